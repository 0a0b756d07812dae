//! The size of a picture sent inline: a `data:` URL's width and height, read from the image's
//! header as Pillow (which vLLM opens every picture with) reads them, without decoding the
//! picture or even the whole base64 payload.
//!
//! A vision model's tokens for a picture follow its resolution (Qwen2-VL and Qwen2.5-VL: one
//! token per 28x28 pixels, up to 16,384 tokens at their default `max_pixels`), not its bytes:
//! a 1.6 KB PNG of 3,584 x 3,584 black pixels costs as much as the longest picture. Only what
//! is certain is read: PNG, JPEG, GIF and WebP headers laid out as their specifications say,
//! taking the largest size any header Pillow might use names (the last `IHDR` before the
//! image data, a JPEG's frames before its first scan, a GIF's first frame when it reaches past
//! the screen). Anything else (another format, a payload that is not strict base64, a header
//! that does not parse, junk Pillow would skip) is `None`: the caller charges its largest.

/// Width and height in pixels of the picture in `url`, when it is a `data:` URL with a strict
/// base64 payload (vLLM decodes with `validate=True`) of a PNG, JPEG, GIF or WebP whose header
/// reads cleanly; `None` otherwise.
pub fn data_url_size(url: &str) -> Option<(u32, u32)> {
    let payload = data_url_payload(url)?;
    let data = Base64::new(payload.as_bytes())?;
    if another_plugin_may_open(&data) {
        return None;
    }
    let size = png(&data)
        .or_else(|| jpeg(&data))
        .or_else(|| gif(&data))
        .or_else(|| webp(&data))?;
    (size.0 > 0 && size.1 > 0).then_some(size)
}

/// The base64 payload of a `data:<type>;base64,<payload>` URL (vLLM splits the URL's path at
/// its first `,`, then the type at its first `;`, and takes only the data type `base64`).
pub fn data_url_payload(url: &str) -> Option<&str> {
    let rest = url
        .get(..5)
        .filter(|s| s.eq_ignore_ascii_case("data:"))
        .map(|_| &url[5..])?;
    let (spec, payload) = rest.split_once(',')?;
    let (_, data_type) = spec.split_once(';')?;
    (data_type == "base64").then_some(payload)
}

/// A strict base64 payload (standard alphabet, padded, nothing else), read at any offset of
/// what it decodes to without decoding the rest.
struct Base64<'a> {
    text: &'a [u8],
    len: usize,
}

/// Each byte's value as a base64 character, 255 outside the standard alphabet (a table: a whole
/// payload is checked, and a branch per byte mispredicts on random base64).
const SEXTETS: [u8; 256] = {
    let mut t = [255u8; 256];
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut i = 0;
    while i < 64 {
        t[alphabet[i] as usize] = i as u8;
        i += 1;
    }
    t
};

/// The value of one base64 character; `None` outside the standard alphabet.
fn sextet(c: u8) -> Option<u32> {
    match SEXTETS[usize::from(c)] {
        255 => None,
        v => Some(u32::from(v)),
    }
}

impl<'a> Base64<'a> {
    /// `text` when it is strict base64: a multiple of four characters of the standard alphabet,
    /// with `=` padding (at most two) only at its end.
    fn new(text: &'a [u8]) -> Option<Self> {
        if text.is_empty() || !text.len().is_multiple_of(4) {
            return None;
        }
        let pad = text.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2
            || text[..text.len() - pad]
                .iter()
                .fold(0u8, |any, &c| any | (SEXTETS[usize::from(c)] >> 7))
                != 0
        {
            return None;
        }
        Some(Self {
            text,
            len: text.len() / 4 * 3 - pad,
        })
    }

    /// The decoded bytes `offset..offset + n`; `None` past the end.
    fn bytes(&self, offset: usize, n: usize) -> Option<Vec<u8>> {
        let end = offset.checked_add(n)?;
        if end > self.len {
            return None;
        }
        let mut out = Vec::with_capacity(n + 3);
        let first = offset / 3;
        for group in self.text[first * 4..].chunks(4) {
            if first * 3 + out.len() >= end {
                break;
            }
            let v = group
                .iter()
                .fold(0u32, |v, &c| (v << 6) | sextet(c).unwrap_or(0));
            out.extend_from_slice(&v.to_be_bytes()[1..]);
        }
        let skip = offset - first * 3;
        Some(out[skip..skip + n].to_vec())
    }

    fn u8(&self, at: usize) -> Option<u8> {
        self.bytes(at, 1).map(|b| b[0])
    }

    fn be16(&self, at: usize) -> Option<u32> {
        self.bytes(at, 2)
            .map(|b| u32::from(u16::from_be_bytes([b[0], b[1]])))
    }

    fn le16(&self, at: usize) -> Option<u32> {
        self.bytes(at, 2)
            .map(|b| u32::from(u16::from_le_bytes([b[0], b[1]])))
    }

    fn be32(&self, at: usize) -> Option<u32> {
        self.bytes(at, 4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn le32(&self, at: usize) -> Option<u32> {
        self.bytes(at, 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn starts_with(&self, at: usize, magic: &[u8]) -> bool {
        self.bytes(at, magic.len()).is_some_and(|b| b == magic)
    }
}

/// Header structures walked at most (chunks, segments, fill bytes, blocks): past them the size
/// is not known and the caller charges the most.
const MAX_STEPS: usize = 4096;

/// Whether Pillow could open these bytes with a plugin that has no signature to check, which
/// it tries when the format's own plugin fails on something this reader does not check (a
/// chunk's CRC, a table's length), and for WebP before WebP's own plugin: IM (a text header:
/// a letter first, a `key: value` line ended within 100 bytes), PCD (`PCD_` at byte 2,048)
/// and SPIDER (27 floats whose header fields agree, either byte order). Such a file's size is
/// what that plugin reads: a WebP of 1 x 1 could open as an IM picture of 3,584 x 3,584.
fn another_plugin_may_open(data: &Base64<'_>) -> bool {
    // IM: Pillow skips carriage returns, then wants a letter and a line with a colon.
    let head = data.bytes(0, data.len.min(100)).unwrap_or_default();
    let text = head
        .iter()
        .skip_while(|&&b| b == b'\r')
        .copied()
        .collect::<Vec<_>>();
    let im = text.first().is_some_and(u8::is_ascii_alphabetic)
        && text
            .iter()
            .position(|&b| b == b'\n')
            .is_some_and(|end| text[..end].contains(&b':'));
    let pcd = data.starts_with(2048, b"PCD_");
    im || pcd || spider(data)
}

/// Pillow's `isSpiderHeader` on the first 108 bytes, big-endian then little-endian: the
/// header's fields 1, 2, 5, 12, 13, 22 and 23 whole numbers, field 5 a known form, and field 22
/// (the header's bytes) the product of 13 and 23, not 0. Where the product is too large to
/// compare exactly, it may be one.
fn spider(data: &Base64<'_>) -> bool {
    let Some(head) = data.bytes(0, 108) else {
        return false;
    };
    let fields = |big: bool| -> Vec<f64> {
        head.chunks(4)
            .map(|c| {
                let b = [c[0], c[1], c[2], c[3]];
                f64::from(if big {
                    f32::from_be_bytes(b)
                } else {
                    f32::from_le_bytes(b)
                })
            })
            .collect()
    };
    let header = |t: Vec<f64>| -> bool {
        // Spider numbers its fields from 1.
        let h = |i: usize| t[i - 1];
        let whole = |f: f64| f.is_finite() && f.fract() == 0.0;
        if ![1, 2, 5, 12, 13, 22, 23].iter().all(|&i| whole(h(i))) {
            return false;
        }
        if ![1.0, 3.0, -11.0, -12.0, -21.0, -22.0].contains(&h(5)) {
            return false;
        }
        let (labrec, labbyt, lenbyt) = (h(13), h(22), h(23));
        let product = labrec * lenbyt;
        labbyt != 0.0 && (product.abs() >= 9e15 || product == labbyt)
    };
    header(fields(true)) || header(fields(false))
}

/// PNG: the largest size of the `IHDR` chunks before the first `IDAT` (Pillow takes the last
/// one it meets).
fn png(data: &Base64<'_>) -> Option<(u32, u32)> {
    if !data.starts_with(0, b"\x89PNG\r\n\x1a\n") {
        return None;
    }
    let mut at = 8usize;
    let mut size: Option<(u32, u32)> = None;
    for _ in 0..MAX_STEPS {
        let len = usize::try_from(data.be32(at)?).ok()?;
        let kind = data.bytes(at + 4, 4)?;
        match kind.as_slice() {
            b"IHDR" => {
                let (w, h) = (data.be32(at + 8)?, data.be32(at + 12)?);
                let (w0, h0) = size.unwrap_or((0, 0));
                size = Some((w0.max(w), h0.max(h)));
            }
            b"IDAT" | b"IEND" => return size,
            _ => {}
        }
        at = at.checked_add(12)?.checked_add(len)?;
    }
    None
}

/// JPEG: the largest size of the frames (`SOFn` segments) before the first scan, walking the
/// segments by their lengths. Any byte out of place (Pillow skips junk between segments, where a
/// frame could hide) gives up.
fn jpeg(data: &Base64<'_>) -> Option<(u32, u32)> {
    if !data.starts_with(0, b"\xff\xd8") {
        return None;
    }
    let mut at = 2usize;
    let mut size: Option<(u32, u32)> = None;
    // Segments and fill bytes alike count against one budget.
    let mut steps = 0;
    loop {
        if data.u8(at)? != 0xff {
            return None;
        }
        // Fill bytes: any number of 0xff before the marker.
        at += 1;
        let mut marker = data.u8(at)?;
        while marker == 0xff {
            steps += 1;
            if steps > MAX_STEPS {
                return None;
            }
            at += 1;
            marker = data.u8(at)?;
        }
        steps += 1;
        if steps > MAX_STEPS {
            return None;
        }
        at += 1;
        match marker {
            // Restart markers carry no length.
            0xd0..=0xd7 => continue,
            // A second start or an end before any scan: not an image Pillow reads whole. TEM,
            // JPG, DHP and JPGn: markers Pillow reads otherwise than by a length (DHP as a
            // frame header), so where they lead is not certain.
            0x00 | 0x01 | 0xc8 | 0xd8 | 0xd9 | 0xde | 0xf0..=0xfd => return None,
            0xda => return size,
            _ => {}
        }
        let len = usize::try_from(data.be16(at)?).ok()?;
        if len < 2 {
            return None;
        }
        if matches!(marker, 0xc0..=0xc3 | 0xc5..=0xc7 | 0xc9..=0xcb | 0xcd..=0xcf) {
            let (h, w) = (data.be16(at + 3)?, data.be16(at + 5)?);
            let (w0, h0) = size.unwrap_or((0, 0));
            size = Some((w0.max(w), h0.max(h)));
        }
        at = at.checked_add(len)?;
    }
}

/// GIF: the logical screen, grown to cover the first frame (Pillow does, when the frame
/// reaches past it).
fn gif(data: &Base64<'_>) -> Option<(u32, u32)> {
    if !data.starts_with(0, b"GIF87a") && !data.starts_with(0, b"GIF89a") {
        return None;
    }
    let (sw, sh) = (data.le16(6)?, data.le16(8)?);
    let flags = data.u8(10)?;
    let mut at = 13usize;
    if flags & 0x80 != 0 {
        at += 3 << ((flags & 0x07) + 1);
    }
    let mut steps = 0;
    loop {
        steps += 1;
        if steps > MAX_STEPS {
            return None;
        }
        match data.u8(at)? {
            0x2c => {
                let (x, y) = (data.le16(at + 1)?, data.le16(at + 3)?);
                let (w, h) = (data.le16(at + 5)?, data.le16(at + 7)?);
                return Some((sw.max(x + w), sh.max(y + h)));
            }
            0x21 => {
                // Extension: a label, then sub-blocks until an empty one.
                at += 2;
                loop {
                    // Every sub-block is a step: a payload of one-byte sub-blocks is walked
                    // no further than any other header.
                    steps += 1;
                    if steps > MAX_STEPS {
                        return None;
                    }
                    let n = usize::from(data.u8(at)?);
                    at += 1 + n;
                    if n == 0 {
                        break;
                    }
                }
            }
            _ => return None,
        }
    }
}

/// WebP: the canvas of an extended file (`VP8X`), else the frame of a simple lossy (`VP8 `) or
/// lossless (`VP8L`) one.
fn webp(data: &Base64<'_>) -> Option<(u32, u32)> {
    if !data.starts_with(0, b"RIFF") || !data.starts_with(8, b"WEBP") {
        return None;
    }
    let chunk = data.bytes(12, 4)?;
    let at = 20usize;
    match chunk.as_slice() {
        b"VP8X" => {
            let w = data.le32(at + 4)? & 0x00ff_ffff;
            let h = data.le32(at + 7)? & 0x00ff_ffff;
            Some((w + 1, h + 1))
        }
        b"VP8 " => {
            if !data.starts_with(at + 3, b"\x9d\x01\x2a") {
                return None;
            }
            Some((data.le16(at + 6)? & 0x3fff, data.le16(at + 8)? & 0x3fff))
        }
        b"VP8L" => {
            if data.u8(at)? != 0x2f {
                return None;
            }
            let bits = data.le32(at + 1)?;
            Some(((bits & 0x3fff) + 1, ((bits >> 14) & 0x3fff) + 1))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pictures written by Pillow 13 (`Image.new(...).save(...)`), with the size Pillow reads
    /// back from each.
    const PILLOW: &[(&str, &str, (u32, u32))] = &[
        ("png", "iVBORw0KGgoAAAANSUhEUgAAACUAAAAXCAIAAAADThHyAAAAKElEQVR4nGPkOiHHQEfARE/LRu0btW/UvlH7Ru0btW/UvlH7Ru0jCABfIgEe+UCBwwAAAABJRU5ErkJggg==", (37, 23)),
        ("gif", "R0lGODdhEwApAIAAAAAAAAAAACwAAAAAEwApAEAILwABCBxIsKDBgwgTKlzIsKHDhxAjSpxIsaLFixgzatzIsaPHjyBDihxJsqRJkwEBADs=", (19, 41)),
        ("webp lossy", "UklGRkgAAABXRUJQVlA4IDwAAABQAwCdASolABcAPtFmrVEoJaQipWgBABoJZwDKpoAANa6r6AD+Ex/jebzWtb//FodaHWhtjoTKuJ+uAAA=", (37, 23)),
        ("webp lossless", "UklGRh4AAABXRUJQVlA4TBEAAAAvJIAFAAdQ5CrUo/+BiOh/AAA=", (37, 23)),
        // A hand-made GIF: a 10 x 10 screen whose first frame sits at (5, 7) and is 300 x 200
        // (Pillow reads 305 x 207).
        ("gif frame past the screen", "R0lGODlhCgAKAIAAAAAAAP///yH+A2FiYwAsBQAHACwByAAAAgJEAQA7", (305, 207)),
    ];

    fn url(payload: &str) -> String {
        format!("data:image/png;base64,{payload}")
    }

    #[test]
    fn pillows_pictures_read_as_pillow_reads_them() {
        for (name, payload, size) in PILLOW {
            assert_eq!(data_url_size(&url(payload)), Some(*size), "{name}");
        }
        for (name, payload, size) in [
            ("jpeg", JPEG, (37, 23)),
            (
                "progressive jpeg after 336 bytes of exif",
                JPEG_EXIF,
                (61, 45),
            ),
            ("webp with alpha and exif (VP8X)", WEBP_X, (33, 17)),
        ] {
            assert_eq!(data_url_size(&url(payload)), Some(size), "{name}");
        }
    }

    #[test]
    fn a_second_header_counts_when_it_is_larger() {
        // Pillow read this PNG (an IHDR of 10 x 10, then one of 3,000 x 3,000) as 3,000 x 3,000.
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        for side in [10u32, 3000] {
            png.extend_from_slice(&13u32.to_be_bytes());
            png.extend_from_slice(b"IHDR");
            png.extend_from_slice(&side.to_be_bytes());
            png.extend_from_slice(&side.to_be_bytes());
            png.extend_from_slice(&[8, 2, 0, 0, 0, 0, 0, 0, 0]);
        }
        png.extend_from_slice(&[0, 0, 0, 0]);
        png.extend_from_slice(b"IEND");
        png.extend_from_slice(&[0; 4]);
        assert_eq!(data_url_size(&url(&encode(&png))), Some((3000, 3000)));
    }

    #[test]
    fn what_is_not_certain_has_no_size() {
        let png = PILLOW[0].1;
        // Not strict base64: whitespace, the URL-safe alphabet, missing padding.
        let spaced = format!("{} {}", &png[..8], &png[8..]);
        let unpadded = png.trim_end_matches('=');
        let urlsafe = png.replace('+', "-");
        for payload in [spaced.as_str(), unpadded, urlsafe.as_str()] {
            assert_eq!(data_url_size(&url(payload)), None, "{payload}");
        }
        // Not base64 at all, or no data URL.
        assert_eq!(data_url_size(&format!("data:image/png,{png}")), None);
        assert_eq!(
            data_url_size(&format!("data:image/png;charset=x;base64,{png}")),
            None
        );
        assert_eq!(data_url_size("https://example.edu/a.png"), None);
        // Another format (a BMP Pillow wrote), or a header cut short.
        assert_eq!(data_url_size(&url(BMP)), None);
        assert_eq!(data_url_size(&url(&png[..24])), None);
        // Fill bytes before a marker are read past.
        let mut filled = decode(JPEG_EXIF);
        filled.splice(2..2, [0xff, 0xff]);
        assert_eq!(data_url_size(&url(&encode(&filled))), Some((61, 45)));
        // Junk between JPEG segments, which Pillow skips (and a frame could follow).
        let mut jpeg = decode(JPEG);
        jpeg.splice(2..2, [0x00, 0x00]);
        assert_eq!(data_url_size(&url(&encode(&jpeg))), None);
    }

    /// Bytes that read as one format here but that Pillow 13 opens with a plugin of no
    /// signature (checked: `Image.open(...).format, .size`): a WebP of 1 x 1 that is an IM
    /// picture of 3,584 x 3,584, a PNG (its IHDR's CRC wrong) that is a PCD of 768 x 512, a WebP
    /// that is a SPIDER picture of 3,584 x 3,584. Their size is not this reader's to say.
    #[test]
    fn what_another_plugin_of_pillow_may_open_has_no_size() {
        let mut im = b"RIFFAAAAWEBPVP8X\x0b\x00\x00\x00".to_vec();
        im.extend_from_slice(&[0; 10]);
        im.extend_from_slice(b": x\nImage type: 0 1 image\nImage size (x*y): 3584*3584\n\x1a");
        im.extend_from_slice(&[0; 64]);
        assert_eq!(
            webp(&Base64::new(encode(&im).as_bytes()).unwrap()),
            Some((1, 1))
        );
        assert_eq!(data_url_size(&url(&encode(&im))), None);

        let mut pcd = b"\x89PNG\r\n\x1a\n".to_vec();
        pcd.extend_from_slice(&13u32.to_be_bytes());
        pcd.extend_from_slice(b"IHDR");
        pcd.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 1, 8, 2, 0, 0, 0, 0, 0, 0, 0]);
        pcd.extend_from_slice(&2100u32.to_be_bytes());
        pcd.extend_from_slice(b"IDAT");
        pcd.resize(pcd.len() + 2104, 0);
        pcd[2048..2052].copy_from_slice(b"PCD_");
        pcd.resize(pcd.len() + 2048, 0);
        assert_eq!(
            png(&Base64::new(encode(&pcd).as_bytes()).unwrap()),
            Some((1, 1))
        );
        assert_eq!(data_url_size(&url(&encode(&pcd))), None);

        let mut spider = vec![0u8; 2200];
        spider[0..4].copy_from_slice(b"RIFF");
        spider[4..8].copy_from_slice(&3584f32.to_be_bytes());
        spider[8..16].copy_from_slice(b"WEBPVP8X");
        spider[16..20].copy_from_slice(&1f32.to_be_bytes());
        spider[44..48].copy_from_slice(&3584f32.to_be_bytes());
        spider[48..52].copy_from_slice(&1f32.to_be_bytes());
        spider[84..88].copy_from_slice(&1024f32.to_be_bytes());
        spider[88..92].copy_from_slice(&1024f32.to_be_bytes());
        assert_eq!(
            webp(&Base64::new(encode(&spider).as_bytes()).unwrap()),
            Some((1, 1))
        );
        assert_eq!(data_url_size(&url(&encode(&spider))), None);
    }

    #[test]
    fn a_header_is_walked_a_bounded_number_of_steps() {
        // A GIF whose first frame follows a comment of 5,000 one-byte sub-blocks: past the
        // steps any header is walked, so it costs the most rather than a walk of the payload.
        let mut gif = b"GIF89a\x0a\x00\x0a\x00\x00\x00\x00".to_vec();
        gif.extend_from_slice(&[0x21, 0xfe]);
        for _ in 0..5_000 {
            gif.extend_from_slice(&[1, b'x']);
        }
        gif.push(0);
        gif.extend_from_slice(&[0x2c, 0, 0, 0, 0, 0x10, 0, 0x10, 0, 0]);
        assert_eq!(data_url_size(&url(&encode(&gif))), None);
        // A JPEG whose segments are each led by 4,096 fill bytes: the fill counts too.
        let mut jpeg = b"\xff\xd8".to_vec();
        for _ in 0..3 {
            jpeg.extend(std::iter::repeat_n(0xff, 4096));
            jpeg.extend_from_slice(&[0xfe, 0x00, 0x02]);
        }
        jpeg.extend_from_slice(&[0xff, 0xc0, 0, 11, 8, 0, 1, 0, 1, 1, 1, 0x11, 0]);
        jpeg.extend_from_slice(&[0xff, 0xda]);
        assert_eq!(data_url_size(&url(&encode(&jpeg))), None);
        // The same with a short comment reads.
        let mut short = b"GIF89a\x0a\x00\x0a\x00\x00\x00\x00".to_vec();
        short.extend_from_slice(&[0x21, 0xfe, 1, b'x', 0]);
        short.extend_from_slice(&[0x2c, 0, 0, 0, 0, 0x10, 0, 0x10, 0, 0]);
        assert_eq!(data_url_size(&url(&encode(&short))), Some((16, 16)));
    }

    #[test]
    fn the_scheme_is_any_case_and_the_type_is_not_read() {
        let png = PILLOW[0].1;
        assert_eq!(
            data_url_size(&format!("DATA:application/octet-stream;base64,{png}")),
            Some((37, 23))
        );
    }

    #[test]
    fn any_window_decodes_as_the_whole_would() {
        let bytes: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        let text = encode(&bytes[..998]);
        let data = Base64::new(text.as_bytes()).unwrap();
        assert_eq!(data.len, 998);
        for offset in [0, 1, 2, 3, 500, 995] {
            for n in [1, 2, 3] {
                assert_eq!(data.bytes(offset, n).unwrap(), &bytes[offset..offset + n]);
            }
        }
        assert_eq!(data.bytes(996, 3), None);
    }

    /// Pillow 13's JPEG (quality 50), progressive JPEG after an EXIF segment, WebP with alpha
    /// and EXIF (an extended file), and the first 54 bytes of its BMP.
    const JPEG: &str = "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDABALDA4MChAODQ4SERATGCgaGBYWGDEjJR0oOjM9PDkzODdASFxOQERXRTc4UG1RV19iZ2hnPk1xeXBkeFxlZ2P/2wBDARESEhgVGC8aGi9jQjhCY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2P/wAARCAAXACUDASIAAhEBAxEB/8QAHwAAAQUBAQEBAQEAAAAAAAAAAAECAwQFBgcICQoL/8QAtRAAAgEDAwIEAwUFBAQAAAF9AQIDAAQRBRIhMUEGE1FhByJxFDKBkaEII0KxwRVS0fAkM2JyggkKFhcYGRolJicoKSo0NTY3ODk6Q0RFRkdISUpTVFVWV1hZWmNkZWZnaGlqc3R1dnd4eXqDhIWGh4iJipKTlJWWl5iZmqKjpKWmp6ipqrKztLW2t7i5usLDxMXGx8jJytLT1NXW19jZ2uHi4+Tl5ufo6erx8vP09fb3+Pn6/8QAHwEAAwEBAQEBAQEBAQAAAAAAAAECAwQFBgcICQoL/8QAtREAAgECBAQDBAcFBAQAAQJ3AAECAxEEBSExBhJBUQdhcRMiMoEIFEKRobHBCSMzUvAVYnLRChYkNOEl8RcYGRomJygpKjU2Nzg5OkNERUZHSElKU1RVVldYWVpjZGVmZ2hpanN0dXZ3eHl6goOEhYaHiImKkpOUlZaXmJmaoqOkpaanqKmqsrO0tba3uLm6wsPExcbHyMnK0tPU1dbX2Nna4uPk5ebn6Onq8vP09fb3+Pn6/9oADAMBAAIRAxEAPwBtFFFeMfMhRRRQAUUUUAFFFFABRRRQAUUUUAf/2Q==";
    const JPEG_EXIF: &str = "/9j/4AAQSkZJRgABAQAAAQABAAD/4QFQRXhpZgAATU0AKgAAAAgAAQEOAAIAAAEtAAAAGgAAAAB4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHgAAP/bAEMACAYGBwYFCAcHBwkJCAoMFA0MCwsMGRITDxQdGh8eHRocHCAkLicgIiwjHBwoNyksMDE0NDQfJzk9ODI8LjM0Mv/bAEMBCQkJDAsMGA0NGDIhHCEyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMv/CABEIAC0APQMBIgACEQEDEQH/xAAVAAEBAAAAAAAAAAAAAAAAAAAABv/EABUBAQEAAAAAAAAAAAAAAAAAAAAB/9oADAMBAAIQAxAAAAGACAAAAAAAAAAAf//EABQQAQAAAAAAAAAAAAAAAAAAAFD/2gAIAQEAAQUCQ//EABQRAQAAAAAAAAAAAAAAAAAAADD/2gAIAQMBAT8BT//EABQRAQAAAAAAAAAAAAAAAAAAADD/2gAIAQIBAT8BT//EABQQAQAAAAAAAAAAAAAAAAAAAFD/2gAIAQEABj8CQ//EABQQAQAAAAAAAAAAAAAAAAAAAFD/2gAIAQEAAT8hQ//aAAwDAQACAAMAAAAQDDDDDDDDDDDD/8QAFBEBAAAAAAAAAAAAAAAAAAAAMP/aAAgBAwEBPxBP/8QAFBEBAAAAAAAAAAAAAAAAAAAAMP/aAAgBAgEBPxBP/8QAFBABAAAAAAAAAAAAAAAAAAAAUP/aAAgBAQABPxBD/9k=";
    const WEBP_X: &str = "UklGRq4BAABXRUJQVlA4WAoAAAAYAAAAIAAAEAAAQUxQSA8AAAABB0AgaYu3/RERR0T0PwAAVlA4ICgAAADwAgCdASohABEAPtFmrVEoJaQipWgBABoJaQAAKUNt8AD+82IAAAAARVhJRkgBAABNTQAqAAAACAABAQ4AAgAAAS0AAAAaAAAAAHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eAAA";
    const BMP: &str = "Qk1GCgAAAAAAADYAAAAoAAAAJQAAABcAAAABABgAAAAAABAKAADEDgAAxA4AAAAAAAAAAAAA";

    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    fn encode(bytes: &[u8]) -> String {
        let mut out = String::new();
        for chunk in bytes.chunks(3) {
            let mut b = [0u8; 3];
            b[..chunk.len()].copy_from_slice(chunk);
            let v = u32::from_be_bytes([0, b[0], b[1], b[2]]);
            for i in 0..4 {
                if i <= chunk.len() {
                    out.push(char::from(ALPHABET[(v >> (18 - 6 * i) & 63) as usize]));
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    fn decode(text: &str) -> Vec<u8> {
        let data = Base64::new(text.as_bytes()).unwrap();
        data.bytes(0, data.len).unwrap()
    }
}

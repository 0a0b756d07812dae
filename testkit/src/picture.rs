//! Pictures for the tests of what a picture costs: a PNG as far as its header goes, in a
//! `data:` URL.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A PNG of `width` x `height` pixels as far as its header goes (signature, `IHDR`, then an
/// `IDAT` of `data` random bytes and `IEND`), base64 in a `data:` URL. The gateway and the
/// simulator read only the header; vLLM would decode the picture and refuse this one.
pub fn png_data_url(width: u32, height: u32, data: usize) -> String {
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut chunk = |kind: &[u8], body: &[u8]| {
        let len = u32::try_from(body.len()).expect("a chunk under 4 GiB");
        png.extend_from_slice(&len.to_be_bytes());
        png.extend_from_slice(kind);
        png.extend_from_slice(body);
        png.extend_from_slice(&[0; 4]);
    };
    let mut ihdr = width.to_be_bytes().to_vec();
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    chunk(b"IHDR", &ihdr);
    let mut rng = StdRng::seed_from_u64(u64::from(width) << 32 | u64::from(height));
    let noise: Vec<u8> = (0..data).map(|_| rng.random()).collect();
    chunk(b"IDAT", &noise);
    chunk(b"IEND", &[]);
    format!("data:image/png;base64,{}", base64(&png))
}

/// `bytes` in standard, padded base64.
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len() / 3 * 4 + 4);
    for c in bytes.chunks(3) {
        let mut b = [0u8; 3];
        b[..c.len()].copy_from_slice(c);
        let v = u32::from_be_bytes([0, b[0], b[1], b[2]]);
        for i in 0..4 {
            out.push(if i <= c.len() {
                char::from(ALPHABET[(v >> (18 - 6 * i) & 63) as usize])
            } else {
                '='
            });
        }
    }
    out
}

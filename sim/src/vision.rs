//! A vision model's tokens for a picture (`--image-token-pixels`, `--image-max-tokens`), as
//! Qwen2-VL and Qwen2.5-VL count them: Hugging Face's `smart_resize` (their image processor)
//! rounds each side to a multiple of the square's side (28 pixels: 14-pixel patches merged 2x2),
//! scales a picture of more than `max_pixels` down (the floor of each scaled side) and one of
//! fewer than `min_pixels` (4 squares) up, and the picture costs one token per square.

use tutor_wire::chat::{ContentPart, MediaKind};

/// A vision model's picture rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vision {
    /// Side of one token's square, in pixels.
    pub side: u32,
    /// The most tokens a picture costs.
    pub max_tokens: u32,
}

impl Vision {
    /// The rule for the flags; `None` for a text model (`side` 0).
    pub fn from_args(side: u32, max_tokens: u32) -> Option<Self> {
        (side > 0).then_some(Self {
            side,
            max_tokens: max_tokens.max(4),
        })
    }

    /// Tokens for a `width` x `height` picture.
    pub fn tokens(&self, width: u32, height: u32) -> u32 {
        let f = f64::from(self.side);
        let (w, h) = (f64::from(width), f64::from(height));
        let max_pixels = f64::from(self.max_tokens) * f * f;
        let min_pixels = 4.0 * f * f;
        // Python's round: halves to even.
        let mut hb = f.max((h / f).round_ties_even() * f);
        let mut wb = f.max((w / f).round_ties_even() * f);
        if hb * wb > max_pixels {
            let beta = (h * w / max_pixels).sqrt();
            hb = f.max((h / beta / f).floor() * f);
            wb = f.max((w / beta / f).floor() * f);
        } else if hb * wb < min_pixels {
            let beta = (min_pixels / (h * w)).sqrt();
            hb = (h * beta / f).ceil() * f;
            wb = (w * beta / f).ceil() * f;
        }
        let squares = (hb / f) * (wb / f);
        // Within the model's bounds whatever the float arithmetic did.
        (squares as u32).clamp(1, self.max_tokens)
    }

    /// What the template renders for `part`: an image's tokens (the most when its size cannot
    /// be read), or `None` for another kind of part (rendered as its JSON).
    pub fn render(&self, part: &ContentPart) -> Option<String> {
        if part.media_kind() != MediaKind::Image {
            return None;
        }
        let n = part
            .image_size()
            .map_or(self.max_tokens, |(w, h)| self.tokens(w, h));
        let mut out = String::with_capacity(40 + 13 * n as usize);
        out.push_str("<|vision_start|>");
        for _ in 0..n {
            out.push_str("<|image_pad|>");
        }
        out.push_str("<|vision_end|>");
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pictures_cost_as_qwen2_vl_counts_them() {
        let v = Vision {
            side: 28,
            max_tokens: 16384,
        };
        // 640 x 480: 23 x 17 squares (rounded to the nearest multiple).
        assert_eq!(v.tokens(640, 480), 23 * 17);
        // 3,584 x 3,584 is exactly the largest picture: 128 x 128.
        assert_eq!(v.tokens(3584, 3584), 16384);
        // Past it, scaled down within the bound.
        let big = v.tokens(8000, 6000);
        assert!(big <= 16384 && big > 15000, "{big}");
        // A tiny picture is scaled up to 4 squares.
        assert_eq!(v.tokens(10, 10), 4);
    }
}

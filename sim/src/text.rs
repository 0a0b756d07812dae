//! Output length, output text and injected faults: all seeded, so a replay is identical.
//!
//! Output length: with `ignore_eos` the request generates exactly `max_tokens`. Otherwise a
//! seeded draw (from `--seed`, the request's `seed` and its prompt tokens) picks a length from an
//! exponential distribution with mean `--mean-output-tokens`, at least 1; if the draw reaches
//! `max_tokens` the request ends at `max_tokens` with `length`, else with `stop`.
//! Each output token is one filler word (" the", " loop", ...); usage counts are exact.

use crate::engine::sequence::FinishReason;
pub use crate::words::{word_token, words, words_in, words_in_from};

pub use tutor_wire::stats::SplitMix;

/// How many tokens a request generates and why it stops.
pub fn output_length(
    rng: &mut SplitMix,
    max_tokens: u32,
    ignore_eos: bool,
    mean: u32,
) -> (u32, FinishReason) {
    let max_tokens = max_tokens.max(1);
    if ignore_eos {
        return (max_tokens, FinishReason::Length);
    }
    let u = rng.next_f64();
    let draw = (-(1.0 - u).ln() * f64::from(mean.max(1))).ceil().max(1.0);
    if draw >= f64::from(max_tokens) {
        (max_tokens, FinishReason::Length)
    } else {
        (draw as u32, FinishReason::Stop)
    }
}

/// Faults injected into one request, decided when it arrives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultPlan {
    /// Answer 500 before streaming.
    pub fail: bool,
    /// Send a mid-stream error after this many tokens.
    pub error_after: Option<u32>,
    /// Stop sending (connection kept open) after this many tokens.
    pub stall_after: Option<u32>,
    /// End without `data: [DONE]`.
    pub omit_done: bool,
    /// With `omit_done`: keep the connection open afterwards instead of closing it.
    pub hang_after_finish: bool,
    /// Send a non-JSON `data:` line after the first token.
    pub garbage: bool,
    /// After the finish, a text chunk every 10 ms without end.
    pub chatter_after_finish: bool,
    /// After the finish, an error event in place of the usage chunk, then `[DONE]`.
    pub error_after_finish: bool,
    /// Bytes of padding on every answer chunk.
    pub padding: usize,
}

/// Fault-injection settings from the command line.
#[derive(Debug, Clone, Copy, Default)]
pub struct FaultRates {
    /// `--fail-rate`.
    pub fail: f64,
    /// `--midstream-error-rate`.
    pub midstream_error: f64,
    /// `--error-after-tokens`.
    pub error_after_tokens: u32,
    /// `--stall-after-tokens`.
    pub stall_after_tokens: Option<u32>,
    /// `--stall-rate`.
    pub stall: f64,
    /// `--omit-done-rate`.
    pub omit_done: f64,
    /// `--omit-done-hang`.
    pub omit_done_hang: bool,
    /// `--garbage-rate`.
    pub garbage: f64,
    /// `--chatter-after-finish`.
    pub chatter_after_finish: bool,
    /// `--error-after-finish`.
    pub error_after_finish: bool,
    /// `--chunk-padding-bytes`.
    pub padding: usize,
}

impl FaultPlan {
    fn hanging(mut self, hang: bool) -> Self {
        self.hang_after_finish = self.omit_done && hang;
        self
    }
}

impl FaultRates {
    /// Draws this request's faults.
    pub fn draw(&self, rng: &mut SplitMix) -> FaultPlan {
        let mut hit = |rate: f64| rate > 0.0 && rng.next_f64() < rate;
        FaultPlan {
            fail: hit(self.fail),
            error_after: hit(self.midstream_error).then_some(self.error_after_tokens),
            stall_after: self.stall_after_tokens.filter(|_| hit(self.stall)),
            omit_done: hit(self.omit_done),
            garbage: hit(self.garbage),
            hang_after_finish: false,
            chatter_after_finish: self.chatter_after_finish,
            error_after_finish: self.error_after_finish,
            padding: self.padding,
        }
        .hanging(self.omit_done_hang)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ignore_eos_generates_exactly_max_tokens() {
        let mut rng = SplitMix::new(1);
        assert_eq!(
            output_length(&mut rng, 77, true, 200),
            (77, FinishReason::Length)
        );
    }

    #[test]
    fn seeded_lengths_replay_and_average_near_the_mean() {
        let draw = |seed| {
            let mut rng = SplitMix::new(seed);
            (0..2000)
                .map(|_| output_length(&mut rng, 100_000, false, 120).0)
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        let v = draw(7);
        let mean = v.iter().map(|x| f64::from(*x)).sum::<f64>() / v.len() as f64;
        assert!((100.0..140.0).contains(&mean), "mean {mean}");
    }

    #[test]
    fn a_draw_past_max_tokens_ends_with_length() {
        let mut rng = SplitMix::new(3);
        let outcomes: Vec<_> = (0..200)
            .map(|_| output_length(&mut rng, 10, false, 200))
            .collect();
        assert!(outcomes
            .iter()
            .all(|(n, r)| *n <= 10 && (*r == FinishReason::Length) == (*n == 10)));
        assert!(outcomes.iter().any(|(_, r)| *r == FinishReason::Length));
    }
}

//! `tutor_gateway_prefill_piec*`: long prompts prefilled in pieces through vLLM's prefix cache
//! (`admission.prefill_piece_tokens`, `crate::pipeline::pieces`), and what that cost.
//! Registered once by [`super::Metrics::new`]; every series exists from start-up.

use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, Registry};

use super::registered::{counter_vec, registered};

/// What became of a prompt long enough to be prefilled in pieces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceOutcome {
    /// Every piece went through; the request itself followed.
    Pieced,
    /// Not pieced: it carries media (their placeholders and cache keys are the engine's), or
    /// its prompt is not text.
    NotText,
    /// Not pieced: the request has a field vLLM's `/tokenize` cannot take that changes its
    /// prompt's ids (`truncate_prompt_tokens`, `reasoning_effort`, `tool_choice: "none"`):
    /// pieces of other ids would never be found cached.
    Unmatched,
    /// Not pieced: the engine's `/tokenize` failed or did not answer in time.
    CountFailed,
    /// A piece failed: the request itself went anyway (its earlier pieces still cached).
    PieceFailed,
}

impl PieceOutcome {
    /// Every outcome.
    pub const ALL: [PieceOutcome; 5] = [
        PieceOutcome::Pieced,
        PieceOutcome::NotText,
        PieceOutcome::Unmatched,
        PieceOutcome::CountFailed,
        PieceOutcome::PieceFailed,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            PieceOutcome::Pieced => "pieced",
            PieceOutcome::NotText => "not_text",
            PieceOutcome::Unmatched => "unmatched",
            PieceOutcome::CountFailed => "count_failed",
            PieceOutcome::PieceFailed => "piece_failed",
        }
    }
}

/// The families.
#[derive(Debug, Clone)]
pub struct PieceMetrics {
    requests: IntCounterVec,
    pieces: IntCounter,
    recomputed: IntCounter,
    seconds: Histogram,
}

impl PieceMetrics {
    /// Registers the families in `registry`.
    pub fn register(registry: &Registry) -> Self {
        let requests = counter_vec(
            registry,
            "tutor_gateway_prefill_pieced_requests_total",
            "Prompts above admission.prefill_piece_tokens, by outcome: pieced, not_text (media, \
             or a prompt that is not text), unmatched (a field /tokenize cannot take changes \
             the prompt's ids), count_failed (the engine's /tokenize failed), \
             piece_failed (a piece failed; the request went anyway).",
            &["outcome"],
        );
        for o in PieceOutcome::ALL {
            requests.with_label_values(&[o.as_str()]);
        }
        Self {
            requests,
            pieces: registered(
                registry,
                IntCounter::new(
                    "tutor_gateway_prefill_pieces_total",
                    "One-token requests sent to prefill a piece of a long prompt (the extra \
                     requests pieces cost).",
                ),
            ),
            recomputed: registered(
                registry,
                IntCounter::new(
                    "tutor_gateway_prefill_piece_recomputed_tokens_total",
                    "Prompt tokens an earlier piece had prefilled that the engine computed again \
                     (evicted from the prefix cache meanwhile), where it reports cached tokens \
                     (--enable-prompt-tokens-details).",
                ),
            ),
            seconds: registered(
                registry,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "tutor_gateway_prefill_pieces_seconds",
                        "Per pieced request: from the first piece sent to the last piece's end \
                         (time its request itself waited for its pieces).",
                    )
                    .buckets(vec![0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]),
                ),
            ),
        }
    }

    /// One long prompt's `outcome`.
    pub fn request(&self, outcome: PieceOutcome) {
        self.requests.with_label_values(&[outcome.as_str()]).inc();
    }

    /// One piece sent.
    pub fn piece(&self) {
        self.pieces.inc();
    }

    /// `n` tokens computed again.
    pub fn recomputed(&self, n: u32) {
        self.recomputed.inc_by(u64::from(n));
    }

    /// A pieced request's pieces took `seconds`.
    pub fn took(&self, seconds: f64) {
        self.seconds.observe(seconds);
    }
}

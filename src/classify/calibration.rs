//! The estimate's correction: what the engine counted teaches the gateway how far off its own
//! count is, per kind of content and per model.
//!
//! Every response's `usage.prompt_tokens` is vLLM's exact count of a prompt the gateway has
//! already counted. The gateway's count differs from it where the tokenizer differs (the
//! `heuristic` against a real model's, about 20% low on code) and where the template renders
//! otherwise than the gateway assumes (tools as compact JSON, a model's own tools preamble,
//! a vision model's tokens per image). Those differences depend on the content, so the
//! correction is kept per [`ContentKind`]: a request's text is split into code, prose, tools
//! (its `tools`, `chat_template_kwargs` and tool calls, with the tools preamble) and media
//! parts (with their configured charge), each counted apart ([`KindCounts`]).
//!
//! **Applying it.** The estimate is `overhead + sum over kinds of ceil(ratio(kind) x
//! count(kind))`, where `overhead` (the beginning-of-sequence token and
//! `classify.per_message_overhead` per turn) is taken as it is.
//!
//! **Learning it.** A response teaches the kind that makes up at least half of its counted
//! tokens (and [`MIN_SAMPLE_TOKENS`] at least): with the other kinds at their current ratios,
//! the ratio this response shows for it is `(prompt_tokens - overhead - others) / count`,
//! clamped to [[`MIN_RATIO`], [`MAX_RATIO`]]. The kind's ratio takes the first observation as
//! it is, then moves toward each new one by [`ALPHA_UP`] when it is higher (an under-count is
//! corrected within a request or two) and by [`ALPHA_DOWN`] when it is lower (an over-count
//! decays slowly): an exponentially decaying average that errs high. Ratios are kept per model
//! (the request's `model`, up to [`MAX_MODELS`] models the engine has answered for) and for all
//! models together, which serves a model not seen yet. They start at 1 (the count as it is) and
//! live as long as the process (a reload keeps them while the tokenizer and the part charges
//! stay the same).

use std::sync::Mutex;

/// The lowest ratio a kind can learn: the gateway's count is never taken as more than twice
/// the engine's.
pub const MIN_RATIO: f64 = 0.5;
/// The highest ratio a kind can learn: the gateway's count is never taken as less than half
/// the engine's (a larger gap means a wrong tokenizer, which the metric shows).
pub const MAX_RATIO: f64 = 2.0;
/// Weight of an observation above the current ratio.
pub const ALPHA_UP: f64 = 0.5;
/// Weight of an observation below the current ratio.
pub const ALPHA_DOWN: f64 = 0.1;
/// Counted tokens of its kind a response needs to teach it (short prompts are mostly template).
pub const MIN_SAMPLE_TOKENS: u32 = 64;
/// Models with ratios of their own; responses for others teach only the shared ratios.
pub const MAX_MODELS: usize = 16;

/// What a piece of a prompt is, as far as its token density goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ContentKind {
    /// Source code, tracebacks, logs: text dense in symbols or indentation.
    Code,
    /// Everything else the client wrote, and message roles.
    Prose,
    /// The request's `tools` (with the template's tools preamble), `chat_template_kwargs` and
    /// assistants' `tool_calls`: JSON the template re-renders its own way.
    Tools,
    /// Non-text content parts (their JSON and their kind's charge).
    Media,
}

impl ContentKind {
    /// Every kind, in [`ContentKind::index`] order.
    pub const ALL: [ContentKind; 4] = [
        ContentKind::Code,
        ContentKind::Prose,
        ContentKind::Tools,
        ContentKind::Media,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            ContentKind::Code => "code",
            ContentKind::Prose => "prose",
            ContentKind::Tools => "tools",
            ContentKind::Media => "media",
        }
    }

    /// Position in [`KindCounts::tokens`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// Whether `text` reads as code: at least one in six of its non-blank lines is indented,
    /// or at least one in eight of its non-space bytes is a bracket, operator or separator
    /// (English prose has about one in twenty-five; Python and Rust one in five).
    pub fn of_text(text: &str) -> ContentKind {
        let (mut lines, mut indented) = (0u32, 0u32);
        for line in text.lines() {
            if line.trim().is_empty() {
                continue;
            }
            lines += 1;
            if line.starts_with("  ") || line.starts_with('\t') {
                indented += 1;
            }
        }
        if lines >= 3 && indented * 6 >= lines {
            return ContentKind::Code;
        }
        let (mut solid, mut symbols) = (0u64, 0u64);
        for b in text.bytes() {
            if b.is_ascii_whitespace() {
                continue;
            }
            solid += 1;
            if b"{}()[]<>=;:_*/\\|&#$%^~`+-\"'@".contains(&b) {
                symbols += 1;
            }
        }
        if solid >= 16 && symbols * 8 >= solid {
            ContentKind::Code
        } else {
            ContentKind::Prose
        }
    }
}

/// One request's counted tokens, by kind, before any correction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KindCounts {
    /// Tokens counted per kind ([`ContentKind::index`]).
    pub tokens: [u32; 4],
    /// Template tokens taken as they are (beginning of sequence, per-message markers).
    pub overhead: u32,
}

impl KindCounts {
    /// Adds `n` tokens of `kind`.
    pub fn add(&mut self, kind: ContentKind, n: u32) {
        let slot = &mut self.tokens[kind.index()];
        *slot = slot.saturating_add(n);
    }

    /// Counted tokens of `kind`.
    pub fn of(&self, kind: ContentKind) -> u32 {
        self.tokens[kind.index()]
    }

    /// Everything counted, overhead included, uncorrected.
    pub fn total(&self) -> u32 {
        self.tokens
            .iter()
            .fold(self.overhead, |sum, &n| sum.saturating_add(n))
    }

    /// The kind with the most counted tokens (code on a tie with prose: the denser guess).
    pub fn dominant(&self) -> ContentKind {
        ContentKind::ALL
            .into_iter()
            .rev()
            .max_by_key(|k| self.of(*k))
            .unwrap_or(ContentKind::Prose)
    }

    /// `overhead + sum of ceil(ratio x count)` under `ratios`.
    fn corrected(&self, ratios: &[f64; 4]) -> u32 {
        let mut total = f64::from(self.overhead);
        for kind in ContentKind::ALL {
            total += (f64::from(self.of(kind)) * ratios[kind.index()]).ceil();
        }
        // A float of at most 2 x u32::MAX, so the cast saturates where it must.
        total.min(f64::from(u32::MAX)) as u32
    }
}

/// One kind's learned ratio.
#[derive(Debug, Clone, Copy)]
struct Ratio {
    value: f64,
    samples: u64,
}

impl Default for Ratio {
    fn default() -> Self {
        Self {
            value: 1.0,
            samples: 0,
        }
    }
}

impl Ratio {
    fn learn(&mut self, observed: f64) {
        let observed = observed.clamp(MIN_RATIO, MAX_RATIO);
        self.value = if self.samples == 0 {
            observed
        } else {
            let alpha = if observed > self.value {
                ALPHA_UP
            } else {
                ALPHA_DOWN
            };
            self.value + alpha * (observed - self.value)
        };
        self.samples = self.samples.saturating_add(1);
    }
}

#[derive(Debug, Default)]
struct Table {
    all: [Ratio; 4],
    models: Vec<(String, [Ratio; 4])>,
}

impl Table {
    /// The ratios for `model`: its own where it has taught a kind, else the shared ones.
    fn ratios(&self, model: Option<&str>) -> [f64; 4] {
        let own = model.and_then(|m| self.models.iter().find(|(name, _)| name == m));
        std::array::from_fn(|i| match own {
            Some((_, r)) if r[i].samples > 0 => r[i].value,
            _ => self.all[i].value,
        })
    }
}

/// What a response taught.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lesson {
    /// The kind that learned.
    pub kind: ContentKind,
    /// The ratio that response showed (clamped).
    pub observed: f64,
}

/// The learned ratios, shared by every request (and kept across reloads).
#[derive(Debug, Default)]
pub struct Calibration {
    table: Mutex<Table>,
}

impl Calibration {
    /// `counts` corrected by what `model` (or, before it taught a kind, every model) taught.
    pub fn correct(&self, model: Option<&str>, counts: &KindCounts) -> u32 {
        counts.corrected(&self.table().ratios(model))
    }

    /// The ratio in force for `kind` of `model` (1 until taught).
    pub fn ratio(&self, model: Option<&str>, kind: ContentKind) -> f64 {
        self.table().ratios(model)[kind.index()]
    }

    /// Learns from the engine's count `prompt_tokens` of a request counted as `counts`, sent for
    /// `model` (see the module doc); `None` when it teaches nothing (no kind with half of the
    /// counted tokens, or too few of them).
    pub fn observe(&self, model: &str, counts: &KindCounts, prompt_tokens: u32) -> Option<Lesson> {
        let kind = counts.dominant();
        let own = counts.of(kind);
        let counted = counts.total().saturating_sub(counts.overhead);
        if own < MIN_SAMPLE_TOKENS || u64::from(own) * 2 < u64::from(counted) {
            return None;
        }
        let mut table = self.table();
        let ratios = table.ratios(Some(model));
        let others = counts.clone_without(kind).corrected(&ratios);
        let observed = ((f64::from(prompt_tokens) - f64::from(others)) / f64::from(own))
            .clamp(MIN_RATIO, MAX_RATIO);
        table.all[kind.index()].learn(observed);
        let slot = match table.models.iter().position(|(name, _)| name == model) {
            Some(i) => Some(i),
            None if table.models.len() < MAX_MODELS => {
                table
                    .models
                    .push((model.to_owned(), [Ratio::default(); 4]));
                Some(table.models.len() - 1)
            }
            None => None,
        };
        if let Some(i) = slot {
            table.models[i].1[kind.index()].learn(observed);
        }
        Some(Lesson { kind, observed })
    }

    /// Takes over what `other` learned (a reload with the same tokenizer and part charges).
    pub fn inherit(&self, other: &Calibration) {
        let theirs = other.table();
        let mut mine = self.table();
        mine.all = theirs.all;
        mine.models = theirs.models.clone();
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl KindCounts {
    /// The same counts without `kind`'s tokens.
    fn clone_without(&self, kind: ContentKind) -> KindCounts {
        let mut c = *self;
        c.tokens[kind.index()] = 0;
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(code: u32, prose: u32, tools: u32, overhead: u32) -> KindCounts {
        KindCounts {
            tokens: [code, prose, tools, 0],
            overhead,
        }
    }

    #[test]
    fn code_and_prose_are_told_apart() {
        let code = "def f(x):\n    if x > 1:\n        return g(x[0])\n    return None\n";
        assert_eq!(ContentKind::of_text(code), ContentKind::Code);
        assert_eq!(
            ContentKind::of_text("let v: Vec<u8> = xs.iter().map(|x| x * 2).collect();"),
            ContentKind::Code
        );
        let prose = "Why does my loop never stop? I thought the counter went up each time, \
                     but it keeps printing the same number.";
        assert_eq!(ContentKind::of_text(prose), ContentKind::Prose);
        assert_eq!(ContentKind::of_text(""), ContentKind::Prose);
    }

    #[test]
    fn an_under_count_is_learned_at_once_and_an_over_count_slowly() {
        let cal = Calibration::default();
        let c = counts(1000, 100, 0, 10);
        assert_eq!(cal.correct(Some("m"), &c), 1110, "nothing learned: the count as it is");
        // The engine counted 1360: with prose and overhead as counted (110), code is 1.25x.
        let lesson = cal.observe("m", &c, 1360).unwrap();
        assert_eq!(lesson.kind, ContentKind::Code);
        assert!((cal.ratio(Some("m"), ContentKind::Code) - 1.25).abs() < 1e-9);
        assert_eq!(cal.correct(Some("m"), &c), 1360);
        // A lower observation (prose taken as counted: (1150 - 110) / 1000) moves it a tenth
        // of the way.
        let low = cal.observe("m", &c, 1150).unwrap().observed;
        assert!((low - 1.04).abs() < 1e-9, "{low}");
        let r = cal.ratio(Some("m"), ContentKind::Code);
        assert!((r - (1.25 + ALPHA_DOWN * (1.04 - 1.25))).abs() < 1e-9, "{r}");
        // A higher one half of the way.
        cal.observe("m", &c, 1650).unwrap();
        let after = cal.ratio(Some("m"), ContentKind::Code);
        assert!((after - (r + ALPHA_UP * (1.54 - r))).abs() < 1e-9, "{after}");
        // Prose and tools were not taught.
        assert_eq!(cal.ratio(Some("m"), ContentKind::Prose), 1.0);
    }

    #[test]
    fn ratios_stay_within_their_bounds_whatever_the_engine_says() {
        let cal = Calibration::default();
        let c = counts(0, 500, 0, 5);
        cal.observe("m", &c, 0).unwrap();
        assert_eq!(cal.ratio(Some("m"), ContentKind::Prose), MIN_RATIO);
        for _ in 0..50 {
            cal.observe("m", &c, u32::MAX).unwrap();
        }
        assert!(cal.ratio(Some("m"), ContentKind::Prose) <= MAX_RATIO);
        // A huge count times the largest ratio saturates instead of wrapping.
        let huge = counts(u32::MAX, u32::MAX, u32::MAX, u32::MAX);
        assert_eq!(cal.correct(Some("m"), &huge), u32::MAX);
    }

    #[test]
    fn mixed_or_tiny_requests_teach_nothing() {
        let cal = Calibration::default();
        assert_eq!(cal.observe("m", &counts(40, 0, 0, 5), 60), None, "too few");
        assert_eq!(
            cal.observe("m", &counts(300, 300, 300, 5), 1500),
            None,
            "no kind with half"
        );
        assert_eq!(cal.ratio(None, ContentKind::Code), 1.0);
    }

    #[test]
    fn a_kind_is_learned_net_of_the_others_already_known() {
        let cal = Calibration::default();
        // Code learned first: 1.2.
        cal.observe("m", &counts(1000, 0, 0, 0), 1200).unwrap();
        // Then a tools-heavy request with some code: the code part is taken at 1.2, the
        // rest is the tools' share.
        let lesson = cal.observe("m", &counts(200, 0, 1000, 10), 10 + 240 + 700);
        assert_eq!(lesson.unwrap().kind, ContentKind::Tools);
        assert!((cal.ratio(Some("m"), ContentKind::Tools) - 0.7).abs() < 1e-9);
    }

    #[test]
    fn models_learn_apart_and_an_unseen_model_uses_what_all_taught() {
        let cal = Calibration::default();
        let c = counts(1000, 0, 0, 0);
        cal.observe("a", &c, 1300).unwrap();
        cal.observe("b", &c, 900).unwrap();
        assert!((cal.ratio(Some("a"), ContentKind::Code) - 1.3).abs() < 1e-9);
        assert!((cal.ratio(Some("b"), ContentKind::Code) - 0.9).abs() < 1e-9);
        let shared = cal.ratio(Some("never-seen"), ContentKind::Code);
        assert!((shared - (1.3 + 0.1 * (0.9 - 1.3))).abs() < 1e-9, "{shared}");
        // Past MAX_MODELS, new names teach only the shared ratios.
        for i in 0..MAX_MODELS + 4 {
            cal.observe(&format!("m{i}"), &c, 1000).unwrap();
        }
        assert_eq!(cal.table().models.len(), MAX_MODELS);
    }

    #[test]
    fn a_reload_keeps_what_was_learned() {
        let old = Calibration::default();
        old.observe("m", &counts(1000, 0, 0, 0), 1250).unwrap();
        let new = Calibration::default();
        new.inherit(&old);
        assert!((new.ratio(Some("m"), ContentKind::Code) - 1.25).abs() < 1e-9);
    }
}

//! The estimate's correction: what the engine counted teaches the gateway how far off its own
//! count is, per kind of content and per model.
//!
//! Every response's `usage.prompt_tokens` is vLLM's exact count of a prompt the gateway has
//! already counted. The gateway's count differs from it where the tokenizer differs (the
//! `heuristic` against a real model's, about 20% low on code) and where the template renders
//! otherwise than the gateway assumes (tools as compact JSON, a model's own tools preamble,
//! a vision model's tokens per image). Those differences depend on the content, so the
//! correction is kept per [`ContentKind`]: a request's text is split into code, prose, tools
//! (its `tools` and tool calls, with the tools preamble) and media
//! parts (with their configured charge), each counted apart ([`KindCounts`]).
//!
//! **Applying it.** The estimate is `overhead + sum over kinds of ceil(engine(kind, count))`,
//! where `overhead` (the beginning-of-sequence token and `classify.per_message_overhead` per
//! turn) is taken as it is and `engine(kind, x)` is the kind's learned line (1 x before it
//! learned anything).
//!
//! **Learning it.** A response teaches the kind that makes up at least half of its counted
//! tokens (and [`MIN_SAMPLE_TOKENS`] at least): with the other kinds at their current lines,
//! the engine counted `prompt_tokens - overhead - others` for this kind's `count`. A request
//! more than an eighth of whose counted tokens are text some templates leave out (a `name`,
//! earlier reasoning, tool call ids: [`KindCounts::optional`]) teaches nothing, and so does
//! one that is not mostly media but more than an eighth media (a media charge is a bound, the
//! most a part can cost, so a text lesson taken with it would count the text short). Each kind
//! fits a line through its observations by least squares, every observation weighing
//! [`DECAY`] times less than the next (about the last 20 count): a slope (the tokenizer's
//! ratio) and a fixed part (such as a model's tools preamble, which the gateway charges at 150
//! and a template may render in 5 or 300). Until the counts spread by [`SPREAD`] or more, or
//! before [`MIN_FIT_SAMPLES`] observations, the line goes through zero (a ratio). Whatever
//! the engine says, a kind's estimate stays within [[`MIN_RATIO`], [`MAX_RATIO`]] times its
//! count. Lines are kept per model (the request's `model`, up to [`MAX_MODELS`] models the
//! engine has answered for) and for all models together, which serves a model not seen yet.
//! They live as long as the process (a reload keeps them while the tokenizer and the part
//! charges stay the same).
//!
//! **Tenants.** The shared lines serve every client, so whatever one client sends teaches them:
//! fifty made-up words that a real tokenizer cuts in three made another school's questions
//! count four times their size (a question moved to the medium lane). With tenants, each
//! tenant's requests also teach lines of their own (per model, up to [`MAX_TENANT_LINES`]),
//! which its requests use once they have taught a kind. A tenant's request counted by the shared
//! lines (a kind it has not taught: short questions never do) is held to what honest content
//! shows ([`Ceilings`]), so no other tenant's text can make it count more; and one tenant
//! teaches the shared lines at most [`MAX_SHARE`] of their last [`RECENT`] lessons of a kind.
//! Without `[auth]` there is one client as far as the lines go: the shared lines serve it whole
//! (its made-up text must still be counted at its cost).

use std::sync::Mutex;

/// The lowest ratio of the engine's count to the gateway's a kind can take (the heuristic
/// against real tokenizers: 0.45 to 0.9, `docs/results/heuristic-fit.md`); each counter sets
/// its own floors above it ([`Floors`]).
pub const MIN_RATIO: f64 = 0.25;
/// The highest ratio of the engine's count to the gateway's a kind can take.
pub const MAX_RATIO: f64 = 4.0;
/// Weight of each observation relative to the next one.
pub const DECAY: f64 = 0.95;
/// Observations a kind needs before a line with a fixed part is fitted.
pub const MIN_FIT_SAMPLES: u64 = 4;
/// Spread of a kind's counts (standard deviation over mean) a line with a fixed part needs.
pub const SPREAD: f64 = 0.1;
/// Counted tokens of its kind a response needs to teach it (short prompts are mostly template).
pub const MIN_SAMPLE_TOKENS: u32 = 64;
/// Models with ratios of their own; responses for others teach only the shared ratios.
pub const MAX_MODELS: usize = 16;
/// (tenant, model) pairs with lines of their own; past them a tenant's requests use the
/// model's and the shared lines.
pub const MAX_TENANT_LINES: usize = 4096;
/// Lessons of a kind over which a tenant's share of the shared lines is counted: the window
/// [`DECAY`] weighs (about 20).
pub const RECENT: usize = 20;
/// Most of the last [`RECENT`] lessons of a kind one tenant may have taught the shared lines.
pub const MAX_SHARE: usize = 4;
/// The most of a request's counted tokens (overhead aside) that may be text some templates
/// leave out ([`KindCounts::optional`]) for it to teach, as a fraction `1 / n`: a template
/// that drops it makes the engine count less than the gateway did, so each lesson may count
/// at most this much short, however many a client sends. Eight: an eighth. The same bound
/// holds for media in a request that teaches another kind (a media charge is the most a part
/// can cost, and what it costs less goes to the other kind's lesson).
pub const MAX_OPTIONAL_SHARE: u64 = 8;

/// How many times its compact count a request's tools block may be counted (pretty-printed)
/// and still teach the tools' line: tools whose pretty rendering dwarfs their compact one
/// (arrays nested a hundred deep), sent to an engine whose template writes them compact, taught
/// the shared line its floor, a quarter, and tools of long descriptions, as long compact as
/// pretty, were then counted at a quarter of what any template renders. Honest schemas (a few
/// levels of properties, descriptions) are counted at 1.3 to 2.4 times their compact count by
/// the heuristic (less by a model's tokenizer).
pub const MAX_PRETTY_GROWTH: u64 = 3;

/// What a piece of a prompt is, as far as its token density goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ContentKind {
    /// Source code, tracebacks, logs: text dense in symbols or indentation.
    Code,
    /// Everything else the client wrote, and message roles.
    Prose,
    /// The request's `tools` (with the template's tools preamble) and assistants'
    /// `tool_calls`: JSON the template re-renders its own way. (Tool results, the `tool`
    /// messages' text counted as a JSON string, and `chat_template_kwargs` are counted as the
    /// text they are, code or prose; a request with `chat_template_kwargs` teaches nothing.)
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

/// Whether the engine's template renders a piece of text for sure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rendered {
    /// Every template renders it (content, roles, tools, tool calls).
    Always,
    /// Some templates leave it out (`PieceKind::Optional`): counted, but a prompt made much of
    /// it teaches nothing ([`KindCounts::optional`]).
    Maybe,
}

/// One request's counted tokens, by kind, before any correction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KindCounts {
    /// Tokens counted per kind ([`ContentKind::index`]).
    pub tokens: [u32; 4],
    /// Template tokens taken as they are (beginning of sequence, per-message markers).
    pub overhead: u32,
    /// Of `tokens`, those of text some templates leave out (a message's `name`, reasoning in
    /// the history, tool call ids: [`Rendered::Maybe`]). A request with more than
    /// [`MAX_OPTIONAL_SHARE`] of them teaches nothing.
    pub optional: u32,
    /// Whether the request's `tools` block is counted (pretty-printed) at more than
    /// [`MAX_PRETTY_GROWTH`] times its count written compact (no whitespace between JSON
    /// tokens): such a request teaches nothing (see [`Calibration::observe_for`]).
    pub tools_inflated: bool,
}

impl KindCounts {
    /// Adds `n` tokens of `kind`.
    pub fn add(&mut self, kind: ContentKind, n: u32) {
        let slot = &mut self.tokens[kind.index()];
        *slot = slot.saturating_add(n);
    }

    /// Adds `n` tokens of `kind` that the template renders as `rendered` says.
    pub fn add_piece(&mut self, kind: ContentKind, rendered: Rendered, n: u32) {
        self.add(kind, n);
        if rendered == Rendered::Maybe {
            self.optional = self.optional.saturating_add(n);
        }
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

    /// `overhead + sum of ceil(engine(kind, count))` under `fits`.
    fn corrected(&self, fits: &[Fit; 4]) -> u32 {
        let mut total = f64::from(self.overhead);
        for kind in ContentKind::ALL {
            let n = self.of(kind);
            if n > 0 {
                total += fits[kind.index()].predict(f64::from(n)).ceil();
            }
        }
        // A float of at most 2 x u32::MAX, so the cast saturates where it must.
        total.min(f64::from(u32::MAX)) as u32
    }
}

/// One kind's learned line: what the engine counts for `x` tokens the gateway counted of this
/// kind, fitted by least squares over the kind's observations, each weighed [`DECAY`] times
/// less than the one after it.
#[derive(Debug, Clone, Copy, Default)]
struct Fit {
    /// The lowest ratio this kind may take ([`Floors`]; 0 reads as [`MIN_RATIO`]).
    floor: f64,
    /// The highest ratio this kind may take here ([`Ceilings`]; 0 reads as [`MAX_RATIO`]).
    ceiling: f64,
    /// Decayed sums: weight, x, y, x squared, x times y.
    w: f64,
    x: f64,
    y: f64,
    xx: f64,
    xy: f64,
    samples: u64,
}

impl Fit {
    fn learn(&mut self, x: f64, y: f64) {
        for sum in [
            &mut self.w,
            &mut self.x,
            &mut self.y,
            &mut self.xx,
            &mut self.xy,
        ] {
            *sum *= DECAY;
        }
        self.w += 1.0;
        self.x += x;
        self.y += y;
        self.xx += x * x;
        self.xy += x * y;
        self.samples = self.samples.saturating_add(1);
    }

    /// What the engine counts for `x` gateway tokens: the fitted line where the observations
    /// spread enough to fit one (a fixed part, such as a template's tools preamble, and a
    /// ratio), else the ratio through zero; `x` itself before any observation. Always within
    /// [[`MIN_RATIO`], [`MAX_RATIO`]] times `x`.
    fn predict(&self, x: f64) -> f64 {
        if self.samples == 0 || self.xx <= 0.0 {
            return x;
        }
        let min = self.floor.max(MIN_RATIO);
        let max = match self.ceiling {
            c if c > 0.0 => c.clamp(min, MAX_RATIO),
            _ => MAX_RATIO,
        };
        let (mx, my) = (self.x / self.w, self.y / self.w);
        let var = self.xx / self.w - mx * mx;
        let line = if self.samples >= MIN_FIT_SAMPLES && var > (SPREAD * mx).powi(2) {
            let slope = ((self.xy / self.w - mx * my) / var).clamp(min, max);
            slope * x + (my - slope * mx)
        } else {
            self.xy / self.xx * x
        };
        line.clamp(min * x, max * x)
    }
}

#[derive(Debug, Default)]
struct Table {
    all: [Fit; 4],
    models: Vec<(String, [Fit; 4])>,
    /// By tenant, then model; at most [`MAX_TENANT_LINES`] (tenant, model) pairs.
    tenants: std::collections::HashMap<String, std::collections::HashMap<String, [Fit; 4]>>,
    tenant_lines: usize,
    /// By kind, who taught the shared lines their last [`RECENT`] lessons (`None`: no tenant).
    recent: [std::collections::VecDeque<Option<String>>; 4],
    floors: Floors,
    ceilings: Ceilings,
}

impl Table {
    /// The fits for `tenant`'s requests for `model`: the tenant's own where it has taught a
    /// kind, else the model's, else the shared ones; each held to its kind's floor.
    fn fits(&self, model: Option<&str>, tenant: Option<&str>) -> [Fit; 4] {
        let own = model.and_then(|m| self.models.iter().find(|(name, _)| name == m));
        let mine = tenant
            .zip(model)
            .and_then(|(t, m)| self.tenants.get(t)?.get(m));
        std::array::from_fn(|i| {
            let (fit, shared) = match (mine, own) {
                (Some(f), _) if f[i].samples > 0 => (f[i], false),
                (_, Some((_, f))) if f[i].samples > 0 => (f[i], true),
                _ => (self.all[i], true),
            };
            Fit {
                floor: self.floors.0[i],
                // A tenant counted by lines others taught: held to honest content's ratio.
                ceiling: if shared && tenant.is_some() {
                    self.ceilings.0[i]
                } else {
                    0.0
                },
                ..fit
            }
        })
    }

    /// Whether `tenant` may teach the shared lines of kind `k` one more lesson (and if so, it
    /// is counted as having done so).
    fn may_teach_all(&mut self, k: usize, tenant: Option<&str>) -> bool {
        let recent = &mut self.recent[k];
        if let Some(t) = tenant {
            let taught = recent.iter().filter(|r| r.as_deref() == Some(t)).count();
            if taught >= MAX_SHARE {
                return false;
            }
        }
        if recent.len() == RECENT {
            recent.pop_front();
        }
        recent.push_back(tenant.map(str::to_owned));
        true
    }
}

/// The lowest ratio of the engine's count to the gateway's each kind may learn (by
/// [`ContentKind::index`]). The correction is shared by every client, so whatever a client can
/// make the engine count less than the gateway counted (text a template leaves out: an unused
/// `chat_template_kwargs` key, a `name` Llama 3.1's template drops) teaches it to count everyone
/// short; a floor bounds how short. Each is the lowest ratio honest content shows for the
/// counter, less a margin:
/// - the `heuristic` against five real tokenizers: 0.45 at the lowest, per sample
///   (`docs/results/heuristic-fit.md`), so 0.4 for code and prose;
/// - the model's own tokenizer counts text as the engine does (the template's markers are the
///   overhead, taken as they are), so 0.8 for code and prose (a template that drops earlier
///   turns' reasoning goes below, and is then counted long: the safe side);
/// - tools stay at [`MIN_RATIO`]: they are counted pretty-printed and most templates render
///   them compact (a third fewer tokens, on top of the tokenizer's ratio);
/// - media at 1.0, the count as the gateway makes it: a part's charge is the most it can cost
///   (its kind's configured charge, or its picture's size), so a part costs less than it is
///   charged and teaches a ratio below 1 wherever the charge is a bound (small photos charged
///   the largest picture, a text model's part JSON); learned, such a ratio counted a picture
///   that does cost the most (3,584 x 3,584 pixels in 1.6 KB of PNG) at a quarter of it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Floors(pub [f64; 4]);

impl Floors {
    /// [`MIN_RATIO`] for every kind (no counter known).
    pub const NONE: Floors = Floors([MIN_RATIO; 4]);
    /// For the `heuristic` counter.
    pub const HEURISTIC: Floors = Floors([0.4, 0.4, MIN_RATIO, 1.0]);
    /// For the served model's own `tokenizer.json`.
    pub const MODEL_TOKENIZER: Floors = Floors([0.8, 0.8, MIN_RATIO, 1.0]);
}

impl Default for Floors {
    fn default() -> Self {
        Self::NONE
    }
}

/// The highest ratio each kind (by [`ContentKind::index`]) counts a tenant's request at by the
/// lines other tenants taught (module doc, "Tenants"): the highest ratio honest content shows
/// for the counter, with a margin. A tenant's own lines, and requests without a tenant, go up
/// to [`MAX_RATIO`].
/// - the `heuristic`: at most 0.89 on every sample and control file against five real
///   tokenizers (`docs/results/heuristic-fit.md`), so 1.0 for code and prose;
/// - the model's own tokenizer counts text as the engine does, so 1.25;
/// - tools and media: 1.0, the count as the gateway makes it (tools pretty-printed, which
///   templates render shorter, with the 150-token preamble charge; media at their configured
///   charges): a tenant whose template or pictures cost more teaches its own line with its
///   first request made mostly of them, and is never charged more because of another's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ceilings(pub [f64; 4]);

impl Ceilings {
    /// [`MAX_RATIO`] for every kind.
    pub const NONE: Ceilings = Ceilings([MAX_RATIO; 4]);
    /// For the `heuristic` counter.
    pub const HEURISTIC: Ceilings = Ceilings([1.0, 1.0, 1.0, 1.0]);
    /// For the served model's own `tokenizer.json`.
    pub const MODEL_TOKENIZER: Ceilings = Ceilings([1.25, 1.25, 1.0, 1.0]);
}

impl Default for Ceilings {
    fn default() -> Self {
        Self::NONE
    }
}

/// What a response taught.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lesson {
    /// The kind that learned.
    pub kind: ContentKind,
    /// What the engine counted for it (net of the other kinds and the overhead).
    pub engine: f64,
}

/// The learned lines, shared by every request (and kept across reloads).
#[derive(Debug, Default)]
pub struct Calibration {
    table: Mutex<Table>,
}

impl Calibration {
    /// A correction that learns no kind below `floors`.
    pub fn with_floors(floors: Floors) -> Self {
        Self::with_bounds(floors, Ceilings::NONE)
    }

    /// A correction that learns no kind below `floors`, and counts a tenant's request by other
    /// tenants' lessons at most at `ceilings`.
    pub fn with_bounds(floors: Floors, ceilings: Ceilings) -> Self {
        Self {
            table: Mutex::new(Table {
                floors,
                ceilings,
                ..Table::default()
            }),
        }
    }

    /// `counts` corrected by what `model` (or, before it taught a kind, every model) taught.
    pub fn correct(&self, model: Option<&str>, counts: &KindCounts) -> u32 {
        self.correct_for(model, None, counts)
    }

    /// `counts` of a request of `tenant` (none without `[auth]`) corrected by what its own
    /// requests for `model` taught, else as [`Calibration::correct`].
    pub fn correct_for(
        &self,
        model: Option<&str>,
        tenant: Option<&str>,
        counts: &KindCounts,
    ) -> u32 {
        counts.corrected(&self.table().fits(model, tenant))
    }

    /// What the engine is expected to count for `tokens` gateway tokens of `kind` of `model`
    /// (`tokens` until taught).
    pub fn expect(&self, model: Option<&str>, kind: ContentKind, tokens: u32) -> f64 {
        self.expect_for(model, None, kind, tokens)
    }

    /// [`Calibration::expect`] for a request of `tenant`.
    pub fn expect_for(
        &self,
        model: Option<&str>,
        tenant: Option<&str>,
        kind: ContentKind,
        tokens: u32,
    ) -> f64 {
        self.table().fits(model, tenant)[kind.index()].predict(f64::from(tokens))
    }

    /// Learns from the engine's count `prompt_tokens` of a request counted as `counts`, sent for
    /// `model` (see the module doc); `None` when it teaches nothing (no kind with half of the
    /// counted tokens, or too few of them).
    pub fn observe(&self, model: &str, counts: &KindCounts, prompt_tokens: u32) -> Option<Lesson> {
        self.observe_for(model, None, counts, prompt_tokens)
    }

    /// [`Calibration::observe`] for a request of `tenant`: it teaches the tenant's own lines,
    /// and the model's and the shared ones within the tenant's share (module doc, "Tenants").
    pub fn observe_for(
        &self,
        model: &str,
        tenant: Option<&str>,
        counts: &KindCounts,
        prompt_tokens: u32,
    ) -> Option<Lesson> {
        let kind = counts.dominant();
        let own = counts.of(kind);
        let counted = counts.total().saturating_sub(counts.overhead);
        let media = counts.of(ContentKind::Media);
        if own < MIN_SAMPLE_TOKENS
            || u64::from(own) * 2 < u64::from(counted)
            || u64::from(counts.optional) * MAX_OPTIONAL_SHARE > u64::from(counted)
            || (kind != ContentKind::Media
                && u64::from(media) * MAX_OPTIONAL_SHARE > u64::from(counted))
            || (kind == ContentKind::Tools && counts.tools_inflated)
        {
            return None;
        }
        let mut table = self.table();
        let others = counts
            .clone_without(kind)
            .corrected(&table.fits(Some(model), tenant));
        let x = f64::from(own);
        let k = kind.index();
        let floor = table.floors.0[k].max(MIN_RATIO);
        let engine = (f64::from(prompt_tokens) - f64::from(others)).clamp(floor * x, MAX_RATIO * x);
        if let Some(t) = tenant {
            let known = table.tenants.get(t).is_some_and(|m| m.contains_key(model));
            if known || table.tenant_lines < MAX_TENANT_LINES {
                table.tenant_lines += usize::from(!known);
                table
                    .tenants
                    .entry(t.to_owned())
                    .or_default()
                    .entry(model.to_owned())
                    .or_default()[k]
                    .learn(x, engine);
            }
        }
        if !table.may_teach_all(k, tenant) {
            return Some(Lesson { kind, engine });
        }
        table.all[k].learn(x, engine);
        let slot = match table.models.iter().position(|(name, _)| name == model) {
            Some(i) => Some(i),
            None if table.models.len() < MAX_MODELS => {
                table.models.push((model.to_owned(), [Fit::default(); 4]));
                Some(table.models.len() - 1)
            }
            None => None,
        };
        if let Some(i) = slot {
            table.models[i].1[k].learn(x, engine);
        }
        Some(Lesson { kind, engine })
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
            optional: 0,
            tools_inflated: false,
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

    /// What the engine is expected to count for `x` code tokens of model `m`.
    fn code(cal: &Calibration, x: u32) -> f64 {
        cal.expect(Some("m"), ContentKind::Code, x)
    }

    #[test]
    fn a_ratio_is_learned_from_one_response() {
        let cal = Calibration::default();
        let c = counts(1000, 100, 0, 10);
        assert_eq!(
            cal.correct(Some("m"), &c),
            1110,
            "nothing learned: the count as it is"
        );
        // The engine counted 1360: with prose and overhead as counted (110), code is 1.25x.
        let lesson = cal.observe("m", &c, 1360).unwrap();
        assert_eq!(lesson.kind, ContentKind::Code);
        assert!((code(&cal, 2000) - 2500.0).abs() < 1e-6);
        assert_eq!(cal.correct(Some("m"), &c), 1360);
        // Prose was not taught.
        assert_eq!(cal.expect(Some("m"), ContentKind::Prose, 100), 100.0);
    }

    #[test]
    fn a_fixed_part_and_a_ratio_are_learned_from_counts_that_spread() {
        let cal = Calibration::default();
        // A template that renders tools at 0.7 of the gateway's count plus 5 tokens, where the
        // gateway charges 150 for the preamble: small tool lists are far more off than large.
        for x in [300u32, 2000, 700, 5000, 1200, 400, 3000, 900] {
            let engine = (0.7 * f64::from(x - 150)).round() as u32 + 5;
            cal.observe("m", &counts(0, 0, x, 0), engine).unwrap();
        }
        for x in [350u32, 4000] {
            let want = 0.7 * f64::from(x - 150) + 5.0;
            let got = cal.expect(Some("m"), ContentKind::Tools, x);
            assert!((got - want).abs() <= 0.02 * want, "{x}: {got} vs {want}");
        }
    }

    #[test]
    fn the_latest_responses_weigh_most() {
        let cal = Calibration::default();
        for _ in 0..20 {
            cal.observe("m", &counts(1000, 0, 0, 0), 1000).unwrap();
        }
        // The engine changed (a new tokenizer): it now counts 1.3x.
        for _ in 0..60 {
            cal.observe("m", &counts(1000, 0, 0, 0), 1300).unwrap();
        }
        assert!(
            (code(&cal, 1000) - 1300.0).abs() < 15.0,
            "{}",
            code(&cal, 1000)
        );
    }

    #[test]
    fn no_client_teaches_a_kind_below_its_floor() {
        // An engine that counts a tenth of what was counted (text the template leaves out,
        // sent again and again): the heuristic's prose never goes below 0.4 of its count,
        // a model tokenizer's below 0.8; media never below its count (its charges are bounds).
        for (floors, want) in [(Floors::HEURISTIC, 0.4), (Floors::MODEL_TOKENIZER, 0.8)] {
            let cal = Calibration::with_floors(floors);
            for n in [500, 900, 1500, 2400, 3000, 4000] {
                cal.observe("m", &counts(0, n, 0, 5), n / 10 + 5).unwrap();
            }
            let got = cal.expect(Some("m"), ContentKind::Prose, 1000);
            assert!((got - want * 1000.0).abs() < 1.0, "{got}");
            let media = KindCounts {
                tokens: [0, 0, 0, 800],
                overhead: 5,
                optional: 0,
                tools_inflated: false,
            };
            cal.observe("m", &media, 85).unwrap();
            assert_eq!(cal.expect(Some("m"), ContentKind::Media, 800), 800.0);
        }
    }

    #[test]
    fn the_correction_stays_within_its_bounds_whatever_the_engine_says() {
        let cal = Calibration::default();
        let c = counts(0, 500, 0, 5);
        cal.observe("m", &c, 0).unwrap();
        assert_eq!(
            cal.expect(Some("m"), ContentKind::Prose, 500),
            MIN_RATIO * 500.0
        );
        for _ in 0..50 {
            cal.observe("m", &c, u32::MAX).unwrap();
        }
        assert!(cal.expect(Some("m"), ContentKind::Prose, 500) <= MAX_RATIO * 500.0);
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
        assert_eq!(cal.expect(None, ContentKind::Code, 100), 100.0);
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
        assert!((cal.expect(Some("m"), ContentKind::Tools, 1000) - 700.0).abs() < 1e-6);
    }

    /// One tenant's made-up text (a real tokenizer cuts it in four) teaches its own lines: its
    /// requests are charged what they cost. Another tenant with lines of its own is not moved
    /// at all; one without (a new school, or questions too short to teach) is moved at most to
    /// honest content's ratio (1.0 here, from the 0.7 the honest lessons alone give), and the
    /// shared lines took at most `MAX_SHARE` of the attacker's lessons. Without tenants the
    /// shared lines serve the one client whole.
    #[test]
    fn one_tenants_text_moves_another_tenants_count_at_most_to_honest_content() {
        let cal = Calibration::with_bounds(Floors::HEURISTIC, Ceilings::HEURISTIC);
        let prose = counts(0, 1000, 0, 0);
        for _ in 0..10 {
            cal.observe_for("m", Some("honest"), &prose, 700).unwrap();
        }
        let before = cal.table().all[ContentKind::Prose.index()].samples;
        for _ in 0..50 {
            cal.observe_for("m", Some("attacker"), &prose, 4000)
                .unwrap();
        }
        let taught = cal.table().all[ContentKind::Prose.index()].samples - before;
        assert_eq!(taught, MAX_SHARE as u64);
        let attacker = cal.expect_for(Some("m"), Some("attacker"), ContentKind::Prose, 1000);
        assert!((attacker - 4000.0).abs() < 1.0, "{attacker}");
        let newcomer = cal.expect_for(Some("m"), Some("new-school"), ContentKind::Prose, 1000);
        assert!((700.0..=1000.0).contains(&newcomer), "{newcomer}");
        // Tools and media too: a kind few tenants send is no easier to move.
        let tools = counts(0, 0, 1000, 0);
        for _ in 0..50 {
            cal.observe_for("m", Some("attacker"), &tools, 4000)
                .unwrap();
        }
        let theirs = cal.expect_for(Some("m"), Some("new-school"), ContentKind::Tools, 1000);
        assert!(theirs <= 1000.0, "{theirs}");
        let honest = cal.expect_for(Some("m"), Some("honest"), ContentKind::Prose, 1000);
        assert!((honest - 700.0).abs() < 1.0, "{honest}");
        // Without tenants: one client, the shared lines whole.
        let one = Calibration::with_bounds(Floors::HEURISTIC, Ceilings::HEURISTIC);
        for _ in 0..30 {
            one.observe("m", &prose, 4000).unwrap();
        }
        assert!((one.expect(Some("m"), ContentKind::Prose, 1000) - 4000.0).abs() < 1.0);
    }

    #[test]
    fn models_learn_apart_and_an_unseen_model_uses_what_all_taught() {
        let cal = Calibration::default();
        let c = counts(1000, 0, 0, 0);
        cal.observe("a", &c, 1300).unwrap();
        cal.observe("b", &c, 900).unwrap();
        assert!((cal.expect(Some("a"), ContentKind::Code, 1000) - 1300.0).abs() < 1e-6);
        assert!((cal.expect(Some("b"), ContentKind::Code, 1000) - 900.0).abs() < 1e-6);
        let shared = cal.expect(Some("never-seen"), ContentKind::Code, 1000);
        assert!(shared > 900.0 && shared < 1300.0, "{shared}");
        // Past MAX_MODELS, new names teach only the shared lines.
        for i in 0..MAX_MODELS + 4 {
            cal.observe(&format!("m{i}"), &c, 1000).unwrap();
        }
        assert_eq!(cal.table().models.len(), MAX_MODELS);
    }
}

//! The lane decision: estimated work = input tokens + output budget, compared to thresholds.

use std::sync::Arc;

use tokio::sync::Semaphore;

use super::bounds::ByteBounds;
use super::calibration::{Calibration, Ceilings, ContentKind, Floors, KindCounts};
use super::counter::TokenCounter;
use super::decision::LaneRules;
use super::error::ClassifyError;
use super::input::{PromptInput, TemplateCosts};
use super::pieces::INLINE_BYTES;
use futures::future::BoxFuture;

use crate::config::{Config, ExactCount};
use crate::lane::Lane;

/// The outcome of classifying one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Classification {
    /// The lane the request waits in.
    pub lane: Lane,
    /// Input tokens, template overhead included: the count corrected by what the engine's
    /// counts taught (`calibration.rs`) when `counts` is `Some`, otherwise the byte-length
    /// upper bound documented in `bounds.rs`. Never more than `max_model_len` less the output
    /// budget: the engine cannot hold more.
    pub input_tokens_estimate: u32,
    /// Output tokens budgeted: the client's max tokens, or `classify.default_output_tokens`,
    /// either lowered to the room the prompt leaves in `max_model_len` (as vLLM lowers it). When the client sent none and the request cannot be
    /// promoted out of its lane, the pipeline sends this as `max_tokens` upstream so the
    /// reservation holds ([`super::LaneRules::output_cap`]).
    pub output_budget: u32,
    /// `input_tokens_estimate + output_budget`: what the lane is chosen by and what admission
    /// reserves from the token budgets.
    pub work: u32,
    /// What was counted, by kind, before the correction; `None` when byte length alone
    /// decided (a short question under a tokenizer that has no fast count).
    pub counts: Option<KindCounts>,
}

impl Classification {
    /// True when the input was counted; false when byte length alone decided.
    pub fn exact(&self) -> bool {
        self.counts.is_some()
    }
}

/// A request's text size and template overhead.
#[derive(Debug, Clone, Copy)]
struct InputSize {
    /// UTF-8 bytes of the text pieces.
    bytes: u64,
    /// Text pieces.
    pieces: u32,
    /// Template tokens around them.
    overhead: u32,
}

/// Sorts requests into lanes. Cheap to clone (the tokenizer is shared).
#[derive(Debug, Clone)]
pub struct Classifier {
    counter: TokenCounter,
    /// Prompts being tokenized at once: at most one per CPU, so a burst of long prompts
    /// queues here instead of crowding out the threads that relay tokens.
    pub(super) tokenizing: Arc<Semaphore>,
    /// The semaphore's size: `classify.max_concurrent_tokenizations`, 0 meaning the CPUs.
    cpus: usize,
    rules: LaneRules,
    default_output_tokens: u32,
    costs: TemplateCosts,
    max_model_len: u32,
    /// What the engine's counts taught (shared by clones, kept across reloads).
    calibration: Arc<Calibration>,
    /// `classify.exact_count_margin_percent` with `exact_count = "near_limits"`; `None`: off.
    exact_margin: Option<u32>,
}

/// Asks the engine for the request's exact prompt count (vLLM's `/tokenize`); `None` when it
/// could not say (an error, a timeout): the estimate then stands.
pub type EngineCount<'a> = &'a (dyn Fn() -> BoxFuture<'static, Option<u32>> + Send + Sync);

impl Classifier {
    /// Builds the classifier from config, loading `classify.tokenizer` (blocking file I/O: call
    /// at startup).
    pub fn from_config(config: &Config) -> Result<Self, ClassifyError> {
        let counter = TokenCounter::load(&config.classify.tokenizer)?;
        Ok(Self::with_counter(config, counter))
    }

    /// Builds the classifier from config with an already loaded counter.
    pub fn with_counter(config: &Config, counter: TokenCounter) -> Self {
        let c = &config.classify;
        let bounds = match counter {
            TokenCounter::Heuristic => (Floors::HEURISTIC, Ceilings::HEURISTIC),
            TokenCounter::HuggingFace { .. } => {
                (Floors::MODEL_TOKENIZER, Ceilings::MODEL_TOKENIZER)
            }
        };
        let cpus = match c.max_concurrent_tokenizations {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n as usize,
        };
        Self {
            counter,
            tokenizing: Arc::new(Semaphore::new(cpus)),
            cpus,
            rules: LaneRules::from_config(config),
            default_output_tokens: c.default_output_tokens.get(),
            costs: TemplateCosts {
                per_message: c.per_message_overhead,
                image_part: c.image_part_tokens,
                image_token_pixels: c.image_token_pixels,
                image_min_tokens: c.image_min_tokens,
                audio_part: c.audio_part_tokens,
                video_part: c.video_part_tokens,
            },
            max_model_len: config.upstream.max_model_len.get(),
            calibration: Arc::new(Calibration::with_bounds(bounds.0, bounds.1)),
            exact_margin: (c.exact_count == ExactCount::NearLimits)
                .then_some(c.exact_count_margin_percent),
        }
    }

    /// The correction this classifier applies, which the relay teaches from each response's
    /// `usage.prompt_tokens`.
    pub fn calibration(&self) -> &Arc<Calibration> {
        &self.calibration
    }

    /// Goes on from `old` (the classifier a reload replaces). When it counts the same way
    /// (same tokenizer and template charges) it keeps `old`'s correction itself, so a reload
    /// that only moves thresholds does not start over and the requests still running teach
    /// the correction in force. With as many tokenizations allowed at once it shares `old`'s
    /// permits, so the prompts `old` is still tokenizing count against the same limit.
    pub fn inherit(&mut self, old: &Classifier, same_counts: bool) {
        if same_counts {
            self.calibration = Arc::clone(&old.calibration);
        }
        if self.cpus == old.cpus {
            self.tokenizing = Arc::clone(&old.tokenizing);
        }
    }

    /// The lane for `work` estimated tokens (the first choice of [`LaneRules`]).
    pub fn lane_for(&self, work: u32) -> Lane {
        self.rules.first(work)
    }

    /// Prompts being tokenized right now (at most `classify.max_concurrent_tokenizations`, by
    /// default one per CPU).
    pub fn tokenizing(&self) -> usize {
        self.cpus
            .saturating_sub(self.tokenizing.available_permits())
    }

    /// The lane rules this classifier decides by.
    pub fn rules(&self) -> &LaneRules {
        &self.rules
    }

    /// Classifies a request with `max_output_tokens` requested by the client (`None`: not sent)
    /// for no model in particular ([`Classifier::classify_for`]).
    pub async fn classify(
        &self,
        input: Arc<PromptInput>,
        max_output_tokens: Option<u32>,
    ) -> Result<Classification, ClassifyError> {
        self.classify_for((None, None), input, max_output_tokens, None, true)
            .await
    }

    /// Classifies a request for `model` with `max_output_tokens` requested by the client
    /// (`None`: not sent).
    ///
    /// Rejects without counting what is over `max_model_len` even at the densest plausible
    /// text; counts a short prompt on the calling thread when the counter has a fast way;
    /// decides a short question from byte length when even its upper bound is small; counts
    /// anything else on a blocking thread, at most one prompt per CPU at a time (the others
    /// wait their turn). The count is corrected by what `model`'s responses taught, and those
    /// of `tenant`'s requests (`calibration.rs`, "Tenants"). With `classify.exact_count = "near_limits"` and an `engine` to ask,
    /// a counted request whose work comes within the margin of a lane boundary or of
    /// `max_model_len` (or is refused for length within it) takes the engine's count instead,
    /// which also teaches the correction when the request `teaches` (one whose engine count is
    /// not its prompt's, or whose text a template may drop, does not). Errors with
    /// [`ClassifyError::ExceedsModelLen`] when the request cannot fit the model.
    pub async fn classify_for(
        &self,
        (model, tenant): (Option<&str>, Option<&str>),
        input: Arc<PromptInput>,
        max_output_tokens: Option<u32>,
        engine: Option<EngineCount<'_>>,
        teaches: bool,
    ) -> Result<Classification, ClassifyError> {
        let size = self.size_of(&input);
        self.reject_by_bytes(size, max_output_tokens)?;
        let counts = match self.count_inline(&input, size) {
            Some(counts) => counts,
            None => {
                if let Some(decided) = self.small_by_bytes(&input, size, max_output_tokens)? {
                    return Ok(decided);
                }
                let counter = self.counter.clone();
                let counted = Arc::clone(&input);
                // The permit goes with the work: a caller that leaves does not stop a count
                // under way.
                let permit = Arc::clone(&self.tokenizing)
                    .acquire_owned()
                    .await
                    .map_err(|e| ClassifyError::Internal(e.to_string()))?;
                tokio::task::spawn_blocking(move || {
                    let n = counter.count_kinds(&counted);
                    drop(permit);
                    n
                })
                .await
                .map_err(ClassifyError::join)?
            }
        };
        let counts = self.with_template(&input, counts);
        let settled = match self.settle_counted((model, tenant), counts, max_output_tokens, None) {
            Err(e) if has_json_blocks(&input) => {
                let floor = self
                    .run_blocking(move |counter| compact_saving(counter, &input))
                    .await?;
                self.settle_counted((model, tenant), counts, max_output_tokens, Some(floor))
                    .map_err(|_| e)
            }
            decided => decided,
        };
        let Some(engine) = engine.filter(|_| self.near_a_limit(&settled)) else {
            return settled;
        };
        match engine().await {
            Some(exact) => {
                if teaches {
                    self.calibration
                        .observe_for(model.unwrap_or_default(), tenant, &counts, exact);
                }
                self.settle(exact, max_output_tokens, Some(counts))
            }
            None => settled,
        }
    }

    /// Whether `settled` came within `classify.exact_count_margin_percent` of a lane boundary
    /// or of `max_model_len` (a refusal for length within the margin too); always false with
    /// `exact_count = "off"`.
    fn near_a_limit(&self, settled: &Result<Classification, ClassifyError>) -> bool {
        let Some(percent) = self.exact_margin else {
            return false;
        };
        let margin = |limit: u32| u64::from(limit) * u64::from(percent) / 100;
        let max_len = u64::from(self.max_model_len);
        match settled {
            Ok(c) => {
                let work = u64::from(c.work);
                let near = |limit: u32| u64::from(limit).abs_diff(work) <= margin(limit);
                // Near the context: the prompt, which alone decides a refusal for length (an
                // output limit is lowered to the room the prompt leaves, and one above the
                // context is refused whatever the count).
                let input = u64::from(c.input_tokens_estimate);
                c.exact()
                    && (near(self.rules.small_max_work())
                        || near(self.rules.medium_max_work())
                        || input + margin(self.max_model_len) >= max_len)
            }
            // A prompt refused for filling the context by a little (an output limit above the
            // context is refused whatever the prompt's count).
            Err(ClassifyError::ExceedsModelLen {
                input_tokens,
                output_tokens,
                ..
            }) => {
                *output_tokens <= self.max_model_len
                    && u64::from(*input_tokens) <= max_len + margin(self.max_model_len)
            }
            Err(_) => false,
        }
    }

    /// Tokens of `input`'s stable prefix as the template renders it: its leading system
    /// messages, tools and template kwargs with their template tokens (0 for a prompt, or a
    /// chat without any). What a request can find cached of its prefix in vLLM's cache is at
    /// most this (and the next message's header): the prefill discount learns no more from
    /// one request (`crate::telemetry::cached_prefix`).
    pub async fn prefix_tokens(&self, input: &PromptInput) -> Result<u32, ClassifyError> {
        let PromptInput::Chat {
            messages,
            tools,
            template_kwargs,
        } = input
        else {
            return Ok(0);
        };
        let prefix = PromptInput::Chat {
            messages: messages
                .iter()
                .take_while(|m| m.role == "system")
                .cloned()
                .collect(),
            tools: tools.clone(),
            template_kwargs: template_kwargs.clone(),
        };
        let size = self.size_of(&prefix);
        let prefix = Arc::new(prefix);
        let text = match self.count_inline(&prefix, size) {
            Some(counts) => counts,
            None => {
                let counted = Arc::clone(&prefix);
                self.run_blocking(move |counter| counter.count_kinds(&counted))
                    .await?
            }
        };
        Ok(self.with_template(&prefix, text).total())
    }

    /// Runs `work` with this classifier's token counter on a blocking thread, under the same
    /// bound as tokenizing (`classify.max_concurrent_tokenizations`): CPU work on a request's
    /// text, such as focusing its code (M11), never runs on an async worker.
    pub async fn run_blocking<R: Send + 'static>(
        &self,
        work: impl FnOnce(&TokenCounter) -> R + Send + 'static,
    ) -> Result<R, ClassifyError> {
        let counter = self.counter.clone();
        let permit = Arc::clone(&self.tokenizing)
            .acquire_owned()
            .await
            .map_err(|e| ClassifyError::Internal(e.to_string()))?;
        tokio::task::spawn_blocking(move || {
            let out = work(&counter);
            drop(permit);
            out
        })
        .await
        .map_err(ClassifyError::join)
    }

    /// The same decision without the async runtime: counts on the calling thread when needed.
    /// For benchmarks and blocking callers.
    pub fn classify_blocking(
        &self,
        input: &PromptInput,
        max_output_tokens: Option<u32>,
    ) -> Result<Classification, ClassifyError> {
        let size = self.size_of(input);
        self.reject_by_bytes(size, max_output_tokens)?;
        let counts = match self.count_inline(input, size) {
            Some(counts) => counts,
            None => {
                if let Some(decided) = self.small_by_bytes(input, size, max_output_tokens)? {
                    return Ok(decided);
                }
                self.counter.count_kinds(input)
            }
        };
        let counts = self.with_template(input, counts);
        match self.settle_counted((None, None), counts, max_output_tokens, None) {
            Err(e) if has_json_blocks(input) => {
                let floor = compact_saving(&self.counter, input);
                self.settle_counted((None, None), counts, max_output_tokens, Some(floor))
                    .map_err(|_| e)
            }
            decided => decided,
        }
    }

    /// What classification reads off `input` before counting, measured once per request.
    fn size_of(&self, input: &PromptInput) -> InputSize {
        let (bytes, pieces) = input.text_bytes_and_pieces();
        InputSize {
            bytes,
            pieces,
            overhead: input.template_overhead(self.costs),
        }
    }

    /// Text counts of a short prompt when the counter has a fast way (`pieces.rs`, or the
    /// heuristic): here, faster than a hand-off to another thread.
    fn count_inline(&self, input: &PromptInput, size: InputSize) -> Option<KindCounts> {
        (size.bytes <= INLINE_BYTES)
            .then(|| self.counter.count_quick_kinds(input))
            .flatten()
    }

    /// `counts` of the text with the template's own tokens added (`input.rs`).
    fn with_template(&self, input: &PromptInput, text: KindCounts) -> KindCounts {
        let mut counts = input.template_costs(self.costs);
        for kind in ContentKind::ALL {
            counts.add(kind, text.of(kind));
        }
        counts.optional = text.optional;
        counts.tools_inflated = text.tools_inflated;
        counts
    }

    /// Rejects a request that is over `max_model_len` even at the densest plausible text
    /// (`bounds.rs`): certain without counting.
    fn reject_by_bytes(
        &self,
        size: InputSize,
        requested: Option<u32>,
    ) -> Result<(), ClassifyError> {
        let bounds = ByteBounds::new(size.bytes, size.pieces, size.overhead);
        self.settle(bounds.lower, requested, None).map(|_| ())
    }

    /// `Some` when byte length alone settles the small lane: even the upper bound (one token a
    /// byte, or the tighter bound this tokenizer's merges give) fits it; `None` to count.
    fn small_by_bytes(
        &self,
        input: &PromptInput,
        size: InputSize,
        requested: Option<u32>,
    ) -> Result<Option<Classification>, ClassifyError> {
        let overhead = size.overhead;
        let bounds = ByteBounds::new(size.bytes, size.pieces, overhead);
        let output = requested.unwrap_or(self.default_output_tokens);
        // Small for sure: even one token per byte (of the text as the tokenizer's normalizer
        // leaves it) fits the small lane (and the model).
        let non_ascii = || {
            let mut n = 0u64;
            input.for_each_text(|t| n += t.bytes().filter(|b| !b.is_ascii()).count() as u64);
            n
        };
        if let Some(split) = self
            .counter
            .byte_growth()
            .split_bytes(size.bytes, non_ascii)
        {
            let upper = ByteBounds::new(split, size.pieces, overhead).upper;
            let most = upper.saturating_add(output);
            if self.rules.first(most) == Lane::Small && most <= self.max_model_len {
                return self.settle(upper, requested, None).map(Some);
            }
        }
        // Small for sure by the tighter bound this tokenizer's merges give (a pass over the
        // bytes, no tokenizing); worth it only when the densest plausible count is small.
        if self.rules.first(bounds.lower.saturating_add(output)) == Lane::Small {
            if let Some(upper) = self.counter.pair_bound(input) {
                let upper = u32::try_from(upper)
                    .unwrap_or(u32::MAX)
                    .saturating_add(overhead);
                let most = upper.saturating_add(output);
                if self.rules.first(most) == Lane::Small && most <= self.max_model_len {
                    return self.settle(upper, requested, None).map(Some);
                }
            }
        }
        Ok(None)
    }

    /// Settles a counted request: the estimate is `counts` corrected for `model`
    /// (`calibration.rs`). With `compact` (the tokens the request's JSON blocks lose when
    /// rendered compact instead of pretty-printed), the request is refused only when even that
    /// rendering, uncorrected, cannot fit, and it then reserves at most what the model holds:
    /// a template that renders tools compactly must not turn a fitting request into a 400.
    fn settle_counted(
        &self,
        (model, tenant): (Option<&str>, Option<&str>),
        counts: KindCounts,
        requested: Option<u32>,
        compact: Option<u32>,
    ) -> Result<Classification, ClassifyError> {
        let estimate = self.calibration.correct_for(model, tenant, &counts);
        let Some(saving) = compact else {
            return self.settle(estimate, requested, Some(counts));
        };
        let floor = estimate.min(counts.total().saturating_sub(saving));
        let fits = self.settle(floor, requested, Some(counts))?;
        let room = self.max_model_len.saturating_sub(fits.output_budget);
        self.settle(estimate.min(room), requested, Some(counts))
    }

    /// Applies the output budget and the model-length rule to `input_tokens`, picks the lane.
    ///
    /// The rule is vLLM's (0.34: `TokenizeParams` refuses an output limit above the context,
    /// and a prompt that fills it; `get_max_tokens` lowers any other limit to the room the
    /// prompt leaves): an output limit the client sent is reserved up to that room, and sent
    /// to the engine as it was, which lowers it by its own count the same way. Refused: an
    /// output limit above `max_model_len` (no prompt would leave room for it), and a prompt
    /// that leaves no room for one token.
    fn settle(
        &self,
        input_tokens: u32,
        requested: Option<u32>,
        counts: Option<KindCounts>,
    ) -> Result<Classification, ClassifyError> {
        let room = self.max_model_len.saturating_sub(input_tokens);
        let too_long = |output_tokens| ClassifyError::ExceedsModelLen {
            input_tokens,
            output_tokens,
            max_model_len: self.max_model_len,
        };
        let output_budget = match requested {
            Some(n) if n > self.max_model_len => return Err(too_long(n)),
            Some(n) => n.min(room),
            // Not sent: the default, capped to the room left.
            None => self.default_output_tokens.min(room),
        };
        if room == 0 {
            return Err(too_long(requested.unwrap_or(1).max(1)));
        }
        let work = input_tokens + output_budget;
        Ok(Classification {
            lane: self.lane_for(work),
            input_tokens_estimate: input_tokens,
            output_budget,
            work,
            counts,
        })
    }
}

/// Whether `input` carries JSON blocks (`tools`, `chat_template_kwargs`) the gateway counts
/// pretty-printed, which a template may render more compactly.
fn has_json_blocks(input: &PromptInput) -> bool {
    matches!(input, PromptInput::Chat { tools, template_kwargs, .. }
        if tools.is_some() || template_kwargs.is_some())
}

/// Tokens the JSON blocks of `input` lose when rendered compact rather than pretty-printed.
/// Blocking CPU work.
fn compact_saving(counter: &TokenCounter, input: &PromptInput) -> u32 {
    let PromptInput::Chat {
        tools,
        template_kwargs,
        ..
    } = input
    else {
        return 0;
    };
    let mut saving = 0u32;
    for block in [tools, template_kwargs].into_iter().flatten() {
        let compact = serde_json::from_str::<serde_json::Value>(block)
            .map(|v| v.to_string())
            .unwrap_or_else(|_| block.clone());
        saving = saving.saturating_add(
            counter
                .count_text(block)
                .saturating_sub(counter.count_text(&compact)),
        );
    }
    saving
}

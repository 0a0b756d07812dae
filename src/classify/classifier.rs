//! The lane decision: estimated work = input tokens + output budget, compared to thresholds.

use std::sync::Arc;

use tokio::sync::Semaphore;

use super::bounds::ByteBounds;
use super::counter::TokenCounter;
use super::decision::LaneRules;
use super::error::ClassifyError;
use super::input::{PromptInput, TemplateCosts};
use super::pieces::INLINE_BYTES;
use crate::config::Config;
use crate::lane::Lane;

/// The outcome of classifying one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Classification {
    /// The lane the request waits in.
    pub lane: Lane,
    /// Input tokens, template overhead included: counted when `exact`, otherwise the byte-length
    /// bound or estimate documented in `bounds.rs`.
    pub input_tokens_estimate: u32,
    /// Output tokens budgeted: the client's max tokens, or `classify.default_output_tokens`
    /// capped to fit `max_model_len`. When the client sent none and the request cannot be
    /// promoted out of its lane, the pipeline sends this as `max_tokens` upstream so the
    /// reservation holds ([`super::LaneRules::output_cap`]).
    pub output_budget: u32,
    /// `input_tokens_estimate + output_budget`: what the lane is chosen by and what admission
    /// reserves from the token budgets.
    pub work: u32,
    /// True when the input was tokenized; false when byte length alone decided.
    pub exact: bool,
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
    tokenizing: Arc<Semaphore>,
    /// The semaphore's size: `classify.max_concurrent_tokenizations`, 0 meaning the CPUs.
    cpus: usize,
    rules: LaneRules,
    default_output_tokens: u32,
    costs: TemplateCosts,
    max_model_len: u32,
}

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
                audio_part: c.audio_part_tokens,
                video_part: c.video_part_tokens,
            },
            max_model_len: config.upstream.max_model_len.get(),
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

    /// Classifies a request with `max_output_tokens` requested by the client (`None`: not sent).
    ///
    /// Decides from byte length when it settles the lane (see `bounds.rs`); otherwise tokenizes
    /// on a blocking thread, at most one prompt per CPU at a time (the others wait their turn).
    /// The tokenizer's own thread pool is never used: it only serves batches. Errors with
    /// [`ClassifyError::ExceedsModelLen`] when the request cannot fit the model.
    pub async fn classify(
        &self,
        input: Arc<PromptInput>,
        max_output_tokens: Option<u32>,
    ) -> Result<Classification, ClassifyError> {
        let size = self.size_of(&input);
        if let Some(decided) = self.decide_by_bytes(&input, size, max_output_tokens)? {
            return Ok(decided);
        }
        let overhead = size.overhead;
        // A short prompt the fast way: here, faster than a hand-off to another thread.
        if size.bytes <= INLINE_BYTES {
            if let Some(text_tokens) = self.counter.count_quick(&input) {
                return self.settle(
                    text_tokens.saturating_add(overhead),
                    max_output_tokens,
                    true,
                );
            }
        }
        let counter = self.counter.clone();
        // The permit goes with the work: a caller that leaves does not stop a count under way.
        let permit = Arc::clone(&self.tokenizing)
            .acquire_owned()
            .await
            .map_err(|e| ClassifyError::Internal(e.to_string()))?;
        let text_tokens = tokio::task::spawn_blocking(move || {
            let n = counter.count_input(&input);
            drop(permit);
            n
        })
        .await
        .map_err(|e| ClassifyError::Internal(e.to_string()))?;
        self.settle(
            text_tokens.saturating_add(overhead),
            max_output_tokens,
            true,
        )
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
        .map_err(|e| ClassifyError::Internal(e.to_string()))
    }

    /// The same decision without the async runtime: tokenizes on the calling thread when needed.
    /// For benchmarks and blocking callers.
    pub fn classify_blocking(
        &self,
        input: &PromptInput,
        max_output_tokens: Option<u32>,
    ) -> Result<Classification, ClassifyError> {
        let size = self.size_of(input);
        if let Some(decided) = self.decide_by_bytes(input, size, max_output_tokens)? {
            return Ok(decided);
        }
        let tokens = self
            .counter
            .count_input(input)
            .saturating_add(size.overhead);
        self.settle(tokens, max_output_tokens, true)
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

    /// `Some` when byte length alone decides (or rejects) the request; `None` to tokenize.
    fn decide_by_bytes(
        &self,
        input: &PromptInput,
        size: InputSize,
        requested: Option<u32>,
    ) -> Result<Option<Classification>, ClassifyError> {
        let overhead = size.overhead;
        let bounds = ByteBounds::new(size.bytes, size.pieces, overhead);
        let output = requested.unwrap_or(self.default_output_tokens);
        // Small for sure: even one token per byte fits the small lane (and the model).
        let most = bounds.upper.saturating_add(output);
        if self.rules.first(most) == Lane::Small && most <= self.max_model_len {
            return self.settle(bounds.upper, requested, false).map(Some);
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
                    return self.settle(upper, requested, false).map(Some);
                }
            }
        }
        // Large for sure: even the densest plausible text exceeds the medium lane.
        if self.rules.first(bounds.lower.saturating_add(output)) == Lane::Large {
            // Too long even at the lower bound: certain, reject without tokenizing.
            self.settle(bounds.lower, requested, false)?;
            if let Ok(c) = self.settle(bounds.estimate, requested, false) {
                if c.lane == Lane::Large {
                    return Ok(Some(c));
                }
            }
            // Only the estimate is over max_model_len: an exact count must decide.
        }
        Ok(None)
    }

    /// Applies the output budget and the model-length rule to `input_tokens`, picks the lane.
    fn settle(
        &self,
        input_tokens: u32,
        requested: Option<u32>,
        exact: bool,
    ) -> Result<Classification, ClassifyError> {
        let room = self.max_model_len.saturating_sub(input_tokens);
        let output_budget = match requested {
            Some(n) => n,
            // Not sent: the default, capped to the room left, but at least one token.
            None => self.default_output_tokens.min(room).max(1),
        };
        if output_budget.max(1) > room {
            return Err(ClassifyError::ExceedsModelLen {
                input_tokens,
                output_tokens: output_budget,
                max_model_len: self.max_model_len,
            });
        }
        let work = input_tokens + output_budget;
        Ok(Classification {
            lane: self.lane_for(work),
            input_tokens_estimate: input_tokens,
            output_budget,
            work,
            exact,
        })
    }
}

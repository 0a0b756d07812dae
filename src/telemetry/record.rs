//! [`RequestRecord`]: everything measured about one request, written once when it ends: the
//! Prometheus series, the `llm.generate` span's attributes and the request log line.
//!
//! It is an RAII value: a record dropped before [`RequestRecord::finish`] is a client that went
//! away, counted as cancelled at the stage it had reached (queued, prefill or decode).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use super::admission_rate::Line;
use super::drift::{DriftSample, Signal};
use super::latency::{LatencySplit, Mark, StageSplit, UpstreamView};
use super::metrics::{Metrics, Outcome, Route, Stage};
use super::prefix_metrics::NO_REPLICA;
use super::request_log::{RequestLog, RequestLogLine};
use super::span;
use crate::classify::{Calibration, Classification};

/// The error code of a request refused or ended for its API key (missing, unknown or
/// revoked): `GatewayError::Unauthorized`'s, and a request's record when a revocation ends it.
pub const INVALID_API_KEY: &str = "invalid_api_key";

/// Whether a request's API key has left the keys in force.
#[derive(Clone)]
struct KeyLeft(std::sync::Arc<dyn Fn() -> bool + Send + Sync>);

impl std::fmt::Debug for KeyLeft {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("KeyLeft").field(&(self.0)()).finish()
    }
}

/// The measurements of one request in progress.
#[derive(Debug)]
pub struct RequestRecord {
    metrics: Metrics,
    log: RequestLog,
    span: tracing::Span,
    request_id: String,
    route: Route,
    arrival: Instant,
    class: Option<Classification>,
    /// What the engine's count teaches, and the model it counted for.
    calibration: Option<(Arc<Calibration>, String, Option<String>)>,
    admitted: Option<(Instant, Duration)>,
    first_token: bool,
    fingerprint: Option<String>,
    /// Cancelled when the shutdown's grace is over (see
    /// [`RequestRecord::ended_by_shutdown_after`]).
    shutdown: Option<tokio_util::sync::CancellationToken>,
    /// Whether the API key the request came with has left the keys in force (see
    /// [`RequestRecord::ended_by_revocation`]).
    key_left: Option<KeyLeft>,
    /// The prefill discount's key (`crate::prompt::discount_key`); the fingerprint when unset.
    discount_key: Option<String>,
    /// The tokens of that prefix itself: what the discount and the drift profile learn from
    /// this request's cached tokens at most (`crate::telemetry::cached_prefix`).
    prefix_tokens: Option<u32>,
    /// The replica that served the request (its `[[upstream.replicas]]` name).
    replica: Option<String>,
    tenant: Option<String>,
    incoming_traceparent: Option<String>,
    /// The prefill reservation admission took (estimated uncached prompt tokens).
    prefill_reserved: Option<u32>,
    /// Prompt tokens its pieces left cached, and whether the engine reports cached tokens
    /// (`crate::pipeline::pieces`).
    pieced: Option<(u32, bool)>,
    /// When each [`Mark`] was reached (the stage breakdown).
    marks: [Option<Instant>; 6],
    /// The lane it was admitted to, once a mid-stream promotion moved it.
    promoted_from: Option<crate::lane::Lane>,
    /// A refusal for the wait (a queue timeout, a full queue, a deadline the predicted wait
    /// misses) that the client brought on itself: not filed as its lane missing its objective
    /// ([`RequestRecord::not_the_lanes_miss`]).
    own_miss: bool,
    done: bool,
}

impl RequestRecord {
    /// Starts the record (and its span) of a request that arrived at `arrival`.
    pub fn new(
        metrics: Metrics,
        log: RequestLog,
        route: Route,
        request_id: String,
        arrival: Instant,
    ) -> Self {
        let span = span::llm_generate();
        span.record(span::REQUEST_ID, request_id.as_str());
        span.record(span::ROUTE, route.as_str());
        span.record(
            span::GEN_AI_OPERATION,
            match route {
                Route::Completions => "text_completion",
                Route::ChatCompletions | Route::Answer | Route::Job => "chat",
            },
        );
        Self {
            metrics,
            log,
            span,
            request_id,
            route,
            arrival,
            class: None,
            calibration: None,
            admitted: None,
            first_token: false,
            fingerprint: None,
            shutdown: None,
            key_left: None,
            discount_key: None,
            prefix_tokens: None,
            replica: None,
            tenant: None,
            incoming_traceparent: None,
            prefill_reserved: None,
            pieced: None,
            marks: [None; 6],
            promoted_from: None,
            own_miss: false,
            done: false,
        }
    }

    /// Joins the client's trace: its `traceparent` becomes the parent of this request's span.
    pub fn link(&mut self, traceparent: Option<&str>, tracestate: Option<&str>) {
        super::otel::set_parent(&self.span, traceparent, tracestate);
        self.incoming_traceparent = traceparent.map(str::to_owned);
    }

    /// The `traceparent` to send to vLLM, so its span joins this request's trace.
    pub fn upstream_traceparent(&self) -> Option<String> {
        super::otel::traceparent_for(&self.span, self.incoming_traceparent.as_deref())
    }

    /// The `llm.generate` span.
    pub fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// The gateway's request id.
    pub fn request_id(&self) -> &str {
        &self.request_id
    }

    /// The route it came by.
    pub fn route(&self) -> Route {
        self.route
    }

    /// When the request arrived.
    pub fn arrival(&self) -> Instant {
        self.arrival
    }

    /// Counts the request from `at` on, its stage marks forgotten: a job kept in process is
    /// measured from the moment its run was taken, as a shared store's run is (its wait in the
    /// job queue is `tutor_gateway_job_wait_seconds`, not a first token the lane was slow to
    /// give).
    pub fn runs_from(&mut self, at: Instant) {
        self.arrival = at;
        self.marks = [None; 6];
    }

    /// Its prompt was prefilled in pieces, leaving `prefix` tokens cached; `reports_cached`:
    /// the engine reported cached tokens on a piece (an absent count then means none).
    pub fn pieced(&mut self, prefix: u32, reports_cached: bool) {
        self.pieced = Some((prefix, reports_cached));
    }

    /// When it was admitted and how long it waited.
    pub fn admitted_at(&self) -> Option<(Instant, Duration)> {
        self.admitted
    }

    /// Records the model asked for and the declared output limit.
    /// The model name is the client's: on the span it is cut to 128 visible ASCII characters
    /// (others become `?`).
    pub fn requested(&mut self, model: &str, max_tokens: Option<u32>) {
        let shown = super::text::printable(model, 128);
        self.span.record(span::GEN_AI_REQUEST_MODEL, shown.as_str());
        if let Some(m) = max_tokens {
            self.span
                .record(span::GEN_AI_REQUEST_MAX_TOKENS, i64::from(m));
        }
    }

    /// Records the prompt fingerprint.
    pub fn fingerprint(&mut self, fp: String) {
        self.span.record(span::PROMPT_FINGERPRINT, fp.as_str());
        self.fingerprint = Some(fp);
    }

    /// Records the key its cached tokens teach the prefill discount under (never logged), and
    /// the tokens of that prefix itself.
    pub fn discount_key(&mut self, key: String, prefix_tokens: u32) {
        self.discount_key = Some(key);
        self.prefix_tokens = Some(prefix_tokens);
    }

    /// A request dropped unfinished once `end` is cancelled (the shutdown's grace is over)
    /// was ended by the shutdown: recorded with error code `shutdown`, not as its client gone.
    pub fn ended_by_shutdown_after(&mut self, end: tokio_util::sync::CancellationToken) {
        self.shutdown = Some(end);
    }

    /// A request dropped unfinished once `key_left` says its API key left the keys in force
    /// (`[auth]`: revoked) was ended by the revocation (the auth layer ends such a request's
    /// stream, or answers it 401 while it waits): recorded with error code `invalid_api_key`,
    /// not as its client gone.
    pub fn ended_by_revocation(&mut self, key_left: impl Fn() -> bool + Send + Sync + 'static) {
        self.key_left = Some(KeyLeft(std::sync::Arc::new(key_left)));
    }

    /// Whether the API key the request came with has left the keys in force.
    pub fn key_revoked(&self) -> bool {
        self.key_left.as_ref().is_some_and(|k| (k.0)())
    }

    /// Records the replica that served the request (a name from `[[upstream.replicas]]`): the
    /// drift profile it is compared with, and the `replica` label of its drift.
    pub fn served_by(&mut self, replica: &str) {
        self.replica = Some(replica.to_owned());
    }

    /// Records the tenant the request's API key belongs to.
    pub fn tenant(&mut self, tenant: &str) {
        self.tenant = Some(tenant.to_owned());
    }

    /// Records what focusing did to the code (M11): its outcome and the tokens it saved.
    pub fn focused(&mut self, outcome: &str, tokens_saved: u32) {
        self.span.record(span::FOCUS_OUTCOME, outcome);
        self.span
            .record(span::FOCUS_TOKENS_SAVED, i64::from(tokens_saved));
    }

    /// Records the lane decision.
    pub fn classified(&mut self, class: Classification) {
        self.span.record(span::LANE, class.lane.as_str());
        self.span.record(
            span::INPUT_TOKENS_ESTIMATED,
            i64::from(class.input_tokens_estimate),
        );
        self.class = Some(class);
    }

    /// The response's `usage.prompt_tokens` will teach `calibration` for `model` (and for
    /// `tenant`'s requests) how far off the classification's count was
    /// (`classify::calibration`).
    pub fn calibrates(&mut self, calibration: Arc<Calibration>, model: &str, tenant: Option<&str>) {
        self.calibration = Some((
            calibration,
            super::text::printable(model, 128),
            tenant.map(str::to_owned),
        ));
    }

    /// What [`Self::calibrates`] set: the correction, the model and the tenant a count of
    /// this request's prompt teaches (`None`: it teaches nothing).
    pub fn lesson(&self) -> Option<(Arc<Calibration>, String, Option<String>)> {
        self.calibration.clone()
    }

    /// Records that the request's reservation grew to `tokens` mid-stream (in its lane, or
    /// moved): the request log's `tokens_reserved` says what it held at the end.
    pub fn reserved(&mut self, tokens: u32) {
        if let Some(class) = &mut self.class {
            class.work = class.work.max(tokens);
        }
    }

    /// Records a mid-stream move to a bigger lane: the request is counted in `to` from now on;
    /// its waits and first token stay in the lane it was admitted to.
    pub fn promoted(&mut self, from: crate::lane::Lane, to: crate::lane::Lane) {
        if let Some(class) = &mut self.class {
            class.lane = to;
        }
        let first = *self.promoted_from.get_or_insert(from);
        self.span.record(span::LANE, to.as_str());
        self.span.record(span::PROMOTED_FROM, first.as_str());
    }

    /// Records admission after `queue_wait`, holding a prefill reservation of `prefill`
    /// tokens (the request log's `prefill_tokens_reserved`), from its lane's line of long
    /// prompts (`long`: it waited for prefill room too) or its other line.
    pub fn admitted(&mut self, queue_wait: Duration, prefill: u32, long: bool) {
        let now = Instant::now();
        if let Some(class) = &self.class {
            self.metrics
                .admission_rate()
                .admitted(Line::new(class.lane, long), queue_wait);
        }
        self.admitted = Some((now, queue_wait));
        self.prefill_reserved = Some(prefill);
        self.mark_at(Mark::Admitted, now);
    }

    /// Notes that the request reached `mark` now (the first time only).
    pub fn mark(&mut self, mark: Mark) {
        self.marks[mark.index()].get_or_insert_with(Instant::now);
    }

    /// Notes that the request reached `mark` at `at` (the first time only).
    pub fn mark_at(&mut self, mark: Mark, at: Instant) {
        self.marks[mark.index()].get_or_insert(at);
    }

    /// Records how long a long prompt waited for room in the prefill budget (before admission;
    /// part of the queue wait): the `llm.prefill_wait_ms` attribute and
    /// `tutor_gateway_prefill_wait_seconds`.
    pub fn prefill_waited(&mut self, wait: Duration) {
        self.span
            .record(span::PREFILL_WAIT_MS, wait.as_secs_f64() * 1000.0);
        if let Some(class) = &self.class {
            self.metrics.prefill_waited(class.lane, wait);
        }
    }

    /// Records that tokens started flowing.
    pub fn first_token(&mut self) {
        self.first_token = true;
    }

    fn stage(&self) -> Stage {
        match (self.admitted, self.first_token) {
            (None, _) => Stage::Queued,
            (Some(_), false) => Stage::Prefill,
            (Some(_), true) => Stage::Decode,
        }
    }

    /// Lets the record go without counting it: the request lives on under another record (a
    /// job kept in the shared store is sent, and counted, by the run that takes it, whose span
    /// continues this one's trace). Its span ends here.
    pub fn hand_over(mut self) {
        self.done = true;
    }

    /// Marks a refusal for the wait as the client's own doing (its tenant over its share, or
    /// a deadline shorter than the lane's objective): the autopilot's window does not count
    /// it as the lane missing its objective. One client's refusals were infinitely late first
    /// tokens for everyone's objective: with `x-tutor-deadline-ms: 1` they halved the large
    /// seats and the prefill budget every few seconds, at no cost to it.
    pub fn not_the_lanes_miss(&mut self) {
        self.own_miss = true;
    }

    /// Ends the record: metrics, span attributes, request log line. Later calls do nothing.
    /// `error_code` names the error of a failed request; `up` is what the upstream stream knew.
    pub fn finish(
        &mut self,
        outcome: Outcome,
        error_code: Option<&str>,
        up: Option<&UpstreamView>,
    ) {
        if self.done {
            return;
        }
        self.done = true;
        let lane = self.class.map(|c| c.lane);
        let split = LatencySplit::compute(self.arrival, self.admitted, up, Instant::now());
        let stage = (outcome == Outcome::Cancelled).then(|| self.stage());
        self.metrics.request_done(lane, self.route, outcome);
        if let (
            Some(l),
            Outcome::QueueTimeout | Outcome::QueueFull | Outcome::DeadlineUnmet,
            false,
        ) = (lane, outcome, self.own_miss)
        {
            // Refused for its wait: a first token that never came.
            self.metrics.ttft_window().missed(l);
        }
        if let (Some(lane), Outcome::UpstreamTimeout, false) = (lane, outcome, self.first_token) {
            // The engine never gave its first token in time: infinitely late for the autopilot,
            // as a refusal for the wait is (an objective is not met by the engine stalling
            // either), after the wait for admission it had (the queue did not take it all).
            let waited = self
                .admitted
                .map_or(f64::INFINITY, |(_, w)| w.as_secs_f64());
            self.metrics.ttft_window().observe(
                self.promoted_from.unwrap_or(lane),
                f64::INFINITY,
                waited,
                Duration::ZERO,
            );
        }
        // A client that went away: a cancel with no error of its own. One the gateway ended
        // (its shutdown's grace over, a client too slow to read, a revoked key) is in
        // `requests_total` and the log, but not among clients giving up on their answers.
        if let Some(stage) = stage.filter(|_| error_code.is_none()) {
            self.metrics
                .cancelled(lane, stage, up.map_or(0, |u| u.output_tokens));
            self.span.record(
                span::CANCELLED_AFTER_TOKENS,
                i64::from(up.map_or(0, |u| u.output_tokens)),
            );
        }
        if let Some(lane) = lane {
            let first = self.promoted_from.unwrap_or(lane);
            self.metrics.observe(first, lane, &split, up);
        }
        if matches!(
            outcome,
            Outcome::UpstreamUnavailable | Outcome::UpstreamError
        ) {
            // The engine went away or failed: it may come back with an empty prefix cache, and
            // a discount learnt before would admit its cold prefills as cached ones until a
            // request of each prefix finished again.
            self.metrics.prefix().forget_cached();
        }
        self.observe_prefix(up);
        self.observe_estimate(up);
        self.observe_pieces(outcome, up);
        self.record_span(outcome, error_code, &split, up);
        let usage = up.and_then(|u| u.usage);
        self.log.write(&RequestLogLine {
            ts_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            request_id: &self.request_id,
            route: self.route.as_str(),
            lane: lane.map(|l| l.as_str()),
            promoted_from: self.promoted_from.map(|l| l.as_str()),
            outcome: outcome.as_str(),
            cancelled_at: stage.map(Stage::as_str),
            error_code,
            input_tokens_estimated: self.class.map(|c| c.input_tokens_estimate),
            input_tokens_exact: self.class.map(|c| c.exact()),
            input_tokens_counted: self.class.and_then(|c| c.counts).map(|c| c.total()),
            tokens_reserved: self.class.map(|c| c.work),
            input_tokens: usage.map(|u| u.prompt_tokens),
            output_tokens: up.map(|u| u.output_tokens),
            // Unknown (null) unless the final usage said it.
            cached_tokens: usage
                .filter(|u| u.reported)
                .map(|u| u.cached_tokens.unwrap_or(0)),
            prefill_tokens_reserved: self.prefill_reserved,
            fingerprint: self.fingerprint.as_deref(),
            tenant: self.tenant.as_deref(),
            finish_reason: up.and_then(|u| u.finish_reason.as_deref()),
            timings: split,
            stages_us: StageSplit::from_marks(self.arrival, &self.marks),
        });
    }

    /// The prompt tokens its pieces had prefilled that the engine computed again. Judged only on
    /// a stream that ended on its own: vLLM puts `cached_tokens` on the final usage alone, so
    /// a cut or cancelled stream's last usage says nothing about the cache.
    fn observe_pieces(&self, outcome: Outcome, up: Option<&UpstreamView>) {
        let (Some((prefix, reports)), Some(usage)) = (self.pieced, up.and_then(|u| u.usage)) else {
            return;
        };
        if outcome != Outcome::Ok {
            return;
        }
        if reports || usage.cached_tokens.is_some() {
            let cached = usage.cached_tokens.unwrap_or(0);
            self.metrics
                .pieces()
                .recomputed(prefix.saturating_sub(cached));
        }
    }

    /// Per-fingerprint cache counters and drift per replica (M18, M19). Drift is judged on
    /// what vLLM reported: cached tokens, and its own prefill (`time_to_first_token_ms -
    /// queue_time_ms`), never the gateway's admission-to-first-token time, which includes the
    /// engine's queue. Logs the evidence (replica, hash, token counts, engine timings), never
    /// prompt text (M20).
    fn observe_prefix(&self, up: Option<&UpstreamView>) {
        let (Some(fp), Some(up)) = (self.fingerprint.as_deref(), up) else {
            return;
        };
        let Some(u) = up.usage else { return };
        // Only the stream's final usage says what was cached (a stream cut short reports its
        // running count without it): nothing is learnt, and no hit counted, from one without.
        if !u.reported {
            return;
        }
        let engine_queue_ms = up.engine.and_then(|e| e.queue_time_ms);
        let engine_prefill_ms = up
            .engine
            .and_then(|e| Some((e.time_to_first_token_ms? - e.queue_time_ms?).max(0.0)));
        let replica = self.replica.as_deref().unwrap_or(NO_REPLICA);
        // vLLM leaves the cached count out when it is 0 (and without
        // --enable-prompt-tokens-details): absent reads as nothing cached.
        let cached = u.cached_tokens.unwrap_or(0);
        // What it found cached of its prefix: at most the prefix's own tokens and the next
        // header. Beyond them (a long message sent again, a session's history) the cache held
        // this request's own text, which neither the discount nor the drift profile of the
        // prefix may learn; nor the prefill per uncached token, whose share is then unknown.
        let cap = self
            .prefix_tokens
            .map(|p| p.saturating_add(super::cached_prefix::NEXT_HEADER));
        let of_prefix = cap.map_or(cached, |c| cached.min(c));
        let sample = DriftSample {
            prompt_tokens: u.prompt_tokens,
            cached_tokens: of_prefix,
            engine_prefill_ms: engine_prefill_ms.filter(|_| of_prefix == cached),
        };
        self.metrics
            .prefix()
            .observe_cached(self.discount_key.as_deref().unwrap_or(fp), of_prefix);
        let Some(v) = self
            .metrics
            .prefix()
            .observe_as(
                replica,
                fp,
                self.discount_key.as_deref().unwrap_or(fp),
                self.tenant.as_deref(),
                (sample, cached),
            )
            .filter(|v| v.log)
        else {
            return;
        };
        match v.signal {
            Signal::CachedTokens => tracing::warn!(
                request_id = %self.request_id,
                replica,
                fingerprint = fp,
                signal = v.signal.as_str(),
                expected_cached_tokens = v.expected,
                cached_tokens = cached,
                input_tokens = u.prompt_tokens,
                engine_prefill_ms,
                engine_queue_ms,
                "prefix cache drift: this prompt found far fewer cached tokens on its replica \
                 than its profile there (evicted, or the prefix bytes changed?)"
            ),
            Signal::Prefill => tracing::warn!(
                request_id = %self.request_id,
                replica,
                fingerprint = fp,
                signal = v.signal.as_str(),
                expected_prefill_ms_per_uncached_token = v.expected,
                observed_prefill_ms_per_uncached_token = v.observed,
                engine_prefill_ms,
                engine_queue_ms,
                input_tokens = u.prompt_tokens,
                cached_tokens = cached,
                "prefix cache drift: this prompt's prefill per uncached token costs far more on \
                 its replica than its profile there, several requests in a row, with its usual \
                 cached tokens (cached blocks from a slower tier, or a saturated engine?)"
            ),
        }
    }

    /// The estimate against the engine's count: the error histogram by kind, and the lesson
    /// for the correction (a counted request only; the learning rule is `calibration.rs`'s).
    fn observe_estimate(&self, up: Option<&UpstreamView>) {
        let (Some(class), Some(usage)) = (self.class, up.and_then(|u| u.usage)) else {
            return;
        };
        let actual = usage.prompt_tokens;
        let kind = class.counts.map(|c| c.dominant());
        self.metrics
            .estimate()
            .observe(kind, class.input_tokens_estimate, actual);
        if let (Some(counts), Some((calibration, model, tenant))) =
            (class.counts, &self.calibration)
        {
            calibration.observe_for(model, tenant.as_deref(), &counts, actual);
        }
    }

    fn record_span(
        &self,
        outcome: Outcome,
        error_code: Option<&str>,
        split: &LatencySplit,
        up: Option<&UpstreamView>,
    ) {
        let s = &self.span;
        s.record(span::OUTCOME, outcome.as_str());
        if let Some(code) = error_code {
            s.record(span::ERROR_TYPE, code);
            if outcome.is_fault() {
                s.record(span::STATUS_DESCRIPTION, code);
            }
        }
        let ms = [
            (span::QUEUE_WAIT_MS, split.queue_wait_ms),
            (span::TTFT_MS, split.ttft_ms),
            (span::TIME_TO_FIRST_TOKEN_MS, split.time_to_first_token_ms),
            (span::TIME_TO_FIRST_ANSWER_MS, split.time_to_first_answer_ms),
            (span::PREFILL_MS, split.prefill_ms),
            (span::ENGINE_QUEUE_MS, split.engine_queue_ms),
            (span::DECODE_TPS, split.decode_tps),
        ];
        for (name, v) in ms {
            if let Some(v) = v {
                s.record(name, v);
            }
        }
        if let Some(up) = up {
            s.record(span::OUTPUT_TOKENS, i64::from(up.output_tokens));
            s.record(
                span::GEN_AI_USAGE_OUTPUT_TOKENS,
                i64::from(up.output_tokens),
            );
            if let Some(u) = up.usage {
                s.record(span::INPUT_TOKENS, i64::from(u.prompt_tokens));
                s.record(span::GEN_AI_USAGE_INPUT_TOKENS, i64::from(u.prompt_tokens));
                if u.reported {
                    s.record(span::CACHED_TOKENS, i64::from(u.cached_tokens.unwrap_or(0)));
                }
            }
            if let Some(f) = &up.finish_reason {
                s.record(span::GEN_AI_FINISH_REASONS, f.as_str());
            }
        }
        s.record(span::GEN_AI_RESPONSE_ID, self.request_id.as_str());
    }
}

impl Drop for RequestRecord {
    fn drop(&mut self) {
        if !self.done {
            if std::thread::panicking() {
                // Unwound by a panic (a bug) while it was served: not its client's doing.
                self.finish(Outcome::Internal, Some("internal"), None);
                return;
            }
            if self.shutdown.as_ref().is_some_and(|end| end.is_cancelled()) {
                // Dropped by the shutdown at the end of its grace (its client got 503
                // `shutdown`).
                self.finish(Outcome::Cancelled, Some("shutdown"), None);
                return;
            }
            if self.key_revoked() {
                // Its key revoked while it waited (its client got 401).
                self.finish(Outcome::Cancelled, Some(INVALID_API_KEY), None);
                return;
            }
            // Dropped unfinished: the client went away (the HTTP server dropped the handler or
            // the response body).
            // At debug: a client can leave thousands of times a second (counted in
            // `tutor_gateway_cancellations_total` and the request log).
            tracing::debug!(request_id = %self.request_id, stage = self.stage().as_str(), "client disconnected");
            self.finish(Outcome::Cancelled, None, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lane::Lane;
    use crate::telemetry::latency::{EngineTimings, PromptUsage};

    /// One finished `/answer` request on `replica-0`: `fp`, `prompt` tokens of which `cached`
    /// were cached, `queue_ms` in the engine's queue, then `prefill_ms` of engine prefill.
    fn request(
        metrics: &Metrics,
        fp: &str,
        prompt: u32,
        cached: u32,
        queue_ms: f64,
        prefill_ms: f64,
    ) {
        let (log, _) = RequestLog::memory();
        let mut r = RequestRecord::new(
            metrics.clone(),
            log,
            Route::Answer,
            "r".into(),
            Instant::now(),
        );
        r.fingerprint(fp.to_owned());
        r.admitted(Duration::ZERO, prompt, false);
        r.served_by("replica-0");
        let admitted = r.admitted_at().unwrap().0;
        // What the gateway sees: admission to first token, the engine's queue included.
        let first = admitted + Duration::from_secs_f64((queue_ms + prefill_ms + 2.0) / 1000.0);
        let up = UpstreamView {
            output_tokens: 5,
            exact_output: true,
            usage: Some(PromptUsage {
                prompt_tokens: prompt,
                cached_tokens: Some(cached),
                reported: true,
            }),
            engine: Some(EngineTimings {
                time_to_first_token_ms: Some(queue_ms + prefill_ms),
                queue_time_ms: Some(queue_ms),
            }),
            first_content_at: Some(first),
            first_answer_at: Some(first),
            ended_at: Some(first + Duration::from_millis(10)),
            finish_reason: Some("stop".into()),
        };
        r.finish(Outcome::Ok, None, Some(&up));
    }

    /// A small `/answer` question that arrived at `arrival`, admitted on arrival.
    fn admitted_question(metrics: &Metrics, arrival: Instant) -> RequestRecord {
        let (log, _) = RequestLog::memory();
        let mut r = RequestRecord::new(metrics.clone(), log, Route::Answer, "r".into(), arrival);
        r.classified(Classification {
            lane: Lane::Small,
            input_tokens_estimate: 100,
            output_budget: 500,
            work: 600,
            counts: None,
        });
        r.admitted(Duration::ZERO, 100, false);
        r
    }

    /// A 20 s answer whose first token came 1 s after arrival: the autopilot's window files
    /// that first token when it came (20 s before the end), so a read of the first tokens
    /// since a change 5 s ago does not judge it.
    #[test]
    fn a_long_answers_first_token_is_filed_when_it_came_not_when_the_answer_ended() {
        let metrics = Metrics::new();
        let arrival = Instant::now() - Duration::from_secs(21);
        let mut r = admitted_question(&metrics, arrival);
        let first = arrival + Duration::from_secs(1);
        let up = UpstreamView {
            output_tokens: 2_000,
            exact_output: true,
            first_content_at: Some(first),
            first_answer_at: Some(first),
            ended_at: Some(Instant::now()),
            finish_reason: Some("stop".into()),
            ..UpstreamView::default()
        };
        r.finish(Outcome::Ok, None, Some(&up));
        let window = metrics.ttft_window();
        let since = window.quantile(Lane::Small, 0.99, Duration::from_secs(5));
        assert!(since.is_none(), "{since:?}");
        let whole = window
            .quantile(Lane::Small, 0.99, Duration::from_secs(30))
            .unwrap();
        assert_eq!(whole.samples, 1);
        assert!((whole.seconds - 1.0).abs() < 0.01, "{whole:?}");
    }

    /// An admitted question whose first token never came in time (the engine stalled:
    /// `upstream_timeout`) is a first token infinitely late for the autopilot, as a refusal
    /// for the wait is; one that timed out mid-answer had its first token filed already.
    #[test]
    fn a_first_token_that_never_came_from_the_engine_counts_as_infinitely_late() {
        let metrics = Metrics::new();
        let ended = |first_token: bool| {
            let mut r = admitted_question(&metrics, Instant::now());
            if first_token {
                r.first_token();
            }
            r.finish(Outcome::UpstreamTimeout, Some("upstream_timeout"), None);
        };
        ended(true);
        let window = metrics.ttft_window();
        let read = || window.quantile(Lane::Small, 0.99, Duration::from_secs(30));
        assert!(read().is_none(), "mid-answer: {:?}", read());
        ended(false);
        let q = read().unwrap();
        assert_eq!(q.samples, 1);
        assert!(q.seconds.is_infinite(), "{q:?}");
        // Its wait for admission was none: the engine, not the queue, took the time.
        let waited = window
            .wait_quantile(Lane::Small, 0.99, Duration::from_secs(30))
            .unwrap();
        assert!(waited.seconds < 1.0, "{waited:?}");
    }

    #[test]
    fn a_growing_engine_queue_is_not_drift_and_an_eviction_is_counted_on_its_replica() {
        let metrics = Metrics::new();
        // No shared prefix, nothing cached; the engine's queue grows from 0 to 4 s while its
        // own prefill stays ~20 ms: admission to first token grows 200x.
        for i in 0..40 {
            request(&metrics, "noprefix", 400, 0, 100.0 * f64::from(i), 20.0);
        }
        // A course under the same load: 1,800 of 2,000 tokens cached throughout.
        for i in 0..20 {
            request(&metrics, "course", 2000, 1800, 200.0 * f64::from(i), 20.0);
        }
        assert_eq!(metrics.prefix().drift_total(), 0);
        // The course's prefix is evicted: the next request finds nothing cached.
        request(&metrics, "course", 2000, 0, 0.0, 200.0);
        assert_eq!(metrics.prefix().drift_total(), 1);
    }
}

//! The classify step: a [`Prepared`] request becomes a [`Ready`] one: its lane (estimated work,
//! then the continuation choice for a session), its reservations, and its body shaped for the
//! engine, here and nowhere else (`for_engine`).

use std::sync::Arc;

use futures::FutureExt;
use serde_json::{Map, Value};

use super::ctx::RequestCtx;
use super::prompt::Prepared;
use super::state::BytesHold;
use super::tenant::Tenant;
use super::tokenize::{engine_count, tokenize_body};
use crate::admission::session::SessionHold;
use crate::admission::tenant_budget::BudgetHold;
use crate::classify::{Classification, KindCounts, PromptInput};
use crate::error::GatewayError;
use crate::lane::Lane;
use crate::prompt::{discount_key, fingerprint_of_chat};
use crate::telemetry::estimate_metrics::ExactOutcome;
use crate::telemetry::{Mark, RequestRecord};
use crate::upstream::Endpoint;

/// A request classified and shaped for the engine, not yet admitted: what admission needs
/// (`class.lane`, `class.work`, `prefill`) and what is sent.
#[derive(Debug)]
pub struct Ready {
    pub(super) endpoint: Endpoint,
    pub(super) body: Map<String, Value>,
    /// Lane, work (the token reservation) and estimates.
    pub class: Classification,
    /// The prefill reservation: the input estimate, less what its prefix usually finds cached.
    pub prefill: u32,
    /// What the request keeps in memory: its bytes as received and, for a JSON body, its
    /// parsed form's ([`crate::pipeline::parse::held_bytes`]); a job of it is counted so.
    pub size: usize,
    /// Its body's bytes and parsed form's, held in `server.max_queued_bytes` since the body was
    /// read; admission takes the hold over (`None`: admission holds `size`).
    pub(super) queued: Option<BytesHold>,
    /// The session's reservation: settled by the relay, given back on any failure (drop).
    pub(super) hold: Option<SessionHold>,
    /// Its tenant's budget charge (`[auth.tenants.<name>]`): settled by the relay to what the
    /// engine counted, nothing charged on any failure before it (drop).
    pub(super) budget: Option<BudgetHold>,
    /// Whose request it is.
    pub(super) tenant: Option<Tenant>,
    /// The id of the API key it came with (`[auth]`): a job ends when that key is revoked.
    pub(super) key_id: Option<String>,
    /// The replica routing key: the prefix fingerprint of a prompt with a stable prefix.
    pub(super) affinity: Option<String>,
    /// The `focus` object of the `/answer` `meta` event (M11).
    pub(super) focus: Option<Value>,
    /// How long after arrival its first token is still useful (`x-tutor-deadline-ms`).
    pub(super) deadline: Option<std::time::Duration>,
    /// A large `/answer` that may borrow an idle seat, pre-emptible (`jobs.preempt_answers`).
    pub(super) preemptible: bool,
}

/// Whether what the engine counts of `body` (its usage, or its exact count) may teach the
/// correction. Not for every request. A prompt vLLM truncates (`truncate_prompt_tokens`) is
/// counted as sent (the reservation covers it), but its engine count is not the prompt's: it
/// would teach the correction, shared by every client, to count short. So is one with
/// `chat_template_kwargs`: a template renders a value where it uses it, or drops it (an unknown
/// key), and 2,000 words the engine never saw taught the line a later rendered value is
/// counted by four times too short. Nor one with tools and `tool_choice: "none"`: vLLM run
/// with `--exclude-tools-when-tool-choice-none` leaves the counted tools out of the template,
/// and twenty such requests taught the tools' correction its floor (a quarter).
fn teaches(body: &Map<String, Value>) -> bool {
    let tools_left_out = body.get("tool_choice").and_then(Value::as_str) == Some("none")
        && body.get("tools").is_some_and(|t| !t.is_null());
    !tools_left_out
        && ["truncate_prompt_tokens", "chat_template_kwargs"]
            .iter()
            .all(|field| body.get(*field).is_none_or(Value::is_null))
}

impl Ready {
    /// Whether the engine's count of it may teach the correction ([`teaches`]); never the
    /// gateway's own continuation of a pre-empted answer, whose counts are the original
    /// prompt's while the engine counts the answer so far with it.
    pub fn teaches(&self) -> bool {
        teaches(&self.body) && !crate::upstream::request::continues_answer(&self.body)
    }

    /// The model the body names (`None`: the engine's default).
    pub fn model(&self) -> Option<&str> {
        self.body.get("model").and_then(Value::as_str)
    }

    /// Whose request it is.
    pub fn tenant(&self) -> Option<&Tenant> {
        self.tenant.as_ref()
    }

    /// The id of the API key it came with (`[auth]`).
    pub fn key_id(&self) -> Option<&str> {
        self.key_id.as_deref()
    }

    /// Charges a job's run to its tenant's budget (`[auth.tenants.<name>]`) as it starts, its
    /// reservation, settled by the relay to what the engine counted (nothing when it fails
    /// before the engine): what jobs use counts toward the tenant's minute and day as its
    /// requests do. Never refused here: the job was let through when it was submitted (a
    /// submission is refused while its tenant is over budget). Nothing when the run is already
    /// charged (a diverted `/answer` keeps its charge) or the tenant has no budget.
    pub async fn charge_run(&mut self, ctx: &RequestCtx) {
        if self.budget.is_some() {
            return;
        }
        let Some(tenant) = &self.tenant else {
            return;
        };
        if !ctx.config().auth.tenants.contains_key(&tenant.0) {
            return;
        }
        let unlimited = crate::config::TenantBudget::default();
        self.budget = ctx
            .tenant_budgets()
            .charge(&tenant.0, &unlimited, u64::from(self.class.work))
            .await
            .ok();
    }

    /// The same request without its session's reservation, given back now: a job's run is
    /// not counted in its session's output, wherever the job is kept (a shared store does not
    /// keep the reservation either: [`Ready::stored`]).
    pub fn without_session(mut self) -> Self {
        self.hold = None;
        self
    }

    /// What a job in a shared store keeps of it, so that any replica can send it: the engine's
    /// endpoint and body, the classification, the prefill reservation, the size and the
    /// tenant. Not the session's reservation: it is given back at submission (the stored job
    /// is settled without it wherever it runs).
    pub fn stored(&self) -> Value {
        let c = &self.class;
        serde_json::json!({
            "endpoint": self.endpoint.path(),
            "body": self.body,
            "lane": c.lane.as_str(),
            "input_tokens_estimate": c.input_tokens_estimate,
            "output_budget": c.output_budget,
            "work": c.work,
            "exact": c.exact(),
            "counts": c.counts.map(|k| {
                let [code, prose, tools, media] = k.tokens;
                [code, prose, tools, media, k.overhead]
            }),
            "optional_tokens": c.counts.map(|k| k.optional),
            "tools_inflated": c.counts.map(|k| k.tools_inflated),
            "prefill": self.prefill,
            "size": self.size,
            "tenant": self.tenant.as_ref().map(|t| &t.0),
            "key_id": self.key_id,
            "affinity": self.affinity,
        })
    }

    /// A request [`Ready::stored`] kept; `None` when `v` is not one.
    pub fn from_stored(v: &Value) -> Option<Ready> {
        let endpoint = [Endpoint::ChatCompletions, Endpoint::Completions]
            .into_iter()
            .find(|e| v["endpoint"].as_str() == Some(e.path()))?;
        let lane = Lane::ALL
            .into_iter()
            .find(|l| v["lane"].as_str() == Some(l.as_str()))?;
        let n = |k: &str| v[k].as_u64().and_then(|n| u32::try_from(n).ok());
        Some(Ready {
            endpoint,
            body: v["body"].as_object()?.clone(),
            class: Classification {
                lane,
                input_tokens_estimate: n("input_tokens_estimate")?,
                output_budget: n("output_budget")?,
                work: n("work")?,
                counts: stored_counts(&v["counts"], &v["optional_tokens"], &v["tools_inflated"]),
            },
            prefill: n("prefill")?,
            size: v["size"].as_u64()? as usize,
            queued: None,
            hold: None,
            budget: None,
            tenant: v["tenant"].as_str().map(|t| Tenant(t.to_owned())),
            key_id: v["key_id"].as_str().map(str::to_owned),
            affinity: v["affinity"].as_str().map(str::to_owned),
            focus: None,
            deadline: None,
            preemptible: false,
        })
    }
}

impl Ready {
    /// The continuation of a request [`Ready::stored`] kept, after its answer was cut at `text`
    /// (`generated` output tokens): the same messages and the partial answer as a final
    /// assistant message that the engine continues (`continue_final_message`, no generation
    /// prompt: the rendered prompt is the original one and the text, so the original is found
    /// in the prefix cache), with `max_tokens` (and `max_completion_tokens`) lowered by what was
    /// generated. The reservation stays (the prompt grew by what the output budget shrank),
    /// unless `prompt_counted`, the engine's count of the request's own prompt in a run it
    /// started (with the model's context length), passed the estimate: then it is reserved
    /// from that count, its output within the context.
    /// With no text yet, the request as first sent. `None` for a completions request or a body without messages, or when nothing is left to
    /// generate.
    pub fn continued(
        stored: &Value,
        text: &str,
        generated: u32,
        prompt_counted: Option<(u32, u32)>,
    ) -> Option<Ready> {
        let mut ready = Ready::from_stored(stored)?;
        // The engine's own count of the request's prompt (from a run it started), where it
        // passed the estimate: what the continuation holds is reserved, not the estimate
        // (a borrowed seat cannot grow where it is, so such a run left it: `relay::mod`),
        // its output to the room the prompt leaves in the context, as vLLM lowers it.
        if let Some((counted, max_model_len)) = prompt_counted {
            let class = &mut ready.class;
            if counted > class.input_tokens_estimate {
                class.input_tokens_estimate = counted;
                class.output_budget = class
                    .output_budget
                    .min(max_model_len.saturating_sub(counted));
                class.work = counted.saturating_add(class.output_budget);
                ready.prefill = ready.prefill.max(counted);
            }
        }
        if text.is_empty() {
            // Cut before its first token: nothing to continue (an empty final message cannot
            // be continued), the request again as it was.
            return Some(ready);
        }
        if ready.endpoint != Endpoint::ChatCompletions {
            return None;
        }
        let body = &mut ready.body;
        for key in ["max_tokens", "max_completion_tokens"] {
            if let Some(max) = body.get(key).and_then(Value::as_u64) {
                let left = max.checked_sub(u64::from(generated)).filter(|n| *n > 0)?;
                body.insert(key.into(), Value::from(left));
            }
        }
        let messages = body.get_mut("messages")?.as_array_mut()?;
        messages.push(serde_json::json!({"role": "assistant", "content": text}));
        body.insert("continue_final_message".into(), Value::Bool(true));
        body.insert("add_generation_prompt".into(), Value::Bool(false));
        let class = &mut ready.class;
        class.input_tokens_estimate = class.input_tokens_estimate.saturating_add(generated);
        class.output_budget = class.output_budget.saturating_sub(generated);
        class.work = class
            .input_tokens_estimate
            .saturating_add(class.output_budget);
        Some(ready)
    }
}

/// The `counts`, `optional_tokens` and `tools_inflated` of [`Ready::stored`]; `None` for a job
/// stored without counts (one stored before `optional_tokens` or `tools_inflated` was kept
/// reads it as 0 or false).
fn stored_counts(v: &Value, optional: &Value, tools_inflated: &Value) -> Option<KindCounts> {
    let n: Vec<u32> = v
        .as_array()?
        .iter()
        .map(|n| n.as_u64().and_then(|n| u32::try_from(n).ok()))
        .collect::<Option<_>>()?;
    let [code, prose, tools, media, overhead] = n[..] else {
        return None;
    };
    Some(KindCounts {
        tokens: [code, prose, tools, media],
        overhead,
        optional: optional
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0),
        tools_inflated: tools_inflated.as_bool().unwrap_or(false),
    })
}

/// Classifies `prepared` under the request's `ctx` (estimated work, then the continuation
/// choice for a session) and shapes its body for the engine. `background` work (jobs) runs in
/// the large lane whatever its size, and at the engine priority of that lane.
pub async fn classify(
    ctx: &RequestCtx,
    prepared: Prepared,
    record: &mut RequestRecord,
) -> Result<Ready, GatewayError> {
    let Prepared {
        endpoint,
        input,
        max_tokens,
        mut body,
        session,
        size,
        queued,
        background,
        tenant,
        focus,
        deadline,
        preemptible,
    } = prepared;
    let config = ctx.config();
    if let Some(t) = &tenant {
        record.tenant(&t.0);
        if !config.auth.share_prefix_cache {
            // Before the keys that learn what vLLM finds cached: they are the tenant's too.
            crate::prompt::salt_for_tenant(&mut body, &t.0);
        }
    }
    if let Some(f) = &focus {
        ctx.metrics().focus().observe(f);
        record.focused(f.outcome.as_str(), f.saved());
    }
    let model = body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or(&config.upstream.model)
        .to_owned();
    record.requested(&model, max_tokens);
    record.mark(Mark::Parsed);
    let fingerprint = match &input {
        PromptInput::Chat { messages, .. } => {
            Some(fingerprint_of_chat(messages, body.get("tools")))
        }
        _ => None,
    };
    if let Some(fp) = &fingerprint {
        record.fingerprint(fp.clone());
    }
    let discount_key = match (&input, &fingerprint) {
        (PromptInput::Chat { messages, .. }, Some(fp)) => {
            Some(discount_key(fp, messages, &body, &model))
        }
        _ => None,
    };
    // Only a stable prefix (a system prompt or tools) is worth keeping on one replica: routed
    // by what decides that vLLM finds it cached (the discount key: a tenant's salted copy of a
    // course is another prefix, best kept where that tenant's copy is).
    let affinity = match &input {
        PromptInput::Chat { messages, .. }
            if messages.first().is_some_and(|m| m.role == "system")
                || body.get("tools").is_some_and(|t| !t.is_null()) =>
        {
            discount_key.clone()
        }
        _ => None,
    };
    if let Some(key) = &discount_key {
        // The prefix's own tokens, counted once per key: what one request may teach the
        // discount and the drift profile at most (`crate::telemetry::cached_prefix`).
        let prefix = ctx.metrics().prefix();
        let tokens = match prefix.prefix_tokens(key) {
            Some(tokens) => tokens,
            None => {
                let tokens = ctx.classifier().prefix_tokens(&input).await?;
                prefix.set_prefix_tokens(key, tokens);
                tokens
            }
        };
        record.discount_key(key.clone(), tokens);
    }
    // Classify: the first lane by estimated work...
    let classifier = ctx.classifier();
    // The engine's exact count, asked for only when the estimate comes near a limit
    // (`classify.exact_count`).
    // At most `MAX_EXACT_COUNTS_OUT` at once: each is asked before admission, so nothing
    // else bounds how many renderings (and media fetches) clients near a limit make vLLM's
    // API server do. Past them the estimate stands (`busy`).
    let engine = || {
        let upstream = ctx.upstream().clone();
        let metrics = ctx.metrics().estimate().clone();
        let timeout = config.classify.exact_count_timeout;
        let request = tokenize_body(endpoint, &body);
        let permit = ctx.exact_counts().clone().try_acquire_owned();
        async move {
            let Ok(_permit) = permit else {
                metrics.exact_count(ExactOutcome::Busy);
                return None;
            };
            engine_count(upstream, request?, timeout, metrics).await
        }
        .boxed()
    };
    let teaches = teaches(&body);
    let mut class = classifier
        .classify_for(
            (Some(&model), tenant.as_ref().map(|t| t.0.as_str())),
            Arc::new(input),
            max_tokens,
            Some(&engine),
            teaches,
        )
        .await?;
    // ...then the continuation choice: a "continue" chain is one piece of work. The declared
    // output counts toward the session from now on (parallel continues see it).
    let rules = ctx.rules();
    let mut hold: Option<SessionHold> = None;
    if let Some(session) = session {
        // A session is the tenant's: another tenant's request with the same id is another one.
        let session = session.within(tenant.as_ref().map(|t| t.0.as_str()));
        let (before, h) = ctx.sessions().reserve(session, class.output_budget).await;
        hold = Some(h);
        let lane = rules.for_continuation(class.lane, before);
        if lane != class.lane {
            ctx.metrics().promotion().reclassified(class.lane, lane);
            class.lane = lane;
        }
    }
    if background {
        class.lane = Lane::Large;
    }
    // Its tenant's budget: charged its reservation now. A job is let through on the same
    // check and charged nothing yet: each of its runs is charged as it starts
    // ([`Ready::charge_run`]), maybe hours from now.
    let budget = match &tenant {
        Some(t) => match config.auth.tenants.get(&t.0) {
            Some(limits) => Some(
                ctx.tenant_budgets()
                    .charge(&t.0, limits, u64::from(class.work))
                    .await
                    .map_err(|r| {
                        ctx.metrics().tenant_refused(&t.0, r.limit);
                        GatewayError::TenantBudget {
                            tenant: t.0.clone(),
                            limit: r.limit,
                            used: r.used,
                            max: r.max,
                            retry_after: r.retry_after,
                        }
                    })?,
            ),
            None => None,
        },
        None => None,
    };
    // Dropped unsettled: given back whole.
    let budget = budget.filter(|_| !background);
    record.classified(class);
    if teaches {
        record.calibrates(
            Arc::clone(classifier.calibration()),
            &model,
            tenant.as_ref().map(|t| t.0.as_str()),
        );
    }
    record.mark(Mark::Classified);
    let output_cap = match max_tokens {
        Some(_) => None,
        // vLLM streams no chunk while its tool parser holds back what the model writes (a
        // forced call whose name has not parsed yet; whitespace inside a call's JSON:
        // `if delta_message is None: continue` in its chat stream), so such a request could
        // decode unseen past its reservation, neither promoted nor cut: it is held to it.
        None if tools_parsed(&body) => Some(class.output_budget),
        None => rules.output_cap(class.lane, class.input_tokens_estimate, class.output_budget),
    };
    for_engine(
        &mut body,
        class.lane,
        config.admission.engine_priority,
        output_cap,
    );
    // The prefill reservation: the estimate, less the prompt tokens its prefix lately found in
    // vLLM's prefix cache when `admission.prefill_discount_cached` is on (a cached course
    // prefix costs next to no prefill).
    let prefill = match discount_key.as_deref() {
        Some(key) if config.admission.prefill_discount_cached => class
            .input_tokens_estimate
            .saturating_sub(ctx.metrics().prefix().expected_cached(key)),
        _ => class.input_tokens_estimate,
    };
    Ok(Ready {
        endpoint,
        body,
        class,
        prefill,
        size,
        queued,
        hold,
        budget,
        // Read here, in the request's own task (the auth layer's scope).
        key_id: tenant.as_ref().and(super::tenant::caller_key()),
        tenant,
        affinity,
        focus: focus.map(|f| f.meta()),
        deadline,
        preemptible: preemptible && class.lane == Lane::Large,
    })
}

/// Whether vLLM's tool parser reads the answer of this chat body: it has tools, and
/// `tool_choice` is not `"none"`.
fn tools_parsed(body: &Map<String, Value>) -> bool {
    body.get("tools")
        .and_then(Value::as_array)
        .is_some_and(|t| !t.is_empty())
        && body.get("tool_choice").and_then(Value::as_str) != Some("none")
}

/// The last touches before the body goes to vLLM: running usage always (the relay counts
/// output tokens exactly mid-stream, even when vLLM packs several tokens into one chunk, and
/// strips it again for clients that did not ask), the lane as `priority` when configured, and
/// `max_tokens` = `output_cap` when the client sent no limit
/// ([`crate::classify::LaneRules::output_cap`]: the reservation must cover what the engine may
/// generate; requests that can still be promoted get the bound of the lane where promotions
/// stop, or none when that is large, whose reservation is `max_model_len`).
fn for_engine(
    body: &mut Map<String, Value>,
    lane: Lane,
    engine_priority: bool,
    output_cap: Option<u32>,
) {
    if let Some(cap) = output_cap {
        body.insert("max_tokens".into(), Value::from(cap));
    }
    let opts = body
        .entry("stream_options")
        .or_insert_with(|| Value::Object(Map::new()));
    if !opts.is_object() {
        *opts = Value::Object(Map::new());
    }
    if let Some(o) = opts.as_object_mut() {
        o.insert("continuous_usage_stats".into(), Value::Bool(true));
    }
    if engine_priority {
        // Short work first in the engine too (vLLM `--scheduling-policy priority`).
        body.insert("priority".into(), Value::from(lane.index()));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn stored() -> Value {
        json!({
            "endpoint": Endpoint::ChatCompletions.path(),
            "body": {"messages": [{"role": "user", "content": "why?"}], "max_tokens": 100},
            "lane": "large",
            "input_tokens_estimate": 10,
            "output_budget": 100,
            "work": 110,
            "prefill": 10,
            "size": 5,
        })
    }

    /// A job's continuation after a pre-emption is counted as the original prompt, while the
    /// engine counts the answer so far with it: its count teaches nothing. The first run does.
    #[test]
    fn a_continuation_teaches_the_correction_nothing() {
        assert!(Ready::from_stored(&stored()).unwrap().teaches());
        assert!(!Ready::continued(&stored(), " the loop", 2, None)
            .unwrap()
            .teaches());
        // Cut before its first token: the request again as it was, and it teaches.
        assert!(Ready::continued(&stored(), "", 0, None).unwrap().teaches());
    }

    #[test]
    fn a_continuation_goes_on_from_its_text_with_what_is_left() {
        let on = Ready::continued(&stored(), " the loop", 2, None).unwrap();
        assert_eq!(on.body["max_tokens"], 98);
        assert_eq!(
            on.body["messages"][1],
            json!({"role": "assistant", "content": " the loop"})
        );
        assert_eq!(on.body["continue_final_message"], true);
        assert_eq!(on.body["add_generation_prompt"], false);
        let c = on.class;
        assert_eq!(
            (c.input_tokens_estimate, c.output_budget, c.work),
            (12, 98, 110)
        );
        // Nothing left to generate: nothing to send.
        assert!(Ready::continued(&stored(), " the", 100, None).is_none());
        // The engine counted the prompt at 500 (the estimate said 10): the continuation
        // reserves from that count, its prefill room too; a count under the estimate changes
        // nothing.
        let c = Ready::continued(&stored(), " the loop", 2, Some((500, 16_384))).unwrap();
        assert_eq!(
            (c.class.input_tokens_estimate, c.class.work, c.prefill),
            (502, 600, 500)
        );
        let c = Ready::continued(&stored(), " the loop", 2, Some((8, 16_384))).unwrap();
        assert_eq!((c.class.work, c.prefill), (110, 10));
        // Its output within what the prompt leaves of the context (vLLM lowers it there): the
        // reservation never passes the context.
        let c = Ready::continued(&stored(), " the loop", 2, Some((550, 600))).unwrap();
        assert_eq!((c.class.output_budget, c.class.work), (48, 600));
    }

    #[test]
    fn a_run_cut_before_its_first_token_is_sent_again_as_it_was() {
        // An empty final message cannot be continued (vLLM refuses it).
        let again = Ready::continued(&stored(), "", 0, None).unwrap();
        assert_eq!(again.body, Ready::from_stored(&stored()).unwrap().body);
        assert!(again.body.get("continue_final_message").is_none());
    }
}

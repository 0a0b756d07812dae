//! Capacity (M10): what the engine's KV cache holds, and whether the configured budgets fit it.
//!
//! - [`model`]: a model's shape from its `config.json` (KV bytes per token, weights estimate).
//! - [`plan`]: the planner behind `tutor-gateway capacity`: pure arithmetic from the model, a
//!   GPU and the product's context lengths to `--max-model-len`, `--max-num-seqs` and the lane
//!   budgets.
//! - [`engine`]: what a running engine reports: `vllm:cache_config_info` (`num_gpu_blocks`,
//!   `block_size`) on `/metrics` and `max_model_len` on `/v1/models`.
//! - [`cli`]: the `capacity` command and `check-config --probe`.
//!
//! [`overcommit`] compares a config with one engine's capacity. Lane limits are per replica:
//! every seat and token budget in the config is what one engine (one vLLM server) can run, and
//! it is checked against that engine's own KV cache. With several replicas the gateway keeps
//! seats and budgets per replica, each sized from that replica's KV cache.

pub mod cli;
pub mod engine;
pub mod model;
pub mod plan;
mod prom;

use std::sync::Arc;
use std::time::Duration;

pub use engine::{client_for, read_engine_capacity, EngineCapacity};

use crate::config::{Config, Policy};
use crate::lane::Lane;

/// Every way `config` asks more of the engine than `cap` says it has, one sentence each naming
/// the key to change; empty when it fits.
///
/// - `upstream.max_model_len` above the engine's `max_model_len` (vLLM would answer 400 to
///   requests the gateway admitted), or above one engine core's KV cache (such a request can
///   never run).
/// - Under `lanes` and `strict`: the tokens the gateway may reserve at once, the smaller of
///   `admission.max_tokens_in_flight` and the sum of the lanes' `max_tokens_in_flight`, above
///   the KV tokens (`num_gpu_blocks x block_size`): vLLM then preempts admitted requests; and
///   any lane whose own budget is above the KV tokens. `fifo` has no token budget to check.
pub fn overcommit(config: &Config, cap: &EngineCapacity) -> Vec<String> {
    let kv = cap.kv_tokens();
    let kv_text = format!(
        "the engine's KV cache, {kv} tokens ({} blocks x {})",
        cap.num_gpu_blocks, cap.block_size
    );
    let mut out = Vec::new();
    let max_len = config.upstream.max_model_len.get();
    if max_len > cap.max_model_len {
        out.push(format!(
            "upstream.max_model_len ({max_len}) is above the engine's max_model_len ({}): vLLM \
             answers 400 to requests the gateway admitted as fitting; set it to at most {}",
            cap.max_model_len, cap.max_model_len
        ));
    }
    let per_core = kv / u64::from(cap.engines.max(1));
    if u64::from(max_len) > per_core {
        out.push(format!(
            "upstream.max_model_len ({max_len}) is above {kv_text}{}: a request that long never \
             runs",
            if cap.engines > 1 {
                " per engine core"
            } else {
                ""
            }
        ));
    }
    if config.admission.policy == Policy::Fifo {
        return out;
    }
    let global = config.admission.max_tokens_in_flight.get();
    let lanes: u64 = Lane::ALL
        .iter()
        .map(|&l| config.lanes.get(l).max_tokens_in_flight.get())
        .sum();
    let reservable = global.min(lanes);
    if reservable > kv {
        out.push(format!(
            "the gateway may reserve {reservable} tokens at once (admission.max_tokens_in_flight \
             {global}, lanes.*.max_tokens_in_flight summing to {lanes}), above {kv_text}: vLLM \
             will preempt admitted requests; lower admission.max_tokens_in_flight to at most {kv}"
        ));
    }
    for lane in Lane::ALL {
        let budget = config.lanes.get(lane).max_tokens_in_flight.get();
        if budget > kv {
            out.push(format!(
                "lanes.{lane}.max_tokens_in_flight ({budget}) alone is above {kv_text}"
            ));
        }
    }
    out
}

/// Reads the engine's capacity and the problems of `config` against it (`check-config
/// --probe`).
pub async fn probe(
    config: &Config,
    base_url: &str,
) -> anyhow::Result<(EngineCapacity, Vec<String>)> {
    let http = client_for(&config.upstream)?;
    let cap = read_engine_capacity(&http, base_url).await?;
    let problems = overcommit(config, &cap);
    Ok((cap, problems))
}

/// At start-up: reads the capacity of the engine at `base_url` and logs it; every overcommit
/// problem is a `warn` ("KV OVERCOMMIT: ..."); an engine that cannot be read is one `warn`
/// too (the budgets then go unchecked). Never fails: the gateway serves either way.
pub async fn warn_on_overcommit(config: &Config, base_url: &str) -> Option<EngineCapacity> {
    match probe(config, base_url).await {
        Ok((cap, problems)) => {
            log(base_url, &cap, &problems);
            Some(cap)
        }
        Err(e) => {
            tracing::warn!(
                upstream = base_url,
                error = format!("{e:#}"),
                "cannot read the engine's capacity: the lane budgets are not checked against its KV cache"
            );
            None
        }
    }
}

fn log(base_url: &str, cap: &EngineCapacity, problems: &[String]) {
    if problems.is_empty() {
        tracing::info!(
            upstream = base_url,
            kv_tokens = cap.kv_tokens(),
            num_gpu_blocks = cap.num_gpu_blocks,
            block_size = cap.block_size,
            max_model_len = cap.max_model_len,
            "engine capacity: {cap}; the configured budgets fit"
        );
    }
    for p in problems {
        tracing::warn!(
            upstream = base_url,
            kv_tokens = cap.kv_tokens(),
            "KV OVERCOMMIT: {p}"
        );
    }
}

/// Reads the engine's capacity every `every`, against the config `current()` returns at that
/// moment (so a reload is seen), and logs as [`warn_on_overcommit`] whenever the capacity or
/// the problems differ from the last read (an engine restarted with other flags), or it cannot
/// be read where it could. Runs until dropped: spawn it, abort it at shutdown. `on_read` gets
/// every successful read (to keep a replica's capacity).
pub async fn watch(
    base_url: String,
    every: Duration,
    current: impl Fn() -> Arc<Config> + Send,
    mut on_read: impl FnMut(&EngineCapacity) + Send,
) {
    let mut last: Option<Result<(EngineCapacity, Vec<String>), String>> = None;
    loop {
        let result = {
            let config = current();
            probe(&config, &base_url)
                .await
                .map_err(|e| format!("{e:#}"))
        };
        if last.as_ref() != Some(&result) {
            match &result {
                Ok((cap, problems)) => log(&base_url, cap, problems),
                Err(e) => tracing::warn!(
                    upstream = base_url,
                    error = e,
                    "cannot read the engine's capacity: the lane budgets are not checked against its KV cache"
                ),
            }
        }
        if let Ok((cap, _)) = &result {
            on_read(cap);
        }
        last = Some(result);
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests;

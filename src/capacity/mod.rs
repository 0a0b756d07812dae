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
//! [`overcommit`] compares a config with an engine's capacity. Lane limits are global: every
//! seat and token budget in the config is what the whole fleet of vLLM replicas runs at once,
//! and it is checked against the replicas' KV caches together ([`fleet`]). The upstream client
//! spreads the requests over the replicas by their KV share: each replica's weight is its KV
//! tokens, and its seats are capped at its share of the fleet's seats (see
//! `crate::upstream::Replicas::set_capacity`). With one replica that is the engine itself.

pub mod cli;
pub mod engine;
pub mod model;
pub mod models;
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
        .fold(0u64, u64::saturating_add);
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

/// The replicas' capacity together, for a config whose limits are the whole fleet's (lane
/// limits are global, spread over the replicas by their KV share): the KV tokens summed (in
/// blocks of the common block size, or of 1 token when sizes differ), the engine cores summed,
/// the smallest `max_model_len`. `None` for no replica.
pub fn fleet(caps: &[EngineCapacity]) -> Option<EngineCapacity> {
    let first = caps.first()?;
    let same_block = caps.iter().all(|c| c.block_size == first.block_size);
    let block_size = if same_block {
        first.block_size.max(1)
    } else {
        1
    };
    let kv: u64 = caps.iter().map(EngineCapacity::kv_tokens).sum();
    Some(EngineCapacity {
        num_gpu_blocks: kv / u64::from(block_size),
        block_size,
        engines: caps.iter().map(|c| c.engines.max(1)).sum(),
        max_model_len: caps.iter().map(|c| c.max_model_len).min()?,
    })
}

/// How often [`watch`] looks between its reads for a reload that changed the replicas or the
/// fleet's seats.
const RELOAD_LOOK: Duration = Duration::from_secs(1);

/// Reads the capacity of every replica of the config `current()` returns, each `every`, and
/// at once (within [`RELOAD_LOOK`]) when a reload changed `[upstream]` or `admission.seats`:
/// a replica added or moved gets its share of the seats then, not up to `every` later.
/// `on_read(replica, cap)` gets each successful read (the upstream client spreads seats by
/// them). Logs each replica's capacity, and every
/// problem of the config against the fleet ([`fleet`], [`overcommit`]) as a `warn` ("KV
/// OVERCOMMIT: ..."), whenever that differs from the last round (an engine restarted with
/// other flags); a replica that cannot be read is one `warn` (the budgets then go unchecked
/// against it). Logs name replicas, never their URLs. Runs until dropped: spawn it, abort it
/// at shutdown.
pub async fn watch(
    every: Duration,
    current: impl Fn() -> Arc<Config> + Send,
    mut on_read: impl FnMut(&crate::config::ReplicaConfig, &EngineCapacity) + Send,
) {
    type Round = (Vec<Result<EngineCapacity, String>>, Vec<String>);
    let mut last: Option<Round> = None;
    loop {
        let config = current();
        let replicas = config.upstream.replica_set();
        let reads = match client_for(&config.upstream) {
            Ok(http) => {
                let reads = replicas.iter().map(|r| read_engine_capacity(&http, &r.url));
                futures::future::join_all(reads)
                    .await
                    .into_iter()
                    .map(|r| r.map_err(|e| format!("{e:#}")))
                    .collect::<Vec<_>>()
            }
            Err(e) => vec![Err(format!("{e:#}")); replicas.len()],
        };
        for (replica, read) in replicas.iter().zip(&reads) {
            if let Ok(cap) = read {
                on_read(replica, cap);
            }
        }
        let caps: Vec<EngineCapacity> = reads.iter().filter_map(|r| r.clone().ok()).collect();
        let problems = match fleet(&caps) {
            Some(all) if caps.len() == replicas.len() => overcommit(&config, &all),
            _ => Vec::new(),
        };
        let round = (reads, problems);
        if last.as_ref() != Some(&round) {
            log(&replicas, &round.0, &round.1);
        }
        last = Some(round);
        let next = tokio::time::Instant::now() + every;
        loop {
            let now = tokio::time::Instant::now();
            if now >= next {
                break;
            }
            tokio::time::sleep(RELOAD_LOOK.min(next - now)).await;
            let now_in_force = current();
            if now_in_force.upstream != config.upstream
                || now_in_force.admission.seats != config.admission.seats
            {
                break;
            }
        }
    }
}

fn log(
    replicas: &[crate::config::ReplicaConfig],
    reads: &[Result<EngineCapacity, String>],
    problems: &[String],
) {
    for (r, read) in replicas.iter().zip(reads) {
        match read {
            Ok(cap) => tracing::info!(
                replica = %r.name,
                kv_tokens = cap.kv_tokens(),
                num_gpu_blocks = cap.num_gpu_blocks,
                block_size = cap.block_size,
                max_model_len = cap.max_model_len,
                "engine capacity: {cap}"
            ),
            Err(e) => tracing::warn!(
                replica = %r.name,
                error = %e,
                "cannot read the engine's capacity: the lane budgets are not checked against its KV cache"
            ),
        }
    }
    if reads.iter().all(Result::is_ok) && problems.is_empty() {
        tracing::info!("the configured budgets fit the engines' KV caches");
    }
    for p in problems {
        tracing::warn!("KV OVERCOMMIT: {p}");
    }
}

#[cfg(test)]
mod tests;

//! FIFO's capacity for the mix, measured: a saturating closed loop of the same mix through the
//! FIFO preset, completions per simulated second over a window after a warm-up.
//!
//! Method: `clients` closed-loop clients (default 1.5 x the engine's `--max-num-seqs`, at most
//! 512, at least 8: more than the engine has seats, so its queue never empties) start evenly
//! over the first 5 simulated seconds. Each client sends one request after another, each
//! request's class drawn by the classes' shares and its sizes as the scenario says, from the
//! client's own seeded stream. Classes are drawn per request, so the completed requests have
//! the mix's proportions (a client's class is not fixed: a closed loop of fixed-class clients
//! would complete mostly short requests). Capacity = requests that ended normally inside
//! `[warmup_s, warmup_s + window_s)` / `window_s`, in requests per simulated second.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::stack::Stack;
use crate::client::Status;
use crate::draw::{pick_class, sizes, stream};
use crate::engine::EngineSetting;
use crate::prompt::request_seed;
use crate::runner::{with_prefix, ERROR_BACKOFF};
use crate::scenario::Scenario;

/// Stream of a capacity client's classes and sizes.
const CAPACITY: u64 = 0xCA9A_C177_0000_0004;
/// Client starts are spread over this many simulated seconds.
pub const RAMP_S: f64 = 5.0;

/// How the capacity is measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CapacityOptions {
    /// Closed-loop clients; 0: [`auto_clients`].
    pub clients: u32,
    /// Simulated seconds before completions count.
    pub warmup_s: f64,
    /// Simulated seconds over which completions count.
    pub window_s: f64,
}

/// The default client count for `engine`: 1.5 x its seats, in 8..=512.
pub fn auto_clients(engine: &EngineSetting) -> u32 {
    ((f64::from(engine.max_num_seqs) * 1.5).ceil() as u32).clamp(8, 512)
}

/// The capacity record (`summary.json`'s `capacity`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Capacity {
    /// Requests of the mix per simulated second: the rate a `--load` of 1.0 offers.
    pub requests_per_s: f64,
    /// `"measured"` or `"given"` (`--capacity`).
    pub source: String,
    /// How it was measured (empty when given).
    pub method: String,
    /// Clients of the closed loop.
    pub clients: u32,
    /// Warm-up, simulated seconds.
    pub warmup_s: f64,
    /// Window, simulated seconds.
    pub window_s: f64,
    /// Requests that ended normally in the window, per class.
    pub completed_by_class: BTreeMap<String, u64>,
    /// Requests that failed (any time).
    pub errors: u64,
    /// Prompt + output tokens of the window's completions per simulated second.
    pub tokens_per_s: f64,
    /// Output tokens of the window's completions per simulated second.
    pub output_tokens_per_s: f64,
    /// p99 of how late the simulator's steps ended, wall-clock ms (the last 4,096 steps): more
    /// than a few ms means the machine did not keep up with `--speed` and the capacity is low.
    pub engine_late_ms_p99: Option<f64>,
}

impl Capacity {
    /// A capacity given on the command line.
    pub fn given(requests_per_s: f64) -> Self {
        Self {
            requests_per_s,
            source: "given".into(),
            method: String::new(),
            clients: 0,
            warmup_s: 0.0,
            window_s: 0.0,
            completed_by_class: BTreeMap::new(),
            errors: 0,
            tokens_per_s: 0.0,
            output_tokens_per_s: 0.0,
            engine_late_ms_p99: None,
        }
    }
}

/// One finished request of the closed loop: class, end (simulated s from start), ended
/// normally, failed (an error, not a cut at the end), prompt and output tokens.
type Done = (usize, f64, bool, bool, u32, u32);

/// Measures the capacity of `stack` (started under the FIFO preset) for `scenario`'s mix.
pub async fn measure(
    stack: &Stack,
    scenario: &Scenario,
    seed: u64,
    speed: f64,
    opts: &CapacityOptions,
    engine: &EngineSetting,
) -> Capacity {
    let clients = if opts.clients == 0 {
        auto_clients(engine)
    } else {
        opts.clients
    };
    let wall = |s: f64| Duration::from_secs_f64((s / speed).max(0.0));
    let start = Instant::now();
    let end = start + wall(opts.warmup_s + opts.window_s);
    let done: Arc<Mutex<Vec<Done>>> = Arc::default();
    let total = scenario.total_share();
    let mut tasks = JoinSet::new();
    for k in 0..clients {
        let (done, scenario) = (done.clone(), scenario.clone());
        let (target, prompts) = (stack.target.clone(), stack.prompts.clone());
        let offset = wall(f64::from(k) * RAMP_S / f64::from(clients));
        tasks.spawn(async move {
            let mut rng = stream(seed, CAPACITY, 0, u64::from(k));
            tokio::time::sleep_until(start + offset).await;
            let mut n = 0u64;
            while Instant::now() < end {
                let ci = pick_class(&scenario, total, &mut rng);
                let class = &scenario.classes[ci];
                let (input, output) = sizes(class, scenario.max_model_len, &mut rng);
                let prompt_seed = request_seed(seed, ci, u64::from(k) + 1, n);
                n += 1;
                let (system, prompt) = with_prefix(&prompts, class, input, prompt_seed);
                let t = class
                    .api
                    .map_or_else(|| target.clone(), |a| target.with_api(a));
                let sent = Instant::now();
                let o = t
                    .send_with_system(system.as_deref(), &prompt, output, end)
                    .await;
                let ok = o.status == Status::Ok && o.diverted.is_none();
                let at =
                    (sent.duration_since(start).as_secs_f64() + o.e2e_s.unwrap_or(0.0)) * speed;
                let failed = o.status == Status::Error;
                done.lock()
                    .expect("done")
                    .push((ci, at, ok, failed, input, o.output_tokens));
                if o.status == Status::Error {
                    tokio::time::sleep(ERROR_BACKOFF).await;
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    // The window's last steps (the clients were cut at its end).
    let late = super::figures::late_ms_p99(&stack.sim.engine.recent_steps());
    let done = std::mem::take(&mut *done.lock().expect("done"));
    Capacity {
        engine_late_ms_p99: late,
        ..tally(scenario, &done, clients, opts)
    }
}

/// The capacity from the closed loop's finished requests.
fn tally(scenario: &Scenario, done: &[Done], clients: u32, opts: &CapacityOptions) -> Capacity {
    let mut by_class: BTreeMap<String, u64> = scenario
        .classes
        .iter()
        .map(|c| (c.name.clone(), 0))
        .collect();
    let (mut n, mut tokens, mut out_tokens, mut errors) = (0u64, 0u64, 0u64, 0u64);
    let (lo, hi) = (opts.warmup_s, opts.warmup_s + opts.window_s);
    for &(ci, at, ok, failed, input, output) in done {
        errors += u64::from(failed);
        if ok && at >= lo && at < hi {
            n += 1;
            *by_class
                .entry(scenario.classes[ci].name.clone())
                .or_default() += 1;
            tokens += u64::from(input) + u64::from(output);
            out_tokens += u64::from(output);
        }
    }
    let w = opts.window_s.max(1e-9);
    Capacity {
        requests_per_s: n as f64 / w,
        source: "measured".into(),
        method: format!(
            "FIFO preset, closed loop of {clients} clients (each request's class drawn by the mix's \
             shares), starts spread over {RAMP_S} s; requests that ended normally in \
             [{lo}, {hi}) simulated s, divided by {} s",
            opts.window_s
        ),
        clients,
        warmup_s: opts.warmup_s,
        window_s: opts.window_s,
        completed_by_class: by_class,
        errors,
        tokens_per_s: tokens as f64 / w,
        output_tokens_per_s: out_tokens as f64 / w,
        engine_late_ms_p99: None,
    }
}

//! Sends an arrival sequence through a stack on the simulated clock: the warm-up, the measured
//! window, then a bounded drain, with the engine's steps read throughout.
//!
//! Arrivals keep coming after the window (so the window's last requests see the same load as
//! its first) until every request of the window has ended or the drain bound passes; then the
//! requests still in flight that do not count are dropped, and those that count are cut (and
//! counted as such).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use vllm_sim::engine::stats::StepRecord;

use super::backlog::{Backlog, Followed};
use super::bound::StepLog;
use super::stack::Stack;
use crate::arrivals::Arrival;
use crate::client::Outcome;
use crate::draw::open_sizes;
use crate::prompt::request_seed;
use crate::runner::with_prefix;
use crate::scenario::Scenario;

/// How often the engine's recent steps are read, wall clock. The simulator keeps 4,096: at
/// this pace none is lost unless steps are shorter than 50 us of wall clock.
pub const STEP_READ_EVERY: Duration = Duration::from_millis(200);

pub use super::window::Window;

/// One counted request.
#[derive(Debug, Clone)]
pub struct Sent {
    /// Its arrival.
    pub arrival: Arrival,
    /// Prompt tokens.
    pub input_tokens: u32,
    /// Output tokens asked for.
    pub output_tokens_asked: u32,
    /// When it was sent, wall-clock microseconds on the engine's clock (since
    /// `Engine::epoch()`).
    pub sent_us: u64,
    /// How late it was sent against its arrival time, wall-clock microseconds (the client's
    /// own lag: its times are measured from the arrival, so this never hides in them).
    pub lag_us: u64,
    /// What the client saw (wall-clock times).
    pub outcome: Outcome,
}

/// What a run produced.
#[derive(Debug)]
pub struct Driven {
    /// Every counted request (those arriving inside the window), in completion order.
    pub sent: Vec<Sent>,
    /// The requests that do not count (arriving in the warm-up or after the window) and ended
    /// before the run did: their work inside the window counts toward its throughput.
    pub others: Vec<Sent>,
    /// The window, wall-clock microseconds on the engine's clock: `[from, to)`.
    pub window_us: (u64, u64),
    /// Every engine step of the run.
    pub steps: Vec<StepRecord>,
    /// Steps that fell out of the simulator's window before they were read.
    pub lost_steps: u64,
    /// The backlog's jobs as they stood at the window's end, and the gateway's `/metrics` then
    /// (empty without a backlog).
    pub backlog: Followed,
}

/// Sends `arrivals` (sorted by time) to `stack` under `window`; sizes and prompt text come from
/// (`seed`, class, index), as in [`crate::runner::run`]'s open loop. With `backlog`, its jobs
/// are submitted at the start and followed until the window's end (the run lasts at least that
/// long).
pub async fn drive(
    arrivals: &[Arrival],
    scenario: &Scenario,
    seed: u64,
    stack: &Stack,
    window: &Window,
    backlog: Option<Backlog>,
) -> Driven {
    // Every prompt is written before the clock starts: with a real tokenizer writing one takes
    // a dozen encodes, which on the run's own threads would delay arrivals (and the gateway
    // and simulator sharing them) by the tool's work.
    let texts = write_prompts(arrivals, scenario, seed, stack).await;
    let engine = stack.sim.engine.clone();
    let epoch = engine.epoch();
    let log = Arc::new(Mutex::new(StepLog::default()));
    let reader = {
        let (log, engine) = (log.clone(), engine.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(STEP_READ_EVERY);
            loop {
                tick.tick().await;
                log.lock().expect("step log").collect(&engine);
            }
        })
    };
    let start = Instant::now();
    let window_end = start + window.wall(window.warmup_s + window.window_s);
    let on_engine = |t: Instant| t.into_std().saturating_duration_since(epoch).as_micros() as u64;
    let window_us = (
        on_engine(start + window.wall(window.warmup_s)),
        on_engine(window_end),
    );
    let jobs = backlog.map(|b| tokio::spawn(b.run(std::time::SystemTime::now(), window_end)));
    let cut_at = window_end + window.wall(window.drain_s);
    let mut remaining = arrivals.iter().filter(|a| window.counts(a.at_s)).count();
    let mut counted: JoinSet<Sent> = JoinSet::new();
    let mut uncounted: JoinSet<Sent> = JoinSet::new();
    let mut others = vec![];
    let mut sent = Vec::with_capacity(remaining);
    let mut next = 0;
    while remaining > 0 {
        let due = arrivals
            .get(next)
            .map(|a| start + window.wall(a.at_s))
            .filter(|t| *t < cut_at);
        tokio::select! {
            Some(done) = counted.join_next(), if !counted.is_empty() => {
                if let Ok(s) = done {
                    sent.push(s);
                }
                remaining -= 1;
            }
            () = tokio::time::sleep_until(due.unwrap_or(cut_at)), if due.is_some() => {
                let a = arrivals[next];
                next += 1;
                let due = start + window.wall(a.at_s);
                let text = texts[next - 1].clone();
                let job = one_request(a, text, scenario, seed, stack, (epoch, due), cut_at);
                if window.counts(a.at_s) {
                    counted.spawn(job);
                } else {
                    uncounted.spawn(job);
                }
            }
            else => break,
        }
        while let Some(done) = uncounted.try_join_next() {
            others.extend(done.ok());
        }
    }
    let backlog = match jobs {
        Some(task) => task.await.unwrap_or_default(),
        None => Followed::default(),
    };
    uncounted.abort_all();
    while let Some(done) = uncounted.join_next().await {
        others.extend(done.ok());
    }
    reader.abort();
    let mut log = Arc::try_unwrap(log)
        .map(|m| m.into_inner().expect("step log"))
        .unwrap_or_else(|arc| std::mem::take(&mut *arc.lock().expect("step log")));
    log.collect(&engine);
    Driven {
        sent,
        others,
        window_us,
        steps: log.steps(),
        lost_steps: log.lost,
        backlog,
    }
}

/// A prompt as sent: the system message (a shared prefix), if any, and the user's text.
type Text = Arc<(Option<String>, String)>;

/// Every arrival's prompt text, from the seed (sizes by [`open_sizes`]), written on the
/// blocking pool.
async fn write_prompts(
    arrivals: &[Arrival],
    scenario: &Scenario,
    seed: u64,
    stack: &Stack,
) -> Vec<Text> {
    let (arrivals, scenario, prompts) =
        (arrivals.to_vec(), scenario.clone(), stack.prompts.clone());
    tokio::task::spawn_blocking(move || {
        arrivals
            .iter()
            .map(|a| {
                let class = &scenario.classes[a.class];
                let (input, _) = open_sizes(&scenario, a.class, a.index, seed);
                let rs = request_seed(seed, a.class, 0, a.index);
                Arc::new(with_prefix(&prompts, class, input, rs))
            })
            .collect()
    })
    .await
    .expect("writing the prompts")
}

/// One request: its sizes from the seed and its prompt `text`, sent at once (its arrival was
/// due at `due`), read until it ends or `cut_at`.
fn one_request(
    a: Arrival,
    text: Text,
    scenario: &Scenario,
    seed: u64,
    stack: &Stack,
    (epoch, due): (std::time::Instant, Instant),
    cut_at: Instant,
) -> impl std::future::Future<Output = Sent> + Send + 'static {
    let class = scenario.classes[a.class].clone();
    let (input, output) = open_sizes(scenario, a.class, a.index, seed);
    let target = stack.target.for_class(class.api, class.deadline_ms);
    async move {
        let (system, prompt) = &*text;
        let at = Instant::now().into_std();
        let outcome = target
            .send_with_system(system.as_deref(), prompt, output, cut_at)
            .await;
        Sent {
            arrival: a,
            input_tokens: input,
            output_tokens_asked: output,
            sent_us: at.saturating_duration_since(epoch).as_micros() as u64,
            lag_us: at.saturating_duration_since(due.into_std()).as_micros() as u64,
            outcome,
        }
    }
}

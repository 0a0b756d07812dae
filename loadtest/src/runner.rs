//! Drives a scenario against a target for a bounded time: closed-loop clients per class or
//! open-loop Poisson arrivals, all from one seed, with a progress line on stderr.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use vllm_sim::text::SplitMix;

use crate::client::{Outcome, Target};
use crate::prompt::PromptBuilder;
use crate::scenario::{Load, Scenario};
use crate::stats::quantile;

pub use crate::record::{Record, RunData};

/// Most open-loop requests in flight at once; arrivals beyond it are counted as `skipped`.
pub const MAX_OPEN_IN_FLIGHT: usize = 4096;
/// Pause of a closed-loop client after an error, so a rejecting target is not hammered.
pub const ERROR_BACKOFF: Duration = Duration::from_millis(250);

/// How long and how a run goes.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Time during which new requests are sent.
    pub duration: Duration,
    /// Extra time in-flight requests get to finish after `duration`; then they are cut.
    pub drain: Duration,
    /// Seed of classes, arrivals and prompts.
    pub seed: u64,
    /// Seconds between progress lines on stderr; 0 = none.
    pub progress_every_s: u64,
}

/// Seed of the prompt of request `i` of client `client` in class `class`.
pub fn request_seed(seed: u64, class: usize, client: u64, i: u64) -> u64 {
    let mut r = SplitMix::new(seed ^ ((class as u64) << 48) ^ (client << 24) ^ i);
    r.next_u64()
}

struct Shared {
    records: Mutex<Vec<Record>>,
    start: Instant,
}

/// Runs `scenario` against `target`.
pub async fn run(
    scenario: &Scenario,
    target: &Target,
    prompts: &PromptBuilder,
    opts: &RunOptions,
) -> RunData {
    let start = Instant::now();
    let end = start + opts.duration;
    let cut_at = end + opts.drain;
    let shared = Arc::new(Shared {
        records: Mutex::new(Vec::new()),
        start,
    });
    let progress = spawn_progress(scenario, shared.clone(), opts.progress_every_s, cut_at);
    let mut tasks = JoinSet::new();
    let mut skipped = 0;
    match scenario.load {
        Load::Closed => {
            for (ci, class) in scenario.classes.iter().enumerate() {
                for client in 0..u64::from(class.concurrency) {
                    let (sh, t, p) = (shared.clone(), target.clone(), prompts.clone());
                    let (inp, outp, seed) = (class.input_tokens, class.output_tokens, opts.seed);
                    tasks.spawn(async move {
                        let mut i = 0;
                        while Instant::now() < end {
                            let prompt = p.build(inp, request_seed(seed, ci, client, i));
                            i += 1;
                            let sent = Instant::now();
                            let o = t.send(&prompt, outp, cut_at).await;
                            let failed = o.status == crate::client::Status::Error;
                            push(&sh, ci, sent, o);
                            if failed {
                                tokio::time::sleep(ERROR_BACKOFF).await;
                            }
                        }
                    });
                }
            }
        }
        Load::Open { rate } => {
            let mut rng = SplitMix::new(opts.seed);
            let total = scenario.total_share();
            let mut at = start;
            let mut i = 0u64;
            loop {
                let gap = -(1.0 - rng.next_f64()).ln() / rate;
                at += Duration::from_secs_f64(gap);
                let mut pick = rng.next_f64() * total;
                let ci = scenario
                    .classes
                    .iter()
                    .position(|c| {
                        pick -= c.share;
                        pick < 0.0
                    })
                    .unwrap_or(scenario.classes.len() - 1);
                i += 1;
                if at >= end {
                    break;
                }
                tokio::time::sleep_until(at).await;
                while tasks.try_join_next().is_some() {}
                if tasks.len() >= MAX_OPEN_IN_FLIGHT {
                    skipped += 1;
                    continue;
                }
                let class = &scenario.classes[ci];
                let (sh, t, p) = (shared.clone(), target.clone(), prompts.clone());
                let (inp, outp, seed) = (class.input_tokens, class.output_tokens, opts.seed);
                tasks.spawn(async move {
                    let prompt = p.build(inp, request_seed(seed, ci, 0, i));
                    let sent = Instant::now();
                    let o = t.send(&prompt, outp, cut_at).await;
                    push(&sh, ci, sent, o);
                });
            }
        }
    }
    while tasks.join_next().await.is_some() {}
    progress.abort();
    let records = std::mem::take(&mut *shared.records.lock().expect("records lock"));
    RunData {
        records,
        skipped,
        wall_s: start.elapsed().as_secs_f64(),
    }
}

fn push(sh: &Shared, class: usize, sent: Instant, outcome: Outcome) {
    let start_s = sent.duration_since(sh.start).as_secs_f64();
    let rec = Record {
        class,
        start_s,
        outcome,
    };
    sh.records.lock().expect("records lock").push(rec);
}

fn spawn_progress(
    scenario: &Scenario,
    sh: Arc<Shared>,
    every_s: u64,
    until: Instant,
) -> tokio::task::JoinHandle<()> {
    let names: Vec<String> = scenario.classes.iter().map(|c| c.name.clone()).collect();
    tokio::spawn(async move {
        if every_s == 0 {
            return;
        }
        let mut tick = tokio::time::interval(Duration::from_secs(every_s));
        tick.tick().await;
        while Instant::now() < until {
            tick.tick().await;
            eprintln!("{}", progress_line(&sh, &names));
        }
    })
}

fn progress_line(sh: &Shared, names: &[String]) -> String {
    let recs = sh.records.lock().expect("records lock");
    let t = sh.start.elapsed().as_secs_f64();
    let errors = recs.iter().filter(|r| r.outcome.error.is_some()).count();
    let tokens: u64 = recs
        .iter()
        .map(|r| u64::from(r.outcome.output_tokens))
        .sum();
    let mut line = format!(
        "[{t:6.0}s] done {} err {errors} out tok/s {:.0} | p95 TTFT",
        recs.len(),
        tokens as f64 / t.max(1e-9)
    );
    for (ci, name) in names.iter().enumerate() {
        let mut v: Vec<f64> = recs
            .iter()
            .filter(|r| r.class == ci)
            .filter_map(|r| r.outcome.ttft_s)
            .collect();
        match quantile(&mut v, 0.95) {
            Some(q) => line.push_str(&format!(" {name} {q:.2}s")),
            None => line.push_str(&format!(" {name} -")),
        }
    }
    line
}

//! Drives a scenario against a target for a bounded time: closed-loop clients per class or
//! open-loop Poisson arrivals, all from one seed, with a progress line on stderr.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use vllm_sim::text::SplitMix;

use crate::arrivals::Stream;
use crate::client::{Outcome, Target};
use crate::draw::{open_sizes, ClientPlan, Step};
use crate::prompt::PromptBuilder;
use crate::scenario::{Load, Scenario};
use crate::stats::quantile;

pub use crate::prompt::request_seed;
pub use crate::record::{Record, RunData};

/// Most open-loop requests in flight at once; arrivals beyond it are counted as `skipped`.
pub const MAX_OPEN_IN_FLIGHT: usize = 4096;
/// Pause of a closed-loop client after an error, so a rejecting target is not hammered.
pub const ERROR_BACKOFF: Duration = Duration::from_millis(250);
/// Most open-loop prompts written ahead of their arrival (memory: at most this many prompts,
/// 64 KB each at the longest): written on a thread of their own before they are due, so a
/// prompt's tokenizing never delays its own send or the next one's.
pub const PROMPTS_AHEAD: usize = 1024;
/// Longest the open loop's clock waits for prompts written ahead before it starts (the writer
/// then goes on beside the run): a run started beside another client (a second opinion) must
/// start when it is started. With a real tokenizer a long prompt takes ~0.1 s to write, so
/// 1,024 of them would hold the start back by minutes.
pub const PROMPTS_HEAD_START: Duration = Duration::from_secs(2);

/// How long and how a run goes.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Time at the start during which requests are sent but not measured (the engine's cache
    /// and queues fill, the closed-loop clients' starts spread out); the measured window
    /// follows it.
    pub warmup: Duration,
    /// Time during which new requests are sent and measured, after the warm-up.
    pub duration: Duration,
    /// Extra time in-flight requests get to finish after `duration`; then they are cut.
    pub drain: Duration,
    /// Seed of classes, arrivals and prompts.
    pub seed: u64,
    /// Seconds between progress lines on stderr; 0 = none.
    pub progress_every_s: u64,
}

impl RunOptions {
    /// The warm-up and the measured window, seconds, as [`crate::stats::Results::build`]
    /// takes them.
    pub fn window_s(&self) -> (f64, f64) {
        (self.warmup.as_secs_f64(), self.duration.as_secs_f64())
    }
}

/// A closed-loop client: waits for its start offset, then sends its plan's requests one after
/// another until `end`, pausing after each for its think time (and [`ERROR_BACKOFF`] more after
/// an error). `send` sends one request and says whether it failed.
pub async fn closed_client<F, Fut>(mut plan: ClientPlan, start: Instant, end: Instant, mut send: F)
where
    F: FnMut(Step) -> Fut,
    Fut: Future<Output = bool>,
{
    tokio::time::sleep_until(start + plan.offset).await;
    while Instant::now() < end {
        let step = plan.next_step();
        if send(step).await {
            tokio::time::sleep(ERROR_BACKOFF).await;
        }
        if !step.think.is_zero() {
            tokio::time::sleep(step.think).await;
        }
    }
}

struct Shared {
    records: Mutex<Vec<Record>>,
    start: Instant,
}

/// A request's prompt of `input` tokens: with the class's shared prefixes, a system message
/// (the prefix its seed draws, `prefix_tokens` long) and the rest as the user message; else
/// all of it as the user message.
pub(crate) fn with_prefix(
    p: &PromptBuilder,
    class: &crate::scenario::Class,
    input: u32,
    seed: u64,
) -> (Option<String>, String) {
    if class.prefixes == 0 {
        return (None, p.build(input, seed));
    }
    let k = SplitMix::new(seed ^ 0x70f1_c0de).next_u64() % u64::from(class.prefixes);
    let system = format!(
        "Course {k}. {}",
        p.build(class.prefix_tokens, 0x5eed_0000 + k)
    );
    let rest = input
        .saturating_sub(class.prefix_tokens)
        .max(crate::scenario::MIN_INPUT_TOKENS);
    (Some(system), p.build(rest, seed))
}

/// One open-loop arrival with everything sent for it, written ahead of its time.
struct Due {
    /// Its arrival, from the run's start.
    at: Duration,
    class: usize,
    output: u32,
    system: Option<String>,
    prompt: String,
}

/// The open loop's arrivals until `until` (Poisson at `rate`, in waves when the scenario has
/// them, as the experiment draws) with their prompts, written in order on a thread of their own
/// at most [`PROMPTS_AHEAD`] ahead of the sender. Returns once [`PROMPTS_AHEAD`] (or all) are
/// written, or [`PROMPTS_HEAD_START`] passed with at least one written, so the run's clock
/// starts with a head start of prompts and without waiting long for them.
async fn write_ahead(
    scenario: &Scenario,
    rate: f64,
    prompts: &PromptBuilder,
    seed: u64,
    until: Duration,
) -> tokio::sync::mpsc::Receiver<Due> {
    let (tx, rx) = tokio::sync::mpsc::channel(PROMPTS_AHEAD);
    let (ready_tx, ready) = tokio::sync::oneshot::channel::<()>();
    let (scenario, prompts) = (scenario.clone(), prompts.clone());
    std::thread::Builder::new()
        .name("tutor-load-prompts".into())
        .spawn(move || {
            let mut ready_tx = Some(ready_tx);
            let started = std::time::Instant::now();
            for (n, a) in Stream::new(&scenario, rate, seed).enumerate() {
                let at = Duration::from_secs_f64(a.at_s);
                if at >= until {
                    break;
                }
                let class = &scenario.classes[a.class];
                let (input, output) = open_sizes(&scenario, a.class, a.index, seed);
                let rs = request_seed(seed, a.class, 0, a.index);
                let (system, prompt) = with_prefix(&prompts, class, input, rs);
                let due = Due {
                    at,
                    class: a.class,
                    output,
                    system,
                    prompt,
                };
                if tx.blocking_send(due).is_err() {
                    return;
                }
                if n + 1 == PROMPTS_AHEAD || started.elapsed() >= PROMPTS_HEAD_START {
                    if let Some(r) = ready_tx.take() {
                        let _ = r.send(());
                    }
                }
            }
        })
        .expect("starting the prompt writer");
    // Dropped without a send when every arrival is written before the first PROMPTS_AHEAD.
    let _ = ready.await;
    rx
}

/// Runs `scenario` against `target`.
pub async fn run(
    scenario: &Scenario,
    target: &Target,
    prompts: &PromptBuilder,
    opts: &RunOptions,
) -> RunData {
    let mut ahead = match scenario.load {
        Load::Open { rate, .. } => Some(
            write_ahead(
                scenario,
                rate,
                prompts,
                opts.seed,
                opts.warmup + opts.duration,
            )
            .await,
        ),
        Load::Closed { .. } => None,
    };
    let start = Instant::now();
    let end = start + opts.warmup + opts.duration;
    let cut_at = end + opts.drain;
    let shared = Arc::new(Shared {
        records: Mutex::new(Vec::new()),
        start,
    });
    let progress = spawn_progress(scenario, shared.clone(), opts.progress_every_s, cut_at);
    let mut tasks = JoinSet::new();
    let mut skipped = 0;
    match scenario.load {
        Load::Closed { .. } => {
            for (ci, class) in scenario.classes.iter().enumerate() {
                let target = target.for_class(class.api, class.deadline_ms);
                for client in 0..u64::from(class.concurrency) {
                    let (sh, t, p) = (shared.clone(), target.clone(), prompts.clone());
                    let class = class.clone();
                    let plan = ClientPlan::new(scenario, ci, client, opts.seed);
                    tasks.spawn(closed_client(plan, start, end, move |step: Step| {
                        let (sh, t, p, class) = (sh.clone(), t.clone(), p.clone(), class.clone());
                        async move {
                            let (system, prompt) =
                                with_prefix(&p, &class, step.input, step.prompt_seed);
                            let sent = Instant::now();
                            let o = t
                                .send_with_system(system.as_deref(), &prompt, step.output, cut_at)
                                .await;
                            let failed = o.status == crate::client::Status::Error;
                            push(&sh, ci, sent, None, o);
                            failed
                        }
                    }));
                }
            }
        }
        Load::Open { .. } => {
            let ahead = ahead.as_mut().expect("open-loop prompts");
            while let Some(due) = ahead.recv().await {
                let at = start + due.at;
                tokio::time::sleep_until(at).await;
                while tasks.try_join_next().is_some() {}
                if tasks.len() >= MAX_OPEN_IN_FLIGHT {
                    skipped += 1;
                    continue;
                }
                let class = &scenario.classes[due.class];
                let t = target.for_class(class.api, class.deadline_ms);
                let sh = shared.clone();
                tasks.spawn(async move {
                    let sent = Instant::now();
                    let lag = sent.saturating_duration_since(at).as_secs_f64();
                    let o = t
                        .send_with_system(due.system.as_deref(), &due.prompt, due.output, cut_at)
                        .await;
                    push(&sh, due.class, sent, Some(lag), o);
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

fn push(sh: &Shared, class: usize, sent: Instant, lag_s: Option<f64>, outcome: Outcome) {
    let start_s = sent.duration_since(sh.start).as_secs_f64();
    let rec = Record {
        class,
        start_s,
        lag_s,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_class_with_prefixes_starts_each_prompt_with_one_of_them() {
        let s = Scenario::parse(
            "name='t'\n[load]\nmode='open'\nrate=1\n[[class]]\nname='a'\n\
             input_tokens=600\noutput_tokens=10\nshare=1\nprefixes=3\nprefix_tokens=400\n",
        )
        .unwrap();
        let p = PromptBuilder::new(vllm_sim::tokenizer::PromptTokenizer::load(None).unwrap());
        let mut systems = std::collections::BTreeSet::new();
        for seed in 0..60 {
            let (system, user) = with_prefix(&p, &s.classes[0], 600, seed);
            let system = system.expect("a system message");
            assert!(system.starts_with("Course "), "{system}");
            assert!(!user.is_empty());
            systems.insert(system);
        }
        assert_eq!(
            systems.len(),
            3,
            "three distinct prefixes, each the same text every time"
        );
        let bad = "name='t'\n[load]\nmode='open'\nrate=1\n[[class]]\nname='a'\n\
                   input_tokens=600\noutput_tokens=10\nshare=1\nprefixes=3\nprefix_tokens=600\n";
        assert!(
            Scenario::parse(bad).is_err(),
            "a prefix as long as the prompt"
        );
    }

    /// Think time and the start offset are applied by the client loop (tokio's paused clock:
    /// virtual time, no wall-clock timing).
    #[tokio::test(start_paused = true)]
    async fn closed_clients_wait_for_their_offset_and_think_between_requests() {
        let s = Scenario::parse(
            "name='t'\n[load]\nmode='closed'\nramp_s=3\n[[class]]\nname='a'\n\
             input_tokens=300\noutput_tokens=10\nconcurrency=4\nthink_ms=1000\n",
        )
        .unwrap();
        let plan = ClientPlan::new(&s, 0, 1, 42);
        let offset = plan.offset;
        assert!(offset > Duration::ZERO && offset < Duration::from_secs(3));
        let start = Instant::now();
        let sent = Arc::new(Mutex::new(Vec::new()));
        let log = sent.clone();
        closed_client(plan, start, start + Duration::from_secs(10), move |_| {
            let log = log.clone();
            async move {
                log.lock().unwrap().push(start.elapsed());
                tokio::time::sleep(Duration::from_millis(500)).await;
                false
            }
        })
        .await;
        let sent = sent.lock().unwrap().clone();
        // The paused clock advances in whole milliseconds.
        let near = |a: Duration, b: Duration| a.abs_diff(b) <= Duration::from_millis(2);
        assert!(near(sent[0], offset), "{sent:?} {offset:?}");
        for w in sent.windows(2) {
            // 500 ms of "request" + 1,000 ms of think time.
            assert!(near(w[1] - w[0], Duration::from_millis(1500)), "{sent:?}");
        }
        assert!(*sent.last().unwrap() < Duration::from_secs(10));
        assert!(*sent.last().unwrap() + Duration::from_millis(1500) >= Duration::from_secs(10));
    }
}

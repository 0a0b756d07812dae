//! A backlog of background jobs (a scenario class with `backlog = N` and `api = "jobs"`,
//! issue 35): all N jobs submitted at the run's start, one after another as fast as the gateway
//! accepts them (a refusal, e.g. 429 when `jobs.max_jobs` is full, is retried), then followed
//! by polling `GET /jobs/{id}` until the window ends, and once more then. Their times are the
//! gateway's own timestamps (`submitted_at`, `started_at`, `finished_at`), so the poll interval
//! does not blur them. Jobs still queued or running at the window's end are not completed
//! (not errors).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::time::Instant;

use super::window::Window;
use crate::client::Target;
use crate::draw::open_sizes;
use crate::prompt::{request_seed, PromptBuilder};
use crate::runner::with_prefix;
use crate::scenario::Scenario;
use crate::stats::{quantile, MetricsHistogram};

/// How often unfinished jobs are polled, wall clock.
pub const POLL_EVERY: Duration = Duration::from_millis(1000);
/// Pause before a refused submission is tried again, wall clock.
pub const RETRY_EVERY: Duration = Duration::from_millis(200);
/// Status polls in flight at once.
const POLLS_AT_ONCE: usize = 16;
/// Job indices of a backlog start here (open-loop arrivals have theirs below), so a job's
/// sizes and prompt never coincide with an arrival's.
pub const BACKLOG_INDEX_BASE: u64 = 1 << 41;

/// What became of one job of the backlog. Times are simulated seconds from the run's start.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    /// The class's name.
    pub class: String,
    /// Its number in the backlog, from 1.
    pub n: u64,
    /// Prompt tokens sent.
    pub input_tokens: u32,
    /// `max_output_tokens` asked for.
    pub output_tokens_asked: u32,
    /// The gateway's id (none: never accepted).
    pub id: Option<String>,
    /// The last status seen (`queued`, `running`, `done`, `failed`, `cancelled`, `expired`),
    /// or `unsubmitted`.
    pub status: String,
    /// The last error (a refused submission, a failed job's code, a failed poll).
    pub error: Option<String>,
    /// Submission refusals before it was accepted.
    pub refusals: u32,
    /// The gateway's `submitted_at`.
    pub submitted_s: Option<f64>,
    /// The gateway's `started_at` (its first start).
    pub started_s: Option<f64>,
    /// The gateway's `finished_at`.
    pub finished_s: Option<f64>,
    /// `answer.usage.output_tokens` (done jobs).
    pub output_tokens: u32,
    /// Pieces of output streamed so far (`output_pieces`, one token each), as last seen
    /// running.
    pub output_pieces: u32,
    /// `answer.usage.input_tokens` (done jobs).
    pub prompt_tokens: Option<u32>,
    /// Times it was pre-empted (`preempted`).
    pub preempted: u32,
    /// `answer.usage.recomputed_tokens` (pre-empted done jobs).
    pub recomputed_tokens: u64,
}

impl JobRecord {
    /// Reads a `GET /jobs/{id}` answer; `start_unix`: the run's start (Unix seconds).
    fn update(&mut self, v: &Value, start_unix: f64, speed: f64) {
        let at = |k: &str| v[k].as_f64().map(|t| (t - start_unix) * speed);
        if let Some(s) = v["status"].as_str() {
            self.status = s.to_string();
        }
        self.submitted_s = at("submitted_at").or(self.submitted_s);
        self.started_s = at("started_at").or(self.started_s);
        self.finished_s = at("finished_at").or(self.finished_s);
        self.preempted = v["preempted"].as_u64().unwrap_or(0) as u32;
        if let Some(n) = v["output_pieces"].as_u64() {
            self.output_pieces = n as u32;
        }
        let u = &v["answer"]["usage"];
        if let Some(n) = u["output_tokens"].as_u64() {
            self.output_tokens = n as u32;
        }
        self.prompt_tokens = u["input_tokens"].as_u64().map(|n| n as u32);
        self.recomputed_tokens = u["recomputed_tokens"].as_u64().unwrap_or(0);
        if let Some(code) = v["error"]["code"].as_str() {
            self.error = Some(code.to_string());
        }
    }

    /// Output tokens it generated: a done job's usage, else the pieces it had streamed.
    pub fn generated(&self) -> u32 {
        if self.status == "done" {
            self.output_tokens
        } else {
            self.output_pieces
        }
    }

    /// Whether it ended (done, failed, cancelled, expired).
    pub fn ended(&self) -> bool {
        matches!(
            self.status.as_str(),
            "done" | "failed" | "cancelled" | "expired"
        )
    }
}

/// A followed backlog: its jobs as they stood at the window's end, and the gateway's `/metrics`
/// text then.
#[derive(Debug, Clone, Default)]
pub struct Followed {
    /// Every job of the backlog.
    pub jobs: Vec<JobRecord>,
    /// `/metrics` at the window's end.
    pub metrics: String,
    /// The simulator's count of tokens it computed twice (`recomputed_tokens` of its engine),
    /// at the same moment.
    pub engine_recomputed_tokens: Option<u64>,
}

/// Whether a refused submission is tried again: the gateway full (429), overloaded or
/// draining (503), or the connection failed; any other refusal is final.
fn retried(code: &str) -> bool {
    matches!(code, "http_429" | "http_503" | "connect" | "http")
}

/// What the backlog needs from its run.
#[derive(Clone)]
pub struct Backlog {
    /// The scenario (its backlog classes, sizes, prefixes).
    pub scenario: Scenario,
    /// Seed of sizes and prompts.
    pub seed: u64,
    /// The gateway.
    pub target: Target,
    /// Prompt text.
    pub prompts: PromptBuilder,
    /// The simulator's speed factor.
    pub speed: f64,
    /// The simulator's engine (its count of work done twice is read at the window's end).
    pub engine: Option<vllm_sim::engine::Engine>,
}

impl Backlog {
    /// Every job of every backlog class, unsubmitted, with its sizes.
    pub fn plan(&self) -> Vec<JobRecord> {
        let mut out = vec![];
        for (ci, n) in self.scenario.backlogs() {
            for k in 1..=u64::from(n) {
                let (input, output) =
                    open_sizes(&self.scenario, ci, BACKLOG_INDEX_BASE + k, self.seed);
                out.push(JobRecord {
                    class: self.scenario.classes[ci].name.clone(),
                    n: k,
                    input_tokens: input,
                    output_tokens_asked: output,
                    status: "unsubmitted".into(),
                    ..Default::default()
                });
            }
        }
        out
    }

    /// Submits every job, follows them until `until`, then polls them once more and reads the
    /// gateway's `/metrics` (the same moment: the window's end). `start`: the run's start on
    /// the system clock (the gateway's timestamps are Unix seconds).
    pub async fn run(self, start: SystemTime, until: Instant) -> Followed {
        let start_unix = start
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        let mut jobs = self.plan();
        for job in &mut jobs {
            let ci = self
                .scenario
                .classes
                .iter()
                .position(|c| c.name == job.class)
                .unwrap_or(0);
            let class = &self.scenario.classes[ci];
            let (system, prompt) = with_prefix(
                &self.prompts,
                class,
                job.input_tokens,
                request_seed(self.seed, ci, 0, BACKLOG_INDEX_BASE + job.n),
            );
            while Instant::now() < until {
                match self
                    .target
                    .submit_job(system.as_deref(), &prompt, job.output_tokens_asked)
                    .await
                {
                    Ok(id) => {
                        job.id = Some(id);
                        job.status = "queued".into();
                        break;
                    }
                    Err(code) => {
                        job.refusals += 1;
                        let again = retried(&code);
                        job.error = Some(code);
                        if !again {
                            break;
                        }
                        tokio::time::sleep(RETRY_EVERY).await;
                    }
                }
            }
        }
        loop {
            let last = Instant::now() >= until;
            self.poll(&mut jobs, start_unix).await;
            if last {
                break;
            }
            if jobs.iter().all(|j| j.id.is_none() || j.ended()) {
                tokio::time::sleep_until(until).await;
                break;
            }
            tokio::time::sleep_until((Instant::now() + POLL_EVERY).min(until)).await;
        }
        let metrics = match reqwest::get(format!("{}/metrics", self.target.base_url)).await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        let engine_recomputed_tokens = self.engine.as_ref().map(|e| e.snapshot().recomputed_tokens);
        Followed {
            jobs,
            metrics,
            engine_recomputed_tokens,
        }
    }

    /// Polls every accepted job that has not ended.
    async fn poll(&self, jobs: &mut [JobRecord], start_unix: f64) {
        let open: Vec<(usize, String)> = jobs
            .iter()
            .enumerate()
            .filter(|(_, j)| !j.ended())
            .filter_map(|(i, j)| Some((i, j.id.clone()?)))
            .collect();
        let answers: Vec<(usize, Result<Value, String>)> = futures::stream::iter(open)
            .map(|(i, id)| {
                let t = self.target.clone();
                async move { (i, t.job_status(&id).await) }
            })
            .buffer_unordered(POLLS_AT_ONCE)
            .collect()
            .await;
        for (i, answer) in answers {
            match answer {
                Ok(v) => jobs[i].update(&v, start_unix, self.speed),
                Err(code) => jobs[i].error = Some(code),
            }
        }
    }
}

/// The backlog's figures in one run (`summary.json`'s `jobs`). Times in simulated seconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BacklogFigures {
    /// Jobs in the backlog.
    pub jobs: u64,
    /// Accepted by the gateway.
    pub submitted: u64,
    /// Submission refusals (each retried).
    pub submit_refusals: u64,
    /// Done with `finished_at` inside the window.
    pub done_in_window: u64,
    /// Done by the end of the window (the warm-up included).
    pub done_by_end: u64,
    /// Failed, cancelled or expired.
    pub failed: u64,
    /// Still queued or running at the window's end (not completed; not an error).
    pub unfinished: u64,
    /// `done_in_window` per simulated hour of window.
    pub jobs_per_hour: f64,
    /// When the last job finished, when every job was done before the window ended: the
    /// backlog ran dry, so `jobs_per_hour` is a lower bound of what the gateway could do.
    pub ran_dry_at_s: Option<f64>,
    /// Submission to done, done jobs: median.
    pub e2e_p50_s: Option<f64>,
    /// Submission to done, done jobs: 95th percentile.
    pub e2e_p95_s: Option<f64>,
    /// Output tokens of the jobs done by the end.
    pub output_tokens: u64,
    /// Output tokens every job had generated by the window's end: the done jobs' usage, the
    /// others' streamed pieces.
    pub generated_tokens: u64,
    /// Prompt + output tokens of the jobs done in the window, per simulated second of window.
    pub tokens_per_s: f64,
    /// Done jobs that were pre-empted at least once.
    pub preempted_jobs: u64,
    /// Their pre-emptions (`preempted`, summed).
    pub preemptions_of_done: u64,
    /// `recomputed_tokens` of the done jobs' usage, summed.
    pub recomputed_tokens_of_done: u64,
    /// `tutor_gateway_job_preemptions_total`, summed over lanes and reasons (the run until the
    /// window's end, as every metric here).
    pub preemptions: u64,
    /// The same by `lane/reason` (non-zero ones).
    pub preemptions_by: BTreeMap<String, u64>,
    /// `tutor_gateway_job_recomputed_tokens_total`.
    pub recomputed_tokens: u64,
    /// `tutor_gateway_job_unreported_prompt_tokens_total`: prompt tokens of continuations cut
    /// again before the engine reported their cache hit.
    pub unreported_tokens: u64,
    /// The simulator's own count of tokens computed twice (every request's, questions'
    /// included; the run until the window's end).
    pub engine_recomputed_tokens: Option<u64>,
    /// `engine_recomputed_tokens` over `generated_tokens`.
    pub engine_recomputed_share: Option<f64>,
    /// `recomputed_tokens` over `generated_tokens` (the jobs' generated output).
    pub recomputed_share: Option<f64>,
    /// `recomputed_tokens_of_done` over `output_tokens` (the done jobs alone).
    pub recomputed_share_of_done: Option<f64>,
    /// Requests a job was pre-empted for (`tutor_gateway_preemption_admit_seconds`, every
    /// lane).
    pub admit_requests: u64,
    /// Their arrival to admission, median (the histogram's buckets, interpolated, x speed).
    pub admit_p50_s: Option<f64>,
    /// 99th percentile.
    pub admit_p99_s: Option<f64>,
    /// Their first ask for a job to leave to admission, 99th percentile
    /// (`tutor_gateway_preemption_ask_admit_seconds`): how fast asked jobs make room; the
    /// rest of `admit_p99_s` is waiting before any job could be asked.
    pub ask_admit_p99_s: Option<f64>,
    /// The run's median engine step.
    pub step_p50_s: Option<f64>,
    /// The admission target: one (median) engine step + 50 ms.
    pub admit_target_s: Option<f64>,
}

/// The figures of `jobs` (one run's backlog), the gateway's `/metrics` text and the
/// simulator's count of tokens computed twice at the window's end, and the run's median step
/// (simulated seconds).
pub fn figures(
    jobs: &[JobRecord],
    metrics: &str,
    engine_recomputed_tokens: Option<u64>,
    window: &Window,
    step_p50_s: Option<f64>,
) -> BacklogFigures {
    let end = window.warmup_s + window.window_s;
    let done: Vec<&JobRecord> = jobs.iter().filter(|j| j.status == "done").collect();
    let in_window: Vec<&&JobRecord> = done
        .iter()
        .filter(|j| j.finished_s.is_some_and(|t| window.counts(t)))
        .collect();
    let mut e2e: Vec<f64> = done
        .iter()
        .filter_map(|j| Some(j.finished_s? - j.submitted_s?))
        .collect();
    let tokens: u64 = in_window
        .iter()
        .map(|j| u64::from(j.prompt_tokens.unwrap_or(j.input_tokens)) + u64::from(j.output_tokens))
        .sum();
    let w = window.window_s.max(1e-9);
    let last_done = done.iter().filter_map(|j| j.finished_s).reduce(f64::max);
    let output_tokens: u64 = done.iter().map(|j| u64::from(j.output_tokens)).sum();
    let generated_tokens: u64 = jobs.iter().map(|j| u64::from(j.generated())).sum();
    let mut f = BacklogFigures {
        jobs: jobs.len() as u64,
        submitted: jobs.iter().filter(|j| j.id.is_some()).count() as u64,
        submit_refusals: jobs.iter().map(|j| u64::from(j.refusals)).sum(),
        done_in_window: in_window.len() as u64,
        done_by_end: done
            .iter()
            .filter(|j| j.finished_s.is_some_and(|t| t < end))
            .count() as u64,
        failed: jobs
            .iter()
            .filter(|j| matches!(j.status.as_str(), "failed" | "cancelled" | "expired"))
            .count() as u64,
        // Not ended by the window's end: also a job done later (in the drain, before the last
        // look), which `done_by_end` leaves out (a loaded machine's jobs finished there and
        // were counted nowhere).
        unfinished: jobs
            .iter()
            .filter(|j| !j.ended() || (j.status == "done" && j.finished_s.is_none_or(|t| t >= end)))
            .count() as u64,
        jobs_per_hour: in_window.len() as f64 / w * 3600.0,
        ran_dry_at_s: last_done.filter(|t| done.len() == jobs.len() && *t < end),
        e2e_p50_s: quantile(&mut e2e, 0.5),
        e2e_p95_s: quantile(&mut e2e, 0.95),
        output_tokens,
        generated_tokens,
        tokens_per_s: tokens as f64 / w,
        preempted_jobs: done.iter().filter(|j| j.preempted > 0).count() as u64,
        preemptions_of_done: done.iter().map(|j| u64::from(j.preempted)).sum(),
        recomputed_tokens_of_done: done.iter().map(|j| j.recomputed_tokens).sum(),
        step_p50_s,
        admit_target_s: step_p50_s.map(|s| s + 0.05),
        engine_recomputed_tokens,
        engine_recomputed_share: engine_recomputed_tokens
            .filter(|_| generated_tokens > 0)
            .map(|n| n as f64 / generated_tokens as f64),
        ..Default::default()
    };
    for (labels, v) in series(metrics, "tutor_gateway_job_preemptions_total") {
        let n = v as u64;
        f.preemptions += n;
        if n > 0 {
            let label = |k: &str| {
                labels
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(&format!("{k}=\"")))
                    .map(|x| x.trim_end_matches('"').to_string())
                    .unwrap_or_default()
            };
            f.preemptions_by
                .insert(format!("{}/{}", label("lane"), label("reason")), n);
        }
    }
    f.recomputed_tokens = series(metrics, "tutor_gateway_job_recomputed_tokens_total")
        .iter()
        .map(|(_, v)| *v as u64)
        .sum();
    f.unreported_tokens = series(metrics, "tutor_gateway_job_unreported_prompt_tokens_total")
        .iter()
        .map(|(_, v)| *v as u64)
        .sum();
    f.recomputed_share =
        (generated_tokens > 0).then(|| f.recomputed_tokens as f64 / generated_tokens as f64);
    f.recomputed_share_of_done =
        (output_tokens > 0).then(|| f.recomputed_tokens_of_done as f64 / output_tokens as f64);
    let mut admit = MetricsHistogram::default();
    for lane in ["small", "medium", "large"] {
        admit.add(&MetricsHistogram::read(
            metrics,
            "tutor_gateway_preemption_admit_seconds",
            &format!("lane=\"{lane}\""),
        ));
    }
    f.admit_requests = admit.total() as u64;
    f.admit_p50_s = admit.quantile(0.5).map(|s| s * window.speed);
    f.admit_p99_s = admit.quantile(0.99).map(|s| s * window.speed);
    let mut after_ask = MetricsHistogram::default();
    for lane in ["small", "medium", "large"] {
        after_ask.add(&MetricsHistogram::read(
            metrics,
            "tutor_gateway_preemption_ask_admit_seconds",
            &format!("lane=\"{lane}\""),
        ));
    }
    f.ask_admit_p99_s = after_ask.quantile(0.99).map(|s| s * window.speed);
    f
}

/// Every series of `family` in a `/metrics` text: (labels without braces, value).
fn series(text: &str, family: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(family)?;
            let (labels, value) = match rest.strip_prefix('{') {
                Some(r) => {
                    let (labels, v) = r.split_once("} ")?;
                    (labels.to_string(), v)
                }
                None => (String::new(), rest.strip_prefix(' ')?),
            };
            Some((labels, value.trim().parse().ok()?))
        })
        .collect()
}

/// The median step of `steps`, simulated seconds.
pub fn step_p50_s(steps: &[vllm_sim::engine::stats::StepRecord], speed: f64) -> Option<f64> {
    let mut d: Vec<f64> = steps
        .iter()
        .map(|s| s.duration_us as f64 / 1e6 * speed)
        .collect();
    quantile(&mut d, 0.5)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn window() -> Window {
        Window {
            speed: 2.0,
            warmup_s: 10.0,
            window_s: 100.0,
            drain_s: 30.0,
        }
    }

    /// Every job is done by the window's end, failed or unfinished: one done in the drain
    /// (after the end, before the last look) is unfinished, not counted nowhere.
    #[test]
    fn a_job_done_after_the_window_is_unfinished() {
        let w = window();
        let jobs = vec![
            job(1, "done", Some(115.0), 100, 0),
            job(2, "done", Some(109.0), 100, 0),
        ];
        let f = figures(&jobs, "", None, &w, None);
        assert_eq!((f.done_by_end, f.unfinished, f.failed), (1, 1, 0));
    }

    fn job(n: u64, status: &str, finished_s: Option<f64>, out: u32, pre: u32) -> JobRecord {
        JobRecord {
            class: "review".into(),
            n,
            input_tokens: 1000,
            output_tokens_asked: out,
            id: Some(n.to_string()),
            status: status.into(),
            submitted_s: Some(0.0),
            started_s: Some(1.0),
            finished_s,
            output_tokens: if status == "done" { out } else { 0 },
            prompt_tokens: Some(1000),
            preempted: pre,
            recomputed_tokens: u64::from(pre) * 10,
            ..Default::default()
        }
    }

    #[test]
    fn a_status_answer_is_read_in_simulated_seconds() {
        let mut j = JobRecord::default();
        let v = json!({
            "status": "done", "submitted_at": 1000.5, "started_at": 1001.0,
            "finished_at": 1011.0, "preempted": 2, "output_pieces": 480,
            "answer": {"usage": {"input_tokens": 8000, "output_tokens": 480, "recomputed_tokens": 37}}
        });
        j.update(&v, 1000.0, 2.0);
        assert_eq!(j.status, "done");
        assert!(j.ended());
        assert_eq!(
            (j.submitted_s, j.started_s, j.finished_s),
            (Some(1.0), Some(2.0), Some(22.0))
        );
        assert_eq!(
            (
                j.output_tokens,
                j.prompt_tokens,
                j.preempted,
                j.recomputed_tokens
            ),
            (480, Some(8000), 2, 37)
        );
        let mut q = JobRecord::default();
        q.update(
            &json!({"status": "queued", "submitted_at": 1000.0, "started_at": null}),
            1000.0,
            1.0,
        );
        assert!(!q.ended());
        assert_eq!(q.started_s, None);
    }

    #[test]
    fn figures_count_the_window_and_read_the_metrics() {
        let jobs = vec![
            job(1, "done", Some(5.0), 100, 0), // in the warm-up: done, not in the window
            job(2, "done", Some(50.0), 200, 1), // in the window, pre-empted once
            job(3, "done", Some(109.0), 300, 0), // in the window
            JobRecord {
                output_pieces: 150,
                ..job(4, "running", None, 400, 2) // unfinished, 150 tokens out
            },
            job(5, "failed", Some(20.0), 500, 0), // failed
        ];
        let metrics = "\
# TYPE tutor_gateway_job_preemptions_total counter
tutor_gateway_job_preemptions_total{lane=\"small\",reason=\"seat\"} 3
tutor_gateway_job_preemptions_total{lane=\"medium\",reason=\"tokens\"} 1
tutor_gateway_job_preemptions_total{lane=\"large\",reason=\"seat\"} 0
tutor_gateway_job_recomputed_tokens_total 30
tutor_gateway_job_unreported_prompt_tokens_total 900
tutor_gateway_preemption_admit_seconds_bucket{lane=\"small\",le=\"0.01\"} 2
tutor_gateway_preemption_admit_seconds_bucket{lane=\"small\",le=\"0.1\"} 3
tutor_gateway_preemption_admit_seconds_bucket{lane=\"small\",le=\"+Inf\"} 3
tutor_gateway_preemption_admit_seconds_bucket{lane=\"medium\",le=\"0.01\"} 0
tutor_gateway_preemption_admit_seconds_bucket{lane=\"medium\",le=\"0.1\"} 1
tutor_gateway_preemption_admit_seconds_bucket{lane=\"medium\",le=\"+Inf\"} 1
";
        let f = figures(&jobs, metrics, Some(75), &window(), Some(0.03));
        assert_eq!((f.jobs, f.submitted), (5, 5));
        assert_eq!((f.done_in_window, f.done_by_end), (2, 3));
        assert_eq!((f.failed, f.unfinished), (1, 1));
        assert!((f.jobs_per_hour - 72.0).abs() < 1e-9, "2 per 100 s");
        assert_eq!(f.ran_dry_at_s, None);
        assert_eq!((f.output_tokens, f.generated_tokens), (600, 750));
        // Jobs 2 and 3: (1000 + 200) + (1000 + 300) tokens over 100 s.
        assert!((f.tokens_per_s - 25.0).abs() < 1e-9);
        assert_eq!((f.preempted_jobs, f.preemptions_of_done), (1, 1));
        assert_eq!(f.recomputed_tokens_of_done, 10);
        assert_eq!(f.preemptions, 4);
        assert_eq!(f.preemptions_by.len(), 2);
        assert_eq!(f.preemptions_by["small/seat"], 3);
        assert_eq!(f.recomputed_tokens, 30);
        assert!(
            (f.recomputed_share.unwrap() - 0.04).abs() < 1e-12,
            "30 / 750"
        );
        assert!((f.recomputed_share_of_done.unwrap() - 10.0 / 600.0).abs() < 1e-12);
        assert_eq!(f.unreported_tokens, 900);
        assert_eq!(f.engine_recomputed_tokens, Some(75));
        assert!(
            (f.engine_recomputed_share.unwrap() - 0.1).abs() < 1e-12,
            "75 / 750"
        );
        // 4 admissions over both lanes: the p50 (rank 2) at the top of (0, 0.01] x speed 2.
        assert_eq!(f.admit_requests, 4);
        assert!((f.admit_p50_s.unwrap() - 0.02).abs() < 1e-9, "{f:?}");
        assert!(f.admit_p99_s.unwrap() > 0.02 && f.admit_p99_s.unwrap() <= 0.2);
        assert!((f.admit_target_s.unwrap() - 0.08).abs() < 1e-12);
        // Every job done before the window's end: the backlog ran dry then.
        let all = vec![
            job(1, "done", Some(30.0), 10, 0),
            job(2, "done", Some(60.0), 10, 0),
        ];
        let f = figures(&all, "", None, &window(), None);
        assert_eq!(f.ran_dry_at_s, Some(60.0));
        assert_eq!(
            (f.admit_requests, f.admit_p99_s, f.recomputed_tokens),
            (0, None, 0)
        );
    }

    #[test]
    fn a_backlog_plan_draws_each_jobs_sizes_from_the_seed() {
        let s = Scenario::parse(
            "name='t'\n[load]\nmode='open'\nrate=1\n[[class]]\nname='small'\ninput_tokens=300\n\
             output_tokens=100\nshare=1\n[[class]]\nname='review'\napi='jobs'\nbacklog=50\n\
             input_tokens=8000\noutput_tokens=500\ndistribution='uniform'\nspread=0.5\n",
        )
        .unwrap();
        let b = |seed| Backlog {
            scenario: s.clone(),
            seed,
            target: Target::new("http://127.0.0.1:1", crate::client::Api::Answer, None).unwrap(),
            prompts: PromptBuilder::new(vllm_sim::tokenizer::PromptTokenizer::load(None).unwrap()),
            speed: 1.0,
            engine: None,
        };
        let plan = b(7).plan();
        assert_eq!(plan.len(), 50);
        assert!(plan
            .iter()
            .all(|j| j.class == "review" && j.status == "unsubmitted"));
        assert!(plan.iter().all(|j| (4000..=12000).contains(&j.input_tokens)
            && (250..=750).contains(&j.output_tokens_asked)));
        let sizes: std::collections::BTreeSet<u32> = plan.iter().map(|j| j.input_tokens).collect();
        assert!(sizes.len() > 40, "drawn, not fixed");
        assert_eq!(b(7).plan(), plan, "the same seed, the same jobs");
        assert_ne!(b(8).plan(), plan);
    }
}

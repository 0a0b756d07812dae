//! One run's figures, in simulated seconds: per class what was offered and how it ended, TTFT
//! and end-to-end quantiles, throughput, the engine bound; then, within a (load, seed) group,
//! ratios to the floor and SLO attainment; and the median with min-max spread across seeds.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::bound::{self, BoundSummary};
use super::drive::{Driven, Window};
use super::unbounded;
use crate::client::{Outcome, Status};
use crate::floor::{ratio, FLOOR_CLASS};
use crate::scenario::Scenario;
use crate::stats::quantile;

/// Note on units, in both reports.
pub const UNITS: &str = "All times are simulated seconds and all rates per simulated second: \
    the simulator ran at --speed F, arrival rates were multiplied by F and every measured time \
    (TTFT, end to end, engine steps) was multiplied back by F, so a run at --speed 2 reports \
    the same figures as one at --speed 1.";

/// The review classes whose end-to-end SLO is read against FIFO's (large first).
pub const REVIEW_CLASSES: [&str; 2] = ["large", "medium"];
/// SLO limits are this multiple of the reference p95 (the floor's TTFT, FIFO's e2e).
pub const SLO_FACTOR: f64 = 2.0;

/// How a counted request ended; every offered request has exactly one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// The answer ran to its end.
    Completed,
    /// The gateway answered 4xx/5xx before streaming (queue full, queue timeout, too long,
    /// overloaded, ...).
    Refused,
    /// The gateway sent it elsewhere: made it a background job, or cut it at a lane limit.
    Diverted,
    /// Anything else: an error mid-stream, a connection failure, or still running when the
    /// drain bound passed (`cut`).
    Failed,
}

/// `o`'s fate.
pub fn fate(o: &Outcome) -> Fate {
    if o.diverted.is_some() {
        return Fate::Diverted;
    }
    match o.status {
        Status::Ok => Fate::Completed,
        Status::Cut => Fate::Failed,
        Status::Error => match o.error.as_deref() {
            Some(c) if c.starts_with("http_4") || c.starts_with("http_5") => Fate::Refused,
            _ => Fate::Failed,
        },
    }
}

/// One class's figures in one run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClassFigures {
    /// Requests that arrived in the window.
    pub offered: u64,
    /// Ran to their end.
    pub completed: u64,
    /// Refused (4xx/5xx before streaming).
    pub refused: u64,
    /// Diverted (to a job, or cut at a lane limit).
    pub diverted: u64,
    /// Failed otherwise, `cut` included.
    pub failed: u64,
    /// Of `failed`: still running when the drain bound passed.
    pub cut: u64,
    /// TTFT quantiles over the offered requests, simulated seconds, from the arrival; one that
    /// never got a first token (refused, cut, diverted, failed) counts as infinitely late, so
    /// an arm cannot look faster by refusing ([`unbounded`]: infinite when the quantile falls
    /// among those).
    #[serde(default, with = "unbounded")]
    pub ttft_p50_s: Option<f64>,
    /// 95th percentile TTFT.
    #[serde(default, with = "unbounded")]
    pub ttft_p95_s: Option<f64>,
    /// 99th percentile TTFT.
    #[serde(default, with = "unbounded")]
    pub ttft_p99_s: Option<f64>,
    /// End-to-end quantiles over the offered requests, simulated seconds, from the arrival;
    /// one that did not complete counts as infinitely late.
    #[serde(default, with = "unbounded")]
    pub e2e_p50_s: Option<f64>,
    /// 95th percentile end to end.
    #[serde(default, with = "unbounded")]
    pub e2e_p95_s: Option<f64>,
    /// 99th percentile end to end.
    #[serde(default, with = "unbounded")]
    pub e2e_p99_s: Option<f64>,
    /// The SLO limit this class is read against, simulated seconds (questions: TTFT <=
    /// 2 x the floor's p95; reviews: e2e <= 2 x FIFO's p95; same load and seed).
    pub slo_limit_s: Option<f64>,
    /// Share of the offered requests that met it (a request that never got there misses).
    pub slo_met: Option<f64>,
}

/// Small TTFT against the floor's (same load, same seed): this / floor.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VsFloor {
    /// p50 ratio.
    #[serde(default, with = "unbounded")]
    pub ttft_p50_x: Option<f64>,
    /// p95 ratio.
    #[serde(default, with = "unbounded")]
    pub ttft_p95_x: Option<f64>,
    /// p99 ratio.
    #[serde(default, with = "unbounded")]
    pub ttft_p99_x: Option<f64>,
}

/// One run's figures (`summary.json`'s `per_seed` entries).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunFigures {
    /// Admission preset.
    pub preset: String,
    /// Offered load, a fraction of the capacity.
    pub load: f64,
    /// Seed of the arrival sequence, sizes and prompts.
    pub seed: u64,
    /// Arrivals per simulated second (of the whole mix; the floor's questions are their share).
    pub rate_per_s: f64,
    /// Per class.
    pub classes: BTreeMap<String, ClassFigures>,
    /// All classes: offered.
    pub offered: u64,
    /// All classes: completed.
    pub completed: u64,
    /// All classes: refused.
    pub refused: u64,
    /// All classes: diverted.
    pub diverted: u64,
    /// All classes: failed.
    pub failed: u64,
    /// Refusals by code (`http_429`, `http_503`, ...).
    pub refused_by_code: BTreeMap<String, u64>,
    /// Failures by code (`cut_at_deadline`, ...).
    pub failed_by_code: BTreeMap<String, u64>,
    /// Prompt + output tokens delivered inside the window per simulated second of it: of every
    /// request that completed, whenever it arrived, a prompt counts at its first token and
    /// output tokens as their events came. Work, not arrivals: above capacity it is what the
    /// engine got done, and an arm that finishes less in the window shows less.
    pub tokens_per_s: f64,
    /// The output tokens of those.
    pub output_tokens_per_s: f64,
    /// p99 of how late the client sent a counted request against its arrival time, wall-clock
    /// ms (already inside every TTFT and end to end, which run from the arrival).
    #[serde(default)]
    pub send_lag_ms_p99: Option<f64>,
    /// Small TTFT against the floor's.
    pub small_vs_floor: VsFloor,
    /// The engine bound of this run's questions, from this run's own steps.
    pub engine_bound: BoundSummary,
    /// Engine steps recorded.
    pub steps: u64,
    /// Engine steps lost (not read in time; should be 0).
    pub lost_steps: u64,
    /// p99 of how late the simulator's steps ended against their deadlines, wall-clock ms:
    /// more than a few ms means this machine did not keep up with `--speed`.
    pub engine_late_ms_p99: Option<f64>,
    /// The largest prompt chunk one sequence computed in one step, over the run's steps.
    pub max_chunk_max: u32,
    /// The same over the steps that began inside the window (from the first counted arrival
    /// to the last): the warm-up's steps, taken before the autopilot had seen enough streams
    /// to turn pieces on, are left out.
    pub max_chunk_window: u32,
    /// The fewest free KV blocks after any step's planning (0: the cache was full and cached
    /// prefixes were being evicted).
    pub min_free_blocks: Option<u32>,
    /// Piece requests the gateway sent (`*-pieces` presets; the whole run).
    pub pieces: u64,
    /// Prompt tokens pieces had prefilled that the engine computed again (the whole run).
    pub piece_recomputed_tokens: u64,
    /// Those over the large class's prompt tokens offered in the window (reviews' prompts).
    pub piece_recomputed_share: Option<f64>,
    /// Share of the offered questions whose TTFT met the small lane's objective
    /// (`lanes.small.ttft_slo_ms` of the config, simulated), when it has one.
    pub small_within_objective: Option<f64>,
    /// The autopilot's knobs over the run (`autopilot*` presets), sampled from the gateway's
    /// gauges.
    pub autopilot_trace: Vec<TracePoint>,
    /// The piece size the autopilot had at the end of the run (0: none).
    pub autopilot_piece_tokens_end: Option<u32>,
    /// Per line (`<lane>-seat`, `<lane>-prefill`: the long prompts that waited for prefill
    /// room): the median of actual over predicted queue wait of the requests that waited with
    /// a prediction (the whole run, from `tutor_gateway_wait_prediction_ratio`, interpolated
    /// within its buckets as Prometheus' `histogram_quantile` does).
    pub wait_prediction_ratio_p50: BTreeMap<String, f64>,
    /// Per line: how many such requests.
    pub wait_predictions: BTreeMap<String, u64>,
    /// Per line: the median of the early refusals' would-be wait over the predicted wait that
    /// refused them (`tutor_gateway_refusal_wait_ratio`: each refusal's ghost, admitted at
    /// the `ahead + 1`-th admission of its line after it).
    pub refusal_wait_ratio_p50: BTreeMap<String, f64>,
    /// Per line: how many refusals' ghosts were measured.
    pub refusal_ghosts: BTreeMap<String, u64>,
    /// The backlog of background jobs (a scenario class with `backlog`), when the run had one.
    #[serde(default)]
    pub jobs: Option<super::backlog::BacklogFigures>,
    /// Prompt + output tokens per simulated second of window: the window's completed requests
    /// (`tokens_per_s`) and the backlog's jobs done in the window.
    #[serde(default)]
    pub total_tokens_per_s: f64,
}

/// The autopilot's knobs at one moment of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct TracePoint {
    /// Simulated seconds since the run's start.
    pub at_s: f64,
    /// `tutor_gateway_autopilot_prefill_budget_tokens`.
    pub prefill_budget: f64,
    /// `tutor_gateway_autopilot_large_seats`.
    pub large_seats: f64,
    /// `tutor_gateway_autopilot_piece_tokens`.
    pub piece_tokens: f64,
    /// `tutor_gateway_autopilot_objective_ratio{lane="small"}`.
    pub small_ratio: f64,
    /// `tutor_gateway_autopilot_small_seats` (absent from results written before it).
    #[serde(default)]
    pub small_seats: f64,
}

/// p99 of the steps' lateness, wall-clock milliseconds.
pub fn late_ms_p99(steps: &[vllm_sim::engine::stats::StepRecord]) -> Option<f64> {
    let mut v: Vec<f64> = steps.iter().map(|s| s.late_us as f64 / 1e3).collect();
    quantile(&mut v, 0.99)
}

/// A run's figures and the per-request times the group-relative figures need.
#[derive(Debug, Clone)]
pub struct Measured {
    /// The figures.
    pub figures: RunFigures,
    /// Per counted request: class name, TTFT (simulated s, if any), e2e (if completed).
    pub times: Vec<(String, Option<f64>, Option<f64>)>,
}

/// The figures of one run (`driven`) in simulated seconds.
pub fn measure(
    driven: &Driven,
    scenario: &Scenario,
    window: &Window,
    preset: &str,
    load: f64,
    seed: u64,
    rate_per_s: f64,
) -> Measured {
    let f = window.speed;
    let mut r = RunFigures {
        preset: preset.to_string(),
        load,
        seed,
        rate_per_s,
        steps: driven.steps.len() as u64,
        lost_steps: driven.lost_steps,
        engine_late_ms_p99: late_ms_p99(&driven.steps),
        max_chunk_max: driven.steps.iter().map(|s| s.max_chunk).max().unwrap_or(0),
        min_free_blocks: driven.steps.iter().map(|s| s.free_blocks).min(),
        ..Default::default()
    };
    let mut times = vec![];
    let mut small_sent = vec![];
    let (tokens, out_tokens) = delivered(driven);
    let mut lags: Vec<f64> = driven.sent.iter().map(|s| s.lag_us as f64 / 1e3).collect();
    r.send_lag_ms_p99 = quantile(&mut lags, 0.99);
    for (ci, c) in scenario.classes.iter().enumerate() {
        let mut cf = ClassFigures::default();
        let (mut ttft, mut e2e) = (vec![], vec![]);
        for s in driven.sent.iter().filter(|s| s.arrival.class == ci) {
            let o = &s.outcome;
            cf.offered += 1;
            // From the arrival, the client's lag in sending included.
            let lag = s.lag_us as f64 / 1e6;
            let t = o.ttft_s.map(|x| (x + lag) * f);
            let fate = fate(o);
            let done = (fate == Fate::Completed)
                .then(|| o.e2e_s.map(|x| (x + lag) * f))
                .flatten();
            match fate {
                Fate::Completed => cf.completed += 1,
                Fate::Refused => {
                    cf.refused += 1;
                    *r.refused_by_code
                        .entry(o.error.clone().unwrap_or_default())
                        .or_default() += 1;
                }
                Fate::Diverted => cf.diverted += 1,
                Fate::Failed => {
                    cf.failed += 1;
                    cf.cut += u64::from(o.status == Status::Cut);
                    *r.failed_by_code
                        .entry(o.error.clone().unwrap_or_default())
                        .or_default() += 1;
                }
            }
            ttft.push(t.unwrap_or(f64::INFINITY));
            e2e.push(done.unwrap_or(f64::INFINITY));
            times.push((c.name.clone(), t, done));
            if c.name == FLOOR_CLASS {
                small_sent.push(s.sent_us);
            }
        }
        cf.ttft_p50_s = quantile(&mut ttft, 0.50);
        cf.ttft_p95_s = quantile(&mut ttft, 0.95);
        cf.ttft_p99_s = quantile(&mut ttft, 0.99);
        cf.e2e_p50_s = quantile(&mut e2e, 0.50);
        cf.e2e_p95_s = quantile(&mut e2e, 0.95);
        cf.e2e_p99_s = quantile(&mut e2e, 0.99);
        r.offered += cf.offered;
        r.completed += cf.completed;
        r.refused += cf.refused;
        r.diverted += cf.diverted;
        r.failed += cf.failed;
        r.classes.insert(c.name.clone(), cf);
    }
    let w = window.window_s.max(1e-9);
    r.tokens_per_s = tokens / w;
    r.output_tokens_per_s = out_tokens / w;
    r.engine_bound = bound::summarize(&driven.steps, &small_sent, f);
    let first = driven.sent.iter().map(|s| s.sent_us).min();
    let last = driven.sent.iter().map(|s| s.sent_us).max();
    if let (Some(first), Some(last)) = (first, last) {
        r.max_chunk_window = driven
            .steps
            .iter()
            .filter(|s| (first..=last).contains(&s.start_us))
            .map(|s| s.max_chunk)
            .max()
            .unwrap_or(0);
    }
    Measured { figures: r, times }
}

/// Prompt + output tokens, and output tokens, that the run's completed requests (counted or
/// not) delivered inside its window: a prompt at its first token, the output spread over the
/// token events (an event may carry several tokens) at the times they came.
fn delivered(driven: &Driven) -> (f64, f64) {
    let (from, to) = driven.window_us;
    let inside = |us: f64| us >= from as f64 && us < to as f64;
    let (mut all, mut output) = (0.0, 0.0);
    for s in driven.sent.iter().chain(&driven.others) {
        let o = &s.outcome;
        if fate(o) != Fate::Completed {
            continue;
        }
        let at = |t: f64| s.sent_us as f64 + t * 1e6;
        if o.ttft_s.is_some_and(|t| inside(at(t))) {
            all += f64::from(s.input_tokens);
        }
        let events = o.token_times.len();
        if events == 0 {
            continue;
        }
        let each = f64::from(o.output_tokens) / events as f64;
        let n = o
            .token_times
            .iter()
            .filter(|t| inside(at(f64::from(**t))))
            .count();
        output += each * n as f64;
    }
    (all + output, output)
}

/// Share of `class`'s requests in `times` whose value (`pick`) is at most `limit`; requests
/// without a value miss. `None` when the class had no requests.
pub fn share_within(
    times: &[(String, Option<f64>, Option<f64>)],
    class: &str,
    limit: f64,
    pick: impl Fn(&(String, Option<f64>, Option<f64>)) -> Option<f64>,
) -> Option<f64> {
    let of: Vec<_> = times.iter().filter(|t| t.0 == class).collect();
    if of.is_empty() {
        return None;
    }
    let met = of
        .iter()
        .filter(|t| pick(t).is_some_and(|v| v <= limit))
        .count();
    Some(met as f64 / of.len() as f64)
}

/// Fills the figures that need the rest of a (load, seed) group: small TTFT ratios to the
/// floor's, the questions' SLO (TTFT <= 2 x the floor's p95) and the reviews' (e2e <= 2 x
/// FIFO's p95 of the same class).
pub fn relate(group: &mut [Measured]) {
    let small_p = |m: &Measured, p: fn(&ClassFigures) -> Option<f64>| {
        m.figures.classes.get(FLOOR_CLASS).and_then(p)
    };
    let floor = group.iter().find(|m| m.figures.preset == "floor").map(|m| {
        (
            small_p(m, |c| c.ttft_p50_s),
            small_p(m, |c| c.ttft_p95_s),
            small_p(m, |c| c.ttft_p99_s),
        )
    });
    let fifo_e2e: BTreeMap<String, Option<f64>> = group
        .iter()
        .find(|m| m.figures.preset == "fifo")
        .map(|m| {
            REVIEW_CLASSES
                .iter()
                .map(|c| {
                    (
                        c.to_string(),
                        m.figures.classes.get(*c).and_then(|x| x.e2e_p95_s),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    for m in group.iter_mut() {
        let times = m.times.clone();
        if let Some((f50, f95, f99)) = floor {
            if let Some(c) = m.figures.classes.get_mut(FLOOR_CLASS) {
                // Against an unbounded floor no ratio means anything.
                let finite = |f: Option<f64>| f.filter(|x| x.is_finite());
                m.figures.small_vs_floor = VsFloor {
                    ttft_p50_x: ratio(c.ttft_p50_s, finite(f50)),
                    ttft_p95_x: ratio(c.ttft_p95_s, finite(f95)),
                    ttft_p99_x: ratio(c.ttft_p99_s, finite(f99)),
                };
                if let Some(p95) = f95.filter(|x| x.is_finite()) {
                    let limit = SLO_FACTOR * p95;
                    c.slo_limit_s = Some(limit);
                    c.slo_met = share_within(&times, FLOOR_CLASS, limit, |t| t.1);
                }
            }
        }
        for (class, p95) in &fifo_e2e {
            let p95 = p95.filter(|x| x.is_finite());
            if let (Some(p95), Some(c)) = (p95, m.figures.classes.get_mut(class)) {
                let limit = SLO_FACTOR * p95;
                c.slo_limit_s = Some(limit);
                c.slo_met = share_within(&times, class, limit, |t| t.2);
            }
        }
    }
}

/// Median (the mean of the middle two for an even count), min and max of `v`.
pub fn spread(v: &[f64]) -> Option<Value> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let median = if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    };
    let to = unbounded::to_json;
    Some(json!({"median": to(median), "min": to(s[0]), "max": to(s[n - 1]), "n": n}))
}

/// The spread of every numeric field across `runs` (the same shape, one per seed): objects are
/// walked key by key; a leaf becomes `{median, min, max, n}` over the runs where it is a number
/// (null where none is). `seed` and `load` are left out.
pub fn spread_tree(runs: &[Value]) -> Value {
    let Some(first) = runs.iter().find(|r| !r.is_null()) else {
        return Value::Null;
    };
    match first {
        Value::Object(o) => {
            let mut m = serde_json::Map::new();
            for k in o.keys() {
                if k == "seed" || k == "load" || k == "preset" {
                    continue;
                }
                let sub: Vec<Value> = runs.iter().map(|r| r[k].clone()).collect();
                m.insert(k.clone(), spread_tree(&sub));
            }
            Value::Object(m)
        }
        _ => {
            let v: Vec<f64> = runs.iter().filter_map(unbounded::from_json).collect();
            spread(&v).unwrap_or(Value::Null)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::client::Status;
    use crate::openloop::drive::Sent;

    /// A completed request sent at `sent_s` (wall s on the engine clock) with a 1,000-token
    /// prompt, its first token `ttft_s` after, then one event a second carrying 2 tokens each.
    fn completed(sent_s: f64, ttft_s: f64, events: u32) -> Sent {
        Sent {
            arrival: crate::arrivals::Arrival {
                at_s: sent_s,
                class: 0,
                index: 1,
            },
            input_tokens: 1000,
            output_tokens_asked: 2 * events,
            sent_us: (sent_s * 1e6) as u64,
            lag_us: 0,
            outcome: crate::client::Outcome {
                status: Status::Ok,
                error: None,
                ttft_s: Some(ttft_s),
                token_times: (0..events)
                    .map(|i| (ttft_s + f64::from(i)) as f32)
                    .collect(),
                output_tokens: 2 * events,
                e2e_s: Some(ttft_s + f64::from(events)),
                diverted: None,
                prompt_tokens: None,
                cached_tokens: None,
            },
        }
    }

    /// Quantiles are over the offered requests: a refused question counts as infinitely late,
    /// so with 1 of 10 refused the p95 is unbounded (it read the ninth-fastest before), and it
    /// stays so through the JSON, the spread across seeds and the table's cell. Times run from
    /// the arrival: the client's lag in sending is inside them.
    #[test]
    fn a_refused_request_counts_as_infinitely_late_and_lag_counts() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let scenario = Scenario::load(&root.join("scenarios/seed-mix-open.toml")).unwrap();
        let small = scenario
            .classes
            .iter()
            .position(|c| c.name == "small")
            .unwrap();
        let mut sent: Vec<Sent> = (0..10)
            .map(|i| {
                let mut s = completed(15.0 + f64::from(i), 0.1, 1);
                s.arrival.class = small;
                s
            })
            .collect();
        sent[0].lag_us = 50_000;
        sent[9].outcome.status = Status::Error;
        sent[9].outcome.error = Some("http_503".into());
        sent[9].outcome.ttft_s = None;
        let driven = Driven {
            sent,
            others: vec![],
            window_us: (10_000_000, 30_000_000),
            steps: vec![],
            lost_steps: 0,
            backlog: Default::default(),
        };
        let window = Window {
            speed: 1.0,
            warmup_s: 10.0,
            window_s: 20.0,
            drain_s: 10.0,
        };
        let m = measure(&driven, &scenario, &window, "lanes", 0.9, 1, 1.0);
        let c = &m.figures.classes["small"];
        assert!((c.ttft_p50_s.unwrap() - 0.1).abs() < 1e-9, "{c:?}");
        let slowest = m.times.iter().filter_map(|t| t.1).fold(0.0, f64::max);
        assert!(
            (slowest - 0.15).abs() < 1e-9,
            "the 50 ms lag is in its TTFT"
        );
        assert_eq!(c.ttft_p95_s, Some(f64::INFINITY));
        assert_eq!(c.e2e_p95_s, Some(f64::INFINITY));
        let json = serde_json::to_value(&m.figures).unwrap();
        assert_eq!(json["classes"]["small"]["ttft_p95_s"], "inf");
        let back: RunFigures = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(back.classes["small"].ttft_p95_s, Some(f64::INFINITY));
        let mut other = json.clone();
        other["classes"]["small"]["ttft_p95_s"] = serde_json::json!(0.2);
        let tree = spread_tree(&[json, other]);
        let p95 = &tree["classes"]["small"]["ttft_p95_s"];
        assert_eq!(p95["median"], "inf", "{p95}");
        assert_eq!(
            (p95["min"].as_f64(), &p95["max"]),
            (Some(0.2), &serde_json::json!("inf"))
        );
    }

    /// Throughput is the work done inside the window, not the work that arrived in it: a
    /// request that arrived in the warm-up adds what it delivered in the window, one that
    /// arrived in the window adds only what it delivered before the window's end, and a
    /// refused one adds nothing.
    #[test]
    fn throughput_counts_the_tokens_delivered_inside_the_window() {
        let mut refused = completed(12.0, 0.5, 5);
        refused.outcome.status = Status::Error;
        refused.outcome.error = Some("http_503".into());
        let driven = Driven {
            // Arrived in the window: prompt at 15.5 s (in), events at 15.5..=24.5 s: 5 in.
            sent: vec![completed(15.0, 0.5, 10), refused],
            // Arrived in the warm-up: prompt at 8.5 s (out), events 8.5..=13.5 s: 4 in.
            others: vec![completed(8.0, 0.5, 6)],
            window_us: (10_000_000, 20_000_000),
            steps: vec![],
            lost_steps: 0,
            backlog: Default::default(),
        };
        let (all, output) = delivered(&driven);
        assert_eq!(output, 2.0 * (5.0 + 4.0));
        assert_eq!(all, 1000.0 + output);
    }

    fn times(v: &[(&str, Option<f64>, Option<f64>)]) -> Vec<(String, Option<f64>, Option<f64>)> {
        v.iter().map(|(c, t, e)| (c.to_string(), *t, *e)).collect()
    }

    fn run(preset: &str, t: Vec<(String, Option<f64>, Option<f64>)>) -> Measured {
        let mut classes = BTreeMap::new();
        for name in ["small", "large"] {
            let mut ttft: Vec<f64> = t
                .iter()
                .filter(|x| x.0 == name)
                .filter_map(|x| x.1)
                .collect();
            let mut e2e: Vec<f64> = t
                .iter()
                .filter(|x| x.0 == name)
                .filter_map(|x| x.2)
                .collect();
            let c = ClassFigures {
                offered: t.iter().filter(|x| x.0 == name).count() as u64,
                ttft_p50_s: quantile(&mut ttft, 0.5),
                ttft_p95_s: quantile(&mut ttft, 0.95),
                ttft_p99_s: quantile(&mut ttft, 0.99),
                e2e_p95_s: quantile(&mut e2e, 0.95),
                ..Default::default()
            };
            classes.insert(name.to_string(), c);
        }
        Measured {
            figures: RunFigures {
                preset: preset.into(),
                classes,
                ..Default::default()
            },
            times: t,
        }
    }

    #[test]
    fn slo_attainment_against_the_floor_and_fifo() {
        // Floor: small TTFTs 0.1 .. 0.2 s (p95 0.2): the question limit is 0.4 s.
        let floor = run(
            "floor",
            times(&[
                ("small", Some(0.1), Some(1.0)),
                ("small", Some(0.2), Some(1.0)),
            ]),
        );
        // FIFO: large e2e p95 10 s: the review limit is 20 s.
        let fifo = run(
            "fifo",
            times(&[
                ("small", Some(0.3), Some(2.0)),
                ("small", Some(0.5), Some(2.0)),
                ("large", Some(1.0), Some(8.0)),
                ("large", Some(2.0), Some(10.0)),
            ]),
        );
        // Lanes: 3 of 4 questions within 0.4 s (one refused: no TTFT, a miss); reviews 15 s
        // (met), 25 s (missed), one never completed (missed).
        let lanes = run(
            "lanes",
            times(&[
                ("small", Some(0.1), Some(1.0)),
                ("small", Some(0.4), Some(1.0)),
                ("small", Some(0.5), Some(1.0)),
                ("small", None, None),
                ("large", Some(3.0), Some(15.0)),
                ("large", Some(3.0), Some(25.0)),
                ("large", Some(3.0), None),
            ]),
        );
        let mut g = vec![floor, fifo, lanes];
        relate(&mut g);
        let small = |i: usize| g[i].figures.classes["small"].clone();
        let large = |i: usize| g[i].figures.classes["large"].clone();
        assert_eq!(small(2).slo_limit_s, Some(0.4));
        assert_eq!(small(2).slo_met, Some(0.5), "0.1 and 0.4 of four");
        assert_eq!(small(0).slo_met, Some(1.0), "the floor meets its own limit");
        assert_eq!(small(1).slo_met, Some(0.5));
        assert_eq!(large(2).slo_limit_s, Some(20.0));
        assert!((large(2).slo_met.unwrap() - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(large(1).slo_met, Some(1.0));
        // The floor has no reviews: nothing to attain.
        assert_eq!(large(0).slo_met, None);
        // Ratios to the floor: lanes p95 0.5 / 0.2.
        assert!((g[2].figures.small_vs_floor.ttft_p95_x.unwrap() - 2.5).abs() < 1e-12);
        assert_eq!(g[0].figures.small_vs_floor.ttft_p95_x, Some(1.0));
    }

    #[test]
    fn spreads_across_seeds() {
        let s = spread(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!(
            (s["median"].as_f64(), s["min"].as_f64(), s["max"].as_f64()),
            (Some(2.0), Some(1.0), Some(3.0))
        );
        assert_eq!(spread(&[1.0, 4.0]).unwrap()["median"], 2.5);
        assert_eq!(spread(&[]), None);
        let runs = vec![
            json!({"seed": 1, "preset": "fifo", "x": 1.0, "c": {"small": {"p": 0.2, "q": null}}}),
            json!({"seed": 2, "preset": "fifo", "x": 3.0, "c": {"small": {"p": 0.4, "q": null}}}),
            json!({"seed": 3, "preset": "fifo", "x": 2.0, "c": {"small": {"p": 0.3, "q": 5}}}),
        ];
        let t = spread_tree(&runs);
        assert_eq!(t["x"]["median"], 2.0);
        assert_eq!(t["c"]["small"]["p"]["max"], 0.4);
        assert_eq!(t["c"]["small"]["p"]["n"], 3);
        // Only where it is a number.
        assert_eq!(t["c"]["small"]["q"]["n"], 1);
        assert!(t.get("seed").is_none() && t.get("preset").is_none());
    }

    #[test]
    fn every_outcome_has_one_fate() {
        let o = |status: Status, error: Option<&str>, diverted: Option<&str>| Outcome {
            status,
            error: error.map(str::to_string),
            ttft_s: None,
            token_times: vec![],
            output_tokens: 0,
            e2e_s: None,
            diverted: diverted.map(str::to_string),
            prompt_tokens: None,
            cached_tokens: None,
        };
        assert_eq!(fate(&o(Status::Ok, None, None)), Fate::Completed);
        assert_eq!(
            fate(&o(Status::Ok, None, Some("lane_limit"))),
            Fate::Diverted
        );
        assert_eq!(
            fate(&o(Status::Error, Some("diverted_to_job"), Some("job"))),
            Fate::Diverted
        );
        assert_eq!(
            fate(&o(Status::Error, Some("http_429"), None)),
            Fate::Refused
        );
        assert_eq!(
            fate(&o(Status::Error, Some("http_503"), None)),
            Fate::Refused
        );
        assert_eq!(
            fate(&o(Status::Error, Some("http_503_deadline_unmet"), None)),
            Fate::Refused
        );
        assert_eq!(
            fate(&o(Status::Error, Some("stream_broken"), None)),
            Fate::Failed
        );
        assert_eq!(
            fate(&o(Status::Cut, Some("cut_at_deadline"), None)),
            Fate::Failed
        );
    }
}

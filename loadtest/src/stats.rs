//! From raw records to `results.json`: per-class quantiles, throughput in the measured window,
//! a per-second throughput timeline, and one compact line per request.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::client::Status;
use crate::record::{Record, RunData};
use crate::scenario::Scenario;

pub use tutor_wire::stats::quantile;

/// One series of a gateway histogram family, read from a `/metrics` text: (upper bound,
/// cumulative count) per bucket, in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetricsHistogram {
    buckets: Vec<(f64, f64)>,
}

impl MetricsHistogram {
    /// `family`'s buckets for the series labelled `labels` in `text`, the labels before `le`
    /// as Prometheus writes them (sorted: `lane="small"`, `lane="medium",line="seat"`); none:
    /// an empty histogram.
    pub fn read(text: &str, family: &str, labels: &str) -> Self {
        let prefix = format!("{family}_bucket{{{labels},le=\"");
        let mut buckets: Vec<(f64, f64)> = text
            .lines()
            .filter_map(|l| {
                let (le, count) = l.strip_prefix(&prefix)?.split_once("\"} ")?;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                Some((le, count.trim().parse().ok()?))
            })
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        Self { buckets }
    }

    /// Adds `other`'s counts bucket by bucket (another series of the same family, e.g. another
    /// lane's: the same bounds); a bound only one of them has is kept as it is.
    pub fn add(&mut self, other: &Self) {
        for &(le, count) in &other.buckets {
            match self.buckets.iter_mut().find(|b| b.0 == le) {
                Some(b) => b.1 += count,
                None => self.buckets.push((le, count)),
            }
        }
        self.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    }

    /// Observations.
    pub fn total(&self) -> f64 {
        self.buckets.last().map_or(0.0, |b| b.1)
    }

    /// The `p` quantile, interpolated linearly within the bucket that holds it (as
    /// Prometheus' `histogram_quantile`; the `+Inf` bucket answers its lower bound); `None`
    /// without observations.
    pub fn quantile(&self, p: f64) -> Option<f64> {
        let total = self.total();
        if total <= 0.0 {
            return None;
        }
        let rank = p * total;
        let mut lower = (0.0, 0.0);
        for &(le, count) in &self.buckets {
            if count >= rank {
                if le.is_infinite() {
                    return Some(lower.0);
                }
                let within = (rank - lower.1) / (count - lower.1).max(f64::MIN_POSITIVE);
                return Some(lower.0 + (le - lower.0) * within);
            }
            lower = (le, count);
        }
        None
    }
}

/// Per-class figures. Times in seconds; `None` where there was nothing to measure.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClassStats {
    /// Requests sent.
    pub requests: u64,
    /// Ended normally.
    pub ok: u64,
    /// Failed (HTTP error, error event, broken stream).
    pub errors: u64,
    /// Still running at the hard deadline.
    pub cut: u64,
    /// Cut before their first token (their TTFT is unknown, at least the time they waited).
    pub cut_before_first_token: u64,
    /// TTFT quantiles over requests that got a first token.
    pub ttft_p50_s: Option<f64>,
    /// 95th percentile TTFT.
    pub ttft_p95_s: Option<f64>,
    /// 99th percentile TTFT.
    pub ttft_p99_s: Option<f64>,
    /// Mean TTFT.
    pub ttft_mean_s: Option<f64>,
    /// End-to-end (send to end of stream) quantiles over ok requests.
    pub e2e_p50_s: Option<f64>,
    /// 95th percentile end-to-end.
    pub e2e_p95_s: Option<f64>,
    /// 99th percentile end-to-end.
    pub e2e_p99_s: Option<f64>,
    /// Time per output token, (e2e - ttft) / (tokens - 1), median over ok requests.
    pub tpot_p50_s: Option<f64>,
    /// 95th percentile time per output token.
    pub tpot_p95_s: Option<f64>,
    /// Inter-token latency (gap between token events) quantiles.
    pub itl_p50_s: Option<f64>,
    /// 95th percentile inter-token latency.
    pub itl_p95_s: Option<f64>,
    /// 99th percentile inter-token latency.
    pub itl_p99_s: Option<f64>,
    /// Output tokens received within the measured window.
    pub output_tokens: u64,
    /// `output_tokens` / window.
    pub output_tokens_per_s: f64,
}

/// One request in `results.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestLine {
    /// Class name.
    pub class: String,
    /// Send time from the run's start, seconds.
    pub start_s: f64,
    /// How it ended.
    pub status: Status,
    /// Error code when not ok.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<String>,
    /// Time to first token.
    pub ttft_s: Option<f64>,
    /// End to end.
    pub e2e_s: Option<f64>,
    /// Output tokens.
    pub output_tokens: u32,
    /// Prompt tokens as the engine counted them, when its usage said.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub prompt_tokens: Option<u32>,
    /// Of those, tokens served from the engine's prefix cache.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub cached_tokens: Option<u32>,
    /// Open loop: how late this tool sent it against its arrival time, seconds.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub lag_s: Option<f64>,
}

/// Open loop: how late this tool sent its measured requests against their arrival times. Every
/// time above is measured from the send, so a late send is in none of them, but the target saw
/// the load as sent: a large lag means the run's arrivals were not the schedule's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct SendLag {
    /// Median, seconds.
    pub p50_s: f64,
    /// 95th percentile, seconds.
    pub p95_s: f64,
    /// Largest, seconds.
    pub max_s: f64,
}

impl SendLag {
    /// Over `records`' lags (`None` when none has one: a closed loop).
    fn of(records: &[RequestLine]) -> Option<Self> {
        let mut lags: Vec<f64> = records.iter().filter_map(|r| r.lag_s).collect();
        Some(Self {
            p50_s: quantile(&mut lags, 0.50)?,
            p95_s: quantile(&mut lags, 0.95)?,
            max_s: quantile(&mut lags, 1.0)?,
        })
    }
}

/// How much of a run's prompts the engine served from its prefix cache, over the requests whose
/// usage reported their prompt tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PrefixCache {
    /// Requests whose usage reported prompt tokens.
    pub requests: u64,
    /// Their prompt tokens.
    pub prompt_tokens: u64,
    /// Of those, tokens served from the prefix cache (`usage.cached_tokens` of the gateway's
    /// `done`, vLLM's `usage.prompt_tokens_details.cached_tokens`; vLLM reports them only with
    /// `--enable-prompt-tokens-details`).
    pub cached_tokens: u64,
    /// `cached_tokens / prompt_tokens`.
    pub cached_ratio: f64,
}

impl PrefixCache {
    /// Sums the requests that reported prompt tokens; `None` when none did.
    pub fn of(lines: &[RequestLine]) -> Option<Self> {
        let mut c = Self::default();
        for l in lines {
            if let Some(p) = l.prompt_tokens {
                c.requests += 1;
                c.prompt_tokens += u64::from(p);
                c.cached_tokens += u64::from(l.cached_tokens.unwrap_or(0).min(p));
            }
        }
        (c.prompt_tokens > 0).then(|| Self {
            cached_ratio: c.cached_tokens as f64 / c.prompt_tokens as f64,
            ..c
        })
    }
}

/// `results.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Results {
    /// The scenario run (as loaded, with overrides).
    pub scenario: Scenario,
    /// Target base URL.
    pub target: String,
    /// `answer` or `chat`.
    pub api: crate::client::Api,
    /// Seed used.
    pub seed: u64,
    /// Salt mixed into the prompt text (`--salt` reproduces it); `None`: the seed's own text
    /// (`--replay`, the experiments, or a results.json from before salts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub salt: Option<u64>,
    /// Seconds at the start whose requests were sent but not measured (0: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub warmup_s: f64,
    /// Requests sent in the warm-up: in no figure but the window's throughput (the work they
    /// delivered inside the window).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub warmup_requests: u64,
    /// The measured window: seconds during which requests were sent, after the warm-up.
    pub duration_s: f64,
    /// Seconds until the last request ended (window + drain).
    pub wall_s: f64,
    /// Requests sent.
    pub requests: u64,
    /// Failed requests.
    pub errors: u64,
    /// Errors by code.
    pub errors_by_code: BTreeMap<String, u64>,
    /// Open-loop arrivals not sent (too many in flight).
    pub skipped: u64,
    /// Output tokens received within the window, all classes.
    pub output_tokens: u64,
    /// Average output tokens/s over the window, all classes.
    pub output_tokens_per_s: f64,
    /// Per class, in scenario order (names as keys).
    pub classes: BTreeMap<String, ClassStats>,
    /// Output tokens received in each second of the window.
    pub throughput_timeline: Vec<f64>,
    /// Every request.
    pub records: Vec<RequestLine>,
    /// Prompt tokens served from the engine's prefix cache; `None` when no request's usage
    /// reported its prompt tokens (or a results.json from before this field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_cache: Option<PrefixCache>,
    /// Open loop: how late the measured requests were sent (`None`: a closed loop, or a
    /// results.json from before this field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_lag: Option<SendLag>,
    /// `tutor-load experiment`: this run's small TTFT against the floor run's (the same small
    /// clients with no large ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vs_floor: Option<VsFloor>,
}

/// A class's TTFT quantiles beside the floor run's and as ratios to them (this / floor).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VsFloor {
    /// The class compared (`small`).
    pub class: String,
    /// The floor run's p50 TTFT.
    pub floor_ttft_p50_s: Option<f64>,
    /// The floor run's p95 TTFT.
    pub floor_ttft_p95_s: Option<f64>,
    /// The floor run's p99 TTFT.
    pub floor_ttft_p99_s: Option<f64>,
    /// This run's p50 TTFT / the floor's.
    pub ttft_p50_x: Option<f64>,
    /// This run's p95 TTFT / the floor's.
    pub ttft_p95_x: Option<f64>,
    /// This run's p99 TTFT / the floor's.
    pub ttft_p99_x: Option<f64>,
}

impl Results {
    /// Summarises `data` over the window of `duration_s` seconds that follows `warmup_s`
    /// seconds of warm-up: every figure is of the requests sent in the window, except the
    /// throughput, which is the output delivered in the window by every request (one sent in
    /// the warm-up included, so the window's work is all counted whatever its start).
    pub fn build(
        scenario: &Scenario,
        target: &crate::client::Target,
        seed: u64,
        (warmup_s, duration_s): (f64, f64),
        data: &RunData,
    ) -> Self {
        let secs = duration_s.ceil().max(1.0) as usize;
        let mut timeline = vec![0.0; secs];
        let mut classes = BTreeMap::new();
        let mut errors_by_code = BTreeMap::new();
        let measured = |r: &Record| r.start_s >= warmup_s;
        for (ci, c) in scenario.classes.iter().enumerate() {
            let recs: Vec<_> = data.records.iter().filter(|r| r.class == ci).collect();
            let mut s = ClassStats {
                requests: recs.iter().filter(|r| measured(r)).count() as u64,
                ..Default::default()
            };
            let (mut ttft, mut e2e, mut tpot, mut itl) = (vec![], vec![], vec![], vec![]);
            let mut tokens = 0.0;
            for r in &recs {
                let o = &r.outcome;
                // Token events may carry several tokens: spread the reported count over them.
                let per_event = if o.token_times.is_empty() {
                    0.0
                } else {
                    f64::from(o.output_tokens) / o.token_times.len() as f64
                };
                for &t in &o.token_times {
                    let at = r.start_s + f64::from(t) - warmup_s;
                    if (0.0..duration_s).contains(&at) {
                        tokens += per_event;
                        timeline[(at as usize).min(secs - 1)] += per_event;
                    }
                }
                if !measured(r) {
                    continue;
                }
                match o.status {
                    Status::Ok => s.ok += 1,
                    Status::Error => s.errors += 1,
                    Status::Cut => s.cut += 1,
                }
                if o.status == Status::Cut && o.ttft_s.is_none() {
                    s.cut_before_first_token += 1;
                }
                if o.status == Status::Error {
                    let code = o.error.clone().unwrap_or_default();
                    *errors_by_code.entry(code).or_insert(0) += 1;
                }
                ttft.extend(o.ttft_s);
                if let (Status::Ok, Some(e), Some(f)) = (&o.status, o.e2e_s, o.ttft_s) {
                    e2e.push(e);
                    if o.output_tokens > 1 {
                        tpot.push((e - f) / f64::from(o.output_tokens - 1));
                    }
                }
                itl.extend(o.token_times.windows(2).map(|w| f64::from(w[1] - w[0])));
            }
            s.ttft_mean_s =
                (!ttft.is_empty()).then(|| ttft.iter().sum::<f64>() / ttft.len() as f64);
            s.ttft_p50_s = quantile(&mut ttft, 0.50);
            s.ttft_p95_s = quantile(&mut ttft, 0.95);
            s.ttft_p99_s = quantile(&mut ttft, 0.99);
            s.e2e_p50_s = quantile(&mut e2e, 0.50);
            s.e2e_p95_s = quantile(&mut e2e, 0.95);
            s.e2e_p99_s = quantile(&mut e2e, 0.99);
            s.tpot_p50_s = quantile(&mut tpot, 0.50);
            s.tpot_p95_s = quantile(&mut tpot, 0.95);
            s.itl_p50_s = quantile(&mut itl, 0.50);
            s.itl_p95_s = quantile(&mut itl, 0.95);
            s.itl_p99_s = quantile(&mut itl, 0.99);
            s.output_tokens = tokens.round() as u64;
            s.output_tokens_per_s = tokens / duration_s.max(1e-9);
            classes.insert(c.name.clone(), s);
        }
        let output_tokens: u64 = classes.values().map(|c| c.output_tokens).sum();
        let mut records: Vec<RequestLine> = data
            .records
            .iter()
            .filter(|r| measured(r))
            .map(|r| RequestLine {
                class: scenario.classes[r.class].name.clone(),
                start_s: round3(r.start_s),
                status: r.outcome.status.clone(),
                error: r.outcome.error.clone(),
                ttft_s: r.outcome.ttft_s.map(round3),
                e2e_s: r.outcome.e2e_s.map(round3),
                output_tokens: r.outcome.output_tokens,
                prompt_tokens: r.outcome.prompt_tokens,
                cached_tokens: r.outcome.cached_tokens,
                lag_s: r.lag_s.map(round3),
            })
            .collect();
        records.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
        Results {
            scenario: scenario.clone(),
            target: target.base_url.clone(),
            api: target.api,
            seed,
            salt: None,
            warmup_s,
            warmup_requests: data.records.iter().filter(|r| !measured(r)).count() as u64,
            duration_s,
            wall_s: data.wall_s,
            requests: records.len() as u64,
            errors: errors_by_code.values().sum(),
            errors_by_code,
            skipped: data.skipped,
            output_tokens,
            output_tokens_per_s: output_tokens as f64 / duration_s.max(1e-9),
            classes,
            throughput_timeline: timeline,
            prefix_cache: PrefixCache::of(&records),
            send_lag: SendLag::of(&records),
            records,
            vs_floor: None,
        }
    }

    /// Reads `results.json`.
    pub fn load(path: &std::path::Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

fn is_zero_u64(x: &u64) -> bool {
    *x == 0
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod metrics_histogram_tests {
    use super::MetricsHistogram;

    #[test]
    fn a_quantile_is_interpolated_within_its_bucket() {
        let text = "\
# HELP x y
x_bucket{lane=\"small\",le=\"0.5\"} 10
x_bucket{lane=\"small\",le=\"1\"} 30
x_bucket{lane=\"small\",le=\"2\"} 40
x_bucket{lane=\"small\",le=\"+Inf\"} 40
x_bucket{lane=\"large\",le=\"0.5\"} 0
x_bucket{lane=\"large\",le=\"+Inf\"} 0
";
        // 40 observations: the 20th lies halfway through (0.5, 1].
        let h = MetricsHistogram::read(text, "x", "lane=\"small\"");
        assert_eq!(h.total(), 40.0);
        assert!((h.quantile(0.5).unwrap() - 0.75).abs() < 1e-9);
        for lane in ["large", "medium"] {
            let h = MetricsHistogram::read(text, "x", &format!("lane=\"{lane}\""));
            assert_eq!((h.total(), h.quantile(0.5)), (0.0, None));
        }
        // Lanes summed: the same buckets, counts added.
        let mut all = MetricsHistogram::default();
        for lane in ["small", "large", "medium"] {
            all.add(&MetricsHistogram::read(
                text,
                "x",
                &format!("lane=\"{lane}\""),
            ));
        }
        assert_eq!(all, h);
    }
}

#[cfg(test)]
mod warmup_tests {
    use super::*;
    use crate::client::{Api, Outcome, Target};

    fn record(start_s: f64, ttft_s: f64, token_times: Vec<f32>) -> Record {
        Record {
            class: 0,
            start_s,
            lag_s: None,
            outcome: Outcome {
                status: Status::Ok,
                error: None,
                ttft_s: Some(ttft_s),
                output_tokens: token_times.len() as u32,
                e2e_s: token_times.last().map(|&t| f64::from(t)),
                token_times,
                diverted: None,
                prompt_tokens: None,
                cached_tokens: None,
            },
        }
    }

    /// A request sent in the warm-up is in no quantile and no count, but what it delivers
    /// inside the window is the window's work; nothing delivered before the window counts.
    #[test]
    fn the_warm_up_is_left_out_of_every_figure_but_the_windows_work() {
        let s = Scenario::parse(
            "name='t'\n[load]\nmode='closed'\n[[class]]\nname='a'\n\
             input_tokens=300\noutput_tokens=10\nconcurrency=1\n",
        )
        .unwrap();
        let t = Target::new("http://127.0.0.1:1", Api::Answer, None).unwrap();
        let data = RunData {
            records: vec![
                // Sent at 1 s (warm-up): 9 s to its first token, tokens at 10-13 s.
                record(1.0, 9.0, vec![9.0, 10.0, 11.0, 12.0]),
                // Sent at 2 s (warm-up): all its tokens before the window.
                record(2.0, 0.5, vec![0.5, 1.0]),
                // Sent at 12 s and 15 s (window): quick ones.
                record(12.0, 0.1, vec![0.1, 0.2]),
                record(15.0, 0.3, vec![0.3]),
            ],
            skipped: 0,
            wall_s: 20.0,
        };
        let r = Results::build(&s, &t, 1, (10.0, 10.0), &data);
        let a = &r.classes["a"];
        assert_eq!((r.requests, a.requests, a.ok), (2, 2, 2));
        assert_eq!(r.warmup_requests, 2);
        assert_eq!(r.records.len(), 2);
        assert!(r.records.iter().all(|l| l.start_s >= 10.0));
        // The warm-up's 9 s first token is in no quantile.
        assert_eq!(a.ttft_p99_s, Some(0.3));
        // In the window: 4 tokens of the first request (10, 11, 12, 13 s) and the window's
        // own 3; the second request's tokens (2.5 s, 3 s) are before it.
        assert_eq!(r.output_tokens, 7);
        assert!((r.output_tokens_per_s - 0.7).abs() < 1e-9);
        assert_eq!(r.throughput_timeline.iter().sum::<f64>(), 7.0);
        // Without a warm-up, every request counts.
        let all = Results::build(&s, &t, 1, (0.0, 20.0), &data);
        assert_eq!((all.requests, all.warmup_requests), (4, 0));
        assert_eq!(all.classes["a"].ttft_p99_s.map(|x| x > 8.0), Some(true));
    }
}

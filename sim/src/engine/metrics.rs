//! vLLM's Prometheus series, same names, types, units and labels (`engine`, `model_name`).
//!
//! Times are wall-clock seconds as a client sees them: with `--speed F` they are F times shorter
//! than the simulated GPU's.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

use super::sequence::{FinishReason, Finished};

/// vLLM's buckets for request-level latency histograms (seconds).
const REQUEST_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];
/// vLLM's buckets for time to first token (seconds).
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's buckets for inter-token latency (seconds).
const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];

/// A cumulative histogram in Prometheus' sense.
#[derive(Debug, Clone)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    /// Records one observation in seconds.
    pub fn observe(&mut self, d: Duration) {
        let v = d.as_secs_f64();
        if let Some(i) = self.bounds.iter().position(|b| v <= *b) {
            self.counts[i] += 1;
        }
        self.sum += v;
        self.count += 1;
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cum = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            cum += c;
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b:?}\"}} {cum}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {:?}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}

/// Counters and histograms the engine updates as it runs.
#[derive(Debug, Clone)]
pub struct EngineMetrics {
    /// Prompt tokens computed (counted once a prompt is fully prefilled).
    pub prompt_tokens: u64,
    /// Output tokens generated.
    pub generation_tokens: u64,
    /// Preemptions.
    pub preemptions: u64,
    /// Finished requests by reason.
    pub success: BTreeMap<&'static str, u64>,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_cache_queries: u64,
    /// Of those, tokens found cached.
    pub prefix_cache_hits: u64,
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
    queue: Histogram,
    prefill: Histogram,
    decode: Histogram,
}

impl Default for EngineMetrics {
    fn default() -> Self {
        let success = ["stop", "length", "abort", "error"]
            .into_iter()
            .map(|r| (r, 0))
            .collect();
        Self {
            prompt_tokens: 0,
            generation_tokens: 0,
            preemptions: 0,
            success,
            prefix_cache_queries: 0,
            prefix_cache_hits: 0,
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(REQUEST_BUCKETS),
            queue: Histogram::new(REQUEST_BUCKETS),
            prefill: Histogram::new(REQUEST_BUCKETS),
            decode: Histogram::new(REQUEST_BUCKETS),
        }
    }
}

impl EngineMetrics {
    /// Records one generated token and its gap since the previous one of the same request.
    pub fn token(&mut self, gap: Option<Duration>) {
        self.generation_tokens += 1;
        if let Some(g) = gap {
            self.itl.observe(g);
        }
    }

    /// Records a first token (time to first token, prefill, prompt tokens).
    pub fn first_token(&mut self, ttft: Duration, prompt_tokens: u32) {
        self.ttft.observe(ttft);
        self.prompt_tokens += u64::from(prompt_tokens);
    }

    /// Records a finished request.
    pub fn finished(&mut self, f: &Finished) {
        *self.success.entry(f.reason.as_str()).or_default() += 1;
        let t = &f.timings;
        for (h, d) in [
            (&mut self.e2e, t.e2e()),
            (&mut self.queue, t.queue_time()),
            (&mut self.prefill, t.prefill()),
            (&mut self.decode, t.decode()),
        ] {
            if let Some(d) = d {
                h.observe(d);
            }
        }
    }

    /// Finished requests with this reason.
    pub fn finished_count(&self, reason: FinishReason) -> u64 {
        self.success.get(reason.as_str()).copied().unwrap_or(0)
    }

    /// Time-to-first-token observations so far.
    pub fn ttft_count(&self) -> u64 {
        self.ttft.count()
    }
}

/// Gauges read at scrape time.
#[derive(Debug, Clone, Copy)]
pub struct Gauges {
    /// Requests running.
    pub running: usize,
    /// Requests waiting.
    pub waiting: usize,
    /// KV-cache usage 0..1.
    pub kv_usage: f64,
}

/// Static cache configuration for `vllm:cache_config_info`.
#[derive(Debug, Clone)]
pub struct CacheInfo {
    /// Tokens per block.
    pub block_size: u32,
    /// Blocks on the GPU.
    pub num_gpu_blocks: u32,
    /// Prefix caching on or off.
    pub prefix_caching: bool,
}

/// Renders the Prometheus text exposition.
pub fn render(model: &str, m: &EngineMetrics, g: Gauges, cache: &CacheInfo) -> String {
    let mut out = String::with_capacity(16 * 1024);
    let l = format!("engine=\"0\",model_name=\"{model}\"");
    let gauge = |out: &mut String, name: &str, help: &str, v: f64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{l}}} {v:?}"
        );
    };
    gauge(
        &mut out,
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        g.running as f64,
    );
    gauge(
        &mut out,
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        g.waiting as f64,
    );
    gauge(
        &mut out,
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        g.kv_usage,
    );
    let _ = writeln!(
        out,
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\n\
         vllm:cache_config_info{{block_size=\"{}\",cache_dtype=\"auto\",enable_prefix_caching=\"{}\",engine=\"0\",gpu_memory_utilization=\"0.9\",num_cpu_blocks=\"0\",num_gpu_blocks=\"{}\"}} 1.0",
        cache.block_size,
        if cache.prefix_caching { "True" } else { "False" },
        cache.num_gpu_blocks
    );
    let counter = |out: &mut String, name: &str, help: &str, v: u64| {
        let _ = writeln!(
            out,
            "# HELP {name}_total {help}\n# TYPE {name}_total counter\n{name}_total{{{l}}} {v}.0"
        );
    };
    counter(
        &mut out,
        "vllm:num_preemptions",
        "Cumulative number of preemption from the engine.",
        m.preemptions,
    );
    counter(
        &mut out,
        "vllm:prompt_tokens",
        "Number of prefill tokens processed.",
        m.prompt_tokens,
    );
    counter(
        &mut out,
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        m.generation_tokens,
    );
    counter(
        &mut out,
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        m.prefix_cache_queries,
    );
    counter(
        &mut out,
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        m.prefix_cache_hits,
    );
    let _ = writeln!(out, "# HELP vllm:request_success_total Count of successfully processed requests.\n# TYPE vllm:request_success_total counter");
    for (reason, v) in &m.success {
        let _ = writeln!(
            out,
            "vllm:request_success_total{{{l},finished_reason=\"{reason}\"}} {v}.0"
        );
    }
    m.ttft.render(
        &mut out,
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        &l,
    );
    m.itl.render(
        &mut out,
        "vllm:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        &l,
    );
    m.e2e.render(
        &mut out,
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        &l,
    );
    m.queue.render(
        &mut out,
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        &l,
    );
    m.prefill.render(
        &mut out,
        "vllm:request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
        &l,
    );
    m.decode.render(
        &mut out,
        "vllm:request_decode_time_seconds",
        "Histogram of time spent in DECODE phase for request.",
        &l,
    );
    out
}

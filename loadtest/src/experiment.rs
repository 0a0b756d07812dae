//! The defining experiment (M16, issue 9): the same closed-loop load through the real gateway in
//! front of the simulator under four presets: `fifo` (one queue, vLLM users' baseline),
//! `strict` (the seed's 32/20/4 as caps), `lanes` (work-conserving lanes, the default) and
//! `lanes-priority` (lanes + the lane sent as vLLM priority, simulator with
//! `--scheduling-policy priority`); a fresh simulator for each, same seed, same requests.
//! Writes one folder per preset, `summary.json`, `comparison.md`.

use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use serde_json::{json, Value};
use tutor_gateway::config::{Config, Policy, RequestLogSink};

use crate::client::{Api, Target};
use crate::compare::{compare, Rules};
use crate::prompt::PromptBuilder;
use crate::runner::{run, RunOptions};
use crate::scenario::Scenario;
use crate::stats::Results;

/// Settings of one experiment.
#[derive(Debug, Clone)]
pub struct ExperimentOptions {
    /// Gateway config file; its policy is overridden per run.
    pub config: PathBuf,
    /// The load (closed loop, e.g. `defining-experiment.toml`).
    pub scenario: Scenario,
    /// Window and drain per policy, seed, progress.
    pub run: RunOptions,
    /// Simulator profile (`llama-3.1-8b-h100`).
    pub profile: String,
    /// Simulator speed factor.
    pub speed: f64,
    /// `[admission.fifo] max_concurrency` for the FIFO run; 0 = unlimited.
    pub fifo_max_concurrency: u32,
    /// Output folder.
    pub out: PathBuf,
}

/// Runs one policy and returns its results.
/// One admission setup the experiment compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// `policy = "fifo"`.
    Fifo,
    /// `policy = "strict"`: the seed's caps.
    Strict,
    /// `policy = "lanes"`: work-conserving lanes.
    Lanes,
    /// `lanes` + `engine_priority` + the simulator's priority scheduling.
    LanesPriority,
}

impl Preset {
    /// The folder / summary key.
    pub fn name(self) -> &'static str {
        match self {
            Preset::Fifo => "fifo",
            Preset::Strict => "strict",
            Preset::Lanes => "lanes",
            Preset::LanesPriority => "lanes-priority",
        }
    }
}

/// Gateway-side p50/p95 of the small lane's queue wait, seconds, from `/metrics` (bucket
/// interpolation): TTFT from admission = TTFT from arrival - this wait.
async fn small_queue_wait(gw_url: &str) -> Value {
    let text = match reqwest::get(format!("{gw_url}/metrics")).await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => return Value::Null,
    };
    let prefix = "tutor_gateway_queue_wait_seconds_bucket{lane=\"small\",le=\"";
    let mut buckets: Vec<(f64, f64)> = text
        .lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .filter_map(|rest| {
            let (le, count) = rest.split_once("\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, count.trim().parse().ok()?))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last().map_or(0.0, |b| b.1);
    let q = |p: f64| -> Option<f64> {
        if total <= 0.0 {
            return None;
        }
        let want = p * total;
        let mut prev = (0.0, 0.0);
        for &(le, c) in &buckets {
            if c >= want {
                if !le.is_finite() {
                    return Some(prev.0);
                }
                let span = (c - prev.1).max(1e-9);
                return Some(prev.0 + (le - prev.0) * (want - prev.1) / span);
            }
            prev = (le, c);
        }
        None
    };
    json!({"p50_s": q(0.5), "p95_s": q(0.95), "requests": total})
}

/// Runs the load under `preset`; returns the client-side results and the gateway's small-lane
/// queue wait.
pub async fn run_preset(
    opts: &ExperimentOptions,
    preset: Preset,
) -> anyhow::Result<(Results, Value)> {
    let policy = match preset {
        Preset::Fifo => Policy::Fifo,
        Preset::Strict => Policy::Strict,
        Preset::Lanes | Preset::LanesPriority => Policy::Lanes,
    };
    let mut cfg = Config::load(&opts.config)
        .map_err(|e| anyhow::anyhow!("{}: {e}", opts.config.display()))?;
    cfg.admission.policy = policy;
    cfg.admission.engine_priority = preset == Preset::LanesPriority;
    cfg.admission.fifo.max_concurrency = NonZeroU32::new(opts.fifo_max_concurrency);
    cfg.telemetry.request_log = RequestLogSink::Off;
    cfg.telemetry.tracing = false;
    let tokenizer = match &cfg.classify.tokenizer {
        tutor_gateway::config::TokenizerSource::File(p) => Some(p.clone()),
        _ => None,
    };
    let mut sim_args: Vec<String> = vec![
        "--profile".into(),
        opts.profile.clone(),
        "--speed".into(),
        opts.speed.to_string(),
        // The gateway's /answer sends no ignore_eos: a huge mean makes every answer run to its
        // max_output_tokens, so output lengths are exact (as with ignore_eos on the chat API).
        "--mean-output-tokens".into(),
        "1000000".into(),
        "--seed".into(),
        opts.run.seed.to_string(),
    ];
    if let Some(p) = &tokenizer {
        sim_args.extend(["--tokenizer".into(), p.display().to_string()]);
    }
    if preset == Preset::LanesPriority {
        sim_args.extend(["--scheduling-policy".into(), "priority".into()]);
    }
    let sim = tutor_gateway::server::start_sim(&mut cfg, &sim_args).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let gw = tutor_gateway::server::start(cfg, listener)?;
    let target = Target::new(&gw.url(), Api::Answer, None)?;
    let prompts = PromptBuilder::new(vllm_sim::tokenizer::PromptTokenizer::load(
        tokenizer.as_deref(),
    )?);
    eprintln!(
        "== {}: gateway {} -> simulator {}",
        preset.name(),
        gw.url(),
        sim.url()
    );
    let data = run(&opts.scenario, &target, &prompts, &opts.run).await;
    let results = Results::build(
        &opts.scenario,
        &target,
        opts.run.seed,
        opts.run.duration.as_secs_f64(),
        &data,
    );
    let wait = small_queue_wait(&gw.url()).await;
    gw.shutdown().await;
    sim.shutdown().await;
    Ok((results, wait))
}

/// The `summary.json` entry of one policy (the shape, plus more fields).
pub fn summary_entry(r: &Results) -> Value {
    let mut classes = serde_json::Map::new();
    for (name, c) in crate::report::ordered(r) {
        classes.insert(
            name.to_string(),
            json!({
                "ttft_p50_s": c.ttft_p50_s, "ttft_p95_s": c.ttft_p95_s, "ttft_p99_s": c.ttft_p99_s,
                "e2e_p50_s": c.e2e_p50_s, "e2e_p95_s": c.e2e_p95_s, "e2e_p99_s": c.e2e_p99_s,
                "requests": c.requests, "ok": c.ok, "errors": c.errors, "cut": c.cut,
                "output_tokens_per_s": c.output_tokens_per_s,
            }),
        );
    }
    json!({
        "classes": classes,
        "output_tokens_per_s": r.output_tokens_per_s,
        "duration_s": r.duration_s,
        "requests": r.requests,
        "errors": r.errors,
        "errors_by_code": r.errors_by_code,
    })
}

/// Runs FIFO then lanes and writes everything under `opts.out`.
/// Runs every preset in turn and writes the reports.
pub async fn run_experiment(opts: &ExperimentOptions) -> anyhow::Result<Value> {
    let mut runs = Vec::new();
    for preset in [
        Preset::Fifo,
        Preset::Strict,
        Preset::Lanes,
        Preset::LanesPriority,
    ] {
        let (r, wait) = run_preset(opts, preset)
            .await
            .with_context(|| format!("{} run", preset.name()))?;
        crate::report::write_all(&opts.out.join(preset.name()), &r, 2.0)?;
        runs.push((preset, r, wait));
        // Let one run's sockets close before the next starts.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let fifo = &runs[0].1;
    let lanes = &runs[2].1;
    let verdict = compare(fifo, lanes, &Rules::default());
    let ratio = |r: &Results| {
        let f = fifo.classes.get("small").and_then(|x| x.ttft_p95_s)?;
        let l = r.classes.get("small").and_then(|x| x.ttft_p95_s)?;
        (l > 0.0).then_some(f / l)
    };
    let mut summary = serde_json::Map::new();
    let mut vs_fifo = serde_json::Map::new();
    for (preset, r, wait) in &runs {
        let mut entry = summary_entry(r);
        entry["small_gateway_queue_wait"] = wait.clone();
        summary.insert(preset.name().to_string(), entry);
        vs_fifo.insert(
            preset.name().to_string(),
            json!({
                "small_p95_ttft_fifo_over_preset": ratio(r),
                "output_tokens_per_s_preset_over_fifo": r.output_tokens_per_s / fifo.output_tokens_per_s.max(1e-9),
            }),
        );
    }
    summary.insert("vs_fifo".into(), Value::Object(vs_fifo));
    summary.insert(
        "setup".into(),
        json!({
            "scenario": opts.scenario.name, "seed": opts.run.seed, "profile": opts.profile,
            "speed": opts.speed, "fifo_max_concurrency": opts.fifo_max_concurrency,
            "duration_s": opts.run.duration.as_secs_f64(),
            "drain_s": opts.run.drain.as_secs_f64(),
            "classes": opts.scenario.classes,
        }),
    );
    summary.insert(
        "m7_regression_lanes_vs_fifo".into(),
        json!(verdict.regression),
    );
    let summary = Value::Object(summary);
    std::fs::write(
        opts.out.join("summary.json"),
        serde_json::to_string_pretty(&summary)?,
    )?;
    let md = format!("# FIFO (A) vs lanes (B)\n\n{}", verdict.text);
    std::fs::write(opts.out.join("comparison.md"), &md)?;
    println!("{md}");
    println!("{}", serde_json::to_string_pretty(&summary["vs_fifo"])?);
    Ok(summary)
}

//! The defining experiment (M16): the same closed-loop load through the real gateway in front of
//! the simulator, first with `policy = "fifo"`, then with `policy = "lanes"`; a fresh simulator
//! for each, same seed, same requests. Writes `fifo/`, `lanes/`, `summary.json`, `comparison.md`.

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
pub async fn run_policy(opts: &ExperimentOptions, policy: Policy) -> anyhow::Result<Results> {
    let mut cfg = Config::load(&opts.config)
        .map_err(|e| anyhow::anyhow!("{}: {e}", opts.config.display()))?;
    cfg.admission.policy = policy;
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
    let sim = tutor_gateway::server::start_sim(&mut cfg, &sim_args).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let gw = tutor_gateway::server::start(cfg, listener)?;
    let target = Target::new(&gw.url(), Api::Answer, None)?;
    let prompts = PromptBuilder::new(vllm_sim::tokenizer::PromptTokenizer::load(
        tokenizer.as_deref(),
    )?);
    eprintln!(
        "== {policy:?}: gateway {} -> simulator {}",
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
    gw.shutdown().await;
    sim.shutdown().await;
    Ok(results)
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
pub async fn run_experiment(opts: &ExperimentOptions) -> anyhow::Result<Value> {
    let fifo = run_policy(opts, Policy::Fifo).await.context("fifo run")?;
    crate::report::write_all(&opts.out.join("fifo"), &fifo, 2.0)?;
    // Let the first run's sockets close before the second starts.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let lanes = run_policy(opts, Policy::Lanes).await.context("lanes run")?;
    crate::report::write_all(&opts.out.join("lanes"), &lanes, 2.0)?;
    let verdict = compare(&fifo, &lanes, &Rules::default());
    let ratio = |c: &str| {
        let f = fifo.classes.get(c).and_then(|x| x.ttft_p95_s)?;
        let l = lanes.classes.get(c).and_then(|x| x.ttft_p95_s)?;
        (l > 0.0).then_some(f / l)
    };
    let summary = json!({
        "fifo": summary_entry(&fifo),
        "lanes": summary_entry(&lanes),
        "setup": {
            "scenario": opts.scenario.name, "seed": opts.run.seed, "profile": opts.profile,
            "speed": opts.speed, "fifo_max_concurrency": opts.fifo_max_concurrency,
            "drain_s": opts.run.drain.as_secs_f64(),
            "classes": opts.scenario.classes,
        },
        "small_p95_ttft_fifo_over_lanes": ratio("small"),
        "output_tokens_per_s_lanes_over_fifo": lanes.output_tokens_per_s / fifo.output_tokens_per_s.max(1e-9),
        "m7_regression": verdict.regression,
    });
    std::fs::write(
        opts.out.join("summary.json"),
        serde_json::to_string_pretty(&summary)?,
    )?;
    let md = format!("# FIFO (A) vs lanes (B)\n\n{}", verdict.text);
    std::fs::write(opts.out.join("comparison.md"), &md)?;
    println!("{md}");
    Ok(summary)
}

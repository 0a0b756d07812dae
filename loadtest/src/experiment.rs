//! The defining experiment (M16, issues 9 and 13): the same closed-loop load through the real
//! gateway in front of the simulator under each admission preset (`floor`: the small clients
//! alone; `fifo`, `strict`, `lanes`, `lanes-priority`), for each engine setting (`--engine seed`,
//! `--engine h100`, per-flag overrides); a fresh simulator for each run, same seed, same requests.
//! Writes `<engine>/<preset>/` folders, `summary.json`, `summary.md`, `comparison.md`
//! (see [`crate::exp_report`]).

use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde_json::{json, Value};
use tutor_gateway::config::{Config, Policy, RequestLogSink};

use crate::client::{Api, Target};
use crate::engine::EngineSetting;
use crate::exp_report::{write_reports, PresetRun};
use crate::floor::{floor_scenario, vs_floor};
pub use crate::preset::Preset;
use crate::prompt::PromptBuilder;
use crate::runner::{run, RunOptions};
use crate::scenario::Scenario;
use crate::stats::Results;
use crate::steps::StepSampler;

/// Settings of one experiment.
#[derive(Debug, Clone)]
pub struct ExperimentOptions {
    /// Gateway config file; its policy (and `upstream.max_model_len`) is overridden per run.
    pub config: PathBuf,
    /// The load (closed loop, e.g. `defining-experiment.toml`).
    pub scenario: Scenario,
    /// Window and drain per run, seed, progress.
    pub run: RunOptions,
    /// Simulator profile (`llama-3.1-8b-h100`).
    pub profile: String,
    /// Simulator speed factor.
    pub speed: f64,
    /// `[admission.fifo] max_concurrency` for the FIFO run; 0 = unlimited.
    pub fifo_max_concurrency: u32,
    /// Engine settings, each run with every preset.
    pub engines: Vec<EngineSetting>,
    /// Admission presets, run in [`Preset::ALL`] order (`floor` first, so the others' reports
    /// can show ratios to it).
    pub presets: Vec<Preset>,
    /// Output folder.
    pub out: PathBuf,
}

/// Gateway-side p50/p95 of the small lane's queue wait, seconds, from `/metrics` (bucket
/// interpolation): TTFT from admission = TTFT from arrival - this wait.
async fn small_queue_wait(gw_url: &str) -> Value {
    let text = match reqwest::get(format!("{gw_url}/metrics")).await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => return Value::Null,
    };
    let h = crate::stats::MetricsHistogram::read(
        &text,
        "tutor_gateway_queue_wait_seconds",
        "lane=\"small\"",
    );
    json!({"p50_s": h.quantile(0.5), "p95_s": h.quantile(0.95), "requests": h.total()})
}

/// What one preset's run measured besides the client's results.
#[derive(Debug, Clone)]
pub struct Inside {
    /// The gateway's small-lane queue wait (see [`small_queue_wait`]).
    pub queue_wait: Value,
    /// The engine's steps during the window (see [`crate::steps`]).
    pub steps: Value,
    /// The gateway's pieces counters at the end of the run (see [`pieces`]).
    pub pieces: Value,
}

/// The gateway's `tutor_gateway_prefill_piec*` counters, from `/metrics`.
async fn pieces(gw_url: &str) -> Value {
    let text = match reqwest::get(format!("{gw_url}/metrics")).await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => return Value::Null,
    };
    let read = |name: &str| {
        text.lines().find_map(|l| {
            l.strip_prefix(name)?
                .strip_prefix(' ')?
                .trim()
                .parse::<f64>()
                .ok()
        })
    };
    json!({
        "pieced_requests": read("tutor_gateway_prefill_pieced_requests_total{outcome=\"pieced\"}"),
        "pieces": read("tutor_gateway_prefill_pieces_total"),
        "recomputed_tokens": read("tutor_gateway_prefill_piece_recomputed_tokens_total"),
        "seconds_sum": read("tutor_gateway_prefill_pieces_seconds_sum"),
    })
}

/// Runs the load under `preset`; returns the client-side results and what the gateway and
/// the engine saw.
pub async fn run_preset(
    opts: &ExperimentOptions,
    engine: &EngineSetting,
    preset: Preset,
) -> anyhow::Result<(Results, Inside)> {
    let mut scenario = if preset == Preset::Floor {
        floor_scenario(&opts.scenario)
    } else {
        opts.scenario.clone()
    };
    scenario.max_model_len = scenario.max_model_len.min(engine.max_model_len);
    let mut cfg = gateway_config(
        &opts.config,
        engine,
        preset,
        opts.fifo_max_concurrency,
        opts.speed,
    )?;
    // The engine counts (and the load sizes its prompts) with the engine's tokenizer when the
    // setting names one, else with the gateway's.
    let tokenizer = engine.counting_tokenizer(config_tokenizer(&cfg));
    let sim_args = sim_args(
        &opts.profile,
        opts.speed,
        opts.run.seed,
        tokenizer.as_deref(),
        engine,
        preset,
    );
    let sim = tutor_gateway::server::start_sim(&mut cfg, &sim_args).await?;
    // The quota in Redis (the server is this run's own); two replicas on it for `lanes-redis`.
    let redis = RedisChild::for_preset(preset, &mut cfg)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let second = match &redis {
        Some(_) if preset == Preset::LanesRedis => {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            Some(tutor_gateway::server::start(cfg.clone(), listener)?)
        }
        _ => None,
    };
    let gw = tutor_gateway::server::start(cfg, listener)?;
    let mut urls = vec![gw.url()];
    urls.extend(second.as_ref().map(|g| g.url()));
    let target = Target::alternating(&urls, Api::Answer, None)?;
    let prompts = PromptBuilder::new(vllm_sim::tokenizer::PromptTokenizer::load(
        tokenizer.as_deref(),
    )?);
    eprintln!(
        "== {} / {}: gateway {} -> simulator {}",
        engine.name,
        preset.name(),
        gw.url(),
        sim.url()
    );
    let sampling = StepSampler::sample(
        &sim.engine,
        (opts.run.warmup, opts.run.duration),
        Duration::from_secs(5),
    );
    let (data, steps) = tokio::join!(run(&scenario, &target, &prompts, &opts.run), sampling);
    let results = Results::build(
        &scenario,
        &target,
        opts.run.seed,
        opts.run.window_s(),
        &data,
    );
    let inside = Inside {
        queue_wait: small_queue_wait(&gw.url()).await,
        steps: steps.summary(),
        pieces: pieces(&gw.url()).await,
    };
    gw.shutdown().await;
    if let Some(g) = second {
        g.shutdown().await;
    }
    drop(redis);
    sim.shutdown().await;
    Ok((results, inside))
}

/// Divides by `speed` every time of `cfg` that is read against the engine's progress, so that
/// at `--speed F` it lasts what the file says in simulated time (the gateway lives in wall-clock
/// time): the queues' timeouts (lanes and FIFO), the upstream's first-token, idle and total
/// timeouts, the promotion's wait, the jobs' divert and pre-emption cool-down times, the lanes'
/// TTFT objectives and the autopilot's times. Left in wall-clock time: what only bounds the
/// network or the infrastructure (connect and header timeouts, health checks, leases, reloads).
/// Without it a queue timeout would last F times longer at `--speed F`, and a run at speed 4
/// would hide refusals a run at speed 1 makes.
pub(crate) fn simulated_times(cfg: &mut Config, speed: f64) {
    let wall = |d: &mut std::time::Duration| *d = d.div_f64(speed);
    let ap = &mut cfg.autopilot;
    for d in [
        &mut ap.interval,
        &mut ap.window,
        &mut ap.hold,
        &mut ap.max_large_wait,
    ] {
        wall(d);
    }
    wall(&mut cfg.admission.fifo.queue.timeout);
    for lane in [
        &mut cfg.lanes.small,
        &mut cfg.lanes.medium,
        &mut cfg.lanes.large,
    ] {
        wall(&mut lane.queue.timeout);
        if let Some(o) = &mut lane.ttft_slo {
            wall(&mut o.target);
        }
    }
    let up = &mut cfg.upstream;
    for d in [
        &mut up.first_token_timeout,
        &mut up.idle_timeout,
        &mut up.total_timeout,
    ] {
        wall(d);
    }
    wall(&mut cfg.promotion.wait);
    wall(&mut cfg.jobs.preempt_cooldown);
    if let Some(d) = &mut cfg.jobs.divert_large_after {
        wall(d);
    }
}

/// Piece size of the `*-pieces` presets when the config file sets none.
const DEFAULT_PIECE_TOKENS: u32 = 1024;

/// The gateway config of one run: the file at `path` (with `upstream.max_model_len` set to the
/// engine's) under `preset`'s admission policy, request log and tracing off, its times read
/// against the engine divided by `speed` ([`simulated_times`]). Under [`Preset::Autopilot`]
/// the autopilot is on.
/// `jobs.preempt` is on under [`Preset::LanesPreempt`], [`Preset::LanesPreemptRedis`],
/// [`Preset::AutopilotPreempt`] and [`Preset::LanesPreemptPieces`] only
/// (off under every other preset, whatever the file says).
pub(crate) fn gateway_config(
    path: &Path,
    engine: &EngineSetting,
    preset: Preset,
    fifo_max_concurrency: u32,
    speed: f64,
) -> anyhow::Result<Config> {
    let policy = match preset {
        Preset::Fifo => Policy::Fifo,
        Preset::Strict => Policy::Strict,
        Preset::Floor
        | Preset::Lanes
        | Preset::LanesPriority
        | Preset::Autopilot
        | Preset::LanesPieces
        | Preset::AutopilotPieces
        | Preset::LanesRedis
        | Preset::LanesPreempt
        | Preset::LanesPreemptRedis
        | Preset::AutopilotPreempt
        | Preset::LanesPreemptPieces => Policy::Lanes,
    };
    let mut cfg = load_config(path, engine.max_model_len)?;
    cfg.autopilot.enabled = preset.piloted();
    cfg.admission.prefill_piece_tokens = match cfg.admission.prefill_piece_tokens {
        _ if !preset.pieced() => 0,
        0 => DEFAULT_PIECE_TOKENS,
        n => n,
    };
    if speed > 0.0 {
        simulated_times(&mut cfg, speed);
    }
    cfg.admission.policy = policy;
    if preset == Preset::Strict {
        // The seed's caps (M16: lanes 32/20/4), whatever the file says.
        for (lane, seats) in [
            (&mut cfg.lanes.small, 32),
            (&mut cfg.lanes.medium, 20),
            (&mut cfg.lanes.large, 4),
        ] {
            lane.max_concurrency = NonZeroU32::new(seats).expect("non-zero");
            lane.ceiling = lane.max_concurrency;
        }
    }
    cfg.jobs.preempt = preset.preempts();
    cfg.admission.engine_priority = preset == Preset::LanesPriority;
    cfg.admission.fifo.max_concurrency = NonZeroU32::new(fifo_max_concurrency);
    cfg.telemetry.request_log = RequestLogSink::Off;
    cfg.telemetry.tracing = false;
    Ok(cfg)
}

/// The tokenizer file the gateway config names, if any (the simulator and the prompts use it too).
pub(crate) fn config_tokenizer(cfg: &Config) -> Option<PathBuf> {
    match &cfg.classify.tokenizer {
        tutor_gateway::config::TokenizerSource::File(p) => Some(p.clone()),
        _ => None,
    }
}

/// The simulator's flags for one run (besides those `start_sim` adds from the gateway config).
pub(crate) fn sim_args(
    profile: &str,
    speed: f64,
    seed: u64,
    tokenizer: Option<&Path>,
    engine: &EngineSetting,
    preset: Preset,
) -> Vec<String> {
    let mut sim_args: Vec<String> = vec![
        "--profile".into(),
        profile.to_string(),
        "--speed".into(),
        speed.to_string(),
        // The gateway's /answer sends no ignore_eos: a huge mean makes every answer run to its
        // max_output_tokens, so output lengths are exact (as with ignore_eos on the chat API),
        // unless the engine setting draws them.
        "--mean-output-tokens".into(),
        engine.mean_output_tokens.unwrap_or(1_000_000).to_string(),
        "--seed".into(),
        seed.to_string(),
    ];
    if let Some(p) = tokenizer {
        sim_args.extend(["--tokenizer".into(), p.display().to_string()]);
    }
    sim_args.extend(engine.sim_flags());
    if preset == Preset::LanesPriority {
        sim_args.extend(["--scheduling-policy".into(), "priority".into()]);
    }
    sim_args
}

/// A `redis-server` on a free loopback port, without persistence, killed on drop.
pub(crate) struct RedisChild {
    port: u16,
    child: std::process::Child,
}

impl RedisChild {
    /// For a preset with its quota in Redis ([`Preset::on_redis`]): a server of the run's own,
    /// `cfg`'s quota moved onto it. `None` for every other preset.
    pub(crate) fn for_preset(preset: Preset, cfg: &mut Config) -> anyhow::Result<Option<Self>> {
        if !preset.on_redis() {
            return Ok(None);
        }
        let server = Self::start()?;
        cfg.quota.backend = tutor_gateway::config::QuotaBackend::Redis;
        cfg.quota.redis_url = tutor_gateway::config::RedisUrl::new(server.url());
        Ok(Some(server))
    }

    fn start() -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("redis-server (the Redis presets need it; scripts/test installs it)")?;
        let server = Self { port, child };
        for _ in 0..500 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(server);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        anyhow::bail!("redis-server did not start on port {port}")
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }
}

impl Drop for RedisChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The gateway config at `path` with `upstream.max_model_len` set to `max_model_len` (checked
/// again as a whole: the lanes' token budgets must still hold the longest request).
pub(crate) fn load_config(path: &Path, max_model_len: u32) -> anyhow::Result<Config> {
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("{}: {e}", path.display());
    let cfg = Config::load(path).map_err(|e| err(&e))?;
    if cfg.upstream.max_model_len.get() == max_model_len {
        return Ok(cfg);
    }
    let text = std::fs::read_to_string(path)?;
    let mut t: toml::Table = text.parse().map_err(|e| err(&e))?;
    let up = t
        .entry("upstream")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    if let Some(up) = up.as_table_mut() {
        up.insert("max_model_len".into(), i64::from(max_model_len).into());
    }
    Config::from_toml_str(&toml::to_string(&t)?)
        .map_err(|e| err(&format!("with --max-model-len {max_model_len}: {e}")))
}

/// Runs every engine setting with every preset in turn and writes the reports.
pub async fn run_experiment(opts: &ExperimentOptions) -> anyhow::Result<Value> {
    let mut presets = opts.presets.clone();
    presets.sort();
    presets.dedup();
    let mut by_engine = vec![];
    for engine in &opts.engines {
        let mut runs: Vec<PresetRun> = vec![];
        for &preset in &presets {
            let (mut r, inside) = run_preset(opts, engine, preset)
                .await
                .with_context(|| format!("{} / {} run", engine.name, preset.name()))?;
            let floor = runs.iter().find(|x| x.preset == Preset::Floor);
            r.vs_floor = match floor {
                Some(f) => Some(vs_floor(&f.results, &r)),
                None if preset == Preset::Floor => Some(vs_floor(&r, &r)),
                None => None,
            };
            let dir = opts.out.join(&engine.name).join(preset.name());
            crate::report::write_all(&dir, &r, 2.0)?;
            runs.push(PresetRun {
                preset,
                results: r,
                queue_wait: inside.queue_wait,
                steps: inside.steps,
                pieces: inside.pieces,
            });
            // Let one run's sockets close before the next starts.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        by_engine.push((engine.clone(), runs));
    }
    let setup = json!({
        "scenario": opts.scenario.name, "seed": opts.run.seed, "profile": opts.profile,
        "speed": opts.speed, "fifo_max_concurrency": opts.fifo_max_concurrency,
        "warmup_s": opts.run.warmup.as_secs_f64(),
        "duration_s": opts.run.duration.as_secs_f64(),
        "drain_s": opts.run.drain.as_secs_f64(),
        "max_model_len": opts.scenario.max_model_len,
        "load": opts.scenario.load,
        "classes": opts.scenario.classes,
        "engines": opts.engines,
        "presets": presets.iter().map(|p| p.name()).collect::<Vec<_>>(),
    });
    write_reports(&opts.out, setup, &by_engine)
}

#[cfg(test)]
mod tests {
    use super::*;

    use clap::Parser as _;

    /// The engine's own tokenizer and answer lengths reach the simulator and name the setting;
    /// without them every answer runs to its asked length.
    #[test]
    fn the_engines_tokenizer_and_answer_lengths_reach_the_simulator() {
        let sim = |e: &crate::engine::EngineSetting, gateway_tok: Option<&std::path::Path>| {
            let mut argv = vec!["vllm-sim".to_string()];
            let tok = e.counting_tokenizer(gateway_tok.map(std::path::Path::to_path_buf));
            argv.extend(sim_args(
                "tiny-test",
                1.0,
                1,
                tok.as_deref(),
                e,
                Preset::Lanes,
            ));
            vllm_sim::SimArgs::try_parse_from(argv).expect("the simulator accepts the flags")
        };
        let d =
            crate::engine::expand(&["seed".into()], &crate::engine::Overrides::default()).unwrap();
        let a = sim(&d[0], None);
        assert_eq!((a.mean_output_tokens, a.tokenizer), (1_000_000, None));
        let o = crate::engine::Overrides {
            tokenizer: Some("engine/tokenizer.json".into()),
            mean_output_tokens: Some(300),
            ..Default::default()
        };
        let v = crate::engine::expand(&["seed".into()], &o).unwrap();
        assert_eq!(v[0].name, "seed-tok-eos300");
        let a = sim(&v[0], Some(std::path::Path::new("gateway/tokenizer.json")));
        assert_eq!(a.mean_output_tokens, 300);
        assert_eq!(
            a.tokenizer.as_deref(),
            Some(std::path::Path::new("engine/tokenizer.json"))
        );
        let zero = crate::engine::Overrides {
            mean_output_tokens: Some(0),
            ..Default::default()
        };
        assert!(crate::engine::expand(&["seed".into()], &zero).is_err());
    }

    #[test]
    fn strict_runs_the_seeds_caps_whatever_the_file_says() {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/config.toml");
        let engine = EngineSetting::preset("seed").unwrap();
        let shipped = load_config(&file, engine.max_model_len).unwrap();
        assert_ne!(
            shipped.lanes.large.max_concurrency.get(),
            4,
            "the file's own"
        );
        let strict = gateway_config(&file, &engine, Preset::Strict, 0, 2.0).unwrap();
        assert_eq!(strict.admission.policy, Policy::Strict);
        let seats = |c: &Config| {
            [&c.lanes.small, &c.lanes.medium, &c.lanes.large].map(|l| l.max_concurrency.get())
        };
        assert_eq!(seats(&strict), [32, 20, 4]);
        let lanes = gateway_config(&file, &engine, Preset::Lanes, 0, 2.0).unwrap();
        assert_eq!(
            seats(&lanes),
            seats(&shipped),
            "other presets keep the file's"
        );
    }

    #[test]
    fn each_preset_turns_the_autopilot_and_preemption_on_as_its_name_says() {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/config.toml");
        let engine = EngineSetting::preset("seed").unwrap();
        for preset in Preset::ALL {
            let cfg = gateway_config(&file, &engine, preset, 0, 2.0).unwrap();
            assert_eq!(cfg.autopilot.enabled, preset.piloted(), "{}", preset.name());
            assert_eq!(cfg.jobs.preempt, preset.preempts(), "{}", preset.name());
        }
        let both = gateway_config(&file, &engine, Preset::AutopilotPreempt, 0, 2.0).unwrap();
        assert!(both.autopilot.enabled && both.jobs.preempt);
        assert_eq!(both.admission.policy, Policy::Lanes);
        let pieced = gateway_config(&file, &engine, Preset::LanesPreemptPieces, 0, 2.0).unwrap();
        assert!(pieced.jobs.preempt && !pieced.autopilot.enabled);
        assert_eq!(pieced.admission.prefill_piece_tokens, DEFAULT_PIECE_TOKENS);
        // Simulated times over the speed, as every piloted preset.
        let shipped = load_config(&file, engine.max_model_len).unwrap();
        assert_eq!(both.autopilot.window, shipped.autopilot.window.div_f64(2.0));
        assert_eq!(
            both.jobs.preempt_cooldown,
            shipped.jobs.preempt_cooldown.div_f64(2.0)
        );
    }

    /// Every time read against the engine's progress lasts, at `--speed F`, what the file says
    /// in simulated time, whatever the preset: a 60 s queue timeout is 15 s of wall clock at
    /// speed 4, so a run at speed 4 refuses what a run at speed 1 refuses. Times that bound
    /// only the network stay as written.
    #[test]
    fn times_read_against_the_engine_are_simulated_under_every_preset() {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/config.toml");
        let engine = EngineSetting::preset("seed").unwrap();
        let was = load_config(&file, engine.max_model_len).unwrap();
        let quarter = |d: std::time::Duration| d.div_f64(4.0);
        for preset in [Preset::Fifo, Preset::Lanes, Preset::Autopilot] {
            let now = gateway_config(&file, &engine, preset, 0, 4.0).unwrap();
            for (what, before, after) in [
                (
                    "fifo queue",
                    was.admission.fifo.queue.timeout,
                    now.admission.fifo.queue.timeout,
                ),
                (
                    "small queue",
                    was.lanes.small.queue.timeout,
                    now.lanes.small.queue.timeout,
                ),
                (
                    "medium queue",
                    was.lanes.medium.queue.timeout,
                    now.lanes.medium.queue.timeout,
                ),
                (
                    "large queue",
                    was.lanes.large.queue.timeout,
                    now.lanes.large.queue.timeout,
                ),
                (
                    "first token",
                    was.upstream.first_token_timeout,
                    now.upstream.first_token_timeout,
                ),
                ("idle", was.upstream.idle_timeout, now.upstream.idle_timeout),
                (
                    "total",
                    was.upstream.total_timeout,
                    now.upstream.total_timeout,
                ),
                ("promotion wait", was.promotion.wait, now.promotion.wait),
                (
                    "cool-down",
                    was.jobs.preempt_cooldown,
                    now.jobs.preempt_cooldown,
                ),
                (
                    "autopilot window",
                    was.autopilot.window,
                    now.autopilot.window,
                ),
            ] {
                assert_eq!(after, quarter(before), "{what} under {}", preset.name());
            }
            let (connect, head) = (now.upstream.connect_timeout, now.server.header_read_timeout);
            assert_eq!(
                connect, was.upstream.connect_timeout,
                "network bound as written"
            );
            assert_eq!(
                head, was.server.header_read_timeout,
                "network bound as written"
            );
        }
        let mut diverting = was.clone();
        diverting.jobs.divert_large_after = Some(std::time::Duration::from_secs(8));
        simulated_times(&mut diverting, 4.0);
        let divert = diverting.jobs.divert_large_after;
        assert_eq!(divert, Some(std::time::Duration::from_secs(2)));
    }
}

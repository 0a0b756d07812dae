//! `tutor-load`: run a scenario, compare two runs, sweep engine flags, run the FIFO-vs-lanes
//! experiment. See `loadtest/README.md`.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tutor_load::client::{Api, Target};
use tutor_load::compare::{compare, Rules};
use tutor_load::engine::Overrides;
use tutor_load::experiment::Preset;
use tutor_load::prompt::PromptBuilder;
use tutor_load::runner::RunOptions;
use tutor_load::scenario::parse_duration;
use tutor_load::scenario::Scenario;
use tutor_load::stats::Results;
use vllm_sim::tokenizer::PromptTokenizer;

#[derive(Parser)]
#[command(name = "tutor-load", about = "Load tests for tutor-gateway and vLLM")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args, Clone)]
struct Common {
    /// Scenario file.
    #[arg(long)]
    scenario: PathBuf,
    /// Time during which requests are sent (e.g. 15m, 90s).
    #[arg(long, default_value = "15m", value_parser = parse_duration)]
    duration: Duration,
    /// Time before the window whose requests are sent but not measured (e.g. 30s, 0s);
    /// default: closed loop, a tenth of --duration and at least its ramp; open loop, none (a
    /// scenario's waves keep their times).
    #[arg(long, value_parser = parse_duration)]
    warmup: Option<Duration>,
    /// Extra time in-flight requests get after the window; then they are cut.
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    drain: Duration,
    /// Seed (default: the scenario's).
    #[arg(long)]
    seed: Option<u64>,
    /// Multiply every closed-loop class's concurrency (CI uses small values).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Seconds between progress lines on stderr (0: none).
    #[arg(long, default_value_t = 5)]
    progress: u64,
    /// A HuggingFace tokenizer.json to size prompts with (default: the simulator's heuristic).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Output folder.
    #[arg(long, default_value = "loadtest-out")]
    out: PathBuf,
}

impl Common {
    fn load(&self) -> anyhow::Result<(Scenario, RunOptions, PromptBuilder)> {
        let mut s = Scenario::load(&self.scenario)?;
        s.scale_concurrency(self.scale);
        let warmup = self
            .warmup
            .unwrap_or_else(|| default_warmup(&s, self.duration));
        let run = RunOptions {
            warmup,
            duration: self.duration,
            drain: self.drain,
            seed: self.seed.unwrap_or(s.seed),
            progress_every_s: self.progress,
        };
        let p = PromptBuilder::new(PromptTokenizer::load(self.tokenizer.as_deref())?);
        Ok((s, run, p))
    }
}

/// Closed loop: a tenth of the window, at least its ramp (every client started). Open loop:
/// none, so a scenario's waves are measured at the times it states.
fn default_warmup(s: &Scenario, duration: Duration) -> Duration {
    match s.load {
        tutor_load::scenario::Load::Closed { ramp_s, .. } => {
            (duration / 10).max(Duration::from_secs_f64(ramp_s))
        }
        tutor_load::scenario::Load::Open { .. } => Duration::ZERO,
    }
}

// Parsed once per process: the size of its largest variant costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Cmd {
    /// Run a scenario against a target; writes results.json, summary.md and SVG charts.
    Run {
        #[command(flatten)]
        common: Common,
        /// Base URL of the gateway, vLLM or the simulator. Repeat it for several gateway
        /// replicas: requests go to each in turn.
        #[arg(long, required = true)]
        target: Vec<String>,
        /// Poll every target's `/readyz` this often, milliseconds, and send only to those that
        /// answered 200 (a load balancer's health check; 0: send to all).
        #[arg(long, default_value_t = 0)]
        ready_poll_ms: u64,
        /// `answer` (gateway /answer) or `chat` (/v1/chat/completions).
        #[arg(long, value_enum, default_value = "answer")]
        api: Api,
        /// `model` on the chat API.
        #[arg(long)]
        model: Option<String>,
        /// Send every request with `Authorization: Bearer <key>` (a gateway with `[auth]` on;
        /// the key's tenant is who the load is sent as). Also read from `TUTOR_LOAD_API_KEY`.
        #[arg(long, env = "TUTOR_LOAD_API_KEY", hide_env_values = true)]
        api_key: Option<String>,
        /// Salt of the prompt text (decimal or 0x hex), to send a earlier run's text again
        /// (its summary.md prints the flag). Default: a fresh salt per run (clock and process
        /// id), so the seed fixes the sizes and arrivals but not the text, and a second run
        /// is not served from the first one's prefix cache.
        #[arg(long, value_parser = parse_salt, conflicts_with = "replay")]
        salt: Option<u64>,
        /// Send the seed's own text, unsalted, the same on every run (a long-lived engine
        /// serves a repeat from its prefix cache).
        #[arg(long)]
        replay: bool,
    },
    /// Compare baseline A with candidate B; exit code 2 on an M7 regression, 3 on an SLO miss
    /// with --fail-on-slo, 4 when the runs' prefix-cache hit ratios differ too much.
    Compare {
        /// Baseline results.json.
        a: PathBuf,
        /// Candidate results.json.
        b: PathBuf,
        /// p95 TTFT SLO per class, CLASS=SECONDS (repeatable; default small=2).
        #[arg(long = "slo")]
        slo: Vec<String>,
        /// Classes the M7 rule watches (repeatable; default small).
        #[arg(long = "interactive")]
        interactive: Vec<String>,
        /// Also exit 3 when B misses an SLO.
        #[arg(long)]
        fail_on_slo: bool,
        /// Largest difference between the runs' cached-token ratios (prompt tokens served
        /// from the prefix cache / prompt tokens, 0..1) that still compares like with like;
        /// beyond it `compare` refuses (exit 4).
        #[arg(long, default_value_t = tutor_load::compare::MAX_CACHED_RATIO_GAP)]
        max_cached_ratio_gap: f64,
        /// Compare anyway when the cached-token ratios differ more, with a warning.
        #[arg(long)]
        allow_cache_mismatch: bool,
    },
    /// Sweep --max-num-seqs x --max-num-batched-tokens by restarting the engine per cell.
    Matrix {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        sweep: tutor_load::matrix::Sweep,
    },
    /// FIFO vs lanes through the in-process gateway and simulator (M16).
    Experiment {
        #[command(flatten)]
        common: Common,
        /// Gateway config (policy overridden per run).
        #[arg(long, default_value = "config/config.toml")]
        config: PathBuf,
        /// Simulator profile.
        #[arg(long, default_value = "llama-3.1-8b-h100")]
        profile: String,
        /// Simulator speed.
        #[arg(long, default_value_t = 1.0)]
        speed: f64,
        /// FIFO concurrency limit (0 = unlimited).
        #[arg(long, default_value_t = 0)]
        fifo_max_concurrency: u32,
        /// Admission presets to run (comma-separated; `floor` runs first, the others are read
        /// against it). Default: floor,fifo,strict,lanes,lanes-priority (closed loop);
        /// floor,fifo,lanes (--arrivals poisson).
        #[arg(long, value_enum, value_delimiter = ',')]
        presets: Vec<Preset>,
        /// `closed`: the scenario's closed loop for --duration. `poisson`: open loop, the
        /// scenario's mix arriving at --load fractions of FIFO's measured capacity (times its
        /// `waves`, if any; its backlog classes' jobs submitted at the start, but not for
        /// `floor`).
        #[arg(long, value_enum, default_value = "closed")]
        arrivals: Arrivals,
        /// Poisson: offered loads, fractions of the capacity (comma-separated).
        #[arg(
            long = "load",
            value_delimiter = ',',
            default_value = "0.5,0.7,0.9,1.1"
        )]
        loads: Vec<f64>,
        /// Poisson: seeds, one run per preset each (default: --seed, else the scenario's).
        #[arg(long, value_delimiter = ',')]
        seeds: Vec<u64>,
        /// Poisson: simulated seconds of arrivals before the window (not counted).
        #[arg(long, default_value_t = 60.0)]
        warmup_s: f64,
        /// Poisson: simulated seconds of counted arrivals after the warm-up.
        #[arg(long, default_value_t = 120.0)]
        window_s: f64,
        /// Poisson: requests per simulated second at load 1.0 (skips measuring the capacity).
        #[arg(long)]
        capacity: Option<f64>,
        /// Poisson: closed-loop clients of the capacity measurement (0: 1.5 x --max-num-seqs,
        /// in 8..=512).
        #[arg(long, default_value_t = 0)]
        capacity_clients: u32,
        /// Poisson: simulated seconds before the capacity measurement's window.
        #[arg(long, default_value_t = 30.0)]
        capacity_warmup_s: f64,
        /// Poisson: simulated seconds of the capacity measurement's window.
        #[arg(long, default_value_t = 60.0)]
        capacity_window_s: f64,
        /// Poisson: a step change in the mix at this simulated second (from the run's start):
        /// the arrivals of --step-class are multiplied by --step-factor from then on.
        #[arg(long)]
        step_at_s: Option<f64>,
        /// Poisson: the class the step change multiplies.
        #[arg(long, default_value = "large")]
        step_class: String,
        /// Poisson: the step change's factor (> 1: more of that class).
        #[arg(long, default_value_t = 2.0)]
        step_factor: f64,
        /// Named engine settings (comma-separated or repeated): `seed` (--max-num-seqs 96
        /// --max-num-batched-tokens 12288), `h100` (vLLM's defaults: 1024 / 8192); both
        /// --max-model-len 16384. Default: h100.
        #[arg(long = "engine", value_delimiter = ',')]
        engines: Vec<String>,
        /// Replace the presets' --max-num-seqs (several values: one setting each).
        #[arg(long, value_delimiter = ',')]
        max_num_seqs: Vec<u32>,
        /// Replace the presets' --max-num-batched-tokens.
        #[arg(long, value_delimiter = ',')]
        max_num_batched_tokens: Vec<u32>,
        /// Replace the presets' --long-prefill-token-threshold (0: none).
        #[arg(long, value_delimiter = ',')]
        long_prefill_token_threshold: Vec<u32>,
        /// Replace the presets' --max-model-len (also the gateway's upstream.max_model_len and
        /// the cap on drawn sizes).
        #[arg(long, value_delimiter = ',')]
        max_model_len: Vec<u32>,
        /// Run the simulator with vLLM's --kv-offloading-size (GiB of CPU memory for KV blocks,
        /// loaded back instead of recomputed; 0: none). Setting names get `-offloadN`.
        #[arg(long, value_delimiter = ',')]
        kv_offloading_size: Vec<u32>,
        /// Run the simulator with --no-async-scheduling (every step planned after the previous
        /// one ended; vLLM 0.33 plans one step ahead by default). Setting names get `-sync`.
        #[arg(long)]
        no_async_scheduling: bool,
        /// The simulator counts prompts with this tokenizer.json (and the load sizes its
        /// prompts with it), while the gateway estimates with its config's (e.g. its heuristic),
        /// as in front of a real vLLM. Setting names get `-tok`.
        #[arg(long)]
        engine_tokenizer: Option<PathBuf>,
        /// Answers end at EOS after an exponential draw of this mean (capped by what each
        /// request asked for) instead of running to the length asked. Names get `-eosN`.
        #[arg(long)]
        engine_mean_output_tokens: Option<u32>,
    },
}

/// How the experiment's requests arrive.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Arrivals {
    /// The scenario's closed loop.
    Closed,
    /// Poisson arrivals at fractions of the capacity.
    Poisson,
}

fn parse_salt(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("bad salt {s:?} (decimal or 0x hex, 64 bits)"))
}

fn rules(slo: &[String], interactive: &[String]) -> anyhow::Result<Rules> {
    let mut r = Rules::default();
    if !slo.is_empty() {
        r.slo_p95_ttft_s = BTreeMap::new();
        for s in slo {
            let (k, v) = s.split_once('=').context("--slo CLASS=SECONDS")?;
            r.slo_p95_ttft_s.insert(k.to_string(), v.parse()?);
        }
    }
    if !interactive.is_empty() {
        r.interactive = interactive.to_vec();
    }
    Ok(r)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Run {
            common,
            target,
            ready_poll_ms,
            api,
            model,
            api_key,
            salt,
            replay,
        } => {
            let (scenario, run, prompts) = common.load()?;
            scenario.refuse_backlog("`tutor-load run`")?;
            let salt = (!replay).then(|| salt.unwrap_or_else(tutor_load::prompt::fresh_salt));
            let prompts = prompts.salted(salt);
            let mut target = Target::alternating(&target, api, model)?;
            if let Some(key) = api_key {
                target = target.with_api_key(&key)?;
            }
            let watch = (ready_poll_ms > 0)
                .then(|| target.watch_ready(Duration::from_millis(ready_poll_ms)));
            let data = tutor_load::runner::run(&scenario, &target, &prompts, &run).await;
            if let Some(w) = watch {
                w.abort();
            }
            let mut r = Results::build(&scenario, &target, run.seed, run.window_s(), &data);
            r.salt = salt;
            tutor_load::report::write_all(&common.out, &r, 2.0)?;
            print!("{}", tutor_load::report::summary_md(&r));
            eprintln!("wrote {}", common.out.display());
        }
        Cmd::Compare {
            a,
            b,
            slo,
            interactive,
            fail_on_slo,
            max_cached_ratio_gap,
            allow_cache_mismatch,
        } => {
            let rules = Rules {
                max_cached_ratio_gap,
                allow_cache_mismatch,
                ..rules(&slo, &interactive)?
            };
            let v = compare(&Results::load(&a)?, &Results::load(&b)?, &rules);
            if v.refused {
                eprint!("{}", v.text);
                std::process::exit(4);
            }
            if let Some(why) = &v.cache_mismatch {
                eprintln!("WARNING: cache mismatch, compared anyway: {why}");
            }
            print!("{}", v.text);
            if v.regression {
                std::process::exit(2);
            }
            if fail_on_slo && v.slo_misses.iter().any(|m| m.0 == "B") {
                std::process::exit(3);
            }
        }
        Cmd::Matrix { common, sweep } => {
            let (scenario, run, prompts) = common.load()?;
            scenario.refuse_backlog("`tutor-load matrix`")?;
            let opts = tutor_load::matrix::MatrixOptions {
                sweep,
                scenario,
                run,
                out: common.out.clone(),
            };
            std::fs::create_dir_all(&opts.out)?;
            let (_, table) = tutor_load::matrix::run_matrix(&opts, &prompts).await?;
            print!("{table}");
        }
        Cmd::Experiment {
            common,
            config,
            profile,
            speed,
            fifo_max_concurrency,
            presets,
            engines,
            max_num_seqs,
            max_num_batched_tokens,
            long_prefill_token_threshold,
            max_model_len,
            kv_offloading_size,
            no_async_scheduling,
            engine_tokenizer,
            engine_mean_output_tokens,
            arrivals,
            loads,
            seeds,
            warmup_s,
            window_s,
            capacity,
            capacity_clients,
            capacity_warmup_s,
            capacity_window_s,
            step_at_s,
            step_class,
            step_factor,
        } => {
            let (scenario, run, _) = common.load()?;
            let overrides = Overrides {
                max_num_seqs,
                max_num_batched_tokens,
                long_prefill_token_threshold,
                max_model_len,
                kv_offloading_size,
                no_async_scheduling,
                tokenizer: engine_tokenizer,
                mean_output_tokens: engine_mean_output_tokens,
            };
            if arrivals == Arrivals::Poisson {
                anyhow::ensure!(
                    common.warmup.is_none(),
                    "--warmup is the closed loop's (wall clock); with --arrivals poisson the \
                     warm-up is --warmup-s (simulated seconds)"
                );
                let presets = if presets.is_empty() {
                    vec![Preset::Floor, Preset::Fifo, Preset::Lanes]
                } else {
                    presets
                };
                let opts = tutor_load::openloop::OpenLoopOptions {
                    stack: tutor_load::openloop::stack::StackSpec {
                        config,
                        profile,
                        speed,
                        fifo_max_concurrency,
                    },
                    scenario,
                    engines: tutor_load::engine::expand(&engines, &overrides)?,
                    presets,
                    loads,
                    seeds: if seeds.is_empty() {
                        vec![run.seed]
                    } else {
                        seeds
                    },
                    window: tutor_load::openloop::drive::Window {
                        speed,
                        warmup_s,
                        window_s,
                        drain_s: common.drain.as_secs_f64(),
                    },
                    capacity,
                    capacity_run: tutor_load::openloop::capacity::CapacityOptions {
                        clients: capacity_clients,
                        warmup_s: capacity_warmup_s,
                        window_s: capacity_window_s,
                    },
                    step: step_at_s.map(|at_s| tutor_load::arrivals::MixStep {
                        at_s,
                        class: step_class,
                        factor: step_factor,
                    }),
                    out: common.out.clone(),
                };
                tutor_load::openloop::run_open_loop(&opts).await?;
                print!(
                    "{}",
                    std::fs::read_to_string(opts.out.join("summary.md")).unwrap_or_default()
                );
                return Ok(());
            }
            scenario.refuse_backlog("the closed-loop experiment")?;
            let presets = if presets.is_empty() {
                vec![
                    Preset::Floor,
                    Preset::Fifo,
                    Preset::Strict,
                    Preset::Lanes,
                    Preset::LanesPriority,
                ]
            } else {
                presets
            };
            let opts = tutor_load::experiment::ExperimentOptions {
                config,
                scenario,
                run,
                profile,
                speed,
                fifo_max_concurrency,
                engines: tutor_load::engine::expand(&engines, &overrides)?,
                presets,
                out: common.out.clone(),
            };
            std::fs::create_dir_all(&opts.out)?;
            tutor_load::experiment::run_experiment(&opts).await?;
        }
    }
    Ok(())
}

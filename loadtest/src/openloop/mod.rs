//! The open-loop experiment (issue 30, item 3): `tutor-load experiment --arrivals poisson`.
//!
//! Questions and reviews arrive (Poisson) at rates set as fractions (`--load`) of FIFO's
//! measured capacity for the mix ([`capacity`]); for each load, seed and preset (`floor`: the
//! same question arrivals alone, [`arrivals::only`]; `fifo`; `lanes`) a fresh simulator and
//! gateway ([`stack`]) get the same arrival sequence ([`arrivals::mixed`]) on the simulated
//! clock ([`drive`]); only requests arriving in the window after the warm-up count. Each run's
//! figures ([`figures`]) include the engine bound ([`bound`]) of its questions; reports in
//! [`report`].
//!
//! The scenario's `[load] waves` make the rate rise and fall (load x capacity x the wave's
//! fraction, [`arrivals::Stream`]). A class with `backlog = N` (`api = "jobs"`, issue 35) is
//! not an arrival class: every preset but `floor` gets its N jobs submitted at the start and
//! followed to the window's end ([`backlog`]); `jobs.md` compares `floor` (no jobs), `lanes`
//! (`jobs.preempt` off) and `lanes-preempt` (on) ([`jobs_report`]).

pub mod backlog;
pub mod bound;
pub mod capacity;
pub mod drive;
pub mod figures;
pub mod jobs_report;
pub mod report;
pub mod stack;
pub mod unbounded;
pub mod window;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::{json, Value};

use crate::arrivals;
use crate::engine::EngineSetting;
use crate::floor::FLOOR_CLASS;
use crate::preset::Preset;
use crate::scenario::Scenario;
use capacity::{Capacity, CapacityOptions};
use drive::Window;
use figures::Measured;
use stack::{Stack, StackSpec};

/// Settings of one open-loop experiment.
#[derive(Debug, Clone)]
pub struct OpenLoopOptions {
    /// Simulator and gateway settings shared by every run.
    pub stack: StackSpec,
    /// The mix: classes with `share`s (`[load]` is ignored: rates come from `loads`).
    pub scenario: Scenario,
    /// Engine settings, each with its own capacity.
    pub engines: Vec<EngineSetting>,
    /// Presets (run floor first, then fifo, then the rest).
    pub presets: Vec<Preset>,
    /// Offered loads, fractions of the capacity.
    pub loads: Vec<f64>,
    /// Seeds of the arrival sequence, sizes and prompts (one run per preset each).
    pub seeds: Vec<u64>,
    /// Warm-up, window, drain (simulated seconds) and the speed factor.
    pub window: Window,
    /// Requests per simulated second at load 1.0; `None`: measured per engine setting.
    pub capacity: Option<f64>,
    /// How the capacity is measured.
    pub capacity_run: CapacityOptions,
    /// A step change in the mix (`--step-at-s`), if any.
    pub step: Option<arrivals::MixStep>,
    /// Output folder.
    pub out: PathBuf,
}

impl OpenLoopOptions {
    fn check(&self) -> anyhow::Result<()> {
        if !self.scenario.classes.iter().any(|c| c.name == FLOOR_CLASS) {
            bail!("the open-loop experiment needs a class named {FLOOR_CLASS:?} (the questions)");
        }
        if self.scenario.total_share() <= 0.0 {
            bail!("the scenario's classes need shares (the mix) for Poisson arrivals");
        }
        if self.loads.is_empty() || self.loads.iter().any(|l| !(*l > 0.0 && l.is_finite())) {
            bail!("--load: one or more fractions of the capacity, each > 0");
        }
        if self.seeds.is_empty() {
            bail!("--seeds: at least one seed");
        }
        let w = &self.window;
        if !(w.speed > 0.0 && w.window_s > 0.0 && w.warmup_s >= 0.0 && w.drain_s >= 0.0) {
            bail!("--speed and --window-s must be > 0, --warmup-s and --drain >= 0");
        }
        if let Some(c) = self.capacity {
            if !(c > 0.0 && c.is_finite()) {
                bail!("--capacity must be > 0 requests/s");
            }
        }
        if let Some(step) = &self.step {
            if !self.scenario.classes.iter().any(|c| c.name == step.class) {
                bail!(
                    "--step-class {:?}: no such class in the scenario",
                    step.class
                );
            }
            if !(step.at_s >= 0.0 && step.factor > 0.0 && step.factor.is_finite()) {
                bail!("--step-at-s must be >= 0 and --step-factor > 0");
            }
        }
        if self.presets.contains(&Preset::LanesRedis) {
            bail!("--arrivals poisson runs every preset but lanes-redis (two replicas)");
        }
        Ok(())
    }
}

/// Runs one preset on one arrival sequence.
async fn one_run(
    opts: &OpenLoopOptions,
    engine: &EngineSetting,
    scenario: &Scenario,
    preset: Preset,
    arrivals: &[arrivals::Arrival],
    (load, seed, rate): (f64, u64, f64),
) -> anyhow::Result<Measured> {
    let stack = Stack::start(&opts.stack, engine, preset, seed).await?;
    let points = std::sync::Arc::new(std::sync::Mutex::new(vec![]));
    let tracer = preset.piloted().then(|| {
        tokio::spawn(trace(
            stack.gateway.url(),
            opts.window.speed,
            points.clone(),
        ))
    });
    let backlog =
        (preset != Preset::Floor && !scenario.backlogs().is_empty()).then(|| backlog::Backlog {
            scenario: scenario.clone(),
            seed,
            target: stack.target.clone(),
            prompts: stack.prompts.clone(),
            speed: opts.window.speed,
            engine: Some(stack.sim.engine.clone()),
        });
    let driven = drive::drive(arrivals, scenario, seed, &stack, &opts.window, backlog).await;
    if let Some(t) = tracer {
        t.abort();
        let _ = t.await;
    }
    let metrics_text = reqwest::get(format!("{}/metrics", stack.gateway.url()))
        .await
        .ok();
    let metrics_text = match metrics_text {
        Some(r) => r.text().await.unwrap_or_default(),
        None => String::new(),
    };
    let counters = counters_of(&metrics_text);
    let run_name = format!("{}-load{load}-{}-seed{seed}", engine.name, preset.name());
    {
        // Every run's metrics at its end are kept: what the summary leaves out (queue waits,
        // the engine's own counters) can be read there afterwards.
        save(
            &opts.out.join("metrics").join(format!("{run_name}.prom")),
            &metrics_text,
        )?;
    }
    let objective = crate::experiment::load_config(&opts.stack.config, engine.max_model_len)?
        .lanes
        .small
        .ttft_slo
        .map(|o| o.target.as_secs_f64());
    stack.stop().await;
    let mut m = figures::measure(
        &driven,
        scenario,
        &opts.window,
        preset.name(),
        load,
        seed,
        rate,
    );
    let read = |name: &str| counters.get(name).copied().unwrap_or(0.0) as u64;
    m.figures.pieces = read("tutor_gateway_prefill_pieces_total");
    m.figures.piece_recomputed_tokens = read("tutor_gateway_prefill_piece_recomputed_tokens_total");
    let review_prompts = review_prompt_tokens(&driven, scenario, &opts.window);
    m.figures.piece_recomputed_share = (m.figures.pieces > 0 && review_prompts > 0)
        .then(|| m.figures.piece_recomputed_tokens as f64 / review_prompts as f64);
    if preset != Preset::Floor && !scenario.backlogs().is_empty() {
        let step = backlog::step_p50_s(&driven.steps, opts.window.speed);
        let followed = &driven.backlog;
        m.figures.jobs = Some(backlog::figures(
            &followed.jobs,
            &followed.metrics,
            followed.engine_recomputed_tokens,
            &opts.window,
            step,
        ));
        save(
            &opts.out.join("jobs").join(format!("{run_name}.json")),
            &serde_json::to_string_pretty(&followed.jobs)?,
        )?;
        save(
            &opts
                .out
                .join("metrics")
                .join(format!("{run_name}.window-end.prom")),
            &followed.metrics,
        )?;
    }
    m.figures.total_tokens_per_s =
        m.figures.tokens_per_s + m.figures.jobs.as_ref().map_or(0.0, |j| j.tokens_per_s);
    m.figures.small_within_objective =
        objective.and_then(|limit| figures::share_within(&m.times, FLOOR_CLASS, limit, |t| t.1));
    for lane in ["small", "medium", "large"] {
        for line in ["seat", "prefill"] {
            let ratio = crate::stats::MetricsHistogram::read(
                &metrics_text,
                "tutor_gateway_wait_prediction_ratio",
                &format!("lane=\"{lane}\",line=\"{line}\""),
            );
            let key = format!("{lane}-{line}");
            if ratio.total() > 0.0 {
                m.figures
                    .wait_predictions
                    .insert(key.clone(), ratio.total() as u64);
                if let Some(p) = ratio.quantile(0.5) {
                    m.figures.wait_prediction_ratio_p50.insert(key.clone(), p);
                }
            }
            let refusals = crate::stats::MetricsHistogram::read(
                &metrics_text,
                "tutor_gateway_refusal_wait_ratio",
                &format!("lane=\"{lane}\",line=\"{line}\""),
            );
            if refusals.total() > 0.0 {
                m.figures
                    .refusal_ghosts
                    .insert(key.clone(), refusals.total() as u64);
                if let Some(p) = refusals.quantile(0.5) {
                    m.figures.refusal_wait_ratio_p50.insert(key, p);
                }
            }
        }
    }
    if preset.piloted() {
        m.figures.autopilot_piece_tokens_end =
            Some(read("tutor_gateway_autopilot_piece_tokens") as u32);
        m.figures.autopilot_trace = std::mem::take(
            &mut *points
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
    }
    let f = &m.figures;
    if let Some(j) = &f.jobs {
        eprintln!(
            "   {} seed {seed}: jobs done in the window {} ({:.0}/h), unfinished {}, failed {}; \
             pre-emptions {}, recomputed tokens {}",
            preset.name(),
            j.done_in_window,
            j.jobs_per_hour,
            j.unfinished,
            j.failed,
            j.preemptions,
            j.recomputed_tokens
        );
    }
    eprintln!(
        "   {} load {load} seed {seed}: offered {} completed {} refused {} diverted {} failed {}; \
         small TTFT p95 {:?} s; steps {} (lost {})",
        preset.name(),
        f.offered,
        f.completed,
        f.refused,
        f.diverted,
        f.failed,
        f.classes.get(FLOOR_CLASS).and_then(|c| c.ttft_p95_s),
        f.steps,
        f.lost_steps
    );
    // Let one run's sockets close before the next starts.
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(m)
}

/// Writes `text` to `path`, creating its folder.
fn save(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Prompt tokens of the large class's requests offered in the window (the reviews').
fn review_prompt_tokens(driven: &drive::Driven, scenario: &Scenario, window: &Window) -> u64 {
    let Some(large) = scenario.classes.iter().position(|c| c.name == "large") else {
        return 0;
    };
    driven
        .sent
        .iter()
        .filter(|s| s.arrival.class == large && window.counts(s.arrival.at_s))
        .map(|s| u64::from(s.input_tokens))
        .sum()
}

/// Samples the autopilot's gauges from the gateway at `url` once a simulated second (the
/// simulator runs at `speed`) into `points`, until aborted.
async fn trace(
    url: String,
    speed: f64,
    points: std::sync::Arc<std::sync::Mutex<Vec<figures::TracePoint>>>,
) {
    let start = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / speed.max(1e-3)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        let at_s = start.elapsed().as_secs_f64() * speed;
        let Ok(resp) = reqwest::get(format!("{url}/metrics")).await else {
            continue;
        };
        let text = resp.text().await.unwrap_or_default();
        let value = |series: &str| {
            text.lines()
                .find_map(|l| {
                    l.strip_prefix(series)?
                        .strip_prefix(' ')?
                        .trim()
                        .parse()
                        .ok()
                })
                .unwrap_or(f64::NAN)
        };
        let point = figures::TracePoint {
            at_s,
            prefill_budget: value("tutor_gateway_autopilot_prefill_budget_tokens"),
            large_seats: value("tutor_gateway_autopilot_large_seats"),
            piece_tokens: value("tutor_gateway_autopilot_piece_tokens"),
            small_ratio: value("tutor_gateway_autopilot_objective_ratio{lane=\"small\"}"),
            small_seats: value("tutor_gateway_autopilot_small_seats"),
        };
        points
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(point);
    }
}

/// The unlabelled counters and gauges of a `/metrics` text, by name.
fn counters_of(text: &str) -> std::collections::HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.contains('{'))
        .filter_map(|l| {
            let (name, v) = l.split_once(' ')?;
            Some((name.to_owned(), v.trim().parse().ok()?))
        })
        .collect()
}

/// The capacity for `engine`: given, or measured through the FIFO preset.
async fn capacity_of(
    opts: &OpenLoopOptions,
    engine: &EngineSetting,
    scenario: &Scenario,
) -> anyhow::Result<Capacity> {
    if let Some(r) = opts.capacity {
        return Ok(Capacity::given(r));
    }
    eprintln!("== {}: measuring FIFO's capacity for the mix", engine.name);
    let stack = Stack::start(&opts.stack, engine, Preset::Fifo, opts.seeds[0]).await?;
    let c = capacity::measure(
        &stack,
        scenario,
        opts.seeds[0],
        opts.window.speed,
        &opts.capacity_run,
        engine,
    )
    .await;
    stack.stop().await;
    if c.requests_per_s <= 0.0 {
        bail!(
            "{}: no request completed while measuring the capacity",
            engine.name
        );
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(c)
}

/// The indices `0..n` starting at `k % n`: the order in which the `k`th seed runs the presets.
fn rotated(n: usize, k: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |i| (i + k) % n)
}

/// Runs every engine setting, load, seed and preset; writes `summary.json` and `summary.md`
/// into `out` and returns the summary.
pub async fn run_open_loop(opts: &OpenLoopOptions) -> anyhow::Result<Value> {
    opts.check()?;
    let mut presets = opts.presets.clone();
    presets.sort();
    presets.dedup();
    let small = opts
        .scenario
        .classes
        .iter()
        .position(|c| c.name == FLOOR_CLASS)
        .context("small class")?;
    let mut engines = serde_json::Map::new();
    for engine in &opts.engines {
        let mut scenario = opts.scenario.clone();
        scenario.max_model_len = scenario.max_model_len.min(engine.max_model_len);
        let cap = capacity_of(opts, engine, &scenario).await?;
        eprintln!(
            "== {}: capacity {:.2} requests/s ({})",
            engine.name, cap.requests_per_s, cap.source
        );
        let mut loads = vec![];
        for &load in &opts.loads {
            let rate = load * cap.requests_per_s;
            let mut by_preset: Vec<(Preset, Vec<Value>)> =
                presets.iter().map(|p| (*p, vec![])).collect();
            for (k, &seed) in opts.seeds.iter().enumerate() {
                let mut mixed = arrivals::mixed(&scenario, rate, seed, opts.window.horizon_s());
                if let Some(step) = &opts.step {
                    mixed = arrivals::stepped(
                        &scenario,
                        mixed,
                        step,
                        rate,
                        seed,
                        opts.window.horizon_s(),
                    );
                }
                let floor = arrivals::only(&mixed, small);
                // Each seed runs the presets in another order (rotated by one a seed), so that
                // no preset always runs first on a fresh machine or last on a warm one.
                let mut group: Vec<Option<_>> = presets.iter().map(|_| None).collect();
                for i in rotated(presets.len(), k) {
                    let preset = presets[i];
                    let arr = if preset == Preset::Floor {
                        &floor
                    } else {
                        &mixed
                    };
                    let m = one_run(opts, engine, &scenario, preset, arr, (load, seed, rate))
                        .await
                        .with_context(|| {
                            format!(
                                "{} / load {load} / seed {seed} / {}",
                                engine.name,
                                preset.name()
                            )
                        })?;
                    group[i] = Some(m);
                }
                let mut group: Vec<_> = group.into_iter().flatten().collect();
                figures::relate(&mut group);
                for (m, (_, runs)) in group.iter().zip(by_preset.iter_mut()) {
                    runs.push(serde_json::to_value(&m.figures)?);
                }
            }
            let mut p = serde_json::Map::new();
            for (preset, runs) in by_preset {
                let spread = figures::spread_tree(&runs);
                p.insert(
                    preset.name().into(),
                    json!({"spread": spread, "per_seed": runs}),
                );
            }
            loads.push(json!({"load": load, "rate_per_s": rate, "presets": p}));
        }
        engines.insert(
            engine.name.clone(),
            json!({
                "engine": engine,
                "engine_flags": engine.all_flags().join(" "),
                "capacity": cap,
                "loads": loads,
            }),
        );
    }
    let w = &opts.window;
    let summary = json!({
        "setup": {
            "arrivals": "poisson",
            "scenario": opts.scenario.name,
            "classes": opts.scenario.classes,
            "waves": opts.scenario.waves(),
            "profile": opts.stack.profile,
            "speed": w.speed,
            "units": report::UNITS,
            "fifo_max_concurrency": opts.stack.fifo_max_concurrency,
            "loads": opts.loads,
            "seeds": opts.seeds,
            "presets": presets.iter().map(|p| p.name()).collect::<Vec<_>>(),
            "warmup_s": w.warmup_s,
            "window_s": w.window_s,
            "drain_s": w.drain_s,
            "capacity_given": opts.capacity,
            "step": opts.step,
            "capacity_run": {
                "clients": opts.capacity_run.clients,
                "warmup_s": opts.capacity_run.warmup_s,
                "window_s": opts.capacity_run.window_s,
            },
            "slo": "questions: TTFT <= 2x the floor's small TTFT p95; reviews: e2e <= 2x FIFO's \
                    e2e p95 of the class; same load and seed; share of offered requests",
            "engine_bound": "per question: (end - arrival) + duration of the step running at \
                    its arrival; between steps or idle: the next step's duration; after the \
                    last step: the median step",
            "tokens_per_s": "prompt + output tokens of the window's completed requests / window",
        },
        "engines": engines,
    });
    report::write(&opts.out, &summary)?;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::rotated;

    /// Every seed runs every preset once, and over as many seeds as presets each preset runs
    /// first once.
    #[test]
    fn each_seed_runs_every_preset_once_and_a_different_one_first() {
        let n = 4;
        let mut firsts = vec![];
        for k in 0..n {
            let mut order: Vec<usize> = rotated(n, k).collect();
            firsts.push(order[0]);
            order.sort_unstable();
            assert_eq!(order, (0..n).collect::<Vec<_>>());
        }
        firsts.sort_unstable();
        assert_eq!(firsts, (0..n).collect::<Vec<_>>());
    }
}

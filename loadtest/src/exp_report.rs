//! The experiment's reports, grouped by engine setting: `summary.json` (every figure),
//! `summary.md` (one table per engine setting: small TTFT p50/p95/p99 beside their ratios to the
//! floor, queue wait, large work, throughput) and `comparison.md` (FIFO vs lanes, the M7 verdict,
//! per engine setting).

use std::fmt::Write;
use std::path::Path;

use serde_json::{json, Value};

use crate::compare::{compare, Rules};
use crate::engine::EngineSetting;
use crate::floor::{ratio, FLOOR_CLASS};
use crate::preset::Preset;
use crate::report::{ordered, s, with_ratio};
use crate::stats::Results;

/// One preset's run.
#[derive(Debug, Clone)]
pub struct PresetRun {
    /// Which preset.
    pub preset: Preset,
    /// Client-side results (with `vs_floor` when a floor ran first).
    pub results: Results,
    /// Gateway-side queue wait of the small lane (`p50_s`, `p95_s`, `requests`).
    pub queue_wait: Value,
    /// The engine's steps during the window ([`crate::steps::summarize`]; null without them).
    pub steps: Value,
    /// The gateway's pieces counters (`*-pieces` presets).
    pub pieces: Value,
}

/// The `summary.json` entry of one run (the shape, plus more fields).
pub fn summary_entry(r: &Results) -> Value {
    let mut classes = serde_json::Map::new();
    for (name, c) in ordered(r) {
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
        "small_vs_floor": r.vs_floor,
    })
}

fn find(runs: &[PresetRun], p: Preset) -> Option<&Results> {
    runs.iter().find(|r| r.preset == p).map(|r| &r.results)
}

/// The `summary.json` object of one engine setting.
pub fn engine_summary(engine: &EngineSetting, runs: &[PresetRun]) -> Value {
    let mut m = serde_json::Map::new();
    m.insert("engine".into(), json!(engine));
    m.insert("engine_flags".into(), json!(engine.all_flags().join(" ")));
    let fifo = find(runs, Preset::Fifo);
    let mut vs_fifo = serde_json::Map::new();
    for run in runs {
        let mut entry = summary_entry(&run.results);
        entry["small_gateway_queue_wait"] = run.queue_wait.clone();
        entry["engine_steps"] = run.steps.clone();
        entry["prefill_pieces"] = run.pieces.clone();
        m.insert(run.preset.name().to_string(), entry);
        if let Some(f) = fifo {
            let p95 = |r: &Results| r.classes.get(FLOOR_CLASS).and_then(|c| c.ttft_p95_s);
            vs_fifo.insert(
                run.preset.name().to_string(),
                json!({
                    "small_p95_ttft_fifo_over_preset": ratio(p95(f), p95(&run.results)),
                    "output_tokens_per_s_preset_over_fifo":
                        run.results.output_tokens_per_s / f.output_tokens_per_s.max(1e-9),
                }),
            );
        }
    }
    if fifo.is_some() {
        m.insert("vs_fifo".into(), Value::Object(vs_fifo));
    }
    if let (Some(a), Some(b)) = (fifo, find(runs, Preset::Lanes)) {
        let v = compare(a, b, &Rules::default());
        m.insert("m7_regression_lanes_vs_fifo".into(), json!(v.regression));
    }
    Value::Object(m)
}

/// One engine setting's Markdown table: a row per preset.
pub fn engine_table(engine: &EngineSetting, runs: &[PresetRun]) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "## Engine `{}`: `{}`\n",
        engine.name,
        engine.all_flags().join(" ")
    );
    o.push_str(
        "| preset | small TTFT p50 s (x floor) | p95 s (x floor) | p99 s (x floor) | small req \
         | small queue wait p95 s | large TTFT p95 s | large e2e p50 / p95 s | large req \
         | errors | out tok/s |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for run in runs {
        let r = &run.results;
        let small = r.classes.get(FLOOR_CLASS);
        let large = r.classes.get("large");
        let v = r.vs_floor.as_ref();
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} | {} / {} | {} | {} | {:.0} |",
            run.preset.name(),
            with_ratio(
                small.and_then(|c| c.ttft_p50_s),
                v.and_then(|v| v.floor_ttft_p50_s),
                v.and_then(|v| v.ttft_p50_x)
            ),
            with_ratio(
                small.and_then(|c| c.ttft_p95_s),
                v.and_then(|v| v.floor_ttft_p95_s),
                v.and_then(|v| v.ttft_p95_x)
            ),
            with_ratio(
                small.and_then(|c| c.ttft_p99_s),
                v.and_then(|v| v.floor_ttft_p99_s),
                v.and_then(|v| v.ttft_p99_x)
            ),
            small.map_or(0, |c| c.requests),
            s(run.queue_wait["p95_s"].as_f64()),
            s(large.and_then(|c| c.ttft_p95_s)),
            s(large.and_then(|c| c.e2e_p50_s)),
            s(large.and_then(|c| c.e2e_p95_s)),
            large.map_or(0, |c| c.requests),
            r.errors,
            r.output_tokens_per_s
        );
    }
    if runs.iter().any(|r| !r.steps.is_null()) {
        let _ = writeln!(
            o,
            "\nWhere small TTFT goes: the engine's steps during the window (simulator \
             `/debug/steps`). An arrival waits for the step in progress (mean residual) and \
             then for its own step; requests waiting in the engine add whole steps.\n"
        );
        o.push_str(crate::steps::HEADER);
        for run in runs.iter().filter(|r| !r.steps.is_null()) {
            let _ = writeln!(o, "{}", crate::steps::row(run.preset.name(), &run.steps));
        }
    }
    o
}

/// Writes `summary.json`, `summary.md` and `comparison.md` under `out`; returns the summary.
pub fn write_reports(
    out: &Path,
    setup: Value,
    by_engine: &[(EngineSetting, Vec<PresetRun>)],
) -> anyhow::Result<Value> {
    let mut engines = serde_json::Map::new();
    let mut md = String::from(
        "# Small questions against the floor, per engine setting\n\n\
         `(Nx)`: the preset's small TTFT over the `floor` run's (the same small clients, same \
         seed and requests, with no other class). TTFT is client side, from sending the \
         request (the gateway's queue included).\n\n",
    );
    let mut cmp = String::new();
    for (engine, runs) in by_engine {
        engines.insert(engine.name.clone(), engine_summary(engine, runs));
        md.push_str(&engine_table(engine, runs));
        md.push('\n');
        if let (Some(a), Some(b)) = (find(runs, Preset::Fifo), find(runs, Preset::Lanes)) {
            let v = compare(a, b, &Rules::default());
            let _ = writeln!(
                cmp,
                "# Engine `{}`: FIFO (A) vs lanes (B)\n\n{}",
                engine.name, v.text
            );
        }
    }
    let summary = json!({"setup": setup, "engines": engines});
    std::fs::write(
        out.join("summary.json"),
        serde_json::to_string_pretty(&summary)?,
    )?;
    std::fs::write(out.join("summary.md"), &md)?;
    if !cmp.is_empty() {
        std::fs::write(out.join("comparison.md"), &cmp)?;
    }
    println!("{md}");
    print!("{cmp}");
    Ok(summary)
}

//! The open-loop experiment's reports: `summary.json` (the setup, then per engine setting the
//! capacity record and, per load and preset, every run's figures and their spread across seeds)
//! and `summary.md` (per engine setting: the capacity, headline lines, one table with rows
//! load x preset and an engine-bound row per load).

use std::fmt::Write;
use std::path::Path;

use serde_json::Value;

pub use super::figures::UNITS;

/// `v` (a `{median, min, max, n}` spread) as `median (min–max)`, or the value alone when the
/// seeds agree or there is one; `scale` multiplies (100 for percentages), `digits` decimals.
pub fn cell(v: &Value, scale: f64, digits: usize, unit: &str) -> String {
    let num = super::unbounded::from_json;
    let (Some(m), Some(lo), Some(hi)) = (num(&v["median"]), num(&v["min"]), num(&v["max"])) else {
        return "-".into();
    };
    let f = |x: f64| {
        if x.is_infinite() {
            "∞".to_owned()
        } else {
            format!("{:.*}", digits, x * scale + 0.0)
        }
    };
    if f(lo) == f(hi) {
        format!("{}{unit}", f(m))
    } else {
        format!("{}{unit} ({}–{})", f(m), f(lo), f(hi))
    }
}

/// The spread at `path` (dot-separated) of a preset's `spread` tree.
fn at<'a>(tree: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(tree, |v, k| &v[k])
}

fn secs(tree: &Value, path: &str) -> String {
    let v = at(tree, path);
    let digits = match super::unbounded::from_json(&v["median"]) {
        Some(x) if x.abs() >= 10.0 => 1,
        Some(x) if x.abs() >= 1.0 => 2,
        _ => 3,
    };
    cell(v, 1.0, digits, "")
}

fn pct(tree: &Value, path: &str) -> String {
    cell(at(tree, path), 100.0, 0, "%")
}

fn count(tree: &Value, path: &str) -> String {
    cell(at(tree, path), 1.0, 0, "")
}

/// The table's header.
pub const HEADER: &str = "| load | preset | small TTFT p50 s | p95 s | p99 s | p95 x floor \
    | questions within 2x floor p95 | large offered / completed | large e2e p50 s | large e2e \
    p95 s | large within 2x FIFO e2e p95 | medium offered / completed | medium e2e p95 s \
    | prompt+output tok/s | output tok/s | refused | diverted | failed |\n\
    |---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";

/// One table row for a preset's spread tree.
pub fn row(load: f64, preset: &str, t: &Value) -> String {
    format!(
        "| {load} | {preset} | {} | {} | {} | {} | {} | {} / {} | {} | {} | {} | {} / {} | {} | {} | {} | {} | {} | {} |\n",
        secs(t, "classes.small.ttft_p50_s"),
        secs(t, "classes.small.ttft_p95_s"),
        secs(t, "classes.small.ttft_p99_s"),
        cell(at(t, "small_vs_floor.ttft_p95_x"), 1.0, 2, "x"),
        pct(t, "classes.small.slo_met"),
        count(t, "classes.large.offered"),
        count(t, "classes.large.completed"),
        secs(t, "classes.large.e2e_p50_s"),
        secs(t, "classes.large.e2e_p95_s"),
        pct(t, "classes.large.slo_met"),
        count(t, "classes.medium.offered"),
        count(t, "classes.medium.completed"),
        secs(t, "classes.medium.e2e_p95_s"),
        cell(at(t, "tokens_per_s"), 1.0, 0, ""),
        cell(at(t, "output_tokens_per_s"), 1.0, 0, ""),
        count(t, "refused"),
        count(t, "diverted"),
        count(t, "failed"),
    )
}

/// The engine-bound row of a load, from `preset`'s run steps.
pub fn bound_row(load: f64, preset: &str, t: &Value) -> String {
    let mut s = format!(
        "| {load} | engine bound (steps of the {preset} run) | {} | {} | {} |",
        secs(t, "engine_bound.p50_s"),
        secs(t, "engine_bound.p95_s"),
        secs(t, "engine_bound.p99_s"),
    );
    s.push_str(&" - |".repeat(13));
    s.push('\n');
    s
}

fn med(t: &Value, path: &str) -> Option<f64> {
    super::unbounded::from_json(&at(t, path)["median"])
}

fn opt(v: Option<f64>, digits: usize) -> String {
    match v {
        None => "-".into(),
        Some(x) if x.is_infinite() => "∞".into(),
        Some(x) => format!("{x:.digits$}"),
    }
}

/// One headline line per load: what a reader quotes.
pub fn headline(load: f64, rate: f64, presets: &Value) -> String {
    let (lanes, fifo, floor) = (
        &presets["lanes"]["spread"],
        &presets["fifo"]["spread"],
        &presets["floor"]["spread"],
    );
    let mut s = format!("- **load {load}** ({rate:.2} requests/s):");
    let p95 = "classes.small.ttft_p95_s";
    let _ = write!(
        s,
        " question TTFT p95 lanes {} s ({}x floor) vs FIFO {} s ({}x floor), floor {} s; \
         engine bound p95 {} s (the lanes run's steps).",
        opt(med(lanes, p95), 3),
        opt(med(lanes, "small_vs_floor.ttft_p95_x"), 2),
        opt(med(fifo, p95), 3),
        opt(med(fifo, "small_vs_floor.ttft_p95_x"), 2),
        opt(med(floor, p95), 3),
        opt(med(lanes, "engine_bound.p95_s"), 3),
    );
    let e = "classes.large.e2e_p95_s";
    let ratio = match (med(lanes, e), med(fifo, e)) {
        (Some(a), Some(b)) if b > 0.0 && a.is_finite() && b.is_finite() => {
            format!(" ({:+.0}%)", (a / b - 1.0) * 100.0)
        }
        _ => String::new(),
    };
    let _ = write!(
        s,
        " Reviews (large): e2e p95 lanes {} s vs FIFO {} s{ratio}; completed lanes {} / FIFO {} \
         of {} offered; within 2x FIFO's p95: lanes {}. Tokens/s lanes {} vs FIFO {}.",
        opt(med(lanes, e), 1),
        opt(med(fifo, e), 1),
        opt(med(lanes, "classes.large.completed"), 0),
        opt(med(fifo, "classes.large.completed"), 0),
        opt(med(fifo, "classes.large.offered"), 0),
        med(lanes, "classes.large.slo_met").map_or("-".into(), |x| format!("{:.0}%", x * 100.0)),
        opt(med(lanes, "tokens_per_s"), 0),
        opt(med(fifo, "tokens_per_s"), 0),
    );
    s.push('\n');
    s
}

/// `summary.md` from `summary.json`'s value.
pub fn summary_md(summary: &Value) -> String {
    let setup = &summary["setup"];
    let mut md = String::from("# Open-loop experiment: what lanes cost reviews\n\n");
    let classes: Vec<String> = setup["classes"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|c| {
                    format!(
                        "{} {:.0}% {}/{}",
                        c["name"].as_str().unwrap_or("?"),
                        c["share"].as_f64().unwrap_or(0.0) * 100.0,
                        c["input_tokens"],
                        c["output_tokens"]
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let _ = writeln!(
        md,
        "Scenario `{}` ({} tokens, sizes drawn as the scenario says), profile `{}`, speed {}, \
         seeds {}, loads {}; Poisson arrivals at load x FIFO's capacity; warm-up {} s, window \
         {} s, then a drain of at most {} s. Presets: {}.\n",
        setup["scenario"].as_str().unwrap_or("?"),
        classes.join(", "),
        setup["profile"].as_str().unwrap_or("?"),
        setup["speed"],
        join(&setup["seeds"]),
        join(&setup["loads"]),
        setup["warmup_s"],
        setup["window_s"],
        setup["drain_s"],
        setup["presets"]
            .as_array()
            .map(|a| a
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(", "))
            .unwrap_or_default(),
    );
    let _ = writeln!(md, "{UNITS}\n");
    let _ = writeln!(
        md,
        "Cells: the median across seeds, (min–max) when they differ. Only requests arriving \
         in the window count toward latencies and counts. Latencies run from each request's \
         arrival (the client's lag in sending included) and their quantiles are over the \
         offered requests: one that never got a first token (TTFT) or did not complete (end \
         to end) counts as infinitely late, so a quantile that falls among those reads ∞, and \
         an arm cannot look faster by refusing. Tokens/s is the work delivered inside the \
         window by every request that completed, whenever it arrived (a prompt at its first \
         token, output tokens as they came), per second of window. The floor is the same question arrivals alone (the mixed \
         sequence with every other class dropped). \"within 2x\": share of the offered \
         requests whose TTFT (questions) is at most 2x the floor's p95, or whose end to end \
         (large) is at most 2x FIFO's p95, same load and seed; requests that never got there \
         miss. Engine bound: per question, the rest of the engine step running at its arrival \
         plus one step as long as that one (idle engine: the next step's length), from that \
         run's step records; no scheduler can give a first token sooner. Refused: 4xx/5xx \
         before streaming; diverted: made a job or cut at a lane limit; failed: any other \
         error or still running at the drain bound.\n"
    );
    let Some(engines) = summary["engines"].as_object() else {
        return md;
    };
    for (name, e) in engines {
        let _ = writeln!(
            md,
            "## Engine `{name}` (`{}`)\n",
            e["engine_flags"].as_str().unwrap_or("")
        );
        let c = &e["capacity"];
        let _ = writeln!(
            md,
            "Capacity ({}): **{:.2} requests/s** of the mix; load 1.0 offers that rate. {}\n",
            c["source"].as_str().unwrap_or("?"),
            c["requests_per_s"].as_f64().unwrap_or(0.0),
            c["method"]
                .as_str()
                .map(|m| if m.is_empty() {
                    String::new()
                } else {
                    format!(
                        "Method: {m}; completed by class {}, {:.0} prompt+output tokens/s.",
                        c["completed_by_class"],
                        c["tokens_per_s"].as_f64().unwrap_or(0.0)
                    )
                })
                .unwrap_or_default(),
        );
        let loads = e["loads"].as_array().cloned().unwrap_or_default();
        for l in &loads {
            md.push_str(&headline(
                l["load"].as_f64().unwrap_or(0.0),
                l["rate_per_s"].as_f64().unwrap_or(0.0),
                &l["presets"],
            ));
        }
        md.push('\n');
        md.push_str(HEADER);
        for l in &loads {
            let load = l["load"].as_f64().unwrap_or(0.0);
            if let Some(p) = l["presets"].as_object() {
                for (preset, v) in p {
                    md.push_str(&row(load, preset, &v["spread"]));
                }
                for preset in ["lanes", "fifo"] {
                    if let Some(v) = p.get(preset) {
                        md.push_str(&bound_row(load, preset, &v["spread"]));
                    }
                }
            }
        }
        md.push('\n');
        md.push_str(PIECES_HEADER);
        for l in &loads {
            let load = l["load"].as_f64().unwrap_or(0.0);
            if let Some(p) = l["presets"].as_object() {
                for (preset, v) in p {
                    md.push_str(&pieces_row(load, preset, &v["spread"]));
                }
            }
        }
        md.push('\n');
    }
    md
}

/// The second table's header: objectives, the engine's steps, pieces.
const PIECES_HEADER: &str = "| load | preset | questions within the small objective \
    | small p99 x engine bound p99 | largest prompt chunk in a step (run / window) \
    | piece requests \
    | tokens recomputed / review prompt tokens | autopilot piece size at the end \
    | waited / predicted wait p50 (large long prompts; medium: others / long prompts) \
    | steps late p99 (wall ms) |\n\
    |---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";

fn pieces_row(load: f64, preset: &str, t: &Value) -> String {
    let vs_bound = match (
        med(t, "classes.small.ttft_p99_s"),
        med(t, "engine_bound.p99_s"),
    ) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
        _ => "-".into(),
    };
    let predictions = format!(
        "{}; {} / {}",
        cell(at(t, "wait_prediction_ratio_p50.large-prefill"), 1.0, 2, ""),
        cell(at(t, "wait_prediction_ratio_p50.medium-seat"), 1.0, 2, ""),
        cell(
            at(t, "wait_prediction_ratio_p50.medium-prefill"),
            1.0,
            2,
            ""
        ),
    );
    format!(
        "| {load} | {preset} | {} | {vs_bound} | {} / {} | {} | {} | {} | {} | {} |\n",
        pct(t, "small_within_objective"),
        count(t, "max_chunk_max"),
        count(t, "max_chunk_window"),
        count(t, "pieces"),
        cell(at(t, "piece_recomputed_share"), 100.0, 2, "%"),
        count(t, "autopilot_piece_tokens_end"),
        predictions,
        cell(at(t, "engine_late_ms_p99"), 1.0, 1, ""),
    )
}

/// One chart per autopilot run: its knobs over the run (`trace-<engine>-<load>-<preset>-seed<n>.svg`).
fn trace_charts(out: &Path, summary: &Value) -> anyhow::Result<()> {
    let step = summary["setup"]["step"]["at_s"].as_f64();
    let Some(engines) = summary["engines"].as_object() else {
        return Ok(());
    };
    for (name, e) in engines {
        for l in e["loads"].as_array().into_iter().flatten() {
            let load = l["load"].as_f64().unwrap_or(0.0);
            for (preset, v) in l["presets"].as_object().into_iter().flatten() {
                for run in v["per_seed"].as_array().into_iter().flatten() {
                    let Some(trace) = run["autopilot_trace"].as_array().filter(|t| !t.is_empty())
                    else {
                        continue;
                    };
                    let series = |label: &str, key: &str, scale: f64| crate::svg::Series {
                        name: label.into(),
                        points: trace
                            .iter()
                            .filter_map(|p| {
                                // An objective missed by refusals reads as the largest float.
                                Some((p["at_s"].as_f64()?, (p[key].as_f64()? / scale).min(30.0)))
                            })
                            .collect(),
                        dots: false,
                    };
                    let chart = crate::svg::Chart {
                        title: format!(
                            "Autopilot: {name}, load {load}, {preset}, seed {}",
                            run["seed"]
                        ),
                        x_label: "simulated seconds since the run's start".into(),
                        y_label: "value (see legend)".into(),
                        series: vec![
                            series("prefill budget, k tokens", "prefill_budget", 1000.0),
                            series("large seats", "large_seats", 1.0),
                            series("small reserved seats, tens", "small_seats", 10.0),
                            series("piece size, 100 tokens", "piece_tokens", 100.0),
                            series(
                                "small objective ratio x 10 (at most 30)",
                                "small_ratio",
                                0.1,
                            ),
                        ],
                        x_marker: step.map(|s| (s, "mix step".to_string())),
                        ..Default::default()
                    };
                    std::fs::write(
                        out.join(format!(
                            "trace-{name}-load{load}-{preset}-seed{}.svg",
                            run["seed"]
                        )),
                        chart.render(),
                    )?;
                }
            }
        }
    }
    Ok(())
}

fn join(v: &Value) -> String {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(Value::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default()
}

/// Writes `summary.json` and `summary.md` into `out`, and `jobs.md` when a run had a backlog
/// ([`super::jobs_report`]).
pub fn write(out: &Path, summary: &Value) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)?;
    std::fs::write(
        out.join("summary.json"),
        serde_json::to_string_pretty(summary)?,
    )?;
    std::fs::write(out.join("summary.md"), summary_md(summary))?;
    if super::jobs_report::has_jobs(summary) {
        std::fs::write(out.join("jobs.md"), super::jobs_report::jobs_md(summary))?;
    }
    trace_charts(out, summary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn cells_show_the_spread_only_when_seeds_differ() {
        let v = json!({"median": 0.41, "min": 0.38, "max": 0.47, "n": 3});
        assert_eq!(cell(&v, 1.0, 2, ""), "0.41 (0.38–0.47)");
        let one = json!({"median": 0.97, "min": 0.97, "max": 0.97, "n": 1});
        assert_eq!(cell(&one, 100.0, 0, "%"), "97%");
        assert_eq!(cell(&Value::Null, 1.0, 2, ""), "-");
        // A quantile that fell among requests that never got there.
        let unbounded = json!({"median": "inf", "min": 0.2, "max": "inf", "n": 2});
        assert_eq!(cell(&unbounded, 1.0, 3, ""), "∞ (0.200–∞)");
    }
}

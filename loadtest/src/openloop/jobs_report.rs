//! `jobs.md`: the backlog experiment's tables (issue 35, pre-emptible background jobs), written
//! beside `summary.md` when the scenario has a backlog class. Three runs side by side on the
//! same seed and the same question arrivals: A `floor` (the questions alone: no jobs), B
//! `lanes` (the backlog, `jobs.preempt = false`), C `lanes-preempt` (the backlog,
//! `jobs.preempt = true`). Per seed and the mean across seeds: one row per run, then the ratios
//! the issue sets targets for.

use std::fmt::Write;

use serde_json::Value;

/// A: the questions alone.
pub const NO_JOBS: &str = "floor";
/// B: the backlog, jobs on idle large-lane seats only.
pub const PREEMPT_OFF: &str = "lanes";
/// C: the backlog, jobs pre-emptible on any lane's idle seats.
pub const PREEMPT_ON: &str = "lanes-preempt";
/// C on Redis: as C, with the quota (and the pre-emption rules) in Redis.
pub const PREEMPT_ON_REDIS: &str = "lanes-preempt-redis";

/// Targets of the issue.
const JOBS_X: f64 = 1.5;
const TTFT_X: f64 = 1.1;
const RECOMPUTED: f64 = 0.05;

/// One figure of a run (`per_seed` entry) at a dot-separated path.
fn get(run: &Value, path: &str) -> Option<f64> {
    super::unbounded::from_json(path.split('.').fold(run, |v, k| &v[k]))
}

fn mean(v: &[Option<f64>]) -> Option<f64> {
    let x: Vec<f64> = v.iter().flatten().copied().collect();
    (!x.is_empty() && x.len() == v.len()).then(|| x.iter().sum::<f64>() / x.len() as f64)
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// A JSON number as Rust prints it (`60`, not `60.0`).
fn num(v: &Value) -> String {
    v.as_f64().map_or_else(|| v.to_string(), |x| x.to_string())
}

fn f(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.digits$}"))
}

/// Seconds: milliseconds under 0.1 s.
fn secs(v: Option<f64>) -> String {
    match v {
        Some(x) if x.is_infinite() => "∞".into(),
        Some(x) if x < 0.1 => format!("{:.1} ms", x * 1e3),
        Some(x) => format!("{x:.2} s"),
        None => "-".into(),
    }
}

fn pct(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{:.2}%", x * 100.0))
}

/// `value` against a target: `(met)` or `(missed)`.
fn verdict(value: Option<f64>, ok: impl Fn(f64) -> bool) -> &'static str {
    match value {
        Some(v) if ok(v) => " (met)",
        Some(_) => " (missed)",
        None => "",
    }
}

/// The run label in the tables.
fn label(preset: &str) -> String {
    match preset {
        NO_JOBS => "A: no jobs (`floor`: the questions alone)".into(),
        PREEMPT_OFF => "B: backlog, preempt off (`lanes`)".into(),
        PREEMPT_ON => "C: backlog, preempt on (`lanes-preempt`)".into(),
        PREEMPT_ON_REDIS => "C on Redis: as C, quota in Redis (`lanes-preempt-redis`)".into(),
        p => format!("`{p}`"),
    }
}

/// The figures of one row (one run, or the mean of a preset's runs).
struct Row {
    ttft_p50: Option<f64>,
    ttft_p99: Option<f64>,
    questions: Option<f64>,
    refused: Option<f64>,
    jobs_done: Option<f64>,
    jobs_since_start: Option<f64>,
    jobs_per_hour: Option<f64>,
    ran_dry: Option<f64>,
    unfinished: Option<f64>,
    failed: Option<f64>,
    preemptions: Option<f64>,
    admit_p99: Option<f64>,
    ask_admit_p99: Option<f64>,
    admit_target: Option<f64>,
    recomputed: Option<f64>,
    recomputed_share: Option<f64>,
    tokens: Option<f64>,
    late_ms: Option<f64>,
    unreported: Option<f64>,
    engine_recomputed: Option<f64>,
    engine_share: Option<f64>,
}

const SMALL: &str = "classes.small";

impl Row {
    fn of(run: &Value) -> Self {
        let jobs = !run["jobs"].is_null();
        let j = |k: &str| get(run, &format!("jobs.{k}"));
        Row {
            ttft_p50: get(run, &format!("{SMALL}.ttft_p50_s")),
            ttft_p99: get(run, &format!("{SMALL}.ttft_p99_s")),
            questions: get(run, &format!("{SMALL}.completed")),
            refused: get(run, &format!("{SMALL}.refused")),
            jobs_done: if jobs { j("done_in_window") } else { Some(0.0) },
            jobs_since_start: if jobs { j("done_by_end") } else { Some(0.0) },
            jobs_per_hour: if jobs { j("jobs_per_hour") } else { Some(0.0) },
            ran_dry: j("ran_dry_at_s"),
            unfinished: j("unfinished"),
            failed: j("failed"),
            preemptions: j("preemptions"),
            admit_p99: j("admit_p99_s"),
            ask_admit_p99: j("ask_admit_p99_s"),
            admit_target: j("admit_target_s"),
            recomputed: j("recomputed_tokens"),
            recomputed_share: j("recomputed_share"),
            tokens: get(run, "total_tokens_per_s"),
            late_ms: get(run, "engine_late_ms_p99"),
            unreported: j("unreported_tokens"),
            engine_recomputed: j("engine_recomputed_tokens"),
            engine_share: j("engine_recomputed_share"),
        }
    }

    fn mean(rows: &[Row]) -> Self {
        let m = |pick: fn(&Row) -> Option<f64>| mean(&rows.iter().map(pick).collect::<Vec<_>>());
        let any = |pick: fn(&Row) -> Option<f64>| {
            let v: Vec<Option<f64>> = rows.iter().map(pick).filter(Option::is_some).collect();
            mean(&v)
        };
        Row {
            ttft_p50: m(|r| r.ttft_p50),
            ttft_p99: m(|r| r.ttft_p99),
            questions: m(|r| r.questions),
            refused: m(|r| r.refused),
            jobs_done: m(|r| r.jobs_done),
            jobs_since_start: m(|r| r.jobs_since_start),
            jobs_per_hour: m(|r| r.jobs_per_hour),
            ran_dry: m(|r| r.ran_dry),
            unfinished: m(|r| r.unfinished),
            failed: m(|r| r.failed),
            preemptions: m(|r| r.preemptions),
            admit_p99: any(|r| r.admit_p99),
            ask_admit_p99: any(|r| r.ask_admit_p99),
            admit_target: any(|r| r.admit_target),
            recomputed: m(|r| r.recomputed),
            recomputed_share: any(|r| r.recomputed_share),
            tokens: m(|r| r.tokens),
            late_ms: m(|r| r.late_ms),
            unreported: m(|r| r.unreported),
            engine_recomputed: m(|r| r.engine_recomputed),
            engine_share: any(|r| r.engine_share),
        }
    }

    fn line(&self, seed: &str, run: &str, vs_no_jobs: Option<f64>) -> String {
        let admit = match (self.admit_p99, self.admit_target) {
            (Some(a), Some(t)) => format!("{} (target {})", secs(Some(a)), secs(Some(t))),
            (a, _) => secs(a),
        };
        let admit = match self.ask_admit_p99 {
            Some(after) => format!("{admit}; from the ask {}", secs(Some(after))),
            None => admit,
        };
        format!(
            "| {seed} | {run} | {} / {} | {} | {} / {} | {} ({}) | {} | {} | {} / {} | {} | {admit} | {} ({}) | {} | {} | {} | {} ({}) |\n",
            secs(self.ttft_p50),
            secs(self.ttft_p99),
            f(vs_no_jobs, 2) + if vs_no_jobs.is_some() { "x" } else { "" },
            f(self.questions, 0),
            f(self.refused, 0),
            f(self.jobs_done, 0),
            f(self.jobs_since_start, 0),
            f(self.jobs_per_hour, 0),
            self.ran_dry.map_or("-".into(), |t| format!("{t:.0} s")),
            f(self.unfinished, 0),
            f(self.failed, 0),
            f(self.preemptions, 0),
            f(self.recomputed, 0),
            pct(self.recomputed_share),
            f(self.tokens, 0),
            f(self.late_ms, 1),
            f(self.unreported, 0),
            f(self.engine_recomputed, 0),
            pct(self.engine_share),
        )
    }
}

const RUNS_HEADER: &str = "| seed | run | questions' TTFT p50 / p99 | p99 x no jobs \
    | questions completed / refused | jobs done in window (since the start) | jobs / hour \
    | backlog ran dry at \
    | jobs unfinished / failed | pre-emptions | pre-emption admit p99 (one step + 50 ms; \
    from the first ask) \
    | recomputed tokens (share of jobs' output) | prompt+output tok/s (questions + jobs) \
    | steps late p99 (wall ms) | unreported prompt tokens \
    | computed twice, the engine's count (share of jobs' output) |\n\
    |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";

const RATIOS_HEADER: &str = "| seed | jobs/h C / B (target >= 1.5x) | TTFT p99 C / A \
    (target <= 1.1x) | TTFT p99 B / A | admit p99 C (target: one step + 50 ms) \
    | recomputed / jobs' output C (target <= 5%) | tok/s C / B | questions completed C / A \
    | computed twice (the engine's count) / jobs' output C (target <= 5%) |\n\
    |---|---:|---:|---:|---:|---:|---:|---:|---:|\n";

/// The ratios of one seed (or of the means): C/B jobs, C/A and B/A TTFT p99, C's admission and
/// recomputed share, C/B tokens, C/A questions.
fn ratios_line(seed: &str, a: Option<&Row>, b: Option<&Row>, c: Option<&Row>) -> String {
    let p = |r: Option<&Row>, pick: fn(&Row) -> Option<f64>| r.and_then(pick);
    let jobs = ratio(p(c, |r| r.jobs_per_hour), p(b, |r| r.jobs_per_hour));
    let c_a = ratio(p(c, |r| r.ttft_p99), p(a, |r| r.ttft_p99));
    let b_a = ratio(p(b, |r| r.ttft_p99), p(a, |r| r.ttft_p99));
    let admit = p(c, |r| r.admit_p99);
    let target = p(c, |r| r.admit_target);
    let share = p(c, |r| r.recomputed_share);
    let engine_share = p(c, |r| r.engine_share);
    let x = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2}x"));
    format!(
        "| {seed} | {}{} | {}{} | {} | {}{} | {}{} | {} | {} | {}{} |\n",
        x(jobs),
        verdict(jobs, |v| v >= JOBS_X),
        x(c_a),
        verdict(c_a, |v| v <= TTFT_X),
        x(b_a),
        match (admit, target) {
            (Some(a), Some(t)) => format!("{} vs {}", secs(Some(a)), secs(Some(t))),
            (a, _) => secs(a),
        },
        match (admit, target) {
            (Some(a), Some(t)) => verdict(Some(a), |v| v <= t),
            _ => "",
        },
        pct(share),
        verdict(share, |v| v <= RECOMPUTED),
        x(ratio(p(c, |r| r.tokens), p(b, |r| r.tokens))),
        x(ratio(p(c, |r| r.questions), p(a, |r| r.questions))),
        pct(engine_share),
        verdict(engine_share, |v| v <= RECOMPUTED),
    )
}

/// Whether any run of `summary` had a backlog.
pub fn has_jobs(summary: &Value) -> bool {
    summary["engines"]
        .as_object()
        .into_iter()
        .flat_map(|e| e.values())
        .flat_map(|e| e["loads"].as_array().into_iter().flatten())
        .flat_map(|l| {
            l["presets"]
                .as_object()
                .into_iter()
                .flat_map(|p| p.values())
        })
        .flat_map(|p| p["per_seed"].as_array().into_iter().flatten())
        .any(|r| !r["jobs"].is_null())
}

/// `jobs.md` from `summary.json`'s value.
pub fn jobs_md(summary: &Value) -> String {
    let setup = &summary["setup"];
    let mut md = String::from("# Background jobs: pre-emptible seats (issue 35)\n\n");
    let backlog: Vec<String> = setup["classes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["backlog"].is_u64())
        .map(|c| {
            format!(
                "{} jobs of class `{}` (~{}/{} tokens, {})",
                c["backlog"],
                c["name"].as_str().unwrap_or("?"),
                c["input_tokens"],
                c["output_tokens"],
                c["distribution"].as_str().unwrap_or("fixed")
            )
        })
        .collect();
    let _ = writeln!(
        md,
        "Scenario `{}`: questions (class `small`) arriving open loop at load x capacity{}, and a \
         backlog of {} submitted at the run's start. Warm-up {} s (not counted), window {} s, \
         drain at most {} s; speed {}. A = `floor` (the same question arrivals, no jobs), B = \
         `lanes` (the backlog; `jobs.preempt = false`: jobs on idle large-lane seats only), C = \
         `lanes-preempt` (the backlog; `jobs.preempt = true`). Same seed, same question \
         arrivals, same jobs in each.\n",
        setup["scenario"].as_str().unwrap_or("?"),
        match &setup["waves"] {
            Value::Null => String::new(),
            w => format!(
                " times a wave between {} and {} (period {} s)",
                num(&w["low"]),
                num(&w["high"]),
                num(&w["period_s"])
            ),
        },
        backlog.join(", "),
        num(&setup["warmup_s"]),
        num(&setup["window_s"]),
        num(&setup["drain_s"]),
        num(&setup["speed"]),
    );
    let _ = writeln!(md, "{}\n", super::figures::UNITS);
    md.push_str(
        "Questions' TTFT: questions arriving in the window (the warm-up left out) that got a \
         first token (refused ones have none: see the refusals). Jobs done in \
         window: `finished_at` (the gateway's) inside the window; jobs / hour = those / window; \
         in brackets, the jobs done from the run's start (the backlog's submission) to the \
         window's end, warm-up included. \
         A job still queued or running at the window's end is unfinished (failed: the gateway \
         failed it). \"Backlog ran dry at\": every job was done before the window's end, so \
         jobs / hour is a lower bound of what the run could do. Pre-emptions, recomputed \
         tokens and the admission histogram are the gateway's metrics read at the window's \
         end (the run so far, warm-up included); recomputed share = \
         `tutor_gateway_job_recomputed_tokens_total` / output tokens the jobs had generated by \
         then (done jobs' usage, the others' streamed pieces): the continuations' prompt tokens \
         the engine reported as not cached; unreported = prompt tokens of continuations cut \
         again before the engine reported their cache hit \
         (`tutor_gateway_job_unreported_prompt_tokens_total`: what they recomputed is \
         unknown, at most this); computed twice = the simulator's own count of tokens of full \
         KV blocks it computed again after losing them (every request's, questions' included, \
         the run until the window's end), over the same output tokens; admit p99 from the \
         `tutor_gateway_preemption_admit_seconds` buckets (all lanes, interpolated), target = \
         the run's median engine step + 50 ms; \"from the ask\": the same requests from their \
         first ask for a job to leave (`tutor_gateway_preemption_ask_admit_seconds`), so the \
         difference is the wait before any job could be asked. Tokens/s: prompt + output tokens of the \
         window's completed questions and jobs done in the window, per second of window. \
         Steps late: p99 of how late the simulator's steps ended (more than a few ms: the \
         machine did not keep up with the speed, and the run measures the machine). Mean: the \
         arithmetic mean across seeds (ratios: of the means).\n\n",
    );
    let Some(engines) = summary["engines"].as_object() else {
        return md;
    };
    for (name, e) in engines {
        let cap = e["capacity"]["requests_per_s"].as_f64().unwrap_or(0.0);
        let _ = writeln!(
            md,
            "## Engine `{name}` (`{}`)\n\nCapacity ({}): {cap:.2} questions/s.\n",
            e["engine_flags"].as_str().unwrap_or(""),
            e["capacity"]["source"].as_str().unwrap_or("?"),
        );
        for l in e["loads"].as_array().into_iter().flatten() {
            md.push_str(&load_tables(l));
        }
    }
    md
}

/// The two tables of one load.
fn load_tables(l: &Value) -> String {
    let mut md = String::new();
    let presets = &l["presets"];
    let order: Vec<&str> = {
        let mut known: Vec<&str> = [NO_JOBS, PREEMPT_OFF, PREEMPT_ON, PREEMPT_ON_REDIS]
            .into_iter()
            .filter(|p| !presets[*p].is_null())
            .collect();
        known.extend(
            presets
                .as_object()
                .into_iter()
                .flat_map(|o| o.keys())
                .map(String::as_str)
                .filter(|p| ![NO_JOBS, PREEMPT_OFF, PREEMPT_ON, PREEMPT_ON_REDIS].contains(p)),
        );
        known
    };
    let runs = |p: &str| -> Vec<Value> {
        presets[p]["per_seed"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let seeds: Vec<u64> = order
        .first()
        .map(|p| runs(p).iter().filter_map(|r| r["seed"].as_u64()).collect())
        .unwrap_or_default();
    let _ = writeln!(
        md,
        "### Load {} ({:.2} questions/s at the base rate)\n",
        l["load"],
        l["rate_per_s"].as_f64().unwrap_or(0.0)
    );
    md.push_str(RUNS_HEADER);
    let row_of = |p: &str, seed: u64| {
        runs(p)
            .iter()
            .find(|r| r["seed"].as_u64() == Some(seed))
            .map(Row::of)
    };
    for &seed in &seeds {
        let a99 = row_of(NO_JOBS, seed).and_then(|r| r.ttft_p99);
        for p in &order {
            if let Some(r) = row_of(p, seed) {
                md.push_str(&r.line(&seed.to_string(), &label(p), ratio(r.ttft_p99, a99)));
            }
        }
    }
    let means: Vec<(&str, Row)> = order
        .iter()
        .map(|p| {
            let rows: Vec<Row> = runs(p).iter().map(Row::of).collect();
            (*p, Row::mean(&rows))
        })
        .collect();
    let mean_of = |p: &str| means.iter().find(|m| m.0 == p).map(|m| &m.1);
    let a99 = mean_of(NO_JOBS).and_then(|r| r.ttft_p99);
    for (p, r) in &means {
        md.push_str(&r.line("mean", &label(p), ratio(r.ttft_p99, a99)));
    }
    md.push('\n');
    md.push_str(RATIOS_HEADER);
    // C's ratios and C on Redis's, each against the same A and B, for those that ran (C's,
    // all "-", when neither did).
    let mut pre_emptive: Vec<(&str, &str)> =
        [(PREEMPT_ON, ""), (PREEMPT_ON_REDIS, " (C on Redis)")]
            .into_iter()
            .filter(|(p, _)| order.contains(p))
            .collect();
    if pre_emptive.is_empty() {
        pre_emptive.push((PREEMPT_ON, ""));
    }
    for (c_preset, suffix) in pre_emptive {
        for &seed in &seeds {
            let (a, b, c) = (
                row_of(NO_JOBS, seed),
                row_of(PREEMPT_OFF, seed),
                row_of(c_preset, seed),
            );
            md.push_str(&ratios_line(
                &format!("{seed}{suffix}"),
                a.as_ref(),
                b.as_ref(),
                c.as_ref(),
            ));
        }
        md.push_str(&ratios_line(
            &format!("mean{suffix}"),
            mean_of(NO_JOBS),
            mean_of(PREEMPT_OFF),
            mean_of(c_preset),
        ));
    }
    md.push('\n');
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(seed: u64, p99: f64, jobs: Option<(f64, f64)>) -> Value {
        let mut r = json!({
            "seed": seed,
            "classes": {"small": {"ttft_p50_s": p99 / 2.0, "ttft_p99_s": p99, "completed": 1000,
                                  "refused": 3}},
            "total_tokens_per_s": 5000.0,
            "jobs": null,
        });
        if let Some((per_hour, share)) = jobs {
            r["jobs"] = json!({
                "done_in_window": per_hour / 20.0, "done_by_end": per_hour / 20.0 + 1.0, "jobs_per_hour": per_hour,
                "ran_dry_at_s": null, "unfinished": 10, "preemptions": 40,
                "admit_p99_s": 0.06, "admit_target_s": 0.08,
                "recomputed_tokens": 500, "recomputed_share": share,
                "unreported_tokens": 7000, "engine_recomputed_tokens": 40,
                "engine_recomputed_share": share / 2.0,
            });
        }
        r
    }

    #[test]
    fn the_tables_show_each_seed_the_mean_and_the_ratios() {
        let summary = json!({
            "setup": {"scenario": "t", "classes": [{"name": "review", "backlog": 200,
                      "input_tokens": 8000, "output_tokens": 500}], "warmup_s": 10,
                      "window_s": 180, "drain_s": 30, "speed": 1,
                      "waves": {"low": 0.1, "high": 0.9, "period_s": 60}},
            "engines": {"seed": {"engine_flags": "--max-num-seqs 96", "capacity":
                {"requests_per_s": 30.0, "source": "measured"}, "loads": [{
                "load": 1.0, "rate_per_s": 30.0, "presets": {
                    "floor": {"per_seed": [run(1, 0.10, None), run(2, 0.20, None)]},
                    "lanes": {"per_seed": [run(1, 0.10, Some((100.0, 0.0))),
                                           run(2, 0.20, Some((120.0, 0.0)))]},
                    "lanes-preempt": {"per_seed": [run(1, 0.105, Some((200.0, 0.02))),
                                                   run(2, 0.30, Some((240.0, 0.04)))]},
                }}]}},
        });
        assert!(has_jobs(&summary));
        let md = jobs_md(&summary);
        assert!(md.contains("between 0.1 and 0.9 (period 60 s)"), "{md}");
        // Seed 1: C/B 2.00x (met), C/A 1.05x (met); seed 2: C/A 1.50x (missed).
        assert!(
            md.contains("| 1 | 2.00x (met) | 1.05x (met) | 1.00x |"),
            "{md}"
        );
        assert!(md.contains("| 2 | 2.00x (met) | 1.50x (missed) |"), "{md}");
        // The mean: jobs/h 220 vs 110, p99 0.2025 vs 0.15 (1.35x), recomputed 3%.
        assert!(md.contains("| mean | 2.00x (met) | 1.35x (missed) | 1.00x | 60.0 ms vs 80.0 ms (met) | 3.00% (met) |"), "{md}");
        assert!(md.contains("| mean | C: backlog, preempt on (`lanes-preempt`) |"));
        // The engine's own count of work done twice, judged against the same target.
        assert!(md.contains("| 1.00x | 1.50% (met) |"), "{md}");
        assert!(md.contains("| 7000 | 40 (2.00%) |"), "{md}");
        // A has no jobs: zero done, no pre-emption figures.
        assert!(
            md.contains(
                "| 1 | A: no jobs (`floor`: the questions alone) | 50.0 ms / 0.10 s | 1.00x | 1000 / 3 \
                 | 0 (0) | 0 | - | - / - | - | - | - (-) | 5000 | - |"
            ),
            "{md}"
        );
        assert!(!has_jobs(&json!({"engines": {}})));
        assert!(
            !md.contains("C on Redis"),
            "no Redis run, no Redis rows: {md}"
        );
    }

    #[test]
    fn a_run_on_redis_gets_its_rows_and_its_ratios_against_the_same_a_and_b() {
        let mut summary = json!({
            "setup": {"scenario": "t", "classes": [], "warmup_s": 10, "window_s": 180,
                      "drain_s": 30, "speed": 1},
            "engines": {"seed": {"engine_flags": "", "capacity":
                {"requests_per_s": 30.0, "source": "measured"}, "loads": [{
                "load": 1.0, "rate_per_s": 30.0, "presets": {
                    "floor": {"per_seed": [run(1, 0.10, None)]},
                    "lanes": {"per_seed": [run(1, 0.10, Some((100.0, 0.0)))]},
                    "lanes-preempt": {"per_seed": [run(1, 0.20, Some((200.0, 0.02)))]},
                    "lanes-preempt-redis": {"per_seed": [run(1, 0.30, Some((50.0, 0.5)))]},
                }}]}},
        });
        let md = jobs_md(&summary);
        assert!(
            md.contains("| 1 | C on Redis: as C, quota in Redis (`lanes-preempt-redis`) |"),
            "{md}"
        );
        assert!(md.contains("| 1 | 2.00x (met) | 2.00x (missed) |"), "{md}");
        assert!(
            md.contains("| 1 (C on Redis) | 0.50x (missed) | 3.00x (missed) |"),
            "{md}"
        );
        assert!(
            md.contains("| mean (C on Redis) | 0.50x (missed) |"),
            "{md}"
        );
        // Only C on Redis ran: no empty rows for C.
        summary["engines"]["seed"]["loads"][0]["presets"]
            .as_object_mut()
            .unwrap()
            .remove("lanes-preempt");
        let md = jobs_md(&summary);
        assert!(md.contains("| 1 (C on Redis) |"), "{md}");
        assert!(!md.contains("| 1 | - |"), "{md}");
    }
}

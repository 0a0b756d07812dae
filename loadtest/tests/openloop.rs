//! Smoke test of the open-loop experiment (`experiment --arrivals poisson`): a tiny run (a
//! capacity measurement of a few simulated seconds, one load, one seed, floor + FIFO + lanes on
//! the `seed` engine at speed 10) writes both reports with every field, and every offered
//! request is accounted for exactly once.

use std::path::Path;

use serde_json::Value;
use tutor_load::engine::{expand, Overrides};
use tutor_load::openloop::capacity::CapacityOptions;
use tutor_load::openloop::drive::Window;
use tutor_load::openloop::stack::StackSpec;
use tutor_load::openloop::{run_open_loop, OpenLoopOptions};
use tutor_load::preset::Preset;
use tutor_load::scenario::Scenario;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_open_loop_experiment_accounts_for_every_request() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::env::temp_dir().join(format!("tutor-load-openloop-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let opts = OpenLoopOptions {
        stack: StackSpec {
            config: root.join("../config/config.toml"),
            profile: "llama-3.1-8b-h100".into(),
            speed: 10.0,
            fifo_max_concurrency: 0,
        },
        scenario: Scenario::load(&root.join("scenarios/seed-mix-open.toml")).unwrap(),
        engines: expand(&["seed".into()], &Overrides::default()).unwrap(),
        presets: vec![Preset::Lanes, Preset::Floor, Preset::Fifo],
        loads: vec![0.5],
        seeds: vec![3],
        window: Window {
            speed: 10.0,
            warmup_s: 2.0,
            window_s: 8.0,
            drain_s: 60.0,
        },
        capacity: None,
        capacity_run: CapacityOptions {
            clients: 24,
            warmup_s: 3.0,
            window_s: 6.0,
        },
        step: None,
        out: out.clone(),
    };
    let summary = run_open_loop(&opts).await.expect("experiment");
    let text = std::fs::read_to_string(out.join("summary.json")).expect("summary.json");
    let parsed: Value = serde_json::from_str(&text).expect("summary.json parses");
    assert_eq!(parsed["setup"], summary["setup"]);
    let e = &parsed["engines"]["seed"];
    let cap = &e["capacity"];
    assert_eq!(cap["source"], "measured");
    assert!(cap["requests_per_s"].as_f64().unwrap() > 0.0, "{cap}");
    assert!(cap["method"].as_str().unwrap().contains("FIFO"));
    let l = &e["loads"][0];
    let rate = l["rate_per_s"].as_f64().unwrap();
    assert!((rate - 0.5 * cap["requests_per_s"].as_f64().unwrap()).abs() < 1e-9);
    let presets: Vec<&String> = l["presets"].as_object().unwrap().keys().collect();
    assert_eq!(
        presets,
        ["floor", "fifo", "lanes"],
        "floor first, then fifo"
    );
    let run = |p: &str| l["presets"][p]["per_seed"][0].clone();
    for p in ["floor", "fifo", "lanes"] {
        let r = run(p);
        assert_eq!(r["seed"], 3);
        let offered = r["offered"].as_u64().unwrap();
        assert!(offered > 0, "{p}: nothing offered");
        let sum = |v: &Value| {
            ["completed", "refused", "diverted", "failed"]
                .iter()
                .map(|k| {
                    v[k].as_u64()
                        .unwrap_or_else(|| panic!("{p}: {k} missing in {v}"))
                })
                .sum::<u64>()
        };
        assert_eq!(sum(&r), offered, "{p}: every offered request has one fate");
        for (name, c) in r["classes"].as_object().unwrap() {
            assert_eq!(sum(c), c["offered"].as_u64().unwrap(), "{p}/{name}");
            for k in [
                "ttft_p50_s",
                "ttft_p95_s",
                "ttft_p99_s",
                "e2e_p50_s",
                "e2e_p95_s",
                "e2e_p99_s",
                "slo_limit_s",
                "slo_met",
                "cut",
            ] {
                assert!(c.get(k).is_some(), "{p}/{name}: {k} missing");
            }
        }
        for k in [
            "tokens_per_s",
            "output_tokens_per_s",
            "refused_by_code",
            "failed_by_code",
            "small_vs_floor",
            "engine_bound",
            "steps",
            "lost_steps",
            "rate_per_s",
        ] {
            assert!(r.get(k).is_some(), "{p}: {k} missing");
        }
        assert!(r["tokens_per_s"].as_f64().unwrap() > r["output_tokens_per_s"].as_f64().unwrap());
        // The shipped small objective (500 ms): a share of the offered questions.
        let within = r["small_within_objective"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&within), "{p}: {within}");
        assert_eq!(
            r["autopilot_trace"],
            serde_json::json!([]),
            "{p}: not piloted"
        );
        assert_eq!(r["lost_steps"], 0, "{p}: engine steps lost");
        let small = &r["classes"]["small"];
        assert!(small["ttft_p95_s"].is_f64(), "{p}: {small}");
        assert!(small["slo_met"].is_f64(), "{p}: {small}");
        assert!(r["small_vs_floor"]["ttft_p95_x"].is_f64(), "{p}");
        // The engine bound covers every question and is below what any run measured.
        let b = &r["engine_bound"];
        assert_eq!(b["questions"], small["offered"], "{p}: {b}");
        assert!(
            b["p50_s"].as_f64().unwrap() <= small["ttft_p50_s"].as_f64().unwrap(),
            "{p}: {b} {small}"
        );
        // Spread across seeds: present for every figure.
        let s = &l["presets"][p]["spread"];
        assert_eq!(s["classes"]["small"]["ttft_p95_s"]["n"], 1, "{s}");
        assert_eq!(s["offered"]["median"].as_f64(), Some(offered as f64));
    }
    // The floor gets the mixed runs' questions, and nothing else; FIFO and lanes the same mix.
    let (floor, fifo, lanes) = (run("floor"), run("fifo"), run("lanes"));
    assert_eq!(
        floor["classes"]["small"]["offered"],
        fifo["classes"]["small"]["offered"]
    );
    assert_eq!(floor["offered"], floor["classes"]["small"]["offered"]);
    assert_eq!(fifo["offered"], lanes["offered"]);
    assert!(
        fifo["offered"].as_u64() > floor["offered"].as_u64(),
        "the mix has reviews too"
    );
    assert!(
        fifo["classes"]["large"]["slo_met"].is_f64() || fifo["classes"]["large"]["offered"] == 0
    );
    let md = std::fs::read_to_string(out.join("summary.md")).unwrap();
    for needle in [
        "## Engine `seed`",
        "Capacity (measured)",
        "engine bound (steps of the lanes run)",
        "simulated seconds",
        "| 0.5 | lanes |",
        "**load 0.5**",
    ] {
        assert!(md.contains(needle), "{needle:?} missing in\n{md}");
    }
    // Every table row has its table's header's columns (two tables: runs, then objectives
    // and pieces).
    let columns = |l: &str| l.matches('|').count();
    let mut header = None;
    let mut tables = 0;
    for l in md.lines() {
        if l.starts_with("| load |") {
            header = Some(l);
            tables += 1;
        } else if l.starts_with("| 0.5 |") {
            assert_eq!(columns(l), columns(header.unwrap()), "{l}");
        }
    }
    assert_eq!(tables, 2, "{md}");
    assert!(md.contains("questions within the small objective"), "{md}");
    let _ = std::fs::remove_dir_all(&out);
}

/// Issue 35's runs in miniature: questions in waves and a backlog of jobs, `floor` (no jobs),
/// `lanes` (`jobs.preempt` off) and `lanes-preempt` (on) on the same arrivals: every job is
/// accounted for, only the floor has no backlog, and `jobs.md` has a row per run and the ratios.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_runs_beside_waves_of_questions_but_not_on_the_floor() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::env::temp_dir().join(format!("tutor-load-backlog-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let mut scenario = Scenario::load(&root.join("scenarios/preempt-day.toml")).unwrap();
    scenario.classes[1].backlog = Some(12);
    scenario.classes[1].input_tokens = 2000;
    scenario.classes[1].output_tokens = 100;
    let opts = OpenLoopOptions {
        stack: StackSpec {
            config: root.join("../config/config.toml"),
            profile: "llama-3.1-8b-h100".into(),
            speed: 10.0,
            fifo_max_concurrency: 0,
        },
        scenario,
        engines: expand(&["seed".into()], &Overrides::default()).unwrap(),
        presets: vec![Preset::LanesPreempt, Preset::Lanes, Preset::Floor],
        loads: vec![1.0],
        seeds: vec![4],
        window: Window {
            speed: 10.0,
            warmup_s: 2.0,
            window_s: 20.0,
            drain_s: 20.0,
        },
        capacity: Some(10.0),
        capacity_run: CapacityOptions {
            clients: 8,
            warmup_s: 1.0,
            window_s: 1.0,
        },
        step: None,
        out: out.clone(),
    };
    let summary = run_open_loop(&opts).await.expect("experiment");
    let l = &summary["engines"]["seed"]["loads"][0];
    let run = |p: &str| l["presets"][p]["per_seed"][0].clone();
    let floor = run("floor");
    assert!(floor["jobs"].is_null(), "no backlog on the floor");
    assert_eq!(floor["classes"]["review"]["offered"], 0);
    for p in ["lanes", "lanes-preempt"] {
        let r = run(p);
        let j = &r["jobs"];
        assert_eq!(j["jobs"], 12, "{p}: {j}");
        assert_eq!(j["submitted"], 12, "{p}: {j}");
        let n = |k: &str| j[k].as_u64().unwrap_or_else(|| panic!("{p}: {k} in {j}"));
        // Every job: done by the end, failed, or unfinished (done before the window's start
        // is possible only in the warm-up).
        assert_eq!(
            n("done_by_end") + n("failed") + n("unfinished"),
            12,
            "{p}: {j}"
        );
        assert!(n("done_in_window") <= n("done_by_end"));
        assert_eq!(n("failed"), 0, "{p}: {j}");
        assert!(n("done_by_end") > 0, "{p}: some job ends in 22 s: {j}");
        let per_hour = j["jobs_per_hour"].as_f64().unwrap();
        assert!((per_hour - n("done_in_window") as f64 / 20.0 * 3600.0).abs() < 1e-6);
        // The jobs done in the window add their tokens to the window's (none done there, as
        // when the backlog's jobs all end in the drain on a busy machine: the same).
        let (total, requests) = (
            r["total_tokens_per_s"].as_f64().unwrap(),
            r["tokens_per_s"].as_f64().unwrap(),
        );
        if n("done_in_window") > 0 {
            assert!(total > requests, "{p}: {total} vs {requests}");
        } else {
            assert!(
                (total - requests).abs() < 1e-9,
                "{p}: {total} vs {requests}"
            );
        }
        // The same questions as the floor.
        assert_eq!(
            r["classes"]["small"]["offered"], floor["classes"]["small"]["offered"],
            "{p}"
        );
        // Each job's record, and the metrics of the run, are kept.
        let records = out.join(format!("jobs/seed-load1-{p}-seed4.json"));
        let records: Value =
            serde_json::from_str(&std::fs::read_to_string(&records).unwrap()).unwrap();
        assert_eq!(records.as_array().unwrap().len(), 12);
        let done = records
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["status"] == "done")
            .collect::<Vec<_>>();
        assert!(done.iter().all(|r| r["output_tokens"].as_u64() > Some(0)
            && r["finished_s"].as_f64() >= r["submitted_s"].as_f64()));
        let metrics = out.join(format!("metrics/seed-load1-{p}-seed4.prom"));
        let metrics = std::fs::read_to_string(metrics).unwrap();
        assert!(
            metrics.contains("tutor_gateway_job_preemptions_total"),
            "{p}"
        );
    }
    // With preempt off, no job is ever pre-empted.
    assert_eq!(run("lanes")["jobs"]["preemptions"], 0);
    let md = std::fs::read_to_string(out.join("jobs.md")).unwrap();
    for needle in [
        "| 4 | A: no jobs",
        "| 4 | B: backlog, preempt off",
        "| 4 | C: backlog, preempt on",
        "| mean | C: backlog, preempt on",
        "jobs/h C / B (target >= 1.5x)",
        "between 0.1 and 0.9 (period 60 s)",
    ] {
        assert!(md.contains(needle), "{needle:?} missing in\n{md}");
    }
    let _ = std::fs::remove_dir_all(&out);
}

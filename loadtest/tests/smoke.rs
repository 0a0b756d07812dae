//! CI smoke test of the defining experiment (M16) at small scale: 8 small + 2 large clients,
//! `llama-3.1-8b-h100` at speed 10, a few seconds per policy, through the real gateway, the floor,
//! FIFO then lanes on the `seed` engine setting. Asserts only that they completed without errors,
//! that the outputs parse and that the ratios to the floor are there.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tutor_load::engine::{expand, Overrides};
use tutor_load::experiment::{run_experiment, ExperimentOptions, Preset};
use tutor_load::runner::RunOptions;
use tutor_load::scenario::Scenario;
use tutor_load::stats::Results;

fn out_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tutor-load-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_vs_lanes_smoke_completes_without_errors() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut scenario = Scenario::load(&root.join("scenarios/defining-experiment.toml")).unwrap();
    scenario.scale_concurrency(0.1);
    assert_eq!(scenario.classes[0].concurrency, 8);
    assert_eq!(scenario.classes[1].concurrency, 2);
    let out = out_dir("smoke");
    let opts = ExperimentOptions {
        config: root.join("../config/config.toml"),
        scenario,
        run: RunOptions {
            warmup: Duration::ZERO,
            duration: Duration::from_secs(6),
            drain: Duration::from_secs(20),
            seed: 42,
            progress_every_s: 0,
        },
        profile: "llama-3.1-8b-h100".into(),
        speed: 10.0,
        fifo_max_concurrency: 0,
        engines: expand(&["seed".into()], &Overrides::default()).unwrap(),
        presets: vec![Preset::Floor, Preset::Fifo, Preset::Lanes],
        out: out.clone(),
    };
    let summary = run_experiment(&opts).await.expect("experiment");
    let seed = out.join("seed");
    let floor = Results::load(&seed.join("floor/results.json")).expect("floor results.json");
    assert_eq!(
        floor.classes["large"].requests, 0,
        "the floor has no large clients"
    );
    for policy in ["fifo", "lanes"] {
        let r = Results::load(&seed.join(policy).join("results.json")).expect("results.json");
        assert!(r.vs_floor.as_ref().unwrap().ttft_p95_x.is_some());
        assert!(r.requests > 10, "{policy}: only {} requests", r.requests);
        assert_eq!(r.errors, 0, "{policy}: errors {:?}", r.errors_by_code);
        for (name, c) in &r.classes {
            assert!(c.ok > 0, "{policy}/{name}: no request completed");
            assert_eq!(c.cut, 0, "{policy}/{name}: cut at the deadline");
        }
        for f in [
            "summary.md",
            "ttft_cdf.svg",
            "ttft_over_time.svg",
            "throughput.svg",
        ] {
            assert!(seed.join(policy).join(f).is_file(), "{policy}/{f} missing");
        }
        let s = &summary["engines"]["seed"][policy];
        assert!(s["classes"]["small"]["ttft_p95_s"].is_f64(), "{summary}");
        assert!(s["output_tokens_per_s"].as_f64().unwrap() > 0.0);
        assert!(s["small_vs_floor"]["ttft_p95_x"].is_f64(), "{summary}");
    }
    let md = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(
        md.contains("## Engine `seed`") && md.contains("x floor"),
        "{md}"
    );
    let text = std::fs::read_to_string(out.join("summary.json")).unwrap();
    let parsed: serde_json::Value = serde_json::from_str(&text).expect("summary.json parses");
    assert_eq!(
        parsed["engines"]["seed"]["lanes"]["classes"]["large"]["errors"],
        0
    );
    let _ = std::fs::remove_dir_all(&out);
}

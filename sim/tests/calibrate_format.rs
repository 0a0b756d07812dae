//! The GPU calibration script (`sim/calibrate/calibrate.py`) writes profiles the simulator loads:
//! its dry run (a synthetic timer, no torch, no GPU) goes through the same grid, fit and writer,
//! and the file it writes must load with `ProfileFile::load` and reproduce every anchor it wrote.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use vllm_sim::profile::{ProfileFile, StepShape};

/// The repository root (this crate is `sim/`).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("sim/ has a parent")
        .to_path_buf()
}

/// `python3`; fails (never skips) where it cannot run, saying what installs it.
fn python3() -> Option<&'static str> {
    match Command::new("python3").arg("--version").output() {
        Ok(out) if out.status.success() => Some("python3"),
        Ok(out) => panic!(
            "`python3 --version` exited with {}: scripts/test installs python3",
            out.status
        ),
        Err(e) => panic!("python3 is not installed ({e}): scripts/test installs it"),
    }
}

/// Runs `python3 args...` from the repository root; panics with its output if it fails.
fn run_python(python: &str, args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new(python)
        .args(args)
        .current_dir(repo_root())
        // No __pycache__ left in the source tree.
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "python3 {args:?} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    stdout
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("vllm-sim-calibrate-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[test]
fn dry_run_profile_loads_and_reproduces_its_anchors() {
    let Some(python) = python3() else { return };
    let dir = scratch_dir("dry-run");
    let out = dir.join("profile.toml");
    let script = repo_root().join("sim/calibrate/calibrate.py");
    let log = run_python(
        python,
        &[
            script.as_os_str(),
            "--dry-run".as_ref(),
            "--out".as_ref(),
            out.as_os_str(),
        ],
    );
    assert!(log.contains("wrote"), "{log}");

    let profile = ProfileFile::load(&out).unwrap_or_else(|e| panic!("{}: {e:#}", out.display()));
    assert!(profile.status == "measured", "status {:?}", profile.status);
    assert_eq!(profile.name, "llama-3.1-8b-dry-run");
    assert!(
        (4..=6).contains(&profile.anchors.len()),
        "{} anchors",
        profile.anchors.len()
    );

    let cost = profile.cost();
    let mut decode_only = 0;
    let mut with_chunk = 0;
    for a in &profile.anchors {
        let shape = StepShape {
            prefill_tokens: a.prefill_tokens,
            prefill_seqs: a.prefill_seqs,
            prefill_attention_pairs: a.prefill_attention_pairs,
            decode_seqs: a.decode_seqs,
            context_tokens: a.context_tokens,
        };
        if shape.prefill_tokens == 0 {
            decode_only += 1;
        } else {
            with_chunk += 1;
        }
        let got = ms(cost.step_time(shape));
        let rel = (got - a.expect_ms).abs() / a.expect_ms;
        assert!(
            rel <= a.tolerance,
            "anchor {:?}: the profile gives {got:.4} ms, the script measured {} ms (tolerance {})",
            a.what,
            a.expect_ms,
            a.tolerance
        );
        assert!(a.tolerance >= 0.05 && a.tolerance <= 1.0, "{a:?}");
    }
    assert!(
        decode_only >= 1 && with_chunk >= 1,
        "anchors of both kinds: {decode_only} decode-only, {with_chunk} with a chunk"
    );

    // The script's model is the simulator's: every grid point's fitted time, as the script
    // computed it, is what `step_time` gives for that shape.
    let text = std::fs::read_to_string(&out).expect("profile text");
    let doc: toml::Table = toml::from_str(&text).expect("profile TOML");
    let rows = doc["calibration"]["point"]
        .as_array()
        .expect("[[calibration.point]] rows");
    assert!(rows.len() >= 12, "{} grid points", rows.len());
    let int = |row: &toml::Value, key: &str| -> u64 {
        u64::try_from(
            row[key]
                .as_integer()
                .unwrap_or_else(|| panic!("{key} in {row}")),
        )
        .expect("non-negative")
    };
    for row in rows {
        let shape = StepShape {
            prefill_tokens: int(row, "prefill_tokens") as u32,
            prefill_seqs: row["chunks"].as_array().expect("chunks").len() as u32,
            prefill_attention_pairs: int(row, "prefill_attention_pairs"),
            decode_seqs: int(row, "decode_seqs") as u32,
            context_tokens: int(row, "context_tokens"),
        };
        let fit_ms = row["fit_ms"].as_float().expect("fit_ms");
        let got = ms(cost.step_time(shape));
        assert!(
            (got - fit_ms).abs() <= 1e-3 + 1e-6 * fit_ms,
            "{shape:?}: the simulator gives {got} ms, the script's fit {fit_ms} ms"
        );
    }

    // The fitted profile keeps the shape the simulator relies on: a late chunk of a long prompt
    // costs more than the same chunk at position 0, and a decode-only step less fixed cost than
    // the same step with a one-token chunk added.
    let chunk = |p: u64| StepShape {
        prefill_tokens: 512,
        prefill_seqs: 1,
        prefill_attention_pairs: 512 * p + 512 * 513 / 2,
        ..StepShape::default()
    };
    assert!(cost.step_time(chunk(11_776)) > cost.step_time(chunk(0)));
    let decode = StepShape {
        decode_seqs: 8,
        context_tokens: 8 * 1000,
        ..StepShape::default()
    };
    let mixed = StepShape {
        prefill_tokens: 1,
        prefill_seqs: 1,
        prefill_attention_pairs: 1,
        ..decode
    };
    assert!(cost.step_time(decode) < cost.step_time(mixed));

    let _ = std::fs::remove_dir_all(&dir);
}

/// The script's own unit tests (grid coverage, the fit, the file's keys) run here too, so that
/// `cargo test` covers them.
#[test]
fn calibration_script_unit_tests_pass() {
    let Some(python) = python3() else { return };
    let tests = repo_root().join("sim/calibrate/test_calibrate.py");
    run_python(python, &[tests.as_os_str()]);
}

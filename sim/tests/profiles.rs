//! Profile files: the shipped ones load and reproduce their anchors, the cost model has the
//! shape a GPU has (late prompt chunks cost more, decode-only steps have less fixed overhead),
//! and bad files are refused with the key named.

use std::path::{Path, PathBuf};

use vllm_sim::profile::{BatchedCost, Profile, ProfileFile, StepShape};
use vllm_sim::SimArgs;

fn shipped() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    files
}

fn h100() -> BatchedCost {
    match Profile::by_name("llama-3.1-8b-h100", 0.0, 0.0) {
        Some(Profile::Batched(c)) => c,
        other => panic!("{other:?}"),
    }
}

#[test]
fn every_shipped_profile_loads_and_reproduces_its_anchors() {
    let files = shipped();
    assert!(files.len() >= 2, "{files:?}");
    for path in files {
        let file = ProfileFile::load(&path).unwrap();
        let stem = path.file_stem().unwrap().to_str().unwrap();
        assert_eq!(
            file.name,
            stem,
            "{}: name is not the file name",
            path.display()
        );
        assert!(!file.anchors.is_empty(), "{}: no anchor", path.display());
        for a in &file.anchors {
            let got = file.cost().step_ms(a.shape());
            assert!(
                a.holds(&file.cost()),
                "{}: {:?}: model {got:.2} ms, expected {} ms +- {:.0}%",
                path.display(),
                a.what,
                a.expect_ms,
                a.tolerance * 100.0
            );
        }
        assert!(file.missed_anchors().is_empty());
    }
}

#[test]
fn built_in_names_are_the_shipped_files() {
    for (name, embedded) in Profile::FILES {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("profiles")
            .join(format!("{name}.toml"));
        assert_eq!(
            ProfileFile::load(&path).unwrap(),
            ProfileFile::from_toml_str(embedded).unwrap()
        );
        let file = ProfileFile::from_toml_str(embedded).unwrap();
        assert_eq!(
            Profile::by_name(name, 0.0, 0.0),
            Some(Profile::Batched(file.cost()))
        );
        assert_eq!(file.status, "estimated");
    }
}

#[test]
fn a_late_prompt_chunk_costs_more_than_an_early_one_by_its_attention() {
    // A 12,288-token prompt in 512-token chunks: the first at 0, the last at 11,776.
    for name in ["llama-3.1-8b-h100", "llama-3.1-8b-h200"] {
        let Some(Profile::Batched(c)) = Profile::by_name(name, 0.0, 0.0) else {
            panic!("{name}");
        };
        let early = StepShape::chunk(512, 0);
        let late = StepShape::chunk(512, 11_776);
        let extra_pairs = late.prefill_attention_pairs - early.prefill_attention_pairs;
        assert_eq!(extra_pairs, 512 * 11_776);
        let attention = extra_pairs as f64 * c.per_attention_pair_ms;
        let (early_ms, late_ms) = (c.step_ms(early), c.step_ms(late));
        assert!(
            late_ms - early_ms >= attention * 0.999,
            "{name}: early {early_ms} ms, late {late_ms} ms, attention {attention} ms"
        );
        // And the difference is worth noticing: more than a quarter of the early chunk.
        assert!(late_ms > early_ms * 1.25, "{name}: {early_ms} vs {late_ms}");
    }
}

#[test]
fn a_decode_only_step_has_less_fixed_overhead_than_a_mixed_one() {
    let c = h100();
    assert!(c.decode_overhead_ms < c.mixed_overhead_ms, "{c:?}");
    // 64 decodes alone, and the same with one 1-token prompt chunk riding along: the chunk adds
    // the mixed overhead, not just one token's worth.
    let decode = StepShape::decode(64, 2_000);
    let mut mixed = decode;
    mixed.prefill_tokens = 1;
    mixed.prefill_seqs = 1;
    mixed.prefill_attention_pairs = 1;
    let diff = c.step_ms(mixed) - c.step_ms(decode);
    assert!(
        diff >= c.mixed_overhead_ms - c.decode_overhead_ms,
        "{diff} ms"
    );
}

#[test]
fn the_model_has_the_expected_figures() {
    // The figures sim/README.md quotes ("Step time"), to 0.1 ms.
    let c = h100();
    let ms = |s: StepShape| (c.step_ms(s) * 10.0).round() / 10.0;
    assert_eq!(ms(StepShape::decode(1, 1_000)), 6.2);
    assert_eq!(ms(StepShape::decode(64, 2_000)), 12.0);
    assert_eq!(ms(StepShape::chunk(512, 0)), 16.6);
    assert_eq!(ms(StepShape::chunk(512, 11_776)), 23.0);
    assert_eq!(ms(StepShape::chunk(8_192, 0)), 268.8);
}

const GOOD: &str = r#"
name = "t"
model = "m"
gpu = "g"
status = "measured"
note = "n"
[cost]
decode_overhead_ms = 1
mixed_overhead_ms = 2.5
weight_read_ms = 5.0
per_token_ms = 0.03
per_attention_pair_ms = 1e-6
per_context_token_ms = 0.00005
[kv]
gpu_blocks = 1000
[[anchor]]
what = "a"
source = "s"
decode_seqs = 1
expect_ms = 6.0
tolerance = 0.1
[calibration]
grid = [[1, 2], [3, 4]]
anything = { goes = "here" }
"#;

fn refused(text: &str) -> String {
    format!("{:#}", ProfileFile::from_toml_str(text).unwrap_err())
}

#[test]
fn a_good_file_loads_with_integers_and_a_free_form_calibration_table() {
    let f = ProfileFile::from_toml_str(GOOD).unwrap();
    assert_eq!(f.status, "measured");
    assert_eq!(f.cost().decode_overhead_ms, 1.0);
    assert_eq!(f.cost().default_gpu_blocks, 1000);
    assert_eq!(f.anchors.len(), 1);
    assert_eq!(f.anchors[0].shape(), StepShape::decode(1, 0));
    assert!(f.anchors[0].holds(&f.cost()));
    assert!(f.calibration.unwrap().contains_key("grid"));
}

#[test]
fn bad_files_are_refused_naming_the_key() {
    let cases = [
        // Unknown keys, at the top, in [cost], in [kv], in an anchor.
        (
            GOOD.replace("note = \"n\"", "note = \"n\"\ncolour = 1"),
            "colour",
        ),
        (
            GOOD.replace(
                "per_token_ms = 0.03",
                "per_token_ms = 0.03\nper_tokn_ms = 1",
            ),
            "per_tokn_ms",
        ),
        (
            GOOD.replace("gpu_blocks = 1000", "gpu_blocks = 1000\nblock_size = 16"),
            "block_size",
        ),
        (
            GOOD.replace("decode_seqs = 1", "decode_seqs = 1\ndecodes = 2"),
            "decodes",
        ),
        // Missing keys.
        (GOOD.replace("weight_read_ms = 5.0\n", ""), "weight_read_ms"),
        // Negative and non-finite constants.
        (
            GOOD.replace("per_token_ms = 0.03", "per_token_ms = -0.03"),
            "per_token_ms",
        ),
        (
            GOOD.replace("weight_read_ms = 5.0", "weight_read_ms = nan"),
            "weight_read_ms",
        ),
        (
            GOOD.replace(
                "per_context_token_ms = 0.00005",
                "per_context_token_ms = inf",
            ),
            "per_context_token_ms",
        ),
        // Tolerance outside (0, 1], a bad expectation, no KV, an unknown status.
        (
            GOOD.replace("tolerance = 0.1", "tolerance = 1.5"),
            "tolerance",
        ),
        (
            GOOD.replace("tolerance = 0.1", "tolerance = 0"),
            "tolerance",
        ),
        (
            GOOD.replace("expect_ms = 6.0", "expect_ms = -1"),
            "expect_ms",
        ),
        (
            GOOD.replace("gpu_blocks = 1000", "gpu_blocks = 0"),
            "gpu_blocks",
        ),
        (GOOD.replace("\"measured\"", "\"guessed\""), "guessed"),
    ];
    for (text, key) in cases {
        let err = refused(&text);
        assert!(
            err.contains(key),
            "error for {key:?} does not name it: {err}"
        );
    }
}

#[test]
fn load_names_the_file() {
    let dir = std::env::temp_dir().join(format!("vllm-sim-profiles-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.toml");
    std::fs::write(
        &path,
        GOOD.replace("per_token_ms = 0.03", "per_token_ms = -1"),
    )
    .unwrap();
    let err = format!("{}", ProfileFile::load(&path).unwrap_err());
    assert!(
        err.contains("bad.toml") && err.contains("per_token_ms"),
        "{err}"
    );
    let missing = format!(
        "{:#}",
        ProfileFile::load(&dir.join("none.toml")).unwrap_err()
    );
    assert!(missing.contains("none.toml"), "{missing}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn profile_file_flag_loads_a_file_and_excludes_profile() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/llama-3.1-8b-h200.toml");
    let args = SimArgs::for_test(&["--profile-file", path.to_str().unwrap()]);
    let state = vllm_sim::build(&args).unwrap();
    drop(state);
    let both = <SimArgs as clap::Parser>::try_parse_from([
        "vllm-sim",
        "--profile",
        "tiny-test",
        "--profile-file",
        path.to_str().unwrap(),
    ]);
    assert!(both.is_err());
    let bad = SimArgs::for_test(&["--profile-file", "/nonexistent/profile.toml"]);
    let err = format!("{:#}", vllm_sim::build(&bad).unwrap_err());
    assert!(err.contains("/nonexistent/profile.toml"), "{err}");
}

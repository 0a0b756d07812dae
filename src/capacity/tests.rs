//! The planner's numbers, from `config.json` values quoted from the models' HuggingFace
//! repositories, and [`overcommit`] against capacities an engine could report.

use super::model::ModelShape;
use super::plan::{plan, LaneInput, Plan, PlanInput};
use super::*;

/// meta-llama/Llama-3.1-8B-Instruct `config.json`, the keys that matter (the file as published).
const LLAMA_31_8B: &str = r#"{
  "architectures": ["LlamaForCausalLM"],
  "hidden_size": 4096,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "vocab_size": 128256
}"#;

/// Qwen/Qwen2.5-7B-Instruct `config.json` (no `head_dim`: 3584 / 28 = 128).
const QWEN_25_7B: &str = r#"{
  "architectures": ["Qwen2ForCausalLM"],
  "hidden_size": 3584,
  "intermediate_size": 18944,
  "max_position_embeddings": 32768,
  "model_type": "qwen2",
  "num_attention_heads": 28,
  "num_hidden_layers": 28,
  "num_key_value_heads": 4,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "vocab_size": 152064
}"#;

fn input(model: &str, gpu: f64, weights: Option<f64>) -> PlanInput {
    PlanInput {
        model: ModelShape::from_json(model).unwrap(),
        gpu_memory_gib: gpu,
        gpu_memory_utilization: 0.9,
        weights_gib: weights,
        overhead_gib: 0.0,
        kv_cache_dtype: "auto".into(),
        block_size: 16,
        lanes: LaneInput::from_config(&Config::default()),
        prefill_budget_tokens: 12_288,
    }
}

fn run(i: &PlanInput) -> Plan {
    plan(i).unwrap()
}

#[test]
fn llama_31_8b_is_128_kib_a_token() {
    let m = ModelShape::from_json(LLAMA_31_8B).unwrap();
    assert_eq!(
        (m.layers, m.kv_heads, m.head_dim, m.dtype_bytes),
        (32, 8, 128, 2)
    );
    // 32 x 8 x 128 x 2 x 2 bytes.
    assert_eq!(m.kv_bytes_per_token(2), 131_072);
    assert_eq!(m.kv_bytes_per_token(1), 65_536, "fp8 KV halves it");
}

#[test]
fn llama_on_an_80_gib_gpu() {
    // 80 GiB x 0.9 = 72 GiB, less 16 GiB of weights: 56 GiB of KV = 56 x 8192 tokens.
    let p = run(&input(LLAMA_31_8B, 80.0, Some(16.0)));
    assert_eq!(p.kv_bytes_per_token, 131_072);
    assert_eq!(p.kv_tokens, 458_752);
    assert_eq!(p.kv_blocks, 28_672);
    // Sequences at the shipped config's lane bounds: 1200, 5000 (313 blocks), 16384 tokens.
    let alone: Vec<u64> = p.lanes.iter().map(|l| l.sequences_alone).collect();
    assert_eq!(alone, [382, 91, 28]);
    assert_eq!(p.max_model_len, 16_384);
    // The budgets sum to no more than the KV cache, and each holds the lane's largest request.
    let budgets: u64 = p.lanes.iter().map(|l| l.max_tokens_in_flight).sum();
    assert!(budgets <= p.kv_tokens, "{budgets} > {}", p.kv_tokens);
    assert_eq!(p.max_tokens_in_flight, p.kv_tokens);
    for l in &p.lanes {
        assert_eq!(
            l.max_tokens_in_flight,
            l.budget_requests * u64::from(l.context)
        );
    }
    // Split like the shipped budgets (115200 / 100000 / 163840) after one request each.
    let requests: Vec<u64> = p.lanes.iter().map(|l| l.budget_requests).collect();
    assert_eq!(requests, [111, 23, 12]);
    assert_eq!(p.max_num_seqs, 146);
    // 111 small requests are more than the small lane's 96-seat ceiling: said, not hidden.
    assert!(
        p.warnings
            .iter()
            .any(|w| w.starts_with("lanes.small: the budget holds 111") && w.contains("ceiling 96")),
        "{:?}",
        p.warnings
    );
    let snippet = p.snippet();
    for line in [
        "--max-model-len 16384 --max-num-seqs 146",
        "max_tokens_in_flight = 458752",
        "seats = 146",
        "[lanes.large]\nmax_tokens_in_flight = 196608",
    ] {
        assert!(snippet.contains(line), "{line:?} not in\n{snippet}");
    }
}

#[test]
fn the_snippet_is_a_valid_config() {
    let p = run(&input(LLAMA_31_8B, 80.0, Some(16.0)));
    // The snippet, with the one key a config must always choose, is a whole valid file.
    let text = p
        .snippet()
        .replace("[classify]\n", "[classify]\ntokenizer = \"heuristic\"\n");
    let config = Config::from_toml_str(&text).unwrap();
    assert_eq!(config.admission.max_tokens_in_flight.get(), p.kv_tokens);
    let cap = EngineCapacity {
        num_gpu_blocks: p.kv_blocks,
        block_size: 16,
        engines: 1,
        max_model_len: p.max_model_len,
    };
    assert_eq!(overcommit(&config, &cap), Vec::<String>::new());
}

/// A small GPU's engine has fewer seats than the lanes reserve by default: the snippet scales
/// the reservations down, so it is a valid config there too.
#[test]
fn the_snippet_is_valid_on_a_small_gpu_too() {
    let mut small_seen = false;
    for gpu in [18.0, 20.0, 24.0, 32.0, 48.0] {
        let Ok(p) = plan(&input(LLAMA_31_8B, gpu, Some(16.0))) else {
            continue;
        };
        small_seen |= p.max_num_seqs < 62;
        let text = p
            .snippet()
            .replace("[classify]\n", "[classify]\ntokenizer = \"heuristic\"\n");
        let config = Config::from_toml_str(&text);
        assert!(config.is_ok(), "{gpu} GiB: {:?}\n{text}", config.err());
    }
    assert!(small_seen, "one of the GPUs has fewer than 62 seats");
}

/// The reservations scaled down are the planned config's, not the defaults': a config whose
/// lanes reserve 64 + 20 + 10 on an engine of fewer seats gets lines that fit those seats
/// (scaled from the defaults' 62, none came at 62 seats or more, and the config pasted in was
/// refused: the lanes' reservations above `admission.seats`).
#[test]
fn the_snippet_scales_the_planned_configs_reservations() {
    let mut config = Config::default();
    config.lanes.small.max_concurrency = 64.try_into().unwrap();
    let mut seen = false;
    for gpu in [24.0, 28.0, 32.0, 40.0, 48.0] {
        let mut i = input(LLAMA_31_8B, gpu, Some(16.0));
        i.lanes = LaneInput::from_config(&config);
        let Ok(p) = plan(&i) else { continue };
        seen |= (62..94).contains(&p.max_num_seqs);
        let snippet: toml::Value = toml::from_str(&p.snippet()).unwrap();
        let reserved: i64 = Lane::ALL
            .iter()
            .map(|l| {
                snippet["lanes"][l.as_str()]
                    .get("max_concurrency")
                    .and_then(toml::Value::as_integer)
                    .unwrap_or(i64::from(config.lanes.get(*l).max_concurrency.get()))
            })
            .sum();
        let seats = snippet["admission"]["seats"].as_integer().unwrap();
        assert!(
            reserved <= seats,
            "{gpu} GiB: {reserved} reserved of {seats}\n{}",
            p.snippet()
        );
    }
    assert!(seen, "one of the GPUs has between 62 and 94 seats");
}

#[test]
fn llama_weights_estimated_from_its_shape() {
    // 8.03 billion parameters in bfloat16: 14.96 GiB.
    let p = run(&input(LLAMA_31_8B, 80.0, None));
    let params = p.estimated_parameters.unwrap();
    assert!((8_020_000_000..8_040_000_000).contains(&params), "{params}");
    assert!((14.9..15.0).contains(&p.weights_gib), "{}", p.weights_gib);
}

#[test]
fn qwen_25_7b_is_56_kib_a_token() {
    let m = ModelShape::from_json(QWEN_25_7B).unwrap();
    // head_dim from hidden_size / num_attention_heads.
    assert_eq!(m.head_dim, 128);
    // 28 x 4 x 128 x 2 x 2 bytes.
    assert_eq!(m.kv_bytes_per_token(2), 57_344);
    // 56 GiB of KV holds 2^20 tokens.
    let p = run(&input(QWEN_25_7B, 80.0, Some(16.0)));
    assert_eq!(p.kv_tokens, 1_048_576);
    let alone: Vec<u64> = p.lanes.iter().map(|l| l.sequences_alone).collect();
    assert_eq!(alone, [873, 209, 64]);
    // 7.6 billion parameters.
    let params = ModelShape::from_json(QWEN_25_7B)
        .unwrap()
        .parameters
        .unwrap();
    assert!((7_600_000_000..7_630_000_000).contains(&params), "{params}");
}

#[test]
fn fp8_kv_doubles_the_tokens() {
    let mut i = input(LLAMA_31_8B, 80.0, Some(16.0));
    i.kv_cache_dtype = "fp8".into();
    let p = run(&i);
    assert_eq!(p.kv_bytes_per_token, 65_536);
    assert_eq!(p.kv_tokens, 2 * 458_752);
    assert!(p.snippet().contains("--kv-cache-dtype fp8"));
}

/// vLLM serves a float32 checkpoint in float16 (`--dtype auto`): its weights and an `auto` KV
/// cache take 2 bytes an element, not 4, and the command needs no `--kv-cache-dtype`. A KV
/// dtype vLLM does not take is refused, not put in the command line.
#[test]
fn a_float32_checkpoint_is_planned_as_vllm_serves_it() {
    let fp32 = LLAMA_31_8B.replace(
        "\"torch_dtype\": \"bfloat16\"",
        "\"torch_dtype\": \"float32\"",
    );
    assert_ne!(fp32, LLAMA_31_8B);
    let (half, full) = (
        run(&input(LLAMA_31_8B, 80.0, None)),
        run(&input(&fp32, 80.0, None)),
    );
    assert_eq!(full.kv_bytes_per_token, half.kv_bytes_per_token);
    assert_eq!(full.kv_tokens, half.kv_tokens);
    assert!((full.weights_gib - half.weights_gib).abs() < 1e-9);
    assert!(
        !full.snippet().contains("--kv-cache-dtype"),
        "{}",
        full.snippet()
    );
    for bad in ["float32", "float16", "fp16"] {
        let mut i = input(LLAMA_31_8B, 80.0, None);
        i.kv_cache_dtype = bad.into();
        let err = plan(&i).unwrap_err().to_string();
        assert!(err.contains("as vLLM takes it"), "{bad}: {err}");
    }
}

#[test]
fn a_gpu_too_small_is_refused_with_the_reason() {
    // 24 GiB x 0.9 = 21.6, less 16 GiB: 5.6 GiB = 45875 tokens, enough;
    // 20 GiB: 18 - 16 = 2 GiB = 16384 tokens, not one request of each lane.
    let err = plan(&input(LLAMA_31_8B, 20.0, Some(16.0)))
        .unwrap_err()
        .to_string();
    assert!(err.contains("less than one request of each lane"), "{err}");
    let err = plan(&input(LLAMA_31_8B, 16.0, Some(16.0)))
        .unwrap_err()
        .to_string();
    assert!(err.contains("no room for the KV cache"), "{err}");
}

#[test]
fn a_missing_key_is_named() {
    let text = LLAMA_31_8B.replace("\"num_hidden_layers\": 32,", "");
    let err = ModelShape::from_json(&text).unwrap_err().to_string();
    assert!(err.contains("missing `num_hidden_layers`"), "{err}");
    let text = LLAMA_31_8B.replace("\"torch_dtype\": \"bfloat16\",", "");
    let err = ModelShape::from_json(&text).unwrap_err().to_string();
    assert!(err.contains("missing `torch_dtype`"), "{err}");
    // Without num_key_value_heads, every attention head has its own KV.
    let text = LLAMA_31_8B.replace("\"num_key_value_heads\": 8,", "");
    assert_eq!(ModelShape::from_json(&text).unwrap().kv_heads, 32);
    // No head_dim and no attention heads: an error, not a division by zero.
    let text = QWEN_25_7B.replace(
        "\"num_attention_heads\": 28,",
        "\"num_attention_heads\": 0,",
    );
    let err = ModelShape::from_json(&text).unwrap_err().to_string();
    assert!(err.contains("`num_attention_heads` must be > 0"), "{err}");
}

#[test]
fn weights_of_a_quantized_model_must_be_given() {
    let text = LLAMA_31_8B.replace(
        "\"model_type\"",
        "\"quantization_config\": {\"quant_method\": \"awq\"}, \"model_type\"",
    );
    let err = plan(&input(&text, 80.0, None)).unwrap_err().to_string();
    assert!(
        err.contains("quantization_config") && err.contains("--weights-gib"),
        "{err}"
    );
    assert!(plan(&input(&text, 80.0, Some(5.0))).is_ok());
}

#[test]
fn a_window_below_max_model_len_is_a_warning() {
    let mut i = input(QWEN_25_7B, 80.0, Some(16.0));
    i.lanes[2].context = 40_000;
    let p = run(&i);
    assert_eq!(p.max_model_len, 40_000);
    assert!(
        p.warnings
            .iter()
            .any(|w| w.contains("max_position_embeddings 32768")),
        "{:?}",
        p.warnings
    );
}

fn cap(blocks: u64, max_model_len: u32) -> EngineCapacity {
    EngineCapacity {
        num_gpu_blocks: blocks,
        block_size: 16,
        engines: 1,
        max_model_len,
    }
}

#[test]
fn the_shipped_config_fits_the_reference_engine() {
    // vllm-sim's llama-3.1-8b-h100 profile: 25000 blocks, 400000 tokens.
    assert_eq!(
        overcommit(&Config::default(), &cap(25_000, 16_384)),
        Vec::<String>::new()
    );
}

#[test]
fn a_small_kv_cache_names_the_global_budget() {
    let problems = overcommit(&Config::default(), &cap(2_048, 16_384));
    assert!(
        problems[0].contains("admission.max_tokens_in_flight")
            && problems[0].contains("32768 tokens (2048 blocks x 16)"),
        "{problems:?}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("lanes.large.max_tokens_in_flight (163840)")),
        "{problems:?}"
    );
    // The lanes' sum below the KV cache caps the global budget: no problem.
    let mut c = Config::default();
    c.admission.max_tokens_in_flight = std::num::NonZeroU64::new(1_000_000).unwrap();
    assert_eq!(overcommit(&c, &cap(25_000, 16_384)), Vec::<String>::new());
}

#[test]
fn a_longer_max_model_len_than_the_engines_is_named() {
    let problems = overcommit(&Config::default(), &cap(25_000, 8_192));
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0]
        .starts_with("upstream.max_model_len (16384) is above the engine's max_model_len (8192)"));
}

#[test]
fn fifo_has_no_budget_to_check() {
    let mut c = Config::default();
    c.admission.policy = Policy::Fifo;
    assert_eq!(overcommit(&c, &cap(2_048, 16_384)), Vec::<String>::new());
}

#[test]
fn lane_budgets_summing_past_u64_are_checked_without_overflow() {
    // Three lane budgets near the top of the range (valid on their own): their sum used to
    // overflow (a panic in a debug build, a wrap to a small number in a release one).
    let mut c = Config::default();
    let half = std::num::NonZeroU64::new(u64::MAX / 2).unwrap();
    for lane in [&mut c.lanes.small, &mut c.lanes.medium, &mut c.lanes.large] {
        lane.max_tokens_in_flight = half;
    }
    c.admission.max_tokens_in_flight = std::num::NonZeroU64::new(u64::MAX).unwrap();
    let problems = overcommit(&c, &cap(25_000, 16_384));
    assert!(
        problems
            .iter()
            .any(|p| p.contains("admission.max_tokens_in_flight")),
        "{problems:?}"
    );
}

//! Capacity read from the engine (issue 19, M10): the gateway reads a simulator's KV cache
//! (`vllm:cache_config_info`, sized by `--num-gpu-blocks`) and `/v1/models` `max_model_len`,
//! names the budgets that overcommit it, and `check-config --probe` reports it; the
//! `capacity` planner prints the numbers for a model's `config.json`.

use std::path::PathBuf;

use tokio::process::Command;
use tutor_gateway::capacity::{self, EngineCapacity};
use tutor_gateway::config::{Config, SHIPPED_CONFIG};
use vllm_sim::SimArgs;

/// A scratch directory for this test, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("tg-capacity-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn write(&self, file: &str, text: &str) -> PathBuf {
        let path = self.0.join(file);
        std::fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The shipped config pointed at `url`.
fn shipped_config_at(url: &str) -> String {
    SHIPPED_CONFIG.replace(
        "base_url = \"http://127.0.0.1:8000\"",
        &format!("base_url = \"{url}\""),
    )
}

async fn read(url: &str) -> EngineCapacity {
    let http = capacity::client_for(&Config::default().upstream).unwrap();
    capacity::read_engine_capacity(&http, url).await.unwrap()
}

#[tokio::test]
async fn reads_the_simulators_kv_cache_and_names_the_overcommitted_budget() {
    // 2048 blocks of 16 tokens: 32768 tokens, 12x less than the shipped global budget.
    let sim = vllm_sim::start(&SimArgs::for_test(&["--num-gpu-blocks", "2048"]))
        .await
        .unwrap();
    let cap = read(&sim.url()).await;
    assert_eq!(cap.num_gpu_blocks, 2048);
    assert_eq!(cap.block_size, 16);
    assert_eq!(cap.kv_tokens(), 2048 * 16);
    assert_eq!(cap.max_model_len, 16384);
    let problems = capacity::overcommit(&Config::default(), &cap);
    assert!(
        problems[0].contains("admission.max_tokens_in_flight")
            && problems[0].contains("at most 32768"),
        "{problems:?}"
    );
    // `probe` reads the same and finds the same problems.
    let (read_again, found) = capacity::probe(&Config::default(), &sim.url())
        .await
        .unwrap();
    assert_eq!((read_again, found), (cap, problems));
    sim.shutdown().await;
}

#[tokio::test]
async fn the_shipped_config_fits_the_simulators_default_engine() {
    // The llama-3.1-8b-h100 profile: 25000 blocks, 400000 tokens, as an H100 holds.
    let sim = vllm_sim::start(&SimArgs::for_test(&[])).await.unwrap();
    let cap = read(&sim.url()).await;
    assert_eq!(cap.kv_tokens(), 400_000);
    assert_eq!(
        capacity::overcommit(&Config::default(), &cap),
        Vec::<String>::new()
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn an_engine_with_a_shorter_max_model_len_is_named() {
    let sim = vllm_sim::start(&SimArgs::for_test(&["--max-model-len", "8192"]))
        .await
        .unwrap();
    let cap = read(&sim.url()).await;
    assert_eq!(cap.max_model_len, 8192);
    let problems = capacity::overcommit(&Config::default(), &cap);
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("upstream.max_model_len (16384) is above the engine's")),
        "{problems:?}"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn a_server_without_vllms_metric_is_a_clear_error() {
    // Something at the upstream's address that serves a /metrics page, but not vLLM's.
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(|| async { "process_cpu_seconds_total 1.5\n" }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let http = capacity::client_for(&Config::default().upstream).unwrap();
    let err = capacity::read_engine_capacity(&http, &url)
        .await
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("engine does not export vllm:cache_config_info"),
        "{err:#}"
    );
    server.abort();
}

#[tokio::test]
async fn check_config_probe_reports_the_overcommit() {
    let sim = vllm_sim::start(&SimArgs::for_test(&["--num-gpu-blocks", "2048"]))
        .await
        .unwrap();
    let dir = Scratch::new("probe");
    let path = dir.write("config.toml", &shipped_config_at(&sim.url()));
    let run = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tutor-gateway"));
        cmd.arg("check-config").arg(&path).args(args);
        cmd.output()
    };
    let out = run(&["--probe"]).await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "warnings exit 0: {stdout}");
    assert!(
        stdout.contains("KV cache 32768 tokens (2048 blocks x 16 tokens), max_model_len 16384"),
        "{stdout}"
    );
    assert!(stdout.contains("replica replica-0: KV cache"), "{stdout}");
    // Warnings go to standard error, with the other problems.
    assert!(
        stderr.contains("warning: KV OVERCOMMIT: the gateway may reserve 379040 tokens"),
        "{stderr}"
    );
    // --strict makes it fail.
    let out = run(&["--probe", "--strict"]).await.unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("capacity problem(s) (--strict)"));
    // Without --probe, nothing is contacted and the file is fine.
    let out = run(&[]).await.unwrap();
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stdout).contains("OVERCOMMIT"));
    sim.shutdown().await;
}

/// A short secret left in the environment is the operator's file's problem, never the built-in
/// defaults': with one set, the planner (which starts from the defaults) panicked ("the shipped
/// config/config.toml is valid"), and so did `serve` (its metrics start from them). The
/// operator's own file is still checked with it, and refused naming the key.
#[tokio::test]
async fn a_short_secret_in_the_environment_leaves_the_defaults_alone() {
    let short = [
        ("TUTOR_GATEWAY_ADMIN_TOKEN", "short"),
        ("TUTOR_GATEWAY_TOKEN_SECRET", "short"),
        ("TUTOR_GATEWAY_WEBHOOK_SECRET", "short"),
    ];
    let out = Command::new(env!("CARGO_BIN_EXE_tutor-gateway"))
        .args([
            "capacity",
            "--model",
            "llama-3.1-8b",
            "--gpu-memory-gib",
            "79.6",
        ])
        .envs(short)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = Scratch::new("short-secret");
    let path = dir.write("config.toml", SHIPPED_CONFIG);
    let out = Command::new(env!("CARGO_BIN_EXE_tutor-gateway"))
        .arg("check-config")
        .arg(&path)
        .envs(short)
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let said =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("server.admin_token"), "{said}");
    assert!(!said.contains("panicked"), "{said}");
}

#[tokio::test]
async fn check_config_probe_fails_when_the_engine_is_not_there() {
    // A port where every connection is refused.
    let refused = tutor_testkit::RefusedPort::new();
    let port = refused.port();
    let dir = Scratch::new("down");
    let path = dir.write(
        "config.toml",
        &shipped_config_at(&format!("http://127.0.0.1:{port}")),
    );
    let out = Command::new(env!("CARGO_BIN_EXE_tutor-gateway"))
        .arg("check-config")
        .arg(&path)
        .arg("--probe")
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--probe: replica replica-0"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Two replicas, one of them down: the budgets are the fleet's, so they are not checked
/// against the one that answered (which alone would look overcommitted, with advice to halve
/// them).
#[tokio::test]
async fn check_config_probe_does_not_judge_the_budgets_on_part_of_the_fleet() {
    // 15,000 blocks: 240,000 tokens, under the 379,040 the shipped budgets may reserve; two
    // such replicas hold them.
    let sim = vllm_sim::start(&SimArgs::for_test(&["--num-gpu-blocks", "15000"]))
        .await
        .unwrap();
    let refused = tutor_testkit::RefusedPort::new();
    let dir = Scratch::new("part");
    let text = format!(
        "{}\n[[upstream.replicas]]\nurl = \"{}\"\n[[upstream.replicas]]\nurl = \"{}\"\n",
        SHIPPED_CONFIG.replace("base_url = \"http://127.0.0.1:8000\"", ""),
        sim.url(),
        refused.url()
    );
    let path = dir.write("config.toml", &text);
    let out = Command::new(env!("CARGO_BIN_EXE_tutor-gateway"))
        .arg("check-config")
        .arg(&path)
        .arg("--probe")
        .output()
        .await
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(!out.status.success(), "a replica is down");
    assert!(stdout.contains("replica replica-0: KV cache"), "{stdout}");
    assert!(!stdout.contains("OVERCOMMIT"), "{stdout}");
    assert!(stderr.contains("the budgets were not checked"), "{stderr}");
    sim.shutdown().await;
}

/// meta-llama/Llama-3.1-8B-Instruct's `config.json` (the keys the planner reads).
const LLAMA_31_8B: &str = r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
  "intermediate_size": 14336, "max_position_embeddings": 131072, "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 8, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "vocab_size": 128256}"#;

#[tokio::test]
async fn the_capacity_command_prints_the_plan() {
    let dir = Scratch::new("plan");
    let model = dir.write("config.json", LLAMA_31_8B);
    let plan = |extra: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tutor-gateway"));
        cmd.arg("capacity")
            .arg("--model-config")
            .arg(&model)
            .args("--gpu-memory-gib 80 --weights-gib 16 --overhead-gib 0".split_whitespace())
            .args(extra);
        cmd.output()
    };
    let out = plan(&["--json"]).await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["kv_bytes_per_token"], 131_072);
    assert_eq!(json["kv_tokens"], 458_752);
    assert_eq!(json["max_model_len"], 16_384);
    assert_eq!(json["lanes"][2]["sequences_alone"], 28);
    let out = plan(&[]).await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for line in [
        "KV per token: 131072 bytes (128 KiB) = 32 layers x 8 kv_heads x 128 head_dim x 2 (K, V) x 2 bytes",
        "KV cache:     56.00 GiB = 28672 blocks of 16 tokens = 458752 tokens",
        "--max-model-len 16384",
        "[admission]\nseats = ",
    ] {
        assert!(text.contains(line), "{line:?} not in\n{text}");
    }
    // A config.json without a key the formula needs names it.
    let broken = dir.write(
        "broken.json",
        &LLAMA_31_8B
            .replace("\"num_key_value_heads\": 8, ", "")
            .replace("\"num_hidden_layers\": 32, ", ""),
    );
    let out = Command::new(env!("CARGO_BIN_EXE_tutor-gateway"))
        .args(["capacity", "--gpu-memory-gib", "80", "--model-config"])
        .arg(&broken)
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("missing `num_hidden_layers`"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn the_watch_reports_every_read_against_the_current_config() {
    let sim = vllm_sim::start(&SimArgs::for_test(&["--num-gpu-blocks", "2048"]))
        .await
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut config = Config::default();
    config.upstream.base_url = sim.url();
    let config = std::sync::Arc::new(config);
    let watch = tokio::spawn(capacity::watch(
        std::time::Duration::from_millis(20),
        move || config.clone(),
        move |replica: &tutor_gateway::config::ReplicaConfig, cap: &EngineCapacity| {
            let _ = tx.send((replica.name.clone(), *cap));
        },
    ));
    for _ in 0..2 {
        let (name, cap) = rx.recv().await.expect("a read");
        assert_eq!((name.as_str(), cap.kv_tokens()), ("replica-0", 32768));
    }
    watch.abort();
    sim.shutdown().await;
}

/// A reload that adds or moves a replica has its KV read at once, not a whole interval later
/// (the seats are spread by these reads): here the interval is an hour.
#[tokio::test]
async fn the_watch_reads_a_reloaded_fleet_at_once() {
    let first = vllm_sim::start(&SimArgs::for_test(&["--num-gpu-blocks", "2048"]))
        .await
        .unwrap();
    let second = vllm_sim::start(&SimArgs::for_test(&["--num-gpu-blocks", "1024"]))
        .await
        .unwrap();
    let at = |url: String| {
        let mut config = Config::default();
        config.upstream.base_url = url;
        std::sync::Arc::new(config)
    };
    let in_force = std::sync::Arc::new(std::sync::Mutex::new(at(first.url())));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let current = in_force.clone();
    let watch = tokio::spawn(capacity::watch(
        std::time::Duration::from_secs(3600),
        move || current.lock().unwrap().clone(),
        move |_: &tutor_gateway::config::ReplicaConfig, cap: &EngineCapacity| {
            let _ = tx.send(cap.kv_tokens());
        },
    ));
    assert_eq!(rx.recv().await, Some(32768), "the first engine, at start");
    *in_force.lock().unwrap() = at(second.url());
    // The bound only fails the test instead of hanging it (the interval is an hour).
    let next = tokio::time::timeout(std::time::Duration::from_secs(120), rx.recv()).await;
    assert_eq!(next, Ok(Some(16384)), "the reloaded engine, read at once");
    watch.abort();
    first.shutdown().await;
    second.shutdown().await;
}

#[tokio::test]
async fn bundled_models_plan_without_a_file_and_match_their_published_shapes() {
    // (name, KV bytes per token in bf16: layers x kv_heads x head_dim x 2 x 2)
    for (name, kv_bytes) in [
        ("llama-3.1-8b", 32 * 8 * 128 * 4),
        ("llama-3.1-70b", 80 * 8 * 128 * 4),
        ("qwen2.5-7b", 28 * 4 * 128 * 4),
        ("qwen2.5-32b", 64 * 8 * 128 * 4),
        ("mistral-7b", 32 * 8 * 128 * 4),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_tutor-gateway"))
            .args([
                "capacity",
                "--model",
                name,
                "--gpu-memory-gib",
                "320",
                "--json",
            ])
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: {stderr}");
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(json["kv_bytes_per_token"], kv_bytes, "{name}");
    }
    // The same plan as from the file itself.
    let dir = Scratch::new("bundled");
    let model = dir.write("config.json", LLAMA_31_8B);
    let run = |how: Vec<String>| async move {
        Command::new(env!("CARGO_BIN_EXE_tutor-gateway"))
            .arg("capacity")
            .args(how)
            .args(["--gpu-memory-gib", "80", "--json"])
            .output()
            .await
            .unwrap()
            .stdout
    };
    assert_eq!(
        run(vec!["--model".into(), "llama-3.1-8b".into()]).await,
        run(vec!["--model-config".into(), model.display().to_string()]).await
    );
    // An unknown name lists the bundled ones.
    let out = Command::new(env!("CARGO_BIN_EXE_tutor-gateway"))
        .args(["capacity", "--model", "gpt-5", "--gpu-memory-gib", "80"])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("qwen2.5-32b") && stderr.contains("--model-config"),
        "{stderr}"
    );
}

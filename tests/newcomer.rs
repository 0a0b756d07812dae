//! What a new user hits in the first hour (issue 32, item 5), each as the user sees it: every
//! response carries an `x-request-id`; a port in use is named; logs written to a file or pipe
//! carry no colour codes; the binary run away from the repository says how to find a config;
//! `check-config` lists every problem at once.

mod common;

use std::process::{Command, Stdio};

use common::{client, harness};

const SIM: &[&str] = &["--speed", "20"];

/// A fresh directory under the system's temp dir, removed when dropped.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("tg-newcomer-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn gateway_bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tutor-gateway"))
}

#[tokio::test]
async fn every_response_carries_an_x_request_id() {
    let h = harness(SIM, |_| {}).await;
    let c = client();
    let mut seen = std::collections::HashSet::new();
    for (method, path) in [
        ("GET", "/healthz"),
        ("GET", "/readyz"),
        ("GET", "/v1/models"),
        ("GET", "/metrics"),
        ("GET", "/version"),
        ("GET", "/jobs/no-such-job"),
        ("DELETE", "/jobs/no-such-job"),
        ("POST", "/jobs"),
        ("GET", "/no/such/route"),
        ("GET", "/answer?prompt=hi&max_output_tokens=4"),
        ("POST", "/v1/chat/completions"),
    ] {
        let request = match method {
            "GET" => c.get(h.url(path)),
            "DELETE" => c.delete(h.url(path)),
            _ => c
                .post(h.url(path))
                .header("content-type", "application/json")
                .body("{not json"),
        };
        let resp = request.send().await.unwrap();
        let status = resp.status();
        let id = resp
            .headers()
            .get("x-request-id")
            .unwrap_or_else(|| panic!("{method} {path} ({status}) has no x-request-id"))
            .to_str()
            .unwrap()
            .to_owned();
        assert!(!id.is_empty(), "{method} {path}");
        assert!(seen.insert(id), "{method} {path}: an id used twice");
        let _ = resp.bytes().await;
    }
    h.shutdown().await;
}

/// A config file in a temporary directory: the shipped defaults, the heuristic tokenizer, and
/// `listen` at `addr`.
fn config_file(dir: &std::path::Path, addr: &str) -> std::path::PathBuf {
    let path = dir.join("gateway.toml");
    std::fs::write(
        &path,
        format!("listen = \"{addr}\"\n[classify]\ntokenizer = \"heuristic\"\n"),
    )
    .unwrap();
    path
}

#[test]
fn a_port_in_use_is_named_and_logs_to_a_pipe_have_no_colour() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = Scratch::new("port");
    let config = config_file(dir.path(), &addr);
    // With the bundled simulator, so that something is logged before the bind fails.
    let out = gateway_bin()
        .args(["serve", "--with-sim", "--config"])
        .arg(&config)
        .env_remove("NO_COLOR")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot listen on {addr}")),
        "the address is named: {stderr}"
    );
    assert!(stderr.contains("INFO"), "something was logged: {stderr}");
    assert!(
        !stderr.contains('\u{1b}'),
        "no ANSI codes in a pipe: {stderr:?}"
    );
    drop(taken);
}

/// `--sim-arg` configures the bundled simulator only: without `--with-sim` it was ignored and
/// the gateway started against the configured engine, the user believing `--speed 10` was in
/// force. Now a usage error (exit 2) naming `--with-sim`.
#[test]
fn a_simulator_flag_without_the_simulator_is_a_usage_error() {
    let out = gateway_bin()
        .args(["serve", "--sim-arg=--speed", "--sim-arg=10"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--with-sim"), "{stderr}");
}

#[test]
fn run_away_from_the_repository_the_binary_points_at_config() {
    let elsewhere = Scratch::new("elsewhere");
    let out = gateway_bin()
        .arg("serve")
        .current_dir(elsewhere.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("--config"), "a hint at --config: {stderr}");
    assert!(stderr.contains("config/config.toml"), "{stderr}");
}

/// check-config says what it read, and never a password written into the upstream's URL.
#[test]
fn check_config_prints_no_credentials_of_the_upstream_url() {
    let dir = Scratch::new("creds");
    let path = dir.path().join("creds.toml");
    std::fs::write(
        &path,
        "[classify]\ntokenizer = \"heuristic\"\n[upstream]\n\
         base_url = \"http://user:UPSTREAMPASS@127.0.0.1:8000\"\n",
    )
    .unwrap();
    let out = gateway_bin()
        .arg("check-config")
        .arg(&path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("http://***@127.0.0.1:8000"), "{stdout}");
    assert!(
        !stdout.contains("UPSTREAMPASS") && !stdout.contains("user:"),
        "{stdout}"
    );
}

/// A setting allowed but seldom meant is told on standard error, naming its keys, and the
/// file still passes (exit 0).
#[test]
fn check_config_warns_of_what_is_allowed_but_seldom_meant() {
    let dir = Scratch::new("advice");
    let path = dir.path().join("advice.toml");
    std::fs::write(
        &path,
        "[classify]\ntokenizer = \"heuristic\"\nsmall_max_work = 512\n\
         default_output_tokens = 512\n",
    )
    .unwrap();
    let out = gateway_bin()
        .arg("check-config")
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning: classify.default_output_tokens (512)"),
        "{stderr}"
    );
}

#[test]
fn check_config_lists_every_problem_at_once() {
    let dir = Scratch::new("check");
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[classify]\ntokenizer = \"heuristic\"\n[lanes.small]\nmax_concurency = 8\n\
         queue_len = \"ten\"\n[server]\nmax_body_bytez = 1\n[telemetri]\n",
    )
    .unwrap();
    let out = gateway_bin()
        .arg("check-config")
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    for key in [
        "lanes.small.max_concurency",
        "lanes.small.queue_len",
        "server.max_body_bytez",
        "telemetri",
    ] {
        assert!(stderr.contains(key), "{key} is reported: {stderr}");
    }
    assert!(stderr.contains("4 problem(s)"), "{stderr}");
    // Text that is not TOML is named by its file too, with the line.
    std::fs::write(
        &path,
        "[classify]\ntokenizer = \"heuristic\"\n[lanes.small\n",
    )
    .unwrap();
    let out = gateway_bin()
        .arg("check-config")
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.starts_with(&format!(
            "{}: config is not valid TOML at line 3",
            path.display()
        )),
        "{stderr}"
    );
}

/// check-config builds what `serve` builds from the files a config names: a file that exists
/// but is no tokenizer, or no PEM pair, fails the check as it fails the start; and the admin
/// listener must not be the public one.
#[test]
fn check_config_fails_where_serve_would() {
    let dir = Scratch::new("build");
    let junk = dir.path().join("junk.txt");
    std::fs::write(&junk, "not a tokenizer, not PEM\n").unwrap();
    let check = |name: &str, toml: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, toml).unwrap();
        let out = gateway_bin()
            .arg("check-config")
            .arg(&path)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let junk = junk.display();
    let (ok, stderr) = check("tok.toml", format!("[classify]\ntokenizer = \"{junk}\"\n"));
    assert!(!ok && stderr.contains("classify.tokenizer"), "{stderr}");
    let (ok, stderr) = check(
        "tls.toml",
        format!(
            "[classify]\ntokenizer = \"heuristic\"\n[server]\ntls_cert = \"{junk}\"\n\
             tls_key = \"{junk}\"\n"
        ),
    );
    assert!(!ok && stderr.contains("server.tls_cert"), "{stderr}");
    let (ok, stderr) = check(
        "admin.toml",
        "listen = \"127.0.0.1:8080\"\n[classify]\ntokenizer = \"heuristic\"\n\
         [server]\nadmin_listen = \"127.0.0.1:8080\"\n"
            .into(),
    );
    assert!(!ok && stderr.contains("server.admin_listen"), "{stderr}");
    // The flag `serve` takes names the file too.
    let out = gateway_bin()
        .args(["check-config", "--config"])
        .arg(dir.path().join("admin.toml"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("server.admin_listen"));
}

/// The repository's own files that name other files: the shipped config, the README, the guides.
fn documents() -> Vec<std::path::PathBuf> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs = vec![root.join("config/config.toml"), root.join("README.md")];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                docs.push(path);
            }
        }
    }
    docs
}

/// Repository paths named in `text` (`docs/…`, `config/…`, `src/…`, …), without a trailing
/// `:line`, `#anchor` or punctuation. A path in another project is named with its owner
/// (`vLLM's docs/…`) and skipped.
fn named_paths(text: &str) -> Vec<String> {
    const ROOTS: &[&str] = &[
        "docs/",
        "config/",
        "scripts/",
        "src/",
        "tests/",
        "deploy/",
        "sim/",
        "loadtest/",
        "testkit/",
        "benches/",
        "lua/",
        "web/",
        ".ci/",
    ];
    let mut found = Vec::new();
    let mut previous = "";
    for word in text.split(|c: char| c.is_whitespace() || "`'\"()[]<>,;|".contains(c)) {
        let word = word.trim_start_matches("./");
        // `vLLM's docs/…` splits at the apostrophe: the word before is `s`.
        let foreign = previous == "s" || previous.ends_with("'s");
        if !word.is_empty() {
            previous = word;
        }
        if foreign || !ROOTS.iter().any(|r| word.starts_with(r)) {
            continue;
        }
        let word = word.split(['#', ':']).next().unwrap_or(word);
        let word = word.trim_end_matches(['.', ',', ')', '!', '?']);
        // Globs and placeholders name no one file.
        if word.contains(['{', '$', '…', '<', '*']) {
            continue;
        }
        found.push(word.to_owned());
    }
    found
}

#[test]
fn every_file_the_docs_and_the_config_name_exists() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut missing = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        for path in named_paths(&text) {
            checked += 1;
            if !root.join(&path).exists() {
                missing.push(format!(
                    "{} names {path}",
                    doc.strip_prefix(root).unwrap().display()
                ));
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} paths found: the scan is broken"
    );
    assert!(missing.is_empty(), "named but missing: {missing:#?}");
}

#[test]
fn every_section_the_config_points_at_exists() {
    // `"Section title" in docs/operations.md`: that guide has a heading with that title.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = std::fs::read_to_string(root.join("config/config.toml")).unwrap();
    let guide = std::fs::read_to_string(root.join("docs/operations.md")).unwrap();
    let headings: Vec<&str> = guide.lines().filter(|l| l.starts_with('#')).collect();
    let flat = config.replace("\n# ", " ");
    let mut pointed = 0;
    let mut missing = Vec::new();
    for (i, _) in flat.match_indices("\" in docs/operations.md") {
        let Some(open) = flat[..i].rfind('"') else {
            continue;
        };
        let title = &flat[open + 1..i];
        pointed += 1;
        if !headings.iter().any(|h| h.contains(title)) {
            missing.push(title.to_owned());
        }
    }
    assert!(
        pointed > 3,
        "only {pointed} pointers found: the scan is broken"
    );
    assert!(
        missing.is_empty(),
        "sections named but not in the guide: {missing:#?}"
    );
}

/// `serve --with-sim --sim-arg=--port --sim-arg=N`: the bundled simulator takes the user's port
/// (a flag given twice was refused, and the gateway did not start); the model's name and length
/// come from the gateway's config, and a flag for them says so.
#[tokio::test]
async fn a_bundled_simulator_takes_the_users_port_and_says_where_the_model_is_set() {
    let strings = |args: &[&str]| args.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut config = tutor_gateway::config::Config::default();
    for flag in ["--max-model-len=4096", "--served-model-name"] {
        let refused = tutor_gateway::server::start_sim(&mut config, &strings(&[flag, "x"])).await;
        let message = format!("{:#}", refused.expect_err("refused"));
        assert!(message.contains("upstream."), "{message}");
    }
    // A production file's replicas are set aside: they take precedence over `base_url`, so
    // every request went to the real engines while the log named the simulator.
    let real = tutor_gateway::config::ReplicaConfig::single("http://10.0.0.7:8000");
    config.upstream.replicas = vec![real.clone(), real];
    let port = tutor_testkit::free_port();
    let sim =
        tutor_gateway::server::start_sim(&mut config, &strings(&["--port", &port.to_string()]))
            .await
            .expect("the simulator starts on the user's port");
    assert_eq!(config.upstream.base_url, format!("http://127.0.0.1:{port}"));
    assert_eq!(
        config.upstream.replica_set(),
        [tutor_gateway::config::ReplicaConfig::single(
            &config.upstream.base_url
        )]
    );
    let models = client()
        .get(format!("{}/v1/models", config.upstream.base_url))
        .send()
        .await
        .unwrap()
        .json::<serde_json::Value>()
        .await
        .unwrap();
    assert_eq!(
        models["data"][0]["id"],
        config.upstream.model.as_str(),
        "{models}"
    );
    sim.shutdown().await;
}

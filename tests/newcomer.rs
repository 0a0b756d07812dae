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
}

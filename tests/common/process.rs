//! A gateway process started from the built binary (`tutor-gateway serve`), killed on drop
//! (also when a test fails): for tests that need a real process (signals, exit-time flushes,
//! the OTLP exporters).

use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use super::client;

pub struct GatewayProcess {
    pub child: Child,
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    /// Its temporary folder (removed on drop).
    pub dir: std::path::PathBuf,
    /// The config file it was started with (`dir/config.toml`).
    pub path: std::path::PathBuf,
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl GatewayProcess {
    /// Starts `tutor-gateway serve` on a port it picks itself (`listen` port 0: a port chosen
    /// here and released would race the other tests' listeners, and once did) with the config
    /// text `rest` after its `listen` line and the environment `env` (the OTLP variables of the
    /// machine removed, so only the config speaks), reads the port from its start-up line and
    /// waits until it answers `/healthz`. `tag` names its temporary folder.
    pub async fn start(tag: &str, rest: &str, env: &[(&str, &str)]) -> Self {
        Self::start_limited(tag, rest, env, None).await
    }

    /// [`GatewayProcess::start`] with its open-file limit (`ulimit -n`) set to `files`.
    pub async fn start_limited(
        tag: &str,
        rest: &str,
        env: &[(&str, &str)],
        files: Option<u64>,
    ) -> Self {
        static STARTED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("tg-{tag}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.toml");
        std::fs::write(&path, listen(rest)).unwrap();
        let log = std::fs::File::create(dir.join("gateway.log")).unwrap();
        let binary = env!("CARGO_BIN_EXE_tutor-gateway");
        let mut command = match files {
            None => Command::new(binary),
            Some(files) => {
                let mut c = Command::new("bash");
                c.args(["-c", "ulimit -n \"$1\" && exec \"$0\" \"${@:2}\""])
                    .arg(binary)
                    .arg(files.to_string());
                c
            }
        };
        let child = command
            .args(["serve", "--config"])
            .arg(&path)
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_PROTOCOL")
            .env_remove("OTEL_SDK_DISABLED")
            // The start-up line says the port it picked (a test may still ask for more).
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("the gateway binary starts");
        let mut p = Self {
            child,
            url: String::new(),
            dir,
            path,
        };
        let mut port = None;
        for _ in 0..1500 {
            port = bound_port(&p.log());
            if port.is_some() {
                break;
            }
            if let Some(status) = p.child.try_wait().unwrap() {
                panic!(
                    "the gateway exited ({status}) before listening:\n{}",
                    p.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let Some(port) = port else {
            panic!("the gateway did not say where it listens:\n{}", p.log());
        };
        p.url = format!("http://127.0.0.1:{port}");
        for _ in 0..500 {
            if let Ok(r) = client().get(format!("{}/healthz", p.url)).send().await {
                if r.status().is_success() {
                    return p;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the gateway did not come up on {}:\n{}", p.url, p.log());
    }

    /// A config file's text for this process: its `listen` line, then `rest` (as
    /// [`GatewayProcess::start`] wrote it), for a test that rewrites the file.
    pub fn config_text(&self, rest: &str) -> String {
        listen(rest)
    }

    /// `http://127.0.0.1:<port>` of the admin listener, for a config with `server.admin_listen =
    /// "127.0.0.1:0"` (the process picks the port; its start-up line says which). Waits 30 s at
    /// most for that line.
    pub async fn admin_url(&self) -> String {
        for _ in 0..1500 {
            if let Some(port) = logged_port(&self.log(), "admin listener (/metrics, /readyz)") {
                return format!("http://127.0.0.1:{port}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!(
            "the gateway did not say where its admin listener is:\n{}",
            self.log()
        );
    }

    /// A real SIGHUP (reload the config file).
    pub fn sighup(&self) {
        let status = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -HUP failed");
    }

    /// What the process wrote to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("gateway.log")).unwrap_or_default()
    }

    /// SIGKILL: no shutdown, no release, no hand-back.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// A real SIGTERM.
    pub fn sigterm(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -TERM failed");
    }

    /// Waits (30 s at most) for the process to exit.
    pub async fn exited(&mut self) -> ExitStatus {
        for _ in 0..1500 {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the gateway did not exit after SIGTERM:\n{}", self.log());
    }
}

/// The `listen` line (port 0: the process picks one), then `rest`.
fn listen(rest: &str) -> String {
    format!("listen = \"127.0.0.1:0\"\n{rest}")
}

/// The port of the start-up line `tutor-gateway listening` (`addr=127.0.0.1:<port>`) in `log`.
fn bound_port(log: &str) -> Option<u16> {
    logged_port(log, "tutor-gateway listening")
}

/// The port in the `addr=127.0.0.1:<port>` field of the first line of `log` that says `what`.
fn logged_port(log: &str, what: &str) -> Option<u16> {
    let line = log.lines().find(|l| l.contains(what))?;
    let at = line.find("addr=127.0.0.1:")? + "addr=127.0.0.1:".len();
    let digits: String = line[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

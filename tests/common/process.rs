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
    port: u16,
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl GatewayProcess {
    /// Starts `tutor-gateway serve` on a free port with the config text `rest` after its
    /// `listen` line and the environment `env` (the OTLP variables of the machine removed, so
    /// only the config speaks), and waits until it answers `/healthz`. `tag` names its
    /// temporary folder.
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
        let port = tutor_testkit::free_port();
        let dir = std::env::temp_dir().join(format!("tg-{tag}-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.toml");
        std::fs::write(&path, listen(port, rest)).unwrap();
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
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("the gateway binary starts");
        let p = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            dir,
            path,
            port,
        };
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
        listen(self.port, rest)
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

/// The `listen` line on `port`, then `rest`.
fn listen(port: u16, rest: &str) -> String {
    format!("listen = \"127.0.0.1:{port}\"\n{rest}")
}

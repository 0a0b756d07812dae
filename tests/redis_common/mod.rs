//! A throwaway `redis-server` on a free port, killed on drop (integration tests, benches).
#![allow(dead_code, missing_docs)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tutor_testkit::free_port;

pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    /// TLS only (`rediss://`), with the test CA's server certificate.
    tls: bool,
}

/// The test CA (`tests/fixtures/tls/ca.pem`), which signed the TLS server's certificate.
pub fn test_ca() -> Vec<u8> {
    std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/tls/ca.pem"
    ))
    .unwrap()
}

impl RedisServer {
    /// Starts `redis-server` without persistence on a free port and waits until it answers.
    pub fn start() -> Self {
        let mut server = Self {
            port: free_port(),
            child: None,
            tls: false,
        };
        server.restart();
        server
    }

    /// [`RedisServer::start`] speaking TLS only, with a certificate for 127.0.0.1 that the
    /// test CA signed ([`test_ca`]).
    pub fn start_tls() -> Self {
        let mut server = Self {
            port: free_port(),
            child: None,
            tls: true,
        };
        server.restart();
        server
    }

    pub fn url(&self) -> String {
        if self.tls {
            format!("rediss://127.0.0.1:{}/0", self.port)
        } else {
            format!("redis://127.0.0.1:{}/0", self.port)
        }
    }

    /// A client for this server (trusting the test CA when it speaks TLS).
    pub fn client(&self) -> redis::Client {
        if self.tls {
            redis::Client::build_with_tls(
                self.url(),
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(test_ca()),
                },
            )
            .unwrap()
        } else {
            redis::Client::open(self.url()).unwrap()
        }
    }

    /// Kills the server (like a crash); its data is gone.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port, empty.
    pub fn restart(&mut self) {
        self.stop();
        let tls = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tls");
        let mut command = Command::new("redis-server");
        if self.tls {
            command
                .args(["--port", "0", "--tls-port", &self.port.to_string()])
                .args(["--tls-cert-file", &format!("{tls}/server.pem")])
                .args(["--tls-key-file", &format!("{tls}/server.key")])
                .args(["--tls-ca-cert-file", &format!("{tls}/ca.pem")])
                .args(["--tls-auth-clients", "no"]);
        } else {
            command.args(["--port", &self.port.to_string()]);
        }
        let child = command
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed (scripts/test installs it)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            {
                let client = self.client();
                if let Ok(mut conn) = client.get_connection() {
                    if redis::cmd("PING").query::<String>(&mut conn).is_ok() {
                        return;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server did not start on port {}", self.port);
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

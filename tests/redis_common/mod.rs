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
        Self::start_on_a_free_port(false)
    }

    /// [`RedisServer::start`] speaking TLS only, with a certificate for 127.0.0.1 that the
    /// test CA signed ([`test_ca`]).
    pub fn start_tls() -> Self {
        Self::start_on_a_free_port(true)
    }

    /// A port picked and released may be taken by another test before the server binds it:
    /// then the server exits, and another port is tried.
    fn start_on_a_free_port(tls: bool) -> Self {
        for _ in 0..10 {
            let mut server = Self {
                port: free_port(),
                child: None,
                tls,
            };
            if server.spawn() {
                return server;
            }
        }
        panic!("redis-server could not listen on any of ten free ports");
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

    /// Starts it again on the same port, empty (retrying while the port is still taken: for up
    /// to 30 s, as a loaded machine may be slow to release it).
    pub fn restart(&mut self) {
        for _ in 0..300 {
            if self.spawn() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("redis-server could not listen again on port {}", self.port);
    }

    /// Starts the server on `self.port` and waits until it answers; false when it exited
    /// first (its port was taken). Only an answer from this very process counts (`INFO`'s
    /// `process_id`), never one from another server that holds the port.
    fn spawn(&mut self) -> bool {
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
        let pid = child.id();
        self.child = Some(child);
        let ours = format!("process_id:{pid}\r\n");
        // A loaded machine may take a while to start a process.
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if child.try_wait().ok().flatten().is_some() {
                    self.child = None;
                    return false;
                }
            }
            {
                let client = self.client();
                // Bounded: whatever holds the port may accept and never answer.
                let bound = Duration::from_secs(2);
                if let Ok(mut conn) = client.get_connection_with_timeout(bound) {
                    let _ = conn.set_read_timeout(Some(bound));
                    let info = redis::cmd("INFO").arg("server").query::<String>(&mut conn);
                    if info.is_ok_and(|info| info.contains(&ours)) {
                        return true;
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

/// Waits (20 s at most) until the shared quota under the default key prefix holds no seat and
/// no token (every lease given back or reaped).
pub async fn quota_drains(redis: &RedisServer) {
    let mut conn = redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    for _ in 0..1000 {
        let usage: std::collections::HashMap<String, i64> = redis::cmd("HGETALL")
            .arg("tg:v2:{quota}:usage")
            .query_async(&mut conn)
            .await
            .unwrap();
        if usage.values().all(|v| *v == 0) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the shared quota never drained");
}

/// Leases held in Redis under the default key prefix.
pub async fn leases(conn: &mut redis::aio::MultiplexedConnection) -> i64 {
    redis::cmd("HLEN")
        .arg("tg:v2:{quota}:leases")
        .query_async(conn)
        .await
        .unwrap()
}

/// Marks lease `id` expired by Redis's clock (its score in the `expiry` ZSET set to 1 ms, the
/// lease itself left): the next renewal's reap takes it, as when Redis's clock ran ahead or the
/// replica renewed too late.
pub async fn expire_lease(conn: &mut redis::aio::MultiplexedConnection, expiry: &str, id: &str) {
    let _: () = redis::cmd("ZADD")
        .arg(expiry)
        .arg("XX")
        .arg(1)
        .arg(id)
        .query_async(conn)
        .await
        .unwrap();
}

/// Holds every write (scripts included; reads go on) until `CLIENT UNPAUSE`, or 10 s.
pub async fn pause_writes(conn: &mut redis::aio::MultiplexedConnection) {
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(10_000)
        .arg("WRITE")
        .query_async(conn)
        .await
        .unwrap();
}

/// The `CLIENT LIST` line of the client whose script waits on a `CLIENT PAUSE <ms> WRITE`, once
/// one does (polled, bounded: a hang fails, nothing is timed).
pub async fn paused_script(conn: &mut redis::aio::MultiplexedConnection) -> String {
    for _ in 0..3_000 {
        let clients: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query_async(conn)
            .await
            .unwrap();
        let waiting = clients
            .lines()
            .find(|c| c.contains(" flags=b ") && c.contains(" cmd=evalsha "));
        if let Some(line) = waiting {
            return line.to_owned();
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("no script reached Redis");
}

/// The `CLIENT LIST` line of the client `line` (a line of an earlier list) names, while it is
/// connected.
pub async fn client_line(
    conn: &mut redis::aio::MultiplexedConnection,
    line: &str,
) -> Option<String> {
    let id = line.split(' ').next()?.to_owned() + " ";
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(conn)
        .await
        .unwrap();
    clients
        .lines()
        .find(|c| c.starts_with(&id))
        .map(str::to_owned)
}

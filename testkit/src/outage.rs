//! [`Outage`]: a TCP forwarder that can cut every connection and refuse new ones, in front of a
//! server that itself keeps running (a network outage, an engine that went away and came back).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Forwards connections on its own port to `127.0.0.1:<target>` while up; [`Outage::cut`]
/// drops the open ones and closes each new one at once, [`Outage::restore`] forwards again.
pub struct Outage {
    port: u16,
    up: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl Outage {
    /// A forwarder to `target` on a port of its own (up).
    pub async fn new(target: u16) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let up = Arc::new(AtomicBool::new(true));
        let conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let (on, held) = (up.clone(), conns.clone());
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !on.load(Ordering::Acquire) {
                    continue;
                }
                let task = tokio::spawn(async move {
                    if let Ok(mut out) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await
                    {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    }
                });
                held.lock().unwrap().push(task.abort_handle());
            }
        });
        Self { port, up, conns }
    }

    /// The forwarder's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Drops every open connection and closes new ones at once.
    pub fn cut(&self) {
        self.up.store(false, Ordering::Release);
        for c in self.conns.lock().unwrap().drain(..) {
            c.abort();
        }
    }

    /// Forwards again.
    pub fn restore(&self) {
        self.up.store(true, Ordering::Release);
    }
}

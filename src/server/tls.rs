//! Inbound TLS (`server.tls_cert`, `server.tls_key`): the acceptor the accept loop wraps each
//! connection in, re-read when the files change (checked every [`RELOAD_EVERY`]), so a renewed
//! certificate is served without a restart. A pair that cannot be loaded keeps the one in force
//! (logged). ALPN offers HTTP/2 and HTTP/1.1.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// How often the certificate and key files are checked for changes.
pub const RELOAD_EVERY: Duration = Duration::from_secs(2);

/// The current acceptor, swapped when the files change. Cheap to clone.
#[derive(Clone)]
pub struct TlsFront {
    acceptor: Arc<RwLock<TlsAcceptor>>,
}

impl std::fmt::Debug for TlsFront {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsFront")
    }
}

/// The files' modification times and lengths, to notice a change.
fn stamp(cert: &Path, key: &Path) -> Option<((SystemTime, u64), (SystemTime, u64))> {
    // The length too: a file truncated and written again within one tick of the file
    // system's clock keeps its modification time.
    let m = |p: &Path| {
        std::fs::metadata(p)
            .and_then(|m| Ok((m.modified()?, m.len())))
            .ok()
    };
    Some((m(cert)?, m(key)?))
}

/// An acceptor for the PEM certificate chain at `cert` and private key at `key`.
pub fn load(cert: &Path, key: &Path) -> anyhow::Result<TlsAcceptor> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("server.tls_cert {}", cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("server.tls_cert {}", cert.display()))?;
    anyhow::ensure!(!certs.is_empty(), "server.tls_cert holds no certificate");
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("server.tls_key {}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("server.tls_cert and server.tls_key do not make a pair")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

impl TlsFront {
    /// Loads the pair now (an error stops the start) and re-reads it on change until `stop`.
    pub fn start(cert: PathBuf, key: PathBuf, stop: CancellationToken) -> anyhow::Result<Self> {
        let front = TlsFront {
            acceptor: Arc::new(RwLock::new(load(&cert, &key)?)),
        };
        let swap = front.clone();
        tokio::spawn(async move {
            let mut seen = stamp(&cert, &key);
            // The pair whose failure was logged: retried at every look (a read may fail for a
            // moment), logged once per change.
            let mut warned = None;
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(RELOAD_EVERY) => {}
                }
                // Reading the files and building the TLS config is blocking work (a slow or
                // network mount): off the async workers.
                let (c, k, before) = (cert.clone(), key.clone(), seen);
                let Ok((now, loaded)) = tokio::task::spawn_blocking(move || {
                    let now = stamp(&c, &k);
                    let changed = now.is_some() && now != before;
                    (now, changed.then(|| load(&c, &k)))
                })
                .await
                else {
                    continue;
                };
                let Some(loaded) = loaded else {
                    continue;
                };
                match loaded {
                    Ok(acceptor) => {
                        *swap.acceptor.write().unwrap_or_else(|e| e.into_inner()) = acceptor;
                        seen = now;
                        tracing::info!("TLS certificate reloaded");
                    }
                    Err(_) if warned == now => {}
                    Err(e) => {
                        warned = now;
                        tracing::warn!(error = %format!("{e:#}"), "TLS certificate not reloaded; keeping the one in force")
                    }
                }
            }
        });
        Ok(front)
    }

    /// The acceptor in force.
    pub fn acceptor(&self) -> TlsAcceptor {
        self.acceptor
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

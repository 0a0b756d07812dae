//! Wiring and serving: build the state from a [`Config`], serve the routes, shut down cleanly.
//!
//! Connections are accepted by [`accept`] (connection limit, header timeout). Shutdown
//! (SIGTERM, Ctrl-C, or [`Gateway::shutdown`]): stop accepting, let in-flight streams
//! finish for `server.shutdown_grace`, then drop the rest (their relays abort the engine work),
//! and wait a bounded time for the spawned abort calls.

use std::net::SocketAddr;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admission::Admission;
use crate::api::{admin, app, AppState, Jobs};
use crate::classify::Classifier;
use crate::config::{Config, RequestLogSink};
use crate::telemetry::{Metrics, RequestLog};
use crate::upstream::{UpstreamClient, ABORT_TIMEOUT};

mod accept;
pub mod tls;

pub use accept::H2_MAX_STREAMS;

/// A running gateway.
#[derive(Debug)]
pub struct Gateway {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Where the admin listener (`server.admin_listen`) listens, when set.
    pub admin_addr: Option<SocketAddr>,
    /// Its state (admission counters, metrics), for tests and the soak check.
    pub state: AppState,
    stop: CancellationToken,
    tasks: TaskTracker,
    serve: JoinHandle<()>,
    admin: Option<JoinHandle<()>>,
}

/// Builds the handlers' state from `config`; spawned abort calls go on `tasks`.
pub fn build_state(config: Config, tasks: TaskTracker) -> anyhow::Result<AppState> {
    let request_log = match config.telemetry.request_log {
        RequestLogSink::Stdout => RequestLog::Stdout,
        RequestLogSink::Off => RequestLog::Off,
    };
    build_state_with_log(config, tasks, request_log)
}

/// [`build_state`] with the request log going to `request_log` instead of the configured sink.
pub fn build_state_with_log(
    config: Config,
    tasks: TaskTracker,
    request_log: RequestLog,
) -> anyhow::Result<AppState> {
    let classifier = Classifier::from_config(&config).context("classifier")?;
    let metrics = Metrics::new();
    metrics.prefix().configure(&config.prefix_cache);
    let admission = Admission::build(&config, metrics.quota().clone()).context("quota backend")?;
    let upstream =
        UpstreamClient::new(config.upstream.clone(), tasks).context("upstream client")?;
    Ok(AppState::new(
        config,
        classifier,
        admission,
        upstream,
        metrics,
        request_log,
    ))
}

/// Serves `config` on `listener` in the background.
pub fn start(config: Config, listener: TcpListener) -> anyhow::Result<Gateway> {
    let tasks = TaskTracker::new();
    let state = build_state(config, tasks.clone())?;
    serve_state(state, tasks, listener)
}

/// Serves an already built state (tests inject an in-memory request log this way).
pub fn serve_state(
    state: AppState,
    tasks: TaskTracker,
    listener: TcpListener,
) -> anyhow::Result<Gateway> {
    let addr = listener.local_addr()?;
    let stop = CancellationToken::new();
    let jobs = Jobs::start(state.clone(), stop.clone(), tasks.clone());
    let auth = crate::api::auth::Auth::start(&state.config().auth, stop.clone());
    let router = app(state.clone(), jobs, auth);
    let grace = state.config().server.shutdown_grace;
    let stopping = stop.clone();
    let server = state.config().server.clone();
    let metrics = state.metrics().clone();
    let (admin_addr, admin) = match server.admin_listen {
        Some(at) => {
            let std_listener = std::net::TcpListener::bind(at)
                .with_context(|| format!("admin listener (server.admin_listen) on {at}"))?;
            std_listener.set_nonblocking(true)?;
            let listener = TcpListener::from_std(std_listener)?;
            let admin_addr = listener.local_addr()?;
            let (router, server, metrics) = (admin(state.clone()), server.clone(), metrics.clone());
            let stopping = stop.clone();
            let task = tokio::spawn(async move {
                accept::serve(listener, router, &server, metrics, None, stopping, grace).await;
            });
            (Some(admin_addr), Some(task))
        }
        None => (None, None),
    };
    let tls = match &server.tls {
        Some((cert, key)) => Some(tls::TlsFront::start(
            cert.clone(),
            key.clone(),
            stop.clone(),
        )?),
        None => None,
    };
    let serve = tokio::spawn(async move {
        accept::serve(listener, router, &server, metrics, tls, stopping, grace).await;
    });
    Ok(Gateway {
        addr,
        admin_addr,
        state,
        stop,
        tasks,
        serve,
        admin,
    })
}

impl Gateway {
    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting, drains within the grace period, then waits for abort calls.
    pub async fn shutdown(self) {
        self.stop.cancel();
        let _ = self.serve.await;
        if let Some(admin) = self.admin {
            let _ = admin.await;
        }
        self.tasks.close();
        let _ = tokio::time::timeout(ABORT_TIMEOUT * 2, self.tasks.wait()).await;
    }

    /// Serves until SIGTERM or Ctrl-C, then shuts down.
    pub async fn run_until_signal(self) -> anyhow::Result<()> {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutting down");
        self.shutdown().await;
        Ok(())
    }
}

/// Starts the bundled simulator as the upstream of `config` (for `serve --with-sim`) and points
/// `config.upstream.base_url` at it. `extra` are more `vllm-sim` flags. Like the deployed vLLM
/// (`deploy/docker-compose.yml`), it runs with `--long-prefill-token-threshold 512` unless
/// `extra` sets that flag.
#[cfg(feature = "sim")]
pub async fn start_sim(
    config: &mut Config,
    extra: &[String],
) -> anyhow::Result<vllm_sim::SimServer> {
    let max_len = config.upstream.max_model_len.to_string();
    let mut argv: Vec<String> = [
        "vllm-sim",
        "--port",
        "0",
        "--served-model-name",
        config.upstream.model.as_str(),
        "--max-model-len",
        max_len.as_str(),
        "--enable-prompt-tokens-details",
        "--enable-per-request-metrics",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if !extra
        .iter()
        .any(|a| a.starts_with("--long-prefill-token-threshold"))
    {
        argv.extend(["--long-prefill-token-threshold".into(), "512".into()]);
    }
    argv.extend(extra.iter().cloned());
    let args =
        <vllm_sim::SimArgs as clap::Parser>::try_parse_from(argv).context("vllm-sim flags")?;
    let sim = vllm_sim::start(&args).await?;
    config.upstream.base_url = sim.url();
    Ok(sim)
}

/// Without the `sim` cargo feature there is no bundled simulator: `serve --with-sim` fails with
/// an error that says so.
#[cfg(not(feature = "sim"))]
pub async fn start_sim(_config: &mut Config, _extra: &[String]) -> anyhow::Result<NoSim> {
    anyhow::bail!(
        "--with-sim: this tutor-gateway binary was built without the simulator \
         (cargo feature `sim` off, e.g. --no-default-features); rebuild with `--features sim` \
         or start vllm-sim separately and point upstream.base_url at it"
    )
}

/// Stands in for the simulator in a build without the `sim` feature; never constructed.
#[cfg(not(feature = "sim"))]
#[derive(Debug)]
pub enum NoSim {}

#[cfg(not(feature = "sim"))]
impl NoSim {
    /// Never called: there is no value of this type.
    pub async fn shutdown(self) {
        match self {}
    }
}

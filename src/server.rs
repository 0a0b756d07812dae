//! Wiring and serving: build the state from a [`Config`], serve the routes, shut down cleanly.
//!
//! Connections are accepted by [`accept`] (connection limit, header timeout). Shutdown
//! (SIGTERM, Ctrl-C, or [`Gateway::shutdown`]), in this order:
//!
//! 1. `/readyz` answers 503 `draining` ([`Drain::begin`]), so the load balancer stops sending.
//!    For `server.drain_announce` (0 by default) requests are still accepted and served, so
//!    that a balancer polling `/readyz` has moved away before the port closes.
//! 2. The public listener stops accepting; open connections are asked to close after their
//!    request. Background jobs stop at once (the stop token: in process they are cancelled,
//!    with Redis handed back to the queue).
//! 3. Open streams get up to `server.shutdown_grace` to finish (a second SIGTERM or Ctrl-C
//!    ends the wait: [`Gateway::run_until_signal`]).
//! 4. Then every stream still open ends ([`Drain::end_streams`]): the client gets an error
//!    with the code `shutdown` (an `/answer` `error` event, a `/v1` `data: {"error": …}` then
//!    `data: [DONE]`, 503 for a request whose answer had not begun), its engine work is
//!    aborted and its seat given back. A connection that has not taken its last event within
//!    [`accept::END_WAIT`] is closed. The listener returns when every connection's task ended.
//! 5. The admin listener (`server.admin_listen`), which kept answering `/readyz` and
//!    `/metrics` until now, stops.
//! 6. The engine abort calls and the jobs' last writes complete (bounded by twice
//!    [`ABORT_TIMEOUT`]).
//! 7. With the Redis quota, the released leases reach Redis ([`RedisAdmission::shutdown`],
//!    bounded by [`RELEASE_WAIT`]) before the call returns; the binary then flushes its spans.
//!
//! [`RedisAdmission::shutdown`]: crate::admission::RedisAdmission::shutdown

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admission::Admission;
use crate::api::{admin, app, AppState, Jobs};
use crate::classify::Classifier;
use crate::config::{Config, RequestLogSink};
use crate::relay::Drain;
use crate::telemetry::{Metrics, RequestLog};
use crate::upstream::{UpstreamClient, ABORT_TIMEOUT};

mod accept;
mod fds;
mod idle;
#[cfg(all(test, feature = "sim"))]
mod panic_tests;
mod resets;
pub mod tls;
mod write_timeout;

pub use accept::{
    END_WAIT, H2_MAX_STREAMS, H2_PING_INTERVAL, H2_PING_TIMEOUT, H2_SEND_BUFFER_BYTES,
};
/// The bundled simulator, as [`start_sim`] returns it.
#[cfg(feature = "sim")]
pub use vllm_sim::SimServer;

/// Longest the shutdown waits for released leases to reach Redis.
pub const RELEASE_WAIT: Duration = Duration::from_secs(2);

/// A running gateway.
#[derive(Debug)]
pub struct Gateway {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Where the admin listener (`server.admin_listen`) listens, when set.
    pub admin_addr: Option<SocketAddr>,
    /// Its state (admission counters, metrics), for tests and the soak check.
    pub state: AppState,
    /// `/readyz` and the streams' view of the shutdown.
    drain: Drain,
    /// Stops the public listener, the jobs and the background reloads.
    stop: CancellationToken,
    /// Stops the admin listener, after the public one is done.
    admin_stop: CancellationToken,
    tasks: TaskTracker,
    serve: JoinHandle<()>,
    admin: Option<JoinHandle<()>>,
}

/// Builds the handlers' state from `config`; spawned abort calls go on `tasks`.
pub fn build_state(config: Config, tasks: TaskTracker) -> anyhow::Result<AppState> {
    let request_log = match config.telemetry.request_log {
        RequestLogSink::Stdout => RequestLog::stdout(),
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
    let courses = crate::prompt::Course::all(&config);
    let fingerprints = courses.into_values().map(|c| c.fingerprint);
    metrics
        .prefix()
        .configure(&config.prefix_cache, fingerprints);
    let admission = Admission::build(&config, metrics.quota().clone()).context("quota backend")?;
    let upstream =
        UpstreamClient::with_metrics(config.upstream.clone(), tasks, metrics.replicas().clone())
            .context("upstream client")?;
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
    let admin_stop = CancellationToken::new();
    let drain = Drain::new();
    // The keys first: the job scheduler must know them from its first job on.
    let auth = crate::api::auth::Auth::start_counted(
        &state.config().auth,
        stop.clone(),
        state.metrics().key_file_refused(),
    );
    let keys = state.config().auth.enabled.then(|| {
        std::sync::Arc::new(auth.clone())
            as std::sync::Arc<dyn crate::pipeline::tenant::KeysInForce>
    });
    let jobs = Jobs::start(state.clone(), stop.clone(), tasks.clone(), keys);
    watch_capacity(&state, stop.clone());
    crate::pipeline::reload::watch(state.clone(), stop.clone());
    crate::autopilot::start(state.clone(), stop.clone(), &tasks);
    let router = app(state.clone(), jobs, auth, addr, &drain);
    let public = accept::Shutdown {
        stop: stop.clone(),
        grace: state.config().server.shutdown_grace,
        drain: Some(drain.clone()),
    };
    let server = state.config().server.clone();
    let metrics = state.metrics().clone();
    if state.config().auth.enabled && server.admin_listen.is_none() {
        tracing::warn!(
            "[auth] is on but server.admin_listen is not set: /metrics and /readyz are \
             open on the public listener, and /metrics names tenants and prompt \
             fingerprints to anyone; set server.admin_listen to keep them to operators"
        );
    }
    if server
        .admin_listen
        .is_some_and(|at| !at.ip().is_loopback() && server.admin_token.is_none())
    {
        tracing::warn!(
            "server.admin_listen is not a loopback address and server.admin_token is not set: \
             anyone who reaches it can reload the configuration (POST /admin/reload, which \
             overwrites the fleet's pushed limits with ?force=true); set server.admin_token, or \
             listen on 127.0.0.1"
        );
    }
    let (admin_addr, admin) = match server.admin_listen {
        Some(at) => {
            let std_listener = std::net::TcpListener::bind(at)
                .with_context(|| format!("admin listener (server.admin_listen) on {at}"))?;
            std_listener.set_nonblocking(true)?;
            let listener = TcpListener::from_std(std_listener)?;
            let admin_addr = listener.local_addr()?;
            let router = admin(state.clone(), admin_addr, &drain);
            let (server, metrics) = (server.clone(), metrics.clone());
            // Stopped after the public listener; its requests are short.
            let shutdown = accept::Shutdown {
                stop: admin_stop.clone(),
                grace: END_WAIT,
                drain: None,
            };
            let task = tokio::spawn(metrics.background().clone().watch(
                "admin listener",
                async move {
                    accept::serve(listener, "admin", router, &server, metrics, None, shutdown)
                        .await;
                },
            ));
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
    let serve = tokio::spawn(
        metrics
            .background()
            .clone()
            .watch("public listener", async move {
                accept::serve(listener, "public", router, &server, metrics, tls, public).await;
            }),
    );
    Ok(Gateway {
        addr,
        admin_addr,
        state,
        drain,
        stop,
        admin_stop,
        tasks,
        serve,
        admin,
    })
}

/// Reads every replica's KV cache at start and each [`CAPACITY_EVERY`] until `stop`: logs
/// overcommitted budgets ([`crate::capacity::watch`]) and spreads seats over the replicas by
/// their KV share ([`crate::upstream::Replicas::set_capacity`]).
fn watch_capacity(state: &AppState, stop: CancellationToken) {
    let (config_of, upstream_of) = (state.clone(), state.clone());
    let watch = crate::capacity::watch(
        CAPACITY_EVERY,
        move || config_of.config(),
        move |replica, cap| {
            let replicas = upstream_of.upstream();
            let replicas = replicas.replicas();
            replicas.set_fleet_seats(upstream_of.config().admission.seats.get());
            replicas.set_capacity(&replica.url, cap.kv_tokens());
        },
    );
    let background = state.metrics().background().clone();
    tokio::spawn(background.watch("capacity watcher", async move {
        tokio::select! {
            () = stop.cancelled() => {}
            () = watch => {}
        }
    }));
}

/// How often the engines' capacity is read again (a replica restarted with other flags).
pub const CAPACITY_EVERY: Duration = Duration::from_secs(30);

impl Gateway {
    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Shuts down in the order of the module doc: `/readyz` says `draining`, the listener
    /// stops accepting, streams get the grace period, then the rest end with `shutdown`; then
    /// abort calls complete and leases are given back. Returns when all of that is done.
    pub async fn shutdown(self) {
        let config = self.state.config();
        let grace_ms = config.server.shutdown_grace.as_millis() as u64;
        let announce = config.server.drain_announce;
        drop(config);
        tracing::info!(
            grace_ms,
            announce_ms = announce.as_millis() as u64,
            "draining: /readyz answers 503"
        );
        self.drain.begin();
        if !announce.is_zero() {
            // The load balancer learns from /readyz; until it has, new requests are served
            // (unless a second signal ends every stream now).
            tokio::select! {
                () = tokio::time::sleep(announce) => {}
                () = self.drain.ending() => {}
            }
        }
        tracing::info!("no new connections");
        self.stop.cancel();
        let _ = self.serve.await;
        self.admin_stop.cancel();
        if let Some(admin) = self.admin {
            let _ = admin.await;
        }
        self.tasks.close();
        if tokio::time::timeout(ABORT_TIMEOUT * 2, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                running = self.tasks.len(),
                "engine abort calls or jobs still running at shutdown"
            );
        }
        if let Some(redis) = self.state.admission().shared() {
            if tokio::time::timeout(RELEASE_WAIT, redis.shutdown())
                .await
                .is_err()
            {
                tracing::warn!("released leases not all written to Redis; they expire by TTL");
            }
        }
        // The last requests' log lines, before the process goes.
        let log = self.state.request_log().clone();
        let flushed =
            tokio::task::spawn_blocking(move || log.flush(crate::telemetry::otel::LOG_FLUSH_WAIT))
                .await;
        if !matches!(flushed, Ok(true)) {
            tracing::warn!("request log lines still queued at exit were lost");
        }
        tracing::info!("shut down");
    }

    /// Serves until a signal of `signals` says stop (SIGTERM, or Ctrl-C / SIGINT), then shuts
    /// down; SIGHUP reloads the configuration file ([`crate::pipeline::reload`]) and serves on.
    pub async fn run_until_signal(self, signals: Signals) -> anyhow::Result<()> {
        let Signals {
            mut term,
            mut int,
            mut hup,
        } = signals;
        loop {
            tokio::select! {
                _ = int.recv() => {
                    tracing::info!("interrupted: shutting down");
                    break;
                }
                _ = term.recv() => {
                    tracing::info!("SIGTERM: shutting down");
                    break;
                }
                _ = hup.recv() => {
                    tracing::info!("SIGHUP: reloading the configuration");
                    let state = self.state.clone();
                    // Reading the file and loading a tokenizer block: off the async workers.
                    // The outcome is logged and counted by the reload itself.
                    let _ = tokio::task::spawn_blocking(move || {
                        crate::pipeline::reload::reload(&state, false)
                    })
                    .await;
                }
            }
        }
        // A second SIGTERM or Ctrl-C during the drain ends every stream now (the operator
        // will not wait out the grace), then the shutdown goes on as after the grace: aborts,
        // releases, spans.
        let drain = self.drain.clone();
        let shutdown = self.shutdown();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                _ = int.recv() => {
                    tracing::warn!("interrupted again: ending every stream now");
                    drain.end_streams();
                }
                _ = term.recv() => {
                    tracing::warn!("SIGTERM again: ending every stream now");
                    drain.end_streams();
                }
                _ = hup.recv() => {
                    tracing::info!("SIGHUP during the shutdown: not reloading");
                }
            }
        }
        Ok(())
    }
}

/// The signals a gateway process answers ([`Gateway::run_until_signal`]). Installed before the
/// gateway serves: from then on a SIGTERM or SIGINT is a drain and SIGHUP a reload, never the
/// default action that ends the process at once (a SIGTERM that came between the listener's
/// first answer and the handler's installation used to kill it, connections reset).
pub struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers (inside a Tokio runtime).
    pub fn install() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }
}

/// Starts the bundled simulator as the upstream of `config` (for `serve --with-sim`) and points
/// `config.upstream.base_url` at it. `extra` are more `vllm-sim` flags. Like the deployed vLLM
/// (`deploy/docker-compose.yml`), it runs with `--long-prefill-token-threshold 512` unless
/// `extra` sets that flag.
#[cfg(feature = "sim")]
pub async fn start_sim(config: &mut Config, extra: &[String]) -> anyhow::Result<SimServer> {
    let max_len = config.upstream.max_model_len.to_string();
    let mut argv: Vec<String> = [
        "vllm-sim",
        "--enable-prompt-tokens-details",
        "--enable-per-request-metrics",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // The defaults of a bundled simulator, each unless `extra` sets that flag itself (a flag
    // given twice is refused).
    let given = |flag: &str| {
        extra
            .iter()
            .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
    };
    // What the gateway itself must know of its engine comes from its config, not the sim's
    // flags (else the two disagree: every request a 404, or the engine's 400 for the gateway's
    // too_long).
    for (flag, key) in [
        ("--served-model-name", "upstream.model"),
        ("--max-model-len", "upstream.max_model_len"),
    ] {
        if given(flag) {
            anyhow::bail!(
                "--sim-arg {flag}: the bundled simulator takes it from the gateway's config; \
                 set {key} there instead"
            );
        }
    }
    for (flag, value) in [
        ("--port", "0"),
        ("--served-model-name", config.upstream.model.as_str()),
        ("--max-model-len", max_len.as_str()),
        ("--long-prefill-token-threshold", "512"),
    ] {
        if !given(flag) {
            argv.extend([flag.to_owned(), value.to_owned()]);
        }
    }
    argv.extend(extra.iter().cloned());
    let args =
        <vllm_sim::SimArgs as clap::Parser>::try_parse_from(argv).context("vllm-sim flags")?;
    let sim = vllm_sim::start(&args).await?;
    config.upstream.base_url = sim.url();
    // The simulator replaces the whole upstream: configured replicas would still get every
    // request (they take precedence over `base_url`).
    if !config.upstream.replicas.is_empty() {
        tracing::warn!(
            replicas = config.upstream.replicas.len(),
            "--with-sim: [[upstream.replicas]] set aside; every request goes to the simulator"
        );
        config.upstream.replicas.clear();
    }
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

//! The `tutor-gateway` binary: `serve`, `check-config`, `limits push` and `capacity`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tutor_gateway::config::{Config, ConfigError};

/// Where `--config` points when it is not given.
const DEFAULT_CONFIG: &str = "config/config.toml";

/// A reverse proxy in front of vLLM that keeps short tutoring questions fast.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway.
    Serve {
        /// Config file.
        #[arg(long, default_value = DEFAULT_CONFIG)]
        config: PathBuf,
        /// Listen here instead of the configured `listen`.
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// Also start the bundled vLLM simulator in-process and use it as the upstream.
        #[arg(long)]
        with_sim: bool,
        /// More `vllm-sim` flags for `--with-sim`, e.g. `--sim-arg=--speed --sim-arg=10`.
        #[arg(long = "sim-arg", allow_hyphen_values = true, requires = "with_sim")]
        sim_args: Vec<String>,
        /// Count tokens with this `tokenizer.json` (the served model's) instead of the
        /// configured `classify.tokenizer`; with `--with-sim` the simulator counts with it too.
        #[arg(long)]
        tokenizer: Option<PathBuf>,
    },
    /// Validate a config file; prints every problem with its dotted key path.
    CheckConfig {
        /// Config file to check (or `--config PATH`, as `serve` takes it).
        #[arg(required_unless_present = "config", conflicts_with = "config")]
        path: Option<PathBuf>,
        /// Config file to check, as `serve --config` names it.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Also read the configured upstream's capacity (`vllm:cache_config_info`, `/v1/models`)
        /// and report every budget that overcommits it (warnings: exit 0 unless `--strict`; a
        /// replica that cannot be read: exit 1, nothing checked).
        #[arg(long)]
        probe: bool,
        /// With `--probe`: exit 1 when a budget overcommits the engine.
        #[arg(long, requires = "probe")]
        strict: bool,
    },
    /// Plan the engine's flags and the lane budgets from a model's config.json and a GPU's
    /// memory (KV bytes per token, KV tokens, sequences per lane).
    Capacity(tutor_gateway::capacity::cli::PlanArgs),
    /// Write a config file's lane limits as the shared quota's limits record in Redis
    /// (`quota.backend = "redis"`): a new version, which every replica enforces from its next
    /// admission on; replicas' reloads keep it unless forced (`POST /admin/reload?force=true`).
    Limits {
        #[command(subcommand)]
        action: LimitsAction,
    },
}

#[derive(Debug, Subcommand)]
enum LimitsAction {
    /// Push the file's limits (checked whole first).
    Push {
        /// Config file whose `[lanes.*]`, `[admission]` and `[quota]` are used.
        #[arg(long, default_value = DEFAULT_CONFIG)]
        config: PathBuf,
    },
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Serve {
            config,
            listen,
            with_sim,
            sim_args,
            tokenizer,
        } => serve(&config, listen, with_sim, &sim_args, tokenizer),
        Command::CheckConfig {
            path,
            config,
            probe,
            strict,
        } => match path.or(config) {
            Some(path) => check_config(&path, probe, strict),
            None => ExitCode::FAILURE,
        },
        Command::Capacity(args) => tutor_gateway::capacity::cli::run(&args),
        Command::Limits {
            action: LimitsAction::Push { config },
        } => limits_push(&config),
    }
}

fn limits_push(path: &std::path::Path) -> ExitCode {
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(e) => return report(path, e),
    };
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(tutor_gateway::admission::redis::push_limits(&config)) {
        Ok(version) => {
            println!(
                "{}: limits pushed to {} as version {version}",
                path.display(),
                config.quota.redis_url
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tutor-gateway: {e}");
            ExitCode::FAILURE
        }
    }
}

fn serve(
    path: &std::path::Path,
    listen: Option<SocketAddr>,
    with_sim: bool,
    sim_args: &[String],
    tokenizer: Option<PathBuf>,
) -> ExitCode {
    if let Some(file) = &tokenizer {
        if !file.is_file() {
            eprintln!(
                "tutor-gateway: --tokenizer {}: no such file (the served model's tokenizer.json)",
                file.display()
            );
            return ExitCode::FAILURE;
        }
    }
    // The tokenizer is put in the file's place before the file is checked: a file naming a
    // tokenizer this machine lacks is fine with --tokenizer.
    let mut config = match Config::load_with_tokenizer(path, tokenizer.as_deref()) {
        Ok(c) => c,
        Err(e) => return report(path, e),
    };
    if let Some(addr) = listen {
        config.listen = addr;
    }
    let mut sim_args = sim_args.to_vec();
    if let Some(file) = &tokenizer {
        if !sim_args.iter().any(|a| a.starts_with("--tokenizer")) {
            sim_args.extend(["--tokenizer".to_owned(), file.display().to_string()]);
        }
    }
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // rustls clients built without a crypto provider of their own (the OTLP/HTTP exporter's
    // default client, for an http:// collector) use the process default: ring, the provider
    // every other TLS client of the gateway names. Without it that exporter panics at start-up.
    let _ = rustls::crypto::ring::default_provider().install_default();
    // The OTLP exporter needs the runtime to exist; it is flushed (dropped) before the runtime.
    let enter = rt.enter();
    let tracing_guard = match tutor_gateway::telemetry::otel::init(&config.telemetry) {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("tutor-gateway: cannot set up logging/tracing: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    tutor_gateway::telemetry::panic::install();
    for warning in config.warnings() {
        tracing::warn!("{warning}");
    }
    let result = rt.block_on(async move {
        let sim = if with_sim {
            let sim = tutor_gateway::server::start_sim(&mut config, &sim_args).await?;
            tracing::info!(upstream = %config.upstream.base_url, "bundled vllm-sim started (llama-3.1-8b-h100 profile unless --sim-arg says otherwise)");
            Some(sim)
        } else {
            None
        };
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("cannot listen on {} (`listen`, or --listen)", config.listen))?;
        // A reload re-reads the file, with this command line's overrides applied again.
        let sim_url = sim.as_ref().map(|_| config.upstream.base_url.clone());
        // Before it serves: a SIGTERM from then on is a drain.
        let signals = tutor_gateway::server::Signals::install()?;
        let gateway = tutor_gateway::server::start(config, listener)?;
        gateway.state.set_config_source(
            path.to_path_buf(),
            std::sync::Arc::new(move |c: &mut Config| {
                if let Some(addr) = listen {
                    c.listen = addr;
                }
                if let Some(url) = &sim_url {
                    c.upstream.base_url = url.clone();
                    c.upstream.replicas.clear();
                }
            }),
            tokenizer,
        );
        tracing::info!(addr = %gateway.addr, "tutor-gateway listening; try: curl -N 'http://{}/answer?prompt=why+does+my+loop+never+end'", gateway.addr);
        if let Some(admin) = gateway.admin_addr {
            tracing::info!(addr = %admin, "admin listener (/metrics, /readyz)");
        }
        gateway.run_until_signal(signals).await?;
        if let Some(sim) = sim {
            sim.shutdown().await;
        }
        anyhow::Ok(())
    });
    // The gateway's shutdown returned only after every connection's task ended, so every
    // request's span is closed, the ones of streams ended by the shutdown included. Flush them
    // now, while the runtime still runs (the gRPC exporter does its I/O on it); then stop it.
    drop(tracing_guard);
    drop(enter);
    drop(rt);
    // What was logged while the runtime stopped.
    tutor_gateway::telemetry::otel::flush_diagnostics();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tutor-gateway: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn report(path: &std::path::Path, err: ConfigError) -> ExitCode {
    match err {
        ConfigError::Invalid(issues) => {
            for issue in &issues {
                eprintln!("{}: {issue}", path.display());
            }
            eprintln!("{}: {} problem(s)", path.display(), issues.len());
        }
        ConfigError::Read { path: read, source }
            if source.kind() == std::io::ErrorKind::NotFound
                && read == Path::new(DEFAULT_CONFIG) =>
        {
            let here = std::env::current_dir()
                .map(|d| d.display().to_string())
                .unwrap_or_else(|_| "the current directory".into());
            eprintln!(
                "tutor-gateway: no config file at {DEFAULT_CONFIG} (the default, read relative to \
                 {here}): pass --config PATH, or run from the repository's root (the shipped, \
                 documented file is config/config.toml there)"
            );
        }
        // Named by the file, as every other problem is.
        syntax @ ConfigError::Syntax { .. } => eprintln!("{}: {syntax}", path.display()),
        other => eprintln!("{other}"),
    }
    ExitCode::FAILURE
}

/// `url` with any `user:password@` replaced by `***@`: what check-config may print.
fn without_credentials(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) if !u.username().is_empty() || u.password().is_some() => {
            let _ = u.set_password(None);
            let _ = u.set_username("***");
            u.to_string()
        }
        Ok(_) => url.to_owned(),
        Err(_) => "(unparsable URL)".to_owned(),
    }
}

fn check_config(path: &std::path::Path, probe: bool, strict: bool) -> ExitCode {
    match Config::load(path) {
        Ok(config) => {
            // What `serve` builds from the files the config names, built here too: a file that
            // exists but is no tokenizer or no PEM pair passed the checks and failed the start.
            let mut unbuildable = vec![];
            if let Err(e) = tutor_gateway::classify::Classifier::from_config(&config) {
                unbuildable.push(format!("classify.tokenizer: {e}"));
            }
            if let Some((cert, key)) = &config.server.tls {
                if let Err(e) = tutor_gateway::server::tls::load(cert, key) {
                    unbuildable.push(format!("{e:#}"));
                }
            }
            if !unbuildable.is_empty() {
                for problem in &unbuildable {
                    eprintln!("{}: {problem}", path.display());
                }
                eprintln!("{}: {} problem(s)", path.display(), unbuildable.len());
                return ExitCode::FAILURE;
            }
            println!(
                "{}: ok (policy {:?}, upstream {}, model {})",
                path.display(),
                config.admission.policy,
                without_credentials(&config.upstream.base_url),
                config.upstream.model
            );
            // Allowed, but seldom what was meant: said, and the exit stays 0.
            for warning in config.warnings() {
                eprintln!("{}: warning: {warning}", path.display());
            }
            if probe {
                return tutor_gateway::capacity::cli::check_probe(path, &config, strict);
            }
            ExitCode::SUCCESS
        }
        Err(e) => report(path, e),
    }
}

//! The `tutor-gateway` binary: `serve` and `check-config`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tutor_gateway::config::{Config, ConfigError};

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
        #[arg(long, default_value = "config/config.toml")]
        config: PathBuf,
        /// Listen here instead of the configured `listen`.
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// Also start the bundled vLLM simulator in-process and use it as the upstream.
        #[arg(long)]
        with_sim: bool,
        /// More `vllm-sim` flags for `--with-sim`, e.g. `--sim-arg=--speed --sim-arg=10`.
        #[arg(long = "sim-arg", allow_hyphen_values = true)]
        sim_args: Vec<String>,
    },
    /// Validate a config file; prints every problem with its dotted key path.
    CheckConfig {
        /// Config file to check.
        path: PathBuf,
    },
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Serve {
            config,
            listen,
            with_sim,
            sim_args,
        } => serve(&config, listen, with_sim, &sim_args),
        Command::CheckConfig { path } => check_config(&path),
    }
}

fn serve(
    path: &std::path::Path,
    listen: Option<SocketAddr>,
    with_sim: bool,
    sim_args: &[String],
) -> ExitCode {
    let mut config = match Config::load(path) {
        Ok(c) => c,
        Err(e) => return report(path, e),
    };
    if let Some(addr) = listen {
        config.listen = addr;
    }
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The OTLP exporter needs the runtime to exist; it is flushed (dropped) before the runtime.
    let _enter = rt.enter();
    let _tracing = match tutor_gateway::telemetry::otel::init(&config.telemetry) {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("tutor-gateway: cannot set up logging/tracing: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async move {
        let sim = if with_sim {
            let sim = tutor_gateway::server::start_sim(&mut config, sim_args).await?;
            tracing::info!(upstream = %config.upstream.base_url, "bundled vllm-sim started (llama-3.1-8b-h100 profile unless --sim-arg says otherwise)");
            Some(sim)
        } else {
            None
        };
        let listener = tokio::net::TcpListener::bind(config.listen).await?;
        let gateway = tutor_gateway::server::start(config, listener)?;
        tracing::info!(addr = %gateway.addr, "tutor-gateway listening; try: curl -N 'http://{}/answer?prompt=why+does+my+loop+never+end'", gateway.addr);
        if let Some(admin) = gateway.admin_addr {
            tracing::info!(addr = %admin, "admin listener (/metrics, /readyz)");
        }
        gateway.run_until_signal().await?;
        if let Some(sim) = sim {
            sim.shutdown().await;
        }
        anyhow::Ok(())
    });
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
        other => eprintln!("{other}"),
    }
    ExitCode::FAILURE
}

fn check_config(path: &std::path::Path) -> ExitCode {
    match Config::load(path) {
        Ok(config) => {
            println!(
                "{}: ok (policy {:?}, upstream {}, model {})",
                path.display(),
                config.admission.policy,
                config.upstream.base_url,
                config.upstream.model
            );
            ExitCode::SUCCESS
        }
        Err(e) => report(path, e),
    }
}

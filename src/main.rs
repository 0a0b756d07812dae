//! The `tutor-gateway` binary: `check-config PATH` now; `serve` comes with the HTTP layer.

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
    /// Run the gateway (not implemented yet).
    Serve {
        /// Config file.
        #[arg(long, default_value = "config/config.toml")]
        config: PathBuf,
    },
    /// Validate a config file; prints every problem with its dotted key path.
    CheckConfig {
        /// Config file to check.
        path: PathBuf,
    },
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Serve { .. } => {
            eprintln!("serve: not implemented yet");
            ExitCode::from(2)
        }
        Command::CheckConfig { path } => check_config(&path),
    }
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
        Err(ConfigError::Invalid(issues)) => {
            for issue in &issues {
                eprintln!("{}: {issue}", path.display());
            }
            eprintln!("{}: {} problem(s)", path.display(), issues.len());
            ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!("{err}");
            ExitCode::FAILURE
        }
    }
}

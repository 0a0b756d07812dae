//! `vllm-sim`: serve the simulator until interrupted.

use clap::Parser;
use vllm_sim::SimArgs;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = SimArgs::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&args.log))
        .init();
    let server = vllm_sim::start(&args).await?;
    let profile = match &args.profile_file {
        Some(path) => path.display().to_string(),
        None => args.profile.clone(),
    };
    tracing::info!(addr = %server.addr, %profile, speed = args.speed, "vllm-sim listening");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
    server.shutdown().await;
    Ok(())
}

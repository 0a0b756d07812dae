//! One run's fresh simulator and gateway (in process) under an admission preset.

use std::path::PathBuf;

use anyhow::bail;
use tutor_gateway::server::Gateway;
use vllm_sim::SimServer;

use crate::client::{Api, Target};
use crate::engine::EngineSetting;
use crate::experiment::{config_tokenizer, gateway_config, sim_args, RedisChild};
use crate::preset::Preset;
use crate::prompt::PromptBuilder;

/// What every run's stack shares.
#[derive(Debug, Clone)]
pub struct StackSpec {
    /// Gateway config file (policy and `upstream.max_model_len` overridden per run).
    pub config: PathBuf,
    /// Simulator profile.
    pub profile: String,
    /// Simulator speed factor.
    pub speed: f64,
    /// `[admission.fifo] max_concurrency` for FIFO (0: unlimited).
    pub fifo_max_concurrency: u32,
}

/// A running simulator, the gateway in front of it, and how to reach it.
pub struct Stack {
    /// The simulator (its engine's step records feed the engine bound).
    pub sim: SimServer,
    /// The gateway under test.
    pub gateway: Gateway,
    /// The gateway's `/answer`.
    pub target: Target,
    /// Prompts sized with the engine's tokenizer (the gateway's unless the setting names one).
    pub prompts: PromptBuilder,
    /// The `redis-server` holding the quota, for a preset on Redis; killed on drop.
    redis: Option<RedisChild>,
}

impl Stack {
    /// Starts a fresh simulator (seeded with `seed`) and gateway under `preset` and `engine`.
    pub async fn start(
        spec: &StackSpec,
        engine: &EngineSetting,
        preset: Preset,
        seed: u64,
    ) -> anyhow::Result<Self> {
        if preset == Preset::LanesRedis {
            bail!("the open-loop experiment does not run lanes-redis (two replicas)");
        }
        let mut cfg = gateway_config(
            &spec.config,
            engine,
            preset,
            spec.fifo_max_concurrency,
            spec.speed,
        )?;
        // The engine counts (and the load sizes its prompts) with the engine's tokenizer when the
        // setting names one, else with the gateway's.
        let tokenizer = engine.counting_tokenizer(config_tokenizer(&cfg));
        let args = sim_args(
            &spec.profile,
            spec.speed,
            seed,
            tokenizer.as_deref(),
            engine,
            preset,
        );
        let sim = tutor_gateway::server::start_sim(&mut cfg, &args).await?;
        let redis = RedisChild::for_preset(preset, &mut cfg)?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let gateway = tutor_gateway::server::start(cfg, listener)?;
        let target = Target::new(&gateway.url(), Api::Answer, None)?.simulated_at(spec.speed);
        let prompts = PromptBuilder::new(vllm_sim::tokenizer::PromptTokenizer::load(
            tokenizer.as_deref(),
        )?);
        Ok(Self {
            sim,
            gateway,
            target,
            prompts,
            redis,
        })
    }

    /// Shuts the gateway, its Redis (if any) and the simulator down.
    pub async fn stop(self) {
        self.gateway.shutdown().await;
        drop(self.redis);
        self.sim.shutdown().await;
    }
}

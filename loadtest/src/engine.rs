//! Engine settings: the vLLM scheduler flags an experiment or a matrix runs under, as named
//! presets (`seed`, `h100`) and per-flag overrides, expanded to a list of settings (every
//! combination) and to the flags given to `vllm-sim` (named as `vllm serve`'s).

use anyhow::bail;
use serde::Serialize;

/// One engine setting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EngineSetting {
    /// Folder and report key (`seed`, `h100`, `seed-lpt512`, ...).
    pub name: String,
    /// `--max-num-seqs`.
    pub max_num_seqs: u32,
    /// `--max-num-batched-tokens`.
    pub max_num_batched_tokens: u32,
    /// `--long-prefill-token-threshold` (0: no cap, vLLM's default).
    pub long_prefill_token_threshold: u32,
    /// `--max-model-len`.
    pub max_model_len: u32,
    /// vLLM's `--async-scheduling` (on by default, as in vLLM 0.33): the next step is planned
    /// while the current one runs. Off: `--no-async-scheduling`.
    pub async_scheduling: bool,
    /// vLLM's `--kv-offloading-size` in GiB (KV blocks copied to CPU memory and loaded back
    /// instead of recomputed); 0: no offloading, vLLM's default.
    pub kv_offloading_gib: u32,
    /// A `tokenizer.json` the engine counts prompts with (the load sizes its prompts with it
    /// too), whatever the gateway's config estimates with; `None`: the gateway's. With the
    /// gateway on its heuristic, the estimate then differs from the engine's count as it does
    /// in front of a real vLLM. Name suffix `-tok`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<std::path::PathBuf>,
    /// Answers end at EOS after an exponential draw of this mean, capped by what the request
    /// asked for, as a real model's answers do; `None`: every answer runs to the length it
    /// asked for (exact output lengths). Name suffix `-eosN`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mean_output_tokens: Option<u32>,
}

/// Names of the presets, in `--engine` help order.
pub const PRESETS: &[&str] = &["seed", "h100"];

impl EngineSetting {
    /// A named preset: `seed` (the seed's reference vLLM command: 96 seats, 12,288 batched
    /// tokens) or `h100` (vLLM's defaults on an H100: 1,024 seats, 8,192 batched tokens); both
    /// with `--max-model-len 16384` and no long-prefill threshold.
    pub fn preset(name: &str) -> Option<Self> {
        let (seqs, batched) = match name {
            "seed" => (96, 12_288),
            "h100" => (1024, 8192),
            _ => return None,
        };
        Some(Self {
            name: name.to_string(),
            max_num_seqs: seqs,
            max_num_batched_tokens: batched,
            long_prefill_token_threshold: 0,
            max_model_len: 16_384,
            async_scheduling: true,
            kv_offloading_gib: 0,
            tokenizer: None,
            mean_output_tokens: None,
        })
    }

    /// Scheduler flags for `vllm-sim` or `vllm serve` (without `--max-model-len`, which the
    /// gateway's `start_sim` passes from `upstream.max_model_len`; see [`Self::all_flags`]).
    pub fn sim_flags(&self) -> Vec<String> {
        let mut flags = vec![
            "--max-num-seqs".into(),
            self.max_num_seqs.to_string(),
            "--max-num-batched-tokens".into(),
            self.max_num_batched_tokens.to_string(),
            "--long-prefill-token-threshold".into(),
            self.long_prefill_token_threshold.to_string(),
        ];
        if !self.async_scheduling {
            flags.push("--no-async-scheduling".into());
        }
        if self.kv_offloading_gib > 0 {
            flags.extend([
                "--kv-offloading-size".into(),
                self.kv_offloading_gib.to_string(),
                "--kv-offloading-backend".into(),
                "native".into(),
            ]);
        }
        flags
    }

    /// The tokenizer the engine counts with (and the load sizes its prompts with): this
    /// setting's, else the gateway's (`gateway`, from its config; `None`: the heuristic).
    pub fn counting_tokenizer(
        &self,
        gateway: Option<std::path::PathBuf>,
    ) -> Option<std::path::PathBuf> {
        self.tokenizer.clone().or(gateway)
    }

    /// Every flag, `--max-model-len` included (for reports and a `vllm serve` command line).
    pub fn all_flags(&self) -> Vec<String> {
        let mut f = self.sim_flags();
        f.extend(["--max-model-len".into(), self.max_model_len.to_string()]);
        f
    }
}

/// Per-flag values that replace a preset's; each non-empty list multiplies the settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--max-num-seqs` values.
    pub max_num_seqs: Vec<u32>,
    /// `--max-num-batched-tokens` values.
    pub max_num_batched_tokens: Vec<u32>,
    /// `--long-prefill-token-threshold` values.
    pub long_prefill_token_threshold: Vec<u32>,
    /// `--max-model-len` values.
    pub max_model_len: Vec<u32>,
    /// `--kv-offloading-size` values, GiB (0: none).
    pub kv_offloading_size: Vec<u32>,
    /// Every setting with `--no-async-scheduling` (name suffix `-sync`).
    pub no_async_scheduling: bool,
    /// Every setting's engine counts with this tokenizer (see [`EngineSetting::tokenizer`]).
    pub tokenizer: Option<std::path::PathBuf>,
    /// Every setting's answers end at EOS with this mean (see
    /// [`EngineSetting::mean_output_tokens`]).
    pub mean_output_tokens: Option<u32>,
}

/// Folder name of a matrix cell (shared with [`expand`]'s suffixes).
pub fn cell_name(seqs: u32, batched: u32) -> String {
    format!("seqs{seqs}-batched{batched}")
}

/// Every preset in `presets` (default `h100`: the simulator's own defaults, what the experiment
/// ran before it had engine settings) times every combination of the overrides; a setting's
/// name is its preset's plus `-seqsN`, `-batchedN`, `-lptN`, `-lenN`, `-offloadN` for each
/// overridden flag.
pub fn expand(presets: &[String], o: &Overrides) -> anyhow::Result<Vec<EngineSetting>> {
    let presets: Vec<String> = if presets.is_empty() {
        vec!["h100".into()]
    } else {
        presets.to_vec()
    };
    let mut out = vec![];
    for p in &presets {
        let Some(base) = EngineSetting::preset(p) else {
            bail!(
                "unknown engine preset {p:?} (known: {})",
                PRESETS.join(", ")
            );
        };
        let mut settings = vec![base];
        type Set = fn(&mut EngineSetting, u32);
        let axes: [(&[u32], &str, Set); 5] = [
            (&o.max_num_seqs, "seqs", |e, v| e.max_num_seqs = v),
            (&o.max_num_batched_tokens, "batched", |e, v| {
                e.max_num_batched_tokens = v
            }),
            (&o.long_prefill_token_threshold, "lpt", |e, v| {
                e.long_prefill_token_threshold = v
            }),
            (&o.max_model_len, "len", |e, v| e.max_model_len = v),
            (&o.kv_offloading_size, "offload", |e, v| {
                e.kv_offloading_gib = v
            }),
        ];
        for (values, tag, set) in axes {
            if values.is_empty() {
                continue;
            }
            settings = settings
                .iter()
                .flat_map(|s| {
                    values.iter().map(move |&v| {
                        let mut n = s.clone();
                        set(&mut n, v);
                        n.name = format!("{}-{tag}{v}", s.name);
                        n
                    })
                })
                .collect();
        }
        if o.no_async_scheduling {
            for s in &mut settings {
                s.async_scheduling = false;
                s.name.push_str("-sync");
            }
        }
        for s in &mut settings {
            if let Some(t) = &o.tokenizer {
                s.tokenizer = Some(t.clone());
                s.name.push_str("-tok");
            }
            if let Some(m) = o.mean_output_tokens {
                s.mean_output_tokens = Some(m);
                s.name.push_str(&format!("-eos{m}"));
            }
        }
        out.extend(settings);
    }
    for s in &out {
        if s.max_num_seqs == 0
            || s.max_num_batched_tokens == 0
            || s.max_model_len == 0
            || s.mean_output_tokens == Some(0)
        {
            bail!(
                "engine {}: seqs, batched tokens, model length and mean output tokens must be > 0",
                s.name
            );
        }
    }
    let mut names: Vec<&str> = out.iter().map(|s| s.name.as_str()).collect();
    names.sort_unstable();
    if names.windows(2).any(|w| w[0] == w[1]) {
        bail!("engine settings repeat: {names:?}");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parsed(e: &EngineSetting) -> vllm_sim::SimArgs {
        let mut argv = vec!["vllm-sim".to_string()];
        argv.extend(e.all_flags());
        vllm_sim::SimArgs::try_parse_from(argv).expect("the simulator accepts the flags")
    }

    #[test]
    fn presets_expand_to_the_right_sim_flags() {
        let v = expand(&["seed".into(), "h100".into()], &Overrides::default()).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(
            v[0].all_flags().join(" "),
            "--max-num-seqs 96 --max-num-batched-tokens 12288 \
             --long-prefill-token-threshold 0 --max-model-len 16384"
        );
        let a = parsed(&v[0]);
        assert_eq!(
            (a.max_num_seqs, a.max_num_batched_tokens, a.max_model_len),
            (96, 12_288, 16_384)
        );
        let b = parsed(&v[1]);
        assert_eq!(v[1].name, "h100");
        assert_eq!(
            (b.max_num_seqs, b.max_num_batched_tokens, b.max_model_len),
            (1024, 8192, 16_384)
        );
        assert_eq!(b.long_prefill_token_threshold, 0);
        // No preset: h100 (the simulator's defaults, the experiment's old behaviour).
        assert_eq!(expand(&[], &Overrides::default()).unwrap()[0].name, "h100");
        assert!(expand(&["a100".into()], &Overrides::default()).is_err());
    }

    #[test]
    fn overrides_replace_and_multiply() {
        let o = Overrides {
            long_prefill_token_threshold: vec![0, 512],
            max_num_seqs: vec![128],
            ..Default::default()
        };
        let v = expand(&["seed".into()], &o).unwrap();
        let names: Vec<&str> = v.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["seed-seqs128-lpt0", "seed-seqs128-lpt512"]);
        let a = parsed(&v[1]);
        assert_eq!(
            (
                a.max_num_seqs,
                a.max_num_batched_tokens,
                a.long_prefill_token_threshold
            ),
            (128, 12_288, 512)
        );
        assert_eq!(cell_name(96, 8192), "seqs96-batched8192");
    }

    #[test]
    fn synchronous_scheduling_reaches_the_simulator() {
        let o = Overrides {
            no_async_scheduling: true,
            ..Default::default()
        };
        let v = expand(&["seed".into()], &o).unwrap();
        assert_eq!(v[0].name, "seed-sync");
        assert!(!parsed(&v[0]).async_scheduling());
        let d = expand(&["seed".into()], &Overrides::default()).unwrap();
        assert!(parsed(&d[0]).async_scheduling());
    }

    #[test]
    fn kv_offloading_reaches_the_simulator_only_when_asked() {
        let o = Overrides {
            kv_offloading_size: vec![0, 64],
            ..Default::default()
        };
        let v = expand(&["seed".into()], &o).unwrap();
        assert_eq!(v[0].name, "seed-offload0");
        assert_eq!(parsed(&v[0]).kv_offloading_size, None);
        assert_eq!(v[1].name, "seed-offload64");
        let a = parsed(&v[1]);
        assert_eq!(
            (a.kv_offloading_size, a.kv_offloading_backend.as_str()),
            (Some(64.0), "native")
        );
        // And the simulator starts with it (its CPU tier sized from the profile's KV bytes).
        assert!(vllm_sim::build(&a).is_ok());
    }
}

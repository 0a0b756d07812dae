//! Scenario files (`loadtest/scenarios/*.toml`): request classes and how they arrive.

use std::path::Path;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

/// A load scenario: a seed, an arrival model and request classes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Short name, copied into results.
    pub name: String,
    /// Seed of every random choice (classes, arrivals, prompt text); `--seed` overrides it.
    #[serde(default)]
    pub seed: u64,
    /// How requests arrive.
    pub load: Load,
    /// Request classes, in report order.
    #[serde(rename = "class")]
    pub classes: Vec<Class>,
}

/// Arrival model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, tag = "mode", rename_all = "lowercase")]
pub enum Load {
    /// Poisson arrivals at `rate` requests per second; each request's class drawn by `share`.
    Open {
        /// Mean requests per second.
        rate: f64,
    },
    /// Each class keeps `concurrency` requests in flight; a client sends its next request as
    /// soon as its previous one ends.
    Closed,
}

/// One request class.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Class {
    /// Name used in reports (`small`, `large`, ...).
    pub name: String,
    /// Prompt tokens as the engine counts them (chat template included).
    pub input_tokens: u32,
    /// Output tokens requested (`max_tokens`; with `ignore_eos` exactly this many).
    pub output_tokens: u32,
    /// Fraction of open-loop arrivals (shares are normalised).
    #[serde(default)]
    pub share: f64,
    /// Closed-loop clients of this class.
    #[serde(default)]
    pub concurrency: u32,
}

impl Scenario {
    /// Reads and validates a scenario file.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading scenario {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("scenario {}", path.display()))
    }

    /// Parses and validates scenario TOML.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let s: Scenario = toml::from_str(text)?;
        s.validate()?;
        Ok(s)
    }

    /// Checks the classes fit the arrival model.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.classes.is_empty() {
            bail!("no [[class]]");
        }
        for c in &self.classes {
            if c.input_tokens < 16 || c.output_tokens == 0 {
                bail!(
                    "class {}: input_tokens >= 16 and output_tokens >= 1",
                    c.name
                );
            }
        }
        match self.load {
            Load::Open { rate } => {
                if !(rate > 0.0 && rate.is_finite()) {
                    bail!("load.rate must be > 0");
                }
                if self.classes.iter().any(|c| c.share < 0.0) || self.total_share() <= 0.0 {
                    bail!("open loop: shares must be >= 0 and sum to > 0");
                }
            }
            Load::Closed => {
                if self.classes.iter().all(|c| c.concurrency == 0) {
                    bail!("closed loop: some class needs concurrency > 0");
                }
            }
        }
        Ok(())
    }

    /// Sum of the shares.
    pub fn total_share(&self) -> f64 {
        self.classes.iter().map(|c| c.share).sum()
    }

    /// Multiplies every closed-loop concurrency by `f` (at least 1 client where there was one).
    pub fn scale_concurrency(&mut self, f: f64) {
        for c in &mut self.classes {
            if c.concurrency > 0 {
                c.concurrency = ((f64::from(c.concurrency) * f).round() as u32).max(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_scenarios_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
        let mix = Scenario::load(&dir.join("seed-mix.toml")).unwrap();
        assert_eq!(mix.classes.len(), 3);
        assert!((mix.total_share() - 1.0).abs() < 1e-9);
        let exp = Scenario::load(&dir.join("defining-experiment.toml")).unwrap();
        assert_eq!(exp.load, Load::Closed);
        assert_eq!(exp.classes[0].concurrency, 80);
        assert_eq!(exp.classes[1].concurrency, 20);
    }

    #[test]
    fn bad_scenarios_are_rejected() {
        assert!(Scenario::parse("name='x'\n[load]\nmode='closed'\n").is_err());
        let no_clients = "name='x'\n[load]\nmode='closed'\n[[class]]\nname='a'\ninput_tokens=300\noutput_tokens=10\n";
        assert!(Scenario::parse(no_clients).is_err());
    }
}

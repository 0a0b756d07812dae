//! Scenario files (`loadtest/scenarios/*.toml`): request classes and how they arrive.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

/// A load scenario: a seed, an arrival model and request classes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Short name, copied into results.
    pub name: String,
    /// Seed of every random choice (classes, arrivals, prompt text, drawn sizes, start offsets,
    /// think times); `--seed` overrides it.
    #[serde(default)]
    pub seed: u64,
    /// Longest prompt + output the engine accepts (vLLM `--max-model-len`); drawn sizes are
    /// clamped so that input + output never exceed it. Default 16384 (vLLM's and the gateway's
    /// reference). `tutor-load experiment` lowers it to its engine setting's `--max-model-len`.
    #[serde(default = "default_max_model_len")]
    pub max_model_len: u32,
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
        /// Mean requests per second (with `waves`: the base the wave's fractions multiply).
        rate: f64,
        /// A rate that rises and falls in waves instead of a constant one (default none).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        waves: Option<Waves>,
    },
    /// Each class keeps `concurrency` clients; a client sends its next request when its
    /// previous one ends (after the class's think time).
    Closed {
        /// Client starts are spread over the first `ramp_s` seconds (0: all start at once).
        #[serde(default)]
        ramp_s: f64,
        /// How start offsets are placed within `ramp_s`.
        #[serde(default)]
        ramp: Ramp,
    },
}

/// An open loop's rate in waves: at `t` seconds from the start, `base x fraction(t)`, where the
/// fraction follows a cosine from `low` (at t = 0) up to `high` (at `period_s / 2`) and back to
/// `low` (at `period_s`): a day-like load. The mean over any whole period is `(low + high) / 2`.
/// `base` is `rate` (`tutor-load run`) or load x capacity (`experiment --arrivals poisson`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Waves {
    /// The fraction of the base rate at the troughs, >= 0.
    pub low: f64,
    /// The fraction at the crests, >= `low` and > 0.
    pub high: f64,
    /// Seconds from one trough to the next (simulated seconds in `experiment`), > 0.
    pub period_s: f64,
}

impl Waves {
    /// The fraction of the base rate at `t_s` seconds from the start: in `[low, high]`.
    pub fn fraction(&self, t_s: f64) -> f64 {
        let mid = (self.low + self.high) / 2.0;
        let amp = (self.high - self.low) / 2.0;
        let f = mid - amp * (std::f64::consts::TAU * t_s / self.period_s).cos();
        f.clamp(self.low, self.high)
    }

    /// The rate at `t_s` for a base rate `base`.
    pub fn rate(&self, base: f64, t_s: f64) -> f64 {
        base * self.fraction(t_s)
    }

    /// Checks the keys, naming the one that is wrong.
    pub fn validate(&self) -> anyhow::Result<()> {
        let Waves {
            low,
            high,
            period_s,
        } = *self;
        if !(low >= 0.0 && low.is_finite()) {
            bail!("load.waves.low must be a number >= 0 (a fraction of the base rate), got {low}");
        }
        if !(high > 0.0 && high.is_finite() && high >= low) {
            bail!("load.waves.high must be a number > 0 and >= low ({low}), got {high}");
        }
        if !(period_s > 0.0 && period_s.is_finite()) {
            bail!("load.waves.period_s must be > 0 seconds, got {period_s}");
        }
        Ok(())
    }
}

/// Where a closed-loop client's start offset falls within `ramp_s`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Ramp {
    /// Drawn uniformly in `[0, ramp_s)` from the client's own seeded stream.
    #[default]
    Uniform,
    /// Evenly spaced per class: client k of n starts at `k * ramp_s / n`.
    Even,
}

/// How a class's figure (tokens or think time) is turned into one request's value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dist {
    /// Exactly the figure.
    #[default]
    Fixed,
    /// Uniform in `[figure * (1 - spread), figure * (1 + spread)]` (mean = the figure).
    Uniform,
    /// `figure * exp(sigma * N(0, 1))`: median = the figure, a right-skewed tail.
    Lognormal,
    /// Exponential with mean = the figure (memoryless; for think times).
    Exponential,
}

/// Default `max_model_len`.
pub const DEFAULT_MAX_MODEL_LEN: u32 = 16_384;
/// Default `spread` of the uniform distribution: +-50%.
pub const DEFAULT_SPREAD: f64 = 0.5;
/// Default `sigma` of the lognormal distribution (of ln(size)): about 68% of draws within
/// x0.61 .. x1.65 of the median.
pub const DEFAULT_SIGMA: f64 = 0.5;
/// Fewest prompt tokens a request has (the chat template alone is a few tokens).
pub const MIN_INPUT_TOKENS: u32 = 16;

fn default_max_model_len() -> u32 {
    DEFAULT_MAX_MODEL_LEN
}
fn default_spread() -> f64 {
    DEFAULT_SPREAD
}
fn default_sigma() -> f64 {
    DEFAULT_SIGMA
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
    /// The API this class's requests use (`answer`, `chat`, `jobs`); default: the target's.
    #[serde(default)]
    pub api: Option<crate::client::Api>,
    /// How each request's input and output sizes are drawn around `input_tokens` /
    /// `output_tokens` (default `fixed`: exactly those).
    #[serde(default)]
    pub distribution: Dist,
    /// `uniform`: +- this fraction of the figure, in [0, 1] (default 0.5). Also used by
    /// `think_distribution = "uniform"`.
    #[serde(default = "default_spread")]
    pub spread: f64,
    /// `lognormal`: standard deviation of ln(value) (default 0.5). Also used by
    /// `think_distribution = "lognormal"`.
    #[serde(default = "default_sigma")]
    pub sigma: f64,
    /// Closed loop: a client's pause between the end of one request and its next, milliseconds
    /// (default 0: none).
    #[serde(default)]
    pub think_ms: f64,
    /// How each think time is drawn around `think_ms` (default `fixed`).
    #[serde(default)]
    pub think_distribution: Dist,
    /// Distinct shared prompt prefixes (courses) this class's requests start with, each sent
    /// as a system message of `prefix_tokens` (0: no shared prefix). A request's prefix is
    /// drawn uniformly from its seed.
    #[serde(default)]
    pub prefixes: u32,
    /// Tokens of each shared prefix (part of `input_tokens`).
    #[serde(default)]
    pub prefix_tokens: u32,
    /// Sent as `x-tutor-deadline-ms` with each of this class's requests (1 to 3,600,000): the
    /// gateway refuses at once (`deadline_unmet`) a request whose predicted wait misses it.
    #[serde(default)]
    pub deadline_ms: Option<u32>,
    /// Open loop, `api = "jobs"` only: this many jobs submitted at the run's start (as fast as
    /// the gateway accepts them) and followed to their end, instead of arrivals by `share`
    /// (the class takes no share). Run by `tutor-load experiment --arrivals poisson`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backlog: Option<u32>,
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
        if self.max_model_len <= MIN_INPUT_TOKENS {
            bail!("max_model_len must be > {MIN_INPUT_TOKENS}");
        }
        for c in &self.classes {
            if c.input_tokens < MIN_INPUT_TOKENS || c.output_tokens == 0 {
                bail!(
                    "class {}: input_tokens >= {MIN_INPUT_TOKENS} and output_tokens >= 1",
                    c.name
                );
            }
            if c.distribution == Dist::Fixed
                && u64::from(c.input_tokens) + u64::from(c.output_tokens)
                    > u64::from(self.max_model_len)
            {
                bail!(
                    "class {}: input_tokens + output_tokens > max_model_len {}",
                    c.name,
                    self.max_model_len
                );
            }
            if c.deadline_ms.is_some_and(|d| !(1..=3_600_000).contains(&d)) {
                bail!("class {}: deadline_ms must be in 1..=3600000", c.name);
            }
            if !(0.0..=1.0).contains(&c.spread) {
                bail!("class {}: spread must be in [0, 1]", c.name);
            }
            if !(c.sigma >= 0.0 && c.sigma.is_finite()) {
                bail!("class {}: sigma must be >= 0", c.name);
            }
            if !(c.think_ms >= 0.0 && c.think_ms.is_finite()) {
                bail!("class {}: think_ms must be >= 0", c.name);
            }
            if c.prefixes > 0
                && (c.prefix_tokens == 0 || c.prefix_tokens + MIN_INPUT_TOKENS > c.input_tokens)
            {
                bail!(
                    "class {}: with prefixes, 0 < prefix_tokens <= input_tokens - {MIN_INPUT_TOKENS}",
                    c.name
                );
            }
            if c.think_ms > 0.0 && matches!(self.load, Load::Open { .. }) {
                bail!("class {}: think_ms is for closed loop only", c.name);
            }
            if let Some(n) = c.backlog {
                if n == 0 {
                    bail!(
                        "class {}: backlog must be >= 1 jobs (leave it out for none)",
                        c.name
                    );
                }
                if c.api != Some(crate::client::Api::Jobs) {
                    bail!("class {}: backlog needs api = \"jobs\"", c.name);
                }
                if !matches!(self.load, Load::Open { .. }) {
                    bail!(
                        "class {}: backlog is for open loop only (mode = \"open\")",
                        c.name
                    );
                }
                if c.share != 0.0 || c.concurrency != 0 {
                    bail!(
                        "class {}: a backlog class takes no share and no concurrency (its jobs \
                         are all submitted at the start)",
                        c.name
                    );
                }
            }
        }
        match self.load {
            Load::Open { rate, waves } => {
                if !(rate > 0.0 && rate.is_finite()) {
                    bail!("load.rate must be > 0");
                }
                if let Some(w) = waves {
                    w.validate()?;
                }
                if self.classes.iter().any(|c| c.share < 0.0) || self.total_share() <= 0.0 {
                    bail!("open loop: shares must be >= 0 and sum to > 0");
                }
            }
            Load::Closed { ramp_s, .. } => {
                if self.classes.iter().all(|c| c.concurrency == 0) {
                    bail!("closed loop: some class needs concurrency > 0");
                }
                if !(ramp_s >= 0.0 && ramp_s.is_finite()) {
                    bail!("load.ramp_s must be >= 0");
                }
            }
        }
        Ok(())
    }

    /// Sum of the shares.
    pub fn total_share(&self) -> f64 {
        self.classes.iter().map(|c| c.share).sum()
    }

    /// The backlog classes (index, jobs): jobs submitted at the start, not arrivals.
    pub fn backlogs(&self) -> Vec<(usize, u32)> {
        self.classes
            .iter()
            .enumerate()
            .filter_map(|(i, c)| Some((i, c.backlog?)))
            .collect()
    }

    /// An error naming `what` when the scenario has a backlog class (only `experiment
    /// --arrivals poisson` runs backlogs).
    pub fn refuse_backlog(&self, what: &str) -> anyhow::Result<()> {
        if let Some((i, _)) = self.backlogs().first() {
            bail!(
                "class {}: backlog classes are run by `tutor-load experiment --arrivals poisson`, \
                 not by {what}",
                self.classes[*i].name
            );
        }
        Ok(())
    }

    /// The open loop's waves, if any.
    pub fn waves(&self) -> Option<Waves> {
        match self.load {
            Load::Open { waves, .. } => waves,
            Load::Closed { .. } => None,
        }
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

/// A duration as the command line writes it: a number and `ms`, `s` (or none), `m` or `h`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.split_at(
        s.find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(s.len()),
    );
    let v: f64 = num.parse().map_err(|_| format!("bad duration {s:?}"))?;
    let mult = match unit {
        "" | "s" => 1.0,
        "ms" => 0.001,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return Err(format!("bad duration unit in {s:?} (ms, s, m, h)")),
    };
    Duration::try_from_secs_f64(v * mult).map_err(|_| format!("duration {s:?} out of range"))
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
        assert!(matches!(exp.load, Load::Closed { ramp_s, .. } if ramp_s == 5.0));
        assert_eq!(exp.classes[0].distribution, Dist::Uniform);
        assert_eq!(exp.classes[0].concurrency, 80);
        assert_eq!(exp.classes[1].concurrency, 20);
        // Every shipped file parses; an open loop's shares sum to one.
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let s =
                    Scenario::load(&path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
                if matches!(s.load, Load::Open { .. }) {
                    assert!((s.total_share() - 1.0).abs() < 1e-9, "{}", path.display());
                }
            }
        }
        let d = Scenario::load(&dir.join("seed-mix-open-deadlines.toml")).unwrap();
        let deadlines: Vec<_> = d.classes.iter().map(|c| c.deadline_ms).collect();
        assert_eq!(deadlines, [Some(500), Some(5_000), Some(30_000)]);
        let bad = "name='x'\n[load]\nmode='open'\nrate=1.0\n[[class]]\nname='a'\ninput_tokens=300\noutput_tokens=10\nshare=1.0\ndeadline_ms=0\n";
        assert!(
            Scenario::parse(bad).is_err(),
            "a deadline of 0 ms is refused"
        );
    }

    #[test]
    fn bad_scenarios_are_rejected() {
        assert!(Scenario::parse("name='x'\n[load]\nmode='closed'\n").is_err());
        let no_clients = "name='x'\n[load]\nmode='closed'\n[[class]]\nname='a'\ninput_tokens=300\noutput_tokens=10\n";
        assert!(Scenario::parse(no_clients).is_err());
        let base = "name='x'\n[load]\nmode='closed'\n[[class]]\nname='a'\ninput_tokens=300\noutput_tokens=10\nconcurrency=1\n";
        assert!(Scenario::parse(base).is_ok());
        assert!(Scenario::parse(&format!("{base}spread=1.5\n")).is_err());
        assert!(Scenario::parse(&format!("{base}think_ms=-1\n")).is_err());
        assert!(Scenario::parse(&format!("{base}distribution='normal'\n")).is_err());
        assert!(Scenario::parse(&format!("max_model_len=200\n{base}")).is_err());
        let ramp = base.replace("mode='closed'", "mode='closed'\nramp_s=-1");
        assert!(Scenario::parse(&ramp).is_err());
    }

    const OPEN: &str = "name='x'\n[load]\nmode='open'\nrate=10.0\n";
    const SMALL: &str = "[[class]]\nname='small'\ninput_tokens=300\noutput_tokens=10\nshare=1.0\n";
    const REVIEW: &str = "[[class]]\nname='review'\ninput_tokens=8000\noutput_tokens=500\n";

    fn err(text: &str) -> String {
        format!("{:#}", Scenario::parse(text).expect_err(text))
    }

    #[test]
    fn waves_parse_and_bad_values_name_their_key() {
        let with = |w: &str| format!("{OPEN}waves = {{ {w} }}\n{SMALL}");
        let s = Scenario::parse(&with("low = 0.1, high = 0.9, period_s = 60")).unwrap();
        let w = s.waves().unwrap();
        assert_eq!((w.low, w.high, w.period_s), (0.1, 0.9, 60.0));
        assert_eq!(
            Scenario::parse(&format!("{OPEN}{SMALL}")).unwrap().waves(),
            None
        );
        // A flat "wave" (low = high) and a trough at zero are fine.
        assert!(Scenario::parse(&with("low = 0.5, high = 0.5, period_s = 1")).is_ok());
        assert!(Scenario::parse(&with("low = 0, high = 1.2, period_s = 1")).is_ok());
        for (w, key) in [
            ("low = -0.1, high = 0.9, period_s = 60", "load.waves.low"),
            ("low = 0.5, high = 0.4, period_s = 60", "load.waves.high"),
            ("low = 0, high = 0, period_s = 60", "load.waves.high"),
            ("low = 0.1, high = 0.9, period_s = 0", "load.waves.period_s"),
            (
                "low = 0.1, high = 0.9, period_s = -5",
                "load.waves.period_s",
            ),
            ("low = 0.1, high = inf, period_s = 60", "load.waves.high"),
        ] {
            let e = err(&with(w));
            assert!(e.contains(key), "{w}: {e}");
        }
        // Missing, unknown or mistyped keys are refused by name.
        assert!(err(&with("low = 0.1, high = 0.9")).contains("period_s"));
        assert!(err(&with(
            "low = 0.1, high = 0.9, period_s = 60, shape = 'square'"
        ))
        .contains("shape"));
        let e = err(&with("low = '10%', high = 0.9, period_s = 60"));
        assert!(e.contains("invalid type"), "{e}");
        // Waves are for the open loop.
        let closed = "name='x'\n[load]\nmode='closed'\nwaves = { low = 0.1, high = 0.9, period_s = 60 }\n[[class]]\nname='a'\ninput_tokens=300\noutput_tokens=10\nconcurrency=1\n";
        assert!(err(closed).contains("waves"), "{}", err(closed));
    }

    #[test]
    fn a_wave_stays_within_its_bounds_and_averages_their_middle() {
        let w = Waves {
            low: 0.1,
            high: 0.9,
            period_s: 60.0,
        };
        assert!(
            (w.fraction(0.0) - 0.1).abs() < 1e-12,
            "starts at the trough"
        );
        assert!(
            (w.fraction(30.0) - 0.9).abs() < 1e-12,
            "crest at half a period"
        );
        assert!((w.fraction(60.0) - 0.1).abs() < 1e-12);
        let base = 25.0;
        let n = 60_000;
        let mut sum = 0.0;
        for k in 0..n {
            // Midpoints of n equal slices of a period, shifted by 17 s: any whole period.
            let t = 17.0 + (k as f64 + 0.5) * 60.0 / n as f64;
            let r = w.rate(base, t);
            assert!((0.1 * base..=0.9 * base).contains(&r), "{t}: {r}");
            sum += r;
        }
        let mean = sum / n as f64;
        assert!((mean - 0.5 * base).abs() < 1e-6, "{mean}");
        // Far from the start too.
        assert!((w.fraction(1e6 * 60.0 + 30.0) - 0.9).abs() < 1e-6);
    }

    #[test]
    fn backlog_classes_parse_and_misuse_is_named() {
        let ok = format!("{OPEN}{SMALL}{REVIEW}api='jobs'\nbacklog=200\n");
        let s = Scenario::parse(&ok).unwrap();
        assert_eq!(s.backlogs(), [(1, 200)]);
        assert_eq!(s.classes[1].backlog, Some(200));
        assert!(s
            .refuse_backlog("`tutor-load run`")
            .unwrap_err()
            .to_string()
            .contains("class review"));
        assert!(Scenario::parse(&format!("{OPEN}{SMALL}"))
            .unwrap()
            .refuse_backlog("x")
            .is_ok());
        for (text, says) in [
            (format!("{OPEN}{SMALL}{REVIEW}api='jobs'\nbacklog=0\n"), "backlog must be >= 1"),
            (format!("{OPEN}{SMALL}{REVIEW}backlog=5\n"), "backlog needs api = \"jobs\""),
            (format!("{OPEN}{SMALL}{REVIEW}api='answer'\nbacklog=5\n"), "backlog needs api"),
            (format!("{OPEN}{SMALL}{REVIEW}api='jobs'\nbacklog=5\nshare=0.1\n"), "takes no share"),
            (format!("{OPEN}{SMALL}{REVIEW}api='jobs'\nbacklog=-1\n"), "backlog"),
            (
                format!("name='x'\n[load]\nmode='closed'\n[[class]]\nname='a'\ninput_tokens=300\noutput_tokens=10\nconcurrency=1\n{REVIEW}api='jobs'\nbacklog=5\n"),
                "open loop only",
            ),
        ] {
            let e = err(&text);
            assert!(e.contains(says), "{text}: {e}");
        }
        // A backlog alone has no arrivals: the open loop still needs a class with a share.
        let alone = format!("{OPEN}{REVIEW}api='jobs'\nbacklog=5\n");
        assert!(err(&alone).contains("shares"));
    }

    #[test]
    fn old_scenarios_keep_todays_behaviour() {
        let s = Scenario::parse("name='x'\n[load]\nmode='closed'\n[[class]]\nname='a'\ninput_tokens=300\noutput_tokens=10\nconcurrency=1\n").unwrap();
        assert_eq!(
            s.load,
            Load::Closed {
                ramp_s: 0.0,
                ramp: Ramp::Uniform
            }
        );
        let c = &s.classes[0];
        assert_eq!((c.distribution, c.think_ms), (Dist::Fixed, 0.0));
        assert_eq!(s.max_model_len, DEFAULT_MAX_MODEL_LEN);
    }
}

//! Seeded draws of what a scenario leaves to chance: each request's input and output sizes
//! around its class's figures, each closed-loop client's start offset within the ramp, and its
//! think times. Every client has its own streams, derived from (seed, class, client), one per
//! kind of draw: a run replays exactly, and turning think time on does not change the sizes.

use std::time::Duration;

use vllm_sim::text::SplitMix;

use crate::scenario::{Class, Dist, Load, Ramp, Scenario, MIN_INPUT_TOKENS};

/// Stream of a client's (or an open-loop request's) sizes.
const SIZES: u64 = 0x5133_5A35_0000_0001;
/// Stream of a client's think times.
const THINK: u64 = 0x7415_4C00_0000_0002;
/// Stream of a client's start offset.
const START: u64 = 0x57A2_7000_0000_0003;

/// An independent generator for (`seed`, `salt`, `class`, `client`).
pub fn stream(seed: u64, salt: u64, class: usize, client: u64) -> SplitMix {
    let mut r = SplitMix::new(seed ^ salt);
    let mut r = SplitMix::new(r.next_u64() ^ class as u64);
    let mut r = SplitMix::new(r.next_u64() ^ client);
    SplitMix::new(r.next_u64())
}

/// One value around `figure` drawn from `dist` (`spread`: uniform +- fraction; `sigma`:
/// lognormal sigma of ln). Never negative.
pub fn draw(figure: f64, dist: Dist, spread: f64, sigma: f64, rng: &mut SplitMix) -> f64 {
    let v = match dist {
        Dist::Fixed => figure,
        Dist::Uniform => figure * (1.0 + spread * (2.0 * rng.next_f64() - 1.0)),
        Dist::Lognormal => figure * (sigma * standard_normal(rng)).exp(),
        Dist::Exponential => -figure * (1.0 - rng.next_f64()).ln(),
    };
    v.max(0.0)
}

/// A standard normal draw (Box-Muller).
fn standard_normal(rng: &mut SplitMix) -> f64 {
    let u1 = 1.0 - rng.next_f64(); // (0, 1]
    let u2 = rng.next_f64();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// A class index drawn by the classes' shares (`total`: their sum, [`Scenario::total_share`]):
/// one draw from `rng`; the last class with a share when rounding leaves the pick past every
/// share (a class without a share, e.g. a backlog, is never drawn).
pub fn pick_class(scenario: &Scenario, total: f64, rng: &mut SplitMix) -> usize {
    let mut pick = rng.next_f64() * total;
    scenario
        .classes
        .iter()
        .position(|c| {
            pick -= c.share;
            pick < 0.0
        })
        .or_else(|| scenario.classes.iter().rposition(|c| c.share > 0.0))
        .unwrap_or(scenario.classes.len().saturating_sub(1))
}

/// One request's (input, output) tokens for `class`: drawn, rounded, then clamped so that
/// output >= 1, input >= [`MIN_INPUT_TOKENS`] and input + output <= `max_model_len`.
pub fn sizes(class: &Class, max_model_len: u32, rng: &mut SplitMix) -> (u32, u32) {
    let d = |figure: u32, rng: &mut SplitMix| {
        draw(
            f64::from(figure),
            class.distribution,
            class.spread,
            class.sigma,
            rng,
        )
        .round()
        .min(f64::from(u32::MAX)) as u32
    };
    let max_len = max_model_len.max(MIN_INPUT_TOKENS + 1);
    let input = d(class.input_tokens, rng);
    let output = d(class.output_tokens, rng).clamp(1, max_len - MIN_INPUT_TOKENS);
    let input = input.clamp(MIN_INPUT_TOKENS, max_len - output);
    (input, output)
}

/// Start offset of client `client` (of `n` in class `class`) under `load`.
pub fn start_offset(load: &Load, seed: u64, class: usize, client: u64, n: u64) -> Duration {
    let Load::Closed { ramp_s, ramp } = *load else {
        return Duration::ZERO;
    };
    if ramp_s <= 0.0 {
        return Duration::ZERO;
    }
    let at = match ramp {
        Ramp::Uniform => stream(seed, START, class, client).next_f64() * ramp_s,
        Ramp::Even => client as f64 * ramp_s / n.max(1) as f64,
    };
    Duration::from_secs_f64(at)
}

/// One request of a client's plan.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step {
    /// Prompt tokens.
    pub input: u32,
    /// Output tokens asked for.
    pub output: u32,
    /// Seed of the prompt text.
    pub prompt_seed: u64,
    /// Pause after this request ends, before the next is sent.
    pub think: Duration,
}

/// Everything a closed-loop client sends, in order, from the scenario and seed alone.
#[derive(Debug, Clone)]
pub struct ClientPlan {
    class: Class,
    class_index: usize,
    client: u64,
    seed: u64,
    max_model_len: u32,
    sizes: SplitMix,
    think: SplitMix,
    next: u64,
    /// When the client sends its first request, from the run's start.
    pub offset: Duration,
}

impl ClientPlan {
    /// The plan of client `client` of class `class_index` in `scenario` under `seed`.
    pub fn new(scenario: &Scenario, class_index: usize, client: u64, seed: u64) -> Self {
        let class = scenario.classes[class_index].clone();
        let n = u64::from(class.concurrency);
        Self {
            offset: start_offset(&scenario.load, seed, class_index, client, n),
            class,
            class_index,
            client,
            seed,
            max_model_len: scenario.max_model_len,
            sizes: stream(seed, SIZES, class_index, client),
            think: stream(seed, THINK, class_index, client),
            next: 0,
        }
    }

    /// The client's next request.
    pub fn next_step(&mut self) -> Step {
        let (input, output) = sizes(&self.class, self.max_model_len, &mut self.sizes);
        let c = &self.class;
        let think_ms = draw(
            c.think_ms,
            c.think_distribution,
            c.spread,
            c.sigma,
            &mut self.think,
        );
        let prompt_seed =
            crate::prompt::request_seed(self.seed, self.class_index, self.client, self.next);
        self.next += 1;
        Step {
            input,
            output,
            prompt_seed,
            think: Duration::from_secs_f64(think_ms / 1000.0),
        }
    }
}

/// Sizes of open-loop request `i` of class `class_index`.
pub fn open_sizes(scenario: &Scenario, class_index: usize, i: u64, seed: u64) -> (u32, u32) {
    let mut rng = stream(seed, SIZES, class_index, i);
    sizes(
        &scenario.classes[class_index],
        scenario.max_model_len,
        &mut rng,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario(extra_class: &str, load: &str) -> Scenario {
        Scenario::parse(&format!(
            "name='t'\nseed=7\n[load]\nmode='closed'\n{load}\n[[class]]\nname='small'\n\
             input_tokens=400\noutput_tokens=120\nconcurrency=40\n{extra_class}\n"
        ))
        .unwrap()
    }

    fn steps(s: &Scenario, client: u64, n: usize) -> Vec<Step> {
        let mut p = ClientPlan::new(s, 0, client, s.seed);
        (0..n).map(|_| p.next_step()).collect()
    }

    #[test]
    fn drawn_sizes_replay_for_a_seed_and_differ_between_clients() {
        let s = scenario("distribution='uniform'", "");
        assert_eq!(steps(&s, 3, 20), steps(&s, 3, 20));
        assert_ne!(steps(&s, 3, 20), steps(&s, 4, 20));
        let other_seed = ClientPlan::new(&s, 0, 3, 8).next_step();
        assert_ne!(steps(&s, 3, 1)[0], other_seed);
        // Sizes vary within a client too.
        let inputs: std::collections::BTreeSet<u32> =
            steps(&s, 3, 20).iter().map(|x| x.input).collect();
        assert!(inputs.len() > 10, "{inputs:?}");
        // Fixed: exactly the figures.
        let fixed = scenario("", "");
        assert!(steps(&fixed, 1, 20)
            .iter()
            .all(|x| (x.input, x.output, x.think) == (400, 120, Duration::ZERO)));
    }

    #[test]
    fn uniform_stays_within_the_spread_and_centres_on_the_figure() {
        for spread in [0.5, 0.2] {
            let s = scenario(&format!("distribution='uniform'\nspread={spread}"), "");
            let all: Vec<Step> = (0..40).flat_map(|c| steps(&s, c, 250)).collect();
            let (lo, hi) = (400.0 * (1.0 - spread), 400.0 * (1.0 + spread));
            assert!(all.iter().all(|x| (lo..=hi).contains(&f64::from(x.input))));
            let mean = all.iter().map(|x| f64::from(x.input)).sum::<f64>() / all.len() as f64;
            assert!((mean - 400.0).abs() < 8.0, "mean {mean}");
            let out = all.iter().map(|x| f64::from(x.output)).sum::<f64>() / all.len() as f64;
            assert!((out - 120.0).abs() < 3.0, "mean output {out}");
            // Both ends of the range are reached.
            assert!(all
                .iter()
                .any(|x| f64::from(x.input) < lo + 0.1 * (hi - lo)));
            assert!(all
                .iter()
                .any(|x| f64::from(x.input) > hi - 0.1 * (hi - lo)));
        }
    }

    #[test]
    fn lognormal_median_is_the_figure() {
        let s = scenario("distribution='lognormal'\nsigma=0.5", "");
        let mut v: Vec<u32> = (0..40)
            .flat_map(|c| steps(&s, c, 250))
            .map(|x| x.input)
            .collect();
        v.sort_unstable();
        let median = f64::from(v[v.len() / 2]);
        assert!((median - 400.0).abs() < 20.0, "median {median}");
        assert!(v.iter().any(|&x| x > 800), "a right tail");
    }

    #[test]
    fn sizes_are_clamped_to_the_model_length_and_one_token() {
        let mut s = scenario("", "");
        s.max_model_len = 1000;
        let mut c = s.classes[0].clone();
        c.input_tokens = 900;
        c.output_tokens = 300;
        c.distribution = Dist::Lognormal;
        c.sigma = 2.0;
        let mut rng = stream(1, SIZES, 0, 0);
        for _ in 0..5000 {
            let (i, o) = sizes(&c, 1000, &mut rng);
            assert!(i >= MIN_INPUT_TOKENS && o >= 1 && i + o <= 1000, "{i} {o}");
        }
    }

    #[test]
    fn stagger_offsets_fall_within_the_window_and_differ() {
        let s = scenario("", "ramp_s=5");
        let offs: Vec<Duration> = (0..40)
            .map(|c| ClientPlan::new(&s, 0, c, s.seed).offset)
            .collect();
        assert!(offs.iter().all(|o| *o < Duration::from_secs(5)));
        let distinct: std::collections::BTreeSet<_> = offs.iter().collect();
        assert!(distinct.len() > 30);
        assert!(offs.iter().any(|o| *o > Duration::from_secs(4)));
        assert!(offs.iter().any(|o| *o < Duration::from_secs(1)));
        let even = scenario("", "ramp_s=4\nramp='even'");
        let offs: Vec<f64> = (0..40)
            .map(|c| ClientPlan::new(&even, 0, c, 1).offset.as_secs_f64())
            .collect();
        assert_eq!(offs[0], 0.0);
        assert!((offs[10] - 1.0).abs() < 1e-9 && (offs[39] - 3.9).abs() < 1e-9);
        // No ramp: everyone at once (today's behaviour).
        let none = scenario("", "");
        assert!((0..40).all(|c| ClientPlan::new(&none, 0, c, 1).offset.is_zero()));
    }

    #[test]
    fn think_times_are_planned_fixed_or_drawn() {
        let s = scenario("think_ms=1500", "");
        assert!(steps(&s, 0, 5)
            .iter()
            .all(|x| x.think == Duration::from_millis(1500)));
        let s = scenario("think_ms=1000\nthink_distribution='exponential'", "");
        let t: Vec<f64> = (0..20)
            .flat_map(|c| steps(&s, c, 100))
            .map(|x| x.think.as_secs_f64())
            .collect();
        let mean = t.iter().sum::<f64>() / t.len() as f64;
        assert!((mean - 1.0).abs() < 0.1, "mean think {mean}");
        // Turning think time on leaves the sizes alone.
        let a = scenario("distribution='uniform'", "");
        let b = scenario("distribution='uniform'\nthink_ms=300", "");
        let sizes = |s: &Scenario| -> Vec<(u32, u32)> {
            steps(s, 2, 10)
                .iter()
                .map(|x| (x.input, x.output))
                .collect()
        };
        assert_eq!(sizes(&a), sizes(&b));
    }
}

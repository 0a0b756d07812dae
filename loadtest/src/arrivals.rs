//! The arrival sequence of an open-loop run: Poisson arrivals of the scenario's mix at a given
//! rate, from a seed. The floor's arrivals are the mixed sequence with every other class
//! dropped, so its questions arrive at exactly the instants they have in the mixed runs.

use serde::Serialize;
use vllm_sim::text::SplitMix;

use crate::draw::pick_class;
use crate::scenario::{Scenario, Waves};

/// One request of the sequence.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Arrival {
    /// When it arrives, simulated seconds from the run's start.
    pub at_s: f64,
    /// Index of its class in the scenario.
    pub class: usize,
    /// Its number in the mixed sequence, from 1: seeds its sizes
    /// ([`crate::draw::open_sizes`]) and its prompt text, so the floor's questions are the
    /// mixed runs' questions, byte for byte.
    pub index: u64,
}

/// Poisson arrivals in `[0, until_s)` at `rate` requests per simulated second (times the
/// scenario's `waves` fraction at each instant, when it has waves: [`Stream`]), each request's
/// class drawn by the classes' `share`. The same draws as `tutor-load run`'s open loop
/// ([`crate::runner::run`]): one generator seeded with `seed`, an exponential gap then a class
/// per request. Without waves the gaps are the same exponential draws divided by `rate`, so
/// every load of one seed has the same classes and sizes in the same order, only closer
/// together (with waves the wave's instants do not scale, so loads differ).
pub fn mixed(scenario: &Scenario, rate: f64, seed: u64, until_s: f64) -> Vec<Arrival> {
    Stream::new(scenario, rate, seed)
        .take_while(|a| a.at_s < until_s)
        .collect()
}

/// The arrivals of an open loop, one after another, without end (none when the rate or the
/// shares are not positive).
///
/// Without waves: Poisson at `rate`: per request an exponential gap at `rate`, then its class.
/// With waves (`[load] waves`): a Poisson process whose rate at `t` is
/// `rate x waves.fraction(t)`, drawn by thinning: candidates arrive at the crest's rate
/// `rate x high` (an exponential gap, then a class), and each is kept with probability
/// `fraction(t) / high` (a third draw). Every draw comes from one generator seeded with `seed`:
/// the same seed gives the same sequence.
#[derive(Debug, Clone)]
pub struct Stream<'a> {
    scenario: &'a Scenario,
    rng: SplitMix,
    total: f64,
    /// Candidates' rate: `rate`, or `rate x high` with waves.
    peak: f64,
    waves: Option<Waves>,
    at: f64,
    index: u64,
}

impl<'a> Stream<'a> {
    /// The arrivals of `scenario` (its shares and waves) at base rate `rate` from `seed`.
    pub fn new(scenario: &'a Scenario, rate: f64, seed: u64) -> Self {
        let waves = scenario.waves();
        let peak = rate * waves.map_or(1.0, |w| w.high);
        Self {
            scenario,
            rng: SplitMix::new(seed),
            total: scenario.total_share(),
            peak,
            waves,
            at: 0.0,
            index: 0,
        }
    }
}

impl Iterator for Stream<'_> {
    type Item = Arrival;

    fn next(&mut self) -> Option<Arrival> {
        if !(self.peak > 0.0 && self.peak.is_finite()) || self.total <= 0.0 {
            return None;
        }
        loop {
            self.at += -(1.0 - self.rng.next_f64()).ln() / self.peak;
            let class = pick_class(self.scenario, self.total, &mut self.rng);
            if let Some(w) = self.waves {
                if self.rng.next_f64() * w.high >= w.fraction(self.at) {
                    continue;
                }
            }
            self.index += 1;
            return Some(Arrival {
                at_s: self.at,
                class,
                index: self.index,
            });
        }
    }
}

/// A step change in the mix: from `at_s` on, `class` arrives `factor` times as often.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MixStep {
    /// Simulated seconds from the run's start.
    pub at_s: f64,
    /// The class's name.
    pub class: String,
    /// Its arrival rate from then on, a multiple of the mix's.
    pub factor: f64,
}

/// Indices of the arrivals a step change adds start here (the mixed sequence's stay below).
pub const STEP_INDEX_BASE: u64 = 1 << 40;

/// `mixed` (the sequence at `rate`) with `step` applied: above a factor of 1, a second Poisson
/// stream of the class alone at `rate x share x (factor - 1)` from `step.at_s` on (its own
/// draws, from `seed`); below, each of the class's arrivals after `step.at_s` is kept with
/// probability `factor`. Sorted by time; the arrivals before the step are exactly `mixed`'s.
pub fn stepped(
    scenario: &Scenario,
    mixed: Vec<Arrival>,
    step: &MixStep,
    rate: f64,
    seed: u64,
    until_s: f64,
) -> Vec<Arrival> {
    let Some(class) = scenario.classes.iter().position(|c| c.name == step.class) else {
        return mixed;
    };
    let total = scenario.total_share();
    let share = if total > 0.0 {
        scenario.classes[class].share / total
    } else {
        0.0
    };
    let mut rng = SplitMix::new(seed ^ 0x5743_4550_5354_4550);
    let mut out: Vec<Arrival> = if step.factor < 1.0 {
        mixed
            .into_iter()
            .filter(|a| a.class != class || a.at_s < step.at_s || rng.next_f64() < step.factor)
            .collect()
    } else {
        mixed
    };
    let extra = rate * share * (step.factor - 1.0);
    if extra > 0.0 && extra.is_finite() {
        let mut at = step.at_s;
        let mut index = STEP_INDEX_BASE;
        loop {
            at += -(1.0 - rng.next_f64()).ln() / extra;
            if at >= until_s {
                break;
            }
            index += 1;
            out.push(Arrival {
                at_s: at,
                class,
                index,
            });
        }
    }
    out.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    out
}

/// The arrivals of class `class` alone (the floor's: the same instants, indices and sizes).
pub fn only(arrivals: &[Arrival], class: usize) -> Vec<Arrival> {
    arrivals
        .iter()
        .filter(|a| a.class == class)
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::draw::pick_class;

    #[test]
    fn a_step_doubles_the_class_from_its_moment_on_and_leaves_the_rest_as_it_was() {
        let s = mix();
        let large = s.classes.iter().position(|c| c.name == "large").unwrap();
        let a = mixed(&s, 12.0, 1, 2_000.0);
        let step = MixStep {
            at_s: 1_000.0,
            class: "large".into(),
            factor: 2.0,
        };
        let b = stepped(&s, a.clone(), &step, 12.0, 1, 2_000.0);
        let count = |v: &[Arrival], from: f64, to: f64, c: usize| {
            v.iter()
                .filter(|x| x.class == c && x.at_s >= from && x.at_s < to)
                .count() as f64
        };
        // Before the step: the same sequence.
        let before: Vec<_> = b.iter().filter(|x| x.at_s < 1_000.0).copied().collect();
        let was: Vec<_> = a.iter().filter(|x| x.at_s < 1_000.0).copied().collect();
        assert_eq!(before, was);
        // After it: about twice the reviews (Poisson: within 25%), the other classes unchanged.
        let ratio = count(&b, 1_000.0, 2_000.0, large) / count(&a, 1_000.0, 2_000.0, large);
        assert!((1.75..2.25).contains(&ratio), "{ratio}");
        let small = s.classes.iter().position(|c| c.name == "small").unwrap();
        assert_eq!(
            count(&b, 1_000.0, 2_000.0, small),
            count(&a, 1_000.0, 2_000.0, small)
        );
        assert!(b.windows(2).all(|w| w[0].at_s <= w[1].at_s));
        // Indices stay distinct (sizes and prompts are seeded by them).
        let ids: std::collections::BTreeSet<u64> = b.iter().map(|x| x.index).collect();
        assert_eq!(ids.len(), b.len());
    }

    fn waved(low: f64, high: f64, period_s: f64) -> Scenario {
        let mut s = mix();
        s.load = crate::scenario::Load::Open {
            rate: 1.0,
            waves: Some(Waves {
                low,
                high,
                period_s,
            }),
        };
        s
    }

    #[test]
    fn without_waves_the_stream_is_the_old_poisson_sequence() {
        // The draws before waves existed: a gap at `rate`, then a class, per request.
        let s = mix();
        let mut rng = SplitMix::new(5);
        let total = s.total_share();
        let mut at = 0.0;
        for (i, a) in Stream::new(&s, 7.0, 5).take(2_000).enumerate() {
            at += -(1.0 - rng.next_f64()).ln() / 7.0;
            let class = pick_class(&s, total, &mut rng);
            assert_eq!(
                a,
                Arrival {
                    at_s: at,
                    class,
                    index: i as u64 + 1
                }
            );
        }
    }

    #[test]
    fn waves_follow_the_rate_and_replay_per_seed() {
        let (low, high, period) = (0.1, 0.9, 60.0);
        let s = waved(low, high, period);
        let base = 20.0;
        let periods = 50.0;
        let a = mixed(&s, base, 1, periods * period);
        // The mean rate over whole periods is (low + high) / 2 x base: 600 expected per period,
        // 30,000 in all (Poisson: sd ~170, so within 3%).
        let mean = a.len() as f64 / (periods * period);
        assert!((mean / (0.5 * base) - 1.0).abs() < 0.03, "{mean}");
        // By phase (tenths of a period, all periods together), the rate follows the wave: near
        // the expected mean of each tenth, and always within [low, high] x base (with the
        // Poisson noise of ~3,000 arrivals a tenth at most: 10%).
        let mut bins = [0usize; 10];
        for x in &a {
            bins[((x.at_s % period) / period * 10.0) as usize % 10] += 1;
        }
        let tenth = period / 10.0;
        for (k, n) in bins.iter().enumerate() {
            let rate = *n as f64 / (periods * tenth);
            let expected: f64 = (0..1000)
                .map(|j| {
                    let w = s.waves().unwrap();
                    w.rate(base, (k as f64 + (j as f64 + 0.5) / 1000.0) * tenth)
                })
                .sum::<f64>()
                / 1000.0;
            assert!(
                (rate / expected - 1.0).abs() < 0.1,
                "tenth {k}: {rate} vs {expected}"
            );
            assert!(
                rate >= low * base * 0.9 && rate <= high * base * 1.1,
                "tenth {k}: {rate}"
            );
        }
        assert!(
            bins[5] > 4 * bins[0],
            "crest {} vs trough {}",
            bins[5],
            bins[0]
        );
        // Sorted, numbered from 1 without gaps, classes by share as before.
        assert!(a.windows(2).all(|w| w[0].at_s < w[1].at_s));
        assert!(a.iter().enumerate().all(|(i, x)| x.index == i as u64 + 1));
        let small = a.iter().filter(|x| x.class == 0).count() as f64 / a.len() as f64;
        assert!((0.68..0.72).contains(&small), "{small}");
        // The same seed replays; another seed does not.
        assert_eq!(mixed(&s, base, 1, periods * period), a);
        assert_ne!(mixed(&s, base, 2, periods * period), a);
        // A flat wave at 1.0 is the plain Poisson sequence at the base rate, but for the third
        // draw per candidate: the same mean rate.
        let flat = mixed(&waved(1.0, 1.0, period), base, 1, 600.0);
        assert!((flat.len() as f64 / 600.0 / base - 1.0).abs() < 0.05);
    }

    #[test]
    fn a_backlog_class_never_arrives() {
        let s = Scenario::parse(
            "name='t'\n[load]\nmode='open'\nrate=1\n[[class]]\nname='small'\n\
             input_tokens=300\noutput_tokens=100\nshare=1\n[[class]]\nname='review'\n\
             api='jobs'\nbacklog=5\ninput_tokens=8000\noutput_tokens=500\n",
        )
        .unwrap();
        assert!(mixed(&s, 50.0, 3, 100.0).iter().all(|a| a.class == 0));
    }

    fn mix() -> Scenario {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
        Scenario::load(&dir.join("seed-mix-open.toml")).unwrap()
    }

    #[test]
    fn the_floor_gets_the_mixed_runs_questions_at_the_same_instants() {
        let s = mix();
        let small = s.classes.iter().position(|c| c.name == "small").unwrap();
        let a = mixed(&s, 12.0, 1, 200.0);
        let floor = only(&a, small);
        // A Poisson mix: 70% small, the rest medium or large.
        let share = floor.len() as f64 / a.len() as f64;
        assert!((0.65..0.75).contains(&share), "{share}");
        assert!(a.iter().any(|x| x.class != small));
        // The floor is exactly the mixed sequence's small requests: instants, indices, sizes.
        let from_mixed: Vec<_> = a.iter().filter(|x| x.class == small).collect();
        assert_eq!(floor.len(), from_mixed.len());
        for (f, m) in floor.iter().zip(from_mixed) {
            assert_eq!(f, m);
            assert_eq!(
                crate::draw::open_sizes(&s, f.class, f.index, 1),
                crate::draw::open_sizes(&s, m.class, m.index, 1)
            );
        }
        // The same seed replays; another seed does not.
        assert_eq!(mixed(&s, 12.0, 1, 200.0), a);
        assert_ne!(mixed(&s, 12.0, 2, 200.0), a);
        // Another load of the same seed: the same classes in the same order, times scaled.
        let b = mixed(&s, 6.0, 1, 400.0);
        assert_eq!(b.len(), a.len());
        for (x, y) in a.iter().zip(&b) {
            assert_eq!((x.class, x.index), (y.class, y.index));
            assert!((y.at_s - 2.0 * x.at_s).abs() < 1e-9);
        }
        // Sizes are drawn (uniform +-50%), not fixed.
        let sizes: std::collections::BTreeSet<u32> = floor
            .iter()
            .map(|f| crate::draw::open_sizes(&s, f.class, f.index, 1).0)
            .collect();
        assert!(sizes.len() > 50, "{}", sizes.len());
    }
}

//! The autopilot: paces long work to the lanes' time-to-first-token objectives
//! (`[lanes.<lane>] ttft_slo_ms`, `[autopilot]`), so an SRE states "questions get their first
//! token within 500 ms at p99" instead of hand-picking the prefill budget and the large lane's
//! seats for each engine setting.
//!
//! Every `autopilot.interval_ms` it reads each lane's objective quantile over the last
//! `autopilot.window_ms` (`crate::telemetry::ttft_window`: refusals for waiting count as
//! infinitely late), judges the lanes with `min_samples` or more, and lets the AIMD rule of
//! [`controller`] move the prefill budget (`admission.prefill_budget_tokens`) and the large
//! lane's seats (its `max_concurrency` and `ceiling`) between their floors and the configured
//! values. The result is put in force as a reload puts limits in force (nothing running is cut;
//! a lowered lane admits no one until it is under its new limit). The large lane's own objective,
//! if any, is not judged: throttling the large lane cannot help it. A third knob, the small
//! lane's reservation ([`reserve`], `autopilot.reserve_small_seats`), goes up when the
//! questions' objective is at risk and they waited for seats, and back down while it holds
//! with headroom.
//!
//! With `autopilot.enabled = false` (the default) it changes nothing: the configured values
//! hold exactly. It reads the configuration in force at each look, so a reload turns it on or
//! off and moves its bounds; while it paces, a reload puts its pace in force over the new
//! file's limits at once (`AppState::set_paced_limits`: the knobs moved inside the new
//! bounds), never the configured values in between. Under `admission.policy = "fifo"` there
//! are no lanes to pace. With `quota.backend = "redis"` one replica leads ([`leader`]): it
//! judges the objectives on its own requests (a load balancer gives each replica a sample of
//! the fleet's) and publishes its values as the shared limits record; the others follow it.
//! At shutdown, or turned off, a leader puts the configured values back.
//!
//! Each change is a log line and a metric (`tutor_gateway_autopilot_*`).

pub mod controller;
pub mod leader;
pub mod piecing;
pub mod reserve;

use std::num::NonZeroU32;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Config, Policy};
use crate::lane::Lane;
use crate::pipeline::AppState;
use crate::telemetry::autopilot_metrics::Knobs;
use crate::telemetry::ttft_window::TtftWindow;
use crate::telemetry::Line;
use controller::{Bounds, Controller, Gains, Pace, Reading, Step};
use piecing::{PieceController, PieceStep};
use reserve::{Reserve, ReserveBounds, ReserveGains, ReserveStep, SmallReading};

/// How long a leader stopping may take to put the configured values back.
const HAND_BACK_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Starts the autopilot's loop on `state` until `stop` (tracked by `tasks`: at shutdown a
/// leader puts the configured values back before the quota's connection closes).
pub fn start(state: AppState, stop: CancellationToken, tasks: &TaskTracker) {
    // The gauges show the configured knobs from the start, not zeros until the first look.
    let config = state.config();
    state.metrics().autopilot().set(
        off(&config).is_none(),
        knobs(bounds(&config).max, reserve_bounds(&config).min),
    );
    let watch = state.metrics().background().clone();
    tasks.spawn(watch.watch("autopilot", async move {
        let mut pilot = Pilot::default();
        loop {
            let interval = state.config().autopilot.interval;
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep(interval) => {}
            }
            #[cfg(test)]
            crate::faults::autopilot(interval);
            pilot.look(&state).await;
        }
        let _ = tokio::time::timeout(HAND_BACK_WAIT, pilot.hand_back(&state)).await;
    }));
}

/// The loop's state between looks.
#[derive(Default)]
struct Pilot {
    controller: Option<Controller>,
    /// The small lane's reservation.
    reserve: Option<Reserve>,
    /// The configuration and the knobs last put in force by the autopilot.
    applied: Option<(Arc<Config>, Pace, u32)>,
    /// Whether "not with this configuration" was logged.
    told: bool,
    /// With the Redis quota: this replica's claim to lead.
    lease: leader::Lease,
    /// The piece size (every replica paces its own).
    pieces: Option<PieceController>,
}

impl Pilot {
    async fn look(&mut self, state: &AppState) {
        let config = state.config();
        let metrics = state.metrics().autopilot();
        let bounds = bounds(&config);
        let redis = state.admission().shared();
        if let Some(why) = off(&config) {
            if self.applied.is_some() {
                // Turned off by a reload: the configured values again, exactly.
                self.hand_back(state).await;
            } else if let Some(redis) = redis {
                // A leader that died leaves its paced record in force; the replicas whose
                // autopilot is on take the lease and pace from there, but if none is, nobody
                // would ever put the configured values back.
                if redis.autopilot_record_in_force() && leader::Lease::free(redis).await {
                    tracing::warn!(
                        "autopilot: the leader's paced limits outlived it; the configured ones written back"
                    );
                    redis.restore_configured().await;
                }
            }
            self.controller = None;
            self.reserve = None;
            self.stop_pieces(state);
            if config.autopilot.enabled && !self.told {
                tracing::warn!(why, "autopilot: enabled but off");
                self.told = true;
            }
            metrics.set(false, knobs(bounds.max, reserve_bounds(&config).min));
            metrics.leads(false);
            return;
        }
        let pieces_first = self.pace_pieces(state, &config);
        if let Some(redis) = redis {
            let Some(leads) = self.lease.claim(redis, config.autopilot.interval).await else {
                // Redis did not answer: nothing can be read or published this look. The pace
                // so far is kept (one failed renewal used to start a leader again from the
                // configured values, undoing its pace fleet-wide).
                return;
            };
            metrics.leads(leads);
            if !leads {
                // The leader's values are in force (or, until one leads, the configured ones).
                self.controller = None;
                self.reserve = None;
                self.applied = None;
                state.set_paced_limits(None);
                let in_force = redis
                    .shared_knobs()
                    .await
                    .unwrap_or(knobs(bounds.max, reserve_bounds(&config).min));
                metrics.set(true, in_force);
                return;
            }
        } else {
            metrics.leads(true);
        }
        let ap = &config.autopilot;
        let window = state.metrics().ttft_window();
        let now = tokio::time::Instant::now();
        // What the knobs decide on: the first tokens since any of them last moved (the pacing
        // knobs or the small lane's reservation: both shape every first token, so older ones
        // tell of a setting no longer in force), at most the window. The metrics show the
        // whole window. (Reading a span once dropped the ring's older samples, so every
        // decision was made on this span while the metrics showed it too; the results in
        // docs/results/autopilot/ were measured that way, and the rule is now written down.)
        let judged = self.judged_span(now, ap.window);
        let mut reading = Reading::default();
        let worse = |w: Option<f64>, ratio: f64| Some(w.map_or(ratio, |w: f64| w.max(ratio)));
        for lane in [Lane::Small, Lane::Medium] {
            let Some(objective) = config.lanes.get(lane).ttft_slo else {
                continue;
            };
            let target = objective.target.as_secs_f64();
            // No sample in the window: 0, as the metric's help says (the last value, an
            // infinite miss included, used to stay for good once traffic stopped).
            let (seconds, ratio) = window
                .quantile(lane, objective.quantile(), ap.window)
                .map_or((0.0, 0.0), |q| (q.seconds, q.seconds / target));
            metrics.measured(lane, seconds, ratio);
            match window.quantile(lane, objective.quantile(), judged) {
                Some(q) if q.samples >= ap.min_samples as usize => {
                    let ratio = q.seconds / target;
                    reading.window = worse(reading.window, ratio);
                    reading.since_change = worse(reading.since_change, ratio);
                }
                _ => {}
            }
        }
        let worst = reading.window;
        let gains = Gains {
            tighten_percent: ap.tighten_percent,
            loosen_prefill_tokens: ap.loosen_prefill_tokens,
            loosen_large_seats: ap.loosen_large_seats,
            headroom_percent: ap.headroom_percent,
            hold: ap.hold,
        };
        if pieces_first {
            // The steps are long and the pieces can still shorten them: they go first (they
            // cost reviews nothing); a miss does not tighten the budget or the seats meanwhile.
            reading.window = reading.window.map(|w| w.min(1.0));
        }
        let small_seats = self.pace_reserve(state, &config, (now, judged));
        let starving = starving(state, &config);
        let controller = self
            .controller
            .get_or_insert_with(|| Controller::new(bounds));
        let before = controller.pace();
        let step = controller.step(now, reading, starving, bounds, gains);
        let pace = controller.pace();
        if let Some(reason) = step.reason() {
            metrics.adjusted(reason);
        }
        if step != Step::Hold {
            tracing::info!(
                reason = step.reason().unwrap_or("hold"),
                worst_objective_ratio = worst.unwrap_or(0.0),
                since_change_ratio = reading.since_change.unwrap_or(0.0),
                prefill_budget_tokens = pace.prefill_budget,
                large_seats = pace.large_seats,
                prefill_budget_before = before.prefill_budget,
                large_seats_before = before.large_seats,
                "autopilot"
            );
        }
        let stale =
            self.applied.as_ref().is_none_or(|(c, p, s)| {
                !Arc::ptr_eq(c, &config) || *p != pace || *s != small_seats
            }) || redis.is_some_and(|r| !r.paced_record_in_force() && !r.pushed_record_in_force());
        // A reload while this look waited on Redis: its limits stand; the next look paces
        // from the new file (applying now would put the old file's limits back).
        if !Arc::ptr_eq(&config, &state.config()) {
            return;
        }
        if stale {
            let limits = paced(&config, pace, small_seats);
            match redis {
                None => {
                    // Under the reload lock, checked again: a reload between the check above
                    // and this call would otherwise have the old file's limits put back. A
                    // reload under way (loading a tokenizer, say) is not waited for on this
                    // async worker: the next look paces from what it puts in force.
                    let Some(_one_at_a_time) = state.try_reload_lock() else {
                        return;
                    };
                    if !Arc::ptr_eq(&config, &state.config()) {
                        return;
                    }
                    state.admission().set_limits(&limits, false);
                    self.in_force(state, config, pace, small_seats);
                }
                Some(r) => {
                    // Redis did not answer: again at the next look.
                    if r.publish_paced(&limits).await.is_some() {
                        self.in_force(state, config, pace, small_seats);
                    }
                }
            }
        }
        metrics.set(true, knobs(pace, small_seats));
    }

    /// `pace` and `small_seats` on `config` are in force: kept as applied, and overlaid on
    /// the file by every reload from now on.
    fn in_force(&mut self, state: &AppState, config: Arc<Config>, pace: Pace, small_seats: u32) {
        self.applied = Some((config, pace, small_seats));
        state.set_paced_limits(Some(Arc::new(move |c: &Config| {
            overlay(c, pace, small_seats)
        })));
    }

    /// The span the knobs are judged on at `now`: since the pacing knobs or the small lane's
    /// reservation last moved, at most `window`.
    fn judged_span(
        &self,
        now: tokio::time::Instant,
        window: std::time::Duration,
    ) -> std::time::Duration {
        let changed = [
            self.controller.as_ref().and_then(Controller::changed_at),
            self.reserve.as_ref().and_then(Reserve::changed_at),
        ];
        changed
            .into_iter()
            .flatten()
            .max()
            .map_or(window, |at| now.saturating_duration_since(at).min(window))
    }

    /// One look at the small lane's objective and its waits: moves its reservation
    /// ([`reserve`]). The reservation in force.
    fn pace_reserve(
        &mut self,
        state: &AppState,
        config: &Config,
        (now, judged): (tokio::time::Instant, std::time::Duration),
    ) -> u32 {
        let bounds = reserve_bounds(config);
        if bounds.min == bounds.max {
            // Nowhere to move (`reserve_small_seats = false`, or a policy other than `lanes`):
            // the configured reservation holds, with no decision counted or logged.
            self.reserve = None;
            return bounds.min;
        }
        let reserve = self.reserve.get_or_insert_with(|| Reserve::new(bounds));
        let ap = &config.autopilot;
        let reading = config
            .lanes
            .small
            .ttft_slo
            .map_or_else(SmallReading::default, |o| {
                small_reading(
                    state.metrics().ttft_window(),
                    o.target.as_secs_f64(),
                    o.quantile(),
                    (judged, judged),
                    ap.min_samples as usize,
                )
            });
        let gains = ReserveGains {
            tighten_percent: ap.tighten_percent,
            loosen_seats: ap.loosen_large_seats,
            headroom_percent: ap.headroom_percent,
            hold: ap.hold,
        };
        let before = reserve.seats();
        let step = reserve.step(now, reading, bounds, gains);
        if let Some(reason) = step.reason() {
            state.metrics().autopilot().adjusted(reason);
        }
        if step != ReserveStep::Hold {
            tracing::info!(
                reason = step.reason().unwrap_or("hold"),
                small_objective_ratio = reading.window.unwrap_or(0.0),
                small_wait_ratio = reading.waited.unwrap_or(0.0),
                small_seats = reserve.seats(),
                small_seats_before = before,
                "autopilot reserve"
            );
        }
        reserve.seats()
    }

    /// One look at the engine's steps: moves the piece size (`piecing`). Whether the pieces
    /// go first (long steps they can still shorten).
    fn pace_pieces(&mut self, state: &AppState, config: &Config) -> bool {
        let ap = &config.autopilot;
        if !ap.pieces || config.admission.prefill_piece_tokens != 0 {
            self.stop_pieces(state);
            return false;
        }
        let now = tokio::time::Instant::now();
        let pieces = self.pieces.get_or_insert_with(|| PieceController::new(now));
        let steps = state.metrics().step_window();
        let reading = steps.since(pieces.since(), ap.window);
        let first = pieces.may_shorten(reading, ap);
        let before = pieces.size();
        let step = pieces.step(now, reading, ap);
        let metrics = state.metrics().autopilot();
        if let Some(r) = reading {
            metrics.steps(r.longest_p90, r.typical);
        }
        if let Some(reason) = step.reason() {
            metrics.adjusted(reason);
        }
        if step != PieceStep::Hold {
            tracing::info!(
                reason = step.reason().unwrap_or("hold"),
                longest_step_p90_ms = reading.map_or(0.0, |r| r.longest_p90 * 1000.0),
                typical_step_ms = reading.map_or(0.0, |r| r.typical * 1000.0),
                piece_tokens = pieces.size(),
                piece_tokens_before = before,
                "autopilot pieces"
            );
        }
        state.set_paced_piece_tokens(pieces.size());
        metrics.piece_tokens(pieces.size());
        first
    }

    /// Pieces off (the autopilot turned off, or a configured size in force).
    fn stop_pieces(&mut self, state: &AppState) {
        self.pieces = None;
        state.set_paced_piece_tokens(0);
        state.metrics().autopilot().piece_tokens(0);
    }

    /// Puts the configured values back if the autopilot paced them (turned off, or stopping),
    /// and gives up the lead.
    async fn hand_back(&mut self, state: &AppState) {
        self.stop_pieces(state);
        let config = state.config();
        state.set_paced_limits(None);
        if self.applied.is_some() {
            match state.admission().shared() {
                None => {
                    // Under the reload lock, with the configuration in force then (as `look`
                    // paces): a reload between reading it and this call had its file's limits
                    // replaced by the old file's until the next reload. A reload under way
                    // puts its own file's limits in force, or (if it swapped while the pace
                    // was still set) the next look hands back again.
                    if let Some(_one_at_a_time) = state.try_reload_lock() {
                        state.admission().set_limits(&state.config(), false);
                        self.applied = None;
                    }
                }
                Some(redis) => {
                    self.applied = None;
                    #[cfg(test)]
                    crate::faults::at(crate::faults::Point::HandingBack, redis.replica());
                    // A reload landing meanwhile put its file's limits in this replica's
                    // record and left them to be written; the publish replaced them with the
                    // file read above, for the fleet until the next reload. So the file in
                    // force after the publish is published again (a reload rarely comes twice
                    // in a round trip; three tries bound it), and a reload after that writes
                    // its own.
                    let mut config = config;
                    for _ in 0..3 {
                        redis.publish_paced(&config).await;
                        let now = state.config();
                        if Arc::ptr_eq(&now, &config) {
                            break;
                        }
                        config = now;
                    }
                }
            }
        }
        if let Some(redis) = state.admission().shared() {
            self.lease.resign(redis).await;
        }
    }
}

/// Whether the large lane is starving: requests wait in it and, at its admissions of the last
/// 10 s, the last of them would wait more than `autopilot.max_large_wait_ms` (or nothing was
/// admitted lately). Reviews come before a question's objective.
/// Each of its two lines (long prompts waiting for prefill room, and the rest) is judged on
/// its own.
fn starving(state: &AppState, config: &Config) -> bool {
    let large = *state.admission().snapshot().lane(Lane::Large);
    let limit = config.autopilot.max_large_wait;
    [false, true].into_iter().any(|long| {
        let waiting = large.line_depth(long);
        waiting > 0
            && state
                .metrics()
                .admission_rate()
                .predict(Line::new(Lane::Large, long), waiting)
                .is_none_or(|wait| wait > limit)
    })
}

/// Why the autopilot does not run under `config`; `None`: it runs.
fn off(config: &Config) -> Option<&'static str> {
    if !config.autopilot.enabled {
        Some("autopilot.enabled is false")
    } else if config.admission.policy == Policy::Fifo {
        Some("admission.policy = \"fifo\" has no lanes to pace")
    } else {
        None
    }
}

/// The small lane's objective read for its reservation: the quantile over the target over
/// `window` and since `since` (each with `min_samples` first tokens), and the same quantile of
/// those first tokens' waits for admission over the target.
fn small_reading(
    window: &TtftWindow,
    target: f64,
    q: f64,
    (over, since): (std::time::Duration, std::time::Duration),
    min_samples: usize,
) -> SmallReading {
    let ratio = |span| {
        window
            .quantile(Lane::Small, q, span)
            .filter(|w| w.samples >= min_samples)
            .map(|w| w.seconds / target)
    };
    SmallReading {
        window: ratio(over),
        since_change: ratio(since),
        waited: window
            .wait_quantile(Lane::Small, q, over)
            .filter(|w| w.samples >= min_samples)
            .map(|w| w.seconds / target),
    }
}

/// Where the small lane's reservation may go under `config`: from the configured one up to
/// its ceiling and the seats the other lanes' configured reservations leave; nowhere under
/// `autopilot.reserve_small_seats = false` or a policy other than `lanes`.
fn reserve_bounds(config: &Config) -> ReserveBounds {
    let small = &config.lanes.small;
    let min = small.max_concurrency.get();
    if !config.autopilot.reserve_small_seats || config.admission.policy != Policy::Lanes {
        return ReserveBounds { min, max: min };
    }
    let others: u32 = [Lane::Medium, Lane::Large]
        .into_iter()
        .map(|l| config.lanes.get(l).max_concurrency.get())
        .fold(0, u32::saturating_add);
    let max = config
        .admission
        .seats
        .get()
        .saturating_sub(others)
        .min(small.ceiling.get())
        .max(min);
    ReserveBounds { min, max }
}

/// The knobs as the metrics show them.
fn knobs(pace: Pace, small_seats: u32) -> Knobs {
    Knobs {
        prefill_budget: pace.prefill_budget,
        large_seats: pace.large_seats,
        small_seats,
    }
}

/// The knobs' floors and ceilings under `config`: the configured prefill budget and the large
/// lane's ceiling above, `autopilot.min_prefill_budget_tokens` (at least one long prompt) and
/// `autopilot.min_large_seats` below.
fn bounds(config: &Config) -> Bounds {
    let large = &config.lanes.large;
    let max = Pace {
        prefill_budget: config.admission.prefill_budget_tokens,
        large_seats: large.ceiling.get().max(large.max_concurrency.get()),
    };
    let long = u64::from(config.admission.long_prompt_tokens.get());
    let min_budget = config
        .autopilot
        .min_prefill_budget_tokens
        .unwrap_or(long)
        .max(long)
        .min(max.prefill_budget);
    Bounds {
        min: Pace {
            prefill_budget: min_budget,
            large_seats: config.autopilot.min_large_seats.min(max.large_seats),
        },
        max,
    }
}

/// The limits of `config` (a reload's) under the pace in force: the knobs moved inside its
/// bounds, or its own values when it turns the autopilot off.
fn overlay(config: &Config, pace: Pace, small_seats: u32) -> Config {
    if off(config).is_some() {
        return config.clone();
    }
    let reserve = reserve_bounds(config);
    paced(
        config,
        bounds(config).clamp(pace),
        small_seats.clamp(reserve.min, reserve.max),
    )
}

/// `config` with the knobs at `pace` and the small lane's reservation at `small_seats`.
fn paced(config: &Config, pace: Pace, small_seats: u32) -> Config {
    let mut c = config.clone();
    let small = NonZeroU32::new(small_seats).unwrap_or(c.lanes.small.max_concurrency);
    c.lanes.small.max_concurrency = small;
    c.lanes.small.ceiling = c.lanes.small.ceiling.max(small);
    c.admission.prefill_budget_tokens = pace.prefill_budget;
    let seats = NonZeroU32::new(pace.large_seats).unwrap_or(NonZeroU32::MIN);
    c.lanes.large.ceiling = seats;
    c.lanes.large.max_concurrency = c.lanes.large.max_concurrency.min(seats);
    c
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The knobs are judged on the first tokens since any of them last moved (the pacing
    /// knobs or the small lane's reservation), at most the window.
    #[tokio::test(start_paused = true)]
    async fn the_knobs_are_judged_since_any_of_them_last_moved_at_most_the_window() {
        let window = Duration::from_secs(30);
        let mut pilot = Pilot::default();
        let now = || tokio::time::Instant::now();
        assert_eq!(
            pilot.judged_span(now(), window),
            window,
            "nothing moved yet"
        );
        let bounds = Bounds {
            min: Pace {
                prefill_budget: 2_048,
                large_seats: 1,
            },
            max: Pace {
                prefill_budget: 12_288,
                large_seats: 10,
            },
        };
        let gains = Gains {
            tighten_percent: 50,
            loosen_prefill_tokens: 1_024,
            loosen_large_seats: 1,
            headroom_percent: 80,
            hold: Duration::from_secs(5),
        };
        let controller = pilot.controller.insert(Controller::new(bounds));
        let missed = Reading {
            window: Some(1.4),
            since_change: Some(1.4),
        };
        assert_eq!(
            controller.step(now(), missed, false, bounds, gains),
            Step::Tighten
        );
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(pilot.judged_span(now(), window), Duration::from_secs(10));
        // The reservation moves later: its change counts for both.
        let reserve_bounds = ReserveBounds { min: 32, max: 66 };
        let reserve = pilot.reserve.insert(Reserve::new(reserve_bounds));
        let at_risk = SmallReading {
            window: Some(1.3),
            since_change: Some(1.3),
            waited: Some(0.6),
        };
        let reserve_gains = ReserveGains {
            tighten_percent: 50,
            loosen_seats: 1,
            headroom_percent: 80,
            hold: Duration::from_secs(5),
        };
        assert_eq!(
            reserve.step(now(), at_risk, reserve_bounds, reserve_gains),
            ReserveStep::Raise
        );
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(pilot.judged_span(now(), window), Duration::from_secs(3));
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(pilot.judged_span(now(), window), window);
    }

    /// A look that would put the paced limits in force while a reload holds its turn (loading
    /// a tokenizer, say) leaves them to its next look, rather than block its runtime worker
    /// until the reload is done (here, where the reload never ends, for good).
    #[test]
    fn a_look_during_a_reload_does_not_wait_for_it() {
        let config = Config::from_toml_str(
            "[classify]\ntokenizer = \"heuristic\"\n[autopilot]\nenabled = true\n",
        )
        .unwrap();
        let state = AppState::for_tests(config, TaskTracker::new());
        let reloading = state.reload_lock();
        let (done, looked) = std::sync::mpsc::channel();
        let looking = state.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let mut pilot = Pilot::default();
            rt.block_on(pilot.look(&looking));
            let _ = done.send(pilot.applied.is_some());
        });
        let applied = looked
            .recv_timeout(Duration::from_secs(60))
            .expect("the look waited for the reload");
        assert!(!applied, "nothing put in force during the reload");
        drop(reloading);
    }

    /// A reload that lands while a leader hands the configured values back (turned off, or
    /// stopping) on the Redis quota: the reloaded file's limits end in force for the fleet,
    /// not the file the hand-back read before it (which used to stay until the next reload).
    /// One thread: the reload's own write waits for the hand-back's first await, as it would
    /// when the reload lands mid-publish.
    #[tokio::test(flavor = "current_thread")]
    async fn a_reload_during_the_hand_back_leaves_its_own_limits_in_the_fleets_record() {
        use crate::admission::redis::tests::redis_common::RedisServer;
        let redis = RedisServer::start();
        let url = redis.url();
        let file = move |budget: u32| {
            Config::from_toml_str(&format!(
                "[classify]\ntokenizer = \"heuristic\"\n\
                 [admission]\nprefill_budget_tokens = {budget}\n\
                 [autopilot]\nenabled = true\n\
                 [quota]\nbackend = \"redis\"\nredis_url = \"{url}\"\n"
            ))
            .unwrap()
        };
        let state = AppState::for_tests(file(12_288), TaskTracker::new());
        let shared = state.admission().shared().expect("the Redis quota").clone();
        // A leader whose paced record is in force.
        let pace = Pace {
            prefill_budget: 2_048,
            large_seats: 1,
        };
        let limits = paced(&state.config(), pace, 32);
        let mut published = false;
        for _ in 0..3_000 {
            if shared.publish_paced(&limits).await == Some(true) {
                published = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(published, "Redis never took the paced record");
        let mut pilot = Pilot::default();
        pilot.in_force(&state, state.config(), pace, 32);
        let reloading = state.clone();
        crate::faults::on(
            crate::faults::Point::HandingBack,
            shared.replica(),
            move || {
                crate::pipeline::reload::apply(&reloading, file(8_192)).expect("the reload");
            },
        );
        pilot.hand_back(&state).await;
        assert_eq!(state.config().admission.prefill_budget_tokens, 8_192);
        let client = redis::Client::open(redis.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let mut budget = String::new();
        for _ in 0..3_000 {
            budget =
                redis::AsyncCommands::hget(&mut conn, "tg:v2:{quota}:limits", "prefill_budget")
                    .await
                    .unwrap();
            if budget == "8192" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            budget, "8192",
            "the fleet's record holds the reloaded file's budget"
        );
        shared.shutdown().await;
    }
}

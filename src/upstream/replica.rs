//! The vLLM replicas one [`super::UpstreamClient`] sends to: each one's health (active
//! `/health` checks, passive ejection on connection errors and 5xx) and its requests in flight.
//!
//! - [`Replicas::pick`] routes a request ([`super::route`]) and hands back a [`Ticket`]: the
//!   request counts as in flight on that replica until the ticket drops (it rides in the
//!   [`super::UpstreamStream`]), and the ticket records the replica's prefix hits from vLLM's
//!   usage.
//! - A replica is ejected after `upstream.routing.unhealthy_after` failures in a row (a
//!   failed check, a connection error, a 5xx answer) and comes back after `healthy_after`
//!   healthy checks in a row. A 2xx answer to a request clears its failure count. With
//!   `health_interval_ms = 0` there are no checks and nothing is ever ejected.
//! - A replica that answers 404 to a request for `upstream.model` (redeployed with another
//!   model, say) fails like a 5xx ([`Replicas::lacks_model`]), and from then on its health
//!   checks also read its `/v1/models` until the model is listed: its `/health` alone would
//!   bring it back into routing after `healthy_after` checks, to 404 again.
//! - [`health_loop`] runs the checks while the client lives (it holds a weak reference).
//! - A reload that changes `[upstream]` builds a new set; a replica at the same URL keeps what
//!   the old set knew of it: its requests in flight (those still running count, and their
//!   tickets give back to the same count), its KV size, and, while health checks run, whether
//!   it is ejected and its streak. A dead replica stays out of routing across a reload, and a
//!   replica's `max_num_seqs` holds with the streams it already runs. Only the newest set's
//!   loop checks a shared health: the replaced set, alive while its requests run, stops
//!   checking it, so streaks do not count twice as fast.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::abort::AbortCaller;
use super::chunk::Usage;
use super::route::{self, Candidate, Route};
use crate::config::{ReplicaConfig, RoutingConfig};
use crate::telemetry::replica_metrics::Reporter;
use crate::telemetry::ReplicaMetrics;

/// One vLLM replica.
#[derive(Debug)]
pub struct Replica {
    /// Its configuration (name, URL, weight, cap).
    pub config: ReplicaConfig,
    /// Arms each stream's abort guard against this replica.
    pub(super) abort: AbortCaller,
    seed: u64,
    /// What it runs (shared with the set a reload replaced, at the same URL).
    load: Arc<Load>,
    /// Its health (shared likewise while health checks run).
    health: Arc<Health>,
}

/// A replica's requests in flight and KV size.
#[derive(Debug, Default)]
struct Load {
    in_flight: AtomicU32,
    /// Its KV cache in tokens, as last read from the engine (0: not read yet).
    kv_tokens: AtomicU64,
}

/// Whether a replica takes traffic.
#[derive(Debug)]
struct Health {
    healthy: AtomicBool,
    /// Failures in a row (while healthy) or healthy checks in a row (while ejected).
    streak: AtomicU32,
    /// Why it was ejected, for `/readyz`.
    last_error: std::sync::Mutex<Option<String>>,
    /// It answered 404 to a request for `upstream.model`: its checks read `/v1/models` too,
    /// until the model is listed there.
    lacks_model: AtomicBool,
    /// The [`Replicas::id`] whose [`health_loop`] checks it (the newest set sharing it).
    checked_by: AtomicU64,
    /// Which health this is: the gauge reports the one the set in force holds (a replaced set's
    /// own, not carried over, may still change as its last requests fail).
    id: u64,
}

impl Default for Health {
    fn default() -> Self {
        static HEALTHS: AtomicU64 = AtomicU64::new(1);
        Self {
            id: HEALTHS.fetch_add(1, Ordering::Relaxed),
            healthy: AtomicBool::new(true),
            streak: AtomicU32::new(0),
            last_error: std::sync::Mutex::new(None),
            lacks_model: AtomicBool::new(false),
            checked_by: AtomicU64::new(0),
        }
    }
}

/// Every replica of one client, with the routing settings and metrics.
#[derive(Debug)]
pub struct Replicas {
    /// Unique among the sets of the process (from 1): which set checks a shared health.
    id: u64,
    list: Vec<Arc<Replica>>,
    routing: RoutingConfig,
    turn: AtomicU64,
    metrics: ReplicaMetrics,
    /// The fleet's seats (`admission.seats`), spread by KV share (0: not spread).
    fleet_seats: AtomicU32,
}

/// A request in flight on a replica: counted until dropped.
#[derive(Debug)]
pub struct Ticket {
    replica: Arc<Replica>,
    metrics: ReplicaMetrics,
    usage: Option<Usage>,
}

/// What `/readyz` and tests see of one replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaStatus {
    /// Its name.
    pub name: String,
    /// Whether it takes traffic.
    pub healthy: bool,
    /// Requests in flight.
    pub in_flight: u32,
    /// Its KV cache in tokens as last read (0: not read).
    pub kv_tokens: u64,
    /// Why it was ejected, if it is.
    pub error: Option<String>,
}

impl Replicas {
    /// The replicas of `configs`, each with its own abort caller from `abort_for`. A replica
    /// at the URL of one of `previous` (the set a reload replaces) goes on with its requests in
    /// flight and KV size, and with its health when checks run here (without checks nothing
    /// would ever bring an ejected replica back, so it starts healthy).
    pub fn new(
        configs: Vec<ReplicaConfig>,
        routing: RoutingConfig,
        metrics: ReplicaMetrics,
        previous: Option<&Replicas>,
        abort_for: impl Fn(&ReplicaConfig) -> AbortCaller,
    ) -> Self {
        static SETS: AtomicU64 = AtomicU64::new(1);
        let id = SETS.fetch_add(1, Ordering::Relaxed);
        let checks = configs.len() > 1 && !routing.health_interval.is_zero();
        let list: Vec<Arc<Replica>> = configs
            .into_iter()
            .map(|config| {
                let before =
                    previous.and_then(|p| p.list.iter().find(|r| r.config.url == config.url));
                let load = before.map_or_else(Arc::default, |r| Arc::clone(&r.load));
                let health = before
                    .filter(|_| checks)
                    .map_or_else(Arc::default, |r| Arc::clone(&r.health));
                health.checked_by.store(id, Ordering::Release);
                Arc::new(Replica {
                    abort: abort_for(&config),
                    seed: route::hash_str(&config.name),
                    config,
                    load,
                    health,
                })
            })
            .collect();
        // The gauges follow the new set: a replica of the replaced one at a URL of the new
        // one reports its last requests under the new name there (and its health, when the
        // new set carried it over); a removed one's series go.
        let own = list.iter().map(|r| Reporter {
            name: r.config.name.clone(),
            url: r.config.url.clone(),
            label: r.config.name.clone(),
            health: r.health.id,
        });
        let carried = previous
            .map_or(&[][..], |p| &p.list[..])
            .iter()
            .filter_map(|old| {
                let new = list.iter().find(|r| r.config.url == old.config.url)?;
                (new.config.name != old.config.name).then(|| Reporter {
                    name: old.config.name.clone(),
                    url: old.config.url.clone(),
                    label: new.config.name.clone(),
                    health: new.health.id,
                })
            });
        let labels = own.chain(carried).collect();
        metrics.in_force(labels);
        for r in &list {
            metrics.set_healthy(
                r.key(),
                r.health.id,
                r.health.healthy.load(Ordering::Acquire),
            );
            r.report_in_flight(&metrics);
        }
        Self {
            id,
            list,
            routing,
            turn: AtomicU64::new(0),
            metrics,
            fleet_seats: AtomicU32::new(
                previous.map_or(0, |p| p.fleet_seats.load(Ordering::Relaxed)),
            ),
        }
    }

    /// The replica at `url`'s KV cache holds `kv_tokens` (read from its `vllm:cache_config_info`).
    /// Once one replica's is known, requests are spread by KV share: each replica's weight
    /// is its configured weight times its KV tokens, and its seats are capped at its share of
    /// [`Replicas::set_fleet_seats`] (rounded up; a configured `max_num_seqs` still holds). A
    /// replica whose KV is not read yet counts as the mean of those read.
    pub fn set_capacity(&self, url: &str, kv_tokens: u64) {
        for r in self.list.iter().filter(|r| r.config.url == url) {
            r.load.kv_tokens.store(kv_tokens, Ordering::Relaxed);
        }
    }

    /// The seats the whole fleet runs at once (`admission.seats`; 0: no cap by KV share).
    pub fn set_fleet_seats(&self, seats: u32) {
        self.fleet_seats.store(seats, Ordering::Relaxed);
    }

    /// Each replica's (weight, seat cap) for routing: by KV share once one replica's KV is known
    /// and there are several (one not read yet counts as the mean of those read: one replica
    /// whose metrics cannot be read, or one a reload just added, used to turn the caps off
    /// fleet-wide), else as configured. The seats are shared among the healthy replicas (all
    /// of them when none is): an ejected replica's share would leave the healthy ones capped
    /// below the fleet's seats.
    fn shares(&self) -> Vec<(u32, Option<u32>)> {
        let read: Vec<u64> = self
            .list
            .iter()
            .map(|r| r.load.kv_tokens.load(Ordering::Relaxed))
            .collect();
        let (sum, count) = read
            .iter()
            .filter(|&&k| k > 0)
            .fold((0u128, 0u128), |(s, n), &k| (s + u128::from(k), n + 1));
        // At most u64::MAX: a mean of u64 values.
        let mean = u64::try_from(sum / count.max(1)).unwrap_or(u64::MAX);
        let kv: Vec<u64> = read.iter().map(|&k| if k > 0 { k } else { mean }).collect();
        // In u128: the sizes are the engines' word (bounded where they are read, but a sum or a
        // product must never wrap, nor a total be zero).
        let healthy: u128 = self
            .list
            .iter()
            .zip(&kv)
            .filter(|(r, _)| r.is_healthy())
            .map(|(_, &k)| u128::from(k))
            .sum();
        let total: u128 = if healthy > 0 {
            healthy
        } else {
            kv.iter().map(|&k| u128::from(k)).sum()
        };
        let known = self.list.len() > 1 && count > 0;
        let largest = kv.iter().copied().max().unwrap_or(0);
        let seats = u64::from(self.fleet_seats.load(Ordering::Relaxed));
        self.list
            .iter()
            .zip(&kv)
            .map(|(r, &k)| {
                let configured = (r.config.weight, r.config.max_num_seqs);
                if !known || self.routing.policy == crate::config::RoutingPolicy::RoundRobin {
                    return configured;
                }
                // Weights up to 1000 per configured unit.
                let (k, largest, seats) = (u128::from(k), u128::from(largest), u128::from(seats));
                let weight = (k * 1000).div_ceil(largest.max(1)).clamp(1, 1000) as u32;
                let weight = weight.saturating_mul(r.config.weight);
                let share = (seats > 0).then(|| {
                    let share = (seats * k).div_ceil(total.max(1)).max(1);
                    u32::try_from(share).unwrap_or(u32::MAX)
                });
                let cap = match (r.config.max_num_seqs, share) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                (weight, cap)
            })
            .collect()
    }

    /// Every replica, in configuration order.
    pub fn all(&self) -> &[Arc<Replica>] {
        &self.list
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether there are none (never, once validated).
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The routing settings.
    pub fn routing(&self) -> &RoutingConfig {
        &self.routing
    }

    /// The metrics it reports into.
    pub fn metrics(&self) -> &ReplicaMetrics {
        &self.metrics
    }

    /// Whether replicas are checked and ejected: more than one, and a non-zero
    /// `health_interval`. (One replica is always routed to; `/readyz` probes it itself.)
    pub fn checks_run(&self) -> bool {
        self.list.len() > 1 && !self.routing.health_interval.is_zero()
    }

    /// Routes a request with routing `key` (see [`super::route`]), leaving out `exclude`;
    /// `reason` overrides the route's reason in the metrics (a retry). `None` when no replica
    /// is left.
    pub fn pick(
        &self,
        key: Option<u64>,
        exclude: Option<&Arc<Replica>>,
        reason: Option<&'static str>,
    ) -> Option<Ticket> {
        let shares = self.shares();
        let candidates: Vec<Candidate> = self
            .list
            .iter()
            .zip(shares)
            .map(|(r, (weight, cap))| Candidate {
                in_flight: r.load.in_flight.load(Ordering::Relaxed),
                weight,
                cap,
                healthy: r.is_healthy(),
                seed: r.seed,
                excluded: exclude.is_some_and(|e| Arc::ptr_eq(e, r)),
            })
            .collect();
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        let Route { index, reason: why } = route::pick(
            self.routing.policy,
            self.routing.balance_factor,
            key,
            turn,
            &candidates,
        )?;
        let replica = Arc::clone(&self.list[index]);
        replica.load.in_flight.fetch_add(1, Ordering::Relaxed);
        replica.report_in_flight(&self.metrics);
        self.metrics
            .routed(&replica.config.name, reason.unwrap_or(why));
        Some(Ticket {
            replica,
            metrics: self.metrics.clone(),
            usage: None,
        })
    }

    /// A ticket for the replica named `name` if it takes traffic (healthy, below its
    /// `max_num_seqs` share or not), routed with reason `pinned`.
    pub fn pick_named(&self, name: &str) -> Option<Ticket> {
        let replica = self
            .list
            .iter()
            .find(|r| r.config.name == name && (r.is_healthy() || self.list.len() == 1))?;
        let replica = Arc::clone(replica);
        replica.load.in_flight.fetch_add(1, Ordering::Relaxed);
        replica.report_in_flight(&self.metrics);
        self.metrics.routed(&replica.config.name, "pinned");
        Some(Ticket {
            replica,
            metrics: self.metrics.clone(),
            usage: None,
        })
    }

    /// The replica non-streaming calls go to: the first healthy one, else the first.
    pub fn any(&self) -> &Arc<Replica> {
        self.list
            .iter()
            .find(|r| r.is_healthy())
            .unwrap_or(&self.list[0])
    }

    /// Each replica's state now.
    pub fn status(&self) -> Vec<ReplicaStatus> {
        self.list
            .iter()
            .map(|r| ReplicaStatus {
                name: r.config.name.clone(),
                healthy: r.is_healthy(),
                in_flight: r.load.in_flight.load(Ordering::Relaxed),
                kv_tokens: r.load.kv_tokens.load(Ordering::Relaxed),
                error: r
                    .health
                    .last_error
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone(),
            })
            .collect()
    }

    /// `replica` failed (a check, a connection error, a 5xx): ejected after
    /// `unhealthy_after` in a row, when health checks run.
    pub fn failed(&self, replica: &Replica, why: &str) {
        if !self.checks_run() {
            return;
        }
        if replica.health.healthy.load(Ordering::Acquire) {
            let n = replica.health.streak.fetch_add(1, Ordering::AcqRel) + 1;
            if n >= self.routing.unhealthy_after
                && replica.health.healthy.swap(false, Ordering::AcqRel)
            {
                replica.health.streak.store(0, Ordering::Release);
                *replica
                    .health
                    .last_error
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = Some(why.to_owned());
                self.metrics
                    .set_healthy(replica.key(), replica.health.id, false);
                self.metrics.ejected(&replica.config.name);
                tracing::warn!(replica = %replica.config.name, failures = n, error = why, "replica ejected");
            }
        } else {
            replica.health.streak.store(0, Ordering::Release);
        }
    }

    /// `replica` answered 404 to a request for `upstream.model`, which every replica must
    /// serve: a failure like a 5xx ([`Replicas::failed`]), and its health checks read
    /// `/v1/models` from now on until the model is listed there ([`Replica::lacks_model`]).
    pub fn lacks_model(&self, replica: &Replica, why: &str) {
        replica.health.lacks_model.store(true, Ordering::Release);
        self.failed(replica, why);
    }

    /// `replica` answered well: a request's 2xx clears a healthy replica's failures; a health
    /// check brings an ejected one back after `healthy_after` in a row.
    pub fn succeeded(&self, replica: &Replica, by_check: bool) {
        if replica.health.healthy.load(Ordering::Acquire) {
            replica.health.streak.store(0, Ordering::Release);
        } else if by_check {
            let n = replica.health.streak.fetch_add(1, Ordering::AcqRel) + 1;
            if n >= self.routing.healthy_after
                && !replica.health.healthy.swap(true, Ordering::AcqRel)
            {
                replica.health.streak.store(0, Ordering::Release);
                *replica
                    .health
                    .last_error
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = None;
                self.metrics
                    .set_healthy(replica.key(), replica.health.id, true);
                tracing::info!(replica = %replica.config.name, "replica back in routing");
            }
        }
    }
}

impl Replica {
    /// Whether it answered 404 to a request for `upstream.model` since its `/v1/models` last
    /// listed it ([`Replicas::lacks_model`]): its health check must read `/v1/models` too.
    pub fn lacks_model(&self) -> bool {
        self.health.lacks_model.load(Ordering::Acquire)
    }

    /// Its `/v1/models` lists `upstream.model` again.
    pub fn serves_model(&self) {
        self.health.lacks_model.store(false, Ordering::Release);
    }

    /// Its (name, URL): what its gauges report under.
    fn key(&self) -> (&str, &str) {
        (&self.config.name, &self.config.url)
    }

    /// Sets its in-flight gauge to its count, again while the count moved meanwhile: two
    /// threads that each set the count they made could leave the older one last (the gauge
    /// read 1 on an idle replica). The last thread to move the count sets it and sees it
    /// unchanged after.
    fn report_in_flight(&self, metrics: &ReplicaMetrics) {
        for _ in 0..16 {
            let n = self.load.in_flight.load(Ordering::Acquire);
            metrics.set_in_flight(self.key(), n);
            if self.load.in_flight.load(Ordering::Acquire) == n {
                return;
            }
        }
    }

    /// Whether it takes traffic.
    pub fn is_healthy(&self) -> bool {
        self.health.healthy.load(Ordering::Acquire)
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.config.name
    }
}

impl Ticket {
    /// The replica the request went to.
    pub fn replica(&self) -> &Arc<Replica> {
        &self.replica
    }

    /// vLLM's usage for the request (its prefix hits are counted when the ticket drops).
    pub fn set_usage(&mut self, usage: Usage) {
        self.usage = Some(usage);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.replica.load.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.replica.report_in_flight(&self.metrics);
        let name = &self.replica.config.name;
        if let Some(u) = self.usage {
            self.metrics
                .prompt_tokens(name, u.prompt_tokens, u.cached_tokens.unwrap_or(0));
        }
    }
}

/// Checks every replica's `/health` each `upstream.routing.health_interval` while `replicas`
/// lives, with `check` doing one probe.
pub async fn health_loop<F, Fut>(replicas: Weak<Replicas>, check: F)
where
    F: Fn(Arc<Replica>) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let Some(interval) = replicas
        .upgrade()
        .map(|r| r.routing.health_interval)
        .filter(|i| !i.is_zero())
    else {
        return;
    };
    let mut tick = tokio::time::interval(interval.max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(set) = replicas.upgrade() else {
            return;
        };
        // A replica whose health a newer set shares is that set's to check.
        let own = set
            .list
            .iter()
            .filter(|r| r.health.checked_by.load(Ordering::Acquire) == set.id);
        // Each probe within one interval: a replica whose `/health` hangs fails its check
        // (a health that takes longer than the checks' period is no health), and the others
        // are still checked every interval (one slow probe used to stretch every replica's
        // cycle to the probe's own 5 s timeout).
        let checks = own.map(|r| {
            let r = Arc::clone(r);
            let probe = tokio::time::timeout(interval, check(Arc::clone(&r)));
            async move {
                let result = probe.await.unwrap_or_else(|_| {
                    Err(format!(
                        "/health took longer than the health interval ({} ms)",
                        interval.as_millis()
                    ))
                });
                (r, result)
            }
        });
        let results = futures::future::join_all(checks).await;
        for (r, result) in results {
            match result {
                Ok(()) => set.succeeded(&r, true),
                Err(why) => set.failed(&r, &why),
            }
        }
    }
}

#[cfg(test)]
#[path = "replica_tests.rs"]
mod tests;

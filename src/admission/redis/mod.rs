//! Redis-backed shared lane quota (M15): the lane limits hold across every replica together.
//!
//! # Data layout (prefix `quota.key_prefix`, default `tg:v2`; hash tag `{quota}`)
//! - `tg:v2:{quota}:leases` HASH: lease id (`<replica>:<n>`) -> `"<lane> <tokens> <prefill>"`
//!   (`<prefill>`: estimated prompt tokens until the first token, then 0; `<lane>` is
//!   `<seat>@<budget>` for a pre-emptible lease, see below).
//! - `tg:v2:{quota}:expiry` ZSET: lease id -> expiry, Redis server time in ms (`TIME`, so
//!   replicas' clocks do not matter).
//! - `tg:v2:{quota}:usage` HASH: `<lane>:n` (leases), `<lane>:tokens`, `global:tokens`,
//!   `prefill:tokens` (the prefill budget in use).
//! - `tg:v2:{quota}:released` pub/sub channel: a lane name each time one of its leases goes,
//!   `prefill` each time prefill room comes back, `limits` when the limits record changed.
//! - `tg:v2:{quota}:limits` HASH: the limits every replica's scripts enforce, one versioned
//!   record (`quota_limits_v2.lua`): written by a replica only where there is none, and pushed
//!   as a new version by a reload. The seat rule is the local backend's (reserved shares,
//!   ceilings, lending, borrowing; strict caps under policy `strict`).
//! - `tg:v2:{quota}:waiting:large` ZSET: replicas with an interactive large request waiting
//!   (background jobs start only while it has none); with `jobs.preempt` or
//!   `jobs.preempt_answers` also `<replica> <lane>` for the other lanes (pre-emptible work
//!   starts only while it is empty).
//!
//! # Pre-emption (`jobs.preempt`, `jobs.preempt_answers`)
//! A job that may still be pre-empted takes a pre-emptible lease in the jobs take script
//! (`borrow` in `quota_common_v2.lua`): an idle seat of the large lane, else medium's, else
//! small's; its lease's lane field is `<seat>@large` (the seat counts in `<seat>`, the tokens in
//! large), and it is listed in `tg:v2:{quota}:borrowers` (ZSET, id -> when taken). An acquire
//! that is refused asks one borrower to leave in the same call (`ask_borrowers`): the youngest
//! whose leaving alone lets it in, else the youngest when all together would, else (reason
//! `pressure`) the youngest while none is leaving; never one in its prefill grace (the limits
//! record's `preempt_grace`, at the rate `tg:v2:{quota}:preempt` keeps from the last borrower's
//! first token). Those asked (`tg:v2:{quota}:asked`, HASH id -> `<lane> <reason> <ms>`) count as
//! gone for later calls; the ask is published on `tg:v2:{quota}:leave` (`<id> <lane>
//! <reason>`), again after a second if still there. The replica holding the lease signals the
//! run's [`Preemptible`] handle; the run drops its stream and its guard releases the lease
//! (which leaves the borrowers and the asks). With the record's `preempt_cooldown` (ms), a
//! refused acquire also notes when (`tg:v2:{quota}:preempt` `waited`), and the take script
//! starts no job within the cool-down after it. A pre-emptible `/answer` borrows by the same
//! rules through its own script ([`RedisAdmission::borrow`], `quota_borrow_v2.lua`); once
//! pre-empted, its continuation waits at the head of this replica's line
//! ([`queue::LaneQueue::join_first`]).
//!
//! Every change goes through one Lua script (`lua/quota_*_v2.lua`, see [`scripts`]), so the
//! counters always equal the sum of the live leases: acquire reaps expired leases, then takes
//! a lease only if a seat (by the record's rules) AND the lane's and global token budgets all
//! fit (and, for a
//! long prompt under `admission.prefill_budget_tokens`, the prefill budget: one engine, one
//! budget, whatever the number of replicas); renew extends this replica's leases; release is
//! idempotent; move shifts a lease to another lane if it has room; prefill-done gives a lease's
//! prefill reservation back at its first token. All keys share one hash tag, so the scripts run
//! on Redis Cluster.
//!
//! # Leases and crashes
//! A [`LaneGuard`] holds one lease. Dropping it removes the lease from this replica's books at
//! once and sends it to a background task that runs the release script (Drop cannot await).
//! A heartbeat renews this replica's leases every `quota.heartbeat_ms` (at most a third of
//! `quota.lease_ttl_ms`). A replica that dies without releasing stops renewing; its leases
//! expire after the TTL and the next script call of any replica reaps them
//! (`tutor_gateway_quota_leases_reaped_total`).
//!
//! # Waiting and fairness
//! Each replica keeps a line per lane (same `queue_len` / `queue_timeout_ms` as the local
//! backend: 429 when full, 503 on timeout), and under a prefill budget a second line per lane
//! for long prompts, so that a short prompt is never held back by a long one waiting for
//! prefill room (each line holds up to `queue_len`). Only a line's head calls Redis; it retries
//! when a release is announced (pub/sub, or this replica's own releases) or after a jittered
//! backoff of 5-250 ms. Its call also asks for the short prompts waiting behind it (up to
//! `quota.batch_max` leases a call), granted in the line's order up to the first that does not
//! fit, and the head hands each its lease (`queue.rs`), so a burst in line costs one round
//! trip; the release task likewise sends what piled up in one call. A long prompt waiting
//! holds nothing: the script takes seat, tokens and prefill room together or none of them. A
//! line's order is the local backend's: FIFO within a tenant, tenants in turns by
//! `auth.tenant_shares` (`queue.rs`). Across replicas there is no global order: when a slot
//! frees, the heads of all replicas are woken and the first script call to
//! arrive wins, so each replica with waiters gets roughly an equal share of the freed slots,
//! whatever its queue length. A request can be overtaken by a later one on another replica.
//!
//! # When Redis is down
//! Three failed calls in a row (connection refused, 500 ms timeout), or one heartbeat that
//! cannot connect at all, mark the replica degraded (`tutor_gateway_quota_degraded` = 1; `/readyz` reports it); a
//! single slow call is retried like a refusal, not taken for an outage. Under `fail_open` (the default)
//! new requests are admitted by an in-process [`LocalAdmission`] with the limits divided by
//! `quota.expected_replicas`; under `fail_closed` they get 503
//! ([`AdmissionError::QuotaUnavailable`]). The heartbeat keeps probing and the replica returns
//! to Redis on its own after the first successful call; no restart. Releases that failed are
//! retried by the heartbeat until the lease's TTL has passed (then Redis has reaped it anyway),
//! so nothing leaks. No overcommit across the switches: when the replica falls back, its
//! fallback first counts the leases it still holds in Redis (their requests run on), and a lease
//! Redis grants to a call that was out as the replica fell back is counted by the fallback as
//! it is booked, so the replica stays within its share; when Redis is back, the requests the
//! fallback admitted are registered there as leases (`quota_adopt_v2.lua`, whatever the
//! limits: they already run), renewed and released like any other, so Redis counts what really
//! runs and new admissions wait until the lanes are under their limits. The replica leaves the
//! fallback only once they are (`Shared::back_on_redis`; the fallback books nothing new while
//! that call is out), and a request still in the fallback's queue then asks Redis. Leases that
//! expired during the outage are registered again the same way, and so are leases Redis lost
//! with its data (a new epoch), reaped less than half a TTL after this replica renewed them
//! (Redis's clock ran ahead), or reaped because this replica renewed them late (its heartbeat
//! stalled past the TTL): their requests run on. Each is counted as `lease_lost`, and a
//! warning says which it was.
//!
//! [`snapshot`](RedisAdmission::snapshot) shows this replica's part only (its leases, its
//! lines, its fallback); sum over replicas for the fleet, or read the `usage` hash.

mod fallback;
mod keys;
mod queue;
pub(crate) mod scripts;
mod service;
mod shared;
pub mod subscription;
mod tasks;

#[cfg(test)]
mod batch_tests;
#[cfg(test)]
mod eviction_tests;
#[cfg(test)]
mod fallback_tests;
#[cfg(test)]
mod limits_tests;
#[cfg(test)]
mod lost_reply_tests;
#[cfg(test)]
mod preempt_tests;
#[cfg(test)]
mod subscription_tests;
#[cfg(test)]
pub(crate) mod tests;

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;

pub use keys::Keys;
pub(crate) use shared::LeaseRelease;

use super::backend::{AdmissionHealth, Ask, Backend, LimitsChange};
use super::budget::Limits;
use super::fair::Room;
use super::preempt::Preemptible;
use super::{AdmissionError, AdmissionSnapshot, LaneGuard, LocalAdmission};
use crate::config::{Config, OnRedisDown, Policy, PreemptAnswers};
use crate::lane::Lane;
use crate::telemetry::autopilot_metrics::Knobs;
use crate::telemetry::QuotaMetrics;
use queue::Left;
use scripts::{Behind, LimitsRecord, LimitsWrite, Verdict, AUTOPILOT_ORIGIN, PUSH_ORIGIN};
use shared::{Handed, Shared, Take};

/// How long a first request waits for the initial connection before counting Redis as down.
const FIRST_CONNECT_WAIT: Duration = Duration::from_secs(2);

/// Admission against the shared quota in Redis. Cheap to clone; clones share one connection,
/// one set of leases and one set of background tasks, stopped when the last clone drops.
#[derive(Clone)]
pub struct RedisAdmission {
    shared: Arc<Shared>,
    /// This replica's lines' limits and each tenant's share of a line's turns
    /// (`auth.tenant_shares`; 1 when not listed); a reload replaces them.
    rules: Arc<std::sync::RwLock<Arc<LineRules>>>,
    tasks: TaskTracker,
    stop: CancellationToken,
    _stop_on_drop: Arc<DropGuard>,
}

impl std::fmt::Debug for RedisAdmission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisAdmission")
            .field("replica", &self.shared.replica)
            .field("keys", &self.shared.keys)
            .field("degraded", &self.shared.degraded())
            .finish()
    }
}

impl RedisAdmission {
    /// Admission for `config` (policy `lanes`) against `config.quota.redis_url`. Starts its
    /// background tasks on the current Tokio runtime and connects in the background.
    pub fn from_config(config: &Config, metrics: QuotaMetrics) -> Result<Self, redis::RedisError> {
        let client = client(config)?;
        let quota = LimitsRecord::from_config(config);
        let (releases, release_rx) = mpsc::unbounded_channel();
        let (retry, retry_rx) = mpsc::unbounded_channel();
        let fallback = (config.quota.on_redis_down == OnRedisDown::FailOpen)
            .then(|| LocalAdmission::from_config(&fallback::local_share(config)));
        let shared = Arc::new(Shared::new(
            client,
            Keys::new(&config.quota.key_prefix),
            quota,
            (
                config.quota.lease_ttl,
                config.quota.heartbeat,
                config.quota.batch_max,
            ),
            releases,
            metrics,
            fallback,
            // Pre-emptible work of any kind waits for every lane's waiters (their marks) and
            // listens for asks to leave.
            config.jobs.preempt || config.jobs.preempt_answers != PreemptAnswers::Off,
        ));
        let stop = shared.stopping.clone();
        let tasks = TaskTracker::new();
        let watch = shared.metrics.background().clone();
        tasks.spawn(watch.watch(
            "quota heartbeat",
            tasks::heartbeat(shared.clone(), retry_rx, stop.clone()),
        ));
        tasks.spawn(watch.watch(
            "quota releaser",
            tasks::releaser(shared.clone(), release_rx, retry, stop.clone()),
        ));
        tasks.spawn(watch.watch(
            "quota listener",
            tasks::listener(shared.clone(), stop.clone()),
        ));
        tasks.spawn(watch.watch(
            "quota service reader",
            tasks::service_reader(shared.clone(), stop.clone()),
        ));
        tasks.close();
        Ok(Self {
            shared,
            rules: Arc::new(std::sync::RwLock::new(Arc::new(LineRules::from_config(
                config,
            )))),
            tasks,
            _stop_on_drop: Arc::new(stop.clone().drop_guard()),
            stop,
        })
    }

    /// Always [`Policy::Lanes`] (config validation requires it for this backend).
    pub fn policy(&self) -> Policy {
        self.rules().limits.policy()
    }

    /// True while Redis is unreachable and this replica runs on its fallback.
    pub fn degraded(&self) -> bool {
        self.shared.degraded()
    }

    /// What this replica does while Redis is down.
    pub fn on_redis_down(&self) -> OnRedisDown {
        if self.shared.fallback.is_some() {
            OnRedisDown::FailOpen
        } else {
            OnRedisDown::FailClosed
        }
    }

    /// An id unique in the fleet (this replica's id and a counter), as a lease's.
    pub fn next_id(&self) -> String {
        self.shared.next_lease_id()
    }

    /// A connection to the quota's Redis, while it is reachable.
    pub fn connection(&self) -> Option<redis::aio::ConnectionManager> {
        if self.shared.degraded() {
            return None;
        }
        self.shared.connection()
    }

    /// [`RedisAdmission::connection`], waiting up to 2 s for the first connection of a
    /// replica that just started (as a first acquire does).
    pub async fn connection_ready(&self) -> Option<redis::aio::ConnectionManager> {
        if self.shared.connection().is_none() && !self.shared.degraded() {
            let mut conn = self.shared.conn.subscribe();
            let _ = tokio::time::timeout(FIRST_CONNECT_WAIT, conn.wait_for(Option::is_some)).await;
        }
        self.connection()
    }

    fn rules(&self) -> Arc<LineRules> {
        self.rules
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Puts the limits of `config` in force (a reload): this replica's lines use the new
    /// queue bounds and tenant shares, and its fallback the new divided limits, at once. The
    /// shared limits record (which every replica's scripts enforce from their next call on, and
    /// the others learn through the `released` channel) is written as a new version only when
    /// the limits differ from this replica's previous ones, and not over a record written by
    /// `tutor-gateway limits push` unless `force`; the answer says which ([`LimitsChange`]).
    /// Leases held are not touched.
    pub fn set_limits(&self, config: &Config, force: bool) -> LimitsChange {
        let change = self
            .shared
            .set_limits(LimitsRecord::from_config(config), force);
        // Written now when a runtime is at hand, else by the next heartbeat.
        if change == LimitsChange::Pushing {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let shared = self.shared.clone();
                rt.spawn(async move { shared.write_pending_limits().await });
            }
        }
        *self
            .rules
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Arc::new(LineRules::from_config(config));
        if let Some(local) = &self.shared.fallback {
            local.set_limits(&fallback::local_share(config));
        }
        self.shared.notify(None, true);
        for lane in Lane::ALL {
            self.shared.notify(Some(lane), false);
        }
        change
    }

    /// This replica's id (its leases' owner in Redis).
    pub fn replica(&self) -> &str {
        &self.shared.replica
    }

    /// Publishes `config`'s limits as the shared record, as the autopilot's leader (origin
    /// `autopilot <replica>`; never over a record `tutor-gateway limits push` wrote). Whether it
    /// is the record in force now (`None`: Redis did not answer).
    pub async fn publish_paced(&self, config: &Config) -> Option<bool> {
        self.shared.publish(LimitsRecord::from_config(config)).await
    }

    /// Whether the shared record in force, as last seen, is this replica's autopilot's.
    pub fn paced_record_in_force(&self) -> bool {
        self.shared.limits_origin() == self.shared.autopilot_origin()
    }

    /// The largest reservation `lane` could ever hold under the shared record in force: the
    /// lane's token budget or the global one, whichever is smaller, read now (`None`: Redis did
    /// not answer, or there is no record). The record may be lower than this replica's file
    /// (`limits push`, another replica's reload, the autopilot).
    async fn record_reservation_bound(&self, lane: Lane) -> Option<u64> {
        let mut conn = self.connection()?;
        let (lane_tokens, global): (Option<u64>, Option<u64>) = redis::cmd("HMGET")
            .arg(&self.shared.keys.limits)
            .arg(format!("{}:tokens", lane.as_str()))
            .arg("global_tokens")
            .query_async(&mut conn)
            .await
            .ok()?;
        Some(lane_tokens?.min(global?))
    }

    /// `Err(TooLarge)` when a reservation of `tokens`, refused by the shared record for its
    /// tokens (`verdict`), could never fit it: refused at once, as the file's own limits refuse
    /// on arrival, instead of blocking its line until its queue timeout.
    async fn never_fits(
        &self,
        verdict: Verdict,
        lane: Lane,
        tokens: u32,
    ) -> Result<(), AdmissionError> {
        if !matches!(verdict, Verdict::LaneTokens | Verdict::GlobalTokens) {
            return Ok(());
        }
        match self.record_reservation_bound(lane).await {
            Some(limit) if u64::from(tokens) > limit => Err(AdmissionError::TooLarge {
                lane,
                tokens,
                limit,
            }),
            _ => Ok(()),
        }
    }

    /// `Err(TooLarge)` when background work of `tokens` in `lane`, refused by the shared record
    /// for its tokens, could never fit it (see [`Self::never_fits`]): a queued job that would
    /// hold the fleet's job queue for good.
    pub async fn never_fits_tokens(&self, lane: Lane, tokens: u32) -> Result<(), AdmissionError> {
        self.never_fits(Verdict::LaneTokens, lane, tokens).await
    }

    /// Whether the shared record in force, as last seen, was published by an autopilot leader
    /// (this replica's or another's).
    pub fn autopilot_record_in_force(&self) -> bool {
        self.shared.limits_origin().starts_with(AUTOPILOT_ORIGIN)
    }

    /// Writes this replica's own (configured) limits as the shared record, as a reload does
    /// (never over a `limits push`): an autopilot leader died and no replica paces any more.
    /// `None`: Redis did not answer.
    pub async fn restore_configured(&self) -> Option<u64> {
        self.shared.write_limits(LimitsWrite::Reload).await
    }

    /// Whether the shared record in force, as last seen, came from `tutor-gateway limits push`
    /// (which the autopilot does not override).
    pub fn pushed_record_in_force(&self) -> bool {
        self.shared.limits_origin().starts_with(PUSH_ORIGIN)
    }

    /// The prefill budget, the large lane's seats (its ceiling) and the small lane's
    /// reservation of the shared record in force, read now (`None`: Redis did not answer, or
    /// there is no record).
    pub async fn shared_knobs(&self) -> Option<Knobs> {
        let mut conn = self.connection()?;
        let (budget, large, small): (Option<u64>, Option<u32>, Option<u32>) = redis::cmd("HMGET")
            .arg(&self.shared.keys.limits)
            .arg("prefill_budget")
            .arg("large:ceiling")
            .arg("small:max")
            .query_async(&mut conn)
            .await
            .ok()?;
        Some(Knobs {
            prefill_budget: budget?,
            large_seats: large?,
            small_seats: small?,
        })
    }

    /// The Redis client (for a module's own pub/sub subscription).
    pub fn client(&self) -> &redis::Client {
        &self.shared.client
    }

    /// The lease lifetime unless renewed and the heartbeat interval (other modules' leases in
    /// Redis, such as a job's runner, follow the same rhythm).
    pub fn lease_timing(&self) -> (Duration, Duration) {
        (
            Duration::from_millis(self.shared.ttl_ms),
            self.shared.heartbeat,
        )
    }

    /// `tenant`'s service counted fleet-wide (tokens over its share) as this replica sees it
    /// (`auth.fleet_fairness`; see `service`).
    pub fn fleet_service(&self, tenant: &str) -> f64 {
        self.shared.service.of(tenant)
    }

    /// The Redis keys this replica uses.
    pub fn keys(&self) -> &Keys {
        &self.shared.keys
    }

    /// This replica's leases, waiters and fallback usage (not the fleet's; see module doc).
    pub fn snapshot(&self) -> AdmissionSnapshot {
        let mut snap = match &self.shared.fallback {
            Some(local) => local.snapshot(),
            None => LocalAdmission::from_config(&Config::default()).snapshot(),
        };
        let held: Vec<(String, shared::Held)> = self
            .shared
            .held()
            .iter()
            .map(|(id, h)| (id.clone(), *h))
            .collect();
        for (id, held) in &held {
            if self.shared.counted_by_fallback(id) {
                continue;
            }
            let lane = &mut snap.lanes[held.lane.index()];
            lane.in_flight += 1;
            lane.reserved_tokens += u64::from(held.tokens);
            snap.prefill_tokens += u64::from(held.prefill);
        }
        for lane in Lane::ALL {
            let i = lane.index();
            let long = self.shared.long_lines[i].waiting();
            snap.lanes[i].queue_depth += self.shared.queues[i].waiting() + long;
            snap.lanes[i].long_queue_depth += long;
        }
        snap
    }

    /// Waits for a lease for `ask`; the local backend's contract ([`LocalAdmission::acquire`]),
    /// fleet-wide. The prefill reservation of `ask.prefill` tokens is in the fleet's prefill
    /// budget, given back at the first token ([`LaneGuard::prefill_done`]) or with the lease; a
    /// long prompt under a budget waits for room in its lane's long-prompt line, holding
    /// nothing. While it waits in this replica's line, the tenants there take turns in
    /// proportion to their shares (`auth.tenant_shares`), a tenant's turn going to its waiter
    /// due first (FIFO among equal dues).
    ///
    /// Errors: [`AdmissionError::QueueFull`], [`AdmissionError::Timeout`],
    /// [`AdmissionError::TooLarge`], and [`AdmissionError::QuotaUnavailable`] when Redis is
    /// down under `fail_closed`. Cancel-safe: dropping the future leaves the line; a lease
    /// granted in that instant is released.
    pub async fn acquire(&self, ask: Ask<'_>) -> Result<LaneGuard, AdmissionError> {
        // Its queue timeout counts from here: the first connection's wait and the first try
        // (Redis calls of up to 500 ms, retried once) are time it waited.
        self.acquire_since(ask, Instant::now()).await
    }

    /// [`RedisAdmission::acquire`] for a request that arrived at `started`.
    async fn acquire_since(
        &self,
        ask: Ask<'_>,
        started: Instant,
    ) -> Result<LaneGuard, AdmissionError> {
        let Ask {
            lane,
            work: tokens,
            prefill: prompt,
            tenant,
            due,
            continuing,
        } = ask;
        let rules = self.rules();
        rules.limits.admissible(lane, tokens)?;
        if self.shared.connection().is_none() && !self.shared.degraded() {
            let mut conn = self.shared.conn.subscribe();
            let _ = tokio::time::timeout(FIRST_CONNECT_WAIT, conn.wait_for(Option::is_some)).await;
        }
        if self.shared.degraded() {
            return self.fall_back_within(ask, started).await;
        }
        let share = tenant
            .and_then(|t| rules.shares.get(t))
            .copied()
            .unwrap_or(1.0);
        let asked = Asked {
            lane,
            tokens,
            prompt,
            long: self.shared.waits_for_prefill(prompt),
            started,
            // Its tenant's service is counted fleet-wide (`service`), whether the lines order by
            // it (`auth.fleet_fairness`) or not: the metrics compare the two.
            service: tenant.map(|t| (Arc::from(t), share)),
        };
        let line = self.shared.line(lane, prompt);
        // With fleet fairness, a head of a tenant ahead of one waiting on another replica yields
        // (`service`): not even a first try while it is.
        let line_name = service::line_name(lane, asked.long);
        let cost = f64::from(tokens) / share;
        let yields = || {
            tenant.filter(|_| rules.fleet_fairness).is_some_and(|t| {
                let here = || line.tenants().into_iter().flatten().collect();
                self.shared.service.yields(&line_name, t, cost, here)
            })
        };
        let mut prefill_blocked = None;
        // When pre-emptible work was first asked to leave for it (`jobs.preempt`).
        let mut made_room: Option<Instant> = None;
        if line.waiting() == 0 && !yields() {
            match self
                .shared
                .try_take(lane, (tokens, prompt), false, &[])
                .await
            {
                Take::Granted(id, _) => return Ok(self.guard(id, &asked, Duration::ZERO, None)),
                Take::Refused(verdict, asked_to_leave) => {
                    self.never_fits(verdict, lane, tokens).await?;
                    if asked_to_leave {
                        made_room = Some(Instant::now());
                    }
                    if verdict == Verdict::PrefillFull {
                        prefill_blocked = Some(asked.started);
                    }
                }
                // One failed call is not an outage: wait in line and try again.
                Take::Failed => {}
                Take::Down => return self.fall_back_within(ask, asked.started).await,
            }
        }
        let queue = rules.limits.queue(rules.limits.queue_of(lane));
        let retry_after = Duration::from_secs(queue.timeout.as_secs().max(1));
        let pushed_out = |held: u32, places: u32| AdmissionError::TenantQueueFull {
            lane,
            tenant: tenant.unwrap_or_default().to_owned(),
            held,
            places,
            retry_after,
        };
        let share_of = |t: &str| rules.shares.get(t).copied().unwrap_or(1.0);
        // With fleet fairness the line orders by tokens, from the tenant's fleet service.
        let costed = rules.fleet_fairness.then(|| {
            let floor = tenant.map_or(0.0, |t| self.shared.service.of(t));
            (f64::from(tokens), floor)
        });
        // A head may take the lease of a short prompt behind it in its own call (quota.batch_max);
        // a long prompt waits for prefill room, which one lease at a time measures.
        let need = (!asked.long).then_some((tokens, prompt));
        // A pre-empted request's continuation waits at the head of this replica's line.
        let joined = if continuing {
            Ok(line.join_first(tenant, need))
        } else {
            line.join_costed(queue.len, (tenant, share), costed, due, need, share_of)
        };
        let place = match joined {
            Ok(place) => place,
            Err(Room::Refuse { held, places }) if tenant.is_some() && places > 0 => {
                return Err(pushed_out(held, places));
            }
            Err(_) => return Err(AdmissionError::QueueFull { lane, retry_after }),
        };
        // Out of the line without a turn: pushed out, or granted by the head's call.
        let left = |left: Left<Handed>| match left {
            Left::PushedOut(held, places) => Err(pushed_out(held, places)),
            // A short prompt (only those are taken behind a head): no prefill wait.
            Left::Handed(lease) => {
                Ok(self.guard(lease.claim(), &asked, asked.started.elapsed(), None))
            }
        };
        let wait = async {
            let mut turn = match place.turn().await {
                Ok(turn) => turn,
                Err(out) => return Ok(left(out)),
            };
            let mut backoff = queue::LaneQueue::<Handed>::first_backoff();
            // How long this head yielded to other replicas' tenants since the first release it
            // let pass (at most YIELD_AT_MOST), and whether it yielded at all.
            let mut yielded: Option<Duration> = None;
            let mut yielded_once = false;
            loop {
                // A reload may have lowered its lane's budget below its reservation: refused
                // as it would be on arrival, instead of blocking the line until its timeout.
                if let Err(too_large) = self.rules().limits.admissible(lane, tokens) {
                    return Ok(Err(too_large));
                }
                let yielding = yielded.is_none_or(|y| y < service::YIELD_AT_MOST) && yields();
                if yielding && !yielded_once {
                    yielded_once = true;
                    self.shared.metrics.yielded(lane);
                }
                if !yielding {
                    let behind = match need {
                        Some(_) => turn.behind(self.shared.batch_max.saturating_sub(1)),
                        None => Vec::new(),
                    };
                    let asks: Vec<Behind> = behind
                        .iter()
                        .map(|&(_, (tokens, prompt))| Behind {
                            id: self.shared.next_lease_id(),
                            tokens,
                            prompt,
                        })
                        .collect();
                    match self
                        .shared
                        .try_take(lane, (tokens, prompt), true, &asks)
                        .await
                    {
                        Take::Granted(id, granted) => {
                            place.admitted();
                            let waited = asked.started.elapsed();
                            turn.hand(
                                behind
                                    .iter()
                                    .zip(asks)
                                    .take(granted)
                                    .map(|(&(waiter, _), b)| {
                                        (waiter, Handed::new(self.shared.clone(), lane, b.id))
                                    })
                                    .collect(),
                            );
                            let guard = self.guard(id, &asked, waited, prefill_blocked);
                            return Ok(Ok(guard.with_made_room(made_room.map(|t| t.elapsed()))));
                        }
                        Take::Down => return Err(()),
                        Take::Refused(verdict, asked_to_leave) => {
                            if let Err(too_large) = self.never_fits(verdict, lane, tokens).await {
                                return Ok(Err(too_large));
                            }
                            if asked_to_leave {
                                made_room.get_or_insert_with(Instant::now);
                            }
                            if verdict == Verdict::PrefillFull {
                                prefill_blocked.get_or_insert_with(Instant::now);
                            }
                        }
                        // One failed call (not yet an outage): try again.
                        Take::Failed => {}
                    }
                }
                let paused = Instant::now();
                let released;
                (backoff, released) = line.pause(backoff).await;
                if yielding && (released || yielded.is_some()) {
                    *yielded.get_or_insert(Duration::ZERO) += paused.elapsed();
                }
                if let Some((held, places)) = place.pushed_out() {
                    return Ok(Err(pushed_out(held, places)));
                }
                if !turn.still_first() {
                    // A waiter with an earlier fair tag joined: its turn first.
                    drop(turn);
                    turn = match place.turn().await {
                        Ok(turn) => turn,
                        Err(out) => return Ok(left(out)),
                    };
                    backoff = queue::LaneQueue::<Handed>::first_backoff();
                }
            }
        };
        let timed_out = || AdmissionError::Timeout {
            lane,
            waited: asked.started.elapsed(),
        };
        let left = queue.timeout.saturating_sub(asked.started.elapsed());
        let outcome = tokio::time::timeout(left, wait).await;
        // Out of this replica's line whatever happens next (a request gone to the fallback
        // waits in the fallback's queue only, counted once).
        drop(place);
        match outcome {
            Ok(Ok(granted)) => granted,
            // Redis went away while it waited: the fallback's queue gets what is left of its
            // queue timeout, not a new one (it would wait up to twice `queue_timeout_ms`).
            Ok(Err(())) => self.fall_back_within(ask, asked.started).await,
            Err(_) => Err(timed_out()),
        }
    }

    /// Runs `script`, a script of another module built on the quota prelude that may take a
    /// lease with its `take_lease` (background jobs start this way: the job and its seat in
    /// one atomic step). Its KEYS are the quota's six, then `keys`; its ARGV are the acquire
    /// script's first five (a lease in `lane` of `tokens` with a prefill reservation of
    /// `prompt`; the limits are the shared record's), then `args`. It answers `{status, reaped,
    /// rest...}`; status 1 means the lease was taken: it is this replica's from then on,
    /// renewed by its heartbeat, and comes back as a guard with `rest`. Any other status comes
    /// back as `Err(status)`. `None` while Redis is unreachable (the caller tries again later).
    /// The lease's id (ARGV[1]) is `lease`, the caller's ([`RedisAdmission::next_id`]): a
    /// script may use it as a token of the work it started, and the caller can undo that work
    /// when the reply is lost (`None` after the call went out: the script may have run).
    ///
    /// With `preemptible` (`jobs.preempt`), a reply whose `rest` goes on with `seat,
    /// preemptible` (the jobs take script's) and says `preemptible` = 1 took a pre-emptible
    /// lease: its seat in lane `seat` (0 small, 1 medium, 2 large), its tokens in `lane`. The
    /// guard then carries the handle, through which an acquire anywhere in the fleet asks the
    /// seat back (`quota_common_v2.lua`'s `ask_borrowers`, the `leave` channel).
    pub async fn take_with(
        &self,
        script: &redis::Script,
        keys: &[&str],
        args: &[String],
        need: (Lane, u32, u32),
        preemptible: Option<&Arc<Preemptible>>,
        lease: String,
    ) -> Option<Result<Taken, i64>> {
        self.take_as(("job_take", lease), script, keys, args, need, preemptible)
            .await
    }

    /// A pre-emptible lease on an idle seat for interactive work of `lane` that gives it back
    /// when asked (`jobs.preempt_answers`), by the rules jobs borrow by
    /// (`quota_borrow_v2.lua`): an idle seat of `lane` or of a lane below, only while no
    /// replica has a request waiting and not within the cool-down. Never waits. `None`: no such
    /// seat now, Redis unreachable, or a `handle` that may no longer be asked to leave
    /// (`jobs.max_preemptions` spent: it would hold a borrowed seat, maybe a lower lane's, to its
    /// end, and every ask would count it as leaving); the request then queues as any other and
    /// keeps the seat of its own lane it gets there.
    pub async fn borrow(
        &self,
        lane: Lane,
        tokens: u32,
        prompt: u32,
        handle: &Arc<Preemptible>,
    ) -> Option<LaneGuard> {
        if !handle.is_eligible() || self.rules().limits.admissible(lane, tokens).is_err() {
            return None;
        }
        let script = &self.shared.scripts.borrow;
        match self
            .take_as(
                ("borrow", self.shared.next_lease_id()),
                script,
                &[],
                &[],
                (lane, tokens, prompt),
                Some(handle),
            )
            .await
        {
            Some(Ok(taken)) if taken.preemptible => Some(taken.guard),
            _ => None,
        }
    }

    /// [`RedisAdmission::take_with`], its script's time observed as `op`, the lease's id `id`.
    async fn take_as(
        &self,
        (op, id): (&'static str, String),
        script: &redis::Script,
        keys: &[&str],
        args: &[String],
        (lane, tokens, prompt): (Lane, u32, u32),
        preemptible: Option<&Arc<Preemptible>>,
    ) -> Option<Result<Taken, i64>> {
        if self.shared.degraded() {
            return None;
        }
        let mut conn = self.shared.connection()?;
        let mut call = self.shared.keys.with_keys(script);
        for key in keys {
            call.key(*key);
        }
        call.arg(&id)
            .arg(lane.as_str())
            .arg(tokens)
            .arg(self.shared.ttl_ms)
            .arg(prompt);
        for arg in args {
            call.arg(arg);
        }
        // Until the reply is read, the lease the call may take goes back if this is dropped
        // (the caller went away) or the call fails (one that timed out may still have run):
        // nothing else would ever renew or release it (`shared::Pending`).
        let mut pending = shared::Pending::new(&self.shared, lane, &id);
        let started = Instant::now();
        let reply: Result<Vec<i64>, _> = call.invoke_async(&mut conn).await;
        self.shared
            .metrics
            .observe(op, started.elapsed().as_secs_f64());
        let mut reply = match reply {
            Ok(r) if r.len() >= 2 => r,
            Ok(_) => return Some(Err(0)),
            Err(err) => {
                self.shared.failed(op, &err);
                return None;
            }
        };
        pending.disarm();
        self.shared.succeeded();
        self.shared.metrics.reaped(reply[1].max(0) as u64);
        if reply[0] != 1 {
            return Some(Err(reply[0]));
        }
        let rest = reply.split_off(2);
        let borrowed = preemptible.filter(|_| rest.get(3) == Some(&1));
        match borrowed {
            Some(handle) => {
                let seat = rest
                    .get(2)
                    .and_then(|&i| usize::try_from(i).ok())
                    .and_then(|i| Lane::ALL.get(i).copied())
                    .unwrap_or(lane);
                self.shared
                    .hold_granted(&id, seat, tokens, prompt, Some(lane));
                self.shared.hold_preemptible(&id, handle.clone());
            }
            None => self.shared.hold_granted(&id, lane, tokens, prompt, None),
        }
        let ask = Asked {
            lane,
            tokens,
            prompt,
            long: self.shared.waits_for_prefill(prompt),
            started: Instant::now(),
            service: None,
        };
        let mut guard = self.guard(id.clone(), &ask, Duration::ZERO, None);
        if let Some(handle) = borrowed {
            guard = guard.with_preemptible(handle.clone());
        }
        Some(Ok(Taken {
            guard,
            lease: id,
            preemptible: borrowed.is_some(),
            rest,
        }))
    }

    /// Stops the background tasks after giving back what dropped guards already sent, and
    /// waits for the calls sent for requests that ended ([`RedisAdmission::spawn_background`]:
    /// each tries once more if it was waiting to retry, then gives up).
    pub async fn shutdown(&self) {
        self.stop.cancel();
        self.tasks.wait().await;
        self.shared.background.close();
        self.shared.background.wait().await;
    }

    /// Runs `call`, a call to Redis for a request that ended (a settlement), in the
    /// background; a shutdown waits for it ([`RedisAdmission::shutdown`]).
    pub(crate) fn spawn_background(
        &self,
        call: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        self.shared.background.spawn(call);
    }

    /// Cancelled once the replica stops: a background call waiting to retry tries once more,
    /// then gives up.
    pub(crate) fn stopping(&self) -> CancellationToken {
        self.shared.stopping.clone()
    }

    /// Stops everything without releasing anything, as `kill -9` would: the heartbeat stops
    /// and guards dropped from now on release nothing, so this replica's leases expire by TTL.
    /// For tests and failure drills.
    pub fn abandon(&self) {
        self.shared
            .abandoned
            .store(true, std::sync::atomic::Ordering::Release);
        self.stop.cancel();
    }

    /// [`RedisAdmission::fall_back`] for a request that arrived at `started`: its fallback
    /// queue gets what is left of its queue timeout, not a new one.
    async fn fall_back_within(
        &self,
        ask: Ask<'_>,
        started: Instant,
    ) -> Result<LaneGuard, AdmissionError> {
        let rules = self.rules();
        let queue = rules.limits.queue(rules.limits.queue_of(ask.lane));
        let left = queue.timeout.saturating_sub(started.elapsed());
        let lane = ask.lane;
        tokio::time::timeout(left, self.fall_back(ask, started))
            .await
            .unwrap_or_else(|_| {
                Err(AdmissionError::Timeout {
                    lane,
                    waited: started.elapsed(),
                })
            })
    }

    async fn fall_back(&self, ask: Ask<'_>, started: Instant) -> Result<LaneGuard, AdmissionError> {
        let Some(local) = &self.shared.fallback else {
            return Err(AdmissionError::QuotaUnavailable { lane: ask.lane });
        };
        let mut state = self.shared.fallback_state.subscribe();
        // A request waiting in the fallback's queue as the replica leaves the fallback asks
        // Redis, within what is left of its queue timeout: it would wait for a fallback seat
        // while Redis has room, behind the requests that arrive after.
        let admitted = tokio::select! {
            biased;
            _ = state.wait_for(|s| *s == shared::FallbackState::Off) => None,
            admitted = local.acquire(ask) => Some(admitted?),
        };
        let Some(mut guard) = admitted else {
            return Box::pin(self.acquire_since(ask, started)).await;
        };
        loop {
            match self.shared.fallback_guard(guard) {
                shared::Booking::Booked(guard) => return Ok(guard),
                // Redis came back meanwhile: its fallback seat is given back.
                shared::Booking::Left => return Box::pin(self.acquire_since(ask, started)).await,
                // The registration before leaving is out: booked once it is back, or to Redis.
                shared::Booking::Closing(held) => {
                    guard = held;
                    if state
                        .wait_for(|s| *s != shared::FallbackState::Closing)
                        .await
                        .is_err()
                    {
                        return Err(AdmissionError::QuotaUnavailable { lane: ask.lane });
                    }
                }
            }
        }
    }

    /// The guard for lease `id` after `waited` in line; `prefill_blocked`: when the acquire
    /// script first answered "no prefill room" (the prefill wait runs from there).
    fn guard(
        &self,
        id: String,
        ask: &Asked,
        waited: Duration,
        prefill_blocked: Option<Instant>,
    ) -> LaneGuard {
        // Its tenant's fleet service: charged its reservation now, settled at release.
        if let Some((tenant, share)) = &ask.service {
            self.shared.service.charge(
                self.shared.connection(),
                &self.shared.background,
                tenant,
                f64::from(ask.tokens) / share,
            );
        }
        let release = LeaseRelease {
            shared: self.shared.clone(),
            id,
            service: ask
                .service
                .as_ref()
                .map(|(t, share)| (t.clone(), *share, ask.tokens)),
        };
        let prefill_wait = ask
            .long
            .then(|| prefill_blocked.map_or(Duration::ZERO, |t| t.elapsed()));
        LaneGuard::new(Box::new(release), ask.lane, ask.tokens, waited)
            .with_prefill(ask.prompt, prefill_wait)
    }
}

impl Backend for RedisAdmission {
    fn acquire<'a>(&'a self, ask: Ask<'a>) -> BoxFuture<'a, Result<LaneGuard, AdmissionError>> {
        Box::pin(RedisAdmission::acquire(self, ask))
    }

    fn set_limits(&self, config: &Config, force: bool) -> LimitsChange {
        RedisAdmission::set_limits(self, config, force)
    }

    fn snapshot(&self) -> AdmissionSnapshot {
        RedisAdmission::snapshot(self)
    }

    fn waits_for_prefill(&self, prompt: u32) -> bool {
        self.shared.waits_for_prefill(prompt)
    }

    fn over_share(&self, lane: Lane, tenant: &str) -> bool {
        let rules = self.rules();
        let i = lane.index();
        let mut tenants = self.shared.queues[i].tenants();
        tenants.extend(self.shared.long_lines[i].tenants());
        super::fair::over_share(tenants.iter().map(Option::as_ref), tenant, |t| {
            rules.shares.get(t).copied().unwrap_or(1.0)
        })
    }

    fn fair_ahead(&self, lane: Lane, long: bool, tenant: Option<&str>) -> u32 {
        let rules = self.rules();
        let i = lane.index();
        let line = if long {
            &self.shared.long_lines[i]
        } else {
            &self.shared.queues[i]
        };
        let tenants = line.tenants();
        let on_redis = super::fair::fair_ahead(tenants.iter().map(Option::as_ref), tenant, |t| {
            rules.shares.get(t).copied().unwrap_or(1.0)
        });
        // And those waiting in the fallback's queue (Redis down), as the snapshot counts them.
        let on_fallback = self
            .shared
            .fallback
            .as_ref()
            .map_or(0, |f| Backend::fair_ahead(f, lane, long, tenant));
        on_redis.saturating_add(on_fallback)
    }

    fn policy(&self) -> Policy {
        RedisAdmission::policy(self)
    }

    fn health(&self) -> AdmissionHealth {
        if !self.degraded() {
            return AdmissionHealth::Ok;
        }
        match self.on_redis_down() {
            OnRedisDown::FailOpen => AdmissionHealth::Degraded,
            OnRedisDown::FailClosed => AdmissionHealth::Unavailable,
        }
    }
}

/// The Redis client for `config.quota`: `rediss://` is TLS (rustls), checked against
/// `quota.redis_ca_file` when given, else the system's roots.
pub fn client(config: &Config) -> Result<redis::Client, redis::RedisError> {
    let url = config.quota.redis_url.expose();
    match &config.quota.redis_ca_pem {
        Some(ca) => redis::Client::build_with_tls(
            url,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(ca.clone()),
            },
        ),
        None => redis::Client::open(url),
    }
}

/// A replica's line limits and tenant shares.
#[derive(Debug)]
struct LineRules {
    limits: Limits,
    shares: std::collections::HashMap<String, f64>,
    /// `auth.fleet_fairness` with `[auth]` on.
    fleet_fairness: bool,
}

impl LineRules {
    fn from_config(config: &Config) -> Self {
        Self {
            limits: Limits::from_config(config),
            shares: crate::admission::fair::shares(config),
            fleet_fairness: config.auth.enabled && config.auth.fleet_fairness,
        }
    }
}

/// Writes the limits of `config` as the shared limits record (a new version) in
/// `config.quota`'s Redis, for `tutor-gateway limits push`: every replica enforces it from its
/// next admission on, and learns the version through the `released` channel. The version.
pub async fn push_limits(config: &Config) -> Result<u64, String> {
    if config.quota.backend != crate::config::QuotaBackend::Redis {
        return Err("quota.backend is \"local\": there is no shared limits record".into());
    }
    let client = client(config).map_err(|e| format!("quota.redis_url: {e}"))?;
    let mut conn = tokio::time::timeout(
        Duration::from_secs(5),
        client.get_multiplexed_async_connection(),
    )
    .await
    .map_err(|_| format!("{}: no answer within 5 s", config.quota.redis_url))?
    .map_err(|e| format!("{}: {e}", config.quota.redis_url))?;
    let keys = Keys::new(&config.quota.key_prefix);
    let origin = match std::env::var("USER").or_else(|_| std::env::var("HOSTNAME")) {
        Ok(who) if !who.is_empty() => format!("{PUSH_ORIGIN} by {who}"),
        _ => PUSH_ORIGIN.to_owned(),
    };
    let reply = scripts::Scripts::default()
        .limits(
            &mut conn,
            &keys,
            LimitsWrite::Force,
            &LimitsRecord::from_config(config),
            &origin,
        )
        .await
        .map_err(|e| format!("writing the limits record: {e}"))?;
    Ok(reply.version)
}

/// What [`RedisAdmission::take_with`] took.
#[derive(Debug)]
pub struct Taken {
    /// The lease, as a guard.
    pub guard: LaneGuard,
    /// The lease's id.
    pub lease: String,
    /// The lease is pre-emptible (see [`RedisAdmission::take_with`]).
    pub preemptible: bool,
    /// The rest of the script's reply.
    pub rest: Vec<i64>,
}

/// One acquire's request, as its guard needs it.
struct Asked {
    lane: Lane,
    tokens: u32,
    prompt: u32,
    /// A long prompt under a prefill budget (it may wait for prefill room).
    long: bool,
    started: Instant,
    /// Its tenant and share when its service is counted fleet-wide (`auth.fleet_fairness`).
    service: Option<(Arc<str>, f64)>,
}

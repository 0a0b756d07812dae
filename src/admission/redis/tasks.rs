//! Background tasks of a Redis-backed replica, tracked and stopped together:
//!
//! - `heartbeat`: connects (and keeps retrying while Redis is down), renews this replica's
//!   leases every `heartbeat`, retries releases that failed, and leaves the fallback once a
//!   beat succeeds again and what the fallback admitted is registered in Redis. Its renew call
//!   also reaps other replicas' expired leases, and always writes (`:beat`), so a beat proves
//!   Redis takes writes, not only that it answers.
//! - `releaser`: runs the release script for every dropped guard (Drop cannot await), and the
//!   prefill-done script for every first token, in the order they were sent.
//! - `listener`: subscribes to the `released` channel and wakes the lane's local heads (and
//!   every long-prompt line on `prefill`); subscribes again when its connection is found dead
//!   (`subscription.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManagerConfig;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::scripts::LimitsWrite;
use super::shared::{Give, Lease, Shared};
use super::subscription::{Subscription, LIVED, PING_TIMEOUT};
use crate::lane::Lane;

/// Each Redis call gives up after this long (then counts as Redis down).
const CALL_TIMEOUT: Duration = Duration::from_millis(500);
/// Leases renewed per script call.
const RENEW_CHUNK: usize = 500;

fn manager_config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(CALL_TIMEOUT)
        .set_response_timeout(CALL_TIMEOUT)
        .set_number_of_retries(1)
        .set_max_delay(200)
}

/// Connects, renews, retries failed releases, probes while degraded.
pub(super) async fn heartbeat(
    shared: Arc<Shared>,
    mut retry: mpsc::UnboundedReceiver<Lease>,
    stop: CancellationToken,
) {
    let mut pending: Vec<(Lease, Instant)> = Vec::new();
    // When the last beat that went through started: every lease held then was renewed by it.
    let mut renewed_at: Option<Instant> = None;
    let mut tick = tokio::time::interval(shared.heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // A stopped (or abandoned) replica beats no more, even when its task wakes late with
        // a tick due as well: a last beat would renew nothing but could reap other replicas'
        // expired leases in a replica that is meant to be gone (measured: a crash test on a
        // loaded machine saw the "dead" replica reap them).
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if shared.connection().is_none() {
            match shared
                .client
                .get_connection_manager_with_config(manager_config())
                .await
            {
                Ok(mut conn) => {
                    warn_if_evicting(&mut conn).await;
                    shared.conn.send_replace(Some(conn));
                    // The shared limits record: this replica's limits where there is none yet.
                    shared.write_limits(LimitsWrite::Ensure).await;
                    // The data's epoch as first seen (a later change: Redis lost its data).
                    shared.data_lost().await;
                }
                Err(err) => {
                    shared.failed("connect", &err);
                    shared
                        .beats
                        .fetch_add(1, std::sync::atomic::Ordering::Release);
                    continue;
                }
            }
        }
        while let Ok(lease) = retry.try_recv() {
            pending.push((lease, Instant::now()));
        }
        let mut lost = Vec::new();
        let was_degraded = shared.degraded();
        let started = Instant::now();
        if beat(&shared, &mut pending, &mut lost).await {
            after_renewal(&shared, &lost, was_degraded, started, &mut renewed_at).await;
        } else if shared.degraded() {
            // The next beat builds a new connection: a connection manager whose own reconnects
            // failed on authentication kept failing after the password was right again.
            shared.conn.send_replace(None);
        }
        shared
            .beats
            .fetch_add(1, std::sync::atomic::Ordering::Release);
    }
}

/// What a beat that went through (started at `started`, on a replica `was_degraded` or not,
/// whose previous such beat started at `renewed_at`) does next: registers again the leases it
/// found gone (`lost`) and what its fallback admitted, saying why they went, and syncs the
/// shared limits.
pub(super) async fn after_renewal(
    shared: &Shared,
    lost: &[String],
    was_degraded: bool,
    started: Instant,
    renewed_at: &mut Option<Instant>,
) {
    let ttl = Duration::from_millis(shared.ttl_ms);
    shared.succeeded();
    // Redis lost its data (restarted without persistence, flushed, failed over to an
    // empty replica): the leases found gone went with it, nobody took their seats.
    let wiped = shared.data_lost().await;
    if wiped {
        tracing::warn!(
            leases = lost.len(),
            "the shared quota's Redis lost its data: this replica's running requests \
                 are counted there again"
        );
    }
    // Every lease found gone is registered again: its request runs on, and left out
    // its seat would go to another request while it does (Redis then counts one
    // request more than a lane's limit until one ends, as after an outage). Why it
    // went is said once a beat. Renewed less than half a TTL ago by this replica's
    // clock, a lease cannot have expired: Redis's clock ran ahead (stepped forward, or
    // a failover to a server whose clock is ahead) and reaped it early. Otherwise this
    // replica renewed it too late (its heartbeat stalled past the TTL: a process
    // paused, a starved machine).
    let since = renewed_at.map(|at| at.elapsed());
    if !lost.is_empty() && !was_degraded && !wiped {
        match since {
            Some(since) if since < ttl / 2 => tracing::warn!(
                leases = lost.len(),
                "the shared quota's Redis reaped leases renewed less than half their \
                     TTL ago (its clock ran ahead): this replica's running requests are \
                     counted there again"
            ),
            _ => tracing::warn!(
                leases = lost.len(),
                since_renewal_ms = since.map_or(0, |s| s.as_millis()),
                ttl_ms = shared.ttl_ms,
                "this replica renewed its leases in the shared quota too late (its \
                     heartbeat stalled past their TTL) and Redis reaped them: its running \
                     requests are counted there again"
            ),
        }
    }
    *renewed_at = Some(started);
    // What ran while Redis was away (and leases it lost) is counted there again, before
    // Redis admits anything for this replica: leaving the fallback first would let it
    // admit against counters that miss those requests. A registration that fails
    // leaves the replica on its fallback until a later beat's succeeds.
    shared.back_on_redis(lost).await;
    sync_limits(shared).await;
    // The record in force changed (a push, another replica's write), or this replica's
    // file did under a pushed record: are they the same now? After this replica's own
    // pending write (compared with that, its new limits would differ for a beat).
    if !shared.limits_pending()
        && shared
            .limits_recheck
            .swap(false, std::sync::atomic::Ordering::AcqRel)
    {
        shared.write_limits(LimitsWrite::Ensure).await;
    }
}

/// Warns when this Redis may evict keys: a `maxmemory` with a `maxmemory-policy` other than
/// `noeviction`. An evicted lease, usage counter, limits record or job record leaves the shared
/// counts wrong (a seat counted for good, a job's bytes never given back) until the keys are
/// deleted by hand; under `noeviction` a full Redis refuses writes instead, and the replicas
/// fall back. A Redis that does not answer `CONFIG GET` (a managed one may refuse it) is not
/// checked.
async fn warn_if_evicting(conn: &mut redis::aio::ConnectionManager) {
    let reply: redis::RedisResult<Vec<String>> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory*")
        .query_async(conn)
        .await;
    let Ok(pairs) = reply else {
        return;
    };
    let value = |name: &str| {
        pairs
            .chunks(2)
            .find(|kv| kv[0] == name)
            .and_then(|kv| kv.get(1))
            .map(String::as_str)
    };
    let (Some(limit), Some(policy)) = (value("maxmemory"), value("maxmemory-policy")) else {
        return;
    };
    if limit != "0" && policy != "noeviction" {
        tracing::warn!(
            maxmemory = limit,
            policy,
            "the shared quota's Redis may evict keys (maxmemory-policy {policy}): an evicted \
             lease, counter or job record leaves the fleet's counts wrong; run it with \
             maxmemory-policy noeviction"
        );
    }
}

/// Writes this replica's limits when a reload left them pending, else reads the shared
/// record's version and origin (should an announcement have been missed).
async fn sync_limits(shared: &Shared) {
    if shared.write_pending_limits().await {
        read_limits_version(shared).await;
    }
}

/// Reads the shared limits record's version and origin.
pub(super) async fn read_limits_version(shared: &Shared) {
    let Some(mut conn) = shared.connection() else {
        return;
    };
    let seen: Result<(Option<u64>, Option<String>), _> = redis::cmd("HMGET")
        .arg(&shared.keys.limits)
        .arg("version")
        .arg("origin")
        .query_async(&mut conn)
        .await;
    match seen {
        Ok((Some(v), origin)) => shared.saw_limits(v, origin.as_deref().unwrap_or("")),
        // Redis lost the record: this replica's limits, until someone pushes.
        Ok((None, _)) => {
            shared.write_limits(LimitsWrite::Ensure).await;
        }
        Err(_) => {}
    }
}

/// One heartbeat: renew every held lease (the ones Redis no longer has go to `lost`, to be
/// registered again), then retry pending releases. True when all calls succeeded.
pub(super) async fn beat(
    shared: &Shared,
    pending: &mut Vec<(Lease, Instant)>,
    lost: &mut Vec<String>,
) -> bool {
    let Some(mut conn) = shared.connection() else {
        return false;
    };
    let ids: Vec<String> = shared.held().keys().cloned().collect();
    let chunks: Vec<&[String]> = if ids.is_empty() {
        vec![&[]]
    } else {
        ids.chunks(RENEW_CHUNK).collect()
    };
    for chunk in chunks {
        let started = Instant::now();
        let reply = shared
            .scripts
            .renew(&mut conn, &shared.keys, shared.ttl_ms, chunk)
            .await;
        shared
            .metrics
            .observe("renew", started.elapsed().as_secs_f64());
        match reply {
            Ok(r) => {
                shared.metrics.reaped(r.reaped);
                for id in r.missing {
                    shared.metrics.error("lease_lost");
                    lost.push(id);
                }
            }
            Err(err) => {
                shared.failed("renew", &err);
                return false;
            }
        }
    }
    // A release older than the TTL no longer matters: Redis has reaped the lease by now.
    let ttl = Duration::from_millis(shared.ttl_ms);
    pending.retain(|(_, since)| since.elapsed() < ttl);
    while let Some((lease, since)) = pending.pop() {
        if !release_one(shared, &mut conn, &lease).await {
            pending.push((lease, since));
            return false;
        }
    }
    true
}

/// Runs the release script (or the prefill-done script); true on success (also when the
/// lease was already gone). A prefill give-back that fails is retried like a release: until
/// then the fleet counts the request as still prefilling (long prompts wait longer, the budget
/// is never exceeded), and its release gives the room back anyway.
async fn release_one(
    shared: &Shared,
    conn: &mut redis::aio::ConnectionManager,
    lease: &Lease,
) -> bool {
    give_back(shared, conn, std::slice::from_ref(lease)).await
}

/// [`release_one`] for several leases, in at most two script calls: the prefill give-backs,
/// then the releases (a lease both finished prefill and ended: the release gives everything
/// back, whichever comes first). Both are idempotent, so a batch that failed is retried whole.
async fn give_back(
    shared: &Shared,
    conn: &mut redis::aio::ConnectionManager,
    leases: &[Lease],
) -> bool {
    let given = |give: Give| leases.iter().filter(move |l| l.give == give);
    for (op, give) in [("prefill_done", Give::Prefill), ("release", Give::Lease)] {
        if given(give).next().is_none() {
            continue;
        }
        let started = Instant::now();
        let reply = match give {
            Give::Prefill => {
                let ids: Vec<_> = given(give)
                    .map(|l| (l.id.as_str(), l.first_token.map(|at| at.elapsed())))
                    .collect();
                let reply = shared.scripts.prefill_done(conn, &shared.keys, &ids).await;
                reply.map(|_| ())
            }
            Give::Lease => {
                let ids: Vec<&str> = given(give).map(|l| l.id.as_str()).collect();
                let reply = shared.scripts.release_all(conn, &shared.keys, &ids).await;
                reply.map(|given| {
                    shared
                        .metrics
                        .leases("release", usize::try_from(given).unwrap_or(usize::MAX));
                })
            }
        };
        shared.metrics.observe(op, started.elapsed().as_secs_f64());
        if let Err(err) = reply {
            shared.failed(op, &err);
            return false;
        }
    }
    // A release that went through does not reset the failures in a row: a Redis out of
    // memory still takes it (its first write removes), while every acquire fails.
    let prefill = leases.iter().any(|l| l.give == Give::Prefill);
    for lane in Lane::ALL {
        if leases.iter().any(|l| l.lane == lane) {
            shared.notify(Some(lane), prefill);
        }
    }
    true
}

/// Releases the leases of dropped guards; failures go to the heartbeat for retry. What piled
/// up while a call ran goes in the next one (up to `quota.batch_max` leases), in the order
/// sent. On stop, drains what was already sent (a graceful shutdown gives everything back).
pub(super) async fn releaser(
    shared: Arc<Shared>,
    mut leases: mpsc::UnboundedReceiver<Lease>,
    retry: mpsc::UnboundedSender<Lease>,
    stop: CancellationToken,
) {
    let mut batch = Vec::with_capacity(shared.batch_max);
    loop {
        let lease = tokio::select! {
            lease = leases.recv() => lease,
            () = stop.cancelled() => {
                leases.close();
                leases.recv().await
            }
        };
        let Some(lease) = lease else { return };
        batch.push(lease);
        while batch.len() < shared.batch_max {
            match leases.try_recv() {
                Ok(lease) => batch.push(lease),
                Err(_) => break,
            }
        }
        let ok = match shared.connection() {
            Some(mut conn) => give_back(&shared, &mut conn, &batch).await,
            None => false,
        };
        if !ok && !stop.is_cancelled() {
            for lease in batch.drain(..) {
                let _ = retry.send(lease);
            }
        }
        batch.clear();
    }
}

/// How often the fleet service counters are read (`service`).
const SERVICE_READ_EVERY: Duration = Duration::from_millis(250);
/// The window Jain's index is measured over.
const FAIRNESS_WINDOW: Duration = Duration::from_secs(10);

/// Reads the fleet service counters into this replica's view every [`SERVICE_READ_EVERY`]
/// while Redis is reachable, and sets their metrics.
pub(super) async fn service_reader(shared: Arc<Shared>, stop: CancellationToken) {
    // Snapshots of the last 10 s, for Jain's index over that window.
    let mut past: std::collections::VecDeque<(Instant, std::collections::HashMap<String, f64>)> =
        std::collections::VecDeque::new();
    let mut tick = tokio::time::interval(SERVICE_READ_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let Some(mut conn) = shared.connection().filter(|_| !shared.degraded()) else {
            // No beat: who waits where is no longer known.
            shared.service.forget_waiting();
            continue;
        };
        let mut mine: Vec<(String, Arc<str>)> = Vec::new();
        for lane in Lane::ALL {
            for (line, queue) in [
                (
                    super::service::line_name(lane, false),
                    &shared.queues[lane.index()],
                ),
                (
                    super::service::line_name(lane, true),
                    &shared.long_lines[lane.index()],
                ),
            ] {
                let mut tenants: Vec<Arc<str>> = queue.tenants().into_iter().flatten().collect();
                tenants.sort();
                tenants.dedup();
                mine.extend(tenants.into_iter().map(|t| (line.clone(), t)));
            }
        }
        if shared.service.refresh(&mut conn, &mine).await.is_err() {
            shared.service.forget_waiting();
            continue;
        }
        for (tenant, tokens) in shared.service.named() {
            shared.metrics.tenant_service(&tenant, tokens);
        }
        shared.metrics.service_gap(shared.service.fleet_gap());
        let fields = shared.service.waiting_fields();
        let now = shared.service.snapshot();
        while past
            .front()
            .is_some_and(|(at, _)| at.elapsed() > FAIRNESS_WINDOW)
        {
            past.pop_front();
        }
        let jain = past
            .front()
            .and_then(|(_, then)| super::service::jain(&fields, then, &now));
        shared.metrics.fairness(jain);
        past.push_back((Instant::now(), now));
    }
}

/// Wakes local heads when any replica releases, and (`jobs.preempt`) asks this replica's
/// pre-emptible leases to leave when an acquire anywhere asks; reconnects after errors.
pub(super) async fn listener(shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let opened = tokio::select! {
            () = stop.cancelled() => return,
            opened = listen(&shared) => opened,
        };
        if opened {
            // A subscription that was live for a while and died: a new one at once.
            continue;
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(shared.heartbeat) => {}
        }
    }
}

/// [`listener`]'s work on one subscription, until its connection fails; whether it opened and
/// lived at least [`LIVED`].
async fn listen(shared: &Shared) -> bool {
    let mut channels = vec![shared.keys.released.as_str()];
    if shared.marks_every_lane {
        channels.push(shared.keys.leave.as_str());
    }
    let every = shared.heartbeat;
    let Ok(mut messages) = Subscription::open(&shared.client, &channels, every, PING_TIMEOUT).await
    else {
        return false;
    };
    // Releases announced while no subscription listened: every waiter tries again.
    shared.notify(None, true);
    for lane in Lane::ALL {
        shared.notify(Some(lane), false);
    }
    let opened = std::time::Instant::now();
    loop {
        let Ok(msg) = messages.next().await else {
            // One that ends at once (a server closing every subscriber) waits a beat.
            return opened.elapsed() >= LIVED;
        };
        let what: String = msg.get_payload().unwrap_or_default();
        if msg.get_channel_name() == shared.keys.leave {
            shared.asked_to_leave(&what);
        } else if what == "prefill" {
            shared.notify(None, true);
        } else if what == "limits" {
            read_limits_version(shared).await;
            // New limits may let waiters in.
            shared.notify(None, true);
            for lane in Lane::ALL {
                shared.notify(Some(lane), false);
            }
        } else if let Some(lane) = Lane::ALL.into_iter().find(|l| l.as_str() == what) {
            shared.notify(Some(lane), false);
        }
    }
}

//! The Redis backend's own tasks on each replica: the beat (runner leases, lost runners, result
//! expiry, the status gauge) and the listener (announcements, and the wake-ups of the
//! scheduler on any replica's releases).

use std::sync::Arc;

use super::store::{store_down, RedisStore};
use crate::admission::redis::subscription::{Subscription, LIVED, PING_TIMEOUT};
use crate::telemetry::job_metrics::JOB_STATUSES;

/// Every heartbeat: renews this replica's runner leases, lets the beat script put lost jobs
/// back and expire results, sets the status gauge to the fleet's counts, and cancels the runs
/// whose cancel was asked (should the announcement have been missed).
pub async fn beat(store: Arc<RedisStore>) {
    let (ttl, heartbeat) = store.admission.lease_timing();
    let mut tick = tokio::time::interval(heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = store.ctx.stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let Ok(mut conn) = store.conn().await else {
            continue;
        };
        let mine: Vec<(String, String)> = store
            .running()
            .iter()
            .map(|(id, run)| (id.clone(), run.token.clone()))
            .collect();
        let mut call = store.call(&store.scripts.beat, None);
        call.arg(ttl.as_millis().to_string())
            .arg(store.ctx.config.max_attempts)
            .arg(store.result_ttl_ms);
        for (id, token) in &mine {
            call.arg(id).arg(token);
        }
        let reply: Vec<redis::Value> = match call.invoke_async(&mut conn).await {
            Ok(r) => r,
            Err(e) => {
                store_down("beat", &e);
                continue;
            }
        };
        let n = |i: usize| {
            reply
                .get(i)
                .and_then(|v| redis::from_redis_value::<i64>(v).ok())
                .unwrap_or(0)
        };
        let (requeued, lost) = (n(0), n(1));
        if requeued > 0 || lost > 0 {
            tracing::warn!(
                requeued,
                lost,
                "jobs whose gateway stopped: put back in the queue, or failed after jobs.max_attempts runs"
            );
            store.ctx.wake.notify_one();
        }
        let metrics = store.ctx.metrics();
        let mut live: usize = 0;
        for (i, status) in JOB_STATUSES.iter().enumerate() {
            let count = n(5 + i).max(0);
            metrics.set(status, count);
            if *status != "expired" {
                live = usize::try_from(count).map_or(live, |c| live.saturating_add(c));
            }
        }
        *store
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            (live, u64::try_from(n(4)).unwrap_or(0));
        let ids = |i: usize| -> Vec<String> {
            reply
                .get(i)
                .and_then(|v| redis::from_redis_value(v).ok())
                .unwrap_or_default()
        };
        // Cancels asked (should the announcement have been missed); runs that lost their job.
        for id in ids(11) {
            if let Some(run) = store.running().get(&id) {
                run.cancel.cancel();
            }
        }
        for id in ids(12) {
            if let Some(run) = store.running().get(&id) {
                run.lost.cancel();
            }
        }
        // Jobs this beat ended (cancelled after their gateway died, or runner_lost).
        for id in ids(13) {
            store.notify_ended(&id).await;
        }
    }
}

/// Forwards `:jobs:changed` announcements to this replica's streams and runs (a `cancel <id>`
/// cancels the run here, if it is here), and wakes the scheduler on any replica's releases
/// (the quota's `released` channel) and submissions. Reconnects after errors.
pub async fn listen(store: Arc<RedisStore>) {
    let (_, heartbeat) = store.admission.lease_timing();
    loop {
        let opened = tokio::select! {
            _ = store.ctx.stop.cancelled() => return,
            opened = listen_once(&store, heartbeat) => opened,
        };
        if opened {
            // A subscription that was live for a while and died: a new one at once.
            continue;
        }
        tokio::select! {
            _ = store.ctx.stop.cancelled() => return,
            _ = tokio::time::sleep(heartbeat) => {}
        }
    }
}

/// [`listen`]'s work on one subscription (checked every `heartbeat`), until its connection
/// fails; whether it opened and lived at least [`LIVED`].
async fn listen_once(store: &RedisStore, heartbeat: std::time::Duration) -> bool {
    let released = store.admission.keys().released.as_str();
    let channels = [store.channel.as_str(), released];
    let client = store.admission.client();
    let Ok(mut messages) = Subscription::open(client, &channels, heartbeat, PING_TIMEOUT).await
    else {
        return false;
    };
    // What was announced while no subscription listened: the scheduler looks again (streams
    // read Redis at least once a second anyway).
    store.ctx.wake.notify_one();
    let opened = std::time::Instant::now();
    loop {
        let Ok(msg) = messages.next().await else {
            // One that ends at once (a server closing every subscriber) waits a beat.
            return opened.elapsed() >= LIVED;
        };
        let what: String = msg.get_payload().unwrap_or_default();
        if msg.get_channel_name() == released {
            store.ctx.wake.notify_one();
            continue;
        }
        if let Some(id) = what.strip_prefix("cancel ") {
            if let Some(run) = store.running().get(id) {
                run.cancel.cancel();
            }
            let _ = store.changes.send(Arc::from(id));
        } else {
            // (Not a wake-up for the scheduler: pieces are announced too; another replica's
            // submission is seen at the next heartbeat.)
            let _ = store.changes.send(Arc::from(what.as_str()));
        }
    }
}

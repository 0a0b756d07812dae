//! Tenants' budgets (`[auth.tenants.<name>]`): requests and prompt + output tokens per minute,
//! tokens per UTC day. The ledger lives where the quota lives: in this process with the local
//! backend; in Redis with the Redis backend, shared by every replica (`lua/tenant_budget_v2.lua`:
//! one atomic script checks and charges, on Redis's clock, so two replicas never both admit the
//! request that crosses a limit). While Redis is unreachable each replica charges its own
//! ledger (the budget then holds per replica, as the session counts do).
//!
//! - **A sliding minute of one-second buckets.** A request is let through while what its
//!   tenant was charged in the last 60 whole seconds is under the limit; it is then charged
//!   its reservation (its estimated prompt plus its output budget, as the lanes reserve). So
//!   what any minute admits stays within the budget plus one request's reservation.
//! - **Settled to what the engine counted.** When the request ends its charge becomes its
//!   prompt + output tokens as vLLM reported them (the bucket it was charged in, if still in
//!   the minute, or the one it counts in since the clock was set back; the day's count
//!   always); a request refused or failed before it reached the
//!   engine is charged nothing. A [`BudgetHold`] does it on every path (drop).
//! - **A day** is a UTC day: its count starts again at midnight.
//! - **A clock set back** (an NTP step; in Redis, a failover to a server whose clock is
//!   behind) neither frees the tenant nor locks it out: charges stamped after the clock's now
//!   count as now's (they leave the minute a minute from then), and across one midnight the
//!   day's count goes on in the later day until the clock reaches its end (a count more than a
//!   day ahead starts again).
//! - **Refusals** name the limit and the tenant's own use, with `Retry-After`: when enough of
//!   the minute's charges will have left it, or the next UTC midnight.
//! - **In Redis** a tenant's keys are `<prefix>:{quota}:tenant:<16 hex of a hash of its
//!   name>:minute` (a hash of per-second charges, expiring 2 minutes after the last) and
//!   `:day` (expiring after 2 days). A charge is one script call that is never retried, so it
//!   is never counted twice; its settlement is one more call, sent in the background and again
//!   while Redis does not answer (for up to 120 s; the script marks the charge settled, so a
//!   settlement sent again is applied once).
//! - **A charge whose reply is lost is given back.** Each charge carries an id (its record,
//!   `:charge:<id>`, kept 120 s). When its caller gives up before the reply (the client went
//!   away meanwhile) or the reply does not come (Redis slow or unreachable: the request is then
//!   charged in this replica), the script may still have charged it, and nothing would settle
//!   it: the tenant would pay its reservation for the minute and the day. The charge is
//!   cancelled in the background instead (retried for up to 120 s): the script gives it back
//!   if it ran and marks the id cancelled if it has not, so a charge still on its way does
//!   nothing.

// The request path: a client's number never wraps (checked or saturating arithmetic only).
#![deny(clippy::arithmetic_side_effects)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::Script;
use sha2::{Digest, Sha256};

use super::redis::RedisAdmission;
use crate::config::TenantBudget;
use crate::telemetry::throttle::Throttle;

/// Seconds in the sliding window.
const WINDOW_S: u64 = 60;
/// Seconds in a day.
const DAY_S: u64 = 86_400;
/// How long Redis keeps a charge's record, and so how long a lost charge may be cancelled
/// (`lua/tenant_budget_v2.lua`).
const RECORD_TTL: Duration = Duration::from_secs(120);
/// The longest wait between two tries of a cancel or a settlement.
const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Why a tenant's request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetRefusal {
    /// The limit's key: `requests_per_minute`, `tokens_per_minute`, `tokens_per_day`.
    pub limit: &'static str,
    /// What the tenant used of it.
    pub used: u64,
    /// The limit.
    pub max: u64,
    /// When to come back.
    pub retry_after: Duration,
}

/// One tenant's charges.
#[derive(Debug, Default)]
struct Ledger {
    /// (second, requests, tokens) of the last [`WINDOW_S`] seconds, oldest first.
    seconds: Vec<(u64, u64, u64)>,
    /// (stamped, counted as): seconds stamped after the clock's now (it was set back) and the
    /// second they count in since, so that their settlements find them; kept while that
    /// second is in the minute.
    moved: Vec<(u64, u64)>,
    /// (day, tokens).
    day: (u64, u64),
}

impl Ledger {
    /// Drops the charges that left the minute ending at `now_s`. Charges stamped after
    /// `now_s` (the clock was set back) count as `now_s`'s: the minute holds them for one
    /// minute from now, not for as long again as the clock went back (the tenant was refused
    /// that long), and not for less (a budget that forgot them would let a minute's worth more
    /// through).
    fn forget_before(&mut self, now_s: u64) {
        let oldest = now_s.saturating_sub(WINDOW_S.saturating_sub(1));
        let (mut requests, mut tokens) = (0u64, 0u64);
        let moved = &mut self.moved;
        moved.retain(|(_, to)| *to >= oldest);
        self.seconds.retain(|(s, r, t)| {
            if *s > now_s {
                requests = requests.saturating_add(*r);
                tokens = tokens.saturating_add(*t);
                moved.push((*s, now_s));
                return false;
            }
            *s >= oldest
        });
        if requests > 0 || tokens > 0 {
            match self.seconds.last_mut() {
                Some(last) if last.0 == now_s => {
                    last.1 = last.1.saturating_add(requests);
                    last.2 = last.2.saturating_add(tokens);
                }
                _ => self.seconds.push((now_s, requests, tokens)),
            }
        }
    }

    /// The bucket a charge stamped `second` counts in: its own, or the one it was moved to
    /// when the clock was set back (each move goes to an earlier second).
    fn bucket(&mut self, mut second: u64) -> Option<&mut (u64, u64, u64)> {
        for _ in 0..8 {
            if self.seconds.iter().any(|b| b.0 == second) {
                return self.seconds.iter_mut().find(|b| b.0 == second);
            }
            second = self.moved.iter().find(|m| m.0 == second)?.1;
        }
        None
    }

    fn minute(&self) -> (u64, u64) {
        self.seconds.iter().fold((0, 0), |(r, t), (_, rr, tt)| {
            (r.saturating_add(*rr), t.saturating_add(*tt))
        })
    }

    /// Seconds until the charges of the minute fall under `max` (by `pick`).
    fn wait_under(&self, now_s: u64, max: u64, pick: impl Fn(&(u64, u64, u64)) -> u64) -> u64 {
        let mut left: u64 = self.seconds.iter().map(&pick).sum();
        for b in &self.seconds {
            left = left.saturating_sub(pick(b));
            if left < max {
                return b.0.saturating_add(WINDOW_S).saturating_sub(now_s).max(1);
            }
        }
        1
    }
}

/// Every tenant's ledger: this process's, and Redis's when the quota is shared.
#[derive(Debug, Default)]
pub struct TenantBudgets {
    ledgers: Mutex<HashMap<String, Ledger>>,
    redis: Option<(RedisAdmission, Script)>,
}

/// A request's charge, settled when it ends (dropped unsettled: nothing is charged).
#[derive(Debug)]
pub struct BudgetHold {
    budgets: Arc<TenantBudgets>,
    tenant: String,
    second: u64,
    day: u64,
    reserved: u64,
    /// Charged in Redis (else in this process): the charge's record, marked at settlement.
    shared: Option<String>,
    settled: bool,
}

/// A charge sent to Redis whose reply was not read yet: dropped armed (its caller gave up, or
/// the reply did not come), the charge is cancelled in the background.
struct ChargePending {
    budgets: Arc<TenantBudgets>,
    tenant: String,
    record: Option<String>,
}

impl ChargePending {
    /// The reply was read: what it says is booked, nothing to cancel.
    fn disarm(&mut self) {
        self.record = None;
    }
}

impl Drop for ChargePending {
    fn drop(&mut self) {
        let Some(record) = self.record.take() else {
            return;
        };
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let Some((redis, _)) = &self.budgets.redis else {
            return;
        };
        let (budgets, tenant) = (self.budgets.clone(), std::mem::take(&mut self.tenant));
        redis.spawn_background(async move { budgets.cancel(&tenant, &record).await });
    }
}

/// The largest number a limit or a charge is sent to Lua as (its numbers are doubles).
const LUA_MAX: u64 = 1 << 53;

/// Whether a day's count kept as day `day` still counts at `now` (seconds): its own day, or
/// the day after now's (the clock was set back across one midnight).
fn same_day(day: u64, now: u64) -> bool {
    let today = now / DAY_S;
    day == today || Some(day) == today.checked_add(1)
}

/// Now, in whole seconds since the Unix epoch.
fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl TenantBudgets {
    /// A ledger kept in the Redis quota's server, shared by every replica.
    pub fn shared(redis: RedisAdmission) -> Self {
        Self {
            ledgers: Mutex::default(),
            redis: Some((
                redis,
                Script::new(include_str!("../../lua/tenant_budget_v2.lua")),
            )),
        }
    }

    /// `tenant`'s two Redis keys (its name hashed: never a raw name in a key).
    fn keys(redis: &RedisAdmission, tenant: &str) -> (String, String) {
        let base = Self::base(redis, tenant);
        (format!("{base}:minute"), format!("{base}:day"))
    }

    fn base(redis: &RedisAdmission, tenant: &str) -> String {
        let digest = Sha256::digest(tenant.as_bytes());
        format!(
            "{}:tenant:{}",
            redis.keys().base,
            crate::sign::hex(&digest[..8])
        )
    }

    /// The key of the record of `tenant`'s charge `id`.
    fn record(redis: &RedisAdmission, tenant: &str, id: &str) -> String {
        format!("{}:charge:{id}", Self::base(redis, tenant))
    }

    /// Gives back `tenant`'s charge whose record is `record`, if it ran, and keeps it from
    /// running if it has not: tried until Redis answers, for as long as the record lives.
    async fn cancel(&self, tenant: &str, record: &str) {
        if self.until_answered(tenant, record, &["cancel"]).await {
            tracing::debug!("tenant budget: a charge without its reply was cancelled");
        } else {
            tracing::warn!("tenant budget: a charge whose reply was lost could not be cancelled; it counts until it leaves the minute (and the day)");
        }
    }

    /// Runs the script on `tenant`'s keys and the charge `record` with `args` until Redis
    /// answers: while it is unreachable, or a call fails, again after a wait doubling from
    /// 100 ms to [`RETRY_BACKOFF_MAX`], for up to [`RECORD_TTL`] (the record's life, within
    /// which the script applies a call sent again once), or, once the replica stops, once
    /// more. False when it never answered.
    async fn until_answered(&self, tenant: &str, record: &str, args: &[&str]) -> bool {
        let Some((redis, script)) = &self.redis else {
            return false;
        };
        let (minute, day) = Self::keys(redis, tenant);
        let started = tokio::time::Instant::now();
        let mut backoff = Duration::from_millis(100);
        let mut stopping = false;
        loop {
            if let Some(mut conn) = redis.connection() {
                let mut call = script.prepare_invoke();
                call.key(&minute).key(&day).key(record);
                for arg in args {
                    call.arg(*arg);
                }
                match call.invoke_async::<redis::Value>(&mut conn).await {
                    Ok(_) => return true,
                    Err(e) => {
                        tracing::debug!(error = %e, call = args[0], "tenant budget: a call did not reach Redis")
                    }
                }
            }
            if started.elapsed().saturating_add(backoff) >= RECORD_TTL || stopping {
                return false;
            }
            let stop = redis.stopping();
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = stop.cancelled() => stopping = true,
            }
            backoff = backoff.saturating_mul(2).min(RETRY_BACKOFF_MAX);
        }
    }

    /// Charges `tenant` (whose budgets are `budget`) one request of `tokens` reserved, or says
    /// which limit refuses it. In Redis when the quota is shared and Redis answers; else here.
    pub async fn charge(
        self: &Arc<Self>,
        tenant: &str,
        budget: &TenantBudget,
        tokens: u64,
    ) -> Result<BudgetHold, BudgetRefusal> {
        if let Some(charged) = self.charge_shared(tenant, budget, tokens).await {
            return charged;
        }
        self.charge_at(tenant, budget, tokens, now_s())
    }

    /// The charge in Redis; `None` when there is no Redis or it did not answer.
    async fn charge_shared(
        self: &Arc<Self>,
        tenant: &str,
        budget: &TenantBudget,
        tokens: u64,
    ) -> Option<Result<BudgetHold, BudgetRefusal>> {
        let (redis, script) = self.redis.as_ref()?;
        // A replica that just started waits for its first connection (as an acquire does):
        // charged here instead, its first requests would not count for the fleet.
        let mut conn = redis.connection_ready().await?;
        let (minute, day) = Self::keys(redis, tenant);
        let record = Self::record(redis, tenant, &redis.next_id());
        let limit = |v: Option<u64>| v.map_or(0, |v| v.min(LUA_MAX));
        let mut pending = ChargePending {
            budgets: self.clone(),
            tenant: tenant.to_owned(),
            record: Some(record.clone()),
        };
        let reply: Vec<i64> = script
            .key(minute)
            .key(day)
            .key(&record)
            .arg("charge")
            .arg(limit(budget.requests_per_minute))
            .arg(limit(budget.tokens_per_minute))
            .arg(limit(budget.tokens_per_day))
            .arg(tokens.min(LUA_MAX))
            .invoke_async(&mut conn)
            .await
            .inspect_err(|e| {
                // Once per request during an outage: a line a second, with the count held back.
                static LOG: Throttle = Throttle::new(Duration::from_secs(1));
                if let Some(held_back) = LOG.allow() {
                    tracing::warn!(error = %e, held_back, "tenant budget: Redis did not answer; charged in this replica");
                }
            })
            .ok()?;
        if reply.first() == Some(&4) {
            // Cancelled before it ran (cannot happen while this call waits): not charged.
            return None;
        }
        pending.disarm();
        let n = |i: usize| reply.get(i).map_or(0, |v| u64::try_from(*v).unwrap_or(0));
        let refused = |limit: &'static str| BudgetRefusal {
            limit,
            used: n(1),
            max: n(2),
            retry_after: Duration::from_secs(n(3).max(1)),
        };
        Some(match reply.first() {
            Some(0) => Ok(BudgetHold {
                budgets: self.clone(),
                tenant: tenant.to_owned(),
                second: n(1),
                day: n(2),
                reserved: tokens.min(LUA_MAX),
                shared: Some(record),
                settled: false,
            }),
            Some(1) => Err(refused("requests_per_minute")),
            Some(2) => Err(refused("tokens_per_minute")),
            Some(3) => Err(refused("tokens_per_day")),
            _ => return None,
        })
    }

    fn charge_at(
        self: &Arc<Self>,
        tenant: &str,
        budget: &TenantBudget,
        tokens: u64,
        now: u64,
    ) -> Result<BudgetHold, BudgetRefusal> {
        let mut ledgers = self.lock();
        let ledger = ledgers.entry(tenant.to_owned()).or_default();
        ledger.forget_before(now);
        // A new UTC day starts the count again; a clock set back across one midnight goes on
        // counting in the later day (it must not start a fresh one). A day further ahead (a
        // clock that was days ahead) is not waited for: the count starts again.
        if !same_day(ledger.day.0, now) {
            ledger.day = (now / DAY_S, 0);
        }
        let today = ledger.day.0;
        let (requests, charged) = ledger.minute();
        if let Some(max) = budget.requests_per_minute.filter(|m| requests >= *m) {
            return Err(BudgetRefusal {
                limit: "requests_per_minute",
                used: requests,
                max,
                retry_after: Duration::from_secs(ledger.wait_under(now, max, |b| b.1)),
            });
        }
        if let Some(max) = budget.tokens_per_minute.filter(|m| charged >= *m) {
            return Err(BudgetRefusal {
                limit: "tokens_per_minute",
                used: charged,
                max,
                retry_after: Duration::from_secs(ledger.wait_under(now, max, |b| b.2)),
            });
        }
        if let Some(max) = budget.tokens_per_day.filter(|m| ledger.day.1 >= *m) {
            return Err(BudgetRefusal {
                limit: "tokens_per_day",
                used: ledger.day.1,
                max,
                retry_after: Duration::from_secs(
                    today
                        .saturating_add(1)
                        .saturating_mul(DAY_S)
                        .saturating_sub(now),
                ),
            });
        }
        match ledger.seconds.last_mut() {
            Some(last) if last.0 == now => {
                last.1 = last.1.saturating_add(1);
                last.2 = last.2.saturating_add(tokens);
            }
            _ => ledger.seconds.push((now, 1, tokens)),
        }
        ledger.day.1 = ledger.day.1.saturating_add(tokens);
        Ok(BudgetHold {
            budgets: self.clone(),
            tenant: tenant.to_owned(),
            second: now,
            day: today,
            reserved: tokens,
            shared: None,
            settled: false,
        })
    }

    /// What `tenant` was charged in the last minute (requests, tokens) and today (tokens):
    /// Redis's count when the quota is shared and Redis answers; else this replica's.
    pub async fn used(&self, tenant: &str) -> (u64, u64, u64) {
        if let Some((redis, script)) = &self.redis {
            if let Some(mut conn) = redis.connection_ready().await {
                let (minute, day) = Self::keys(redis, tenant);
                let reply: redis::RedisResult<(u64, u64, u64)> = script
                    .key(minute)
                    .key(day)
                    .arg("peek")
                    .invoke_async(&mut conn)
                    .await;
                if let Ok(used) = reply {
                    return used;
                }
            }
        }
        self.used_here(tenant)
    }

    fn used_here(&self, tenant: &str) -> (u64, u64, u64) {
        let now = now_s();
        let mut ledgers = self.lock();
        let Some(ledger) = ledgers.get_mut(tenant) else {
            return (0, 0, 0);
        };
        ledger.forget_before(now);
        let (r, t) = ledger.minute();
        let day = if same_day(ledger.day.0, now) {
            ledger.day.1
        } else {
            0
        };
        (r, t, day)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Ledger>> {
        self.ledgers.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl BudgetHold {
    /// The request ended having used `tokens` (prompt + output, as the engine counted): its
    /// charge becomes that.
    pub fn settle(mut self, tokens: u64) {
        self.set(Some(tokens));
    }

    fn set(&mut self, used: Option<u64>) {
        if self.settled {
            return;
        }
        self.settled = true;
        // Never refund a request that reached the engine below zero; a request that did not
        // (dropped unsettled) is charged nothing.
        let used = used.unwrap_or(0).min(LUA_MAX);
        if let Some(record) = self.shared.take() {
            self.settle_shared(used, record);
            return;
        }
        let mut ledgers = self.budgets.lock();
        let Some(ledger) = ledgers.get_mut(&self.tenant) else {
            return;
        };
        let adjust = |v: &mut u64| {
            *v = v.saturating_sub(self.reserved).saturating_add(used);
        };
        if let Some(b) = ledger.bucket(self.second) {
            adjust(&mut b.2);
            if used == 0 {
                b.1 = b.1.saturating_sub(1);
            }
        }
        if ledger.day.0 == self.day {
            adjust(&mut ledger.day.1);
        }
    }
}

impl BudgetHold {
    /// The settlement in Redis, sent in the background (a hold may settle in a drop), and
    /// sent again while Redis does not answer (for up to [`RECORD_TTL`]: the script applies it
    /// once). Sent once, a settlement lost to a moment of unreachable Redis left the request
    /// charged its whole reservation, for the minute and the day.
    fn settle_shared(&self, used: u64, record: String) {
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let Some((redis, _)) = &self.budgets.redis else {
            return;
        };
        // Both at most 2^53: the difference fits.
        let delta = i64::try_from(used)
            .unwrap_or(i64::MAX)
            .saturating_sub(i64::try_from(self.reserved).unwrap_or(i64::MAX));
        let args = [
            "settle".to_owned(),
            self.second.to_string(),
            self.day.to_string(),
            delta.to_string(),
            (if used == 0 { "1" } else { "0" }).to_owned(),
        ];
        let (budgets, tenant) = (self.budgets.clone(), self.tenant.clone());
        // A shutdown waits for it (bounded), as for the leases.
        redis.spawn_background(async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            if !budgets.until_answered(&tenant, &record, &args).await {
                tracing::warn!("tenant budget: a settlement could not reach Redis; the request stays charged its reservation until it leaves the minute (and the day)");
            }
        });
    }
}

impl Drop for BudgetHold {
    fn drop(&mut self) {
        self.set(None);
    }
}

#[cfg(test)]
#[path = "tenant_budget_tests.rs"]
mod tests;

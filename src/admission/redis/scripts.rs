//! The quota's Lua scripts (`lua/quota_*_v2.lua`) and the Rust types that decode their replies.
//!
//! Every script is the shared prelude `quota_common_v2.lua` followed by its own body, loaded
//! with `include_str!`. [`redis::Script`] runs them with `EVALSHA` and loads them with
//! `SCRIPT LOAD` on `NOSCRIPT` (a new connection, a restarted Redis), so no call sends the
//! source twice. The `v2` in the file names and in the default key prefix lets replicas with a
//! different layout run side by side during a rolling deploy under another prefix.

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{RedisResult, Script};

use super::keys::Keys;
use crate::admission::budget::PrefillLimit;
use crate::config::{Config, Policy};
use crate::lane::Lane;

/// The quota scripts, loaded once per [`Scripts`] value.
#[derive(Debug, Clone)]
pub struct Scripts {
    acquire: Script,
    /// A pre-emptible lease on an idle seat (`jobs.preempt_answers`), run through
    /// [`super::RedisAdmission::take_with`].
    pub borrow: Script,
    renew: Script,
    release: Script,
    move_lease: Script,
    prefill_done: Script,
    limits: Script,
    adopt: Script,
    epoch: Script,
}

macro_rules! quota_script {
    ($name:literal) => {
        Script::new(concat!(
            include_str!("../../../lua/quota_common_v2.lua"),
            "\n",
            include_str!(concat!("../../../lua/", $name))
        ))
    };
}

impl Default for Scripts {
    fn default() -> Self {
        Self {
            acquire: quota_script!("quota_acquire_v2.lua"),
            borrow: quota_script!("quota_borrow_v2.lua"),
            renew: quota_script!("quota_renew_v2.lua"),
            release: quota_script!("quota_release_v2.lua"),
            move_lease: quota_script!("quota_move_v2.lua"),
            prefill_done: quota_script!("quota_prefill_done_v2.lua"),
            limits: quota_script!("quota_limits_v2.lua"),
            adopt: quota_script!("quota_adopt_v2.lua"),
            epoch: Script::new(include_str!("../../../lua/quota_epoch_v2.lua")),
        }
    }
}

/// One lane's limits in the shared record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneRecord {
    /// Its reserved share of seats (policy `strict`: its cap).
    pub max: u32,
    /// Most seats it may hold, borrowed ones included.
    pub ceiling: u32,
    /// Tokens its leases may reserve at once.
    pub tokens: u64,
    /// Its idle share may be borrowed.
    pub lend: bool,
    /// It may borrow idle seats above its share.
    pub borrow: bool,
}

/// The limits every replica's scripts enforce: one record in Redis (`<prefix>:{quota}:limits`,
/// with a version), so replicas agree even while their files differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitsRecord {
    /// Work-conserving (`lanes`) or hard caps (`strict`).
    pub work_conserving: bool,
    /// Seats in all (`admission.seats`; the borrowing bound).
    pub seats: u32,
    /// The global token budget.
    pub global_tokens: u64,
    /// The prefill budget (shared by every replica in front of one engine).
    pub prefill: PrefillLimit,
    /// Per lane, in [`Lane::ALL`] order.
    pub lanes: [LaneRecord; 3],
    /// `jobs.preempt_prefill_grace_tokens`: a pre-emptible lease this near the end of its
    /// prefill is not asked to leave.
    pub preempt_grace: u32,
    /// `jobs.preempt_cooldown_ms`: no job takes a seat this long after an interactive request
    /// was last refused one.
    pub preempt_cooldown_ms: u64,
}

impl LimitsRecord {
    /// The record `config` asks for.
    pub fn from_config(config: &Config) -> Self {
        Self {
            work_conserving: config.admission.policy == Policy::Lanes,
            seats: config.admission.seats.get(),
            global_tokens: config.admission.max_tokens_in_flight.get(),
            prefill: PrefillLimit::from_config(config),
            lanes: Lane::ALL.map(|lane| {
                let c = config.lanes.get(lane);
                LaneRecord {
                    max: c.max_concurrency.get(),
                    ceiling: c.ceiling.get().max(c.max_concurrency.get()),
                    tokens: c.max_tokens_in_flight.get(),
                    lend: c.lend,
                    borrow: c.borrow,
                }
            }),
            preempt_grace: config.jobs.preempt_prefill_grace_tokens,
            preempt_cooldown_ms: u64::try_from(config.jobs.preempt_cooldown.as_millis())
                .unwrap_or(u64::MAX),
        }
    }
}

/// How a limits record is written (`quota_limits_v2.lua`'s mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitsWrite {
    /// Only where there is no record (a replica starting, or Redis lost it).
    Ensure,
    /// A replica's reloaded file: not over a record that `limits push` wrote.
    Reload,
    /// A reload with `force`, or `tutor-gateway limits push`: always.
    Force,
    /// The autopilot's leader publishing its paced values: as `Reload` (not over a push).
    Autopilot,
}

impl LimitsWrite {
    fn as_str(self) -> &'static str {
        match self {
            LimitsWrite::Ensure => "ensure",
            LimitsWrite::Reload | LimitsWrite::Autopilot => "reload",
            LimitsWrite::Force => "force",
        }
    }
}

/// The limits record after a write: its version and origin, and whether this call wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitsReply {
    /// The record's version.
    pub version: u64,
    /// Whether this call wrote it.
    pub written: bool,
    /// Who wrote the record in force (`start <replica>`, `reload <replica>`, `limits push ...`).
    pub origin: String,
    /// `ensure` found a record whose limits are not the ones given (or lack some): it stays
    /// in force over this replica's file.
    pub differs: bool,
}

/// The origin `tutor-gateway limits push` writes: a record with it is reverted by a replica's
/// reload only with `force`.
pub const PUSH_ORIGIN: &str = "limits push";

/// The origin an autopilot leader writes, before its replica id (`autopilot <replica>`).
pub const AUTOPILOT_ORIGIN: &str = "autopilot ";

/// What one acquire call asks for.
#[derive(Debug, Clone, Copy)]
pub struct AcquireArgs<'a> {
    /// The lease id (`<replica>:<n>`); a retried call with the same id is granted once.
    pub id: &'a str,
    /// The lane.
    pub lane: Lane,
    /// Token reservation (input estimate + output budget).
    pub tokens: u32,
    /// Estimated prompt tokens: the lease's prefill reservation until its first token.
    pub prompt: u32,
    /// Lease lifetime unless renewed, ms.
    pub ttl_ms: u64,
    /// How long a refused call marks `replica` as having a request of the lane waiting, ms
    /// (background work waits while any replica is marked): large lane only, every lane with
    /// `jobs.preempt`; 0 = no mark.
    pub wait_mark_ms: u64,
    /// The mark's member: the replica's id (large), `<replica> <lane>` (the others).
    pub replica: &'a str,
    /// More of this replica's requests of the lane wait behind this one and those in `behind`
    /// (a grant keeps the mark).
    pub others_waiting: bool,
    /// The requests waiting behind this one in the replica's line, in their order, to be
    /// granted in the same call once this one is, up to the first that does not fit.
    pub behind: &'a [Behind],
}

/// A request waiting behind an acquire's own in its line ([`AcquireArgs::behind`]): the same
/// lane and lease lifetime, its own lease id, tokens and prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Behind {
    /// Its lease id.
    pub id: String,
    /// Its token reservation.
    pub tokens: u32,
    /// Its estimated prompt tokens (the prefill reservation).
    pub prompt: u32,
}

/// What `quota_acquire_v2.lua` and `quota_move_v2.lua` answer (their `status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Granted (or moved, or already held by this id).
    Granted,
    /// The lane has no free request slot.
    LaneFull,
    /// The lane's token budget has no room.
    LaneTokens,
    /// The global token budget has no room.
    GlobalTokens,
    /// `move` only: the lease no longer exists.
    NoLease,
    /// `acquire` only: a long prompt and no room in the prefill budget.
    PrefillFull,
    /// There is no limits record (Redis lost it): write it, then try again.
    NoLimits,
}

/// Reply of `quota_acquire_v2.lua` / `quota_move_v2.lua`: `{ status, reaped }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TakeReply {
    /// The decision.
    pub verdict: Verdict,
    /// Expired leases this call reaped.
    pub reaped: u64,
}

impl TakeReply {
    fn decode((status, reaped): (i64, u64)) -> Self {
        let verdict = match status {
            1 => Verdict::Granted,
            0 => Verdict::LaneFull,
            -1 => Verdict::LaneTokens,
            -2 => Verdict::GlobalTokens,
            -4 => Verdict::PrefillFull,
            -5 => Verdict::NoLimits,
            _ => Verdict::NoLease,
        };
        Self { verdict, reaped }
    }
}

/// Reply of `quota_move_v2.lua`: `{ status, reaped, asked }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoveReply {
    /// The decision.
    pub verdict: Verdict,
    /// Expired leases this call reaped.
    pub reaped: u64,
    /// Refused, pre-emptible background work holding what it needs is leaving for it.
    pub asked: bool,
}

/// Reply of `quota_acquire_v2.lua`: `{ status, reaped, granted behind }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcquireReply {
    /// The decision on the acquire's own request.
    pub verdict: Verdict,
    /// Expired leases this call reaped.
    pub reaped: u64,
    /// How many of the requests behind it ([`AcquireArgs::behind`]) were granted too: the
    /// first ones, in order.
    pub behind: usize,
    /// Refused, it asked pre-emptible background work to leave (`jobs.preempt`).
    pub asked: bool,
}

/// Reply of `quota_renew_v2.lua`: `{ renewed, reaped, missing... }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenewReply {
    /// Leases extended.
    pub renewed: u64,
    /// Expired leases this call reaped (anyone's).
    pub reaped: u64,
    /// Ids asked for that no longer exist: expired, or lost with Redis's data.
    pub missing: Vec<String>,
}

impl Scripts {
    /// `quota_acquire_v2.lua`: a lease for `ask`, if it fits the limits record, then leases
    /// for the requests behind it, in order, up to the first that does not fit.
    pub async fn acquire<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        keys: &Keys,
        ask: &AcquireArgs<'_>,
    ) -> RedisResult<AcquireReply> {
        let mut call = keys.with_keys(&self.acquire);
        call.arg(ask.id)
            .arg(ask.lane.as_str())
            .arg(ask.tokens)
            .arg(ask.ttl_ms)
            .arg(ask.prompt)
            .arg(ask.wait_mark_ms)
            .arg(ask.replica)
            .arg(u8::from(ask.others_waiting));
        for b in ask.behind {
            call.arg(&b.id).arg(b.tokens).arg(b.prompt);
        }
        let (status, reaped, behind, asked): (i64, u64, u64, u8) = call.invoke_async(conn).await?;
        let TakeReply { verdict, reaped } = TakeReply::decode((status, reaped));
        Ok(AcquireReply {
            verdict,
            reaped,
            asked: asked == 1,
            // Never more than were sent (a reply from a script of another version).
            behind: usize::try_from(behind).map_or(0, |n| n.min(ask.behind.len())),
        })
    }

    /// `quota_limits_v2.lua`: writes `record` as the shared limits, by `origin`, as `mode`
    /// says (see [`LimitsWrite`]). Returns the record's version and origin after the call, and
    /// whether it was written.
    pub async fn limits<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        keys: &Keys,
        mode: LimitsWrite,
        record: &LimitsRecord,
        origin: &str,
    ) -> RedisResult<LimitsReply> {
        let mut call = keys.with_keys(&self.limits);
        call.arg(mode.as_str())
            .arg(if record.work_conserving {
                "lanes"
            } else {
                "strict"
            })
            .arg(record.seats)
            .arg(record.global_tokens)
            .arg(record.prefill.budget)
            .arg(record.prefill.long_prompt);
        for lane in &record.lanes {
            call.arg(lane.max)
                .arg(lane.ceiling)
                .arg(lane.tokens)
                .arg(u8::from(lane.lend))
                .arg(u8::from(lane.borrow));
        }
        call.arg(origin)
            .arg(record.preempt_grace)
            .arg(record.preempt_cooldown_ms);
        let (version, written, origin, differs): (u64, u8, String, u8) =
            call.invoke_async(conn).await?;
        Ok(LimitsReply {
            version,
            written: written == 1,
            origin,
            differs: differs == 1,
        })
    }

    /// `quota_adopt_v2.lua`: registers `leases` (`(id, lane field, tokens, prefill)`,
    /// requests already running; the lane field as a lease keeps it, `<seat>@<budget>` for a
    /// pre-emptible one) whatever the limits say; how many were new.
    pub async fn adopt<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        keys: &Keys,
        ttl_ms: u64,
        leases: &[(String, String, u32, u32)],
    ) -> RedisResult<u64> {
        let mut call = keys.with_keys(&self.adopt);
        call.arg(ttl_ms);
        for (id, lane, tokens, prefill) in leases {
            call.arg(id).arg(lane).arg(*tokens).arg(*prefill);
        }
        call.invoke_async(conn).await
    }

    /// `quota_epoch_v2.lua`: the epoch of the data in Redis (set to `fresh` where there is
    /// none).
    pub async fn epoch<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        keys: &Keys,
        fresh: &str,
    ) -> RedisResult<String> {
        self.epoch
            .key(&keys.epoch)
            .arg(fresh)
            .invoke_async(conn)
            .await
    }

    /// `quota_prefill_done_v2.lua`: the requests of leases `ids` have their first tokens, each
    /// that long ago (`None`: not known); gives their prefill reservations back (the slots and
    /// tokens stay). Returns the tokens given back (0 when none were left, or the leases are
    /// gone).
    pub async fn prefill_done<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        keys: &Keys,
        ids: &[(&str, Option<Duration>)],
    ) -> RedisResult<u64> {
        let mut call = keys.with_keys(&self.prefill_done);
        for (id, ago) in ids {
            call.arg(*id);
            match ago {
                Some(ago) => call.arg(u64::try_from(ago.as_millis()).unwrap_or(u64::MAX)),
                None => call.arg("-"),
            };
        }
        call.invoke_async(conn).await
    }

    /// `quota_renew_v2.lua`: extends leases `ids` to `ttl_ms` from now.
    pub async fn renew<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        keys: &Keys,
        ttl_ms: u64,
        ids: &[String],
    ) -> RedisResult<RenewReply> {
        let mut call = keys.with_keys(&self.renew);
        call.arg(ttl_ms);
        for id in ids {
            call.arg(id);
        }
        let mut reply: Vec<redis::Value> = call.invoke_async(conn).await?;
        let rest = reply.split_off(2.min(reply.len()));
        let head: (u64, u64) = redis::from_redis_value(&redis::Value::Array(reply))?;
        let missing = rest
            .iter()
            .map(redis::from_redis_value::<String>)
            .collect::<RedisResult<_>>()?;
        Ok(RenewReply {
            renewed: head.0,
            reaped: head.1,
            missing,
        })
    }

    /// `quota_release_v2.lua`: gives lease `id` back; true when it was still held.
    #[cfg(test)]
    pub async fn release<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        keys: &Keys,
        id: &str,
    ) -> RedisResult<bool> {
        Ok(self.release_all(conn, keys, &[id]).await? == 1)
    }

    /// `quota_release_v2.lua`: gives leases `ids` back in one call; how many were still held.
    pub async fn release_all<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        keys: &Keys,
        ids: &[&str],
    ) -> RedisResult<u64> {
        keys.with_keys(&self.release)
            .arg(ids)
            .invoke_async(conn)
            .await
    }

    /// `quota_move_v2.lua`: moves lease `id` to lane `to` if it fits there under the limits
    /// record, keeping its tokens.
    #[cfg(test)]
    pub async fn move_lease<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        keys: &Keys,
        id: &str,
        to: Lane,
    ) -> RedisResult<MoveReply> {
        // New tokens 0 keeps the lease's own.
        self.move_and_grow(conn, keys, id, to, 0, false).await
    }

    /// `quota_move_v2.lua` with growth: moves lease `id` to lane `to` and grows it to
    /// `new_tokens`, if it fits there under the limits record; with `ask`, refused for room in
    /// another lane, asks the pre-emptible work whose leaving lets it in to leave.
    pub async fn move_and_grow<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        keys: &Keys,
        id: &str,
        to: Lane,
        new_tokens: u32,
        ask: bool,
    ) -> RedisResult<MoveReply> {
        let (status, reaped, asked): (i64, u64, i64) = keys
            .with_keys(&self.move_lease)
            .arg(id)
            .arg(to.as_str())
            .arg(new_tokens)
            .arg(if ask { "1" } else { "0" })
            .invoke_async(conn)
            .await?;
        let TakeReply { verdict, reaped } = TakeReply::decode((status, reaped));
        Ok(MoveReply {
            verdict,
            reaped,
            asked: asked == 1,
        })
    }
}

//! Fairness between tenants across the fleet (`auth.fleet_fairness`, on by default with the
//! Redis quota and `[auth]`): virtual-token-counter fairness ("Fairness in Serving Large
//! Language Models", OSDI 2024) on a counter every replica shares.
//!
//! - **The counter.** Each tenant's service, in tokens over its share (`auth.tenant_shares`),
//!   lives in one Redis hash (`<prefix>:{quota}:service`, a field per tenant: 16 hex of a hash
//!   of its name, never the name). An admission adds its reservation (estimated prompt + output
//!   budget) at once; when the request ends the difference to what the engine counted (prompt +
//!   output tokens, the budgets' unit) is added, so a request that never reached the engine
//!   costs nothing. Each replica reads the whole hash every heartbeat into its view and adds its
//!   own charges to the view at once.
//! - **The order.** A replica's line gives the turn to the first waiter of the waiting tenant
//!   whose counter is the least *now* (this replica's view; ties and a tenant's own waiters by
//!   their start tags, `max(V, F[t], S[t])` as [`crate::admission::fair::Fair`] gives them).
//!   The counters move while requests wait (admissions here and elsewhere, settlements), so a
//!   tag fixed at arrival would not say who is behind now: measured, tags alone let the gap
//!   between two backlogged tenants drift past 100,000 tokens. A turn holder that stops being
//!   first hands the turn on at its next try.
//! - **Who waits where.** Every heartbeat each replica writes, for each of its lines, the
//!   tenants waiting in it (`<prefix>:{quota}:waiting`, entries `<line>|<replica>|<tenant>`
//!   that count for 2 s of Redis's clock, so a replica that died stops counting within two
//!   seconds; a live one's tenant that stopped waiting is dropped at its next beat, and an
//!   entry never counts past 2 s from now, whatever Redis's clock did) and reads everyone's,
//!   in one script (`lua/fleet_service_v2.lua`). A head yields only to the other replicas'
//!   entries: its own replica's tenants it reads from its line, as they are now. A tenant that starts waiting is lifted there to the
//!   least counter among the tenants already waiting: service it received while nobody else
//!   waited is no debt, and idle time banks no credit (as the paper's counter lift).
//! - **Yielding across replicas.** The tags order one replica's line. When the head of a line
//!   is of a tenant `t` whose counter is ahead of a tenant `u` that waits in the same line on
//!   another replica (and not in this one) by more than the head's own cost over its share, the
//!   head does not try for a seat: it yields, so the next seat freed goes to `u`'s replica, as
//!   one fleet-wide line would have it. A head yields for at most [`YIELD_AT_MOST`] from the
//!   first release it lets pass, then takes its turn (a remote head that cannot be admitted,
//!   say a review waiting for token room a question would fit in, does not stall this line
//!   for longer). So a replica that only sees one tenant cannot give it every seat it wins.
//! - **The bound.** While two tenants keep waiting in the same lines, their counters differ by
//!   at most about twice the largest request's cost over the share (a head goes while it is
//!   ahead by at most its own cost, and its admission adds that cost again), plus what the
//!   views lag Redis (one heartbeat of admissions elsewhere), as long as no head yields for
//!   [`YIELD_AT_MOST`]. The counter is one per tenant across lanes and seats are per lane: a
//!   tenant waiting only for review seats cannot take the question seats the other tenant
//!   uses meanwhile, so then the gap grows past the bound until its lane catches it up.
//!   `tutor_gateway_tenant_service_tokens{tenant}` is the view;
//!   `tutor_gateway_tenant_service_gap_tokens` its largest gap between tenants waiting anywhere.
//! - **Jobs** are not charged: they start only from seats nobody waits for, so the service they
//!   get was not anyone else's to have.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::ConnectionManager;
use sha2::{Digest, Sha256};

/// How long a replica's entry in the waiting hash counts without being written again.
pub(crate) const WAITING_COUNTS_FOR: Duration = Duration::from_secs(2);
/// The longest a line's head yields to other replicas' tenants, from the first release it let
/// pass.
pub(crate) const YIELD_AT_MOST: Duration = Duration::from_secs(5);

static HEARTBEAT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../../lua/fleet_service_v2.lua")));

/// The fleet service counters as this replica sees them.
#[derive(Debug)]
pub(crate) struct FleetService {
    /// The Redis hash of counters.
    key: String,
    /// The Redis hash of who waits where.
    waiting_key: String,
    /// This replica's name in the waiting hash's entries.
    replica: String,
    /// The tenants (fields) waiting in each line (`small`, `small:long`, ...) on the other
    /// replicas, as last read.
    waiting: Mutex<HashMap<String, HashSet<String>>>,
    /// The tenants (fields) waiting in each of this replica's lines, as last written (its
    /// heads read their own line instead: exact, where this lags a heartbeat).
    own: Mutex<HashMap<String, HashSet<String>>>,
    /// Field (16 hex) to tokens over share, as last read plus this replica's charges since.
    view: Mutex<HashMap<String, f64>>,
    /// The tenants this replica charged, by field (for the metrics' labels).
    names: Mutex<HashMap<String, std::sync::Arc<str>>>,
}

/// The name of a lane's line in the waiting hash (`long`: its long-prompt line).
pub(crate) fn line_name(lane: crate::lane::Lane, long: bool) -> String {
    if long {
        format!("{}:long", lane.as_str())
    } else {
        lane.as_str().to_owned()
    }
}

/// A tenant's field in the hash.
pub(crate) fn field(tenant: &str) -> String {
    let digest = Sha256::digest(tenant.as_bytes());
    crate::sign::hex(&digest[..8])
}

impl FleetService {
    /// The counters under `base` (`<prefix>:{quota}`), for the replica named `replica`.
    pub fn new(base: &str, replica: &str) -> Self {
        Self {
            key: format!("{base}:service"),
            waiting_key: format!("{base}:waiting"),
            replica: replica.to_owned(),
            waiting: Mutex::default(),
            own: Mutex::default(),
            view: Mutex::default(),
            names: Mutex::default(),
        }
    }

    fn view(&self) -> std::sync::MutexGuard<'_, HashMap<String, f64>> {
        self.view.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `tenant`'s counted service over its share, as this replica sees it.
    pub fn of(&self, tenant: &str) -> f64 {
        self.view().get(&field(tenant)).copied().unwrap_or(0.0)
    }

    /// Adds `amount` (tokens over share; negative gives back) to `tenant`'s counter: the view at
    /// once, Redis in the background (`conn`: none while Redis is away; the view then keeps it
    /// until the next read replaces it).
    pub fn charge(
        &self,
        conn: Option<ConnectionManager>,
        background: &tokio_util::task::TaskTracker,
        tenant: &str,
        amount: f64,
    ) {
        if amount == 0.0 || !amount.is_finite() {
            return;
        }
        let field = field(tenant);
        self.names
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(field.clone())
            .or_insert_with(|| std::sync::Arc::from(tenant));
        {
            let mut view = self.view();
            let v = view.entry(field.clone()).or_insert(0.0);
            *v = (*v + amount).max(0.0);
        }
        let (Some(mut conn), Ok(_)) = (conn, tokio::runtime::Handle::try_current()) else {
            return;
        };
        let key = self.key.clone();
        background.spawn(async move {
            let reply: redis::RedisResult<f64> = redis::cmd("HINCRBYFLOAT")
                .arg(&key)
                .arg(&field)
                .arg(amount)
                .query_async(&mut conn)
                .await;
            if let Err(e) = reply {
                tracing::debug!(error = %e, "fleet service: a charge did not reach Redis");
            }
        });
    }

    /// The heartbeat's: writes which tenants wait in which of this replica's lines (`mine`:
    /// line and tenant), lifting a tenant that starts waiting, and reads every counter and
    /// every replica's waiting tenants into the view.
    pub async fn refresh<C: redis::aio::ConnectionLike + Send>(
        &self,
        conn: &mut C,
        mine: &[(String, Arc<str>)],
    ) -> redis::RedisResult<()> {
        let mut call = HEARTBEAT.key(&self.key);
        call.key(&self.waiting_key)
            .arg(WAITING_COUNTS_FOR.as_millis() as u64)
            .arg(&self.replica);
        for (line, tenant) in mine {
            call.arg(format!("{line}|{}|{}", self.replica, field(tenant)));
        }
        let (all, entries): (HashMap<String, f64>, Vec<String>) = call.invoke_async(conn).await?;
        let (mut waiting, mut own) = (HashMap::new(), HashMap::new());
        for entry in entries {
            // `<line>|<replica>|<tenant>`, or `<line>|<tenant>` from a replica of before.
            let mut parts = entry.split('|');
            let (Some(line), Some(second)) = (parts.next(), parts.next()) else {
                continue;
            };
            let (replica, tenant) = match parts.next() {
                Some(tenant) => (Some(second), tenant),
                None => (None, second),
            };
            let into: &mut HashMap<String, HashSet<String>> = if replica == Some(&self.replica) {
                &mut own
            } else {
                &mut waiting
            };
            into.entry(line.to_owned())
                .or_default()
                .insert(tenant.to_owned());
        }
        *self.view() = all;
        *self.waiting.lock().unwrap_or_else(PoisonError::into_inner) = waiting;
        *self.own.lock().unwrap_or_else(PoisonError::into_inner) = own;
        Ok(())
    }

    /// Whether the head of `line` here, of `tenant` and costing `cost` (tokens over its share),
    /// should yield: its tenant's counter is ahead by more than `cost` of a tenant that waits in
    /// `line` on another replica and not in this replica's line (`here`: the tenants waiting in
    /// it, their order the tags'; read only when some tenant behind waits in the fleet's line,
    /// so a head with nobody behind pays nothing for it on each try).
    pub fn yields(
        &self,
        line: &str,
        tenant: &str,
        cost: f64,
        here: impl FnOnce() -> Vec<Arc<str>>,
    ) -> bool {
        let waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(others) = waiting.get(line) else {
            return false;
        };
        let mine = field(tenant);
        let behind: Vec<&String> = {
            let view = self.view();
            let of = |f: &str| view.get(f).copied().unwrap_or(0.0);
            let ahead = of(&mine);
            others
                .iter()
                .filter(|f| **f != mine && ahead - of(f) > cost)
                .collect()
        };
        if behind.is_empty() {
            return false;
        }
        let here: HashSet<String> = here().iter().map(|t| field(t)).collect();
        behind.iter().any(|f| !here.contains(*f))
    }

    /// Forgets who waits where (a beat that failed: a view that can no longer be refreshed
    /// must not keep heads yielding to tenants that may have stopped waiting long ago).
    pub fn forget_waiting(&self) {
        self.waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        self.own
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// The fields of the tenants waiting anywhere in the fleet, as last read.
    pub fn waiting_fields(&self) -> Vec<String> {
        let waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        let own = self.own.lock().unwrap_or_else(PoisonError::into_inner);
        let mut fields: Vec<String> = waiting
            .values()
            .chain(own.values())
            .flatten()
            .cloned()
            .collect();
        fields.sort();
        fields.dedup();
        fields
    }

    /// The largest difference between the counters of tenants waiting anywhere in the fleet
    /// (0 for fewer than two).
    pub fn fleet_gap(&self) -> f64 {
        let waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        let own = self.own.lock().unwrap_or_else(PoisonError::into_inner);
        let tenants: HashSet<&String> = waiting.values().chain(own.values()).flatten().collect();
        let view = self.view();
        let values: Vec<f64> = tenants
            .iter()
            .map(|f| view.get(*f).copied().unwrap_or(0.0))
            .collect();
        if values.len() < 2 {
            return 0.0;
        }
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        max - min
    }

    /// The counter of every tenant this replica charged, by name.
    pub fn named(&self) -> Vec<(std::sync::Arc<str>, f64)> {
        let names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        let view = self.view();
        names
            .iter()
            .map(|(f, n)| (n.clone(), view.get(f).copied().unwrap_or(0.0)))
            .collect()
    }

    /// Every counter as read (field to value), for [`jain`] over a window.
    pub fn snapshot(&self) -> HashMap<String, f64> {
        self.view().clone()
    }
}

/// Jain's fairness index of the service the tenants of `fields` received between `then` and
/// `now` (two snapshots): `(sum x)^2 / (n sum x^2)`, 1 when equal, `1/n` when one tenant got
/// everything. `None` with fewer than two tenants or no service at all.
pub(crate) fn jain(
    fields: &[String],
    then: &HashMap<String, f64>,
    now: &HashMap<String, f64>,
) -> Option<f64> {
    let x: Vec<f64> = fields
        .iter()
        .map(|f| {
            (now.get(f).copied().unwrap_or(0.0) - then.get(f).copied().unwrap_or(0.0)).max(0.0)
        })
        .collect();
    let (sum, squares): (f64, f64) = (x.iter().sum(), x.iter().map(|v| v * v).sum());
    #[allow(clippy::cast_precision_loss)]
    (x.len() >= 2 && squares > 0.0).then(|| sum * sum / (x.len() as f64 * squares))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jains_index_is_one_when_equal_and_one_over_n_when_one_takes_all() {
        let at = |a: f64, b: f64| HashMap::from([(field("a"), a), (field("b"), b)]);
        let then = at(100.0, 5_000.0);
        let ab = [field("a"), field("b")];
        assert_eq!(jain(&ab, &then, &at(600.0, 5_500.0)), Some(1.0));
        assert_eq!(jain(&ab, &then, &at(1_100.0, 5_000.0)), Some(0.5));
        assert_eq!(jain(&ab[..1], &then, &at(600.0, 5_500.0)), None);
        assert_eq!(jain(&ab, &then, &then), None);
    }

    #[test]
    fn charges_add_up_in_the_view_never_below_zero_and_names_are_hashed() {
        let s = FleetService::new("tg:test:{quota}", "r1");
        let t = tokio_util::task::TaskTracker::new();
        s.charge(None, &t, "school-a", 300.0);
        s.charge(None, &t, "school-a", -100.0);
        s.charge(None, &t, "school-b", 50.0);
        assert_eq!(s.of("school-a"), 200.0);
        assert_eq!(s.of("school-b"), 50.0);
        s.charge(None, &t, "school-b", -500.0);
        assert_eq!(s.of("school-b"), 0.0);
        assert!(!field("school-a").contains("school"));
        assert_eq!(field("school-a").len(), 16);
    }
}

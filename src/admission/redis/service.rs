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
//! - **The order.** A replica's lines tag an arrival of tenant `t` with the start
//!   `max(V, F[t], S[t])`, where `V` is the tag of the line's last admitted waiter, `F[t]` the
//!   end of `t`'s last tag in this line and `S[t]` the fleet counter, all in tokens over the
//!   share; the tag then advances by the request's cost over the share. So a tenant served on
//!   other replicas is served later here, and one that was idle is lifted to `V` (it banks no
//!   credit): the backlogged tenant with the least counted service fleet-wide goes first,
//!   whichever replicas their requests land on. Through one replica the order is the
//!   start-time fair order by tokens.
//! - **The bound.** Between two tenants backlogged on one replica, the counted service differs
//!   by at most about the largest request's cost over the share, plus what the view lags Redis
//!   (one heartbeat of admissions elsewhere). `tutor_gateway_tenant_service_tokens{tenant}` is
//!   the view; `tutor_gateway_tenant_service_gap_tokens` its largest gap between tenants waiting
//!   on this replica.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use redis::aio::ConnectionManager;
use sha2::{Digest, Sha256};

/// The fleet service counters as this replica sees them.
#[derive(Debug)]
pub(crate) struct FleetService {
    /// The Redis hash.
    key: String,
    /// Field (16 hex) to tokens over share, as last read plus this replica's charges since.
    view: Mutex<HashMap<String, f64>>,
    /// The tenants this replica charged, by field (for the metrics' labels).
    names: Mutex<HashMap<String, std::sync::Arc<str>>>,
}

/// A tenant's field in the hash.
pub(crate) fn field(tenant: &str) -> String {
    let digest = Sha256::digest(tenant.as_bytes());
    crate::sign::hex(&digest[..8])
}

impl FleetService {
    /// The counters under `base` (`<prefix>:{quota}`).
    pub fn new(base: &str) -> Self {
        Self {
            key: format!("{base}:service"),
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
    pub fn charge(&self, conn: Option<ConnectionManager>, tenant: &str, amount: f64) {
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
        let (Some(mut conn), Ok(rt)) = (conn, tokio::runtime::Handle::try_current()) else {
            return;
        };
        let key = self.key.clone();
        rt.spawn(async move {
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

    /// Reads every tenant's counter from Redis into the view (the heartbeat's).
    pub async fn refresh(&self, conn: &mut ConnectionManager) -> redis::RedisResult<()> {
        let all: HashMap<String, f64> = redis::cmd("HGETALL")
            .arg(&self.key)
            .query_async(conn)
            .await?;
        *self.view() = all;
        Ok(())
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

    /// The largest difference between the counters of `tenants` (0 for fewer than two).
    pub fn gap(&self, tenants: &[&str]) -> f64 {
        let view = self.view();
        let values: Vec<f64> = tenants
            .iter()
            .map(|t| view.get(&field(t)).copied().unwrap_or(0.0))
            .collect();
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        if values.len() < 2 {
            0.0
        } else {
            max - min
        }
    }
}

/// Jain's fairness index of the service `tenants` received between `then` and `now` (two
/// snapshots): `(sum x)^2 / (n sum x^2)`, 1 when equal, `1/n` when one tenant got everything.
/// `None` with fewer than two tenants or no service at all.
pub(crate) fn jain(
    tenants: &[&str],
    then: &HashMap<String, f64>,
    now: &HashMap<String, f64>,
) -> Option<f64> {
    let x: Vec<f64> = tenants
        .iter()
        .map(|t| {
            let f = field(t);
            (now.get(&f).copied().unwrap_or(0.0) - then.get(&f).copied().unwrap_or(0.0)).max(0.0)
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
        assert_eq!(jain(&["a", "b"], &then, &at(600.0, 5_500.0)), Some(1.0));
        assert_eq!(jain(&["a", "b"], &then, &at(1_100.0, 5_000.0)), Some(0.5));
        assert_eq!(jain(&["a"], &then, &at(600.0, 5_500.0)), None);
        assert_eq!(jain(&["a", "b"], &then, &then), None);
    }

    #[test]
    fn charges_add_up_in_the_view_never_below_zero_and_names_are_hashed() {
        let s = FleetService::new("tg:test:{quota}");
        s.charge(None, "school-a", 300.0);
        s.charge(None, "school-a", -100.0);
        s.charge(None, "school-b", 50.0);
        assert_eq!(s.of("school-a"), 200.0);
        assert_eq!(s.gap(&["school-a", "school-b"]), 150.0);
        assert_eq!(s.gap(&["school-a"]), 0.0);
        s.charge(None, "school-b", -500.0);
        assert_eq!(s.of("school-b"), 0.0);
        assert!(!field("school-a").contains("school"));
        assert_eq!(field("school-a").len(), 16);
    }
}

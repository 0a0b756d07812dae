//! The `fail_open` fallback: this replica's share of the limits, enforced in process while
//! Redis is unreachable.

use std::num::{NonZeroU32, NonZeroU64};

use crate::config::Config;
use crate::lane::Lane;

/// `config` with every lane's `max_concurrency`, `ceiling` and `max_tokens_in_flight`, the
/// global `admission.seats` and the global token budget divided by `quota.expected_replicas`
/// (rounded down), but never below one slot (a ceiling never below its lane's share, the seats
/// never below the reserved shares together) and the largest request the lane (or the global
/// budget) must hold, so every request stays admittable and the replicas together never hold
/// more than the shared limits would allow. The prefill budget (when on) is divided the same
/// way, never below `long_prompt_tokens`.
pub(super) fn local_share(config: &Config) -> Config {
    let n = config.quota.expected_replicas.get();
    let max_len = config.upstream.max_model_len.get();
    let largest = |lane: Lane| -> u64 {
        u64::from(match lane {
            Lane::Small => config.classify.small_max_work.get().min(max_len),
            Lane::Medium => config.classify.medium_max_work.get().min(max_len),
            Lane::Large => max_len,
        })
    };
    let mut out = config.clone();
    for lane in Lane::ALL {
        let l = match lane {
            Lane::Small => &mut out.lanes.small,
            Lane::Medium => &mut out.lanes.medium,
            Lane::Large => &mut out.lanes.large,
        };
        l.max_concurrency = NonZeroU32::new(l.max_concurrency.get() / n).unwrap_or(NonZeroU32::MIN);
        l.ceiling = NonZeroU32::new(l.ceiling.get() / n)
            .unwrap_or(NonZeroU32::MIN)
            .max(l.max_concurrency);
        let tokens = (l.max_tokens_in_flight.get() / u64::from(n)).max(largest(lane));
        l.max_tokens_in_flight = NonZeroU64::new(tokens).unwrap_or(NonZeroU64::MIN);
    }
    let reserved: u32 = [&out.lanes.small, &out.lanes.medium, &out.lanes.large]
        .iter()
        .map(|l| l.max_concurrency.get())
        .fold(0u32, u32::saturating_add);
    out.admission.seats = NonZeroU32::new((config.admission.seats.get() / n).max(reserved))
        .unwrap_or(NonZeroU32::MIN);
    let global =
        (config.admission.max_tokens_in_flight.get() / u64::from(n)).max(u64::from(max_len));
    out.admission.max_tokens_in_flight = NonZeroU64::new(global).unwrap_or(NonZeroU64::MIN);
    let prefill = config.admission.prefill_budget_tokens;
    if prefill > 0 {
        let long = u64::from(config.admission.long_prompt_tokens.get());
        out.admission.prefill_budget_tokens = (prefill / u64::from(n)).max(long);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_share_divides_limits_but_keeps_the_largest_request_admittable() {
        let mut config = Config::default();
        config.quota.expected_replicas = NonZeroU32::new(32).unwrap();
        let share = local_share(&config);
        assert_eq!(share.lanes.small.max_concurrency.get(), 1);
        // 20 / 32 and 10 / 32 round to zero: one slot stays.
        assert_eq!(share.lanes.medium.max_concurrency.get(), 1);
        assert_eq!(share.lanes.large.max_concurrency.get(), 1);
        // Ceilings and seats are divided too (never below the shares they cover).
        assert!(share.lanes.small.ceiling >= share.lanes.small.max_concurrency);
        assert!(share.lanes.small.ceiling.get() <= config.lanes.small.ceiling.get() / 32 + 1);
        assert_eq!(share.admission.seats.get(), 3, "the three shares, no more");
        let two = {
            let mut c = Config::default();
            c.quota.expected_replicas = NonZeroU32::new(2).unwrap();
            local_share(&c)
        };
        let full = Config::default();
        assert_eq!(
            two.lanes.medium.ceiling.get(),
            full.lanes.medium.ceiling.get() / 2
        );
        assert_eq!(two.admission.seats.get(), full.admission.seats.get() / 2);
        // 163840 / 32 = 5120 < max_model_len: the largest request must still fit.
        assert_eq!(share.lanes.large.max_tokens_in_flight.get(), 16_384);
        assert_eq!(share.lanes.small.max_tokens_in_flight.get(), 115_200 / 32);
        // 393216 / 32 = 12288 < max_model_len: raised to it.
        assert_eq!(share.admission.max_tokens_in_flight.get(), 16_384);
        // The prefill budget is divided too: 12288 / 32 = 384, raised to long_prompt_tokens.
        assert_eq!(share.admission.prefill_budget_tokens, 2_048);
        config.admission.prefill_budget_tokens = 0;
        assert_eq!(
            local_share(&config).admission.prefill_budget_tokens,
            0,
            "off stays off"
        );
        config.admission.prefill_budget_tokens = 24_576;
        config.quota.expected_replicas = NonZeroU32::new(2).unwrap();
        assert_eq!(local_share(&config).admission.prefill_budget_tokens, 12_288);
        // 24576 / 16 = 1536 is under long_prompt_tokens: 2048.
        config.quota.expected_replicas = NonZeroU32::new(16).unwrap();
        assert_eq!(local_share(&config).admission.prefill_budget_tokens, 2_048);
    }
}

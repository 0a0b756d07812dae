//! Settings the checks allow but that are seldom what was meant: [`Config::warnings`]. Told by
//! `check-config` on standard error (the exit stays 0) and logged at `warn` when the gateway
//! starts and at every reload, each naming its keys.

use super::auth::parse_keys;
use super::{Config, Policy};

/// The tokens Qwen2-VL and Qwen2.5-VL spend on their largest picture (their default
/// `max_pixels` of 12,845,056 over 28 x 28 squares): below it, a cap on a picture charged by its
/// resolution is seldom what was meant.
const RESOLUTION_MODELS_LARGEST_PICTURE: u32 = 16_384;

impl Config {
    /// What this configuration does that its writer may not expect; empty when nothing.
    pub fn warnings(&self) -> Vec<String> {
        let mut said = Vec::new();
        let small = self.classify.small_max_work.get();
        let default_output = self.classify.default_output_tokens.get();
        if default_output >= small {
            said.push(format!(
                "classify.default_output_tokens ({default_output}) is not below \
                 classify.small_max_work ({small}): a request that names no output limit is \
                 never in the small lane"
            ));
        }
        let admission = &self.admission;
        let long_prompt = admission.long_prompt_tokens.get();
        if admission.policy != Policy::Fifo
            && admission.prefill_budget_tokens > 0
            && long_prompt < small
        {
            said.push(format!(
                "admission.long_prompt_tokens ({long_prompt}) is below classify.small_max_work \
                 ({small}): small questions with prompts above it wait for room in the prefill \
                 budget as reviews do"
            ));
        }
        let classify = &self.classify;
        let (side, cap) = (classify.image_token_pixels, classify.image_part_tokens);
        if side > 0 && cap < RESOLUTION_MODELS_LARGEST_PICTURE {
            // The side of the largest square picture charged less than the cap.
            let bound = (f64::from(cap).sqrt().floor() as u64) * u64::from(side);
            said.push(format!(
                "classify.image_part_tokens ({cap}) caps every picture while \
                 classify.image_token_pixels ({side}) charges them by resolution: a picture \
                 larger than about {bound} x {bound} pixels is charged {cap} tokens whatever the \
                 engine spends on it (Qwen2-VL and Qwen2.5-VL spend up to \
                 {RESOLUTION_MODELS_LARGEST_PICTURE} at their default max_pixels); set it to \
                 your model's largest, or lower the engine's max_pixels to match"
            ));
        }
        if self.auth.enabled {
            said.extend(self.tenants_without_a_key());
        }
        said
    }

    /// Tenants `[auth]` gives limits or a share to that no key belongs to (a typo's limits are
    /// never charged). The keys file is read as the check reads it; unreadable, nothing is said
    /// (the check reports it).
    fn tenants_without_a_key(&self) -> Vec<String> {
        let auth = &self.auth;
        let mut keyed: std::collections::BTreeSet<String> =
            auth.keys.iter().map(|k| k.tenant.clone()).collect();
        if let Some(path) = &auth.keys_file {
            let Ok(keys) = std::fs::read_to_string(path)
                .map_err(drop)
                .and_then(|t| parse_keys(&t).map_err(drop))
            else {
                return Vec::new();
            };
            keyed.extend(keys.into_iter().map(|k| k.tenant));
        }
        let named = auth
            .tenants
            .keys()
            .map(|t| ("auth.tenants", t))
            .chain(auth.tenant_shares.keys().map(|t| ("auth.tenant_shares", t)));
        named
            .filter(|(_, tenant)| !keyed.contains(*tenant))
            .map(|(key, tenant)| {
                format!(
                    "{key}.{tenant}: no key in auth.keys or auth.keys_file belongs to this tenant \
                     (a typo? what it sets applies to no request until a key does)"
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use crate::config::{Config, KeyEntry};

    #[test]
    fn the_shipped_defaults_say_nothing() {
        assert_eq!(Config::default().warnings(), Vec::<String>::new());
    }

    #[test]
    fn each_surprise_is_told_with_its_keys() {
        let mut c = Config::default();
        c.classify.default_output_tokens = c.classify.small_max_work;
        c.admission.prefill_budget_tokens = 8192;
        c.admission.long_prompt_tokens = NonZeroU32::new(16).unwrap();
        c.auth.enabled = true;
        c.auth.keys = vec![KeyEntry {
            sha256: "0".repeat(64),
            tenant: "cs101".into(),
        }];
        c.auth.tenant_shares.insert("cs101".into(), 2);
        c.auth.tenant_shares.insert("cs1O1".into(), 2);
        c.classify.image_token_pixels = 28;
        let said = c.warnings();
        assert_eq!(said.len(), 4, "{said:#?}");
        assert!(
            said[0].starts_with("classify.default_output_tokens"),
            "{said:#?}"
        );
        assert!(
            said[1].starts_with("admission.long_prompt_tokens (16)"),
            "{said:#?}"
        );
        assert!(
            said[2].starts_with("classify.image_part_tokens (1024) caps every picture"),
            "{said:#?}"
        );
        assert!(said[2].contains("896 x 896 pixels"), "{said:#?}");
        assert!(
            said[3].starts_with("auth.tenant_shares.cs1O1: no key"),
            "{said:#?}"
        );
        // With the cap at the model's largest, nothing is said of pictures.
        c.classify.image_part_tokens = 16_384;
        assert_eq!(c.warnings().len(), 3);
    }
}

//! The prefix-cache salt vLLM sees. vLLM's prefix cache is shared by every request it serves,
//! and a request finds a prefix cached only if another sent it: by its time to first token (and
//! the `cached_tokens` the gateway relays), one client can tell whether a prompt it guesses was
//! sent by someone else, a field at a time (a grade, a name). vLLM keeps requests with different
//! `cache_salt`s apart in its cache (the salt is hashed into a request's first block). With
//! tenants (`[auth]`), the gateway therefore gives every request the salt of its tenant, mixed
//! with the client's own salt if it sent one: requests of one tenant share the cache as before,
//! another tenant's never, and no client can choose a salt that lands in another tenant's
//! cache (it would need a SHA-256 collision). `auth.share_prefix_cache = true` turns this off.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// The `cache_salt` vLLM gets for a request of `tenant` that sent `client` (its own salt):
/// 32 hex digits of SHA-256 over both, length-prefixed.
pub fn tenant_salt(tenant: &str, client: Option<&str>) -> String {
    let mut h = Sha256::new();
    h.update(b"tutor-gateway cache_salt 1\0");
    h.update((tenant.len() as u64).to_le_bytes());
    h.update(tenant.as_bytes());
    if let Some(c) = client {
        h.update([1]);
        h.update(c.as_bytes());
    }
    crate::sign::hex(&h.finalize()[..16])
}

/// Puts `tenant`'s salt ([`tenant_salt`]) in `body` in place of the client's.
pub fn salt_for_tenant(body: &mut Map<String, Value>, tenant: &str) {
    let client = body.get("cache_salt").and_then(Value::as_str);
    let salt = tenant_salt(tenant, client);
    body.insert("cache_salt".into(), Value::String(salt));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_never_share_a_salt_whatever_their_clients_send() {
        let a = tenant_salt("school-a", None);
        assert_eq!(
            a,
            tenant_salt("school-a", None),
            "stable across requests and replicas"
        );
        assert_eq!(a.len(), 32);
        assert_ne!(a, tenant_salt("school-b", None));
        // A client of one tenant sending another's salt, or the other's name as its salt.
        assert_ne!(
            tenant_salt("school-a", Some(&a)),
            tenant_salt("school-b", None)
        );
        assert_ne!(
            tenant_salt("school-a", Some("school-b")),
            tenant_salt("school-b", None)
        );
        // Names that run into each other stay apart (length-prefixed).
        assert_ne!(tenant_salt("ab", Some("c")), tenant_salt("a", Some("bc")));
        let mut body = Map::new();
        body.insert("cache_salt".into(), Value::from("mine"));
        salt_for_tenant(&mut body, "school-a");
        assert_eq!(body["cache_salt"], tenant_salt("school-a", Some("mine")));
    }
}

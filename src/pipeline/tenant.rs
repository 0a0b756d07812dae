//! [`Tenant`]: whose request it is.

/// The tenant a request's API key belongs to (`[auth]`); set by the auth layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant(pub String);

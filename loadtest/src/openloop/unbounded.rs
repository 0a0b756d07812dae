//! Quantiles that may be unbounded, in JSON: a number, or `"inf"` when the quantile falls among
//! the offered requests that never got there (refused, cut, diverted), which count as
//! infinitely late; `null` when nothing was offered.

use serde::{Deserialize, Deserializer, Serializer};
use serde_json::Value;

/// How an unbounded value is written.
pub const INF: &str = "inf";

/// `v` as JSON: a number, `"inf"`, or `null`.
pub fn to_json(v: f64) -> Value {
    if v.is_infinite() {
        Value::from(INF)
    } else {
        serde_json::json!(v)
    }
}

/// A number or `"inf"` from JSON.
pub fn from_json(v: &Value) -> Option<f64> {
    v.as_f64()
        .or_else(|| (v.as_str() == Some(INF)).then_some(f64::INFINITY))
}

/// Serde: writes `"inf"` for an infinite value.
pub fn serialize<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(x) if x.is_infinite() => s.serialize_str(INF),
        Some(x) => s.serialize_f64(*x),
        None => s.serialize_none(),
    }
}

/// Serde: reads a number, `"inf"` or `null`.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    Ok(from_json(&Value::deserialize(d)?))
}

//! Numbers and booleans read the way vLLM reads them. vLLM's request models are pydantic models
//! in lax mode, which coerce: an `int` field takes `20`, `20.0`, `"20"`, `" 20 "`, `"2_0"` and
//! `"20.00"` alike (and `true` as 1), but refuses `20.5` and `"abc"`; a `bool` field takes
//! `true`, `1`, `1.0` and the strings `"true"`, `"1"`, `"yes"`, `"on"`, `"t"`, `"y"` (any case),
//! and their negatives. The gateway judges a field by the value vLLM will see, so it reads it
//! the same way ([`int`], [`boolean`]) and forwards that value ([`read_as_vllm`], over the
//! fields it judges); a value it cannot read is refused, never passed on unjudged.

use serde_json::Value;

use crate::error::GatewayError;

/// vLLM's type for a field the gateway judges by value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `int` (pydantic lax: `"20"`, `20.0` are 20).
    Int,
    /// `bool` (pydantic lax: `"true"`, `"yes"`, `1` are true).
    Bool,
}

/// The fields read as numbers or booleans, with vLLM's type (chat's `logprobs` is a boolean,
/// completions' an integer: [`kind`]).
const TYPED: &[(&str, Kind)] = &[
    ("max_tokens", Kind::Int),
    ("max_completion_tokens", Kind::Int),
    ("n", Kind::Int),
    ("best_of", Kind::Int),
    ("top_logprobs", Kind::Int),
    ("prompt_logprobs", Kind::Int),
    ("min_tokens", Kind::Int),
    ("logprobs", Kind::Int),
    ("stream", Kind::Bool),
    ("use_beam_search", Kind::Bool),
    ("echo", Kind::Bool),
    ("include_reasoning", Kind::Bool),
];

/// `name`'s entry in [`TYPED`] for the chat (`chat`) or completions endpoint.
fn kind(name: &str, chat: bool) -> Option<(&'static str, Kind)> {
    let (field, kind) = TYPED.iter().find(|(f, _)| *f == name)?;
    match *field {
        "logprobs" if chat => Some((field, Kind::Bool)),
        _ => Some((field, *kind)),
    }
}

/// Replaces each field of [`TYPED`] in `value` (a body object), and `stream_options`'
/// booleans, with the value vLLM will read from it (`"20"` becomes `20`), or answers a 400
/// naming the first field vLLM could not read. Null stays null (vLLM's default).
pub fn read_as_vllm(value: &mut Value, chat: bool) -> Result<(), GatewayError> {
    let Value::Object(body) = value else {
        return Ok(());
    };
    for (name, v) in body.iter_mut() {
        if v.is_null() {
            continue;
        }
        let Some((field, kind)) = kind(name, chat) else {
            continue;
        };
        *v = coerced(field, kind, v)?;
    }
    if let Some(Value::Object(options)) = body.get_mut("stream_options") {
        for (name, v) in options.iter_mut() {
            if matches!(name.as_str(), "include_usage" | "continuous_usage_stats") && !v.is_null() {
                *v = coerced("stream_options", Kind::Bool, v)?;
            }
        }
    }
    Ok(())
}

/// `v` as the JSON vLLM reads it for a `kind` field, or a 400 naming `field`.
fn coerced(field: &'static str, kind: Kind, v: &Value) -> Result<Value, GatewayError> {
    let read = match kind {
        Kind::Int => int(v).map(Value::from),
        Kind::Bool => boolean(v).map(Value::Bool),
    };
    read.map_err(|why| {
        let kind = match kind {
            Kind::Int => "an integer",
            Kind::Bool => "a boolean",
        };
        GatewayError::bad_request(
            format!("{field} {why} (vLLM reads it as {kind})"),
            Some(field),
        )
    })
}

/// The integer vLLM reads from `value` (not null), or why it is not one.
pub fn int(value: &Value) -> Result<i64, &'static str> {
    match value {
        Value::Bool(b) => Ok(i64::from(*b)),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                return Ok(i);
            }
            if n.is_u64() {
                return Err("is out of range");
            }
            whole(n.as_f64().unwrap_or(f64::NAN))
        }
        Value::String(s) => int_text(s.trim()),
        _ => Err("must be an integer"),
    }
}

/// A float with no fractional part as an `i64`.
fn whole(f: f64) -> Result<i64, &'static str> {
    if !f.is_finite() || f.fract() != 0.0 {
        return Err("must be a whole number");
    }
    // -2^63 and 2^63 are exact as f64: every whole float in between converts exactly.
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    if !(-LIMIT..LIMIT).contains(&f) {
        return Err("is out of range");
    }
    // In range and whole (checked above): the conversion is exact, nothing truncates or wraps.
    #[allow(clippy::cast_possible_truncation)]
    Ok(f as i64)
}

/// An integer written as text: optional sign, digits (single `_` between digits allowed), and
/// optionally a decimal point followed only by zeros.
fn int_text(s: &str) -> Result<i64, &'static str> {
    const NOT: &str = "must be an integer";
    let (sign, rest) = match s.as_bytes().first() {
        Some(b'-') => ("-", &s[1..]),
        Some(b'+') => ("", &s[1..]),
        _ => ("", s),
    };
    let digits = match rest.split_once('.') {
        Some((int, zeros)) if !zeros.is_empty() && zeros.bytes().all(|b| b == b'0') => int,
        Some(_) => return Err(NOT),
        None => rest,
    };
    let well_formed = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit() || b == b'_')
        && !digits.starts_with('_')
        && !digits.ends_with('_')
        && !digits.contains("__");
    if !well_formed {
        return Err(NOT);
    }
    let plain: String = sign
        .chars()
        .chain(digits.chars().filter(|c| *c != '_'))
        .collect();
    plain.parse::<i64>().map_err(|_| "is out of range")
}

/// The boolean vLLM reads from `value` (not null), or why it is not one.
pub fn boolean(value: &Value) -> Result<bool, &'static str> {
    const NOT: &str = "must be a boolean";
    match value {
        Value::Bool(b) => Ok(*b),
        Value::Number(n) => match n.as_f64() {
            Some(0.0) => Ok(false),
            Some(1.0) => Ok(true),
            _ => Err(NOT),
        },
        Value::String(s) => match s.trim().to_ascii_lowercase().as_str() {
            "1" | "on" | "t" | "true" | "y" | "yes" => Ok(true),
            "0" | "off" | "f" | "false" | "n" | "no" => Ok(false),
            _ => Err(NOT),
        },
        _ => Err(NOT),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn integers_are_read_as_pydantic_reads_them() {
        for (v, want) in [
            (json!(20), 20),
            (json!(20.0), 20),
            (json!("20"), 20),
            (json!(" 20 "), 20),
            (json!("+20"), 20),
            (json!("-3"), -3),
            (json!("2_0"), 20),
            (json!("20.00"), 20),
            (json!(true), 1),
            (json!(-1e3), -1000),
        ] {
            assert_eq!(int(&v), Ok(want), "{v}");
        }
        for v in [
            json!(20.5),
            json!("abc"),
            json!("20.5"),
            json!("2__0"),
            json!("_20"),
            json!(""),
            json!("1e3"),
            json!([1]),
            json!({}),
            json!(1e300),
            json!(u64::MAX),
            json!("99999999999999999999"),
        ] {
            assert!(int(&v).is_err(), "{v}");
        }
    }

    #[test]
    fn booleans_are_read_as_pydantic_reads_them() {
        for v in [
            json!(true),
            json!(1),
            json!(1.0),
            json!("true"),
            json!("Yes"),
            json!("on"),
            json!("1"),
        ] {
            assert_eq!(boolean(&v), Ok(true), "{v}");
        }
        for v in [
            json!(false),
            json!(0),
            json!("false"),
            json!("off"),
            json!("N"),
        ] {
            assert_eq!(boolean(&v), Ok(false), "{v}");
        }
        for v in [json!(2), json!(0.5), json!("maybe"), json!([]), json!({})] {
            assert!(boolean(&v).is_err(), "{v}");
        }
    }
}

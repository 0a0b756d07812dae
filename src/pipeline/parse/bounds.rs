//! Bounds on what a body asks of the engine besides its prompt (`[fields]`): work vLLM does
//! outside any lane, paid per request whatever its lane.
//!
//! - `stop` and `bad_words`: matched against the output at every step; at most
//!   `fields.max_stop_strings` strings and `fields.max_stop_bytes` bytes, each list.
//! - `logit_bias`: at most `fields.max_logit_bias` entries; `stop_token_ids` and
//!   `allowed_token_ids`: at most `fields.max_token_ids` each.
//! - Structured-output guides ([`GUIDES`]): compiled into a grammar before the first token; at
//!   most `fields.max_guide_bytes` of JSON each (0 refuses them). A `tool_choice` that forces
//!   a call (`"required"`, or a named function) is one too: vLLM builds the grammar from the
//!   tools' `parameters` (all of them, or the named one's), bounded the same way; and with
//!   `fields.auto_tool_guides`, so is `"auto"` (or none, which vLLM reads as `"auto"`): vLLM
//!   0.24+ with strict tool calling compiles every tool's `parameters` into a structural tag
//!   for tool parsers that have one.
//!
//! Beyond a bound: 400 naming the field. Sizes are counted without copying and stop at the
//! bound, so a huge field costs no more to refuse than a small one to accept.

use std::io::Write;

use serde_json::{Map, Value};

use crate::config::FieldsConfig;
use crate::error::GatewayError;

/// Lists of strings matched against the output.
const STRING_LISTS: &[&str] = &["stop", "bad_words"];

/// Lists of token ids.
const TOKEN_LISTS: &[&str] = &["stop_token_ids", "allowed_token_ids"];

/// The structured-output guides vLLM compiles into a grammar.
pub const GUIDES: &[&str] = &[
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_whitespace_pattern",
    "structural_tag",
    "structured_outputs",
    "response_format",
];

/// The first field of `body` beyond `bounds`, as a 400 naming it.
pub fn check(body: &Map<String, Value>, bounds: &FieldsConfig) -> Result<(), GatewayError> {
    for field in STRING_LISTS {
        if let Some(v) = body.get(*field) {
            strings(field, v, bounds)?;
        }
    }
    if let Some(Value::Object(bias)) = body.get("logit_bias") {
        at_most(
            "logit_bias",
            "entries",
            bias.len(),
            bounds.max_logit_bias,
            "fields.max_logit_bias",
        )?;
    }
    for field in TOKEN_LISTS {
        if let Some(Value::Array(ids)) = body.get(*field) {
            at_most(
                field,
                "entries",
                ids.len(),
                bounds.max_token_ids,
                "fields.max_token_ids",
            )?;
        }
    }
    for field in GUIDES {
        match body.get(*field) {
            None | Some(Value::Null) => {}
            Some(v) if *field == "response_format" && plain_text(v) => {}
            Some(v) => guide(field, v, bounds)?,
        }
    }
    match compiled_tool_schemas(body, bounds.auto_tool_guides) {
        Some((Call::Forced, schemas)) => guide("tool_choice", &Value::Array(schemas), bounds)?,
        // The tools are the prompt's too (counted and charged as such); what they cost every
        // step is their structure.
        Some((Call::Auto, schemas)) => structure("tools", &Value::Array(schemas), bounds)?,
        None => {}
    }
    Ok(())
}

/// The tools' `parameters` vLLM builds a grammar of: when `tool_choice` forces a call,
/// `"required"`, every tool's; a named function, that one's (every tool's when none has the
/// name: vLLM refuses it itself); with `auto` (`fields.auto_tool_guides`), every tool's when
/// the model may choose (`"auto"`, or none). With whether the call is forced; `None` when no
/// grammar is built.
fn compiled_tool_schemas(body: &Map<String, Value>, auto: bool) -> Option<(Call, Vec<Value>)> {
    let tools = body.get("tools")?.as_array()?;
    let (call, named) = match body.get("tool_choice").unwrap_or(&Value::Null) {
        Value::String(s) if s == "required" => (Call::Forced, None),
        Value::Null if auto => (Call::Auto, None),
        Value::String(s) if s == "auto" && auto => (Call::Auto, None),
        Value::Object(choice) => (
            Call::Forced,
            choice
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .map(str::to_owned),
        ),
        _ => return None,
    };
    let parameters = |t: &Value| t.get("function").and_then(|f| f.get("parameters")).cloned();
    let name_of = |t: &Value| {
        t.get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let chosen: Vec<Value> = match &named {
        Some(name) if tools.iter().any(|t| name_of(t).as_ref() == Some(name)) => tools
            .iter()
            .filter(|t| name_of(t).as_ref() == Some(name))
            .filter_map(parameters)
            .collect(),
        _ => tools.iter().filter_map(parameters).collect(),
    };
    Some((call, chosen))
}

/// Whether `tool_choice` forces a call, or leaves it to the model.
enum Call {
    Forced,
    Auto,
}

/// `stop` / `bad_words`: a string counts as one.
fn strings(field: &'static str, v: &Value, bounds: &FieldsConfig) -> Result<(), GatewayError> {
    let (count, bytes) = match v {
        Value::String(s) => (1, s.len()),
        Value::Array(items) => (
            items.len(),
            items
                .iter()
                .filter_map(Value::as_str)
                .fold(0usize, |sum, s| sum.saturating_add(s.len())),
        ),
        // Not a string or a list: vLLM refuses it itself.
        _ => return Ok(()),
    };
    let max = bounds.max_stop_strings;
    at_most(field, "strings", count, max, "fields.max_stop_strings")?;
    at_most(
        field,
        "bytes",
        bytes,
        bounds.max_stop_bytes,
        "fields.max_stop_bytes",
    )
}

/// A 400 naming `field` when `n` is above `max`.
fn at_most(
    field: &'static str,
    unit: &str,
    n: usize,
    max: u32,
    key: &str,
) -> Result<(), GatewayError> {
    let within = u32::try_from(n).is_ok_and(|n| n <= max);
    if within {
        return Ok(());
    }
    let message = if max == 0 {
        format!("{field} is not accepted on this gateway ({key} = 0)")
    } else {
        format!("{field} has {n} {unit}; this gateway takes at most {max} ({key})")
    };
    Err(GatewayError::bad_request(message, Some(field)))
}

/// `{"type": "text"}`: no guide at all.
fn plain_text(v: &Value) -> bool {
    v.get("type").and_then(Value::as_str) == Some("text")
        && v.as_object().is_some_and(|o| o.len() == 1)
}

/// A guide of at most `fields.max_guide_bytes` bytes as JSON, with nothing whose cost its
/// structure makes unbounded (`repeats.rs`): no regex or grammar guide unless
/// `fields.regex_guides`, no count and no regex weight past `fields.max_guide_repeat`.
fn guide(field: &'static str, v: &Value, bounds: &FieldsConfig) -> Result<(), GatewayError> {
    size(field, v, bounds.max_guide_bytes)?;
    structure(field, v, bounds)
}

/// A guide with nothing whose cost its structure makes unbounded (see [`guide`]), whatever
/// its size.
fn structure(field: &'static str, v: &Value, bounds: &FieldsConfig) -> Result<(), GatewayError> {
    use super::repeats::Refusal;
    let limit = bounds.max_guide_repeat;
    let why =
        match super::repeats::refusal(field, v, limit, bounds.regex_guides) {
            None => return Ok(()),
            Some(Refusal::RegexGuide(at)) => format!(
                "{at} is not accepted: regex and grammar guides are off on this gateway \
             (fields.regex_guides): a few bytes of one can make every step of the engine's \
             batch milliseconds to seconds longer; use a JSON schema"
            ),
            Some(Refusal::Count(n)) => {
                format!(
            "{field} holds a repetition count of {}, more than {limit}, the most this gateway \
             takes (fields.max_guide_repeat): past it the engine's grammar slows every step of \
             the batch",
            if n == u64::MAX { "no whole number".to_owned() } else { n.to_string() }
        )
            }
            Some(Refusal::Weight(w)) => {
                format!(
                "{field} holds a regex that unrolls to {} atoms (counts multiplied through their \
             groups, an optional atom {}), more than {limit}, the most this gateway takes \
             (fields.max_guide_repeat): past it the engine's grammar slows every step of the \
             batch",
                if w == u64::MAX { "uncountably many".to_owned() } else { w.to_string() },
                super::repeats::OPTIONAL_WEIGHT
            )
            }
        };
    let why = if field == "tools" {
        format!(
            "{why} (the model may call a tool here, and vLLM's strict tool calling compiles the \
             tools' parameters into its grammar; fields.auto_tool_guides)"
        )
    } else {
        why
    };
    Err(GatewayError::bad_request(why, Some(field)))
}

/// A guide of at most `max` bytes as JSON.
fn size(field: &'static str, v: &Value, max: u32) -> Result<(), GatewayError> {
    if max == 0 {
        return Err(GatewayError::bad_request(
            format!(
                "{field} is not accepted: structured output is off on this gateway \
                 (fields.max_guide_bytes = 0)"
            ),
            Some(field),
        ));
    }
    let limit = usize::try_from(max).unwrap_or(usize::MAX);
    // A guide given as a string (a regex, a grammar, a schema's text) counts as its text.
    let within = match v {
        Value::String(s) => s.len() <= limit,
        other => serde_json::to_writer(&mut Counter { n: 0, limit }, other).is_ok(),
    };
    if within {
        return Ok(());
    }
    Err(GatewayError::bad_request(
        format!("{field} is larger than {max} bytes, the most this gateway takes (fields.max_guide_bytes)"),
        Some(field),
    ))
}

/// Counts bytes written, failing once past `limit`.
struct Counter {
    n: usize,
    limit: usize,
}

impl Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.n = self.n.saturating_add(buf.len());
        if self.n > self.limit {
            return Err(std::io::Error::other("over the bound"));
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn param(body: Value, bounds: &FieldsConfig) -> Option<&'static str> {
        match check(body.as_object().unwrap(), bounds) {
            Ok(()) => None,
            // Test-only: the named field, leaked to compare with literals.
            Err(GatewayError::BadRequest { param, .. }) => {
                param.map(|p| &*Box::leak(p.into_owned().into_boxed_str()))
            }
            Err(other) => panic!("{other}"),
        }
    }

    /// A `tool_choice` that forces a call makes vLLM build a grammar of the tools' schemas:
    /// bounded as a guide, named `tool_choice`; `"auto"` (or none) too with strict tool
    /// calling (`fields.auto_tool_guides`), named `tools`; `"none"` builds none.
    #[test]
    fn a_tool_choice_that_builds_a_grammar_is_bounded_as_a_guide() {
        let b = FieldsConfig {
            auto_tool_guides: false,
            ..FieldsConfig::default()
        };
        let tool = |name: &str, size: usize| {
            json!({"type": "function", "function": {"name": name,
                   "parameters": {"type": "object", "description": "d".repeat(size)}}})
        };
        let tools = json!([tool("big", 20_000), tool("small", 10)]);
        let with = |choice: Value| json!({"tools": tools, "tool_choice": choice});
        assert_eq!(param(with(json!("required")), &b), Some("tool_choice"));
        let named = |name: &str| json!({"type": "function", "function": {"name": name}});
        assert_eq!(param(with(named("big")), &b), Some("tool_choice"));
        assert_eq!(param(with(named("small")), &b), None);
        for free in [json!("auto"), json!("none")] {
            assert_eq!(param(with(free), &b), None);
        }
        assert_eq!(param(json!({"tools": tools}), &b), None);
        let off = FieldsConfig {
            max_guide_bytes: 0,
            ..FieldsConfig::default()
        };
        let small = json!({"tools": [tool("small", 10)], "tool_choice": "required"});
        assert_eq!(param(small, &off), Some("tool_choice"));
        // With strict tool calling (the default), a choice left to the model builds one too:
        // its structure is bounded, not its size (the tools are counted as the prompt's).
        let strict = FieldsConfig::default();
        assert_eq!(param(with(json!("auto")), &strict), None);
        assert_eq!(param(json!({"tools": tools}), &strict), None);
        let counted = json!([{"type": "function", "function": {"name": "f", "parameters":
            {"type": "array", "maxItems": 100_000}}}]);
        assert_eq!(param(json!({"tools": counted}), &strict), Some("tools"));
        let patterned = json!([{"type": "function", "function": {"name": "f", "parameters":
            {"type": "string", "pattern": "^([a-z]{1,16}){1,16}$"}}}]);
        assert_eq!(param(json!({"tools": patterned}), &strict), Some("tools"));
        let refusal = check(json!({"tools": counted}).as_object().unwrap(), &strict)
            .unwrap_err()
            .to_string();
        assert!(refusal.contains("fields.auto_tool_guides"), "{refusal}");
        let counted_off = json!({"tools": counted, "tool_choice": "auto"});
        assert_eq!(param(counted_off.clone(), &b), None);
        assert_eq!(param(counted_off, &strict), Some("tools"));
        let none = json!({"tools": counted, "tool_choice": "none"});
        assert_eq!(param(none, &strict), None);
    }

    #[test]
    fn each_list_and_guide_is_bounded_by_its_key() {
        let b = FieldsConfig::default();
        let many = |n: usize| Value::from(vec!["x"; n]);
        assert_eq!(param(json!({"stop": many(16)}), &b), None);
        assert_eq!(param(json!({"stop": many(17)}), &b), Some("stop"));
        assert_eq!(param(json!({"stop": "x".repeat(5000)}), &b), Some("stop"));
        assert_eq!(
            param(json!({"bad_words": many(100)}), &b),
            Some("bad_words")
        );
        let bias: Map<String, Value> = (0..301).map(|i| (i.to_string(), json!(1))).collect();
        assert_eq!(param(json!({"logit_bias": bias}), &b), Some("logit_bias"));
        let ids = Value::from(vec![1; 1025]);
        assert_eq!(
            param(json!({"allowed_token_ids": ids}), &b),
            Some("allowed_token_ids")
        );
        assert_eq!(param(json!({"stop_token_ids": [1, 2]}), &b), None);
        let big = "a".repeat(20_000);
        for field in GUIDES {
            assert_eq!(param(json!({ *field: big }), &b), Some(*field), "{field}");
            assert_eq!(
                param(json!({ *field: {"d": big} }), &b),
                Some(*field),
                "{field}"
            );
        }
        // Regex guides are off by default; allowed, one within the bounds is taken.
        assert_eq!(
            param(json!({"guided_regex": "[a-z]+"}), &b),
            Some("guided_regex")
        );
        let regexes = FieldsConfig {
            regex_guides: true,
            ..FieldsConfig::default()
        };
        assert_eq!(param(json!({"guided_regex": "[a-z]+"}), &regexes), None);
        let schema = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {}}});
        assert_eq!(param(json!({ "response_format": schema }), &b), None);
        let off = FieldsConfig {
            max_guide_bytes: 0,
            ..FieldsConfig::default()
        };
        assert_eq!(
            param(json!({"guided_regex": "a"}), &off),
            Some("guided_regex")
        );
        assert_eq!(
            param(json!({"response_format": {"type": "text"}}), &off),
            None
        );
    }
}

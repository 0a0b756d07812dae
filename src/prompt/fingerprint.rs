//! The prompt fingerprint (M18): the first 16 hex characters of
//! `sha256(system_prompt + "\nTOOLS=" + canonical_tools)`.
//!
//! - `system_prompt`: the text of the leading `system` messages, joined by `\n` (empty if none).
//! - `canonical_tools`: the request's `tools` as canonical JSON (object keys sorted, compact
//!   separators, no ASCII escaping), `[]` when there are none.
//!
//! Requests with the same stable prefix share a fingerprint, whatever the student wrote after
//! it; so "same fingerprint, different prefill time" points at eviction, a tokenizer mismatch or
//! another replica (M19). Only the hash is logged, never the prompt (M20).

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::classify::ChatMessage;

/// JSON with object keys sorted at every level, compact separators, non-ASCII kept as is.
pub fn canonical_json(v: &Value) -> String {
    let mut out = String::new();
    write_canonical(v, &mut out);
    out
}

/// The same JSON with object keys sorted at every level: serialized (compact, as `serde_json`
/// does with `preserve_order`), it is exactly [`canonical_json`].
pub fn canonical_value(v: &Value) -> Value {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), canonical_value(&map[k])))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(canonical_value).collect()),
        other => other.clone(),
    }
}

fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(&map[k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// The fingerprint of a system prompt and its tools.
pub fn fingerprint(system_prompt: &str, tools: Option<&Value>) -> String {
    let tools = tools.map_or_else(|| "[]".to_owned(), canonical_json);
    let digest = Sha256::new()
        .chain_update(system_prompt.as_bytes())
        .chain_update(b"\nTOOLS=")
        .chain_update(tools.as_bytes())
        .finalize();
    crate::sign::hex(&digest[..8])
}

/// The key the prefill discount (`admission.prefill_discount_cached`) learns a prefix's cached
/// tokens under: `fingerprint` with everything else that decides whether vLLM finds that
/// prefix cached, each leading system message whole (its reasoning, name and non-text parts,
/// which the fingerprint leaves out), the tools as sent (their key order when they are not
/// canonicalized), the `model`, the `cache_salt` (vLLM salts its cache with it) and the
/// `chat_template_kwargs` (rendered before the messages), `truncate_prompt_tokens` (a prompt
/// cut from the left keeps little of its prefix), `add_special_tokens`, `reasoning_effort` and
/// a `tool_choice` of `"none"`. A request that differs in any of
/// them is not discounted by what the others found cached. 16 hex characters, never logged.
pub fn discount_key(
    fingerprint: &str,
    messages: &[ChatMessage],
    body: &serde_json::Map<String, Value>,
    model: &str,
) -> String {
    let mut hash = Sha256::new()
        .chain_update(fingerprint.as_bytes())
        .chain_update(b"\nMODEL=")
        .chain_update(model.as_bytes());
    for name in [
        "tools",
        "cache_salt",
        "chat_template_kwargs",
        "truncate_prompt_tokens",
        // A second BOS shifts every block; harmony templates render the effort in the
        // system header.
        "add_special_tokens",
        "reasoning_effort",
    ] {
        hash.update(b"\n");
        hash.update(name.as_bytes());
        hash.update(b"=");
        if let Some(v) = body.get(name) {
            hash.update(v.to_string().as_bytes());
        }
    }
    // vLLM leaves the tools out of the template for `tool_choice: "none"` when run with
    // `--exclude-tools-when-tool-choice-none`.
    if body.get("tool_choice").and_then(Value::as_str) == Some("none") {
        hash.update(b"\ntool_choice=none");
    }
    for m in messages.iter().take_while(|m| m.role == "system") {
        hash.update(b"\nSYSTEM");
        // Which fields it has: the pieces come in a fixed order of fields, so with this a
        // piece's field is known (`{content: "A", name: "B"}` is not `{reasoning: "A",
        // content: "B"}`, though both are the pieces "A", "B").
        let fields = [
            m.content.is_some(),
            m.name.is_some(),
            m.tool_calls.as_ref().is_some_and(|c| !c.is_null()),
            m.tool_call_id.is_some(),
            m.reasoning.is_some(),
            m.reasoning_content.is_some(),
        ];
        hash.update([fields
            .iter()
            .fold(0u8, |mask, &has| (mask << 1) | u8::from(has))]);
        m.for_each_piece(|_, piece| {
            // A separator no JSON or text piece is told apart by its length alone.
            hash.update(u64::try_from(piece.len()).unwrap_or(u64::MAX).to_le_bytes());
            hash.update(piece.as_bytes());
        });
    }
    crate::sign::hex(&hash.finalize()[..8])
}

/// The fingerprint of a chat request: its leading system messages and its tools.
pub fn fingerprint_of_chat(messages: &[ChatMessage], tools: Option<&Value>) -> String {
    let system: Vec<String> = messages
        .iter()
        .take_while(|m| m.role == "system")
        .map(ChatMessage::text)
        .collect();
    fingerprint(&system.join("\n"), tools)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_json_sorts_keys_and_keeps_unicode() {
        let v = json!({"b": 1, "a": {"z": [1, {"y": "ü", "x": null}], "c": true}});
        assert_eq!(
            canonical_json(&v),
            r#"{"a":{"c":true,"z":[1,{"x":null,"y":"ü"}]},"b":1}"#
        );
    }

    #[test]
    fn canonical_value_serializes_as_canonical_json() {
        let v = json!({"b": 1, "a": {"z": [1, {"y": "ü", "x": null}], "c": true}});
        assert_eq!(
            serde_json::to_string(&canonical_value(&v)).unwrap(),
            canonical_json(&v)
        );
    }

    #[test]
    fn the_discount_key_tells_apart_what_the_fingerprint_leaves_out() {
        let msgs = |v: Value| -> Vec<ChatMessage> { serde_json::from_value(v).unwrap() };
        let body = |v: Value| v.as_object().unwrap().clone();
        let system = json!([{"role": "system", "content": "You are a tutor."},
                            {"role": "user", "content": "hi"}]);
        let fp = fingerprint_of_chat(&msgs(system.clone()), None);
        let key = |m: Value, b: Value, model: &str| discount_key(&fp, &msgs(m), &body(b), model);
        let base = key(system.clone(), json!({}), "m");
        assert_eq!(base.len(), 16);
        // Another question after the same prefix: the same key.
        let other_question = json!([{"role": "system", "content": "You are a tutor."},
                                    {"role": "user", "content": "why?"}]);
        assert_eq!(base, key(other_question, json!({}), "m"));
        // What changes vLLM's cache and not the fingerprint: another key.
        let reasoning = json!([{"role": "system", "content": "You are a tutor.", "reasoning": "x"},
                               {"role": "user", "content": "hi"}]);
        assert_eq!(fp, fingerprint_of_chat(&msgs(reasoning.clone()), None));
        assert_ne!(base, key(reasoning, json!({}), "m"));
        // The same pieces from other fields render another prompt: another key.
        let pieces = |m: Value| {
            key(
                json!([m, {"role": "user", "content": "hi"}]),
                json!({}),
                "m",
            )
        };
        assert_ne!(
            pieces(json!({"role": "system", "content": "A", "name": "B"})),
            pieces(json!({"role": "system", "reasoning": "A", "content": "B"}))
        );
        assert_ne!(
            pieces(json!({"role": "system", "content": "C"})),
            pieces(json!({"role": "system", "content": null, "name": "C"}))
        );
        assert_ne!(base, key(system.clone(), json!({"cache_salt": "s"}), "m"));
        assert_ne!(
            base,
            key(
                system.clone(),
                json!({"chat_template_kwargs": {"a": 1}}),
                "m"
            )
        );
        assert_ne!(base, key(system.clone(), json!({}), "other-model"));
        // A second BOS, an effort rendered in the header, tools left out of the template.
        for b in [
            json!({"add_special_tokens": true}),
            json!({"reasoning_effort": "high"}),
            json!({"tool_choice": "none"}),
        ] {
            assert_ne!(base, key(system.clone(), b.clone(), "m"), "{b}");
        }
        // A tool choice the template does not see keeps the key.
        assert_eq!(base, key(system, json!({"tool_choice": "auto"}), "m"));
    }

    #[test]
    fn key_order_does_not_change_the_fingerprint_but_content_does() {
        let t1 = json!([{"type": "function", "function": {"name": "run_tests", "parameters": {}}}]);
        let t2 = json!([{"function": {"parameters": {}, "name": "run_tests"}, "type": "function"}]);
        let a = fingerprint("You are a tutor.", Some(&t1));
        assert_eq!(a.len(), 16);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(a, fingerprint("You are a tutor.", Some(&t2)));
        assert_ne!(a, fingerprint("You are a tutor!", Some(&t1)));
        assert_ne!(a, fingerprint("You are a tutor.", None));
    }

    #[test]
    fn matches_the_definition() {
        // sha256("S\nTOOLS=[]"), first 16 hex characters.
        let expected = crate::sign::hex(&Sha256::digest(b"S\nTOOLS=[]")[..8]);
        assert_eq!(fingerprint("S", None), expected);
    }

    #[test]
    fn only_leading_system_messages_count() {
        let msgs: Vec<ChatMessage> = serde_json::from_value(json!([
            {"role": "system", "content": "Rubric"},
            {"role": "user", "content": "my code A"}
        ]))
        .unwrap();
        let other: Vec<ChatMessage> = serde_json::from_value(json!([
            {"role": "system", "content": "Rubric"},
            {"role": "user", "content": "completely different student code"}
        ]))
        .unwrap();
        assert_eq!(
            fingerprint_of_chat(&msgs, None),
            fingerprint_of_chat(&other, None)
        );
        assert_eq!(
            fingerprint_of_chat(&msgs, None),
            fingerprint("Rubric", None)
        );
    }
}

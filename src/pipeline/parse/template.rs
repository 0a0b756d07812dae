//! What the chat template renders, checked so that all of it can be counted (docs/operations.md,
//! "What the estimate counts"): a message carries only the keys the estimate counts, each of the
//! type it counts, its role is one vLLM's templates know (or one of `classify.extra_roles`),
//! and every content part is text or a media part of a known type. `chat_template_kwargs` is an
//! object of the keys `fields.template_kwargs` lists (switches a template reads, never the
//! template, material or special tokens), each a boolean, a number, null or a short string;
//! its values are counted. Anything else is a 400 whose `param` is the field's path
//! (`messages[2].role`; `messages[2]` for a key the gateway does not know, named in the
//! message only, so the request log never carries a name the client chose).

use serde_json::{Map, Value};

use super::typed_ref;
use crate::classify::{text_field, ChatMessage, MediaKind, TEXT_PART_TYPES};
use crate::config::MAX_TEMPLATE_KWARG_BYTES;
use crate::error::GatewayError;

/// The roles vLLM's OpenAI server and chat templates know.
pub const VLLM_ROLES: &[&str] = &[
    "system",
    "developer",
    "user",
    "assistant",
    "tool",
    "function",
];

/// Message keys counted as text: a string, or null.
const TEXT_KEYS: &[&str] = &["name", "tool_call_id", "reasoning", "reasoning_content"];

/// Fields of a message from an OpenAI response that clients send back with their history;
/// vLLM drops them before the template, so they are accepted when null (and only then).
const NULL_ONLY_KEYS: &[&str] = &["refusal", "annotations", "audio", "function_call"];

/// `chat_template_kwargs` keys refused: a template of the client's own (the counted prompt
/// would not be the one rendered), and material that has its own field or none.
const RESERVED_KWARGS: &[(&str, &str)] = &[
    (
        "chat_template",
        "chat_template_kwargs.chat_template is not accepted: the gateway counts the prompt the model's own template renders",
    ),
    (
        "tools",
        "chat_template_kwargs.tools is not accepted: send tools as the request's `tools`",
    ),
    (
        "documents",
        "chat_template_kwargs.documents is not accepted: put the material in the messages, where it is counted",
    ),
];

/// A client's string as it may appear in an error message: at most 64 visible characters.
fn shown(s: &str) -> String {
    let mut out = crate::telemetry::printable(s, 64);
    if s.chars().count() > 64 {
        out.push('…');
    }
    out
}

/// The JSON type of `v`, for messages.
fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The chat messages in `value`, checked so that everything the template renders from them is
/// counted; `extra_roles` are accepted besides [`VLLM_ROLES`].
pub fn chat_messages(
    value: &Value,
    extra_roles: &[String],
) -> Result<Vec<ChatMessage>, GatewayError> {
    let Value::Array(items) = value else {
        return Err(GatewayError::bad_request(
            format!("messages must be an array, not {}", type_name(value)),
            Some("messages"),
        ));
    };
    for (i, item) in items.iter().enumerate() {
        let at = format!("messages[{i}]");
        let Value::Object(message) = item else {
            return Err(GatewayError::bad_field(
                format!("{at} must be an object, not {}", type_name(item)),
                at,
            ));
        };
        check_message(&at, message, extra_roles)?;
    }
    typed_ref(value).map_err(|e| match e {
        GatewayError::BadRequest { message, .. } => GatewayError::bad_request(
            format!("messages{}", message.trim_start_matches('.')),
            Some("messages"),
        ),
        other => other,
    })
}

fn check_message(
    at: &str,
    message: &Map<String, Value>,
    extra_roles: &[String],
) -> Result<(), GatewayError> {
    let field = |key: &str| format!("{at}.{key}");
    match message.get("role") {
        None => {
            return Err(GatewayError::bad_field(
                format!("{at}.role is required"),
                field("role"),
            ))
        }
        Some(Value::String(role)) => {
            let known =
                VLLM_ROLES.contains(&role.as_str()) || extra_roles.iter().any(|r| r == role);
            if !known {
                return Err(GatewayError::bad_field(
                    format!(
                        "{at}.role `{}` is not an accepted role: use one of {} (classify.extra_roles adds others)",
                        shown(role),
                        VLLM_ROLES.join(", ")
                    ),
                    field("role"),
                ));
            }
        }
        Some(other) => {
            return Err(GatewayError::bad_field(
                format!("{at}.role must be a string, not {}", type_name(other)),
                field("role"),
            ))
        }
    }
    for (key, value) in message {
        match key.as_str() {
            "role" => {}
            "content" => check_content(at, value)?,
            "tool_calls" => check_tool_calls(at, value)?,
            k if TEXT_KEYS.contains(&k) => {
                if !matches!(value, Value::String(_) | Value::Null) {
                    return Err(GatewayError::bad_field(
                        format!("{at}.{k} must be a string or null, not {}", type_name(value)),
                        field(k),
                    ));
                }
            }
            k if NULL_ONLY_KEYS.contains(&k) => {
                if !value.is_null() {
                    return Err(GatewayError::bad_field(
                        format!("{at}.{k} is not supported by this gateway: send null or leave it out (its tokens could not be counted)"),
                        field(k),
                    ));
                }
            }
            k => {
                return Err(GatewayError::bad_field(
                    format!(
                        "{at} has the field `{}`, which the gateway does not count: a message takes role, content, name, tool_calls, tool_call_id, reasoning and reasoning_content",
                        shown(k)
                    ),
                    at.to_owned(),
                ))
            }
        }
    }
    Ok(())
}

/// The keys of a tool call the estimate counts, and of its `function`: what OpenAI's API and
/// vLLM's message types define (`index` as clients that gather streamed calls keep it).
const CALL_KEYS: &[&str] = &["id", "type", "function", "index"];
const CALL_FUNCTION_KEYS: &[&str] = &["name", "arguments"];

/// `tool_calls`: null, or an array of calls with the keys of [`CALL_KEYS`] (a call's `id` a
/// string, its `function` an object of [`CALL_FUNCTION_KEYS`]). Any other key is refused: the
/// API defines none, a template renders a call's function (or the call whole) while vLLM's
/// request types may drop a key they do not define, and counted as tools such a key that the
/// engine never saw would teach the estimate's correction to count everyone's tools short.
fn check_tool_calls(at: &str, value: &Value) -> Result<(), GatewayError> {
    let calls = match value {
        Value::Null => return Ok(()),
        Value::Array(calls) => calls,
        other => {
            return Err(GatewayError::bad_field(
                format!(
                    "{at}.tool_calls must be an array or null, not {}",
                    type_name(other)
                ),
                format!("{at}.tool_calls"),
            ))
        }
    };
    for (j, call) in calls.iter().enumerate() {
        let at = format!("{at}.tool_calls[{j}]");
        let Value::Object(call) = call else {
            return Err(GatewayError::bad_field(
                format!("{at} must be an object, not {}", type_name(call)),
                at,
            ));
        };
        for (key, value) in call {
            match key.as_str() {
                "id" | "type" if !value.is_string() => {
                    return Err(GatewayError::bad_field(
                        format!("{at}.{key} must be a string, not {}", type_name(value)),
                        format!("{at}.{key}"),
                    ))
                }
                "function" => {
                    let Value::Object(function) = value else {
                        return Err(GatewayError::bad_field(
                            format!("{at}.function must be an object, not {}", type_name(value)),
                            format!("{at}.function"),
                        ));
                    };
                    if let Some(k) = function.keys().find(|k| !CALL_FUNCTION_KEYS.contains(&k.as_str())) {
                        return Err(GatewayError::bad_field(
                            format!(
                                "{at}.function has the field `{}`, which the gateway does not count: a call's function takes name and arguments",
                                shown(k)
                            ),
                            format!("{at}.function"),
                        ));
                    }
                }
                k if CALL_KEYS.contains(&k) => {}
                k => {
                    return Err(GatewayError::bad_field(
                        format!(
                            "{at} has the field `{}`, which the gateway does not count: a tool call takes id, type, function and index",
                            shown(k)
                        ),
                        at.clone(),
                    ))
                }
            }
        }
    }
    Ok(())
}

/// `content`: a string, null, or an array of text and media parts.
fn check_content(at: &str, content: &Value) -> Result<(), GatewayError> {
    let parts = match content {
        Value::String(_) | Value::Null => return Ok(()),
        Value::Array(parts) => parts,
        other => {
            return Err(GatewayError::bad_field(
                format!(
                    "{at}.content must be a string, an array of parts or null, not {}",
                    type_name(other)
                ),
                format!("{at}.content"),
            ))
        }
    };
    for (j, part) in parts.iter().enumerate() {
        let at = format!("{at}.content[{j}]");
        let Value::Object(part) = part else {
            return Err(GatewayError::bad_field(
                format!("{at} must be an object, not {}", type_name(part)),
                at,
            ));
        };
        let kind = match part.get("type") {
            Some(Value::String(kind)) => kind.as_str(),
            Some(other) => {
                return Err(GatewayError::bad_field(
                    format!("{at}.type must be a string, not {}", type_name(other)),
                    format!("{at}.type"),
                ))
            }
            None => {
                return Err(GatewayError::bad_field(
                    format!("{at}.type is required"),
                    format!("{at}.type"),
                ))
            }
        };
        if kind.ends_with("_embeds") {
            // vLLM (with `--enable-mm-embeds`) takes such a part's tokens from its tensor's
            // shape, which a few bytes can make as large as any prompt (a stride-0 view):
            // refused, as `prompt_embeds` is.
            return Err(GatewayError::bad_field(
                format!(
                    "{at}.type `{}` is not accepted: an embeddings part's tokens are its tensor's shape, which the gateway cannot count; send the media itself",
                    shown(kind)
                ),
                format!("{at}.type"),
            ));
        }
        if let Some(field) = text_field(kind) {
            check_text_part(&at, part, kind, field)?;
        } else if MediaKind::of(kind) == MediaKind::Other {
            let types: Vec<&str> = TEXT_PART_TYPES
                .iter()
                .map(|(name, _)| *name)
                .chain(MediaKind::TYPES.iter().map(|(name, _)| *name))
                .collect();
            return Err(GatewayError::bad_field(
                format!(
                    "{at}.type `{}` is not a part type the gateway counts: use one of {}",
                    shown(kind),
                    types.join(", ")
                ),
                format!("{at}.type"),
            ));
        } else if part.get("uuid").is_some_and(|v| !v.is_null()) {
            // vLLM takes a part with a `uuid` as a reference to a media item it has cached
            // under that id, with or without the media itself: the gateway cannot count an
            // item it is not sent, and another client's picture would answer for it.
            return Err(GatewayError::bad_field(
                format!(
                    "{at}.uuid is not accepted: a media part is counted by the media it carries, which must be sent whole"
                ),
                format!("{at}.uuid"),
            ));
        } else if let Some(text) = part.get("text").filter(|t| !t.is_string()) {
            // Counted as part of the part's JSON, but the typed message takes it as text.
            return Err(GatewayError::bad_field(
                format!("{at}.text must be a string, not {}", type_name(text)),
                format!("{at}.text"),
            ));
        }
        // A media part is counted as the JSON of all its fields, whatever they are.
    }
    Ok(())
}

/// A part vLLM renders as text (`kind` one of [`TEXT_PART_TYPES`]): `type` and a string in
/// its text field (`text`, `refusal` or `thinking`), nothing else (nothing else would be
/// counted, and vLLM hands a text part's other fields to the template).
fn check_text_part(
    at: &str,
    part: &Map<String, Value>,
    kind: &str,
    field: &str,
) -> Result<(), GatewayError> {
    match part.get(field) {
        Some(Value::String(_)) => {}
        Some(other) => {
            return Err(GatewayError::bad_field(
                format!("{at}.{field} must be a string, not {}", type_name(other)),
                format!("{at}.{field}"),
            ))
        }
        None => {
            return Err(GatewayError::bad_field(
                format!("{at}.{field} is required in a {kind} part"),
                format!("{at}.{field}"),
            ))
        }
    }
    if let Some(key) = part.keys().find(|k| *k != "type" && *k != field) {
        return Err(GatewayError::bad_field(
            format!(
                "{at} has the field `{}`, which the gateway does not count: a {kind} part takes type and {field}",
                shown(key)
            ),
            at.to_owned(),
        ));
    }
    Ok(())
}

/// `chat_template_kwargs`: absent, null, or an object of keys among `allowed`
/// (`fields.template_kwargs`; never one of [`RESERVED_KWARGS`]), each a boolean, a number, null
/// or a string of at most [`MAX_TEMPLATE_KWARG_BYTES`]: a template may render a value many times
/// (a loop over a string's characters, a special token after every message), which the count
/// (each value once, [`crate::classify::PromptInput::with_template_kwargs`]) could not follow.
pub fn template_kwargs(value: Option<&Value>, allowed: &[String]) -> Result<(), GatewayError> {
    match value {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Object(map)) => {
            for (key, why) in RESERVED_KWARGS {
                if map.get(*key).is_some_and(|v| !v.is_null()) {
                    return Err(GatewayError::bad_field(
                        *why,
                        format!("chat_template_kwargs.{key}"),
                    ));
                }
            }
            for (key, v) in map {
                if !allowed.iter().any(|a| a == key) {
                    // The key is the client's: named in the message only (`param` goes to
                    // the request log).
                    let accepted = if allowed.is_empty() {
                        "none here".to_owned()
                    } else {
                        allowed.join(", ")
                    };
                    return Err(GatewayError::bad_request(
                        format!(
                            "chat_template_kwargs.{} is not accepted (accepted: {accepted}; \
                             fields.template_kwargs)",
                            shown(key)
                        ),
                        Some("chat_template_kwargs"),
                    ));
                }
                let fine = match v {
                    Value::Null | Value::Bool(_) | Value::Number(_) => true,
                    Value::String(s) => s.len() <= MAX_TEMPLATE_KWARG_BYTES,
                    Value::Array(_) | Value::Object(_) => false,
                };
                if !fine {
                    return Err(GatewayError::bad_field(
                        format!(
                            "chat_template_kwargs.{key} must be a boolean, a number, null or a \
                             string of at most {MAX_TEMPLATE_KWARG_BYTES} bytes, not {}",
                            if v.is_string() {
                                "a longer string"
                            } else {
                                type_name(v)
                            }
                        ),
                        format!("chat_template_kwargs.{key}"),
                    ));
                }
            }
            Ok(())
        }
        Some(other) => Err(GatewayError::bad_request(
            format!(
                "chat_template_kwargs must be an object, not {}",
                type_name(other)
            ),
            Some("chat_template_kwargs"),
        )),
    }
}

#[cfg(test)]
mod tests;

use serde_json::{json, Value};

use super::*;

/// The `param` of the 400 `value` gets, or `None` when it is accepted.
fn refused(value: Value, extra: &[String]) -> Option<String> {
    chat_messages(&value, extra)
        .err()
        .map(|e| e.body()["error"]["param"].as_str().unwrap_or("").to_owned())
}

#[test]
fn every_vllm_role_is_accepted_and_no_other_unless_configured() {
    for role in VLLM_ROLES {
        assert_eq!(refused(json!([{"role": role, "content": "hi"}]), &[]), None);
    }
    let long = "word ".repeat(2000);
    let body = json!([{"role": "user"}, {"role": long, "content": "hi"}]);
    assert_eq!(
        refused(body.clone(), &[]).as_deref(),
        Some("messages[1].role")
    );
    let err = chat_messages(&body, &[]).unwrap_err().message();
    assert!(err.len() < 400, "the role is shortened: {err}");
    assert_eq!(refused(body, std::slice::from_ref(&long)), None);
    assert_eq!(
        refused(json!([{"content": "hi"}]), &[]).as_deref(),
        Some("messages[0].role")
    );
    assert_eq!(
        refused(json!([{"role": 7, "content": "hi"}]), &[]).as_deref(),
        Some("messages[0].role")
    );
}

#[test]
fn keys_the_estimate_does_not_count_are_refused_by_their_message() {
    let ok = json!([
        {"role": "system", "content": "Be brief.", "name": "course"},
        {"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "input_text", "text": "and this?"},
            {"type": "output_text", "text": "an earlier answer"},
            {"type": "refusal", "refusal": "I can't help with that."},
            {"type": "thinking", "thinking": "they want the loop"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
            {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}
        ]},
        {"role": "assistant", "content": null, "reasoning": "think", "reasoning_content": null,
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "f", "arguments": "{}"}},
                        {"index": 1, "id": "c2", "type": "function",
                         "function": {"name": "g", "arguments": {"x": 1}}}],
         "refusal": null, "annotations": null, "audio": null, "function_call": null},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]);
    assert_eq!(refused(ok, &[]), None);
    for (message, param) in [
        (
            json!({"role": "user", "content": "hi", "extra": "x"}),
            "messages[0]",
        ),
        (json!({"role": "user", "content": 5}), "messages[0].content"),
        (json!({"role": "user", "name": ["x"]}), "messages[0].name"),
        (
            json!({"role": "assistant", "reasoning": {"a": 1}}),
            "messages[0].reasoning",
        ),
        (
            json!({"role": "assistant", "reasoning_content": 1}),
            "messages[0].reasoning_content",
        ),
        (
            json!({"role": "assistant", "tool_calls": "call"}),
            "messages[0].tool_calls",
        ),
        (
            json!({"role": "assistant", "tool_calls": ["call"]}),
            "messages[0].tool_calls[0]",
        ),
        // A key the API does not define may never reach the template: counted as tools, it
        // would teach the tools' correction to count short.
        (
            json!({"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                "function": {"name": "f", "arguments": "{}"}, "notes": "x"}]}),
            "messages[0].tool_calls[0]",
        ),
        (
            json!({"role": "assistant", "tool_calls": [{"type": "function",
                "function": {"name": "f", "arguments": "{}", "description": "x"}}]}),
            "messages[0].tool_calls[0].function",
        ),
        (
            json!({"role": "assistant", "tool_calls": [{"type": "function",
                "function": "f"}]}),
            "messages[0].tool_calls[0].function",
        ),
        (
            json!({"role": "assistant", "tool_calls": [{"id": 7, "type": "function",
                "function": {"name": "f", "arguments": "{}"}}]}),
            "messages[0].tool_calls[0].id",
        ),
        (
            json!({"role": "tool", "tool_call_id": 3}),
            "messages[0].tool_call_id",
        ),
        (
            json!({"role": "assistant", "refusal": "no"}),
            "messages[0].refusal",
        ),
        (
            json!({"role": "user", "content": ["hi"]}),
            "messages[0].content[0]",
        ),
        (
            json!({"role": "user", "content": [{"text": "hi"}]}),
            "messages[0].content[0].type",
        ),
        (
            json!({"role": "user", "content": [{"type": "file", "file": {}}]}),
            "messages[0].content[0].type",
        ),
        // Their tokens are the tensor's shape, which a few bytes can make as long as any
        // prompt.
        (
            json!({"role": "user", "content": [{"type": "image_embeds", "image_embeds": "AAAA"}]}),
            "messages[0].content[0].type",
        ),
        (
            json!({"role": "user", "content": [{"type": "audio_embeds", "audio_embeds": "AAAA"}]}),
            "messages[0].content[0].type",
        ),
        // A `uuid` names a media item vLLM cached earlier (perhaps another client's), which
        // the part need not carry.
        (
            json!({"role": "user", "content": [{"type": "image_url", "uuid": "pic-1", "image_url": null}]}),
            "messages[0].content[0].uuid",
        ),
        (
            json!({"role": "user", "content": [{"type": "input_audio", "uuid": "a", "input_audio": {"data": "AAAA", "format": "wav"}}]}),
            "messages[0].content[0].uuid",
        ),
        (
            json!({"role": "user", "content": [{"type": "text"}]}),
            "messages[0].content[0].text",
        ),
        (
            json!({"role": "user", "content": [{"type": "text", "text": "a", "x": 1}]}),
            "messages[0].content[0]",
        ),
        (
            json!({"role": "user", "content": [{"type": "image_url", "text": 1}]}),
            "messages[0].content[0].text",
        ),
        (
            json!({"role": "user", "content": [{"type": "refusal", "text": "no"}]}),
            "messages[0].content[0].refusal",
        ),
        (
            json!({"role": "user", "content": [{"type": "thinking", "thinking": null}]}),
            "messages[0].content[0].thinking",
        ),
        (
            json!({"role": "user", "content": [{"type": "output_text", "text": "a", "annotations": []}]}),
            "messages[0].content[0]",
        ),
    ] {
        assert_eq!(
            refused(json!([message]), &[]).as_deref(),
            Some(param),
            "{message}"
        );
    }
    assert_eq!(refused(json!("hi"), &[]).as_deref(), Some("messages"));
    assert_eq!(refused(json!([3]), &[]).as_deref(), Some("messages[0]"));
}

#[test]
fn an_unknown_key_is_named_in_the_message_but_never_in_the_param() {
    let key = "k".repeat(500);
    let err = chat_messages(&json!([{"role": "user", key: 1}]), &[]).unwrap_err();
    assert!(err.message().contains("kkkk"), "{}", err.message());
    assert!(err.message().len() < 400);
    assert!(!err.log_summary().contains("kkkk"), "{}", err.log_summary());
}

#[test]
fn template_kwargs_are_an_object_of_listed_switches() {
    let allowed: Vec<String> = crate::config::TEMPLATE_KWARGS
        .iter()
        .map(|k| (*k).to_owned())
        .collect();
    let long = "x".repeat(crate::config::MAX_TEMPLATE_KWARG_BYTES);
    for ok in [
        None,
        Some(json!(null)),
        Some(json!({"enable_thinking": false, "reasoning_effort": "low", "thinking": null})),
        Some(json!({"date_string": long, "tools_in_user_message": 1})),
    ] {
        assert!(template_kwargs(ok.as_ref(), &allowed).is_ok(), "{ok:?}");
    }
    for (value, param) in [
        (json!("x"), "chat_template_kwargs"),
        (
            json!({"chat_template": "{{ 1 }}"}),
            "chat_template_kwargs.chat_template",
        ),
        (json!({"tools": []}), "chat_template_kwargs.tools"),
        (
            json!({"documents": [{"text": "x"}]}),
            "chat_template_kwargs.documents",
        ),
        // Llama 3.1's template loops over `custom_tools` (a string: over its characters).
        (json!({"custom_tools": "abc"}), "chat_template_kwargs"),
        (json!({"eos_token": "</s>"}), "chat_template_kwargs"),
        (json!({"unlisted": true}), "chat_template_kwargs"),
        (
            json!({"date_string": format!("{long}x")}),
            "chat_template_kwargs.date_string",
        ),
        (
            json!({"enable_thinking": [true]}),
            "chat_template_kwargs.enable_thinking",
        ),
        (
            json!({"thinking": {"on": true}}),
            "chat_template_kwargs.thinking",
        ),
    ] {
        let err = template_kwargs(Some(&value), &allowed).unwrap_err();
        assert_eq!(err.body()["error"]["param"], param, "{value}");
        assert_eq!(err.status(), axum::http::StatusCode::BAD_REQUEST);
    }
    // An unlisted key is named in the message, with what is accepted.
    let err = template_kwargs(Some(&json!({"custom_tools": "abc"})), &allowed).unwrap_err();
    let message = err.message();
    assert!(
        message.contains("chat_template_kwargs.custom_tools is not accepted"),
        "{message}"
    );
    assert!(message.contains("enable_thinking") && message.contains("fields.template_kwargs"));
    // With nothing listed, every key is refused.
    let err = template_kwargs(Some(&json!({"enable_thinking": true})), &[]).unwrap_err();
    assert!(
        err.message().contains("accepted: none here"),
        "{}",
        err.message()
    );
}

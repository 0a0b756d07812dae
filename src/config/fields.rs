//! `[fields]`: how much a `/v1` body (and `/tokenize`) may ask of the engine besides its prompt:
//! stop strings, token lists, structured-output guides, and where media may come from.
//!
//! Owns [`RawFields`] and [`FieldsConfig`], their defaults and validation. Each bound is a
//! count or a size the engine spends CPU on outside any lane (matching stop strings, building a
//! grammar, fetching a URL); beyond it the request is a 400 naming the field
//! (`src/pipeline/parse/bounds.rs`, `media.rs`).

use serde::Deserialize;

use super::check::Checker;

/// Default `fields.max_stop_strings`.
const MAX_STOP_STRINGS: u32 = 16;
/// Default `fields.max_stop_bytes`.
const MAX_STOP_BYTES: u32 = 4096;
/// Default `fields.max_logit_bias`.
const MAX_LOGIT_BIAS: u32 = 300;
/// Default `fields.max_token_ids`.
const MAX_TOKEN_IDS: u32 = 1024;
/// Default `fields.max_guide_bytes`.
const MAX_GUIDE_BYTES: u32 = 16 * 1024;
/// Default `fields.max_guide_repeat`: xgrammar 0.2.9 builds a count above 128 otherwise, and
/// each mask fill then costs 8x (`maxItems` 200) to 8,400x (`pattern` `[a-z]{1,129}`) the
/// plain guide's (`docs/results/guides/`).
const MAX_GUIDE_REPEAT: u32 = 128;

/// Default `fields.template_kwargs`: the switches the common chat templates read (Qwen3's and
/// DeepSeek's thinking, gpt-oss' reasoning effort, Llama 3.1's date and tool placement).
pub const TEMPLATE_KWARGS: &[&str] = &[
    "enable_thinking",
    "thinking",
    "reasoning_effort",
    "date_string",
    "tools_in_user_message",
];

/// Most bytes of a `chat_template_kwargs` string value: a switch's value, not material (a
/// template that loops over a string renders each of its characters with markup around it).
pub const MAX_TEMPLATE_KWARG_BYTES: usize = 256;

/// Most entries of `fields.template_kwargs`.
const MAX_TEMPLATE_KWARG_KEYS: usize = 64;

/// Template variables a request may never set through `chat_template_kwargs`, whatever
/// `fields.template_kwargs` lists: the template itself, material that has its own field (or
/// none) and that templates loop over, the rendering's own switches, and the tokenizer's
/// special tokens (a template writes them once per message).
pub const NEVER_TEMPLATE_KWARGS: &[&str] = &[
    "chat_template",
    "tools",
    "documents",
    "custom_tools",
    "builtin_tools",
    "messages",
    "tokenize",
    "add_generation_prompt",
    "continue_final_message",
    "bos_token",
    "eos_token",
    "pad_token",
    "unk_token",
    "sep_token",
    "cls_token",
    "mask_token",
    "additional_special_tokens",
];

/// `[fields]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFields {
    /// Strings in `stop` (and in `bad_words`), each list.
    pub max_stop_strings: Option<u32>,
    /// Bytes of all strings in `stop` (and in `bad_words`) together, each list.
    pub max_stop_bytes: Option<u32>,
    /// Entries in `logit_bias`.
    pub max_logit_bias: Option<u32>,
    /// Entries in `stop_token_ids` and in `allowed_token_ids`, each list.
    pub max_token_ids: Option<u32>,
    /// Bytes of each structured-output guide (its JSON); 0 refuses structured output.
    pub max_guide_bytes: Option<u32>,
    /// Largest repetition count a guide may hold (`maxItems`, `{m,n}`...).
    pub max_guide_repeat: Option<u32>,
    /// Whether regex and grammar guides are taken.
    pub regex_guides: Option<bool>,
    /// Whether the tools of a request that lets the model choose are bounded as guides.
    pub auto_tool_guides: Option<bool>,
    /// Hosts media URLs in messages may name; `data:` URLs are always allowed.
    pub media_hosts: Option<Vec<String>>,
    /// The `chat_template_kwargs` keys a request may set.
    pub template_kwargs: Option<Vec<String>>,
}

/// Bounds on what a body may ask of the engine besides its prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldsConfig {
    /// Most strings in `stop`, and in `bad_words` (each list; 0 refuses them).
    pub max_stop_strings: u32,
    /// Most bytes of a list's strings together (`stop`, `bad_words`).
    pub max_stop_bytes: u32,
    /// Most `logit_bias` entries (0 refuses it).
    pub max_logit_bias: u32,
    /// Most entries of `stop_token_ids`, and of `allowed_token_ids` (each list).
    pub max_token_ids: u32,
    /// Most bytes of each structured-output guide as JSON (`guided_json`, `guided_regex`,
    /// `guided_choice`, `guided_grammar`, `guided_whitespace_pattern`, `structural_tag`,
    /// `structured_outputs`, `response_format`); 0 refuses them all.
    pub max_guide_bytes: u32,
    /// Largest repetition count a guide may hold: an array's or object's `minItems`,
    /// `maxItems`, `minContains`, `maxContains`, `minProperties`, `maxProperties`, and a
    /// regex's, pattern's or grammar's `{m}`, `{m,}`, `{m,n}` (Lark's `~ m..n`).
    pub max_guide_repeat: u32,
    /// Whether regex and grammar guides are taken (`guided_regex`, `guided_grammar`,
    /// `guided_whitespace_pattern`, `structured_outputs`' `regex`, `grammar` and
    /// `whitespace_pattern`, a structural tag's `regex`, `grammar` and `repeat` formats); a JSON
    /// schema's `pattern` always is, weighed (`src/pipeline/parse/repeats.rs`).
    pub regex_guides: bool,
    /// Whether the tools' `parameters` of a request with `tool_choice` `"auto"` (or none, which
    /// vLLM reads as `"auto"`) are bounded by their structure as a guide's (their size is the
    /// prompt's), as those of a forced call always are (with their size):
    /// vLLM 0.24+ with strict tool calling (`VLLM_ENFORCE_STRICT_TOOL_CALLING`, on by default)
    /// compiles them into a structural tag for a tool parser that has one.
    pub auto_tool_guides: bool,
    /// Hosts (lower case, as the `url` crate normalizes them) that `image_url`, `video_url`,
    /// `audio_url` and `file` parts may fetch from; `data:` URLs need no entry.
    pub media_hosts: Vec<String>,
    /// The `chat_template_kwargs` keys a request may set (none of [`NEVER_TEMPLATE_KWARGS`]),
    /// each to a boolean, a number, null or a string of at most [`MAX_TEMPLATE_KWARG_BYTES`].
    pub template_kwargs: Vec<String>,
}

impl Default for FieldsConfig {
    /// The shipped defaults: no media host (only `data:` URLs), [`TEMPLATE_KWARGS`].
    fn default() -> Self {
        Self {
            max_stop_strings: MAX_STOP_STRINGS,
            max_stop_bytes: MAX_STOP_BYTES,
            max_logit_bias: MAX_LOGIT_BIAS,
            max_token_ids: MAX_TOKEN_IDS,
            max_guide_bytes: MAX_GUIDE_BYTES,
            max_guide_repeat: MAX_GUIDE_REPEAT,
            regex_guides: false,
            auto_tool_guides: true,
            media_hosts: Vec::new(),
            template_kwargs: TEMPLATE_KWARGS.iter().map(|k| (*k).to_owned()).collect(),
        }
    }
}

/// Checks `[fields]`.
pub(super) fn validate(c: &mut Checker, raw: RawFields) -> FieldsConfig {
    let mut bounded = |key: &str, v: Option<u32>, default: u32, max: u32| -> u32 {
        let v = v.unwrap_or(default);
        if v > max {
            c.fail(format!("fields.{key}"), format!("must be at most {max}"));
        }
        v.min(max)
    };
    let max_stop_strings = bounded(
        "max_stop_strings",
        raw.max_stop_strings,
        MAX_STOP_STRINGS,
        10_000,
    );
    let max_stop_bytes = bounded(
        "max_stop_bytes",
        raw.max_stop_bytes,
        MAX_STOP_BYTES,
        1 << 20,
    );
    let max_logit_bias = bounded(
        "max_logit_bias",
        raw.max_logit_bias,
        MAX_LOGIT_BIAS,
        1_000_000,
    );
    let max_token_ids = bounded("max_token_ids", raw.max_token_ids, MAX_TOKEN_IDS, 1_000_000);
    let max_guide_bytes = bounded(
        "max_guide_bytes",
        raw.max_guide_bytes,
        MAX_GUIDE_BYTES,
        16 << 20,
    );
    let max_guide_repeat = bounded(
        "max_guide_repeat",
        raw.max_guide_repeat,
        MAX_GUIDE_REPEAT,
        1 << 20,
    );
    let mut media_hosts = Vec::new();
    for (i, host) in raw.media_hosts.unwrap_or_default().iter().enumerate() {
        match media_host(host) {
            Some(h) => media_hosts.push(h),
            None => c.fail(
                format!("fields.media_hosts[{i}]"),
                "must be a host name or IP address like media.example.edu, with a port when it is \
                 not the scheme's own (media.example.edu:8080; no scheme or path)",
            ),
        }
    }
    let template_kwargs = raw
        .template_kwargs
        .unwrap_or_else(|| TEMPLATE_KWARGS.iter().map(|k| (*k).to_owned()).collect());
    if template_kwargs.len() > MAX_TEMPLATE_KWARG_KEYS {
        c.fail(
            "fields.template_kwargs",
            format!("must list at most {MAX_TEMPLATE_KWARG_KEYS} keys"),
        );
    }
    for (i, key) in template_kwargs.iter().enumerate() {
        let name_like = (1..=64).contains(&key.len())
            && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !name_like {
            c.fail(
                format!("fields.template_kwargs[{i}]"),
                "must be a template variable's name: 1 to 64 of A-Z a-z 0-9 _",
            );
        } else if NEVER_TEMPLATE_KWARGS.contains(&key.as_str()) {
            c.fail(
                format!("fields.template_kwargs[{i}]"),
                format!(
                    "{key} cannot be set by a request: the template itself, material it loops \
                     over, its own switches and the special tokens are never accepted"
                ),
            );
        }
    }
    FieldsConfig {
        max_stop_strings,
        max_stop_bytes,
        max_logit_bias,
        max_token_ids,
        max_guide_bytes,
        max_guide_repeat,
        regex_guides: raw.regex_guides.unwrap_or(false),
        auto_tool_guides: raw.auto_tool_guides.unwrap_or(true),
        media_hosts,
        template_kwargs,
    }
}

/// An allowed media host as a URL's host reads after parsing (lower case, punycode, IPv6 in
/// brackets), or `None` when `host` is not one.
fn media_host(host: &str) -> Option<String> {
    if host.is_empty() || host.contains(['/', '@', '?', '#', ' ', '\\', '*']) {
        return None;
    }
    // A port, when given, is digits after the host (after the brackets of an IPv6 literal),
    // kept as written: `media.example.edu:80` allows port 80 only, whatever the scheme.
    let (bare, port) = match host.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') || name.ends_with(']') => {
            (name, Some(port.parse::<u16>().ok()?))
        }
        _ => (host, None),
    };
    if bare.contains(':') && !(bare.starts_with('[') && bare.ends_with(']')) {
        return None;
    }
    // The host normalized as a URL reads it (lower case, IPv4 in dotted decimal).
    let u = url::Url::parse(&format!("http://{bare}/")).ok()?;
    let name = u.host_str()?;
    Some(match port {
        Some(port) => format!("{name}:{port}"),
        None => name.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_hosts_are_normalized_as_urls_read_them() {
        assert_eq!(
            media_host("Media.Example.EDU").as_deref(),
            Some("media.example.edu")
        );
        assert_eq!(media_host("[::1]").as_deref(), Some("[::1]"));
        assert_eq!(media_host("10.0.0.1").as_deref(), Some("10.0.0.1"));
        assert_eq!(
            media_host("Media.Example.EDU:8080").as_deref(),
            Some("media.example.edu:8080")
        );
        assert_eq!(media_host("[::1]:9000").as_deref(), Some("[::1]:9000"));
        assert_eq!(media_host("x.example:80").as_deref(), Some("x.example:80"));
        assert_eq!(
            media_host("x.example:443").as_deref(),
            Some("x.example:443")
        );
        for bad in [
            "",
            "https://x.example",
            "x.example:",
            "x.example:http",
            "x.example:99999",
            "::1",
            "x.example/a",
            "*.x",
        ] {
            assert_eq!(media_host(bad), None, "{bad}");
        }
    }
}

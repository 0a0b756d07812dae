//! The JSON vLLM writes, field for field and in vLLM's field order.

use serde::Serialize;
use serde_json::Value;

use super::request::Api;
use crate::engine::sequence::Finished;

/// `usage`.
#[derive(Debug, Clone, Serialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Prompt plus completion.
    pub total_tokens: u32,
    /// Output tokens.
    pub completion_tokens: u32,
    /// Cached prompt tokens, only with `--enable-prompt-tokens-details` and a hit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: u32,
}

impl Usage {
    /// Usage so far.
    pub fn new(prompt: u32, completion: u32) -> Self {
        Self {
            prompt_tokens: prompt,
            total_tokens: prompt + completion,
            completion_tokens: completion,
            prompt_tokens_details: None,
        }
    }

    /// Final usage of a finished request.
    pub fn final_of(f: &Finished, details: bool) -> Self {
        let mut u = Self::new(f.prompt_tokens, f.output_tokens);
        if details && f.cached_tokens > 0 {
            u.prompt_tokens_details = Some(PromptTokensDetails {
                cached_tokens: f.cached_tokens,
            });
        }
        u
    }
}

#[derive(Serialize)]
struct Chunk<'a, C> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: Vec<C>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    metrics: Option<Value>,
}

#[derive(Serialize)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    content: &'a str,
}

/// A reasoning delta as vLLM writes it: `DeltaMessage(reasoning=...)` serialized with only the
/// fields set, so no `content`.
#[derive(Serialize)]
struct ReasoningDelta<'a> {
    reasoning: &'a str,
}

#[derive(Serialize)]
struct ChatStreamChoice<D> {
    index: u32,
    delta: D,
    logprobs: Option<()>,
    finish_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stop_reason: Option<Option<()>>,
}

#[derive(Serialize)]
struct CompletionStreamChoice<'a> {
    index: u32,
    text: &'a str,
    logprobs: Option<()>,
    finish_reason: Option<&'static str>,
    stop_reason: Option<()>,
}

/// Identity of one response: id, creation time and model, shared by all its chunks.
#[derive(Debug, Clone)]
pub struct ResponseId {
    /// API shape.
    pub api: Api,
    /// `chatcmpl-<request id>` or `cmpl-<request id>`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// Served model name.
    pub model: String,
}

impl ResponseId {
    /// The identity of the response to `request_id`.
    pub fn new(api: Api, request_id: &str, model: &str) -> Self {
        let prefix = match api {
            Api::Chat => "chatcmpl-",
            Api::Completion => "cmpl-",
        };
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Self {
            api,
            id: format!("{prefix}{request_id}"),
            created,
            model: model.to_owned(),
        }
    }

    fn object(&self, stream: bool) -> &'static str {
        match (self.api, stream) {
            (Api::Chat, true) => "chat.completion.chunk",
            (Api::Chat, false) => "chat.completion",
            (Api::Completion, _) => "text_completion",
        }
    }

    fn chunk<C: Serialize>(
        &self,
        choices: Vec<C>,
        usage: Option<Usage>,
        metrics: Option<Value>,
    ) -> String {
        let c = Chunk {
            id: &self.id,
            object: self.object(true),
            created: self.created,
            model: &self.model,
            choices,
            usage,
            metrics,
        };
        serde_json::to_string(&c).expect("chunk serializes")
    }

    /// The chat role chunk vLLM sends with the first token.
    pub fn role_chunk(&self, usage: Option<Usage>) -> String {
        self.chunk(
            vec![ChatStreamChoice {
                index: 0,
                delta: Delta {
                    role: Some("assistant"),
                    content: "",
                },
                logprobs: None,
                finish_reason: None,
                stop_reason: None,
            }],
            usage,
            None,
        )
    }

    /// A chunk of text, with the finish reason when it is the last.
    pub fn text_chunk(
        &self,
        text: &str,
        finish: Option<&'static str>,
        usage: Option<Usage>,
    ) -> String {
        match self.api {
            Api::Chat => self.chunk(
                vec![ChatStreamChoice {
                    index: 0,
                    delta: Delta {
                        role: None,
                        content: text,
                    },
                    logprobs: None,
                    finish_reason: finish,
                    stop_reason: finish.map(|_| None),
                }],
                usage,
                None,
            ),
            Api::Completion => self.chunk(
                vec![CompletionStreamChoice {
                    index: 0,
                    text,
                    logprobs: None,
                    finish_reason: finish,
                    stop_reason: None,
                }],
                usage,
                None,
            ),
        }
    }

    /// A chat chunk of reasoning text (`delta.reasoning`), with the finish reason when it is
    /// the last.
    pub fn reasoning_chunk(
        &self,
        text: &str,
        finish: Option<&'static str>,
        usage: Option<Usage>,
    ) -> String {
        self.chunk(
            vec![ChatStreamChoice {
                index: 0,
                delta: ReasoningDelta { reasoning: text },
                logprobs: None,
                finish_reason: finish,
                stop_reason: finish.map(|_| None),
            }],
            usage,
            None,
        )
    }

    /// A chat chunk of a named tool call (`delta.tool_calls`): `arguments` is this chunk's
    /// fragment of the call's arguments; the first chunk of the call carries its id, type and
    /// function `name` too, as vLLM streams a named tool choice.
    pub fn tool_call_chunk(
        &self,
        name: Option<&str>,
        arguments: &str,
        finish: Option<&'static str>,
        usage: Option<Usage>,
    ) -> String {
        let mut call = serde_json::json!({"index": 0, "function": {"arguments": arguments}});
        if let Some(name) = name {
            call["id"] = self.tool_call_id().into();
            call["type"] = "function".into();
            call["function"]["name"] = name.into();
        }
        self.chunk(
            vec![ChatStreamChoice {
                index: 0,
                delta: serde_json::json!({ "tool_calls": [call] }),
                logprobs: None,
                finish_reason: finish,
                stop_reason: finish.map(|_| None),
            }],
            usage,
            None,
        )
    }

    /// A named tool call's arguments: the answer's words as `{"text": "<words>"}`, opened with
    /// its first words and closed with the chunk that finishes it.
    pub const ARGUMENTS_OPEN: &'static str = "{\"text\": \"";
    /// See [`ResponseId::ARGUMENTS_OPEN`].
    pub const ARGUMENTS_CLOSE: &'static str = "\"}";

    /// The id of the answer's tool call (vLLM's `chatcmpl-tool-<hex>`).
    fn tool_call_id(&self) -> String {
        format!("chatcmpl-tool-{}", self.id.trim_start_matches("chatcmpl-"))
    }

    /// The final usage chunk: no choices.
    pub fn usage_chunk(&self, usage: Usage, metrics: Option<Value>) -> String {
        self.chunk::<CompletionStreamChoice>(Vec::new(), Some(usage), metrics)
    }

    /// A non-streaming response; `reasoning` (chat only) goes in `message.reasoning`; with a
    /// named tool `call`, `text` is its arguments, in `message.tool_calls` (`content` empty).
    pub fn full_response(
        &self,
        reasoning: Option<&str>,
        text: &str,
        call: Option<&str>,
        finish: &'static str,
        usage: Usage,
        metrics: Option<Value>,
    ) -> Value {
        let choice = match self.api {
            Api::Chat => serde_json::json!({
                "index": 0,
                // No `tool_calls` without calls (vLLM 0.33 on drops an empty list).
                "message": {"role": "assistant", "content": text},
                "logprobs": null,
                "finish_reason": finish,
                "stop_reason": null,
            }),
            Api::Completion => serde_json::json!({
                "index": 0,
                "text": text,
                "logprobs": null,
                "finish_reason": finish,
                "stop_reason": null,
                "prompt_logprobs": null,
            }),
        };
        let mut v = serde_json::json!({
            "id": self.id,
            "object": self.object(false),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage,
        });
        if let (Some(r), Api::Chat) = (reasoning, self.api) {
            v["choices"][0]["message"]["reasoning"] = r.into();
            // Only reasoning: vLLM's reasoning parser leaves no content (`null`).
            if text.is_empty() {
                v["choices"][0]["message"]["content"] = serde_json::Value::Null;
            }
        }
        if let (Some(name), Api::Chat) = (call, self.api) {
            let message = &mut v["choices"][0]["message"];
            // Only a call: `""` when forced (a named choice), null when the model chose it.
            message["content"] = if finish == "tool_calls" {
                serde_json::Value::Null
            } else {
                "".into()
            };
            message["tool_calls"] = serde_json::json!([{
                "id": self.tool_call_id(),
                "type": "function",
                "function": {"name": name, "arguments": text},
            }]);
        }
        if let Some(m) = metrics {
            v["metrics"] = m;
        }
        v
    }
}

/// The log-probabilities of output positions `from..to` (the answer's words there), with `top`
/// alternatives each, in `api`'s shape as vLLM writes them: chat `{"content": [{"token",
/// "logprob", "bytes", "top_logprobs"}]}`, completions `{"text_offset", "token_logprobs",
/// "tokens", "top_logprobs"}` (`text_offset`: where each token starts in the whole answer, the
/// text before `from` being `offset` bytes long). The values are made up, the same for the
/// same position.
pub fn logprobs(api: Api, from: u32, to: u32, top: u32, offset: usize) -> Value {
    let token = |i: u32| crate::text::words(i, i + 1);
    let logprob = |i: u32, rank: u32| -f64::from((i % 7) + 1 + 2 * rank) / 10.0;
    // Alternatives: the token itself first, then the next words of the vocabulary.
    let alternatives = |i: u32| (0..top).map(move |r| (token(i + r), logprob(i, r)));
    match api {
        Api::Chat => serde_json::json!({"content": (from..to).map(|i| {
            let t = token(i);
            serde_json::json!({
                "token": t, "logprob": logprob(i, 0), "bytes": t.as_bytes(),
                "top_logprobs": alternatives(i).map(|(t, lp)| serde_json::json!({
                    "token": t, "logprob": lp, "bytes": t.as_bytes()})).collect::<Vec<_>>(),
            })
        }).collect::<Vec<_>>()}),
        Api::Completion => {
            let mut at = offset;
            let mut offsets = Vec::new();
            for i in from..to {
                offsets.push(at);
                at += token(i).len();
            }
            serde_json::json!({
                "text_offset": offsets,
                "token_logprobs": (from..to).map(|i| logprob(i, 0)).collect::<Vec<_>>(),
                "tokens": (from..to).map(token).collect::<Vec<_>>(),
                "top_logprobs": (from..to).map(|i| {
                    alternatives(i)
                        .map(|(t, lp)| (t, Value::from(lp)))
                        .collect::<serde_json::Map<String, Value>>()
                }).collect::<Vec<_>>(),
            })
        }
    }
}

/// `chunk` (one choice's JSON) with `logprobs` set on its choice.
pub fn with_logprobs(chunk: &str, logprobs: Value) -> String {
    let mut v: Value = serde_json::from_str(chunk).expect("a chunk the simulator wrote");
    v["choices"][0]["logprobs"] = logprobs;
    v.to_string()
}

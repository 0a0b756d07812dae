//! `POST /answer` and `GET /answer`: the body and query, checked into an [`AnswerRequest`].
//! With `course_id`, the student's material (turns, question, code or files, stack trace),
//! which the handler puts after the course's stable prefix; the prompt step may focus the code
//! on the stack trace first (M11).

use serde::Deserialize;
use serde_json::Value;

use super::json::{json_body, typed};
use crate::admission::session::SessionId;
use crate::classify::ChatMessage;
use crate::error::GatewayError;
use crate::prompt::focus::{Lang, SourceFile, LANGUAGE_NAMES};
use crate::prompt::{student_messages, StudentMaterial};

/// `POST /answer` body. Exactly one of `messages` and `prompt`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnswerBody {
    /// The conversation so far (chat format).
    pub messages: Option<Vec<ChatMessage>>,
    /// A single question, as a user message.
    pub prompt: Option<String>,
    /// Most output tokens wanted; the classifier's default budget when absent.
    pub max_output_tokens: Option<u32>,
    /// The student's session, for continuation tracking (checked and hashed by
    /// [`AnswerRequest::checked`]).
    pub session_id: Option<String>,
    /// The course whose stable prefix (`[courses.<id>]`) goes first; unknown ids are a 400.
    pub course_id: Option<String>,
    /// With `course_id`: the student's code.
    pub code: Option<String>,
    /// With `course_id`: a stack trace.
    pub stack_trace: Option<String>,
    /// With `course_id`: recent turns (user/assistant messages, oldest first); `messages` is
    /// accepted for the same, but not both.
    pub turns: Option<Vec<ChatMessage>>,
    /// With `course_id` and `code` or `files`: the code's language (else from the paths).
    pub language: Option<String>,
    /// With `course_id` and `code`: the file's path, as the stack trace names it.
    pub path: Option<String>,
    /// With `course_id`: several files instead of `code`.
    pub files: Option<Vec<CodeFile>>,
}

/// One of `files`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CodeFile {
    /// Its path, as the stack trace names it.
    pub path: String,
    /// Its text.
    pub code: String,
}

/// `GET /answer` query (browser `EventSource`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnswerQuery {
    /// The question.
    pub prompt: String,
    /// Most output tokens wanted.
    pub max_output_tokens: Option<u32>,
    /// The student's session.
    pub session_id: Option<String>,
    /// The course.
    pub course_id: Option<String>,
}

/// A validated `/answer` request: the messages to send and the declared output limit.
#[derive(Debug)]
pub struct AnswerRequest {
    /// Chat messages.
    pub messages: Vec<ChatMessage>,
    /// The raw messages JSON to forward.
    pub messages_json: Value,
    /// Declared output limit.
    pub max_output_tokens: Option<u32>,
    /// The student's session, for continuation tracking (checked, hashed).
    pub session_id: Option<SessionId>,
    /// The course whose stable prefix goes before `messages`; `messages` is then only the
    /// student's material.
    pub course_id: Option<String>,
    /// With a course: the student's material `messages` was built from, for the prompt step
    /// to focus the code on the stack trace (M11) and build them again.
    pub material: Option<StudentMaterial>,
}

/// A session id from field or header `name`, checked and hashed; `None` when empty.
pub fn session_id_from(raw: &str, name: &'static str) -> Result<Option<SessionId>, GatewayError> {
    SessionId::parse(raw)
        .map_err(|why| GatewayError::bad_request(format!("{name} {why}"), Some(name)))
}

fn session(raw: &str) -> Result<Option<SessionId>, GatewayError> {
    session_id_from(raw, "session_id")
}

fn user_message(prompt: &str) -> Value {
    serde_json::json!([{ "role": "user", "content": prompt }])
}

impl AnswerRequest {
    /// From a `POST /answer` body.
    pub fn from_body(bytes: &[u8]) -> Result<Self, GatewayError> {
        Self::from_value(json_body(bytes)?)
    }

    /// From a `POST /answer` body already read as JSON (a job's body, less its own fields).
    pub fn from_value(value: Value) -> Result<Self, GatewayError> {
        let raw_messages = value.get("messages").cloned();
        let raw_turns = value.get("turns").cloned();
        let body: AnswerBody = typed(value)?;
        if let Some(course_id) = body.course_id.clone().filter(|c| !c.is_empty()) {
            return Self::for_course(body, course_id, raw_messages.or(raw_turns));
        }
        if body.code.is_some()
            || body.stack_trace.is_some()
            || body.turns.is_some()
            || body.files.is_some()
            || body.language.is_some()
            || body.path.is_some()
        {
            return Err(GatewayError::bad_request(
                "`code`, `files`, `language`, `path`, `stack_trace` and `turns` need a `course_id`",
                Some("course_id"),
            ));
        }
        let (messages, messages_json, asked_in) = match (body.messages, body.prompt) {
            (Some(m), None) => (m, raw_messages.unwrap_or(Value::Null), "messages"),
            (None, Some(p)) => (typed(user_message(&p))?, user_message(&p), "prompt"),
            _ => {
                return Err(GatewayError::bad_request(
                    "send exactly one of `messages` and `prompt`",
                    None,
                ))
            }
        };
        Self::checked(
            messages,
            messages_json,
            body.max_output_tokens,
            body.session_id,
            asked_in,
        )
    }

    /// From a `GET /answer` query.
    pub fn from_query(q: AnswerQuery) -> Result<Self, GatewayError> {
        let json = user_message(&q.prompt);
        let mut req = Self::checked(
            typed(json.clone())?,
            json,
            q.max_output_tokens,
            q.session_id,
            "prompt",
        )?;
        req.course_id = q.course_id.filter(|c| !c.is_empty());
        Ok(req)
    }

    pub(in crate::pipeline) fn checked(
        messages: Vec<ChatMessage>,
        messages_json: Value,
        max: Option<u32>,
        session_id: Option<String>,
        asked_in: &'static str,
    ) -> Result<Self, GatewayError> {
        if messages.is_empty() || messages.iter().all(|m| m.text().trim().is_empty()) {
            let message = match asked_in {
                "messages" => "the question must not be empty: `messages` holds no text",
                _ => "the question must not be empty",
            };
            return Err(GatewayError::bad_request(message, Some(asked_in)));
        }
        if max == Some(0) {
            return Err(GatewayError::bad_request(
                "max_output_tokens must be at least 1",
                Some("max_output_tokens"),
            ));
        }
        Ok(Self {
            messages,
            messages_json,
            max_output_tokens: max,
            session_id: session_id.as_deref().map(session).transpose()?.flatten(),
            course_id: None,
            material: None,
        })
    }
}

impl AnswerRequest {
    /// A course request: recent turns, then one user message with question, code and trace.
    pub(super) fn for_course(
        body: AnswerBody,
        course_id: String,
        raw_turns: Option<Value>,
    ) -> Result<Self, GatewayError> {
        if body.messages.is_some() && body.turns.is_some() {
            return Err(GatewayError::bad_request(
                "send recent turns as `turns` or `messages`, not both",
                Some("turns"),
            ));
        }
        let turns = body.messages.or(body.turns).unwrap_or_default();
        // The course's system message is the only instruction: a student's `developer` (or
        // `system`) turn would be rendered with the weight of one. Tool results stay
        // possible (a course with tools).
        if turns
            .iter()
            .any(|m| !matches!(m.role.as_str(), "user" | "assistant" | "tool"))
        {
            return Err(GatewayError::bad_request(
                "with `course_id` the system message is the course's; turns are user, assistant \
                 or tool messages (no system or developer message)",
                Some("turns"),
            ));
        }
        let blank = |s: &Option<String>| s.as_deref().is_none_or(|s| s.trim().is_empty());
        let files = code_files(&body.path, &body.code, &body.files)?;
        if blank(&body.prompt) && blank(&body.code) && files.is_empty() {
            return Err(GatewayError::bad_request(
                "a course request needs a `prompt` (the question), `code` or `files`",
                Some("prompt"),
            ));
        }
        let language = match body.language.as_deref() {
            None => None,
            Some(_) if body.code.is_none() && files.is_empty() => {
                return Err(GatewayError::bad_request(
                    "`language` describes `code` or `files`; send one of them",
                    Some("language"),
                ))
            }
            Some(name) => Some(Lang::from_name(name).ok_or_else(|| {
                GatewayError::bad_request(
                    format!("language must be one of {LANGUAGE_NAMES}"),
                    Some("language"),
                )
            })?),
        };
        let material = StudentMaterial {
            turns: match raw_turns {
                Some(Value::Array(items)) => items,
                _ => Vec::new(),
            },
            question: body.prompt,
            code: body.code,
            stack_trace: body.stack_trace,
            path: body.path.filter(|p| !p.trim().is_empty()),
            files,
            language,
            focused: None,
        };
        let json = Value::Array(student_messages(&material));
        let mut req = Self::checked(
            typed(json.clone())?,
            json,
            body.max_output_tokens,
            body.session_id,
            "prompt",
        )?;
        req.course_id = Some(course_id);
        req.material = Some(material);
        Ok(req)
    }
}

/// Most files in `files`.
const MAX_FILES: usize = 64;

/// `files`, checked: not with `code`, not empty, each with a path of its own; and `path` only
/// with `code`.
fn code_files(
    path: &Option<String>,
    code: &Option<String>,
    files: &Option<Vec<CodeFile>>,
) -> Result<Vec<SourceFile>, GatewayError> {
    let bad = |m: String, field| Err(GatewayError::bad_request(m, Some(field)));
    if path.is_some() && code.is_none() {
        return bad(
            "`path` is the path of `code` (with `files`, each file has its own)".into(),
            "path",
        );
    }
    let Some(files) = files else {
        return Ok(Vec::new());
    };
    if code.is_some() {
        return bad(
            "send the code as `code` (one file) or `files` (several), not both".into(),
            "files",
        );
    }
    if files.is_empty() || files.len() > MAX_FILES {
        return bad(format!("files must hold 1 to {MAX_FILES} files"), "files");
    }
    let mut out: Vec<SourceFile> = Vec::with_capacity(files.len());
    for (i, f) in files.iter().enumerate() {
        let path = f.path.trim();
        if path.is_empty() {
            return bad(format!("files[{i}].path must not be empty"), "files");
        }
        if out.iter().any(|o| o.path.as_deref() == Some(path)) {
            return bad(format!("files[{i}].path is given twice"), "files");
        }
        out.push(SourceFile {
            path: Some(path.to_owned()),
            code: f.code.clone(),
        });
    }
    Ok(out)
}

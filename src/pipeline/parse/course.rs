//! `/answer` with `course_id`: the student's material (turns, question, code, stack trace),
//! which the handler puts after the course's stable prefix.

use serde_json::Value;

use super::{typed, AnswerBody, AnswerRequest};
use crate::error::GatewayError;
use crate::prompt::{student_messages, StudentMaterial};

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
        if turns.iter().any(|m| m.role == "system") {
            return Err(GatewayError::bad_request(
                "with `course_id` the system message is the course's; turns are user/assistant",
                Some("turns"),
            ));
        }
        let blank = |s: &Option<String>| s.as_deref().is_none_or(|s| s.trim().is_empty());
        if blank(&body.prompt) && blank(&body.code) {
            return Err(GatewayError::bad_request(
                "a course request needs a `prompt` (the question) or `code`",
                Some("prompt"),
            ));
        }
        let material = StudentMaterial {
            turns: match raw_turns {
                Some(Value::Array(items)) => items,
                _ => Vec::new(),
            },
            question: body.prompt,
            code: body.code,
            stack_trace: body.stack_trace,
        };
        let json = Value::Array(student_messages(&material));
        let mut req = Self::checked(
            typed(json.clone())?,
            json,
            body.max_output_tokens,
            body.session_id,
        )?;
        req.course_id = Some(course_id);
        Ok(req)
    }
}

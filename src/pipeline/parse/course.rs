//! `/answer` with `course_id`: the student's material (turns, question, code or files, stack
//! trace), which the handler puts after the course's stable prefix; the prompt step may focus
//! the code on the stack trace first (M11).

use serde_json::Value;

use super::{typed, AnswerBody, AnswerRequest, CodeFile};
use crate::error::GatewayError;
use crate::prompt::focus::{Lang, SourceFile, LANGUAGE_NAMES};
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

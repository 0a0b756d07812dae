//! Course prompt assembly (M17): the course's stable prefix first, the student's material after.
//!
//! The stable prefix is one system message, the same bytes for every request of a course version:
//!
//! ```text
//! Course <id>, version <version>.
//!
//! # Instructions
//! <instructions>
//!
//! # Rubric
//! <rubric>
//!
//! # Safety rules
//! <safety>
//!
//! # Tools
//! <tools as canonical JSON>
//! ```
//!
//! (sections left empty in the course are left out). The tools also go upstream as `tools`, in
//! canonical JSON. Everything per request (recent turns, code, stack trace, question) comes after
//! the prefix, so vLLM's prefix cache can reuse the prefix's KV blocks for every student. The
//! code is the whole code, or the part of it [`super::focus`] chose for the stack trace.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::fingerprint::{canonical_json, canonical_value, fingerprint};
use super::focus::{self, FocusSettings, Lang, SourceFile};
use crate::config::{Config, CourseConfig};

/// A course's stable prefix, built once from the config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Course {
    /// The course id (`[courses.<id>]`).
    pub id: String,
    /// The course version the prefix was built from.
    pub version: String,
    /// The system message: instructions, rubric, safety rules and tools.
    pub system_prompt: String,
    /// The tool schemas, keys sorted (serialized canonically when sent), if any.
    pub tools: Option<Value>,
    /// The prompt fingerprint of this prefix (M18).
    pub fingerprint: String,
    /// How the student's code is focused on its stack trace (M11); not part of the prefix.
    pub focus: FocusSettings,
    /// The only tenants whose requests may name it; `None`: every tenant.
    pub tenants: Option<Vec<String>>,
}

impl Course {
    /// Builds the stable prefix. The parts must already be checked for placeholders.
    pub fn build(
        id: &str,
        version: &str,
        instructions: &str,
        rubric: &str,
        safety: &str,
        tools: Option<Value>,
    ) -> Self {
        let tools = tools.map(|t| canonical_value(&t));
        let mut system = format!("Course {id}, version {version}.");
        let tools_text = tools.as_ref().map(canonical_json);
        for (title, body) in [
            ("Instructions", Some(instructions)),
            ("Rubric", Some(rubric)),
            ("Safety rules", Some(safety)),
            ("Tools", tools_text.as_deref()),
        ] {
            if let Some(body) = body.map(str::trim).filter(|b| !b.is_empty()) {
                system.push_str(&format!("\n\n# {title}\n{body}"));
            }
        }
        let fingerprint = fingerprint(&system, tools.as_ref());
        Self {
            id: id.to_owned(),
            version: version.to_owned(),
            system_prompt: system,
            tools,
            fingerprint,
            focus: FocusSettings::default(),
            tenants: None,
        }
    }

    /// Whether a request of `tenant` (none without `[auth]`) may name this course. A course
    /// that lists tenants is theirs alone: its instructions and rubric are one school's.
    pub fn open_to(&self, tenant: Option<&str>) -> bool {
        match (&self.tenants, tenant) {
            (None, _) => true,
            (Some(list), Some(t)) => list.iter().any(|x| x == t),
            (Some(_), None) => false,
        }
    }

    /// The stable prefix of a checked `[courses.<id>]`, with its focusing settings.
    pub fn from_config(c: &CourseConfig) -> Self {
        Self::build(
            &c.id,
            &c.version,
            &c.instructions,
            &c.rubric,
            &c.safety,
            c.tools.clone(),
        )
        .with_focus(c.focus.clone())
        .with_tenants(c.tenants.clone())
    }

    /// The same course, open only to `tenants` (`None`: every tenant).
    pub fn with_tenants(self, tenants: Option<Vec<String>>) -> Self {
        Self { tenants, ..self }
    }

    /// Every course of `config`, by id, built once per config (load and reload).
    pub fn all(config: &Config) -> BTreeMap<String, Course> {
        config
            .courses
            .iter()
            .map(|(id, c)| (id.clone(), Self::from_config(c)))
            .collect()
    }

    /// The same course with these focusing settings.
    pub fn with_focus(self, focus: FocusSettings) -> Self {
        Self { focus, ..self }
    }

    /// The messages to send: the stable system message, then `student` as is.
    pub fn messages(&self, student: &[Value]) -> Vec<Value> {
        let mut out = Vec::with_capacity(student.len() + 1);
        out.push(json!({"role": "system", "content": self.system_prompt}));
        out.extend(student.iter().cloned());
        out
    }
}

/// What a student sends with a course request: everything after the stable prefix.
#[derive(Debug, Clone, Default)]
pub struct StudentMaterial {
    /// Recent turns (chat messages, oldest first), without system messages.
    pub turns: Vec<Value>,
    /// The question.
    pub question: Option<String>,
    /// The student's code (one file).
    pub code: Option<String>,
    /// The stack trace (or compiler error), if any.
    pub stack_trace: Option<String>,
    /// `code`'s path, if given.
    pub path: Option<String>,
    /// Several files instead of `code` (`files: [{path, code}]`).
    pub files: Vec<SourceFile>,
    /// The code's language, if given (otherwise from the paths, or the trace).
    pub language: Option<Lang>,
    /// The focused code section that replaces the whole code, once focusing chose one.
    pub focused: Option<String>,
}

impl StudentMaterial {
    /// The code as files: `files`, or `code` (with its `path`) when not blank.
    pub fn sources(&self) -> Vec<SourceFile> {
        if !self.files.is_empty() {
            return self.files.clone();
        }
        match self.code.as_deref().filter(|c| !c.trim().is_empty()) {
            Some(code) => vec![SourceFile {
                path: self.path.clone(),
                code: code.to_owned(),
            }],
            None => Vec::new(),
        }
    }
}

/// The student's part of the messages: the recent turns, then one user message with the
/// question, the code (focused, or whole) and the stack trace.
pub fn student_messages(s: &StudentMaterial) -> Vec<Value> {
    let mut parts = Vec::new();
    if let Some(q) = s.question.as_deref().filter(|q| !q.trim().is_empty()) {
        parts.push(q.to_owned());
    }
    match &s.focused {
        Some(focused) => parts.push(focused.clone()),
        None => {
            let sources = s.sources();
            if !sources.is_empty() {
                parts.push(focus::whole(&sources));
            }
        }
    }
    if let Some(trace) = s.stack_trace.as_deref().filter(|t| !t.trim().is_empty()) {
        parts.push(format!("Stack trace:\n```\n{trace}\n```"));
    }
    let mut out = s.turns.clone();
    if !parts.is_empty() {
        out.push(json!({"role": "user", "content": parts.join("\n\n")}));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn course(tools: Value) -> Course {
        Course::build(
            "py101",
            "3",
            "Be a tutor.",
            "Hints first.",
            "No full solutions.",
            Some(tools),
        )
    }

    #[test]
    fn prefix_is_stable_and_tools_are_canonical() {
        let a = course(json!([{"type": "function", "function": {"name": "t", "parameters": {}}}]));
        let b = course(json!([{"function": {"parameters": {}, "name": "t"}, "type": "function"}]));
        assert_eq!(a, b);
        assert!(a
            .system_prompt
            .starts_with("Course py101, version 3.\n\n# Instructions\n"));
        assert!(a.system_prompt.ends_with(
            r#"# Tools
[{"function":{"name":"t","parameters":{}},"type":"function"}]"#
        ));
        assert_eq!(
            serde_json::to_string(a.tools.as_ref().unwrap()).unwrap(),
            r#"[{"function":{"name":"t","parameters":{}},"type":"function"}]"#
        );
    }

    #[test]
    fn student_material_comes_after_the_prefix() {
        let c = course(json!([]));
        let s = StudentMaterial {
            turns: vec![json!({"role": "user", "content": "earlier"})],
            question: Some("Why?".into()),
            code: Some("print(x)".into()),
            stack_trace: Some("NameError".into()),
            ..StudentMaterial::default()
        };
        let m = c.messages(&student_messages(&s));
        assert_eq!(m.len(), 3);
        assert_eq!(m[0]["role"], "system");
        assert_eq!(m[0]["content"], c.system_prompt.as_str());
        assert_eq!(m[1]["content"], "earlier");
        let last = m[2]["content"].as_str().unwrap();
        assert!(last.starts_with("Why?\n\nMy code:\n```\nprint(x)\n```\n\nStack trace:"));
    }
}

//! Template variables and per-request values in text meant for the stable prefix (M17, M20).
//!
//! A course's stable parts are sent before every student's material, so they must be the same
//! bytes for everyone. [`find_placeholder`] rejects what is obviously per-user or per-request:
//!
//! - `{{name}}` (Jinja, Mustache, Handlebars) and `${name}` (shell, JS template strings);
//! - `{name}` (Python `format`, Rust `format!`): `{`, an identifier (letters, digits, `_`, `.`),
//!   `}`; JSON objects (`{"a": 1}`) and empty braces are fine;
//! - `%(name)s` and `%s` (printf-style);
//! - `<NAME>` placeholders: `<`, two or more upper-case letters, digits or `_`, `>`;
//! - dates and times: `2026-11-29` (four digits, `-`, two digits, `-`, two digits) and `14:05`
//!   (one or two digits, `:`, two digits).

/// The kind of the first placeholder found in `text`, or `None`.
pub fn find_placeholder(text: &str) -> Option<&'static str> {
    let b = text.as_bytes();
    for i in 0..b.len() {
        let rest = &b[i..];
        if rest.starts_with(b"{{") {
            return Some("a `{{...}}` template variable");
        }
        if rest.starts_with(b"${") {
            return Some("a `${...}` template variable");
        }
        if rest.starts_with(b"%(") || rest.starts_with(b"%s") {
            return Some("a printf-style `%s` / `%(name)s` placeholder");
        }
        if b[i] == b'{'
            && ident_then(rest, 1, b'}', |c| {
                c.is_ascii_alphanumeric() || c == b'_' || c == b'.'
            })
        {
            return Some("a `{name}` template variable");
        }
        if b[i] == b'<'
            && ident_then(rest, 2, b'>', |c| {
                c.is_ascii_uppercase() || c.is_ascii_digit() || c == b'_'
            })
        {
            return Some("a `<NAME>` placeholder");
        }
        let at_start = i == 0 || !b[i - 1].is_ascii_digit();
        if at_start && digits(rest, 4) && shape(&rest[4..], b"-dd-dd") {
            return Some("a date (YYYY-MM-DD)");
        }
        if at_start && (shape(rest, b"d:dd") || shape(rest, b"dd:dd")) {
            return Some("a time of day (HH:MM)");
        }
    }
    None
}

/// `rest[1..]` is at least `min` bytes matching `ok`, then `close`.
fn ident_then(rest: &[u8], min: usize, close: u8, ok: impl Fn(u8) -> bool) -> bool {
    let n = rest[1..].iter().take_while(|c| ok(**c)).count();
    n >= min && rest.get(1 + n) == Some(&close)
}

fn digits(s: &[u8], n: usize) -> bool {
    s.len() >= n && s[..n].iter().all(u8::is_ascii_digit)
}

/// `s` starts with `pattern`, where `d` is any digit; the match is not followed by a digit.
fn shape(s: &[u8], pattern: &[u8]) -> bool {
    s.len() >= pattern.len()
        && pattern.iter().zip(s).all(|(p, c)| match p {
            b'd' => c.is_ascii_digit(),
            other => other == c,
        })
        && !s.get(pattern.len()).is_some_and(u8::is_ascii_digit)
}

#[cfg(test)]
mod tests {
    use super::find_placeholder;

    #[test]
    fn rejects_template_variables_dates_and_times() {
        for bad in [
            "Hello {{student_name}}",
            "Due ${deadline}",
            "Dear {student}, ...",
            "Hi {user.name}",
            "Name: %s",
            "Name: %(name)s",
            "Student: <STUDENT_NAME>",
            "Updated 2026-11-29.",
            "Office hours at 14:05",
            "at 9:30 sharp",
        ] {
            assert!(find_placeholder(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn accepts_ordinary_instructions_and_json() {
        for ok in [
            "You are a patient Python tutor. Never give the full solution.",
            r#"[{"type":"function","function":{"name":"run_tests","parameters":{}}}]"#,
            "Use a dict {} or a set; compare a<b and b>a; score 1-5; ratio 10:1.",
            "Wrap code in <code> tags.",
        ] {
            assert_eq!(find_placeholder(ok), None, "{ok}");
        }
    }
}

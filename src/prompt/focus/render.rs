//! The code section of the student's message: the whole code as sent, or the focused
//! selection in source order with `...` where lines are left out and each line's number.

use super::lang::Lang;
use super::selector::FileSelection;
use super::source::SourceFile;

/// The heading of a focused code section.
pub const FOCUSED_HEADING: &str = "My code, cut down to what the stack trace or error points \
at (the functions in it with their class headers and imports, and what they call; `...` marks \
lines left out, each line starts with its line number in the file):";

/// The whole code: `My code:` and each file in a fence (with its path when given).
pub fn whole(files: &[SourceFile]) -> String {
    match files {
        [one] => match &one.path {
            None => format!("My code:\n```\n{}\n```", one.code),
            Some(p) => format!("My code (`{p}`):\n```\n{}\n```", one.code),
        },
        many => {
            let mut out = String::from("My code:");
            for f in many {
                let p = f.path.as_deref().unwrap_or("(no path)");
                out.push_str(&format!("\n\nFile `{p}`:\n```\n{}\n```", f.code));
            }
            out
        }
    }
}

/// The focused code: per file with a selection, its chosen lines with their numbers; the files
/// without one named at the end.
pub fn focused(files: &[SourceFile], langs: &[Lang], selections: &[FileSelection]) -> String {
    let mut out = String::from(FOCUSED_HEADING);
    let mut left_out: Vec<&str> = Vec::new();
    for ((file, lang), sel) in files.iter().zip(langs).zip(selections) {
        if sel.is_empty() {
            left_out.push(file.path.as_deref().unwrap_or("(no path)"));
            continue;
        }
        out.push_str("\n\n");
        if let Some(p) = &file.path {
            out.push_str(&format!("File `{p}`:\n"));
        }
        out.push_str(&format!("```{}\n", lang.as_str()));
        out.push_str(&numbered(&file.code, &sel.rows));
        out.push_str("```");
    }
    if !left_out.is_empty() {
        let names: Vec<String> = left_out.iter().map(|p| format!("`{p}`")).collect();
        out.push_str(&format!(
            "\n\nFiles left out (no frame or call in them): {}.",
            names.join(", ")
        ));
    }
    out
}

/// The chosen rows of `code`, numbered from 1, a `...` line for each run left out. A single
/// line left out between two chosen ones is sent instead (it costs what the marker costs).
fn numbered(code: &str, rows: &[bool]) -> String {
    let lines: Vec<&str> = code.lines().collect();
    let mut on: Vec<bool> = rows.to_vec();
    on.resize(lines.len(), false);
    for r in 1..on.len().saturating_sub(1) {
        if !on[r] && on[r - 1] && on[r + 1] {
            on[r] = true;
        }
    }
    let last = on.iter().rposition(|x| *x).unwrap_or(0);
    let width = (last + 1).to_string().len();
    let mut out = String::new();
    let mut gap = false;
    for (r, line) in lines.iter().enumerate() {
        if on[r] {
            if gap {
                out.push_str("...\n");
                gap = false;
            }
            out.push_str(&format!("{:>width$} | {}\n", r + 1, line.trim_end()));
        } else {
            gap = true;
        }
    }
    if gap {
        out.push_str("...\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_lines_and_gaps() {
        let code = "a\nb\nc\nd\ne\nf";
        let rows = [true, false, true, false, false, true];
        assert_eq!(numbered(code, &rows), "1 | a\n2 | b\n3 | c\n...\n6 | f\n");
        assert_eq!(
            numbered(code, &[false, false, true, false, false, false]),
            "...\n3 | c\n...\n"
        );
    }

    #[test]
    fn whole_code_is_sent_as_before() {
        let one = [SourceFile {
            path: None,
            code: "print(x)".into(),
        }];
        assert_eq!(whole(&one), "My code:\n```\nprint(x)\n```");
    }
}

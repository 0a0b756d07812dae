//! A JSON text as Python's `json.dumps` writes it after `json.loads`: how vLLM hands an
//! assistant's tool-call `arguments` to the chat template. vLLM parses each call's `arguments`
//! string (`_postprocess_messages` in `vllm/entrypoints/chat_utils.py`) and the templates of
//! Llama 3.1 and Qwen 2.5 write it back with `tojson` (Hugging Face's: `json.dumps` with
//! `ensure_ascii=False` and the default separators). What the client sent compact comes out
//! with `", "` and `": "`, and a number with a fraction or an exponent as Python writes a float
//! (`1e15` is `1000000000000000.0`): more text than was sent, which the count must see.
//!
//! Whitespace between tokens is dropped (as `json.loads` drops it); strings and integers are
//! kept as written (Python writes an integer's digits as they came, and a string at most as
//! long: it only unescapes).

/// `raw` as `json.dumps(json.loads(raw))` writes it (see the module doc); `None` when a number
/// in it cannot be read. Python also reads `NaN`, `Infinity` and `-Infinity`, which are kept as
/// they are; text that is not JSON at all (vLLM refuses the request) goes through the same
/// rules.
pub fn python_dumps(raw: &str) -> Option<String> {
    let bytes = raw.as_bytes();
    let mut out = String::with_capacity(raw.len() + raw.len() / 4);
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'"' => {
                let start = i;
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i = (i + 1).min(bytes.len());
                out.push_str(&raw[start..i]);
            }
            b',' => {
                out.push_str(", ");
                i += 1;
            }
            b':' => {
                out.push_str(": ");
                i += 1;
            }
            b'-' if raw[i..].starts_with("-Infinity") => {
                out.push_str("-Infinity");
                i += "-Infinity".len();
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                i += 1;
                while i < bytes.len()
                    && matches!(bytes[i], b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-')
                {
                    i += 1;
                }
                let literal = &raw[start..i];
                if literal.contains(['.', 'e', 'E']) {
                    out.push_str(&python_float(literal.parse().ok()?));
                } else {
                    out.push_str(literal);
                }
            }
            b' ' | b'\t' | b'\n' | b'\r' => i += 1,
            _ => {
                // `{`, `}`, `[`, `]`, `true`, `false`, `null`, `NaN`, `Infinity`: as they are.
                let len = raw[i..].chars().next().map_or(1, char::len_utf8);
                out.push_str(&raw[i..i + len]);
                i += len;
            }
        }
    }
    Some(out)
}

/// `repr(x)` of a Python float: the shortest digits that read back as `x`, in positional
/// notation with at least one fractional digit when the decimal exponent is from -4 to 15,
/// else in scientific notation with a signed exponent of at least two digits (`1e+16`,
/// `1.5e-05`); `Infinity`, `-Infinity` and `NaN` as `json.dumps` writes them.
pub fn python_float(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // Rust's `{:e}` is the shortest round-trip digits too: `1.5e-5`, `-1e15`.
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if (-4..16).contains(&exp) {
        let point = usize::try_from(exp + 1).unwrap_or(0);
        if exp < 0 {
            let zeros = "0".repeat(usize::try_from(-exp - 1).unwrap_or(0));
            return format!("{sign}0.{zeros}{digits}");
        }
        let (int, frac) = if digits.len() > point {
            (digits[..point].to_owned(), digits[point..].to_owned())
        } else {
            (format!("{digits:0<point$}"), "0".to_owned())
        };
        return format!("{sign}{int}.{frac}");
    }
    let (first, rest) = digits.split_at(1);
    let rest = if rest.is_empty() {
        String::new()
    } else {
        format!(".{rest}")
    };
    let exp_sign = if exp < 0 { '-' } else { '+' };
    format!("{sign}{first}{rest}e{exp_sign}{:02}", exp.abs())
}

#[cfg(test)]
mod tests {
    use super::{python_dumps, python_float};

    #[test]
    fn floats_are_written_as_python_writes_them() {
        // Each against CPython's repr().
        for (x, py) in [
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (0.5, "0.5"),
            (-2.0, "-2.0"),
            (123.456, "123.456"),
            (1e300, "1e+300"),
            (1.2345678901234567e19, "1.2345678901234567e+19"),
            (-0.0, "-0.0"),
            (100.0, "100.0"),
            (f64::INFINITY, "Infinity"),
        ] {
            assert_eq!(python_float(x), py, "{x}");
        }
    }

    #[test]
    fn compact_json_comes_out_as_json_dumps_writes_it() {
        assert_eq!(
            python_dumps(r#"{"x":[1e15,2,-3.5],"s":"a, b:c","t":true}"#).unwrap(),
            r#"{"x": [1000000000000000.0, 2, -3.5], "s": "a, b:c", "t": true}"#
        );
        assert_eq!(python_dumps("{ \"a\" :\n 1 }").unwrap(), r#"{"a": 1}"#);
        assert_eq!(python_dumps(r#""q\"uo,te""#).unwrap(), r#""q\"uo,te""#);
        // Python reads these too.
        assert_eq!(
            python_dumps("[NaN,Infinity,-Infinity,1]").unwrap(),
            "[NaN, Infinity, -Infinity, 1]"
        );
    }
}

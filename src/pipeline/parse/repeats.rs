//! Repetition counts in a structured-output guide. vLLM's grammar engine (xgrammar) builds a
//! counted repetition above 128 otherwise than one below, and each mask fill, which the engine
//! makes for every guided request at every step of the batch, then costs far more: measured on
//! xgrammar 0.2.9 (a 128,000-token vocabulary, on a CPU core), `maxItems` 200 made a fill 8x
//! the plain guide's and `minItems` 1,000 up to 43x; a string `pattern` of `[a-z]{1,129}`
//! 8,400x (28 ms a fill, a whole step of an 8B model on an H100); a regex `[a-z]{1,256}` 200x,
//! compiled in seconds. Counts up to 128 kept fills within 1.5x; `maxLength`, `minLength`,
//! unbounded `+` and `*`, `anyOf` of 32 and an enum of 1,000 strings stayed cheap. So a guide
//! whose counts pass `fields.max_guide_repeat` is refused (400 naming it) before it reaches the
//! engine.
//!
//! What is read: in a JSON schema, `minItems`, `maxItems`, `minContains`, `maxContains`,
//! `minProperties`, `maxProperties`, and the regexes of `pattern` and `patternProperties`;
//! in a regex or a grammar (`guided_regex`, `guided_grammar`, `structured_outputs`' `regex`
//! and `grammar`, a whitespace pattern), every `{m}`, `{m,}` and `{m,n}` not escaped (in a
//! character class too: read as a count whatever it is, which can only refuse more) and Lark's
//! `~ m` and `~ m..n`. A guide given as JSON text (`guided_json` as a string, a structural tag)
//! is read as the JSON it holds.

use serde_json::Value;

/// Schema keys whose number is a repetition count.
const COUNT_KEYS: &[&str] = &[
    "minItems",
    "maxItems",
    "minContains",
    "maxContains",
    "minProperties",
    "maxProperties",
];

/// Keys whose string is a regex or a grammar.
const PATTERN_KEYS: &[&str] = &[
    "pattern",
    "regex",
    "grammar",
    "whitespace_pattern",
    "guided_regex",
    "guided_grammar",
    "guided_whitespace_pattern",
];

/// The largest repetition count in `guide` (field `field` of a request) above `limit`, if
/// any.
pub fn over(field: &str, guide: &Value, limit: u32) -> Option<u64> {
    let limit = u64::from(limit);
    let mut worst = None;
    let mut note = |n: u64| {
        if n > limit && worst.is_none_or(|w| n > w) {
            worst = Some(n);
        }
    };
    match guide {
        // A whole guide as a string: a regex or a grammar, or a schema or tag as JSON text.
        Value::String(s) => match serde_json::from_str::<Value>(s) {
            Ok(v @ Value::Object(_)) if !is_pattern_field(field) => walk(&v, &mut note),
            _ => counts_in_pattern(s, &mut note),
        },
        other => walk(other, &mut note),
    }
    worst
}

/// Whether `field` is a guide that is a regex or a grammar itself.
fn is_pattern_field(field: &str) -> bool {
    PATTERN_KEYS.contains(&field)
}

/// Every count in a JSON guide (a schema, `structured_outputs`, a `response_format`).
fn walk(v: &Value, note: &mut impl FnMut(u64)) {
    match v {
        Value::Object(map) => {
            for (key, value) in map {
                if COUNT_KEYS.contains(&key.as_str()) {
                    if let Some(n) = count(value) {
                        note(n);
                    }
                }
                match value {
                    Value::String(s) if PATTERN_KEYS.contains(&key.as_str()) => {
                        counts_in_pattern(s, note);
                    }
                    // A structural tag or schema given as JSON text inside the guide.
                    Value::String(s) if key == "structural_tag" || key == "json" => {
                        if let Ok(inner) = serde_json::from_str::<Value>(s) {
                            walk(&inner, note);
                        }
                    }
                    _ => {}
                }
                if key == "patternProperties" {
                    if let Value::Object(patterns) = value {
                        for regex in patterns.keys() {
                            counts_in_pattern(regex, note);
                        }
                    }
                }
                walk(value, note);
            }
        }
        Value::Array(items) => items.iter().for_each(|item| walk(item, note)),
        _ => {}
    }
}

/// A count as a schema writes it: a non-negative whole number (a float with no fraction too);
/// any other number counts as past every bound.
fn count(v: &Value) -> Option<u64> {
    let n = v.as_number()?;
    Some(
        n.as_u64()
            .or_else(|| {
                n.as_f64()
                    .filter(|f| *f >= 0.0 && f.fract() == 0.0 && *f < 1e18)
                    .map(|f| f as u64)
            })
            .unwrap_or(u64::MAX),
    )
}

/// Every `{m}`, `{m,}`, `{m,n}` not escaped and every Lark `~ m` or `~ m..n` in `pattern`.
fn counts_in_pattern(pattern: &str, note: &mut impl FnMut(u64)) {
    let b = pattern.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'{' => {
                let (numbers, end) = numbers_until(b, i + 1, b'}');
                if let Some(end) = end {
                    numbers.into_iter().for_each(&mut *note);
                    i = end;
                }
                i += 1;
            }
            b'~' => {
                let mut j = i + 1;
                while j < b.len() && b[j].is_ascii_whitespace() {
                    j += 1;
                }
                let (first, after) = digits(b, j);
                if let Some(n) = first {
                    note(n);
                    if b.get(after..after + 2) == Some(b"..") {
                        if let (Some(m), _) = digits(b, after + 2) {
                            note(m);
                        }
                    }
                }
                i += 1;
            }
            _ => i += 1,
        }
    }
}

/// The numbers of a `m}`, `m,}` or `m,n}` quantifier body starting at `start` (spaces
/// allowed), and where its closing `close` is; no end when it is not one.
fn numbers_until(b: &[u8], start: usize, close: u8) -> (Vec<u64>, Option<usize>) {
    let mut numbers = Vec::new();
    let mut j = start;
    let skip = |j: &mut usize| {
        while *j < b.len() && b[*j] == b' ' {
            *j += 1;
        }
    };
    skip(&mut j);
    let (first, after) = digits(b, j);
    let Some(first) = first else {
        // `{,n}` (a count with no least) counts its most.
        if b.get(j) == Some(&b',') {
            let mut k = j + 1;
            skip(&mut k);
            if let (Some(n), after) = digits(b, k) {
                let mut k = after;
                skip(&mut k);
                if b.get(k) == Some(&close) {
                    return (vec![n], Some(k));
                }
            }
        }
        return (numbers, None);
    };
    numbers.push(first);
    j = after;
    skip(&mut j);
    if b.get(j) == Some(&b',') {
        j += 1;
        skip(&mut j);
        let (second, after) = digits(b, j);
        if let Some(n) = second {
            numbers.push(n);
            j = after;
            skip(&mut j);
        }
    }
    if b.get(j) == Some(&close) {
        (numbers, Some(j))
    } else {
        (Vec::new(), None)
    }
}

/// The decimal number at `at` (saturating), and where it ends; `None` when no digit is there.
fn digits(b: &[u8], at: usize) -> (Option<u64>, usize) {
    let mut j = at;
    let mut n: u64 = 0;
    while j < b.len() && b[j].is_ascii_digit() {
        n = n.saturating_mul(10).saturating_add(u64::from(b[j] - b'0'));
        j += 1;
    }
    ((j > at).then_some(n), j)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn counts_past_the_bound_are_found_wherever_a_guide_holds_them() {
        let over_128 = |field: &str, v: Value| over(field, &v, 128);
        // Schemas: arrays, objects, patterns, patternProperties, nested anywhere.
        assert_eq!(
            over_128("guided_json", json!({"type": "array", "maxItems": 200})),
            Some(200)
        );
        assert_eq!(
            over_128("guided_json", json!({"type": "array", "minItems": 1000.0})),
            Some(1000)
        );
        assert_eq!(
            over_128(
                "response_format",
                json!({"type": "json_schema", "json_schema": {"schema":
                {"properties": {"a": {"anyOf": [{"type": "string", "pattern": "^[a-z]{1,129}$"}]}}}}})
            ),
            Some(129)
        );
        assert_eq!(
            over_128(
                "guided_json",
                json!({"patternProperties": {"^x{300}$": {}}})
            ),
            Some(300)
        );
        assert_eq!(
            over_128("guided_json", json!({"maxProperties": -1})),
            Some(u64::MAX)
        );
        // Regexes and grammars, as strings or inside structured_outputs.
        assert_eq!(over_128("guided_regex", json!("[a-z]{1,4096}")), Some(4096));
        assert_eq!(over_128("guided_regex", json!("a{ 200 , }")), Some(200));
        assert_eq!(over_128("guided_regex", json!("a{,500}")), Some(500));
        assert_eq!(
            over_128("structured_outputs", json!({"regex": "(ab|cd){0,100000}"})),
            Some(100_000)
        );
        assert_eq!(
            over_128("guided_grammar", json!("root ::= [a-z]{1,300}")),
            Some(300)
        );
        assert_eq!(
            over_128("guided_grammar", json!("start: \"a\"~ 5..1000")),
            Some(1000)
        );
        // JSON text guides are read as the JSON they hold.
        assert_eq!(
            over_128("guided_json", json!("{\"maxItems\": 999}")),
            Some(999)
        );
        assert_eq!(
            over_128(
                "structured_outputs",
                json!({"structural_tag": "{\"schema\": {\"minItems\": 129}}"})
            ),
            Some(129)
        );
    }

    #[test]
    fn counts_within_the_bound_and_what_is_not_a_count_pass() {
        let over_128 = |field: &str, v: Value| over(field, &v, 128);
        for (field, guide) in [
            (
                "guided_json",
                json!({"type": "array", "maxItems": 128, "items": {"maxLength": 100000}}),
            ),
            (
                "guided_json",
                json!({"type": "string", "minLength": 1000, "description": "about {1000} words"}),
            ),
            ("guided_regex", json!("[a-z]{1,128}\\{1000}")),
            ("guided_regex", json!("[a-z]+ (ab|cd)*")),
            ("guided_regex", json!("a{b,1000}")),
            ("guided_choice", json!(["{1000}", "b"])),
            ("structured_outputs", json!({"json": {"enum": ["x{999}"]}})),
        ] {
            assert_eq!(over_128(field, guide.clone()), None, "{field}: {guide}");
        }
    }
}

//! What a structured-output guide's structure costs the engine. vLLM's grammar engine
//! (xgrammar) fills a mask for every guided request at every step of the batch, on the engine's
//! own thread, and compiles each guide on a pool without a timeout for JSON schemas; measured
//! on xgrammar 0.2.9 (`docs/results/guides/`):
//! - a counted repetition above 128 is built otherwise than one below: `maxItems` 200 made a
//!   fill 8x the plain guide's, `minItems` 1,000 up to 43x, a `pattern` `[a-z]{1,129}`
//!   8,400x (28 ms, a whole decode step);
//! - a regex or a grammar (`guided_regex`, `guided_grammar`, and a structural tag's `regex`,
//!   `grammar` and `repeat` formats) is matched by a general parser whose fills cost 2 ms to
//!   seconds for guides of a few dozen bytes with no count above 16, or none at all
//!   (`([a-z]{1,16} ){0,20}` 43 ms, `[a-z]?` twenty times 64 ms, fifty times 1.8 s);
//! - a JSON schema's `pattern` takes a cheaper path, which nested or adjacent counts and chains
//!   of optional atoms still make costly (`^([a-z]{1,16}){1,16}$` 94x and a 73 s compile;
//!   `[a-z]?` fifty times 20x and 4.4 s).
//!
//! So, unless `fields.regex_guides` allows them, regex and grammar guides are refused; and in
//! what is taken, a count (`minItems`, `maxItems`, `minContains`, `maxContains`,
//! `minProperties`, `maxProperties`, a `repeat` format's `min` and `max`, a grammar's `{m,n}`
//! or Lark's `~ m..n`) above `fields.max_guide_repeat` is refused, and so is a regex (a
//! `pattern`, a `patternProperties` key, an allowed regex guide) whose weight is above it: the
//! atoms it unrolls to, a counted group's weight times its count, an optional atom counting
//! [`OPTIONAL_WEIGHT`] (its cost grows with the chain). `const`, `enum`, `default` and
//! `examples` are values, not structure, and are not read.

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

/// Schema keys whose value is data, not structure.
const VALUE_KEYS: &[&str] = &["const", "enum", "default", "examples"];

/// Structural-tag formats compiled as a regex or a grammar (a `repeat` of any format too).
const REGEX_FORMATS: &[&str] = &["regex", "grammar", "repeat"];

/// Guide fields (and `structured_outputs` keys) that are a regex or a grammar.
const REGEX_FIELDS: &[&str] = &[
    "guided_regex",
    "guided_grammar",
    "guided_whitespace_pattern",
    "regex",
    "grammar",
    "whitespace_pattern",
];

/// The weight of an optional atom (`x?`, `{0,1}`): a chain of them cost far more per atom than
/// a counted repetition (fifty `[a-z]?` in a `pattern`: 20x a fill and a 4.4 s compile).
pub const OPTIONAL_WEIGHT: u64 = 4;

/// Why a guide is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A regex or grammar guide, with `fields.regex_guides` off: where it is.
    RegexGuide(String),
    /// A count above the bound (`u64::MAX`: not a whole number).
    Count(u64),
    /// A regex whose weight is above the bound.
    Weight(u64),
}

/// The first reason to refuse `guide` (request field `field`) under the bound `limit`
/// (`fields.max_guide_repeat`), regex and grammar guides allowed or not.
pub fn refusal(field: &str, guide: &Value, limit: u32, regex_guides: bool) -> Option<Refusal> {
    let mut walk = Walk {
        limit: u64::from(limit),
        regex_guides,
        found: None,
    };
    walk.field(field, guide);
    walk.found
}

struct Walk {
    limit: u64,
    regex_guides: bool,
    found: Option<Refusal>,
}

impl Walk {
    fn refuse(&mut self, why: Refusal) {
        if self.found.is_none() {
            self.found = Some(why);
        }
    }

    fn count(&mut self, n: u64) {
        if n > self.limit {
            self.refuse(Refusal::Count(n));
        }
    }

    /// A regex: its weight within the bound.
    fn regex(&mut self, pattern: &str) {
        let w = weight(pattern);
        if w > self.limit {
            self.refuse(Refusal::Weight(w));
        }
    }

    /// A grammar (EBNF, GBNF, Lark): its counts within the bound (what can be read of them),
    /// read as written and with its `#` comments taken out (a comment may sit inside a count's
    /// braces; a `#` in a literal is not one): each a linear pass.
    fn grammar(&mut self, text: &str) {
        let mut worst = 0;
        counts_in_grammar(text, &mut |n| worst = worst.max(n));
        counts_in_grammar(&without_comments(text), &mut |n| worst = worst.max(n));
        self.count(worst);
    }

    /// A regex or grammar guide named `at`: refused unless allowed, then bounded.
    fn regex_guide(&mut self, at: &str, key: &str, text: &str) {
        if !self.regex_guides {
            self.refuse(Refusal::RegexGuide(at.to_owned()));
        } else if key.contains("grammar") {
            self.grammar(text);
        } else {
            self.regex(text);
        }
    }

    /// A request's guide field.
    fn field(&mut self, field: &str, guide: &Value) {
        match guide {
            Value::String(s) if REGEX_FIELDS.contains(&field) => self.regex_guide(field, field, s),
            // A schema or a structural tag as JSON text.
            // (Not JSON: vLLM refuses it.)
            Value::String(s) => {
                if let Ok(v) = serde_json::from_str::<Value>(s) {
                    self.value(field, &v);
                }
            }
            other => self.value(field, other),
        }
    }

    /// Anything inside a guide, `at` naming where (for the refusal).
    fn value(&mut self, at: &str, v: &Value) {
        match v {
            Value::Object(map) => {
                if let Some(kind) = map.get("type").and_then(Value::as_str) {
                    if REGEX_FORMATS.contains(&kind) && !self.regex_guides {
                        self.refuse(Refusal::RegexGuide(format!("{at} ({kind} format)")));
                    }
                    if kind == "repeat" {
                        for key in ["min", "max"] {
                            // A `max` of -1 is xgrammar's "no most": an unbounded loop.
                            let unbounded = map.get(key).and_then(Value::as_i64) == Some(-1);
                            if let Some(n) = map.get(key).and_then(count).filter(|_| !unbounded) {
                                self.count(n);
                            }
                        }
                    }
                }
                for (key, value) in map {
                    if VALUE_KEYS.contains(&key.as_str()) {
                        continue;
                    }
                    if COUNT_KEYS.contains(&key.as_str()) {
                        if let Some(n) = count(value) {
                            self.count(n);
                        }
                    }
                    match value {
                        Value::String(s) if key == "pattern" => self.regex(s),
                        Value::String(s) if REGEX_FIELDS.contains(&key.as_str()) => {
                            self.regex_guide(&format!("{at}.{key}"), key, s);
                        }
                        // A structural tag or schema as JSON text inside the guide.
                        Value::String(s) if key == "structural_tag" || key == "json" => {
                            if let Ok(inner) = serde_json::from_str::<Value>(s) {
                                self.value(&format!("{at}.{key}"), &inner);
                            }
                        }
                        Value::Object(patterns) if key == "patternProperties" => {
                            for regex in patterns.keys() {
                                self.regex(regex);
                            }
                        }
                        _ => {}
                    }
                    self.value(at, value);
                }
            }
            Value::Array(items) => items.iter().for_each(|item| self.value(at, item)),
            _ => {}
        }
    }
}

/// A count as a schema writes it: a non-negative whole number; any other number counts as past
/// every bound (xgrammar refuses it anyway).
fn count(v: &Value) -> Option<u64> {
    let n = v.as_number()?;
    Some(n.as_u64().unwrap_or(u64::MAX))
}

/// The weight of `pattern` as a regex: the atoms it unrolls to. An atom (a character, a class,
/// an escape) weighs 1; a group its contents; a sequence the sum of its items; an alternation
/// the sum of its branches (both are built); `x*` and `x+` what `x` weighs (a loop); `x?` and
/// `x{0,1}` [`OPTIONAL_WEIGHT`] times; `x{m}`, `x{m,}`, `x{m,n}` `x` times the largest of its
/// numbers. Saturating.
pub fn weight(pattern: &str) -> u64 {
    let mut p = Parser {
        b: pattern.as_bytes(),
        i: 0,
        depth: 0,
    };
    let w = p.alternation();
    // Stopped before the end: a `)` that closes nothing, which no engine takes as written
    // (and what follows it was not weighed).
    if p.i < p.b.len() {
        return u64::MAX;
    }
    w
}

struct Parser<'a> {
    b: &'a [u8],
    i: usize,
    depth: u32,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn alternation(&mut self) -> u64 {
        let mut total = self.sequence();
        while self.peek() == Some(b'|') {
            self.i += 1;
            total = total.saturating_add(self.sequence());
        }
        total
    }

    fn sequence(&mut self) -> u64 {
        let mut total = 0u64;
        while let Some(c) = self.peek() {
            if c == b'|' || c == b')' {
                break;
            }
            let atom = self.atom();
            let item = self.quantified(atom);
            total = total.saturating_add(item);
        }
        total
    }

    fn atom(&mut self) -> u64 {
        let Some(c) = self.peek() else { return 0 };
        self.i += 1;
        match c {
            b'\\' => {
                // An escape: one character, or a braced one (`\p{L}`, `\u{1F600}`, `\x{41}`).
                if let Some(n) = self.peek() {
                    self.i += 1;
                    if matches!(n, b'p' | b'P' | b'u' | b'x' | b'k' | b'N')
                        && self.peek() == Some(b'{')
                    {
                        self.skip_past(b'}');
                    }
                }
                1
            }
            b'[' => {
                // A class: `]` first (after an optional `^`) is a member; escapes inside.
                if self.peek() == Some(b'^') {
                    self.i += 1;
                }
                if self.peek() == Some(b']') {
                    self.i += 1;
                }
                while let Some(c) = self.peek() {
                    self.i += 1;
                    match c {
                        b'\\' => self.i += 1,
                        b']' => break,
                        _ => {}
                    }
                }
                1
            }
            b'(' => {
                // A group's prefix (`?:`, `?=`, `?!`, `?<name>`, `?P<name>`...) weighs nothing;
                // a group that is all prefix (flags `(?i)`, a comment `(?#...)`) weighs nothing
                // and ends there, what follows it weighed as the rest of the pattern.
                if self.peek() == Some(b'?') {
                    while let Some(c) = self.peek() {
                        self.i += 1;
                        if c == b')' {
                            return 0;
                        }
                        if matches!(c, b':' | b'=' | b'!' | b'>') {
                            break;
                        }
                    }
                }
                self.depth += 1;
                let inner = if self.depth > 200 {
                    // Deeper than any pattern needs: past every bound.
                    self.skip_past(b')');
                    u64::MAX
                } else {
                    self.alternation()
                };
                self.depth -= 1;
                if self.peek() == Some(b')') {
                    self.i += 1;
                }
                inner.max(1)
            }
            // Anchors weigh nothing.
            b'^' | b'$' => 0,
            _ => 1,
        }
    }

    /// `atom` with the quantifiers that follow it.
    fn quantified(&mut self, atom: u64) -> u64 {
        let mut w = atom;
        loop {
            match self.peek() {
                Some(b'*' | b'+') => {
                    self.i += 1;
                }
                Some(b'?') => {
                    self.i += 1;
                    w = w.saturating_mul(OPTIONAL_WEIGHT);
                }
                Some(b'{') => {
                    let (numbers, end) = numbers_until(self.b, self.i + 1, b'}', false);
                    let Some(end) = end else { return w };
                    self.i = end + 1;
                    let times = match numbers.as_slice() {
                        [0, 1] => OPTIONAL_WEIGHT,
                        _ => numbers.iter().copied().max().unwrap_or(0),
                    };
                    w = w.saturating_mul(times);
                }
                _ => return w,
            }
            // A lazy or possessive mark after a quantifier changes nothing here.
            if matches!(self.peek(), Some(b'?' | b'+'))
                && matches!(self.b.get(self.i.wrapping_sub(1)), Some(b'*' | b'+' | b'}'))
            {
                self.i += 1;
            }
        }
    }

    fn skip_past(&mut self, close: u8) {
        while let Some(c) = self.peek() {
            self.i += 1;
            if c == close {
                break;
            }
        }
    }
}

/// `text` with each `#` comment (to the end of its line) taken out.
fn without_comments(text: &str) -> String {
    text.lines()
        .map(|line| line.split('#').next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every count of a grammar (EBNF, GBNF, Lark) that can be read: `{m}`, `{m,}`, `{m,n}` with any
/// whitespace inside the braces, and Lark's `~ m` and `~ m..n` (spaces allowed), wherever they
/// are (in a quoted literal too: that can only refuse more).
fn counts_in_grammar(text: &str, note: &mut impl FnMut(u64)) {
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'{' => {
                let (numbers, end) = numbers_until(b, i + 1, b'}', true);
                numbers.into_iter().for_each(&mut *note);
                i = end.unwrap_or(i) + 1;
                // (A failed body is rescanned from its next byte: its scan stopped at the first
                // byte that is not whitespace, a digit or a comma, so the rescan is linear.)
            }
            b'~' => {
                let mut j = skip_space(b, i + 1);
                let (first, after) = digits(b, j);
                if let Some(n) = first {
                    note(n);
                    j = skip_space(b, after);
                    if b.get(j..j + 2) == Some(b"..") {
                        let k = skip_space(b, j + 2);
                        if let (Some(m), _) = digits(b, k) {
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

/// Past ASCII whitespace from `at`.
fn skip_space(b: &[u8], mut at: usize) -> usize {
    while at < b.len() && b[at].is_ascii_whitespace() {
        at += 1;
    }
    at
}

/// The numbers of a `m}`, `m,}`, `,n}` or `m,n}` quantifier body starting at `start`, and where
/// its closing `close` is; no end when it is not one. A grammar's may hold whitespace; a
/// regex's spaces.
fn numbers_until(b: &[u8], start: usize, close: u8, grammar: bool) -> (Vec<u64>, Option<usize>) {
    let skip = |at: usize| {
        if grammar {
            skip_space(b, at)
        } else {
            let mut at = at;
            while b.get(at) == Some(&b' ') {
                at += 1;
            }
            at
        }
    };
    let mut numbers = Vec::new();
    let mut j = skip(start);
    let (first, after) = digits(b, j);
    if let Some(n) = first {
        numbers.push(n);
        j = skip(after);
    }
    if b.get(j) == Some(&b',') {
        j = skip(j + 1);
        let (second, after) = digits(b, j);
        if let Some(n) = second {
            numbers.push(n);
            j = skip(after);
        }
    }
    if !numbers.is_empty() && b.get(j) == Some(&close) {
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

    fn refused(field: &str, v: Value) -> Option<Refusal> {
        refusal(field, &v, 128, false)
    }

    fn allowed(field: &str, v: Value) -> Option<Refusal> {
        refusal(field, &v, 128, true)
    }

    #[test]
    fn regex_and_grammar_guides_are_refused_unless_allowed() {
        for (field, guide) in [
            ("guided_regex", json!("[a-z]+")),
            ("guided_grammar", json!("root ::= \"a\"")),
            ("guided_whitespace_pattern", json!(" *")),
            ("structured_outputs", json!({"regex": "[a-z]?"})),
            ("structured_outputs", json!({"grammar": "start: \"a\""})),
            (
                "response_format",
                json!({"type": "structural_tag", "format": {"type": "repeat", "min": 0, "max": 3,
                    "content": {"type": "const_string", "value": "a"}}}),
            ),
            (
                "structural_tag",
                json!("{\"type\": \"regex\", \"pattern\": \"a\"}"),
            ),
            (
                "structured_outputs",
                json!({"structural_tag": "{\"format\": {\"type\": \"grammar\", \"grammar\": \"x\"}}"}),
            ),
        ] {
            assert!(
                matches!(refused(field, guide.clone()), Some(Refusal::RegexGuide(_))),
                "{field}: {guide}"
            );
            assert_eq!(allowed(field, guide.clone()), None, "{field}: {guide}");
        }
    }

    #[test]
    fn counts_past_the_bound_are_found_wherever_a_guide_holds_them() {
        assert_eq!(
            refused("guided_json", json!({"type": "array", "maxItems": 200})),
            Some(Refusal::Count(200))
        );
        assert_eq!(
            refused("guided_json", json!({"type": "array", "minItems": 1000.0})),
            Some(Refusal::Count(u64::MAX))
        );
        assert_eq!(
            refused("guided_json", json!("{\"maxItems\": 999}")),
            Some(Refusal::Count(999))
        );
        assert_eq!(
            allowed(
                "structured_outputs",
                json!({"structural_tag": {"format": {"type": "repeat",
                "min": 0, "max": 1000, "content": {"type": "regex", "pattern": "[a-z]"}}}})
            ),
            Some(Refusal::Count(1000))
        );
        // Grammars: whitespace and comments inside braces, Lark's ranges with spaces.
        for grammar in [
            "root ::= [a-z]{1,300}",
            "root ::= [a-z]{1,\t300}",
            "root ::= [a-z]{1, # up to\n300}",
            "root ::= \"#\" [a-z]{1,300}",
            "start: /[a-z]/ ~ 1 .. 300",
            "start: \"a\"~5..\t300",
        ] {
            assert_eq!(
                allowed("guided_grammar", json!(grammar)),
                Some(Refusal::Count(300)),
                "{grammar}"
            );
        }
    }

    #[test]
    fn reading_a_grammar_is_linear() {
        // A comment opened at every brace was read to the end of its line at each: 16 KB took
        // 41 ms, 4 MiB hours.
        // Here 400 KB: read linearly, milliseconds (no time is asserted: a quadratic read
        // would take minutes, and the run with it).
        let text = "{#".repeat(200_000);
        assert_eq!(allowed("guided_grammar", json!(text)), None);
    }

    #[test]
    fn a_repeat_of_no_most_is_a_loop() {
        let tag = |max: i64| {
            json!({"type": "structural_tag", "format": {"type": "repeat", "min": 0, "max": max,
                "content": {"type": "const_string", "value": "a"}}})
        };
        assert_eq!(allowed("response_format", tag(-1)), None);
        assert_eq!(
            allowed("response_format", tag(-2)),
            Some(Refusal::Count(u64::MAX))
        );
    }

    #[test]
    fn a_regex_weighs_what_it_unrolls_to() {
        for (pattern, w) in [
            ("^[a-z]{1,128}$", 128),
            ("^[a-z]{1,129}$", 129),
            ("^[a-z]{1,128}[a-z]{0,128}$", 256),
            ("^([a-z]{1,16}){1,16}$", 256),
            ("([a-z]{1,16} ){0,20}", 340),
            ("([a-z]{1,16} )*", 17),
            ("(ab|cd){0,100000}", 400_000),
            ("^\\d{4}-\\d{2}-\\d{2}$", 10),
            (
                "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
                36,
            ),
            ("^[a-zA-Z_][a-zA-Z0-9_]{0,63}$", 64),
            ("^\\+?[0-9]{7,15}$", 19),
            ("[]a]{2}\\{500}", 7),
            ("(?:x){200}", 200),
            ("a{1,200}?", 200),
            // Flags and comments weigh nothing and hide nothing; a `)` that closes nothing is
            // past every bound.
            ("(?i)[a-z]{1,300}", 300),
            ("(?#c)[a-z]{1,300}", 300),
            ("a)[a-z]{1,300}", u64::MAX),
        ] {
            assert_eq!(weight(pattern), w, "{pattern}");
        }
        let optionals = "[a-z]?".repeat(50);
        assert_eq!(weight(&optionals), 200);
        assert_eq!(
            refused(
                "guided_json",
                json!({"type": "string", "pattern": optionals})
            ),
            Some(Refusal::Weight(200))
        );
        assert_eq!(
            refused(
                "guided_json",
                json!({"patternProperties": {"^([a-z]{1,16}){1,16}$": {}}})
            ),
            Some(Refusal::Weight(256))
        );
        assert_eq!(
            allowed("guided_regex", json!("([a-z]{1,16} ){0,20}")),
            Some(Refusal::Weight(340))
        );
    }

    #[test]
    fn what_is_within_the_bound_or_is_data_passes() {
        for (field, guide) in [
            (
                "guided_json",
                json!({"type": "array", "maxItems": 128, "items": {"maxLength": 100000}}),
            ),
            (
                "guided_json",
                json!({"type": "string", "minLength": 1000, "description": "about {1000} words"}),
            ),
            (
                "guided_json",
                json!({"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}$"}),
            ),
            (
                "guided_json",
                json!({"default": {"maxItems": 500}, "examples": [{"minItems": 900}],
                "enum": [{"type": "regex"}], "const": {"pattern": "a{1,9999}"}}),
            ),
            ("guided_choice", json!(["{1000}", "b"])),
            ("structured_outputs", json!({"json": {"enum": ["x{999}"]}})),
        ] {
            assert_eq!(refused(field, guide.clone()), None, "{field}: {guide}");
        }
    }
}

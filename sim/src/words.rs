//! The simulator's output words: one filler word per output token, by position (" the",
//! " loop", ...), the text of a position range, how many a text holds, and the token id each
//! word is generated as. A leaf: the engine hashes output blocks with these ids, and the API
//! renders and counts the text.

const WORDS: &[&str] = &[
    " the",
    " loop",
    " returns",
    " value",
    " because",
    " function",
    " type",
    " error",
    " of",
    " variable",
    " is",
    " a",
    " call",
    " list",
    " index",
    " and",
    " string",
    " when",
    " it",
    " compiler",
    " checks",
    " each",
    " branch",
    " so",
    " you",
    " can",
    " see",
    " why",
    " test",
    " fails",
    " here",
    " now",
];

/// Text of the output tokens at positions `from..to` (0-based), one word each.
pub fn words(from: u32, to: u32) -> String {
    let mut s = String::new();
    for i in from..to {
        s.push_str(WORDS[i as usize % WORDS.len()]);
    }
    s
}

/// The token id of output word `i` (0-based), as the engine generated it: one token per word
/// (the id the heuristic gives the word's first piece). A continued answer's prompt carries
/// these ids for the words it continues (`crate::api::request::continued_ids`), so its blocks
/// hash as the original's output blocks did.
pub fn word_token(i: u32) -> u32 {
    let word = WORDS[i as usize % WORDS.len()];
    tutor_wire::tokens::heuristic_ids(word, false)
        .first()
        .copied()
        .unwrap_or(0)
}

/// How many output words `text` holds from the start of the output (`words(0, n)` holds `n`):
/// the position a continued answer goes on from. Text that is not the simulator's output
/// holds 0.
pub fn words_in(text: &str) -> u32 {
    words_in_from(text, 0)
}

/// How many output words `text` holds from output position `start` on (`words(start, start +
/// n)` holds `n`): a reasoning model's answer starts after its reasoning.
pub fn words_in_from(text: &str, start: u32) -> u32 {
    let (mut rest, mut n) = (text, 0u32);
    while let Some(r) =
        rest.strip_prefix(WORDS[(start as usize).saturating_add(n as usize) % WORDS.len()])
    {
        rest = r;
        n += 1;
    }
    n
}

//! Byte-level BPE tokenizers trained here with each accepted pre-tokenizer: the pair bound
//! never undercounts and decides a 300-token question without tokenizing; the hand-written
//! pre-tokenizer counts exactly what `encode` counts.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use serde_json::Value;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::normalizers::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::Split;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use super::pair_bound::{PairBound, PATTERNS};
use super::*;
use crate::config::Config;
use crate::lane::Lane;
use tutor_wire::stats::SplitMix as Rng;

/// Words of a few common letters (so the vocabulary merges nearly every pair of them) and
/// tutoring prose and code.
fn corpus(rng: &mut Rng) -> Vec<String> {
    const LETTERS: &[u8] = b"etaoinsrhdluTSA";
    const PROSE: &[&str] = &[
        "Why doesn't the loop stop when the list is empty? I've checked it twice.",
        "fn main() { let total: u32 = items.iter().map(|x| x.price).sum(); println!(\"{total}\"); }",
        "    if value is None:\n        raise ValueError(\"they're missing\")\n",
        "The borrow checker says you'll need a reference here; we'd rather clone it.",
        "Line 1234: expected 2026 items, got 42 at offset 123456; retried 100 times in 2026.",
    ];
    (0..3000)
        .map(|i| {
            if i % 3 == 0 {
                PROSE[i % PROSE.len()].to_string()
            } else {
                (0..12)
                    .map(|_| {
                        let n = 2 + rng.below(7);
                        (0..n)
                            .map(|_| LETTERS[rng.below(LETTERS.len())] as char)
                            .collect::<String>()
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            }
        })
        .collect()
}

/// A byte-level BPE (vocabulary 1,500) trained with `pre_tokenizer` (and NFC when `nfc`), with
/// the special tokens Qwen-style chat templates use; saved to a temp file, returned with its
/// JSON.
fn trained(name: &str, pre_tokenizer: PreTokenizerWrapper, nfc: bool) -> (PathBuf, Value) {
    let mut tokenizer = Tokenizer::new(BPE::default());
    tokenizer.with_pre_tokenizer(Some(pre_tokenizer));
    if nfc {
        tokenizer.with_normalizer(Some(NFC));
    }
    tokenizer.with_decoder(Some(ByteLevel::default()));
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .show_progress(false)
        .vocab_size(1500)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build()
        .into();
    let lines = corpus(&mut Rng::new(7));
    tokenizer
        .train(&mut trainer, lines.iter())
        .expect("training a BPE");
    tokenizer.add_special_tokens(&[
        AddedToken::from("<|im_start|>", true),
        AddedToken::from("<|im_end|>", true),
    ]);
    let dir = std::env::temp_dir().join(format!("tutor-gateway-pairs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.json"));
    tokenizer.save(&path, false).unwrap();
    let json = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    (path, json)
}

fn split_then_bytes(pattern: &str) -> PreTokenizerWrapper {
    let split = Split::new(
        tokenizers::pre_tokenizers::split::SplitPattern::Regex(pattern.into()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .unwrap();
    Sequence::new(vec![
        split.into(),
        ByteLevel::new(false, true, false).into(),
    ])
    .into()
}

/// GPT-2 style (`ByteLevel` with its regex), then Llama 3's and Qwen 2's `Split` + NFC. Trained
/// and saved once per test binary: tests running in parallel never write the same file.
fn accepted_tokenizers() -> Vec<(PathBuf, Value)> {
    static TRAINED: OnceLock<Vec<(PathBuf, Value)>> = OnceLock::new();
    TRAINED
        .get_or_init(|| {
            vec![
                trained("gpt2", ByteLevel::new(false, true, true).into(), false),
                trained("llama3", split_then_bytes(PATTERNS[1]), true),
                trained("qwen2", split_then_bytes(PATTERNS[2]), true),
            ]
        })
        .clone()
}

/// Text aimed at the bound's edges: runs of merged letters, contractions, spaces before
/// letters and runs of spaces, digits, punctuation, newlines and tabs, non-ASCII letters,
/// combining marks that NFC composes with the letter before, emoji, and special tokens.
fn adversarial(rng: &mut Rng) -> String {
    const PIECES: &[&str] = &[
        "e",
        "t",
        "a",
        "o",
        "i",
        "n",
        "s",
        "r",
        "h",
        "th",
        "the",
        "an",
        "T",
        "S",
        "A",
        " ",
        "  ",
        "    ",
        "'",
        "'s",
        "'t",
        "'re",
        "'ll",
        "'ve",
        "'d",
        "'m",
        "'S",
        "0",
        "7",
        "42",
        ".",
        ",",
        "(",
        ")",
        "{",
        "_",
        "\n",
        "\n\n",
        "\t",
        "\r\n",
        "é",
        "ß",
        "\u{301}",
        "\u{308}",
        "🦀",
        "<|im_start|>",
        "<|im_end|>",
        "ñ",
        "e\u{301}",
        "Å",
    ];
    let n = 1 + rng.below(120);
    (0..n).map(|_| PIECES[rng.below(PIECES.len())]).collect()
}

#[test]
fn the_bound_is_never_below_the_real_count() {
    let mut rng = Rng::new(42);
    for (path, json) in accepted_tokenizers() {
        let bound = PairBound::from_tokenizer_json(&json)
            .unwrap_or_else(|why| panic!("{}: {why}", path.display()));
        let tokenizer = Tokenizer::from_file(&path).unwrap();
        let mut texts: Vec<String> = corpus(&mut Rng::new(9)).into_iter().take(300).collect();
        texts.extend((0..4000).map(|_| adversarial(&mut rng)));
        let (mut tight, mut bytes) = (0u64, 0u64);
        for (i, text) in texts.iter().enumerate() {
            let real = tokenizer.encode_fast(text.as_str(), false).unwrap().len() as u64;
            let upper = bound.upper(text);
            assert!(
                upper >= real,
                "{}: bound {upper} < {real} tokens for {text:?}",
                path.display()
            );
            if i < 300 {
                tight += upper;
                bytes += text.len() as u64;
            }
        }
        // On words and prose the constraint bites: well under one token a byte.
        assert!(
            tight * 10 < bytes * 8,
            "{}: bound {tight} for {bytes} bytes",
            path.display()
        );
    }
}

/// A chat of one user message with `text`.
fn user_turn(text: &str) -> PromptInput {
    PromptInput::chat(
        vec![ChatMessage {
            role: "user".into(),
            content: Some(MessageContent::Text(text.to_owned())),
            name: None,
            tool_calls: None,
            tool_call_id: None,
            reasoning: None,
            reasoning_content: None,
        }],
        None,
        16_384,
    )
}

#[test]
fn a_three_hundred_token_question_is_small_without_tokenizing() {
    let (path, _) = &accepted_tokenizers()[2];
    let counter = TokenCounter::from_file(path).unwrap();
    // About 1.1 KB: too long for one token a byte to settle the small lane with 120 out.
    let mut question = String::new();
    for line in corpus(&mut Rng::new(11)) {
        if question.len() > 1100 {
            break;
        }
        question.push_str(&line);
        question.push(' ');
    }
    // Not ASCII: an ASCII question would be counted the fast way instead (`pieces.rs`).
    question.push_str("caf\u{e9}");
    let input = user_turn(&question);
    let exact = counter.count_input(&input);
    assert!(
        question.len() > 1200 - 120,
        "one token a byte would not settle it: {} bytes",
        question.len()
    );
    let classifier = Classifier::with_counter(&Config::default(), counter);
    let c = classifier.classify_blocking(&input, Some(120)).unwrap();
    assert_eq!(c.lane, Lane::Small);
    assert!(!c.exact(), "decided from the bytes: {c:?}");
    assert!(
        c.input_tokens_estimate >= exact,
        "the reservation {} covers the {exact} tokens",
        c.input_tokens_estimate
    );
    // The async path decides the same way.
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let again = rt
        .block_on(classifier.classify(Arc::new(input), Some(120)))
        .unwrap();
    assert_eq!(again, c);
}

/// One change to a tokenizer's JSON.
type Change = fn(&mut Value);

#[test]
fn other_tokenizers_keep_the_generic_bound() {
    let (_, qwen) = &accepted_tokenizers()[2];
    let variants: [(&str, Change); 5] = [
        (
            "another pattern",
            (|j: &mut Value| {
                j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\w+|\W".into()
            }),
        ),
        (
            "dropout",
            (|j: &mut Value| j["model"]["dropout"] = 0.1.into()),
        ),
        (
            "NFKC",
            (|j: &mut Value| j["normalizer"] = serde_json::json!({"type": "NFKC"})),
        ),
        (
            "a letter-edged added token",
            (|j: &mut Value| {
                j["added_tokens"][0]["content"] = "INST".into();
            }),
        ),
        (
            "WordPiece",
            (|j: &mut Value| j["model"]["type"] = "WordPiece".into()),
        ),
    ];
    for (what, change) in variants {
        let mut json = qwen.clone();
        change(&mut json);
        assert!(
            PairBound::from_tokenizer_json(&json).is_err(),
            "{what}: must not use the pair bound"
        );
    }
    // Through the counter: the heuristic has no pair bound, a rejected tokenizer neither.
    assert_eq!(
        TokenCounter::Heuristic.pair_bound(&PromptInput::Prompt("x".into())),
        None
    );
    let mut json = qwen.clone();
    json["model"]["dropout"] = 0.1.into();
    let path =
        std::env::temp_dir().join(format!("tutor-gateway-dropout-{}.json", std::process::id()));
    std::fs::write(&path, json.to_string()).unwrap();
    let counter = TokenCounter::from_file(&path).unwrap();
    assert_eq!(counter.pair_bound(&PromptInput::Prompt("the".into())), None);
}

/// ASCII text aimed at the hand-written pre-tokenizer: every character class, contractions in
/// every case, runs of digits and of every kind of whitespace, control characters.
fn ascii_adversarial(rng: &mut Rng) -> String {
    const PIECES: &[&str] = &[
        "e", "th", "the", "The", "SAT", "x", " ", "  ", "   ", "\t", "\n", "\r", "\r\n", "\n\n",
        " \n", "\x0b", "\x0c", "\x1c", "\x00", "\x7f", "'", "'s", "'S", "'t", "'re", "'RE", "'Ve",
        "'ll", "'lL", "'d", "'m", "'x", "0", "12", "2026", "1234567", ".", ",", "(", ")", "{}",
        "::", "->", "_", "\"", "#", "<", "|", "!=", " (", " .", " 'x",
    ];
    let n = 1 + rng.below(150);
    (0..n).map(|_| PIECES[rng.below(PIECES.len())]).collect()
}

#[test]
fn the_hand_written_pre_tokenizer_counts_what_encode_counts() {
    let mut rng = Rng::new(5);
    let mut tokenizers = accepted_tokenizers();
    // Llama 3 sets ignore_merges: a piece in the vocabulary is one token without merging.
    let (path, mut json) = tokenizers[1].clone();
    json["model"]["ignore_merges"] = true.into();
    let ignoring = path.with_file_name("llama3-ignore-merges.json");
    std::fs::write(&ignoring, json.to_string()).unwrap();
    tokenizers.push((ignoring, json.clone()));
    // Qwen 2's single digits over a vocabulary that merges digits (Llama 3's pieces trained it).
    json["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = PATTERNS[2].into();
    let single_digits = path.with_file_name("qwen2-over-digit-merges.json");
    std::fs::write(&single_digits, json.to_string()).unwrap();
    tokenizers.push((single_digits, json));
    for (path, _) in tokenizers {
        let counter = TokenCounter::from_file(&path).unwrap();
        let mut texts: Vec<String> = (0..3000).map(|_| ascii_adversarial(&mut rng)).collect();
        texts.extend((0..500).map(|_| adversarial(&mut rng)));
        texts.extend(corpus(&mut Rng::new(3)).into_iter().take(300));
        let mut quick = 0;
        for text in &texts {
            let input = PromptInput::Prompt(text.clone());
            let want = counter.count_text_encoded(text) as u32;
            assert_eq!(
                counter.count_text(text),
                want,
                "{}: {text:?}",
                path.display()
            );
            if let Some(n) = counter.count_quick(&input) {
                assert_eq!(n, want, "{}: {text:?}", path.display());
                quick += 1;
            }
        }
        // Every ASCII text without a chat-template marker went the fast way.
        assert!(quick >= 3300, "{}: {quick} fast counts", path.display());
    }
}

/// A count that learns new pieces while another count reads the cache (a long prompt on the
/// blocking pool) returns without waiting for it: a short prompt is counted on an async worker,
/// which a wait for the write lock would stall, with every later reader queued behind it.
#[test]
fn a_count_never_waits_for_the_cache_another_count_reads() {
    let (path, json) = accepted_tokenizers()[1].clone();
    let tokenizer = Arc::new(Tokenizer::from_file(&path).unwrap());
    let fast = Arc::new(super::pieces::FastCount::new(tokenizer, &json).expect("llama3 pattern"));
    let held = fast.reading();
    let (tx, rx) = std::sync::mpsc::channel();
    let counting = Arc::clone(&fast);
    std::thread::spawn(move || {
        let _ = tx.send(counting.count("novel words never counted before"));
    });
    // Generous on any machine: without the fix it never returns while the cache is read.
    let counted = rx.recv_timeout(std::time::Duration::from_secs(60));
    drop(held);
    assert!(matches!(counted, Ok(Some(n)) if n > 0), "{counted:?}");
    // Once nobody reads, it learns: the same text again is counted the same.
    assert_eq!(
        fast.count("novel words never counted before"),
        counted.unwrap()
    );
}

/// A normalizer can grow the text before it is split: NFC up to three times the bytes of
/// non-ASCII text (U+1D160, 4 bytes, decomposes into 12), NFKC up to eleven (U+FDFA, 3 bytes,
/// into 33). A request of such characters that one token a byte of its raw text put in the
/// small lane reserved a third of what the tokenizer counts; its reservation now covers the
/// count, however it was decided.
#[test]
fn text_a_normalizer_grows_is_never_reserved_below_its_count() {
    let (_, qwen) = &accepted_tokenizers()[2];
    let mut nfkc = qwen.clone();
    nfkc["normalizer"] = serde_json::json!({"type": "NFKC"});
    let nfkc_path =
        std::env::temp_dir().join(format!("tutor-gateway-nfkc-{}.json", std::process::id()));
    std::fs::write(&nfkc_path, nfkc.to_string()).unwrap();
    let nfc_path = accepted_tokenizers()[2].0.clone();
    for (path, text) in [
        (&nfc_path, "\u{1D160}".repeat(160)),
        (&nfc_path, "\u{FB2C}".repeat(200)),
        (&nfkc_path, "\u{FDFA}".repeat(200)),
    ] {
        let counter = TokenCounter::from_file(path).unwrap();
        let input = user_turn(&text);
        let exact = counter.count_input(&input);
        assert!(
            u64::from(exact) > text.len() as u64 + 20,
            "{}: the normalizer grows it past one token a byte: {exact} for {} bytes",
            path.display(),
            text.len()
        );
        let classifier = Classifier::with_counter(&Config::default(), counter);
        let c = classifier.classify_blocking(&input, Some(120)).unwrap();
        assert!(
            c.input_tokens_estimate >= exact,
            "{}: {c:?} reserves less than the {exact} tokens",
            path.display()
        );
    }
}

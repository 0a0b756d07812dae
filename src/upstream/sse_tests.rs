use super::*;

fn all(p: &mut SseParser) -> Vec<String> {
    std::iter::from_fn(|| p.pop())
        .map(|b| String::from_utf8(b.to_vec()).unwrap())
        .collect()
}

fn parse_whole(input: &[u8]) -> Vec<String> {
    let mut p = SseParser::default();
    p.feed(input).unwrap();
    all(&mut p)
}

/// Feeds `input` split at every possible position into two reads, and byte by byte; every way
/// must give the same events as one read.
fn assert_split_invariant(input: &[u8], expected: &[&str]) {
    assert_eq!(parse_whole(input), expected, "whole");
    for cut in 0..=input.len() {
        let mut p = SseParser::default();
        p.feed(&input[..cut]).unwrap();
        let mut got = all(&mut p);
        p.feed(&input[cut..]).unwrap();
        got.extend(all(&mut p));
        assert_eq!(got, expected, "split at byte {cut}");
    }
    let mut p = SseParser::default();
    let mut got = Vec::new();
    for b in input {
        p.feed(std::slice::from_ref(b)).unwrap();
        got.extend(all(&mut p));
    }
    assert_eq!(got, expected, "byte by byte");
    // And with an empty read between every two bytes (a transport may deliver one).
    let mut p = SseParser::default();
    let mut got = Vec::new();
    for b in input {
        p.feed(std::slice::from_ref(b)).unwrap();
        p.feed(&[]).unwrap();
        got.extend(all(&mut p));
    }
    assert_eq!(got, expected, "byte by byte, empty reads between");
}

#[test]
fn vllm_stream_parses_at_every_split_point() {
    let input = b"data: {\"a\":1}\n\ndata: {\"b\":2}\n\ndata: [DONE]\n\n";
    assert_split_invariant(input, &["{\"a\":1}", "{\"b\":2}", "[DONE]"]);
}

#[test]
fn crlf_line_endings_split_between_cr_and_lf() {
    let input = b"data: one\r\n\r\ndata: two\r\n\r\n";
    assert_split_invariant(input, &["one", "two"]);
}

/// A `\r`, an empty read, then the `\n`: one line ending, not two (the second used to end
/// the event early, splitting one event's data in two).
#[test]
fn an_empty_read_between_cr_and_lf_is_one_line_ending() {
    let mut p = SseParser::default();
    for read in [&b"data: a\r"[..], b"", b"\ndata: b\r\n\r\n"] {
        p.feed(read).unwrap();
    }
    assert_eq!(all(&mut p), ["a\nb"]);
}

#[test]
fn bare_cr_line_endings() {
    assert_split_invariant(b"data: one\r\rdata: two\r\r", &["one", "two"]);
}

#[test]
fn mixed_line_endings_in_one_stream() {
    assert_split_invariant(b"data: a\r\n\ndata: b\n\r\ndata: c\r\r", &["a", "b", "c"]);
}

#[test]
fn utf8_character_split_across_reads() {
    let input = "data: {\"content\":\"grüße 🦀\"}\n\n".as_bytes();
    assert_split_invariant(input, &["{\"content\":\"grüße 🦀\"}"]);
    // A cut inside the four-byte crab leaves an incomplete character in the first read.
    let crab = input.iter().position(|b| *b == 0xF0).unwrap();
    let mut p = SseParser::default();
    p.feed(&input[..crab + 2]).unwrap();
    assert!(p.pop().is_none());
    p.feed(&input[crab + 2..]).unwrap();
    assert_eq!(all(&mut p), ["{\"content\":\"grüße 🦀\"}"]);
}

#[test]
fn several_events_in_one_read() {
    let input = b"data: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4";
    let mut p = SseParser::default();
    p.feed(input).unwrap();
    assert_eq!(all(&mut p), ["1", "2", "3"]);
    assert!(p.has_partial_event());
    p.feed(b"\n\n").unwrap();
    assert_eq!(all(&mut p), ["4"]);
    assert!(!p.has_partial_event());
}

#[test]
fn comments_event_id_and_retry_lines_are_ignored() {
    let input = b": keep-alive\n\nevent: message\nid: 7\nretry: 100\ndata: x\n\n:tail\n\n";
    assert_split_invariant(input, &["x"]);
}

#[test]
fn multi_line_data_is_joined_with_newlines() {
    assert_split_invariant(b"data: {\"a\":\ndata: 1}\n\n", &["{\"a\":\n1}"]);
    assert_split_invariant(b"data:a\ndata:\ndata:b\n\n", &["a\n\nb"]);
}

#[test]
fn only_one_leading_space_is_stripped_and_no_colon_means_empty_value() {
    assert_split_invariant(b"data:  two spaces\n\n", &[" two spaces"]);
    assert_split_invariant(b"data\ndata: x\n\n", &["\nx"]);
}

#[test]
fn empty_data_and_blank_lines_dispatch_nothing() {
    assert_split_invariant(b"\n\n\ndata:\n\n\r\n", &[]);
}

#[test]
fn partial_event_at_end_of_stream_is_not_emitted() {
    let mut p = SseParser::default();
    p.feed(b"data: [DONE]\n").unwrap();
    assert!(p.pop().is_none());
    assert!(p.has_partial_event());
}

#[test]
fn oversized_event_is_an_error_and_the_parser_stays_failed() {
    let mut p = SseParser::new(64);
    p.feed(b"data: ok\n\n").unwrap();
    let long = vec![b'x'; 100];
    let err = p.feed(&long).unwrap_err();
    assert_eq!(err, SseError::EventTooLarge { limit: 64 });
    // Events completed before the error are still handed out.
    assert_eq!(all(&mut p), ["ok"]);
    assert!(p.feed(b"\n\ndata: more\n\n").is_err());
    assert!(p.pop().is_none());
}

#[test]
fn many_data_lines_cannot_exceed_the_cap_either() {
    let mut p = SseParser::new(64);
    let err = (0..100).find_map(|_| p.feed(b"data: 0123456789\n").err());
    assert_eq!(err, Some(SseError::EventTooLarge { limit: 64 }));
}

#[test]
fn a_line_never_terminated_hits_the_cap_across_reads() {
    let mut p = SseParser::new(1000);
    let mut failed = false;
    for _ in 0..100 {
        if p.feed(b"data: aaaaaaaaaaaaaaaaaaaa").is_err() {
            failed = true;
            break;
        }
    }
    assert!(failed);
}

#[test]
fn an_event_exactly_at_the_cap_is_accepted() {
    let mut p = SseParser::new(16);
    // "data: " (6) + 10 payload bytes = 16 bytes of line.
    p.feed(b"data: 0123456789\n\n").unwrap();
    assert_eq!(all(&mut p), ["0123456789"]);
}

/// The spec drops one byte-order mark at the stream's start; read as part of the first line's
/// field name, it lost the first event (the role chunk the cut chunks take their id from).
#[test]
fn a_byte_order_mark_at_the_start_is_dropped_however_it_is_split() {
    assert_split_invariant(b"\xEF\xBB\xBFdata: a\n\ndata: b\n\n", &["a", "b"]);
    // Only at the start: later, it is part of a line (here an unknown field, ignored).
    assert_split_invariant(
        b"data: a\n\n\xEF\xBB\xBFdata: b\n\ndata: c\n\n",
        &["a", "c"],
    );
    // A start that is not a whole mark is the first line's.
    assert_split_invariant(b"\xEF\xBBdata: a\n\ndata: b\n\n", &["b"]);
}

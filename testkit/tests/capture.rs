//! `capture_logs` keeps a line that another thread, with no subscriber, reached first
//! (tokio-rs/tracing#3611: with one dispatcher in the process, that thread's "nobody listens"
//! was cached as the line's interest, and the capturing test lost the line). Alone in its own
//! binary, so no other test's dispatcher hides the bug.

use std::sync::mpsc;

fn the_line(n: u32) {
    tracing::warn!(n, "a line two threads reach");
}

#[test]
fn a_line_first_reached_by_a_thread_without_a_subscriber_is_still_captured() {
    let (captured, guard) = tutor_testkit::capture_logs(tracing::Level::INFO);
    // Another thread, without a subscriber, reaches the line first, while this one captures.
    let (done, reached) = mpsc::channel();
    std::thread::spawn(move || {
        the_line(1);
        done.send(()).unwrap();
    });
    reached.recv().unwrap();
    the_line(2);
    drop(guard);
    let text = captured.text();
    assert!(
        text.contains("a line two threads reach") && text.contains("n=2"),
        "the capturing thread's line is kept: {text:?}"
    );
    assert!(!text.contains("n=1"), "the other thread's is not: {text:?}");
}

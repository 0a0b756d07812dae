//! What the code under test logs, kept as text.

use std::sync::{Arc, Mutex};

/// Everything logged while the guard of [`capture_logs`] lives, as plain text (no ANSI).
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    /// The text logged so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Captures this thread's logs at `level` and above until the guard drops: a
/// `#[tokio::test]` runtime has one thread, so everything the gateway and the simulator log in
/// the test lands here.
pub fn capture_logs(level: tracing::Level) -> (Captured, tracing::subscriber::DefaultGuard) {
    // tracing-core 0.1 decides a log line's interest once, when the line is first reached. While
    // exactly one dispatcher exists in the process it asks the reaching thread's default, so a
    // line first reached by another test's thread (no subscriber) while this capture was the
    // only dispatcher was cached as "never": this test then lost that line
    // (tokio-rs/tracing#3611). A second dispatcher that lives as long as the process keeps
    // every interest the union of all of them.
    static KEEP_TWO: std::sync::OnceLock<tracing::Dispatch> = std::sync::OnceLock::new();
    KEEP_TWO.get_or_init(|| tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default()));
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    (captured, tracing::subscriber::set_default(subscriber))
}

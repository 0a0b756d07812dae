//! The process's panic report: where a panic happened, on which thread, and its message only
//! when that is a plain literal (`panic!("…")` without arguments, `unwrap()` on `None`). A
//! formatted message (`expect`'s, `Result::unwrap`'s with its error, any `panic!` with
//! arguments) is withheld: it can quote request data (a string slice out of bounds names the
//! string it cut, so a bug in counting a prompt would print that prompt), and the log never
//! carries prompt text. Written to stderr at once, as one line (and the backtrace when
//! `RUST_BACKTRACE` asks for one), not through the diagnostic log's queue: a panic may be the
//! process's last act, and one inside the logging must not enter it again.

use std::any::Any;
use std::io::Write;

/// Installs the report as the panic hook, in place of the standard one, which prints every
/// message whole.
pub fn install() {
    std::panic::set_hook(Box::new(|info| {
        let location = info
            .location()
            .map_or_else(|| "unknown".to_owned(), ToString::to_string);
        let thread = std::thread::current();
        let line = format!(
            "tutor-gateway: panicked at {location} on thread '{}': {}",
            thread.name().unwrap_or("unnamed"),
            message(info.payload())
        );
        let backtrace = std::backtrace::Backtrace::capture();
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "{line}");
        if backtrace.status() == std::backtrace::BacktraceStatus::Captured {
            let _ = writeln!(err, "{backtrace}");
        }
    }));
}

/// A panic's message as it may be logged: a literal as it is, anything formatted withheld.
pub fn message(payload: &(dyn Any + Send)) -> &'static str {
    match payload.downcast_ref::<&'static str>() {
        Some(literal) => literal,
        None => "(withheld: a formatted message may quote request data)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_literal_is_told_and_a_formatted_message_is_not() {
        let literal = std::panic::catch_unwind(|| panic!("a literal")).unwrap_err();
        assert_eq!(message(&*literal), "a literal");
        let prompt = String::from("my secret homework");
        let formatted =
            std::panic::catch_unwind(move || prompt[..prompt.len() + 1].len()).unwrap_err();
        assert!(!message(&*formatted).contains("secret"));
    }
}

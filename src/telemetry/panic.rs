//! The process's panic report: where a panic happened, on which thread, and its message only
//! when that is a literal (`panic!("…")`, `expect("…")`). A formatted message is withheld: it
//! can quote request data (a string slice out of bounds names the string it cut, so a bug in
//! counting a prompt would print that prompt), and the log never carries prompt text. Written
//! through `tracing` (the diagnostic log) at `error`, with the backtrace when `RUST_BACKTRACE`
//! asks for one.

use std::any::Any;

/// Installs [`report`] as the panic hook (in place of the standard one, which prints every
/// message whole).
pub fn install() {
    std::panic::set_hook(Box::new(|info| {
        let location = info
            .location()
            .map_or_else(|| "unknown".to_owned(), ToString::to_string);
        let thread = std::thread::current();
        let backtrace = std::backtrace::Backtrace::capture();
        tracing::error!(
            thread = thread.name().unwrap_or("unnamed"),
            %location,
            message = message(info.payload()),
            backtrace = %backtrace,
            "panicked"
        );
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

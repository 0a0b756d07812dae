//! The process's panic report: where a panic happened, on which thread, and its message only
//! when that is a plain literal (`panic!("…")` without arguments, `unwrap()` on `None`). A
//! formatted message (`expect`'s, `Result::unwrap`'s with its error, any `panic!` with
//! arguments) is withheld: it can quote request data (a string slice out of bounds names the
//! string it cut, so a bug in counting a prompt would print that prompt), and the log never
//! carries prompt text. Written to stderr at once, as one line (and the backtrace when
//! `RUST_BACKTRACE` asks for one), not through the diagnostic log's queue: a panic may be the
//! process's last act, and one inside the logging must not enter it again.
//!
//! [`Background`]: the gateway's long-lived background tasks (the Redis quota's heartbeat,
//! releaser and listeners, the job scheduler and sweeper, a job's run past its own catch, the
//! replicas' health checks, the engines' capacity watcher, the autopilot, the config watcher),
//! each watched: one that panics (a bug) is counted and logged, and takes the replica's
//! `/healthz` and `/readyz` to 503, so that it is restarted rather than left serving without
//! it (a dead releaser would leave each finished request's seat held in Redis until its lease
//! ran out; a dead scheduler would start no job).

use std::any::Any;
use std::future::Future;
use std::io::Write;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, OnceLock};

use futures::FutureExt;
use prometheus::IntCounterVec;

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

/// The background tasks' watch of one gateway (a cheap handle): the first task that panicked.
#[derive(Debug, Clone)]
pub struct Background {
    failed: Arc<OnceLock<&'static str>>,
    /// `tutor_gateway_panics_total`, counted `at="background"`.
    panics: IntCounterVec,
}

impl Background {
    /// A watch that counts in `panics` (`tutor_gateway_panics_total`).
    pub fn new(panics: IntCounterVec) -> Self {
        Self {
            failed: Arc::default(),
            panics,
        }
    }

    /// A watch of its own, counted in no gateway's registry (components built alone, as in
    /// tests).
    pub fn detached() -> Self {
        Self::new(
            IntCounterVec::new(
                prometheus::Opts::new("tutor_gateway_panics_total", "detached"),
                &["at"],
            )
            .expect("valid counter"),
        )
    }

    /// `task` (named `name` in the log and the probes), watched: it runs as it would, and a
    /// panic in it is counted, logged and kept as this gateway's failure ([`Background::failed`]).
    pub fn watch(
        &self,
        name: &'static str,
        task: impl Future<Output = ()> + Send + 'static,
    ) -> impl Future<Output = ()> + Send + 'static {
        let me = self.clone();
        async move {
            if let Err(panic) = AssertUnwindSafe(task).catch_unwind().await {
                me.panics.with_label_values(&["background"]).inc();
                tracing::error!(
                    task = name,
                    panic = message(&*panic),
                    "a background task panicked: /healthz and /readyz now answer 503, so that \
                     this replica is restarted"
                );
                let _ = me.failed.set(name);
            }
        }
    }

    /// The first background task that panicked, if any.
    pub fn failed(&self) -> Option<&'static str> {
        self.failed.get().copied()
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

    #[tokio::test]
    async fn a_background_task_that_panics_is_counted_and_kept_as_the_failure() {
        let panics = IntCounterVec::new(prometheus::Opts::new("p", "p"), &["at"]).unwrap();
        let background = Background::new(panics.clone());
        background.watch("steady", async {}).await;
        assert_eq!(
            background.failed(),
            None,
            "a task that ends well is no failure"
        );
        background
            .watch("releaser", async { panic!("a bug") })
            .await;
        background
            .watch("listener", async { panic!("another") })
            .await;
        assert_eq!(
            background.failed(),
            Some("releaser"),
            "the first one is told"
        );
        assert_eq!(panics.with_label_values(&["background"]).get(), 2);
    }
}

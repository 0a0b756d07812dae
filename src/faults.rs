//! Faults the unit tests inject (compiled into test builds only): a request whose engine cap
//! (`max_tokens`, `/answer`'s `max_output_tokens`) is one of these values panics at that point,
//! and so does the autopilot's loop of a gateway configured with [`AUTOPILOT_PANICS_EVERY`], and
//! a job's finish (storing its outcome) with [`JOB_FINISH_PANICS_TTL`], so
//! the tests can show what a bug there costs a client and the gateway (`crate::server`'s
//! `panic_tests`).

/// Panics in the send step, after admission (a seat and tokens held), before the engine is
/// asked.
pub const PANICS_BEFORE_SEND: u32 = 311;

/// Panics in the relay once the engine's second content chunk arrived (the response began).
pub const PANICS_MID_STREAM: u32 = 307;

/// The send step's fault.
pub fn before_send(engine_cap: Option<u32>) {
    if engine_cap == Some(PANICS_BEFORE_SEND) {
        panic!("a fault injected by a test: before the send");
    }
}

/// The relay's fault, at each event read after `chunks` content chunks.
pub fn mid_stream(engine_cap: Option<u32>, chunks: u32) {
    if engine_cap == Some(PANICS_MID_STREAM) && chunks >= 2 {
        panic!("a fault injected by a test: mid-stream");
    }
}

/// An `autopilot.interval` at which the autopilot's loop panics at its first look.
pub const AUTOPILOT_PANICS_EVERY: std::time::Duration = std::time::Duration::from_millis(313);

/// The autopilot loop's fault.
pub fn autopilot(interval: std::time::Duration) {
    if interval == AUTOPILOT_PANICS_EVERY {
        panic!("a fault injected by a test: in the autopilot");
    }
}

/// A `jobs.result_ttl` at which a job's finish (storing its outcome, after its run's own
/// catch) panics.
pub const JOB_FINISH_PANICS_TTL: std::time::Duration = std::time::Duration::from_millis(317);

/// The job finish's fault.
pub fn job_finish(result_ttl: std::time::Duration) {
    if result_ttl == JOB_FINISH_PANICS_TTL {
        panic!("a fault injected by a test: in a job's finish");
    }
}

/// A point where a test may run a hook while an async step is out, by replica id (tests
/// running at once each set their own).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Point {
    /// `Shared::adopt_fallback`, between taking the list of leases it registers and sending it.
    Adopting,
    /// The autopilot's hand-back on the Redis quota, between reading the configuration it
    /// hands back and publishing it.
    HandingBack,
}

type Hook = Box<dyn FnOnce() + Send>;
static HOOKS: std::sync::Mutex<Vec<(Point, String, Hook)>> = std::sync::Mutex::new(Vec::new());

/// Runs `f` when replica `replica` next reaches `point`.
pub fn on(point: Point, replica: &str, f: impl FnOnce() + Send + 'static) {
    HOOKS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push((point, replica.to_owned(), Box::new(f)));
}

/// The hook point `point`, reached by replica `replica`.
pub fn at(point: Point, replica: &str) {
    let hook = {
        let mut hooks = HOOKS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        hooks
            .iter()
            .position(|(p, r, _)| *p == point && r == replica)
            .map(|i| hooks.remove(i).2)
    };
    if let Some(f) = hook {
        f();
    }
}

//! The process's open-file limit against `server.max_connections`. A connection beyond the
//! limit cannot even be accepted (the accept fails with "too many open files"): it waits in the
//! listen backlog, unanswered, instead of getting the documented 503. Each client connection
//! may also need one to vLLM (one per request in flight), and the process keeps a few files of
//! its own (Redis, the listeners, logs). So where the limit is too low for both, the
//! connections are capped below it, with a warning naming the numbers: beyond the cap the
//! 503 is given again.

/// Files kept for the process's own use (listeners, Redis, logs, the tokenizer).
pub const RESERVED: u64 = 64;

/// The soft limit on open files (`ulimit -n`), where the platform says it (Linux:
/// `/proc/self/limits`); `None` when unknown or unlimited.
pub fn open_file_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    soft_limit(&limits)
}

/// The soft "Max open files" of a `/proc/<pid>/limits` text.
fn soft_limit(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The connections to accept at once: `max_connections`, unless the open-file limit `files`
/// cannot hold them with one upstream connection for each of `max_requests_in_flight` and
/// [`RESERVED`] more; then half of what the limit leaves after the reserve (at least 1).
pub fn connection_cap(
    max_connections: usize,
    max_requests_in_flight: usize,
    files: Option<u64>,
) -> usize {
    let Some(files) = files else {
        return max_connections;
    };
    let needed = (max_connections as u64)
        .saturating_add(max_requests_in_flight as u64)
        .saturating_add(RESERVED);
    if needed <= files {
        return max_connections;
    }
    let cap = usize::try_from(files.saturating_sub(RESERVED) / 2).unwrap_or(usize::MAX);
    cap.clamp(1, max_connections)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_is_read_from_proc_limits() {
        let text = "Limit                     Soft Limit           Hard Limit           Units     \n\
                    Max open files            1024                 524288               files     \n";
        assert_eq!(soft_limit(text), Some(1024));
        assert_eq!(soft_limit("Max open files unlimited unlimited files"), None);
        assert_eq!(soft_limit(""), None);
    }

    #[test]
    fn connections_are_capped_below_a_low_open_file_limit() {
        // Enough files: as configured.
        assert_eq!(connection_cap(10_000, 4_096, Some(1_048_576)), 10_000);
        assert_eq!(connection_cap(10_000, 4_096, None), 10_000);
        // systemd's default soft limit: half of what the reserve leaves, so an accept never
        // fails for want of a file and the connections beyond get their 503.
        assert_eq!(connection_cap(10_000, 4_096, Some(1_024)), 480);
        assert_eq!(connection_cap(100, 4_096, Some(1_024)), 100);
        assert_eq!(connection_cap(10_000, 4_096, Some(10)), 1);
    }
}

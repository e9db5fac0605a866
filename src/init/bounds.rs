//! What clients of the control socket may cost PID 1, whatever they do: connections, bytes of
//! requests not whole yet, requests waiting for their run to start, output waiting for a shim,
//! and time to send a request. docs/protocol.md ("Limits") states each bound and the memory
//! figure [`memory_bound`] computes from them; conns.rs and session.rs enforce them.
//!
//! A client of the init's own uid can start any program, so these bounds do not stop it from
//! hurting terraform runs; they stop it from killing PID 1 (out of memory), spinning it, or
//! filling its log, which would take every run in the container with it.

use std::time::Duration;

use crate::protocol;

/// Client connections open at once. When they are all open the listener leaves the epoll set and
/// new clients wait in the kernel's listen queue until one closes (a shim waits; it is not
/// refused). Room for a thousand shims at once (a tested case) and clients beside 256 runs; a
/// controller runs far fewer terraform processes at once in one pod.
pub(super) const MAX_CONNECTIONS: usize = 1024;

/// How long a client has, from its connection being accepted, to send its whole request. A shim
/// sends it at once (milliseconds, even for a 6 MiB request); one that has not is answered
/// (exit 125) and closed, and its bytes freed.
pub(super) const REQUEST_DEADLINE: Duration = Duration::from_secs(10);

/// Bytes of frames received and not whole yet, over every connection (each holds at most one
/// frame of at most the request limit). A connection whose unfinished frame does not fit is
/// answered "try again" (exit 75); whole requests do not count here, so clients that send
/// slowly cannot keep a shim's request out. At least the largest request limit (6 MiB + 64 KiB).
pub(super) const UNFINISHED_BUDGET: usize = 8 << 20;

/// Bytes of memory the requests of runs that wait to start (queued under TFINIT_MAX_RUNS,
/// recording, recovering) may take once parsed ([`parsed_cost`]). A request that does not fit
/// is answered "try again" (exit 75) before it is parsed.
pub(super) const HELD_BUDGET: usize = 16 << 20;

/// Output queued for one shim beyond which terraform's pipes are paused (backpressure).
pub(super) const HIGH_WATER: usize = 1 << 20;

/// Output queued for all shims together beyond which a run is paused as soon as its own shim
/// has anything queued: shims that do not read cannot make the init hold their runs' output.
pub(super) const OUTPUT_BUDGET: usize = 8 << 20;

/// What one read of a run's pipe may take for a shim with nothing queued while the output
/// budget is spent (so that such shims together add at most MAX_CONNECTIONS times this).
pub(super) const OVER_BUDGET_READ: usize = 4 << 10;

/// How long the listener stays out of the epoll set after accept(2) failed (out of
/// descriptors, most often), unless a connection closes first and frees one.
pub(super) const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// Bytes the loop reads from one connection per event (64 reads of 16 KiB): a connection's
/// unfinished frame may pass [`UNFINISHED_BUDGET`] by this much before it is answered.
pub(super) const READ_PER_EVENT: usize = 64 * READ_CHUNK;

/// Bytes of one read of a connection.
pub(super) const READ_CHUNK: usize = 16 << 10;

/// Memory one parsed string of a request may take beyond its bytes: its `String` in a `Vec`
/// that may have doubled (2 x 24 bytes) and the allocator's rounding and header (24 bytes).
const PER_STRING: usize = 72;

/// Memory one open connection takes besides its buffers: the table entry, the session, the
/// socket's `Conn` (measured: 5,000 idle connections cost 1 MB), rounded up.
const PER_CONNECTION: usize = 1 << 10;

/// An upper bound of the memory a request frame's payload takes once parsed: its bytes, plus
/// [`PER_STRING`] for each string in it (half its quote characters, escaped ones included:
/// they only make the bound larger).
pub(super) fn parsed_cost(payload: &[u8]) -> usize {
    let quotes = payload.iter().filter(|&&b| b == b'"').count();
    payload.len() + quotes.div_ceil(2) * PER_STRING
}

/// The most memory PID 1 holds for its clients beyond its idle size, when a request frame may
/// be `request_limit` bytes: unfinished frames (their budget, passed by at most one event's
/// reads), parsed requests waiting to start, the one request being parsed (its payload, next to
/// its parsed form), the output queued (its budget, passed by one full read and by one small
/// read per connection), and the connections themselves. docs/protocol.md states its value.
pub fn memory_bound(request_limit: usize) -> usize {
    let frame = protocol::HEADER + request_limit;
    UNFINISHED_BUDGET
        + READ_PER_EVENT
        + HELD_BUDGET
        + frame
        + OUTPUT_BUDGET
        + protocol::HEADER
        + protocol::MAX_DATA
        + MAX_CONNECTIONS * (protocol::HEADER + OVER_BUDGET_READ + PER_CONNECTION)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budgets_take_the_largest_request_and_the_figure_is_the_documented_one() {
        let largest = protocol::request_limit(protocol::ARG_MAX_CEILING);
        assert!(UNFINISHED_BUDGET >= protocol::HEADER + largest);
        // A largest request of ordinary strings (100 bytes each) fits in the held budget.
        assert!(largest + largest / 100 * PER_STRING <= HELD_BUDGET);
        let mib = |b: usize| b as f64 / f64::from(1 << 20);
        // docs/protocol.md, "Limits": 40.3 MiB with the default stack, 44.3 MiB at most.
        let default = protocol::request_limit(protocol::arg_max(Some(8 << 20)));
        assert_eq!(format!("{:.1}", mib(memory_bound(default))), "40.3");
        assert_eq!(format!("{:.1}", mib(memory_bound(largest))), "44.3");
    }

    #[test]
    fn a_parsed_cost_counts_each_string() {
        assert_eq!(parsed_cost(b"{}"), 2);
        assert_eq!(parsed_cost(br#"{"v":1}"#), 7 + PER_STRING);
        let tiny = br#"["","","",""]"#;
        assert_eq!(parsed_cost(tiny), tiny.len() + 4 * PER_STRING);
    }
}

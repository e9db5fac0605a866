//! Reads what `terraform force-unlock -force <id that cannot match>` prints: the current holder's
//! Lock Info (a read-only probe for the backends whose Unlock compares the id first), that the
//! lock is free, that terraform could not read it, or an answer in a wording this reader does not
//! know. Only a wording it knows is ever read as free.
//!
//! The wordings are in the tables of `wordings.rs`, per backend, each with the releases that print
//! it and how that is known: "measured" (recorded with scripts/record-lock-probes.sh, byte-exact
//! in tests/fixtures/terraform/lock*/, read back by this module's tests) or "source" (read in the
//! release's tag of hashicorp/terraform or opentofu/opentofu, `internal/backend/remote-state/
//! */client.go` `Unlock` and what it calls). Supported: terraform 1.0.3 (measured), 1.5.7 (what
//! provider-terraform ships; source), 1.11.4 (measured), every release 1.0 to 1.17-dev (source),
//! and OpenTofu 1.6 to 1.13-dev (source). docs/notes/terraform-facts.md, sections 3, 9b and 12,
//! has the outputs and the table of wordings by release.
//!
//! This file holds the probe's verdict; `backends.rs` what differs per backend (the probe's id,
//! whether probing is safe, how an Unlock error reads), `wordings.rs` the tables of wordings by
//! release, `parse.rs` terraform's output (the answer, the Lock Info block, Go times).

use crate::mutation::{self, Guard};

mod backends;
mod parse;
#[cfg(test)]
mod tests;
mod wordings;

use backends::unlock_answer;
pub use backends::{plain_id, probe_id, probe_safe};
pub use parse::{first_line, parse_go_time, parse_lock_info};
use parse::{message, plain};
use wordings::{Says, LOCKING_DISABLED, NOT_THE_LOCK, STATE_LOAD_FAILED, UNLOCKED, UNLOCK_FAILED};

/// The lock as terraform describes it (statemgr.LockInfo.String()).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LockInfo {
    /// Lock id, the argument force-unlock needs.
    pub id: String,
    /// State path.
    pub path: String,
    /// e.g. OperationTypeApply.
    pub operation: String,
    /// `user@hostname` of the holder.
    pub who: String,
    /// terraform version of the holder.
    pub version: String,
    /// Creation time as printed.
    pub created: String,
    /// Creation time, ms since the epoch, when it parses.
    pub created_ms: Option<u64>,
    /// Free text.
    pub info: String,
}

/// What the probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// Somebody holds the lock.
    Held(LockInfo),
    /// Somebody holds the lock, and terraform cannot load the state: it does not exist, and
    /// creating it needs the lock (`Failed to load state: ...` with a Lock Info). No terraform
    /// command can release such a lock, not even with its id: only the backend's own tools.
    HeldStateMissing(LockInfo),
    /// Nobody holds it.
    Free,
    /// terraform could not read the lock and said so in a wording this reader knows (the backend
    /// did not answer or refused, the directory is not initialised, or the lock is held but no
    /// Lock Info says whose): cannot tell; touch nothing and try again. The answer's first line.
    Unreadable(String),
    /// An answer in a wording this reader does not know (a release newer than its tables, a
    /// backend's new error): cannot tell; touch nothing, never free. The answer's first line.
    Unknown(String),
}

/// Parses the probe's combined output for `backend`; `success` is whether it exited 0.
pub fn parse_probe(backend: &str, success: bool, output: &str) -> Probe {
    parse_probe_of(backend, None, success, output)
}

/// [`parse_probe`], knowing the name of the backend's own lock object when there is one (the
/// kubernetes Lease `lock-tfstate-<workspace>-<suffix>`): its NotFound after the state loaded
/// means nobody holds the lock (a person deleted the Lease). Any other NotFound (the namespace,
/// another object) says nothing.
pub fn parse_probe_of(backend: &str, own_lock: Option<&str>, success: bool, output: &str) -> Probe {
    let text = plain(output);
    let quote = || first_line(&text);
    let answer = message(&text);
    // The block as its own parser reads it (the same verdict as parse_lock_info on the raw output).
    if let Some(info) = parse_lock_info(output) {
        return match answer {
            Some(m) if m.starts_with(STATE_LOAD_FAILED) => Probe::HeldStateMissing(info),
            _ => Probe::Held(info),
        };
    }
    // An id that cannot match was "unlocked": the backend has no locking configured (s3
    // without a lock table or lock object), so nothing can be held.
    if success && UNLOCKED.iter().any(|u| text.contains(u)) {
        return Probe::Free;
    }
    if backend == "s3" && text.lines().any(|l| LOCKING_DISABLED.contains(&l.trim())) {
        return Probe::Free;
    }
    let Some(answer) = answer else {
        return Probe::Unknown(quote());
    };
    // A Lock Info block that did not parse: something is held, whose cannot be read.
    if answer.lines().any(|l| l.trim() == "Lock Info:") {
        return Probe::Unknown(quote());
    }
    let says = match answer.strip_prefix(UNLOCK_FAILED) {
        Some(m) => unlock_answer(backend, own_lock, m),
        None if NOT_THE_LOCK.iter().any(|p| answer.starts_with(p)) => Some(Says::Unreadable),
        None => None,
    };
    match says {
        // With the wordings guard off (mutation builds only), the rules before issue 23: 1.0.3's
        // free wording of each backend alone.
        Some(Says::Free) if !mutation::on(Guard::Wordings) && !free_in_1_0_3(&answer) => {
            Probe::Unknown(quote())
        }
        Some(Says::Free) => Probe::Free,
        Some(Says::HeldUnnamed | Says::Unreadable) => Probe::Unreadable(quote()),
        None => Probe::Unknown(quote()),
    }
}

/// Whether `answer` is a free lock in terraform 1.0.3's wording (the only one read before issue
/// 23): for [`Guard::Wordings`] turned off.
fn free_in_1_0_3(answer: &str) -> bool {
    [
        "failed to retrieve lock info: unexpected end of JSON input",
        "state is already unlocked",
        "failed to retrieve lock info: blob metadata \"terraformlockid\" was empty",
        "storage: object doesn't exist",
        "not found",
    ]
    .iter()
    .any(|m| answer.contains(m))
}

//! What a reader says of a record it cannot use: unreadable by this uid, left alone unread, or
//! set aside as corrupt; and of a listing that got no answer.

use std::io;

use super::{Aside, RecordId, Store};
use crate::locks::record::{Unread, MAX_FILE};

/// Warns about a record this uid may not read (pods sharing a state directory must share a uid).
pub fn warn_unreadable(path: &RecordId, error: &str) {
    tracing::warn!(
        file = %path, error,
        "lock-owner record is not readable by this uid and is left alone: pods sharing TFINIT_STATE_DIR must run as the same uid"
    );
}

/// Warns about a file in `records/` that was left alone unread, saying what to do.
pub fn warn_left_alone(path: &RecordId, why: &Unread) {
    match why {
        Unread::NotRegular(kind) => tracing::warn!(
            file = %path, kind,
            "lock-owner record is not a regular file and is left alone: tfinit never opens, follows or renames it; remove it"
        ),
        Unread::TooLarge(bytes) => tracing::warn!(
            file = %path, bytes, limit = MAX_FILE,
            "lock-owner record is larger than tfinit reads and is left alone: a tfinit older than the record size cap may have written it and may still run that terraform; once its owner is gone, check the file by hand (it names the working directory and the lock's Who), then delete it"
        ),
        Unread::Failed(error) => tracing::warn!(
            file = %path, error,
            "lock-owner record could not be read and is left alone; it is read again by the next recovery: check the volume"
        ),
    }
}

/// Warns that the records of `store` could not be listed: which there are is unknown, so no
/// record of it is recovered (nor taken for absent) until a listing answers.
pub fn warn_unlisted(store: &str, error: &str) {
    tracing::warn!(
        store, error,
        "the lock-owner records could not be listed: which records there are is unknown, so none is recovered until a listing answers; check the store (the volume at TFINIT_STATE_DIR, or the Kubernetes API and the service account's rights on Leases)"
    );
}

/// Sets an unreadable record aside (`*.corrupt`) so it is reported once and never stops anyone.
pub fn set_aside_corrupt<S: Store + ?Sized>(store: &S, path: &RecordId, problem: &str) {
    match store.set_aside(path, &Aside::Corrupt(problem.to_string())) {
        Ok(aside) => tracing::warn!(
            file = %path,
            renamed_to = %aside,
            problem,
            "lock-owner record cannot be read and was renamed aside; check it by hand, then delete it"
        ),
        // Another pod set it aside first.
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(file = %path, problem, error = %e, "lock-owner record cannot be read, nor renamed aside")
        }
    }
}

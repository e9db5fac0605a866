//! The Kubernetes store's errors as the [`Store`](super::Store) seam reports them.

use std::io;

use crate::kube::Error;

/// `e` as the I/O error the callers of [`Store`](super::Store) take: the kind they decide on, and the whole
/// message (which says what to do).
pub fn io_error(e: Error) -> io::Error {
    let kind = match &e {
        Error::Unauthorized { .. } | Error::Forbidden { .. } => io::ErrorKind::PermissionDenied,
        Error::NotFound { .. } => io::ErrorKind::NotFound,
        Error::Conflict { .. } | Error::AlreadyExists { .. } => io::ErrorKind::AlreadyExists,
        Error::Timeout { .. } => io::ErrorKind::TimedOut,
        Error::Connect { .. } => io::ErrorKind::ConnectionRefused,
        Error::AnswerLost { .. } => io::ErrorKind::ConnectionAborted,
        Error::Invalid { .. } => io::ErrorKind::InvalidInput,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, e.to_string())
}

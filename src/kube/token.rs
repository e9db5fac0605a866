//! The service account's bearer token, kept fresh. A projected token (every pod's since
//! Kubernetes 1.22) is rewritten by the kubelet well before it expires (hourly, by default) and an
//! old one is refused after expiry: like client-go's cached file token source, the file is read
//! again when the value in memory is a minute old, and at once after a 401 (the caller then sends
//! the request once more).
//!
//! A periodic re-read that fails keeps the token in memory (the kubelet swaps the file by a
//! symlink rename, so a failed read is a mount problem, and the old token may still be valid for
//! a while); the failure is logged once per attempt.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The oldest a token in memory may be before the file is read again.
pub(super) const MAX_AGE: Duration = Duration::from_secs(60);

/// Why a token file gave no token.
#[derive(Debug)]
pub(super) enum ReadError {
    /// It cannot be read.
    Io(io::Error),
    /// It holds nothing but white space.
    Empty,
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Io(e) => write!(f, "{e}"),
            ReadError::Empty => f.write_str("the file is empty"),
        }
    }
}

/// The token of a file, without the white space around it (a written token may end in a
/// newline; HTTP would refuse one in a header).
pub(super) fn read(path: &Path) -> Result<String, ReadError> {
    let text = std::fs::read_to_string(path).map_err(ReadError::Io)?;
    let token = text.trim();
    if token.is_empty() {
        return Err(ReadError::Empty);
    }
    Ok(token.to_string())
}

/// The token in memory and when it was read.
pub(super) struct Token {
    path: PathBuf,
    value: String,
    read_at: Instant,
}

impl Token {
    /// A token just read from `path`.
    pub(super) fn new(path: PathBuf, value: String, now: Instant) -> Token {
        Token {
            path,
            value,
            read_at: now,
        }
    }

    /// The token file.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// The token to send at `now`: the file's, read again when the one in memory is
    /// [`MAX_AGE`] old.
    pub(super) fn current(&mut self, now: Instant) -> &str {
        if now.saturating_duration_since(self.read_at) >= MAX_AGE {
            if let Err(e) = self.reread(now) {
                tracing::warn!(
                    path = %self.path.display(),
                    "cannot re-read the service account token ({e}): the one read before is \
                     used until the file can be read; check the service account's mount"
                );
            }
        }
        &self.value
    }

    /// Reads the file again now (after a 401). On failure the token in memory stays, and the
    /// next periodic re-read is not sooner than [`MAX_AGE`] (no read per request on a lost
    /// mount).
    pub(super) fn reread(&mut self, now: Instant) -> Result<(), ReadError> {
        self.read_at = now;
        self.value = read(&self.path)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_is_read_again_once_the_token_is_a_minute_old_and_not_before() {
        let dir = std::env::temp_dir().join(format!("tfinit-kube-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        std::fs::write(&path, "one\n").unwrap();
        let start = Instant::now();
        let mut t = Token::new(path.clone(), read(&path).unwrap(), start);
        assert_eq!(t.current(start), "one");

        std::fs::write(&path, "two").unwrap();
        assert_eq!(t.current(start + MAX_AGE - Duration::from_millis(1)), "one");
        assert_eq!(t.current(start + MAX_AGE), "two");

        // A file that went away: the old token stays, and is not re-read on every request.
        std::fs::remove_file(&path).unwrap();
        assert!(t.reread(start + MAX_AGE * 2).is_err());
        assert_eq!(t.current(start + MAX_AGE * 2), "two");
        std::fs::write(&path, "three").unwrap();
        assert_eq!(
            t.current(start + MAX_AGE * 3 - Duration::from_millis(1)),
            "two"
        );
        assert_eq!(t.current(start + MAX_AGE * 3), "three");

        std::fs::write(&path, " \n").unwrap();
        assert!(matches!(read(&path), Err(ReadError::Empty)));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

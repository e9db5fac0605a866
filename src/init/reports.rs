//! What recovery helpers report back: each writes one JSON line per record it decided on
//! ([`HelperReport`]) into a pipe the init made at start, and the loop counts the lines in the
//! metrics. The read end is non-blocking and in the epoll set, so a helper never makes the loop
//! wait; a line comes in one write(2) shorter than PIPE_BUF, so helpers running at once never
//! interleave theirs. Unit-tested without processes: [`Reports::feed`] takes bytes.

use std::collections::HashSet;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, OFlag};

use crate::locks::labels::{Backend, UnlockOutcome};
use crate::locks::recover::{HelperReport, UnknownWording};

/// The longest partial line kept while its end has not arrived: a helper writes far less, so
/// anything longer is not one of its lines and is dropped.
const MAX_LINE: usize = 4096;

/// How many records whose probe answered in an unknown wording are remembered as said. Beyond it
/// the memory starts again: a record may be said twice, never not at all.
const MAX_SAID: usize = 1024;

/// A helper's report with its labels parsed: the loop compares no text afterwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Report {
    /// The working directory's backend, as the metrics count it.
    pub(super) backend: Backend,
    /// The backend's type as the helper wrote it, for the log.
    pub(super) backend_name: String,
    /// What the recovery decided; None for a text this tfinit does not know (not counted).
    pub(super) outcome: Option<UnlockOutcome>,
    /// Resources the dead run had in progress (orphan candidates).
    pub(super) orphans: u64,
    /// Set when the probe answered in a wording tfinit does not know.
    pub(super) unknown_wording: Option<UnknownWording>,
}

impl From<HelperReport> for Report {
    fn from(r: HelperReport) -> Report {
        Report {
            backend: Backend::parse(&r.backend),
            outcome: UnlockOutcome::parse(&r.outcome),
            backend_name: r.backend,
            orphans: r.orphans,
            unknown_wording: r.unknown_wording,
        }
    }
}

/// The report pipe and the part of a line read so far.
#[derive(Debug)]
pub(super) struct Reports {
    /// The read end (non-blocking, close-on-exec).
    read: OwnedFd,
    /// The write end (close-on-exec): a duplicate without it goes to each helper.
    write: OwnedFd,
    /// Bytes after the last newline.
    partial: Vec<u8>,
    /// The records whose unknown probe wording the init has said (each is said once).
    said: HashSet<String>,
}

impl Reports {
    /// A new pipe.
    pub(super) fn new() -> io::Result<Reports> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
        // Only the read end is non-blocking (its own open file description): a helper's write
        // end stays blocking, so a full pipe slows that helper, never drops its line.
        fcntl(&read, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
        Ok(Reports {
            read,
            write,
            partial: Vec::new(),
            said: HashSet::new(),
        })
    }

    /// The read end, for the epoll set.
    pub(super) fn fd(&self) -> BorrowedFd<'_> {
        self.read.as_fd()
    }

    /// The write end, for a helper to inherit a duplicate of.
    pub(super) fn write_end(&self) -> &OwnedFd {
        &self.write
    }

    /// Reads what is there (never blocks) and returns the complete lines' reports.
    pub(super) fn take(&mut self, scratch: &mut [u8]) -> Vec<Report> {
        let mut out = Vec::new();
        loop {
            match nix::unistd::read(&self.read, scratch) {
                Ok(0) => break,
                Ok(n) => out.extend(self.feed(&scratch[..n]).into_iter().map(Report::from)),
                Err(Errno::EINTR) => continue,
                // EAGAIN: all read. Anything else: the next readiness tries again.
                Err(_) => break,
            }
        }
        out
    }

    /// Whether `record`'s unknown probe wording is to be said now: the first time it is reported.
    pub(super) fn first_time_unknown(&mut self, record: &str) -> bool {
        if self.said.len() >= MAX_SAID && !self.said.contains(record) {
            self.said.clear();
        }
        self.said.insert(record.to_string())
    }

    /// Takes `bytes` in; returns the reports of the lines they complete. A line that does not
    /// parse is logged and skipped.
    pub(super) fn feed(&mut self, bytes: &[u8]) -> Vec<HelperReport> {
        self.partial.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(end) = self.partial.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=end).collect();
            match serde_json::from_slice::<HelperReport>(&line[..end]) {
                Ok(r) => out.push(r),
                Err(e) => {
                    tracing::debug!(error = %e, "a recovery helper's report line does not parse")
                }
            }
        }
        if self.partial.len() > MAX_LINE {
            self.partial.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(outcome: &str) -> HelperReport {
        HelperReport {
            backend: "s3".into(),
            outcome: outcome.into(),
            orphans: 2,
            unknown_wording: None,
        }
    }

    #[test]
    fn lines_are_taken_whole_whatever_the_reads_cut() {
        let mut r = Reports::new().unwrap();
        let a = serde_json::to_string(&report("unlocked")).unwrap();
        let b = serde_json::to_string(&report("free")).unwrap();
        let text = format!("{a}\n{b}\n");
        let (first, rest) = text.split_at(a.len() - 3);
        assert_eq!(r.feed(first.as_bytes()), vec![]);
        assert_eq!(
            r.feed(rest.as_bytes()),
            vec![report("unlocked"), report("free")]
        );
    }

    #[test]
    fn a_bad_line_is_skipped_and_an_endless_one_dropped() {
        let mut r = Reports::new().unwrap();
        let good = serde_json::to_string(&report("ambiguous")).unwrap();
        assert_eq!(
            r.feed(format!("not json\n{good}\n").as_bytes()),
            vec![report("ambiguous")]
        );
        assert_eq!(r.feed(&[b'x'; MAX_LINE + 1]), vec![]);
        assert_eq!(
            r.feed(format!("\n{good}\n").as_bytes()),
            vec![report("ambiguous")]
        );
    }

    #[test]
    fn an_unknown_wording_is_said_once_per_record_and_its_report_reads_back() {
        let mut r = Reports::new().unwrap();
        let mut odd = report("unknown");
        odd.unknown_wording = Some(crate::locks::recover::UnknownWording {
            record: "/state/records/a.json".into(),
            workdir: "/work".into(),
            said: "Failed to unlock state: something new".into(),
        });
        let line = format!("{}\n", serde_json::to_string(&odd).unwrap());
        assert_eq!(r.feed(line.as_bytes()), vec![odd]);
        assert!(line.contains("\"unknown_wording\""), "{line}");
        let plain = serde_json::to_string(&report("free")).unwrap();
        assert!(
            !plain.contains("unknown_wording"),
            "left out when unset: {plain}"
        );
        // An older helper's line (no such field) still reads.
        assert_eq!(
            r.feed(b"{\"backend\":\"s3\",\"outcome\":\"free\",\"orphans\":2}\n"),
            vec![report("free")]
        );
        assert!(r.first_time_unknown("/state/records/a.json"));
        assert!(!r.first_time_unknown("/state/records/a.json"));
        assert!(r.first_time_unknown("/state/records/b.json"));
        for i in 0..MAX_SAID {
            r.first_time_unknown(&format!("/r/{i}"));
        }
        assert!(
            r.said.len() <= MAX_SAID,
            "the memory is bounded: {}",
            r.said.len()
        );
    }

    #[test]
    fn the_pipe_is_read_without_blocking() {
        let mut r = Reports::new().unwrap();
        let mut scratch = vec![0u8; 64];
        assert_eq!(
            r.take(&mut scratch),
            vec![],
            "an empty pipe returns at once"
        );
        let line = format!("{}\n", serde_json::to_string(&report("unlocked")).unwrap());
        nix::unistd::write(r.write_end(), line.as_bytes()).unwrap();
        assert_eq!(r.take(&mut scratch), vec![report("unlocked").into()]);
    }

    #[test]
    fn a_report_is_parsed_once_and_an_unknown_label_is_not_counted() {
        let r = Report::from(report("held_by_other"));
        assert_eq!(r.outcome, Some(UnlockOutcome::HeldByOther));
        assert_eq!(r.backend, Backend::S3);
        let r = Report::from(HelperReport {
            backend: "etcdv3".into(),
            ..report("no_such_outcome")
        });
        assert_eq!(r.outcome, None, "a helper of another version");
        assert_eq!(r.backend, Backend::Other);
        assert_eq!(r.backend_name, "etcdv3", "the log names it as written");
    }
}

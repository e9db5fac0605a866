//! What each epoll registration stands for: the 64-bit token carries a kind and an id (a
//! client connection's [`ConnId`], or a run's id and its output [`Stream`]).

use crate::locks::names::RunId;

/// A client connection's id (its epoll token says which connection an event is for).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct ConnId(u64);

impl ConnId {
    /// Its number, in logs and epoll tokens.
    pub(super) fn number(self) -> u64 {
        self.0
    }
}

impl From<u64> for ConnId {
    fn from(n: u64) -> ConnId {
        ConnId(n)
    }
}

/// Which output stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stream {
    /// terraform's stdout.
    Stdout,
    /// terraform's stderr.
    Stderr,
}

impl Stream {
    /// Both, in the order they are drained.
    pub(super) const BOTH: [Stream; 2] = [Stream::Stdout, Stream::Stderr];

    /// Name for logs.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

const SIGNALS: u64 = 0;
const LISTENER: u64 = 1;
const KIND_CONN: u64 = 1;
const KIND_STDOUT: u64 = 2;
const KIND_STDERR: u64 = 3;
const KIND_RECORDER: u64 = 4;
const KIND_REPORTS: u64 = 5;

/// Where an epoll event comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    /// The signalfd.
    Signals,
    /// The control socket's listener.
    Listener,
    /// A client connection.
    Conn(ConnId),
    /// A run's output pipe.
    Output(RunId, Stream),
    /// The recorder's eventfd: storage work has completed.
    Recorder,
    /// The recovery helpers' report pipe.
    Reports,
    /// Nothing we registered.
    Unknown(u64),
}

/// The token of the signalfd.
pub(super) const TOKEN_SIGNALS: u64 = SIGNALS;
/// The token of the listener.
pub(super) const TOKEN_LISTENER: u64 = LISTENER;

/// The token of the recorder's eventfd (a kind of its own: a bare 2 or 3 would read as run 0's
/// output).
pub(super) const TOKEN_RECORDER: u64 = KIND_RECORDER;

/// The token of the recovery helpers' report pipe (a kind of its own, like the recorder's).
pub(super) const TOKEN_REPORTS: u64 = KIND_REPORTS;

/// The token of client connection `id` (ids start at 1, so it never equals the two above).
pub(super) fn conn(id: ConnId) -> u64 {
    (id.number() << 8) | KIND_CONN
}

/// The token of run `id`'s `stream` pipe.
pub(super) fn output(id: RunId, stream: Stream) -> u64 {
    let kind = match stream {
        Stream::Stdout => KIND_STDOUT,
        Stream::Stderr => KIND_STDERR,
    };
    (id.number() << 8) | kind
}

/// What a token stands for.
pub(super) fn decode(tok: u64) -> Source {
    match tok {
        SIGNALS => Source::Signals,
        LISTENER => Source::Listener,
        t => match (t & 0xff, t >> 8) {
            (KIND_CONN, id) => Source::Conn(ConnId::from(id)),
            (KIND_STDOUT, id) => Source::Output(RunId::from(id), Stream::Stdout),
            (KIND_STDERR, id) => Source::Output(RunId::from(id), Stream::Stderr),
            (KIND_RECORDER, 0) => Source::Recorder,
            (KIND_REPORTS, 0) => Source::Reports,
            _ => Source::Unknown(t),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_decode_to_what_they_were_made_for() {
        assert_eq!(decode(TOKEN_SIGNALS), Source::Signals);
        assert_eq!(decode(TOKEN_LISTENER), Source::Listener);
        assert_eq!(decode(TOKEN_RECORDER), Source::Recorder);
        assert_eq!(decode(TOKEN_REPORTS), Source::Reports);
        assert_eq!(decode(conn(ConnId::from(7))), Source::Conn(ConnId::from(7)));
        let r9 = RunId::from(9);
        assert_eq!(
            decode(output(r9, Stream::Stderr)),
            Source::Output(r9, Stream::Stderr)
        );
        assert_eq!(
            decode(output(r9, Stream::Stdout)),
            Source::Output(r9, Stream::Stdout)
        );
        assert_eq!(decode((3 << 8) | 0x7f), Source::Unknown((3 << 8) | 0x7f));
    }
}

//! What each epoll registration stands for: the 64-bit token carries a kind and an id.

use super::runs::Stream;

const SIGNALS: u64 = 0;
const LISTENER: u64 = 1;
const KIND_CONN: u64 = 1;
const KIND_STDOUT: u64 = 2;
const KIND_STDERR: u64 = 3;
const KIND_RECORDER: u64 = 4;

/// Where an epoll event comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The signalfd.
    Signals,
    /// The control socket's listener.
    Listener,
    /// A client connection, by id.
    Conn(u64),
    /// A run's output pipe, by run id.
    Output(u64, Stream),
    /// The recorder's eventfd: storage work has completed.
    Recorder,
    /// Nothing we registered.
    Unknown(u64),
}

/// The token of the signalfd.
pub const TOKEN_SIGNALS: u64 = SIGNALS;
/// The token of the listener.
pub const TOKEN_LISTENER: u64 = LISTENER;

/// The token of the recorder's eventfd (a kind of its own: a bare 2 or 3 would read as run 0's
/// output).
pub const TOKEN_RECORDER: u64 = KIND_RECORDER;

/// The token of client connection `id` (ids start at 1, so it never equals the two above).
pub fn conn(id: u64) -> u64 {
    (id << 8) | KIND_CONN
}

/// The token of run `id`'s `stream` pipe.
pub fn output(id: u64, stream: Stream) -> u64 {
    let kind = match stream {
        Stream::Stdout => KIND_STDOUT,
        Stream::Stderr => KIND_STDERR,
    };
    (id << 8) | kind
}

/// What a token stands for.
pub fn decode(tok: u64) -> Source {
    match tok {
        SIGNALS => Source::Signals,
        LISTENER => Source::Listener,
        t => match (t & 0xff, t >> 8) {
            (KIND_CONN, id) => Source::Conn(id),
            (KIND_STDOUT, id) => Source::Output(id, Stream::Stdout),
            (KIND_STDERR, id) => Source::Output(id, Stream::Stderr),
            (KIND_RECORDER, 0) => Source::Recorder,
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
        assert_eq!(decode(conn(7)), Source::Conn(7));
        assert_eq!(
            decode(output(9, Stream::Stderr)),
            Source::Output(9, Stream::Stderr)
        );
        assert_eq!(
            decode(output(9, Stream::Stdout)),
            Source::Output(9, Stream::Stdout)
        );
        assert_eq!(decode((3 << 8) | 0x7f), Source::Unknown((3 << 8) | 0x7f));
    }
}

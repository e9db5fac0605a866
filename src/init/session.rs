//! One client's conversation, without its socket: the frames it sent, where it is (waiting for
//! its one request, attached to its run, answered and closing), and the bytes queued for it.
//! Pure: conns.rs owns the socket and moves bytes between it and the session, and keeps the
//! totals of what every session holds (bounds.rs).

use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Instant;

use super::action::Force;
use super::bounds::parsed_cost;
use super::runs::CancelTarget;
use crate::locks::names::RunId;
use crate::protocol::{
    self, CancelRequest, Decoder, Envelope, Kind, Request, RunRequest, SignalNote,
};
use crate::terraform::normal_dir;

/// Where a conversation is.
#[derive(Debug)]
enum Conversation {
    /// Waits for its one request, with the descriptor passed with it (the shim's stdin).
    Open {
        /// The shim's stdin, once received.
        stdin: Option<OwnedFd>,
        /// When it is answered and closed if its request has not come whole.
        deadline: Instant,
    },
    /// Its request was handed over and not answered yet.
    Asked {
        /// What its run request costs the init until terraform starts (0 for a control request).
        held: usize,
    },
    /// Its run request started a run: the run's output and exit note come here.
    Attached {
        /// The run.
        run: RunId,
        /// What its request costs the init until terraform starts (then 0).
        held: usize,
    },
    /// Answered: closes once everything queued is written.
    Closing,
}

/// What a client asks, frame by frame.
#[derive(Debug)]
pub(super) enum Input {
    /// Start terraform (validated: absolute program and cwd, an `argv[0]`).
    Run {
        /// The request.
        request: RunRequest,
        /// The shim's stdin, when it passed one.
        stdin: Option<OwnedFd>,
    },
    /// A control request: `tfinit status`, `drain`, `resume`, `metrics` or `cancel`.
    Control(Control),
    /// The shim of `run` got a stop signal.
    Signal {
        /// The run.
        run: RunId,
        /// The signal.
        signo: i32,
    },
    /// The client broke the protocol (the text says how): it is answered with an error, or
    /// dropped when it has a run (as if the shim were gone).
    Broken(String),
    /// Its request does not fit in what the init keeps for requests now (the text says so): it
    /// is answered "try again" (exit 75) without being parsed.
    Busy(String),
}

/// A control request (answered by supervisor/control.rs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Control {
    /// The status document.
    Status,
    /// Refuse new runs.
    Drain,
    /// Accept runs again.
    Resume,
    /// The metrics text.
    Metrics,
    /// Stop the runs `target` names (`tfinit cancel`).
    Cancel {
        /// Which runs.
        target: CancelTarget,
        /// Gracefully, or SIGKILL at once.
        force: Force,
    },
}

/// One client's conversation.
#[derive(Debug)]
pub(super) struct Session {
    decoder: Decoder,
    phase: Conversation,
    out: Vec<u8>,
    sent: usize,
}

/// The output buffer is given back to the allocator once written if it grew past this: a shim
/// that once lagged a megabyte behind must not keep that memory for the rest of its run.
const KEEP_OUT: usize = 64 << 10;

impl Session {
    /// A new client, whose frames may be `limit` bytes and whose request must have come whole
    /// by `deadline`.
    pub(super) fn new(limit: usize, deadline: Instant) -> Session {
        Session {
            decoder: Decoder::new(limit),
            phase: Conversation::Open {
                stdin: None,
                deadline,
            },
            out: Vec::new(),
            sent: 0,
        }
    }

    /// Bytes received and not decoded yet: a frame that has not come whole.
    pub(super) fn unfinished(&self) -> usize {
        self.decoder.pending()
    }

    /// What its run's request costs the init until terraform starts.
    pub(super) fn held(&self) -> usize {
        match self.phase {
            Conversation::Asked { held } | Conversation::Attached { held, .. } => held,
            Conversation::Open { .. } | Conversation::Closing => 0,
        }
    }

    /// When it is closed unless its request has come whole (only while it has not).
    pub(super) fn deadline(&self) -> Option<Instant> {
        match self.phase {
            Conversation::Open { deadline, .. } => Some(deadline),
            Conversation::Asked { .. } | Conversation::Attached { .. } | Conversation::Closing => {
                None
            }
        }
    }

    /// terraform of its run started: its request is no longer held.
    pub(super) fn launched(&mut self) {
        if let Conversation::Asked { held } | Conversation::Attached { held, .. } = &mut self.phase
        {
            *held = 0;
        }
    }

    /// Takes bytes read from the socket, and the descriptors that came with them: the first one
    /// before the request is the shim's stdin; any other is dropped (closed).
    pub(super) fn received(&mut self, bytes: &[u8], fds: Vec<OwnedFd>) {
        for fd in fds {
            if let Conversation::Open {
                stdin: stdin @ None,
                ..
            } = &mut self.phase
            {
                *stdin = Some(fd);
            }
        }
        self.decoder.push(bytes);
    }

    /// The next whole frame received, as what the client asks; None until one is whole. A
    /// request is parsed only when what it would cost parsed fits in `room` bytes.
    pub(super) fn next_input(&mut self, room: usize) -> Option<Input> {
        loop {
            let frame = match self.decoder.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => return None,
                Err(e) => return Some(Input::Broken(e.to_string())),
            };
            match (frame.kind, &mut self.phase) {
                (Kind::Request, Conversation::Open { stdin, .. }) => {
                    let cost = parsed_cost(&frame.payload);
                    if cost > room {
                        self.phase = Conversation::Asked { held: 0 };
                        return Some(Input::Busy(format!(
                            "refused for now: this request would take up to {cost} bytes of the init's memory until terraform starts, and {room} are free of what it keeps for the requests of runs waiting to start (TFINIT_MAX_RUNS queues them); try again"
                        )));
                    }
                    let stdin = stdin.take();
                    let input = request(&frame.payload, stdin);
                    let held = match input {
                        Input::Run { .. } => cost,
                        _ => 0,
                    };
                    self.phase = Conversation::Asked { held };
                    return Some(input);
                }
                (Kind::Signal, Conversation::Attached { run, .. }) => {
                    match serde_json::from_slice::<SignalNote>(&frame.payload) {
                        Ok(n) => {
                            return Some(Input::Signal {
                                run: *run,
                                signo: n.signal,
                            })
                        }
                        Err(e) => tracing::debug!(error = %e, "malformed signal note ignored"),
                    }
                }
                (other, _) => return Some(Input::Broken(format!("unexpected {other:?} frame"))),
            }
        }
    }

    /// Its request started `run`.
    pub(super) fn attach(&mut self, run: RunId) {
        let held = self.held();
        self.phase = Conversation::Attached { run, held };
    }

    /// The run it is attached to, if any.
    pub(super) fn run(&self) -> Option<RunId> {
        match self.phase {
            Conversation::Attached { run, .. } => Some(run),
            Conversation::Open { .. } | Conversation::Asked { .. } | Conversation::Closing => None,
        }
    }

    /// Queues its answer (an exit note or a reply): nothing follows it, and it closes once
    /// everything is written. It is no longer attached to a run, and nothing more it sends is
    /// read: what it sent and was not decoded is dropped.
    pub(super) fn answer<T: serde::Serialize>(&mut self, kind: Kind, answer: &T) {
        self.queue_json(kind, answer);
        self.phase = Conversation::Closing;
        self.decoder.clear();
    }

    /// How much of its request had come when it was due, for the answer: the bytes, and the
    /// frame's announced length when its header came.
    pub(super) fn progress(&self) -> (usize, Option<usize>) {
        (self.decoder.pending(), self.decoder.expected())
    }

    /// Whether it closes once everything queued is written.
    pub(super) fn closing(&self) -> bool {
        matches!(self.phase, Conversation::Closing)
    }

    /// Queues one frame.
    pub(super) fn queue_frame(&mut self, kind: Kind, payload: &[u8]) {
        if self.sent > 0 && self.sent == self.out.len() {
            self.out.clear();
            self.sent = 0;
        }
        protocol::encode(kind, payload, &mut self.out);
    }

    fn queue_json<T: serde::Serialize>(&mut self, kind: Kind, v: &T) {
        let body = serde_json::to_vec(v).unwrap_or_else(|_| b"{}".to_vec());
        self.queue_frame(kind, &body);
    }

    /// Bytes queued and not yet written.
    pub(super) fn queued(&self) -> usize {
        self.out.len() - self.sent
    }

    /// What is queued and not yet written.
    pub(super) fn unwritten(&self) -> &[u8] {
        &self.out[self.sent..]
    }

    /// `n` bytes of [`Self::unwritten`] were written.
    pub(super) fn wrote(&mut self, n: usize) {
        self.sent += n;
        if self.sent == self.out.len() {
            if self.out.capacity() > KEEP_OUT {
                self.out = Vec::new();
            }
            self.out.clear();
            self.sent = 0;
        } else if self.sent >= (64 << 10) && self.sent * 2 >= self.out.len() {
            // Reclaim the written prefix once it is as large as what is left: under a steady
            // stream the buffer never empties, and would otherwise grow far past the high-water
            // mark. Each byte is moved at most once on average.
            self.out.drain(..self.sent);
            self.sent = 0;
        }
    }
}

/// A request frame's payload as what it asks, or how it breaks the protocol.
fn request(payload: &[u8], stdin: Option<OwnedFd>) -> Input {
    let env = match serde_json::from_slice::<Envelope>(payload) {
        Ok(env) => env,
        Err(e) => return Input::Broken(format!("malformed request: {e}")),
    };
    if env.v != protocol::VERSION {
        return Input::Broken(format!(
            "protocol version {} is not supported (this init speaks {}): use the tfinit binary of the init as the shim",
            env.v,
            protocol::VERSION
        ));
    }
    match env.request {
        Request::Run(request) => match validate_run(&request) {
            Ok(()) => Input::Run { request, stdin },
            Err(problem) => Input::Broken(problem),
        },
        Request::Status => Input::Control(Control::Status),
        Request::Drain => Input::Control(Control::Drain),
        Request::Resume => Input::Control(Control::Resume),
        Request::Metrics => Input::Control(Control::Metrics),
        Request::Cancel(c) => match cancel_target(&c) {
            Ok(target) => {
                let force = if c.force {
                    Force::Kill
                } else {
                    Force::Graceful
                };
                Input::Control(Control::Cancel { target, force })
            }
            Err(problem) => Input::Broken(problem),
        },
    }
}

/// Which runs a cancel names: a run id as the init writes them, or an absolute directory.
fn cancel_target(c: &CancelRequest) -> Result<CancelTarget, String> {
    match (&c.run, &c.workdir) {
        (Some(id), None) => RunId::parse(id).map(CancelTarget::Run).ok_or_else(|| {
            format!("{id:?} is not a run id: ids are r and the run's number without leading zeros, e.g. r7, as `tfinit status` shows them")
        }),
        (None, Some(dir)) if Path::new(dir).is_absolute() => Ok(CancelTarget::Workdir {
            path: normal_dir(Path::new(dir)),
            id: c.workdir_id,
        }),
        (None, Some(dir)) => Err(format!("cancel workdir {dir:?} is not an absolute path")),
        _ => Err("a cancel names either a run or a workdir, not both nor neither".into()),
    }
}

fn validate_run(r: &RunRequest) -> Result<(), String> {
    if !Path::new(&r.program).is_absolute() {
        return Err(format!("program {:?} is not an absolute path", r.program));
    }
    if !Path::new(&r.cwd).is_absolute() {
        return Err(format!("cwd {:?} is not an absolute path", r.cwd));
    }
    if r.argv0.is_empty() {
        return Err("argv0 is empty".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::ExitNote;

    fn frame(kind: Kind, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        protocol::encode(kind, body, &mut out);
        out
    }

    fn envelope(request: Request) -> Vec<u8> {
        let body = serde_json::to_vec(&Envelope {
            v: protocol::VERSION,
            request,
        })
        .unwrap();
        frame(Kind::Request, &body)
    }

    fn run_request(program: &str) -> Request {
        Request::Run(RunRequest {
            program: program.into(),
            argv0: "terraform".into(),
            args: vec!["plan".into()],
            cwd: "/tf".into(),
            env: vec![],
            workspace: None,
            cwd_id: None,
            workdir_id: None,
        })
    }

    fn session() -> Session {
        Session::new(protocol::MAX_PAYLOAD, Instant::now())
    }

    fn null() -> OwnedFd {
        std::fs::File::open("/dev/null").unwrap().into()
    }

    #[test]
    fn a_run_request_comes_with_the_stdin_passed_before_it_and_only_once() {
        let mut s = session();
        s.received(&[], vec![null(), null()]);
        s.received(&envelope(run_request("/bin/terraform")), vec![]);
        assert!(matches!(
            s.next_input(usize::MAX),
            Some(Input::Run { stdin: Some(_), .. })
        ));
        assert!(s.next_input(usize::MAX).is_none());
        s.received(&envelope(Request::Status), vec![]);
        assert!(
            matches!(s.next_input(usize::MAX), Some(Input::Broken(p)) if p == "unexpected Request frame"),
            "one request per connection"
        );
    }

    #[test]
    fn signals_count_only_from_an_attached_shim() {
        let mut s = session();
        let note = frame(Kind::Signal, br#"{"signal":15}"#);
        s.received(&note, vec![]);
        assert!(matches!(s.next_input(usize::MAX), Some(Input::Broken(_))));

        let mut s = session();
        s.received(&envelope(run_request("/bin/terraform")), vec![]);
        assert!(matches!(
            s.next_input(usize::MAX),
            Some(Input::Run { stdin: None, .. })
        ));
        s.attach(RunId::from(3));
        assert_eq!(s.run(), Some(RunId::from(3)));
        s.received(&frame(Kind::Signal, b"not json"), vec![]);
        s.received(&note, vec![]);
        assert!(
            matches!(s.next_input(usize::MAX), Some(Input::Signal { run, signo: 15 }) if run == RunId::from(3)),
            "a malformed note is skipped"
        );
    }

    #[test]
    fn bad_requests_say_what_is_wrong() {
        let broken = |bytes: Vec<u8>| {
            let mut s = session();
            s.received(&bytes, vec![]);
            match s.next_input(usize::MAX) {
                Some(Input::Broken(p)) => p,
                other => panic!("{other:?}"),
            }
        };
        assert!(broken(envelope(run_request("terraform"))).contains("not an absolute path"));
        assert!(broken(frame(Kind::Request, b"{")).starts_with("malformed request"));
        let future = br#"{"v":99,"op":"status"}"#;
        assert!(broken(frame(Kind::Request, future)).contains("protocol version 99"));
    }

    #[test]
    fn a_cancel_names_a_run_id_or_an_absolute_directory() {
        let cancel = |run: Option<&str>, workdir: Option<&str>, force: bool| {
            let mut s = session();
            s.received(
                &envelope(Request::Cancel(CancelRequest {
                    run: run.map(String::from),
                    workdir: workdir.map(String::from),
                    workdir_id: None,
                    force,
                })),
                vec![],
            );
            s.next_input(usize::MAX)
        };
        assert!(matches!(
            cancel(Some("r7"), None, true),
            Some(Input::Control(Control::Cancel { target: CancelTarget::Run(r), force: Force::Kill }))
                if r == RunId::from(7)
        ));
        assert!(matches!(
            cancel(None, Some("/tf/x/../y/"), false),
            Some(Input::Control(Control::Cancel { target: CancelTarget::Workdir { path, id: None }, force: Force::Graceful }))
                if path == Path::new("/tf/y")
        ));
        for (run, dir, problem) in [
            (Some("7"), None, "is not a run id"),
            (Some("r"), None, "is not a run id"),
            (Some("r99999999999999999999"), None, "is not a run id"),
            (Some("r00004"), None, "without leading zeros"),
            (None, Some("tf/x"), "not an absolute path"),
            (Some("r1"), Some("/tf"), "either a run or a workdir"),
            (None, None, "either a run or a workdir"),
        ] {
            match cancel(run, dir, false) {
                Some(Input::Broken(p)) => assert!(p.contains(problem), "{p}"),
                other => panic!("{run:?} {dir:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_request_is_parsed_only_when_its_cost_fits_and_a_run_holds_it_until_launched() {
        let bytes = envelope(run_request("/bin/terraform"));
        let cost = parsed_cost(&bytes[protocol::HEADER..]);
        // One byte short: refused for now, unparsed, and holding nothing.
        let mut s = session();
        s.received(&bytes, vec![]);
        match s.next_input(cost - 1) {
            Some(Input::Busy(p)) => assert!(p.contains("try again"), "{p}"),
            other => panic!("{other:?}"),
        }
        assert_eq!((s.held(), s.unfinished()), (0, 0));
        // Room enough: parsed, and held until terraform starts.
        let mut s = session();
        s.received(&bytes, vec![]);
        assert!(matches!(s.next_input(cost), Some(Input::Run { .. })));
        assert_eq!(s.held(), cost);
        s.attach(RunId::from(1));
        assert_eq!(s.held(), cost, "still held while the run waits");
        s.launched();
        assert_eq!(s.held(), 0);
        // A control request holds nothing once answered.
        let mut s = session();
        s.received(&envelope(Request::Status), vec![]);
        assert!(matches!(s.next_input(usize::MAX), Some(Input::Control(_))));
        assert_eq!(s.held(), 0);
    }

    #[test]
    fn an_unfinished_request_has_a_deadline_and_the_answer_frees_its_bytes() {
        let at = Instant::now();
        let mut s = Session::new(protocol::MAX_PAYLOAD, at);
        assert_eq!(s.deadline(), Some(at));
        let bytes = envelope(Request::Status);
        s.received(&bytes[..bytes.len() - 1], vec![]);
        assert!(s.next_input(usize::MAX).is_none());
        assert_eq!(s.unfinished(), bytes.len() - 1);
        assert_eq!(
            s.progress(),
            (bytes.len() - 1, Some(bytes.len() - protocol::HEADER))
        );
        s.answer(Kind::Exit, &ExitNote::default());
        assert_eq!((s.unfinished(), s.deadline()), (0, None));
        // Once the request came whole, no deadline is left.
        let mut s = Session::new(protocol::MAX_PAYLOAD, at);
        s.received(&bytes, vec![]);
        assert!(s.next_input(usize::MAX).is_some());
        assert_eq!(s.deadline(), None);
    }

    #[test]
    fn controls_are_answered_and_the_answer_closes() {
        let mut s = session();
        s.received(&envelope(Request::Drain), vec![]);
        assert!(matches!(
            s.next_input(usize::MAX),
            Some(Input::Control(Control::Drain))
        ));
        assert!(!s.closing());
        s.answer(Kind::Exit, &ExitNote::default());
        assert!(s.closing() && s.run().is_none());
        let n = s.queued();
        assert!(n > protocol::HEADER);
        s.wrote(2);
        assert_eq!(s.queued(), n - 2);
        s.wrote(n - 2);
        assert_eq!((s.queued(), s.unwritten().len()), (0, 0));
    }
}

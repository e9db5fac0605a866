//! The wire format between clients (the `terraform` shim, `tfinit status|drain|resume`) and the
//! init, over a Unix stream socket. Documented in docs/protocol.md.
//!
//! A connection carries frames: one kind byte, a 4-byte big-endian payload length, the payload.
//! The client's first frame is a `Request` (JSON with a version field `v`); the shim passes its
//! stdin as an SCM_RIGHTS file descriptor alongside it. The init answers a run with `Stdout` and
//! `Stderr` frames (raw bytes, in order within each stream) and one `Exit` frame (JSON); a control
//! request with one `Reply` frame (JSON). A shim may send `Signal` frames (JSON) while it waits.

use serde::{Deserialize, Serialize};

/// The protocol version this build speaks. A request with another version gets an error reply.
pub const VERSION: u32 = 1;

/// Largest payload a client accepts from the init (replies carry the status of every run).
pub const MAX_PAYLOAD: usize = 4 << 20;

/// The kernel's floor for the bytes of argument and environment strings exec(2) takes: 32 pages
/// (the historical ARG_MAX), whatever the stack limit.
pub const ARG_MAX_FLOOR: usize = 128 << 10;

/// The kernel's ceiling for the same: 3/4 of its 8 MiB `_STK_LIM`, whatever the stack limit
/// (fs/exec.c; measured: `ulimit -s unlimited` and `ulimit -s 65536` both give 6 MiB).
pub const ARG_MAX_CEILING: usize = 6 << 20;

/// What a request carries besides its arguments and environment: the program and working
/// directory (each at most PATH_MAX, 4 KiB), the field names, the workspace, and JSON's escapes.
pub const ENVELOPE: usize = 64 << 10;

/// Bytes of argument and environment strings exec(2) takes in a process whose soft stack limit
/// is `stack` (None: unlimited): a quarter of it, between [`ARG_MAX_FLOOR`] and
/// [`ARG_MAX_CEILING`], as the kernel computes it (measured on Linux 6.18: 8 MiB of stack gives
/// `getconf ARG_MAX` = 2,097,152 and 16 MiB gives 4 MiB). Each string counts its bytes, its NUL
/// and an 8-byte pointer, and is at most 128 KiB (MAX_ARG_STRLEN).
pub fn arg_max(stack: Option<u64>) -> usize {
    let quarter = stack.map_or(usize::MAX, |s| usize::try_from(s / 4).unwrap_or(usize::MAX));
    quarter.clamp(ARG_MAX_FLOOR, ARG_MAX_CEILING)
}

/// The largest request frame the init takes when its children's exec(2) takes `arg_max` bytes
/// of strings ([`arg_max`]): anything larger could not start terraform anyway. A string costs
/// exec(2) its bytes plus 9 (NUL and pointer) and costs JSON its bytes plus 3 (quotes and
/// comma), so the JSON of what exec(2) takes fits in `arg_max`; [`ENVELOPE`] covers the rest.
pub fn request_limit(arg_max: usize) -> usize {
    arg_max + ENVELOPE
}

/// [`request_limit`] for this process's own stack limit (the init's children inherit it).
pub fn request_limit_here() -> usize {
    request_limit(arg_max(crate::sys::stack_limit()))
}

/// Largest data payload the init sends in one frame.
pub const MAX_DATA: usize = 256 << 10;

/// Frame header length.
pub const HEADER: usize = 5;

/// Exit code of the shim when the init refuses to start terraform because it is draining or
/// shutting down (EX_TEMPFAIL: try again later; the controller's next reconcile does).
pub const EXIT_REFUSED: i32 = 75;

/// Exit code of the shim when the init failed it in some other way (bad request, init gone).
pub const EXIT_INIT_ERROR: i32 = 125;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Client → init: the JSON request (first frame).
    Request,
    /// Client → init: the shim received a signal (JSON [`SignalNote`]).
    Signal,
    /// Init → client: terraform's stdout bytes.
    Stdout,
    /// Init → client: terraform's stderr bytes.
    Stderr,
    /// Init → client: how the run ended (JSON [`ExitNote`]); the last frame of a run.
    Exit,
    /// Init → client: the answer to a control request (JSON).
    Reply,
}

impl Kind {
    fn byte(self) -> u8 {
        match self {
            Kind::Request => b'R',
            Kind::Signal => b'S',
            Kind::Stdout => b'O',
            Kind::Stderr => b'E',
            Kind::Exit => b'X',
            Kind::Reply => b'J',
        }
    }

    fn from_byte(b: u8) -> Option<Kind> {
        Some(match b {
            b'R' => Kind::Request,
            b'S' => Kind::Signal,
            b'O' => Kind::Stdout,
            b'E' => Kind::Stderr,
            b'X' => Kind::Exit,
            b'J' => Kind::Reply,
            _ => return None,
        })
    }
}

/// A decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// What it carries.
    pub kind: Kind,
    /// The payload.
    pub payload: Vec<u8>,
}

/// Why a byte stream is not a valid frame sequence.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    /// The kind byte is unknown.
    #[error(
        "unknown frame kind byte 0x{0:02x} (is the peer a tfinit client of the same version?)"
    )]
    UnknownKind(u8),
    /// The announced length is over the limit.
    #[error("frame of {len} bytes is over the limit of {limit} bytes (what exec(2) takes for terraform's arguments and environment here, ARG_MAX, plus {ENVELOPE} bytes)")]
    TooLarge {
        /// The announced length.
        len: usize,
        /// The limit.
        limit: usize,
    },
}

/// Appends one frame to `out`.
pub fn encode(kind: Kind, payload: &[u8], out: &mut Vec<u8>) {
    out.reserve(HEADER + payload.len());
    out.push(kind.byte());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
}

/// Encodes a JSON frame.
pub fn encode_json<T: Serialize>(kind: Kind, value: &T, out: &mut Vec<u8>) {
    // Serializing our own plain structs cannot fail; an empty object keeps the stream valid.
    let body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    encode(kind, &body, out);
}

/// Checks a frame header: its kind, and its payload length against `limit`.
pub fn parse_header(h: [u8; HEADER], limit: usize) -> Result<(Kind, usize), DecodeError> {
    let kind = Kind::from_byte(h[0]).ok_or(DecodeError::UnknownKind(h[0]))?;
    let len = u32::from_be_bytes([h[1], h[2], h[3], h[4]]) as usize;
    if len > limit {
        return Err(DecodeError::TooLarge { len, limit });
    }
    Ok((kind, len))
}

/// A decoder's buffer is given back to the allocator once empty if it grew past this: a
/// connection that once received a large request must not keep its memory for the whole run.
const KEEP: usize = 64 << 10;

/// Incremental frame decoder: push bytes as they arrive, take whole frames out. It holds at most
/// one unfinished frame of at most `limit` bytes, plus the bytes of one push after it.
#[derive(Debug)]
pub struct Decoder {
    buf: Vec<u8>,
    start: usize,
    limit: usize,
}

impl Decoder {
    /// A decoder of frames of at most `limit` payload bytes.
    pub fn new(limit: usize) -> Decoder {
        Decoder {
            buf: Vec::new(),
            start: 0,
            limit,
        }
    }

    /// Appends received bytes. The buffer grows as bytes come (doubling, so that each byte is
    /// copied about once), but never past the frame whose header is in: a frame announced and
    /// never sent reserves no more than what came of it.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        let need = self.buf.len() + bytes.len();
        if need > self.buf.capacity() {
            let doubled = need.max(2 * self.buf.capacity()).max(KEEP);
            let target = match self.frame_len() {
                // The frame's end (and what comes after it in this push) is as far as it goes.
                Some(whole) => doubled.min((self.start + whole).max(need)),
                None => doubled,
            };
            self.buf.reserve_exact(target - self.buf.len());
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes received but not yet decoded.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Drops every byte received and not decoded (the connection is answered and read no more).
    pub fn clear(&mut self) {
        self.buf = Vec::new();
        self.start = 0;
    }

    /// The payload length the unfinished frame announced, once its header came.
    pub fn expected(&self) -> Option<usize> {
        self.frame_len().map(|n| n - HEADER)
    }

    /// The length (header included) of the frame that starts the pending bytes, once its header
    /// is in and valid.
    fn frame_len(&self) -> Option<usize> {
        let h = self.buf.get(self.start..self.start + HEADER)?;
        let (_, len) = parse_header([h[0], h[1], h[2], h[3], h[4]], self.limit).ok()?;
        Some(HEADER + len)
    }

    /// The next whole frame, if one has arrived. An error is final for the connection.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, DecodeError> {
        let avail = &self.buf[self.start..];
        if avail.is_empty() {
            return Ok(None);
        }
        Kind::from_byte(avail[0]).ok_or(DecodeError::UnknownKind(avail[0]))?;
        if avail.len() < HEADER {
            return Ok(None);
        }
        let h = [avail[0], avail[1], avail[2], avail[3], avail[4]];
        let (kind, len) = parse_header(h, self.limit)?;
        if avail.len() < HEADER + len {
            return Ok(None);
        }
        let payload = if self.start == 0 && self.buf.len() == HEADER + len {
            // The buffer is this one frame (a request, most often): hand it over without a copy
            // of up to `limit` bytes.
            let mut whole = std::mem::take(&mut self.buf);
            whole.drain(..HEADER);
            whole
        } else {
            let p = avail[HEADER..HEADER + len].to_vec();
            self.start += HEADER + len;
            p
        };
        if self.start == self.buf.len() && self.buf.capacity() > KEEP {
            self.clear();
        } else if self.start > KEEP && self.start * 2 > self.buf.len() {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        Ok(Some(Frame { kind, payload }))
    }
}

/// A client's request (the `Request` frame's JSON).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Envelope {
    /// Protocol version: [`VERSION`].
    pub v: u32,
    /// What is asked.
    #[serde(flatten)]
    pub request: Request,
}

/// What a client asks.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Start terraform as the init's child and relay it to this connection.
    Run(RunRequest),
    /// Report the phase and the runs.
    Status,
    /// Enter draining: refuse new runs.
    Drain,
    /// Leave draining.
    Resume,
    /// The metrics, in the OpenMetrics text format (`tfinit metrics`).
    Metrics,
    /// Stop one run, or every run in a directory (`tfinit cancel`).
    Cancel(CancelRequest),
}

/// What a file is, whatever path reached it: its device and inode numbers (stat(2)'s `st_dev`
/// and `st_ino`). Two paths name the same directory exactly when these are equal, through
/// symbolic links, bind mounts and `..` alike; the text of a path is only a name.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash)]
pub struct FileId {
    /// The device.
    pub dev: u64,
    /// The inode.
    pub ino: u64,
}

impl FileId {
    /// The id of the open file `f` (fstat: the file itself, whatever is at its path now).
    pub fn of(f: &std::fs::File) -> std::io::Result<FileId> {
        use std::os::unix::fs::MetadataExt;
        let m = f.metadata()?;
        Ok(FileId {
            dev: m.dev(),
            ino: m.ino(),
        })
    }
}

/// `tfinit cancel`: exactly one of `run` and `workdir`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CancelRequest {
    /// The run's id, as `tfinit status` shows it (`r7`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// An absolute directory: every run whose working directory it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// What `workdir` is, as the client found it: runs whose shim sent their directories' ids are
    /// matched by these numbers; the others, and all of them when this is absent (an older
    /// client, a directory that could not be stat'ed), by `workdir`'s text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir_id: Option<FileId>,
    /// SIGKILL the runs' process groups at once instead of the graceful SIGTERM.
    #[serde(default)]
    pub force: bool,
}

/// A terraform run as the shim saw it invoked.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RunRequest {
    /// Absolute path of the real terraform binary (resolved by the shim).
    pub program: String,
    /// The `argv[0]` the shim was invoked with (kept for terraform).
    pub argv0: String,
    /// Arguments after `argv[0]`.
    pub args: Vec<String>,
    /// Working directory.
    pub cwd: String,
    /// Environment, as `KEY=VALUE` strings.
    pub env: Vec<String>,
    /// The workspace stored in the run's data directory (`$TF_DATA_DIR/environment`, default
    /// `.terraform/environment`, in cwd + -chdir), read by the shim in its own process so the
    /// init never reads in a working directory; absent when there is none or it is not valid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    /// What `cwd` is, stat'ed by the shim in its own process (the init never stats a working
    /// directory: a hung volume would stall its loop), for `tfinit cancel --workdir`; absent from
    /// an older shim or when the stat failed (the run is then matched by its text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd_id: Option<FileId>,
    /// What the directory terraform works in (`cwd` + `-chdir`) is, likewise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir_id: Option<FileId>,
}

/// The non-empty value of `key` in `KEY=VALUE` strings (a run's environment): the first entry
/// with that key counts, as for Go's os.Getenv (syscall's copyenv keeps the first of duplicate
/// keys), so terraform reads the same value.
pub fn env_value<'a>(env: &'a [String], key: &str) -> Option<&'a str> {
    env.iter()
        .find_map(|kv| kv.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        .filter(|v| !v.is_empty())
}

/// How a run ended, or why it never started.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExitNote {
    /// The exit code the shim must exit with (128+N for death by signal N).
    pub code: i32,
    /// The signal terraform died of, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Why terraform was not started or the request failed; the shim prints it to stderr.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The run id, for correlating with the init's logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
}

/// A signal the shim received (the `Signal` frame's JSON).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SignalNote {
    /// The signal number.
    pub signal: i32,
}

/// A control request's answer (the `Reply` frame's JSON).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Reply {
    /// Protocol version.
    pub v: u32,
    /// Whether the request was carried out.
    pub ok: bool,
    /// Why not, when `ok` is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The status document, for `status`, `drain` and `resume`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    /// The metrics text, for `metrics`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<String>,
    /// For `cancel`: what was done to each run it named, one line each (`r7: SIGTERM sent...`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cancelled: Vec<String>,
}

/// `tfinit status`: the init and its runs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Status {
    /// Format version.
    pub v: u32,
    /// The init's pid (1 in a container).
    pub pid: i32,
    /// running, draining or stopping.
    pub phase: String,
    /// When stopping: the deadline (its two fields stand in the status itself).
    #[serde(flatten)]
    pub deadline: Option<Deadline>,
    /// The controller's pid, while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub main_pid: Option<i32>,
    /// The lock-owner records' store, as the init knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub records: Option<RecordsStatus>,
    /// terraform runs in flight.
    pub runs: Vec<RunStatus>,
}

/// The deadline in `tfinit status`, while stopping.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Deadline {
    /// The deadline, Unix seconds.
    pub deadline_unix: f64,
    /// Seconds until the deadline (negative once past).
    pub seconds_left: f64,
}

/// The lock-owner records' store in `tfinit status`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RecordsStatus {
    /// `opening`, `open`, `failed`, `not_answering` or `heartbeat_stale`.
    pub state: String,
    /// Seconds since this owner's heartbeat was last written successfully (none yet: null).
    #[serde(default)]
    pub heartbeat_age_seconds: Option<f64>,
}

/// One run in `tfinit status`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunStatus {
    /// Run id.
    pub id: String,
    /// terraform's pid (0 while a lock recovery runs first).
    pub pid: i32,
    /// terraform's process group.
    pub pgid: i32,
    /// Working directory.
    pub cwd: String,
    /// The terraform subcommand (`apply`, `state rm`...).
    pub subcommand: String,
    /// argv with secrets replaced by `<redacted>`.
    pub argv: Vec<String>,
    /// Start time, Unix seconds.
    pub started_unix: f64,
    /// Whether the shim that asked for it is still connected.
    pub attached: bool,
    /// Whether terraform was asked to stop gracefully (its one SIGTERM).
    pub stop_requested: bool,
    /// Where the run is in its life: `queued` (waiting for a place under TFINIT_MAX_RUNS),
    /// `recovering` (a lock recovery runs first), `recording` (its lock-owner record is being
    /// written), `running`, or `exited` (terraform was reaped, its output is still being
    /// drained). Empty from an older init.
    #[serde(default)]
    pub state: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_split_anywhere() {
        let mut wire = Vec::new();
        encode(Kind::Stdout, b"hello", &mut wire);
        encode(Kind::Stderr, b"", &mut wire);
        encode_json(
            Kind::Exit,
            &ExitNote {
                code: 2,
                ..Default::default()
            },
            &mut wire,
        );
        for split in 0..wire.len() {
            let mut d = Decoder::new(MAX_PAYLOAD);
            let mut got = Vec::new();
            d.push(&wire[..split]);
            while let Some(f) = d.next_frame().unwrap() {
                got.push(f);
            }
            d.push(&wire[split..]);
            while let Some(f) = d.next_frame().unwrap() {
                got.push(f);
            }
            assert_eq!(got.len(), 3, "split at {split}");
            assert_eq!(got[0].payload, b"hello");
            assert_eq!(got[1].kind, Kind::Stderr);
            let exit: ExitNote = serde_json::from_slice(&got[2].payload).unwrap();
            assert_eq!(exit.code, 2);
        }
    }

    #[test]
    fn rejects_unknown_kind_and_oversized() {
        let mut d = Decoder::new(MAX_PAYLOAD);
        d.push(b"Z\0\0\0\0");
        assert_eq!(d.next_frame(), Err(DecodeError::UnknownKind(b'Z')));
        let mut d = Decoder::new(MAX_PAYLOAD);
        d.push(&[b'R', 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(
            d.next_frame(),
            Err(DecodeError::TooLarge {
                len: 0xffff_ffff,
                limit: MAX_PAYLOAD
            })
        );
        // The limit is the decoder's: one byte over it is refused, the limit itself is not.
        let mut d = Decoder::new(10);
        d.push(&[b'R', 0, 0, 0, 11]);
        assert_eq!(
            d.next_frame(),
            Err(DecodeError::TooLarge { len: 11, limit: 10 })
        );
        let mut d = Decoder::new(10);
        d.push(&[b'R', 0, 0, 0, 10]);
        d.push(&[b'x'; 10]);
        assert_eq!(d.next_frame().unwrap().unwrap().payload, vec![b'x'; 10]);
    }

    #[test]
    fn a_large_frame_is_handed_over_whole_and_its_memory_given_back() {
        let mut d = Decoder::new(1 << 20);
        let mut wire = Vec::new();
        encode(Kind::Request, &vec![b'r'; 1 << 20], &mut wire);
        encode(Kind::Signal, b"{}", &mut wire);
        // In 16 KiB pushes, as the loop reads: the buffer grows with what came, never past the
        // frame.
        let mut chunks = wire[..HEADER + (1 << 20)].chunks(16 << 10);
        d.push(chunks.next().unwrap());
        d.push(chunks.next().unwrap());
        assert!(
            d.buf.capacity() <= KEEP,
            "announced is not reserved: {}",
            d.buf.capacity()
        );
        for chunk in chunks {
            d.push(chunk);
        }
        assert_eq!(d.buf.capacity(), HEADER + (1 << 20));
        assert_eq!(d.pending(), HEADER + (1 << 20));
        let f = d.next_frame().unwrap().unwrap();
        assert_eq!((f.kind, f.payload.len()), (Kind::Request, 1 << 20));
        assert_eq!((d.pending(), d.buf.capacity()), (0, 0));
        d.push(&wire[HEADER + (1 << 20)..]);
        assert_eq!(d.next_frame().unwrap().unwrap().kind, Kind::Signal);
        assert_eq!(d.next_frame(), Ok(None));
    }

    #[test]
    fn the_request_limit_is_what_exec_takes_plus_the_envelope() {
        assert_eq!(arg_max(Some(8 << 20)), 2 << 20, "the default 8 MiB stack");
        assert_eq!(arg_max(Some(16 << 20)), 4 << 20);
        assert_eq!(arg_max(Some(64 << 20)), ARG_MAX_CEILING);
        assert_eq!(arg_max(None), ARG_MAX_CEILING, "an unlimited stack");
        assert_eq!(arg_max(Some(256 << 10)), ARG_MAX_FLOOR);
        assert_eq!(request_limit(2 << 20), (2 << 20) + (64 << 10));
    }

    #[test]
    fn request_json_has_version_and_op() {
        let e = Envelope {
            v: VERSION,
            request: Request::Status,
        };
        let s = serde_json::to_string(&e).unwrap();
        assert_eq!(s, r#"{"v":1,"op":"status"}"#);
        let back: Envelope = serde_json::from_str(&s).unwrap();
        assert_eq!(back, e);
    }

    #[test]
    fn a_cancel_names_a_run_or_a_directory() {
        let e = Envelope {
            v: VERSION,
            request: Request::Cancel(CancelRequest {
                run: Some("r7".into()),
                workdir: None,
                workdir_id: None,
                force: true,
            }),
        };
        let s = serde_json::to_string(&e).unwrap();
        assert_eq!(s, r#"{"v":1,"op":"cancel","run":"r7","force":true}"#);
        assert_eq!(serde_json::from_str::<Envelope>(&s).unwrap(), e);
        let dir: Envelope =
            serde_json::from_str(r#"{"v":1,"op":"cancel","workdir":"/tf/x"}"#).unwrap();
        assert_eq!(
            dir.request,
            Request::Cancel(CancelRequest {
                run: None,
                workdir: Some("/tf/x".into()),
                workdir_id: None,
                force: false
            })
        );
        let by_id =
            r#"{"v":1,"op":"cancel","workdir":"/tf/x","workdir_id":{"dev":2049,"ino":131}}"#;
        let Request::Cancel(c) = serde_json::from_str::<Envelope>(by_id).unwrap().request else {
            panic!("a cancel");
        };
        assert_eq!(
            c.workdir_id,
            Some(FileId {
                dev: 2049,
                ino: 131
            })
        );
    }

    /// The directories' ids are new optional fields of version 1: a shim without them is read
    /// as before, and a request with them reads back whole (an older init ignores them).
    #[test]
    fn a_run_request_carries_its_directories_ids_when_the_shim_found_them() {
        let old = r#"{"v":1,"op":"run","program":"/bin/terraform","argv0":"terraform","args":["plan"],"cwd":"/tf","env":[]}"#;
        let Request::Run(r) = serde_json::from_str::<Envelope>(old).unwrap().request else {
            panic!("a run");
        };
        assert_eq!((r.cwd_id, r.workdir_id), (None, None));
        let ids = RunRequest {
            cwd_id: Some(FileId { dev: 1, ino: 2 }),
            workdir_id: Some(FileId {
                dev: u64::MAX,
                ino: u64::MAX,
            }),
            ..r
        };
        let json = serde_json::to_string(&ids).unwrap();
        assert!(
            json.ends_with(r#""cwd_id":{"dev":1,"ino":2},"workdir_id":{"dev":18446744073709551615,"ino":18446744073709551615}}"#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<RunRequest>(&json).unwrap(), ids);
        // And the other way round: a field this build does not know is ignored, as an older
        // init ignores these.
        let newer = r#"{"v":1,"op":"run","program":"/bin/terraform","argv0":"terraform","args":[],"cwd":"/tf","env":[],"from_the_future":{"x":1}}"#;
        assert!(serde_json::from_str::<Envelope>(newer).is_ok());
        let newer = r#"{"v":1,"op":"cancel","workdir":"/tf","from_the_future":1}"#;
        assert!(serde_json::from_str::<Envelope>(newer).is_ok());
    }

    #[test]
    fn the_deadline_stands_in_the_status_only_while_stopping_and_reads_back() {
        let mut status = Status {
            v: VERSION,
            pid: 1,
            phase: "running".into(),
            deadline: None,
            main_pid: Some(7),
            records: None,
            runs: vec![],
        };
        let json = serde_json::to_string(&status).unwrap();
        assert_eq!(
            json,
            r#"{"v":1,"pid":1,"phase":"running","main_pid":7,"runs":[]}"#
        );
        assert_eq!(serde_json::from_str::<Status>(&json).unwrap(), status);
        status.phase = "stopping".into();
        status.deadline = Some(Deadline {
            deadline_unix: 1.5,
            seconds_left: -2.0,
        });
        let json = serde_json::to_string(&status).unwrap();
        assert_eq!(
            json,
            r#"{"v":1,"pid":1,"phase":"stopping","deadline_unix":1.5,"seconds_left":-2.0,"main_pid":7,"runs":[]}"#
        );
        assert_eq!(serde_json::from_str::<Status>(&json).unwrap(), status);
    }
}

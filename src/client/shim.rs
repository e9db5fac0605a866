//! The `terraform` shim: asks the init to start the real terraform as its child and relays it.
//!
//! The shim passes its stdin to the init (SCM_RIGHTS), then copies the init's stdout/stderr
//! frames to its own stdout/stderr and exits with terraform's exit code. SIGTERM/SIGINT are
//! passed on as a stop request (the init sends terraform one SIGTERM, once). If the shim is
//! killed, terraform keeps running under the init. Without an init, it runs terraform itself.

use std::ffi::{OsStr, OsString};
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use super::{read_frame, write_frame};
use crate::config;
use crate::config::socket_path;
use crate::protocol::{self, Envelope, ExitNote, Kind, Request, RunRequest, SignalNote};
use crate::terraform;

/// Runs the shim: `argv0` as invoked, `name` is `terraform` or `tofu`; returns the exit code.
pub fn main(argv0: &OsStr, name: &str, args: Vec<OsString>) -> i32 {
    crate::logging::init_client();
    let program = match terraform::find_real(
        name,
        std::env::var_os("TFINIT_TERRAFORM").as_deref(),
        std::env::var_os("PATH").as_deref(),
    ) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("tfinit: {e}");
            return 127;
        }
    };
    let run_dir = config::client_run_dir();
    let sock_path = socket_path(&run_dir);
    let request = match build_request(&program, argv0, &args) {
        Ok(r) => r,
        Err(why) => return fallback(&program, argv0, &args, &why),
    };
    let sock = match UnixStream::connect(&sock_path) {
        Ok(s) => s,
        Err(e) => {
            let why = format!("no tfinit init answers on {} ({e})", sock_path.display());
            return fallback(&program, argv0, &args, &why);
        }
    };
    match relay(sock, &request) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tfinit: lost the connection to the init while terraform ran: {e}");
            protocol::EXIT_INIT_ERROR
        }
    }
}

/// Runs terraform directly (replacing this process), after one warning line.
fn fallback(program: &Path, argv0: &OsStr, args: &[OsString], why: &str) -> i32 {
    eprintln!(
        "tfinit: warning: {why}; running {} directly, without tfinit's protection (make tfinit the container's entrypoint: ENTRYPOINT [\"/usr/local/bin/tfinit\", \"--\"])",
        program.display()
    );
    let err = std::process::Command::new(program)
        .arg0(argv0)
        .args(args)
        .exec();
    eprintln!("tfinit: cannot execute {}: {err}", program.display());
    if err.kind() == io::ErrorKind::NotFound {
        127
    } else {
        126
    }
}

fn utf8(what: &str, s: &OsStr) -> Result<String, String> {
    s.to_str().map(str::to_string).ok_or_else(|| {
        format!("{what} {s:?} is not valid UTF-8, which the init's protocol cannot carry")
    })
}

fn build_request(program: &Path, argv0: &OsStr, args: &[OsString]) -> Result<RunRequest, String> {
    let cwd =
        std::env::current_dir().map_err(|e| format!("cannot read the working directory: {e}"))?;
    let mut env = Vec::new();
    for (k, v) in std::env::vars_os() {
        let mut kv = k.clone();
        kv.push("=");
        kv.push(&v);
        env.push(utf8("environment variable", &kv)?);
    }
    let args: Vec<String> = args
        .iter()
        .map(|a| utf8("argument", a))
        .collect::<Result<_, _>>()?;
    // Read here, in the shim's own process: the init's loop never reads in a working directory
    // (a hung volume there would stall it).
    let workdir = terraform::Invocation::parse(&args, &env).workdir(&cwd);
    let workspace = crate::locks::workspace::stored_workspace(&env, &workdir);
    Ok(RunRequest {
        program: utf8("path", program.as_os_str())?,
        argv0: utf8("argv[0]", argv0)?,
        args,
        cwd: utf8("working directory", cwd.as_os_str())?,
        env,
        workspace,
        // What the directories are, for `tfinit cancel --workdir`: a run started with
        // -chdir=link is found by the directory the link leads to, and the other way round.
        cwd_id: super::file_id(&cwd),
        workdir_id: super::file_id(&workdir),
    })
}

/// Sends the request, then relays frames until the exit note arrives.
fn relay(mut sock: UnixStream, request: &RunRequest) -> io::Result<i32> {
    let sigfd = read_signals()?;
    if let Some(code) = send_request(&mut sock, request)? {
        return Ok(code);
    }
    let mut payload = Vec::with_capacity(protocol::MAX_DATA);
    loop {
        let Some((frames, signals)) = wait_readable(&sock, &sigfd)? else {
            continue;
        };
        if signals {
            pass_stop_signals(&sigfd, &mut sock)?;
        }
        if frames {
            if let Some(code) = relay_frame(&mut sock, &mut payload)? {
                return Ok(code);
            }
        }
    }
}

/// Every catchable signal is read here rather than acted on: the shim sits in the controller's
/// process group, so signals meant for the controller (a SIGHUP forwarded by the init, say)
/// reach it too, and dying of one would abandon terraform. Only SIGTERM and SIGINT mean "stop
/// terraform"; the rest are ignored. SIGKILL still ends the shim, never terraform.
fn read_signals() -> io::Result<SignalFd> {
    let mask = crate::signals::init_mask();
    mask.thread_block().map_err(io::Error::from)?;
    Ok(SignalFd::with_flags(
        &mask,
        SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC,
    )?)
}

/// Sends the request with our stdin. Returns the exit code when the init answered before it
/// read the request (it refuses a client of another uid at once).
fn send_request(sock: &mut UnixStream, request: &RunRequest) -> io::Result<Option<i32>> {
    let body = serde_json::to_vec(&Envelope {
        v: protocol::VERSION,
        request: Request::Run(request.clone()),
    })
    .map_err(io::Error::other)?;
    let mut frame = Vec::new();
    protocol::encode(Kind::Request, &body, &mut frame);
    let Err(e) = send_with_stdin(sock, &frame) else {
        return Ok(None);
    };
    // The init may have answered and closed before reading the request: its answer is still in
    // our receive queue.
    let mut payload = Vec::new();
    if let Ok(Some(Kind::Exit)) = read_frame(sock, &mut payload) {
        if let Ok(note) = serde_json::from_slice::<ExitNote>(&payload) {
            if let Some(why) = &note.error {
                eprintln!("{why}");
            }
            return Ok(Some(note.code));
        }
    }
    Err(e)
}

/// Waits until the socket or the signalfd is readable: whether each is; None when interrupted.
fn wait_readable(sock: &UnixStream, sigfd: &SignalFd) -> io::Result<Option<(bool, bool)>> {
    let mut fds = [
        PollFd::new(sock.as_fd(), PollFlags::POLLIN),
        PollFd::new(sigfd.as_fd(), PollFlags::POLLIN),
    ];
    match poll(&mut fds, PollTimeout::NONE) {
        Ok(_) => Ok(Some((
            fds[0].any().unwrap_or(false),
            fds[1].any().unwrap_or(false),
        ))),
        Err(nix::errno::Errno::EINTR) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Passes SIGTERM and SIGINT on to the init as a stop request; ignores the others.
fn pass_stop_signals(sigfd: &SignalFd, sock: &mut UnixStream) -> io::Result<()> {
    while let Ok(Some(info)) = sigfd.read_signal() {
        let signo = info.ssi_signo as i32;
        if signo != libc::SIGTERM && signo != libc::SIGINT {
            tracing::debug!(signal = %crate::signals::name(signo), "ignored: only SIGTERM and SIGINT stop terraform");
            continue;
        }
        let body = serde_json::to_vec(&SignalNote { signal: signo }).map_err(io::Error::other)?;
        write_frame(sock, Kind::Signal, &body)?;
    }
    Ok(())
}

/// Relays one frame from the init: terraform's output to ours, or its exit code (returned).
fn relay_frame(sock: &mut UnixStream, payload: &mut Vec<u8>) -> io::Result<Option<i32>> {
    let Some(kind) = read_frame(sock, payload)? else {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the init closed the connection before terraform's exit code arrived",
        ));
    };
    let written = match kind {
        Kind::Stdout => write_out(&mut io::stdout().lock(), payload),
        Kind::Stderr => write_out(&mut io::stderr().lock(), payload),
        Kind::Exit => {
            let note: ExitNote = serde_json::from_slice(payload).map_err(io::Error::other)?;
            if let Some(e) = &note.error {
                let _ = writeln!(io::stderr().lock(), "{e}");
            }
            return Ok(Some(note.code));
        }
        other => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unexpected {other:?} frame from the init"),
            ));
        }
    };
    match written {
        Ok(()) => Ok(None),
        // Our caller stopped reading: exit as a direct terraform would (128 + SIGPIPE). Closing
        // the socket abandons the run, which the init stops.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
            let _ = writeln!(io::stderr().lock(), "tfinit: the caller closed terraform's output; terraform is left to the init, which stops it");
            Ok(Some(128 + libc::SIGPIPE))
        }
        Err(e) => Err(e),
    }
}

fn write_out(w: &mut impl Write, bytes: &[u8]) -> io::Result<()> {
    w.write_all(bytes)?;
    w.flush()
}

/// Sends the request frame with our stdin attached, so terraform reads the caller's stdin itself.
fn send_with_stdin(sock: &UnixStream, frame: &[u8]) -> io::Result<()> {
    let stdin = io::stdin();
    let fd: BorrowedFd<'_> = stdin.as_fd();
    // A closed stdin cannot be passed: terraform then gets /dev/null.
    let sent = match nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD) {
        Ok(_) => crate::sys::send_with_fd(sock.as_fd(), frame, fd).map_err(io::Error::from)?,
        Err(_) => 0,
    };
    let mut s = sock;
    s.write_all(&frame[sent..])
}

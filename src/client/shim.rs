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
    let workdir = terraform::Invocation::parse(&args).workdir(&cwd);
    let workspace = crate::locks::workspace::stored_workspace(&env, &workdir);
    Ok(RunRequest {
        program: utf8("path", program.as_os_str())?,
        argv0: utf8("argv[0]", argv0)?,
        args,
        cwd: utf8("working directory", cwd.as_os_str())?,
        env,
        workspace,
    })
}

/// Sends the request, then relays frames until the exit note arrives.
fn relay(mut sock: UnixStream, request: &RunRequest) -> io::Result<i32> {
    // Every catchable signal is read here rather than acted on: the shim sits in the controller's
    // process group, so signals meant for the controller (a SIGHUP forwarded by the init, say)
    // reach it too, and dying of one would abandon terraform. Only SIGTERM and SIGINT mean
    // "stop terraform"; the rest are ignored. SIGKILL still ends the shim, never terraform.
    let mask = crate::signals::init_mask();
    mask.thread_block().map_err(io::Error::from)?;
    let sigfd = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)?;

    let body = serde_json::to_vec(&Envelope {
        v: protocol::VERSION,
        request: Request::Run(request.clone()),
    })
    .map_err(io::Error::other)?;
    let mut frame = Vec::new();
    protocol::encode(Kind::Request, &body, &mut frame);
    if let Err(e) = send_with_stdin(&sock, &frame) {
        // The init may have answered and closed before reading the request (it refuses a client
        // of another uid at once): its answer is still in our receive queue.
        let mut payload = Vec::new();
        if let Ok(Some(Kind::Exit)) = read_frame(&mut sock, &mut payload) {
            if let Ok(note) = serde_json::from_slice::<ExitNote>(&payload) {
                if let Some(why) = &note.error {
                    eprintln!("{why}");
                }
                return Ok(note.code);
            }
        }
        return Err(e);
    }

    let stdout = io::stdout();
    let stderr = io::stderr();
    let mut payload = Vec::with_capacity(protocol::MAX_DATA);
    loop {
        let ready = {
            let mut fds = [
                PollFd::new(sock.as_fd(), PollFlags::POLLIN),
                PollFd::new(sigfd.as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => (fds[0].any().unwrap_or(false), fds[1].any().unwrap_or(false)),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
        };
        if ready.1 {
            while let Ok(Some(info)) = sigfd.read_signal() {
                let signo = info.ssi_signo as i32;
                if signo != libc::SIGTERM && signo != libc::SIGINT {
                    tracing::debug!(signal = %crate::signals::name(signo), "ignored: only SIGTERM and SIGINT stop terraform");
                    continue;
                }
                let note = SignalNote { signal: signo };
                let body = serde_json::to_vec(&note).map_err(io::Error::other)?;
                write_frame(&mut sock, Kind::Signal, &body)?;
            }
        }
        if !ready.0 {
            continue;
        }
        let Some(kind) = read_frame(&mut sock, &mut payload)? else {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the init closed the connection before terraform's exit code arrived",
            ));
        };
        match kind {
            Kind::Stdout | Kind::Stderr => {
                let written = match kind {
                    Kind::Stdout => write_out(&mut stdout.lock(), &payload),
                    _ => write_out(&mut stderr.lock(), &payload),
                };
                if let Err(e) = written {
                    if e.kind() == io::ErrorKind::BrokenPipe {
                        // Our caller stopped reading: exit as a direct terraform would (128 +
                        // SIGPIPE). Closing the socket abandons the run, which the init stops.
                        let _ = writeln!(stderr.lock(), "tfinit: the caller closed terraform's output; terraform is left to the init, which stops it");
                        return Ok(128 + libc::SIGPIPE);
                    }
                    return Err(e);
                }
            }
            Kind::Exit => {
                let note: ExitNote = serde_json::from_slice(&payload).map_err(io::Error::other)?;
                if let Some(e) = &note.error {
                    let _ = writeln!(stderr.lock(), "{e}");
                }
                return Ok(note.code);
            }
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("unexpected {other:?} frame from the init"),
                ));
            }
        }
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

//! Every `unsafe` block of tfinit lives here, each with the reason it is sound.
//!
//! The rest of the code calls these safe functions and never touches raw signal numbers through
//! libc itself. Harmless errnos are handled by name where the caller needs it (ESRCH from kill).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::errno::Errno;
use nix::unistd::Pid;

/// A signal by its raw number: real-time signals have no `nix::sys::signal::Signal` variant.
pub(crate) type SigNo = i32;

/// Where a kill goes: one process, a whole process group, or every process we may signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// A single process.
    Pid(Pid),
    /// Every member of a process group (kill with a negative pid).
    Group(Pid),
    /// Every process in the PID namespace except ourselves (kill(-1)); only used as PID 1.
    Everyone,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Pid(p) => write!(f, "pid {p}"),
            Target::Group(p) => write!(f, "process group {p}"),
            Target::Everyone => write!(f, "every process"),
        }
    }
}

/// The one function that turns a target into kill(2). Signal 0 probes existence.
pub(crate) fn kill(target: Target, signo: SigNo) -> Result<(), Errno> {
    let raw = match target {
        Target::Pid(p) => p.as_raw(),
        Target::Group(p) => -p.as_raw(),
        Target::Everyone => -1,
    };
    if raw == 0 || raw == 1 && matches!(target, Target::Group(_)) {
        // kill(0) or kill(-1) by accident would hit our own group or everyone.
        return Err(Errno::EINVAL);
    }
    // SAFETY: kill(2) takes plain integers, touches no memory of ours; any pid/signal value is
    // accepted by the kernel and reported through errno.
    let rc = unsafe { libc::kill(raw, signo) };
    Errno::result(rc).map(drop)
}

/// Whether a process group still has any member (zombies count until reaped).
pub(crate) fn group_alive(pgid: Pid) -> bool {
    // EPERM means it exists but belongs to someone else: still alive.
    !matches!(kill(Target::Group(pgid), 0), Err(Errno::ESRCH))
}

/// Sets every catchable signal's disposition back to SIG_DFL.
///
/// Dispositions set to SIG_IGN by whoever started us would otherwise be inherited by the
/// controller and terraform (a shell's background job ignores SIGINT and SIGQUIT, say).
pub(crate) fn reset_signal_dispositions() {
    for signo in 1..=libc::SIGRTMAX() {
        if signo == libc::SIGKILL || signo == libc::SIGSTOP {
            continue;
        }
        // SAFETY: installing SIG_DFL involves no handler code of ours; invalid numbers (the
        // glibc-reserved real-time ones) fail with EINVAL, which is ignored on purpose.
        unsafe {
            libc::signal(signo, libc::SIG_DFL);
        }
    }
}

/// Blocks `signals` in the calling thread (and every thread created after), returning the old mask.
pub(crate) fn block_signals(signals: &nix::sys::signal::SigSet) -> io::Result<()> {
    nix::sys::signal::pthread_sigmask(nix::sys::signal::SigmaskHow::SIG_BLOCK, Some(signals), None)
        .map_err(io::Error::from)
}

/// The soft RLIMIT_NOFILE tfinit was started with, when it raised its own (see `raise_nofile`).
static ORIGINAL_NOFILE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(u64::MAX);

/// Raises the soft open-files limit to the hard one: the init holds a socket and two pipes per
/// terraform run and a socket per client (a thousand shims at once is a tested case). Children
/// get the original soft limit back (see `child_defaults`), so nothing changes for them.
pub(crate) fn raise_nofile() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit for getrlimit and read-only for setrlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 || lim.rlim_cur >= lim.rlim_max {
            return;
        }
        let original = lim.rlim_cur;
        lim.rlim_cur = lim.rlim_max;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 {
            ORIGINAL_NOFILE.store(original, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// Makes every allocation of at least `threshold` bytes a mapping of its own, unmapped when
/// freed. glibc otherwise raises this threshold to the size of the largest such block freed
/// (up to 32 MiB) and keeps later ones in its heap, where freed memory stays resident: a burst of
/// large client requests would leave the init's RSS at its peak for good. Setting it turns that
/// adjustment off. Returns false when glibc refused.
pub fn return_large_buffers(threshold: usize) -> bool {
    let Ok(value) = libc::c_int::try_from(threshold) else {
        return false;
    };
    // SAFETY: mallopt changes a malloc parameter; it takes plain integers and is called before
    // the loop's allocations (any time is allowed: glibc serialises it with its arenas' locks).
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, value) == 1 }
}

/// Takes an exclusive flock(2) on `fd` without waiting (EWOULDBLOCK: another open file
/// description holds it). Unlike nix's `Flock` guard, nothing unlocks it on drop: the lock is
/// released when the last descriptor of this open file description closes (every process that
/// inherited one is gone), which is what an incarnation's lock file is for.
pub(crate) fn flock_exclusive_now(fd: std::os::fd::BorrowedFd<'_>) -> Result<(), Errno> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock(2) takes a descriptor, valid for the call as `fd` is borrowed, and flags; it
    // touches no memory of ours.
    Errno::result(unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }).map(drop)
}

/// The soft stack limit (RLIMIT_STACK) of this process, in bytes; None when unlimited (or when
/// it cannot be read: the kernel then uses its largest ARG_MAX, and so does the caller).
pub fn stack_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into `lim`, a valid and writable rlimit.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_STACK, &mut lim) };
    (rc == 0 && lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur)
}

/// Gives the child started by `cmd` the process state a normal program expects: an empty signal
/// mask (the init blocks everything it reads through its signalfd, and a mask survives exec) and
/// the open-files limit tfinit was started with. Dispositions were reset to SIG_DFL at start-up,
/// and std resets SIGPIPE, which it ignores in the parent.
pub(crate) fn child_defaults(cmd: &mut Command) {
    let nofile = ORIGINAL_NOFILE.load(std::sync::atomic::Ordering::Relaxed);
    // SAFETY: the closure runs between fork and exec and calls only sigemptyset, sigprocmask,
    // getrlimit and setrlimit: plain syscalls without locks or allocation (async-signal-safe in
    // practice on Linux; the first two by POSIX).
    unsafe {
        cmd.pre_exec(move || {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            if libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
            if nofile != u64::MAX {
                let mut lim = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
                    lim.rlim_cur = nofile;
                    libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
                }
            }
            Ok(())
        });
    }
}

/// Makes the child started by `cmd` take the terminal's foreground, when stdin is a terminal.
///
/// Without this, a controller started with `docker run -it` sits in a background process group
/// and is stopped by SIGTTIN the first time it reads its terminal (tini does the same).
pub(crate) fn take_terminal_foreground_in_child(cmd: &mut Command) {
    // SAFETY: the closure runs between fork and exec and calls only async-signal-safe functions
    // (signal, tcsetpgrp, getpgrp); it allocates nothing and touches no lock. std has already put
    // the child in its own process group at that point.
    unsafe {
        cmd.pre_exec(|| {
            // SIGTTOU would stop us: a background group may not change the foreground group.
            let old = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
            let rc = libc::tcsetpgrp(libc::STDIN_FILENO, libc::getpgrp());
            let e = *libc::__errno_location();
            libc::signal(libc::SIGTTOU, old);
            // ENOTTY/ENXIO/EBADF: stdin is no terminal (the usual case in Kubernetes); EPERM: the
            // terminal belongs to another session. Neither stops the start.
            if rc != 0
                && e != libc::ENOTTY
                && e != libc::ENXIO
                && e != libc::EBADF
                && e != libc::EPERM
            {
                return Err(io::Error::from_raw_os_error(e));
            }
            Ok(())
        });
    }
}

/// The highest real-time signal number of this libc.
pub(crate) fn sigrtmax() -> SigNo {
    libc::SIGRTMAX()
}

/// The lowest real-time signal number usable by programs (glibc reserves the first two).
pub(crate) fn sigrtmin() -> SigNo {
    libc::SIGRTMIN()
}

/// How many descriptors one message may carry to the init (the shim sends one: its stdin).
pub const MAX_FDS: usize = 4;

/// Why [`recv_with_fds`] failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecvError {
    /// recvmsg(2) failed (EAGAIN when nothing is there).
    Os(Errno),
    /// The peer passed more descriptors than [`MAX_FDS`] (the control data was truncated,
    /// MSG_CTRUNC). Every descriptor the kernel installed was closed; the bytes were dropped.
    TooManyFds,
}

/// Receives bytes from a Unix stream socket together with any file descriptors passed with them
/// (SCM_RIGHTS, close-on-exec). Returns 0 bytes at end of stream. Non-blocking: EAGAIN comes back
/// as an error.
///
/// Walks the control data with libc's CMSG_* rather than nix's `cmsgs()`, which fails on
/// truncated control data and so would leak the descriptors the kernel installed.
pub(crate) fn recv_with_fds(
    sock: std::os::fd::BorrowedFd<'_>,
    buf: &mut [u8],
) -> Result<(usize, Vec<std::os::fd::OwnedFd>), RecvError> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
    const INT: usize = std::mem::size_of::<RawFd>();
    // SAFETY: CMSG_SPACE only computes a size from its argument.
    let space = unsafe { libc::CMSG_SPACE((MAX_FDS * INT) as u32) } as usize;
    // u64 words: the control buffer must be aligned for cmsghdr.
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain old data; all-zero is a valid (empty) value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = (control.len() * 8) as _;
    // SAFETY: `msg` points at `iov` (which points at `buf`) and at `control`, all alive and
    // writable for the call, with their true lengths.
    let n = unsafe {
        libc::recvmsg(
            sock.as_raw_fd(),
            &mut msg,
            libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT,
        )
    };
    let n = Errno::result(n).map_err(RecvError::Os)? as usize;
    let mut fds = Vec::new();
    // SAFETY: `msg` was filled by recvmsg: msg_control/msg_controllen describe the control data
    // the kernel wrote into `control` (still alive), so CMSG_FIRSTHDR/CMSG_NXTHDR stay inside it.
    // On truncation the kernel sets each cmsg_len to the descriptors it actually installed.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !c.is_null() {
        // SAFETY: `c` is a non-null header inside `control` (see above).
        let hdr = unsafe { &*c };
        if hdr.cmsg_level == libc::SOL_SOCKET && hdr.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: CMSG_LEN(0) only computes a size.
            let header = unsafe { libc::CMSG_LEN(0) } as usize;
            let count = (hdr.cmsg_len as usize).saturating_sub(header) / INT;
            // SAFETY: CMSG_DATA points just after this header, inside `control`.
            let data = unsafe { libc::CMSG_DATA(c) }.cast::<RawFd>();
            for i in 0..count {
                // SAFETY: `i < count` descriptors follow the header (cmsg_len says so); the data
                // may be unaligned, hence read_unaligned.
                let fd = unsafe { data.add(i).read_unaligned() };
                // SAFETY: the kernel just installed this descriptor in our table for this
                // message (SCM_RIGHTS); nothing else owns it, so taking ownership is sound.
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
        // SAFETY: `msg` and `c` are as above; CMSG_NXTHDR returns null past the end.
        c = unsafe { libc::CMSG_NXTHDR(&msg, c) };
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        // Dropping `fds` closes every descriptor that was installed.
        drop(fds);
        return Err(RecvError::TooManyFds);
    }
    Ok((n, fds))
}

/// Waits up to `timeout` for one of the signals in `set` (blocked in every thread), consuming
/// it: Ok(None) when none came in time.
pub(crate) fn wait_signal(
    set: &nix::sys::signal::SigSet,
    timeout: std::time::Duration,
) -> Result<Option<SigNo>, Errno> {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as _,
    };
    // SAFETY: `set` is a valid sigset_t and `ts` a valid timespec, both alive for the call; a
    // null siginfo pointer is allowed.
    let rc = unsafe { libc::sigtimedwait(set.as_ref(), std::ptr::null_mut(), &ts) };
    match Errno::result(rc) {
        Ok(signo) => Ok(Some(signo)),
        Err(Errno::EAGAIN) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Signals read from a signalfd in one read(2): up to [`SignalBatch::CAP`] at once.
pub(crate) struct SignalBatch {
    /// Filled by the kernel up to `len`; the rest is never read (not zeroed on each wake-up).
    infos: [std::mem::MaybeUninit<libc::signalfd_siginfo>; SignalBatch::CAP],
    len: usize,
}

impl SignalBatch {
    /// How many signals one read takes.
    pub(crate) const CAP: usize = 8;

    /// An empty batch.
    pub(crate) fn new() -> SignalBatch {
        SignalBatch {
            infos: [std::mem::MaybeUninit::uninit(); SignalBatch::CAP],
            len: 0,
        }
    }

    /// Reads what `sigfd` (non-blocking) holds, as much as fits, replacing the batch's contents:
    /// Ok(n) signals, 0 when none was pending.
    pub(crate) fn read(&mut self, sigfd: std::os::fd::BorrowedFd<'_>) -> Result<usize, Errno> {
        self.len = 0;
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        // SAFETY: the buffer is `infos`, valid and writable for CAP * size bytes for the call.
        let rc = unsafe {
            libc::read(
                sigfd.as_raw_fd(),
                self.infos.as_mut_ptr().cast(),
                SignalBatch::CAP * size,
            )
        };
        match Errno::result(rc) {
            Ok(bytes) => {
                self.len = (bytes as usize / size).min(SignalBatch::CAP);
                Ok(self.len)
            }
            Err(Errno::EAGAIN) => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// Each signal read: its number and the sender's pid (0 when the kernel sent it).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (SigNo, i32)> + '_ {
        self.infos[..self.len].iter().map(|i| {
            // SAFETY: the first `len` entries were written whole by the last read: a signalfd
            // returns whole signalfd_siginfo records only, plain integers.
            let i = unsafe { i.assume_init_ref() };
            (i.ssi_signo as SigNo, i.ssi_pid as i32)
        })
    }
}

/// Sends `bytes` with `fd` attached as SCM_RIGHTS (blocking socket); returns bytes sent.
pub fn send_with_fd(
    sock: std::os::fd::BorrowedFd<'_>,
    bytes: &[u8],
    fd: std::os::fd::BorrowedFd<'_>,
) -> Result<usize, Errno> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    use std::os::fd::AsRawFd;
    let fds = [fd.as_raw_fd()];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    let iov = [std::io::IoSlice::new(bytes)];
    sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None)
}

/// One non-blocking waitpid(-1): Ok(None) when children exist but none changed state.
///
/// Raw, because nix decodes the status into its `Signal` enum and fails on real-time signals
/// after the child was already reaped, losing its status.
pub(crate) fn wait_any_nohang() -> Result<Option<(Pid, i32)>, Errno> {
    let mut status: libc::c_int = 0;
    // SAFETY: `status` is a valid, writable c_int for the duration of the call.
    let rc = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
    match Errno::result(rc)? {
        0 => Ok(None),
        pid => Ok(Some((Pid::from_raw(pid), status))),
    }
}

/// Ends the process now with `code`, without atexit handlers or std's cleanup.
///
/// The init's last step: its logs are written unbuffered (stderr), its records are fsynced, and
/// nothing registered with atexit has work to do, so the only effect of `std::process::exit`'s
/// extra steps (flushing stdout, tearing down the signal stack, glibc's exit handlers) would be
/// time on the path the container runtime waits on.
pub(crate) fn exit_now(code: i32) -> ! {
    // SAFETY: _exit(2) takes an integer and never returns; it skips destructors and atexit
    // handlers, which is the intent (see above), and leaves no memory of ours in a bad state
    // because the process is gone.
    unsafe { libc::_exit(code) }
}

/// 32 random bits from the kernel (getrandom(2), without waiting for its pool at early boot), or,
/// when it has none to give, from the monotonic clock's nanoseconds: what tells apart two inits
/// that start in the same millisecond with the same pid (PID 1 of two containers on one node).
pub(crate) fn random_u32() -> u32 {
    let mut buf = [0u8; 4];
    // SAFETY: `buf` is a valid, writable 4-byte buffer for the duration of the call, and its
    // length is passed with it.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), libc::GRND_NONBLOCK) };
    if n == buf.len() as isize {
        return u32::from_ne_bytes(buf);
    }
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        t.tv_nsec() as u64 ^ (t.tv_sec() as u64).rotate_left(29)
    });
    (t ^ (t >> 32)) as u32 ^ std::process::id().rotate_left(16)
}

/// Takes ownership of descriptor `fd`, inherited from the parent for this process (the recovery
/// helper's report pipe), and marks it close-on-exec so the terraform it starts does not hold
/// it. None when `fd` is not an open descriptor (or is a standard stream).
pub(crate) fn take_inherited_fd(fd: i32) -> Option<OwnedFd> {
    if fd <= 2 {
        return None;
    }
    // SAFETY: F_GETFD only reads the descriptor's flags; an fd that is not open gives EBADF.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return None;
    }
    // SAFETY: the parent (the init) passed this open descriptor to this process alone, and
    // nothing else in this process refers to it: taking ownership closes it exactly once.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: F_SETFD with FD_CLOEXEC on a descriptor just checked to be open.
    unsafe { libc::fcntl(owned.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    Some(owned)
}

/// The hostname as terraform's `os.Hostname()` sees it (the pod name in Kubernetes).
pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| {
            nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
        })
        .unwrap_or_else(|| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsFd, AsRawFd, OwnedFd};
    use std::os::unix::net::UnixStream;

    /// Sends `count` copies of `fd` in one message with one byte.
    fn send_copies(sock: &UnixStream, fd: &OwnedFd, count: usize) {
        use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
        let fds = vec![fd.as_raw_fd(); count];
        let cmsg = [ControlMessage::ScmRights(&fds)];
        let iov = [std::io::IoSlice::new(b"x")];
        sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None).unwrap();
    }

    /// Whether every copy of a pipe's write end is closed: its read end (non-blocking) then reads
    /// end of file. A descriptor leaked anywhere in this process would keep the pipe open.
    fn write_end_closed(read: &OwnedFd) -> bool {
        let mut b = [0u8; 1];
        matches!(nix::unistd::read(read, &mut b), Ok(0))
    }

    #[test]
    fn too_many_descriptors_are_all_closed_and_refused() {
        let (a, b) = UnixStream::pair().unwrap();
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_NONBLOCK).unwrap();
        send_copies(&a, &write, MAX_FDS * 3);
        drop(write);
        let mut buf = [0u8; 16];
        assert_eq!(
            recv_with_fds(b.as_fd(), &mut buf).err(),
            Some(RecvError::TooManyFds),
            "a message with more descriptors than MAX_FDS must be refused"
        );
        assert!(
            write_end_closed(&read),
            "every descriptor installed from the truncated message must be closed"
        );
    }

    #[test]
    fn descriptors_within_the_limit_are_received_open() {
        let (a, b) = UnixStream::pair().unwrap();
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_NONBLOCK).unwrap();
        send_copies(&a, &write, MAX_FDS);
        drop(write);
        let mut buf = [0u8; 16];
        let (n, fds) = recv_with_fds(b.as_fd(), &mut buf).unwrap();
        assert_eq!((n, fds.len()), (1, MAX_FDS));
        assert!(
            !write_end_closed(&read),
            "the received copies keep the pipe open"
        );
        drop(fds);
        assert!(write_end_closed(&read), "dropping them closes them");
    }
}

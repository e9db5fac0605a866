//! The recorder thread: the loop's handle on it ([`Recorder`]), the channels and the eventfd
//! between them, and the thread itself, which performs each storage operation the [`Machine`]
//! asks for on the [`Store`] and hands its completions to the loop.
//!
//! The thread ends when it has nothing to do for longer than [`LINGER`] (between two heartbeats,
//! most of the time): its state (the machine, the store, its end of the channels) waits in the
//! handle, and the loop starts a thread again for the next request or when the machine's next
//! timed work (the heartbeat) is due ([`Recorder::wake_at`], [`Recorder::tick`]). An idle init is
//! then one thread: its exit does not wait for the kernel to kill a second one (measured: an idle
//! second thread added about 110 µs to the exit, and up to milliseconds under load), and it holds
//! no thread stack. Starting a thread (clone(2), a stack mapping) never waits on storage.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use nix::sys::eventfd::{EfdFlags, EventFd};

use super::machine::{HeartbeatRead, Held, Machine, Next, Now, Op, Out, Outcome};
use super::{Completion, Entry, Gone, Work};
use crate::locks::record::{now_ms, Found, Owner};
use crate::locks::store::Store;
use crate::locks::who::passwd_user;

/// How long the thread waits with nothing to do before it ends (its state then waits in the
/// handle). Requests sent together (several runs starting at once) share one thread; an init
/// idle for longer has no second thread. Measured (scripts/bench-pid1.sh's exit, which comes
/// once the init has been still for 10 ms): with 10 ms the thread was often still there at the
/// exit (633 µs at the median against 443 µs with none, catatonit 297, one interleaved run).
pub const LINGER: Duration = Duration::from_millis(1);
/// How long after a failed start of the thread (clone(2) refused: a thread limit, no memory)
/// the loop tries again.
const RESTART_AFTER: Duration = Duration::from_secs(1);

/// The loop's handle on the recorder thread.
#[derive(Debug)]
pub struct Recorder {
    requests: Sender<Work>,
    completions: Receiver<Completion>,
    ready: Arc<Doorbell>,
    /// Record writes (create, progress, end, remove) asked for and not finished.
    writes: Arc<AtomicUsize>,
    /// Who has the thread's state: a running thread, or the handle while none runs.
    shift: Arc<Mutex<Shift>>,
}

/// Where the thread's state is. The loop and the thread take the mutex only to move the state
/// (never around storage work), so the loop never waits on it for long.
enum Shift {
    /// A thread runs with it.
    Working,
    /// A thread was started and has not taken it yet.
    Handing(Box<Worker>),
    /// No thread runs: the next one starts for a request, or at `until` (the machine's next timed
    /// work), or, when `failed`, no sooner than `until` (the last start was refused).
    Idle {
        worker: Box<Worker>,
        until: Instant,
        failed: bool,
    },
}

impl std::fmt::Debug for Shift {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Shift::Working => f.write_str("Working"),
            Shift::Handing(_) => f.write_str("Handing"),
            Shift::Idle { until, failed, .. } => f
                .debug_struct("Idle")
                .field("until", until)
                .field("failed", failed)
                .finish(),
        }
    }
}

/// Everything the thread works with, which outlives each thread.
struct Worker {
    store: Box<dyn Store>,
    me: Owner,
    machine: Machine,
    inbox: Receiver<Work>,
    out: Outbox,
}

impl Recorder {
    /// Starts the recorder on `store` for owner `me` (heartbeat TTL `ttl`); it opens the store
    /// first and reports [`Completion::Opened`]. Fails only when the eventfd or the thread cannot
    /// be created.
    pub fn start(store: Box<dyn Store>, me: Owner, ttl: Duration) -> io::Result<Recorder> {
        let ready = Arc::new(Doorbell {
            fd: EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
                .map_err(io::Error::from)?,
            unread: AtomicU64::new(0),
        });
        let (requests, inbox) = mpsc::channel();
        let (outbox, completions) = mpsc::channel();
        let writes = Arc::new(AtomicUsize::new(0));
        let machine = Machine::new(me.clone(), ttl, store.location());
        let out = Outbox {
            tx: outbox,
            ready: Arc::clone(&ready),
            writes: Arc::clone(&writes),
        };
        let worker = Box::new(Worker {
            store,
            me,
            machine,
            inbox,
            out,
        });
        let shift = Arc::new(Mutex::new(Shift::Handing(worker)));
        spawn(&shift)?;
        Ok(Recorder {
            requests,
            completions,
            ready,
            writes,
            shift,
        })
    }

    /// When the loop must start the thread again for the machine's timed work (the heartbeat),
    /// while none runs; never blocks for long (a mutex the thread holds only to hand its state
    /// over).
    pub fn wake_at(&self) -> Option<Instant> {
        match &*lock(&self.shift) {
            Shift::Idle { until, .. } => Some(*until),
            _ => None,
        }
    }

    /// At `now`: starts the thread again when none runs and its timed work is due.
    pub fn tick(&self, now: Instant) {
        if self.wake_at().is_some_and(|until| now >= until) {
            self.wake(true);
        }
    }

    /// Starts a thread when none runs (`due`: also after a refused start, else only when none
    /// was refused: a refused start is tried again on the timer, not on every request).
    fn wake(&self, due: bool) {
        {
            let mut shift = lock(&self.shift);
            match std::mem::replace(&mut *shift, Shift::Working) {
                Shift::Idle { worker, failed, .. } if due || !failed => {
                    *shift = Shift::Handing(worker);
                }
                other => {
                    *shift = other;
                    return;
                }
            }
        }
        if let Err(e) = spawn(&self.shift) {
            let mut shift = lock(&self.shift);
            if let Shift::Handing(worker) = std::mem::replace(&mut *shift, Shift::Working) {
                tracing::warn!(
                    error = %e, retry_seconds = RESTART_AFTER.as_secs_f64(),
                    "cannot start the lock-owner recorder thread again (clone(2) refused: a thread or memory limit of the container?): record writes and the heartbeat wait until it starts; raise the limit if this repeats"
                );
                *shift = Shift::Idle {
                    worker,
                    until: Instant::now() + RESTART_AFTER,
                    failed: true,
                };
            }
        }
    }

    /// Whether no thread runs now (the tests look).
    #[cfg(test)]
    pub(crate) fn is_idle(&self) -> bool {
        matches!(&*lock(&self.shift), Shift::Idle { .. })
    }

    /// The descriptor to register in epoll (readable when completions are waiting).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.ready.fd.as_fd()
    }

    /// Queues `request`; never blocks.
    pub fn send(&self, request: Work) -> Result<(), Gone> {
        let write = is_write(&request);
        if write {
            self.writes.fetch_add(1, Ordering::SeqCst);
        }
        self.requests.send(request).map_err(|_| {
            if write {
                self.writes.fetch_sub(1, Ordering::SeqCst);
            }
            Gone
        })?;
        // After the send: a thread that is ending takes the mutex to check its inbox before it
        // hands its state over, so either it sees this request or this sees it idle.
        self.wake(false);
        Ok(())
    }

    /// Every completion waiting (resets the eventfd first, so none is missed); never blocks.
    pub fn take_completions(&self) -> Vec<Completion> {
        // Reset first: a completion that comes after is in the channel, or rings again.
        self.ready.clear();
        self.completions.try_iter().collect()
    }

    /// How many record writes are queued or in flight.
    pub fn writes_pending(&self) -> usize {
        self.writes.load(Ordering::SeqCst)
    }

    /// At exit: waits until no record write is queued or in flight, or until `deadline`
    /// (the caller passes now + min(1 s, time left)). Returns the completions that came in and
    /// whether every write finished. Blocks: only for the very end, after every child is gone.
    pub fn wait_idle(&self, deadline: Instant) -> (Vec<Completion>, bool) {
        let mut out = Vec::new();
        loop {
            out.extend(self.take_completions());
            // A thread that could not be started is tried again on its timer.
            self.tick(Instant::now());
            if self.writes_pending() == 0 {
                return (out, true);
            }
            let now = Instant::now();
            if now >= deadline {
                return (out, false);
            }
            let left = (deadline - now).min(Duration::from_millis(100));
            let ms = u16::try_from(left.as_millis().max(1)).unwrap_or(100);
            let mut fds = [nix::poll::PollFd::new(
                self.ready.fd.as_fd(),
                nix::poll::PollFlags::POLLIN,
            )];
            // EINTR or an error: the loop above re-checks the deadline.
            let _ = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(ms));
        }
    }
}

fn is_write(r: &Work) -> bool {
    matches!(
        r,
        Work::Create { .. } | Work::Progress { .. } | Work::End { .. } | Work::Remove { .. }
    )
}

/// The eventfd that wakes the loop when completions wait, and how many rings it holds that the
/// loop has not read. The loop looks for news on every wake-up (each signal forwarded, too):
/// with the count it skips the read(2) that would only say EAGAIN.
#[derive(Debug)]
struct Doorbell {
    fd: EventFd,
    /// Rings counted before they are written, so the eventfd is never readable while this is 0.
    unread: AtomicU64,
}

impl Doorbell {
    /// Wakes the loop (the thread's side).
    fn ring(&self) {
        self.unread.fetch_add(1, Ordering::SeqCst);
        let _ = self.fd.write(1);
    }

    /// Resets the eventfd when it may be readable (the loop's side); never blocks.
    fn clear(&self) {
        if self.unread.load(Ordering::SeqCst) == 0 {
            return;
        }
        // EAGAIN: counted but not written yet; its write makes the eventfd readable again.
        if let Ok(n) = self.fd.read() {
            self.unread.fetch_sub(n, Ordering::SeqCst);
        }
    }
}

/// The thread's side of the completion channel.
struct Outbox {
    tx: Sender<Completion>,
    ready: Arc<Doorbell>,
    writes: Arc<AtomicUsize>,
}

impl Outbox {
    fn send(&self, c: Completion) {
        // The loop is gone only when the init exits: nobody to tell.
        let _ = self.tx.send(c);
        self.ready.ring();
    }

    /// Queues `c` without waking the loop: news nobody waits for (a heartbeat that went well, the
    /// table it rescanned), taken whenever the loop next looks (each wake-up, `status`, a
    /// decision about records). An idle init then wakes once a heartbeat, here, not three times.
    fn send_quietly(&self, c: Completion) {
        let _ = self.tx.send(c);
    }

    /// `n` record write requests are done (finished, merged into another, or dropped). Signals
    /// the loop after the count dropped, so [`Recorder::wait_idle`] wakes up for it.
    fn done(&self, n: usize) {
        if n > 0 {
            self.writes.fetch_sub(n, Ordering::SeqCst);
            self.ready.ring();
        }
    }
}

impl Outbox {
    /// Passes on what the machine has for the loop.
    fn flush(&self, machine: &mut Machine) {
        for o in machine.take_out() {
            match o {
                Out::Wake(c) => self.send(c),
                Out::Quiet(c) => self.send_quietly(c),
                Out::Done(n) => self.done(n),
            }
        }
    }
}

/// Starts a thread that takes the state waiting in `shift` (Handing) and serves it.
fn spawn(shift: &Arc<Mutex<Shift>>) -> io::Result<()> {
    let shift = Arc::clone(shift);
    std::thread::Builder::new()
        .name("tfinit-recorder".into())
        .spawn(move || {
            let worker = {
                let mut s = lock(&shift);
                match std::mem::replace(&mut *s, Shift::Working) {
                    Shift::Handing(worker) => worker,
                    // Not ours to take (cannot happen: a thread is started only for Handing).
                    other => {
                        *s = other;
                        return;
                    }
                }
            };
            serve(worker, &shift);
        })
        .map(|_| ())
}

/// The mutex's state, even if a thread panicked while holding it (the state it holds is whole
/// between statements: each change is one `mem::replace`).
fn lock(shift: &Mutex<Shift>) -> std::sync::MutexGuard<'_, Shift> {
    shift.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The thread: the machine's operations on the store, one at a time, until nothing is left to
/// do for [`LINGER`] (the state goes back to the handle and the thread ends) or the loop drops
/// its handle (the init is exiting).
fn serve(mut w: Box<Worker>, shift: &Mutex<Shift>) {
    loop {
        for r in w.inbox.try_iter() {
            w.machine.request(r);
        }
        // What came of the requests, or of a job that needed no storage, goes out before the
        // operation or the wait.
        let next = w.machine.next(now());
        w.out.flush(&mut w.machine);
        match next {
            Next::Do(op) => {
                let outcome = perform(&*w.store, &w.me, op);
                w.machine.finished(outcome, now());
            }
            Next::Wait(until) => {
                let wait = until.saturating_duration_since(Instant::now());
                match w.inbox.recv_timeout(wait.min(LINGER)) {
                    Ok(r) => w.machine.request(r),
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    Err(mpsc::RecvTimeoutError::Timeout) if wait > LINGER => {
                        // Idle: the state goes back to the handle, unless a request came in
                        // meanwhile (checked under the mutex the loop takes after each send).
                        let mut s = lock(shift);
                        match w.inbox.try_recv() {
                            Ok(r) => w.machine.request(r),
                            Err(mpsc::TryRecvError::Disconnected) => return,
                            Err(mpsc::TryRecvError::Empty) => {
                                let ready = Arc::clone(&w.out.ready);
                                *s = Shift::Idle {
                                    worker: w,
                                    until,
                                    failed: false,
                                };
                                drop(s);
                                // The loop sets its timer for `until` on this wake-up.
                                ready.ring();
                                return;
                            }
                        }
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                }
            }
        }
        w.out.flush(&mut w.machine);
    }
}

fn now() -> Now {
    Now {
        mono: Instant::now(),
        wall_ms: now_ms(),
    }
}

/// Does `op` on `store` for owner `me`.
fn perform(store: &dyn Store, me: &Owner, op: Op) -> Outcome {
    match op {
        Op::Open { stale_temp } => {
            let passwd_user = passwd_user();
            let host = crate::sys::hostname();
            let result = store
                .open(stale_temp)
                .map(|()| match store.hold_incarnation_lock(me) {
                    Ok(Some((fd, id))) => Held::File(Some(Arc::new(fd)), id),
                    Ok(None) => Held::NoFile,
                    Err(e) => {
                        tracing::warn!(
                            state_dir = %store.location(), error = %e,
                            "cannot take this incarnation's lock file: records are written, but after a container restart they are recovered only once this owner has been watched dead for TFINIT_OWNER_TTL"
                        );
                        Held::Failed
                    }
                })
                .map_err(|e| e.to_string());
            Outcome::Opened {
                passwd_user,
                host,
                location: store.location(),
                result,
            }
        }
        Op::WriteHeartbeat(hb) => Outcome::Wrote(store.write_heartbeat(&hb)),
        Op::Tidy { older_than } => {
            store.tidy(me, older_than);
            Outcome::Tidied
        }
        Op::List => {
            let mut records = Vec::new();
            let mut unlisted = None;
            for f in store.list() {
                match f {
                    Found::Record(path, rec) => records.push(Entry::of(path, &rec)),
                    Found::Unlisted(why) => unlisted = Some(why),
                    _ => {}
                }
            }
            Outcome::Listed { records, unlisted }
        }
        Op::ReadHeartbeats { owners, name } => {
            let each = owners
                .into_iter()
                .map(|owner| {
                    let started = Instant::now();
                    let answer = store.read_heartbeat(&owner).map_err(|e| e.to_string());
                    let done = Instant::now();
                    let read = answer.as_ref().ok().and_then(Option::as_ref);
                    let proof = store.kernel_proof(me, &owner, read);
                    HeartbeatRead {
                        owner,
                        answer,
                        started,
                        done,
                        proof,
                    }
                })
                .collect();
            let named_started = Instant::now();
            let named = store.heartbeats_named(&name).map_err(|e| e.to_string());
            Outcome::Heartbeats {
                each,
                named,
                named_started,
                named_done: Instant::now(),
            }
        }
        Op::Apply(changes) => Outcome::Applied(store.apply(&changes)),
    }
}

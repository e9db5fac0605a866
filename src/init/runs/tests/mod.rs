//! The runs' decisions, without a process, a pipe or a socket: requests, the store's answers and
//! the loop's reports go in, actions come out. [`World`] is the runs and the records with the part
//! of the loop that carries out what they ask of each other (records' actions, `Admit`,
//! `Recheck`), in the loop's order; what is left is what the loop would do to processes and
//! sockets, and the requests the records sent to the recorder.
//!
//! - start.rs: from the request to terraform's start.
//! - stop.rs: stopping and ending runs.
//! - queue.rs: TFINIT_MAX_RUNS.
//! - cancel.rs: `tfinit cancel`.

mod cancel;
mod queue;
mod start;
mod stop;

use std::collections::VecDeque;
use std::num::NonZeroUsize;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::unistd::Pid;

use super::super::action::{Action, Force, Refusal};
use super::super::reaper::Exit;
use super::super::records::Records;
use super::super::shutdown::Phase;
use super::super::spawn::{RecoveryArgs, StartError, Started};
use super::super::token::{ConnId, Stream};
use super::{CancelTarget, Runs};
use crate::locks::book::Book;
use crate::locks::liveness::Facts;
use crate::locks::names::RunId;
use crate::locks::record::{Ended, Owner};
use crate::locks::recorder::{Completion, Entry, Table, Work};
use crate::protocol::{self, FileId, RunRequest};

const RECORD_TIMEOUT: Duration = Duration::from_secs(10);
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
const TTL: Duration = Duration::from_secs(30);

/// An apply that takes no lock: it goes straight to its launch once it has a place.
const NO_LOCK: &[&str] = &["apply", "-lock=false"];

fn r(n: u64) -> RunId {
    RunId::from(n)
}

fn c(n: u64) -> ConnId {
    ConnId::from(n)
}

fn runs() -> Runs {
    Runs::new(RECORD_TIMEOUT, STOP_TIMEOUT, None)
}

/// Runs under TFINIT_MAX_RUNS=`max`.
fn capped(max: usize) -> Runs {
    Runs::new(RECORD_TIMEOUT, STOP_TIMEOUT, NonZeroUsize::new(max))
}

/// Records whose store is still opening (nothing is known about it yet).
fn opening(t: Instant) -> Records {
    let book = Book::new(
        Path::new("/state"),
        Owner::current("pod-a", None),
        crate::locks::liveness::Observer::new(TTL, crate::locks::liveness::LONGEST_TTL),
        RECORD_TIMEOUT,
        true,
        "pod-a".into(),
        t,
    );
    Records::for_tests(book)
}

fn table(t: Instant, records: Vec<Entry>) -> Table {
    Table {
        scanned: t,
        records,
        beats: vec![],
        gone: vec![],
        held: Vec::new(),
        unlisted: None,
        unread: Vec::new(),
    }
}

fn opened(t: Instant, records: Vec<Entry>) -> Completion {
    Completion::Opened {
        result: Ok(()),
        table: Some(table(t, records)),
        passwd_user: None,
        location: None,
        beat: Some(t),
        lock: None,
    }
}

/// Records whose store opened at `t` with `records` on it.
fn open(t: Instant, records: Vec<Entry>) -> Records {
    let mut rec = opening(t);
    let mut none = crate::locks::book::RunTable::<(), crate::locks::book::RunRecord>::new();
    assert_eq!(rec.feed(&mut none, opened(t, records), t), vec![]);
    rec
}

/// A record of another owner's run in `workdir` whose terraform was seen dying.
fn dead_record(workdir: &str) -> Entry {
    let owner = Owner {
        name: "pod-old".into(),
        boot_id: "b".into(),
        started_ms: 1,
        pid: 1,
        pod_uid: None,
        nonce: None,
    };
    Entry {
        path: PathBuf::from(format!("/state/records/{workdir}.json")).into(),
        workdir: PathBuf::from(workdir),
        who: "@pod-old".into(),
        facts: Facts {
            owner,
            updated_ms: 2,
            ended: Some(Ended {
                ms: 3,
                how: "killed by SIGKILL".into(),
            }),
            needs_person_by: None,
            ttl: Some(TTL),
        },
    }
}

fn request(args: &[&str], cwd: &str) -> RunRequest {
    RunRequest {
        program: "/usr/bin/terraform".into(),
        argv0: "terraform".into(),
        args: args.iter().map(|a| a.to_string()).collect(),
        cwd: cwd.into(),
        env: vec![],
        workspace: None,
        cwd_id: None,
        workdir_id: None,
    }
}

fn null() -> OwnedFd {
    std::fs::File::open("/dev/null").unwrap().into()
}

/// What the loop was left to do: an action on a process or a socket, or a request the records
/// sent to the recorder.
#[derive(Debug)]
enum Done {
    /// An action.
    Act(Action),
    /// A request sent to the recorder.
    Sent(Work),
}

/// The runs and the records, and the loop between them.
struct World {
    runs: Runs,
    rec: Records,
}

impl World {
    fn new(runs: Runs, rec: Records) -> World {
        World { runs, rec }
    }

    /// Carries out, at `t`, what the runs asked of the records and of themselves, as the loop
    /// does: in order, what comes of an action before the actions after it.
    fn settle(&mut self, acts: Vec<Action>, t: Instant) -> Vec<Done> {
        let mut queue = VecDeque::from(acts);
        let mut out = Vec::new();
        while let Some(action) = queue.pop_front() {
            let more = match action {
                Action::Record(r) => {
                    let events = self.rec.apply(self.runs.records_mut(), r, t);
                    out.extend(self.rec.take_sent().into_iter().map(Done::Sent));
                    if events.is_empty() {
                        Vec::new()
                    } else {
                        self.runs.on_record_events(events, self.rec.book())
                    }
                }
                Action::Admit => self.runs.admit(self.rec.book(), t),
                Action::Recheck => self.runs.recheck(self.rec.book(), t),
                other => {
                    out.push(Done::Act(other));
                    Vec::new()
                }
            };
            for a in more.into_iter().rev() {
                queue.push_front(a);
            }
        }
        self.assert_in_step();
        out
    }

    /// The two parts of each entry of the one table agree once the loop carried everything out:
    /// a run whose record part is live (begun, not closed) is one the runs hold, past its lock
    /// check. (Removing the `Record::Close` of `Runs::take` breaks this.)
    fn assert_in_step(&self) {
        let mut id = RunId::FIRST;
        while id != self.runs.next {
            if self.runs.table.record_status(id).is_some() {
                let life = self.runs.table.get(&id).map(|run| run.life.as_str());
                assert!(
                    matches!(life, Some("recording" | "running" | "exited")),
                    "the book holds {id} as live, the runs as {life:?}"
                );
            }
            id = id.next();
        }
    }

    fn ask(&mut self, conn: u64, args: &[&str], t: Instant) -> Vec<Done> {
        self.request(c(conn), request(args, "/tf/x"), Phase::Running, t)
    }

    fn request(&mut self, conn: ConnId, req: RunRequest, phase: Phase, t: Instant) -> Vec<Done> {
        let acts = self
            .runs
            .request(conn, req, None, phase, self.rec.book(), t);
        self.settle(acts, t)
    }

    /// The loop started terraform of `run` as `pid`.
    fn start(&mut self, run: RunId, pid: i32) -> Vec<Done> {
        let (req, _stdin) = self.runs.launching(run).expect("launching");
        assert_eq!(req.program, "/usr/bin/terraform");
        let started = Started {
            pid: Pid::from_raw(pid),
            stdout: null(),
            stderr: null(),
        };
        self.spawned(run, Ok(started), Instant::now())
    }

    fn spawned(&mut self, run: RunId, r: Result<Started, StartError>, t: Instant) -> Vec<Done> {
        let acts = self.runs.spawned(run, r);
        self.settle(acts, t)
    }

    /// Both pipes of `run` reached their end.
    fn close_pipes(&mut self, run: RunId) -> Vec<Done> {
        let mut acts = Vec::new();
        for s in Stream::BOTH {
            assert!(self.runs.take_pipe(run, s).is_some());
            acts.extend(self.runs.pipe_closed(run, self.rec.book()));
        }
        self.settle(acts, Instant::now())
    }

    fn terraform_exited(&mut self, run: RunId, exit: Exit, stop: bool, t: Instant) -> Vec<Done> {
        let acts = self
            .runs
            .terraform_exited(run, exit, stop, self.rec.book(), t);
        self.settle(acts, t)
    }

    /// The recorder did `c`.
    fn feed(&mut self, c: Completion, t: Instant) -> Vec<Done> {
        let events = self.rec.feed(self.runs.records_mut(), c, t);
        let acts = self.runs.on_record_events(events, self.rec.book());
        self.settle(acts, t)
    }

    /// The records' timers at `t`.
    fn record_timers(&mut self, t: Instant) -> Vec<Done> {
        let events = self.rec.record_timers(self.runs.records_mut(), t);
        let acts = self.runs.on_record_events(events, self.rec.book());
        self.settle(acts, t)
    }

    /// The runs' timers at `t`.
    fn tick(&mut self, t: Instant) -> Vec<Done> {
        let acts = self.runs.run_timers(Path::new("/state"), t);
        self.settle(acts, t)
    }

    fn refuse_waiting(&mut self, why: Refusal, t: Instant) -> Vec<Done> {
        let acts = self.runs.refuse_waiting(why);
        self.settle(acts, t)
    }

    fn detach(&mut self, run: RunId, t: Instant, stopping: bool) -> Vec<Done> {
        let acts = self.runs.detach(run, t, stopping);
        self.settle(acts, t)
    }

    /// What `run`'s recovery helper is given when the loop starts it at `t`.
    fn recovery_args(&self, run: RunId, t: Instant) -> (RecoveryArgs, bool) {
        let workdir = self.runs.workdir(run).expect("a run");
        self.rec.recovery_args(self.runs.table(), workdir, t)
    }

    /// The loop tried to start `run`'s recovery helper at `t` (with what the records say now).
    fn recovery_started(&mut self, run: RunId, r: std::io::Result<Pid>, t: Instant) -> Vec<Done> {
        let (args, watching) = self.recovery_args(run, t);
        let acts = self.runs.recovery_started(run, &args, watching, r);
        self.settle(acts, t)
    }

    fn recovery_exited(
        &mut self,
        run: RunId,
        exit: Exit,
        refusal: Option<Refusal>,
        t: Instant,
    ) -> Vec<Done> {
        let acts = self.runs.recovery_exited(run, exit, refusal);
        self.settle(acts, t)
    }

    fn cancel(
        &mut self,
        target: &CancelTarget,
        force: Force,
        t: Instant,
    ) -> Result<(Vec<Done>, Vec<String>), String> {
        let (acts, done) = self.runs.cancel(target, force, t)?;
        Ok((self.settle(acts, t), done))
    }

    fn stop_all(&mut self, force: Force, reason: &'static str) -> Vec<Done> {
        let acts = self.runs.stop_all(force, reason);
        self.settle(acts, Instant::now())
    }

    fn shim_signal(&mut self, run: RunId, signo: i32, stopping: bool) -> Vec<Done> {
        let acts = self.runs.shim_signal(run, signo, stopping);
        self.settle(acts, Instant::now())
    }
}

fn state(runs: &Runs) -> Vec<(String, String)> {
    runs.statuses()
        .into_iter()
        .map(|s| (s.id, s.state))
        .collect()
}

/// A short name of each thing done, for comparing sequences.
fn names(done: &[Done]) -> Vec<String> {
    done.iter()
        .map(|d| match d {
            Done::Sent(req) => match req {
                Work::Create { run, .. } => format!("record create {run}"),
                Work::Progress { run, .. } => format!("record progress {run}"),
                Work::End { run, .. } => format!("record end {run}"),
                Work::Remove { run } => format!("record remove {run}"),
                Work::Heartbeat => "record heartbeat".into(),
                Work::Rescan => "record rescan".into(),
            },
            Done::Act(a) => name(a),
        })
        .collect()
}

fn name(a: &Action) -> String {
    match a {
        Action::Attach { conn, run } => format!("attach {} {run}", conn.number()),
        Action::Answer { conn, note } => format!(
            "answer {} {} {}",
            conn.number(),
            note.code,
            note.run_id.as_deref().unwrap_or("-")
        ),
        Action::Spawn(run) => format!("spawn {run}"),
        Action::Recover(run) => format!("recover {run}"),
        Action::Adopt { pid, child } => format!("adopt {} {child:?}", pid.as_raw()),
        Action::Watch(run) => format!("watch {run}"),
        Action::Resume(run) => format!("resume {run}"),
        Action::Drain(run) => format!("drain {run}"),
        Action::Term { run, pid, .. } => format!("term {run} {}", pid.as_raw()),
        Action::KillGroup { run, pgid, .. } => format!("kill {run} {}", pgid.as_raw()),
        Action::KillLeftovers { run, pgid, .. } => {
            format!("kill leftovers {run} {}", pgid.as_raw())
        }
        Action::KillHelper(pid) => format!("kill helper {}", pid.as_raw()),
        Action::Tally {
            subcommand,
            outcome,
            ..
        } => format!("tally {subcommand} {}", outcome.label()),
        Action::CountCancel(how) => format!("count cancel {}", how.label()),
        other => format!("{other:?}"),
    }
}

//! Lock-owner records, as the loop sees them: requests to the recorder thread (which does every
//! storage call beside the loop), its completions through the eventfd in the epoll set, and the
//! runs that wait for them. What the loop decides on (is a store usable, does a directory need a
//! recovery, is an owner dead) is in memory, in the book.

use std::time::{Duration, Instant};

use super::runs::Life;
use super::state::Init;
use crate::config::InitConfig;
use crate::locks::book::{Book, Event};
use crate::locks::record::Owner;
use crate::locks::recorder::{Completion, Recorder, Request};
use crate::locks::store::FileStore;

/// The longest the init's exit waits for queued and in-flight record writes.
const EXIT_WAIT: Duration = Duration::from_secs(1);

impl Init {
    /// The recorder's eventfd is readable, or the loop is about to decide on records: take in
    /// what it did (never blocks).
    pub(super) fn on_recorder(&mut self) {
        let Some(recorder) = &self.recorder else {
            return;
        };
        let done = recorder.take_completions();
        let now = Instant::now();
        for c in done {
            if let Completion::Opened { lock: Some(l), .. } = &c {
                self.incarnation_lock = Some(l.clone());
            }
            let events = self.book.on_completion(c, now);
            self.apply(events);
        }
    }

    /// The book's timers: records that did not land in time, a stale heartbeat.
    pub(super) fn on_record_timers(&mut self, now: Instant) {
        // The recorder's quiet news first (heartbeats that went well): a stale heartbeat is
        // judged on the latest.
        self.on_recorder();
        let events = self.book.tick(now);
        self.apply(events);
        // Runs that waited too long for this init's own end-markings go on without a recovery;
        // never while a recovery runs in their directory (it may be about to release a lock
        // there, and it decided with the runs it was given).
        let expired: Vec<u64> = self
            .runs
            .iter()
            .filter(|(_, r)| matches!(r.life, Life::AwaitingRecords { deadline, .. } if deadline <= now))
            .filter(|(_, r)| !self.recovering_in(&r.job.workdir))
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            if let Some(run) = self.runs.get(&id) {
                tracing::warn!(
                    run = %run.job.id, workdir = %run.job.workdir.display(), state_dir = %self.cfg.state_dir.display(),
                    "the lock check is skipped: within TFINIT_RECORD_TIMEOUT the state volume did not open, or did not take this init's own end-marking of a run in this directory (a recovery must read records that tell the truth); terraform starts, and the next state-locking run here checks the lock"
                );
            }
            if let Some((job, request, stdin, deadline)) = self.take_awaiting(id) {
                self.record_step(id, job, request, stdin, Some(deadline));
            }
        }
    }

    /// Does what the book asks: log, send to the recorder, start a run that waited in `recording`.
    fn apply(&mut self, events: Vec<Event>) {
        for e in events {
            match e {
                Event::Log(notice) => notice.log(),
                Event::Send(request) => self.send_to_recorder(request),
                Event::Start { run, .. } => {
                    if let Some(id) = run_key(&run) {
                        self.record_settled(id);
                    }
                }
                Event::Fence { runs, kill } => self.fence(&runs, kill),
            }
        }
        self.resume_awaiting();
    }

    /// Queues storage work; never blocks. A recorder that is gone (its thread died) makes the
    /// store unusable: runs go on without records.
    pub(super) fn send_to_recorder(&mut self, request: Request) {
        let Some(recorder) = &self.recorder else {
            return;
        };
        if recorder.send(request).is_ok() {
            return;
        }
        tracing::error!("the lock-owner recorder thread is gone: tfinit goes on without lock-owner records (state-locking runs start without one); restart the pod to get them back");
        self.recorder = None;
        let events = self.book.on_completion(
            Completion::not_usable("the recorder thread is gone".into()),
            Instant::now(),
        );
        self.apply(events);
    }

    /// The heartbeat has not landed for long: this owner's runs with records are stopped before
    /// any other pod may call it dead and release their locks (`locks::liveness::Fence`).
    fn fence(&mut self, runs: &[String], kill: bool) {
        self.book.fence_notice(runs, kill, Instant::now()).log();
        for id in runs.iter().filter_map(|r| run_key(r)) {
            if kill {
                self.kill_run(id, "the heartbeat did not land (fence)");
            } else {
                self.request_stop(id, "the heartbeat did not land (fence)");
            }
        }
    }

    /// Whether a lock recovery helper runs in `workdir` now: nothing launches there meanwhile.
    pub(super) fn recovering_in(&self, workdir: &std::path::Path) -> bool {
        self.runs
            .values()
            .any(|r| matches!(r.life, Life::Recovering { .. }) && r.job.workdir == workdir)
    }

    /// Runs that waited for this init's end-markings in their directory, or for a recovery there,
    /// go on once those are done.
    pub(super) fn resume_awaiting(&mut self) {
        let ready: Vec<u64> = self
            .runs
            .iter()
            .filter(|(_, r)| {
                matches!(r.life, Life::AwaitingRecords { .. })
                    && !self.book.opening()
                    && self.book.may_recover(&r.job.workdir)
                    && !self.recovering_in(&r.job.workdir)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in ready {
            if let Some((job, request, stdin, deadline)) = self.take_awaiting(id) {
                self.check_lock(id, job, request, stdin, Some(deadline));
            }
        }
    }

    /// At exit: waits at most min(1 s, the time left to the deadline) for queued and in-flight
    /// record writes, so a finished run's record does not stay behind.
    pub(super) fn settle_records(&mut self) {
        let Some(recorder) = &self.recorder else {
            return;
        };
        let pending = recorder.writes_pending();
        if pending == 0 {
            return;
        }
        let now = Instant::now();
        let left = self
            .timeline
            .deadline()
            .map_or(EXIT_WAIT, |(d, _)| d.saturating_duration_since(now));
        let wait = left.min(EXIT_WAIT);
        let (done, all) = recorder.wait_idle(now + wait);
        let now = Instant::now();
        for c in done {
            for e in self.book.on_completion(c, now) {
                if let Event::Log(notice) = e {
                    notice.log();
                }
            }
        }
        if !all {
            tracing::warn!(
                writes = pending, waited_ms = wait.as_millis() as u64, state_dir = %self.cfg.state_dir.display(),
                "exiting with lock-owner record writes unfinished: the state volume did not answer in time; records of runs that ended may stay behind until the next pod's recovery reads them"
            );
        }
    }
}

/// Starts the recorder on TFINIT_STATE_DIR and the book that mirrors it. Set-up, before the
/// loop; touches no storage itself (the thread opens the store). Without a recorder (no thread
/// could be started) the store counts as unusable, with the usual warning.
pub fn start(cfg: &InitConfig) -> (Option<Recorder>, Book) {
    let me = Owner::current(&cfg.owner, cfg.pod_uid.clone());
    let now = Instant::now();
    let mut book = Book::new(
        &cfg.state_dir,
        me.clone(),
        cfg.owner_ttl,
        cfg.record_timeout,
        cfg.force_unlock,
        crate::config::hostname(),
        now,
    );
    match Recorder::start(Box::new(FileStore::new(&cfg.state_dir)), me, cfg.owner_ttl) {
        Ok(r) => (Some(r), book),
        Err(e) => {
            let failed = Completion::not_usable(format!("cannot start the recorder thread: {e}"));
            for ev in book.on_completion(failed, now) {
                if let Event::Log(n) = ev {
                    n.log();
                }
            }
            (None, book)
        }
    }
}

/// The loop's key of a run from its id (`r7` -> 7).
fn run_key(run: &str) -> Option<u64> {
    run.strip_prefix('r')?.parse().ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn run_ids_map_back_to_keys() {
        assert_eq!(super::run_key("r7"), Some(7));
        assert_eq!(super::run_key("7"), None);
        assert_eq!(super::run_key("rx"), None);
    }
}

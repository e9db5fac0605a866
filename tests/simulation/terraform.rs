//! terraform itself: a run takes the lock of its directory's state when it starts (or waits for
//! it with `-lock-timeout`, then gives up), with its Who and its node's wall clock as Created,
//! works, and releases it when it ends or stops gracefully (or ignores SIGTERM); a SIGKILLed
//! terraform leaves its lock.

use tfinit::locks::names::RunId;

use super::world::{workspace_name, Ev, LoopEv, Ms, World};

/// A held state lock in terraform's backend.
#[derive(Debug, Clone)]
pub struct Lock {
    /// Its ID (a plain lock id).
    pub id: u64,
    /// terraform's Who: `@host`.
    pub who: String,
    /// Created, stamped by the holder's node wall clock.
    pub created_ms: u64,
    /// The terraform process holding it.
    pub holder: usize,
}

/// The key of terraform's lock table: (state, workspace).
pub type LockKey = (u8, u8);

/// A terraform process's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PState {
    /// Starting up, not yet at the lock.
    Starting,
    /// Waiting for a held lock (-lock-timeout), until `until`.
    Waiting {
        /// Gives up then.
        until: Ms,
    },
    /// Holding the lock, working.
    Holding,
    /// SIGTERMed while holding: finishing, then releases the lock.
    Stopping,
    /// Exited or killed.
    Dead,
}

/// A terraform process.
#[derive(Debug, Clone)]
pub struct Proc {
    /// Its init.
    pub inc: usize,
    /// Its run id.
    pub run: RunId,
    /// Where.
    pub workdir: u8,
    /// The lock it takes: its directory's state, its workspace.
    pub key: LockKey,
    /// Its Who.
    pub who: String,
    /// Life.
    pub state: PState,
    /// Timer generation (older timers are ignored).
    pub gen: u32,
    /// The lock it holds (its id).
    pub lock: Option<u64>,
    /// When it started.
    pub started: Ms,
    /// How long it works once it holds the lock.
    pub work: Ms,
    /// Ignores SIGTERM.
    pub stubborn: bool,
    /// SIGKILLed.
    pub killed: bool,
    /// When it ended (Ms::MAX while alive).
    pub died: Ms,
}

impl World {
    pub fn on_proc_timer(&mut self, p: usize, gen: u32) {
        if self.procs[p].gen != gen {
            return;
        }
        match self.procs[p].state {
            PState::Dead => {}
            PState::Starting => {
                let until = self.now + self.rng.range(0, 2 * self.cfg.ttl / 3);
                self.try_lock(p, until);
            }
            PState::Waiting { until } => self.try_lock(p, until),
            PState::Holding | PState::Stopping => {
                self.release(p);
                self.exit(p, false);
            }
        }
    }

    fn try_lock(&mut self, p: usize, until: u64) {
        let key = self.procs[p].key;
        if self.locks.contains_key(&key) {
            if self.now >= until {
                // "Error acquiring the state lock": exit code 1, nothing to release.
                return self.exit(p, false);
            }
            self.procs[p].state = PState::Waiting { until };
            let t = (self.now + 500).min(until);
            let gen = self.procs[p].gen;
            self.at(t, Ev::Proc(p, gen));
            return;
        }
        let id = self.new_lock_id();
        let inc = self.procs[p].inc;
        let created_ms = self.wall(self.incs[inc].node);
        self.locks.insert(
            key,
            Lock {
                id,
                who: self.procs[p].who.clone(),
                created_ms,
                holder: p,
            },
        );
        self.holders.push(p);
        let pr = &mut self.procs[p];
        pr.lock = Some(id);
        pr.state = PState::Holding;
        let (t, gen) = (self.now + pr.work, pr.gen);
        self.log(|| {
            format!(
                "terraform {p} takes lock {id} of state s{} {}",
                key.0,
                workspace_name(key.1)
            )
        });
        self.at(t, Ev::Proc(p, gen));
    }

    fn release(&mut self, p: usize) {
        let key = self.procs[p].key;
        if let Some(id) = self.procs[p].lock.take() {
            if self.locks.get(&key).is_some_and(|l| l.id == id) {
                self.locks.remove(&key);
            }
        }
    }

    fn exit(&mut self, p: usize, killed: bool) {
        let pr = &mut self.procs[p];
        if pr.state == PState::Dead {
            return;
        }
        pr.state = PState::Dead;
        pr.killed = killed;
        pr.died = self.now;
        pr.gen += 1;
        let inc = pr.inc;
        self.holders.retain(|h| *h != p);
        self.log(|| format!("terraform {p} {}", if killed { "killed" } else { "exits" }));
        if self.incs[inc].alive {
            let now = self.now;
            self.at(now, Ev::Loop(inc, LoopEv::Reaped { proc: p }));
        }
    }

    /// SIGTERM: it stops at once before the lock, else finishes in a while and releases the lock
    /// (unless it ignores the signal).
    pub fn sigterm(&mut self, p: usize) {
        match self.procs[p].state {
            PState::Starting | PState::Waiting { .. } => self.exit(p, false),
            PState::Holding if !self.procs[p].stubborn => {
                let t = self.now + self.rng.range(100, 3000);
                let pr = &mut self.procs[p];
                pr.state = PState::Stopping;
                pr.gen += 1;
                let gen = pr.gen;
                self.at(t, Ev::Proc(p, gen));
            }
            _ => {}
        }
    }

    /// SIGKILL: dead now; a lock it held stays.
    pub fn sigkill(&mut self, p: usize) {
        if self.procs[p].state != PState::Dead {
            self.exit(p, true);
        }
    }
}

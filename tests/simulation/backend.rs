//! terraform's backend as a recovery helper meets it: the probe (`force-unlock` with an id that
//! cannot match, printing what the helper's terraform version prints, which the real lockinfo
//! parser reads) and the force-unlock (s3's compare, then an unconditional delete), and what the
//! simulation knows of each unlock (`World::force_unlock` names the cause of an unlock of a live
//! holder's lock).

use std::rc::Rc;

use tfinit::locks::lockinfo::{self, LockInfo};
use tfinit::locks::record::{FileId, Owner, Record};

use super::check::{Cause, VKind};
use super::exec::Sim;
use super::helper::{dir_of, Ctx, Judged};
use super::terraform::{Lock, LockKey, PState};
use super::world::{workspace_name, Ev, LoopEv, Ms, Rules, Tf, World, EPOCH_MS};

/// What the probe found (lockinfo::Probe, the cases the backend model has; the old helper's).
pub enum Probe {
    /// No lock.
    Free,
    /// This lock.
    Held(LockInfo),
    /// The probe could not tell.
    Unknown,
}

/// The old helper's probe: [`probe_output`], read by the real lockinfo parser.
pub async fn probe(sim: &Sim, c: &Ctx, rec: &Record) -> Probe {
    let output = probe_output(sim, c.tf, rec).await;
    match lockinfo::parse_probe_of("s3", None, false, &output) {
        lockinfo::Probe::Free => Probe::Free,
        lockinfo::Probe::Held(info) => Probe::Held(info),
        // Not read (the table did not answer), or read in a wording not known: cannot tell.
        lockinfo::Probe::Unknown(_) | lockinfo::Probe::Unreadable(_) => Probe::Unknown,
        lockinfo::Probe::HeldStateMissing(_) => unreachable!("the model's states exist"),
    }
}

/// `terraform force-unlock -force <id that cannot match>` in the record's directory, by
/// terraform `tf`: it reads the lock of the directory's state at one moment and prints what that
/// version prints (exit status 1), which the real lockinfo parser reads (`parse_probe_of`).
pub async fn probe_output(sim: &Sim, tf: Tf, rec: &Record) -> String {
    let (at, done, unknown, key) = sim.with(|w| {
        let calm = w.now >= w.cfg.calm_at;
        let dur = w.rng.range(200, 2000);
        let at = w.rng.range(w.now, w.now + dur);
        let unknown = !calm && w.rng.chance(w.cfg.probe_unknown);
        (at, w.now + dur, unknown, w.key_of(rec))
    });
    let slot = Rc::new(std::cell::RefCell::new(None));
    let s2 = Rc::clone(&slot);
    sim.with(|w| {
        w.at(
            at,
            Ev::Call(Box::new(move |w| {
                let held = key.and_then(|k| w.locks.get(&k).cloned());
                let holder_tf = held
                    .as_ref()
                    .map(|l| w.pods[w.incs[w.procs[l.holder].inc].pod].tf);
                *s2.borrow_mut() = Some((held, holder_tf, key));
            })),
        )
    });
    sim.sleep_until(done).await;
    let Some((held, holder_tf, key)) = slot.borrow_mut().take() else {
        unreachable!("the probe's read was taken before its end")
    };
    if unknown {
        unreachable_output(tf)
    } else {
        match (&held, key) {
            (Some(l), Some(k)) => held_output(l, k, holder_tf.unwrap_or(tf)),
            _ => free_output(tf),
        }
    }
}

/// The id a probe passes (lockinfo::probe_id for s3): it cannot match a lock.
pub const PROBE_ID: &str = "00000000-0000-0000-0000-000000000000";

/// What `force-unlock` prints for a free s3 lock (stderr, exit 1).
fn free_output(tf: Tf) -> String {
    match tf {
        // Measured (tests/fixtures/terraform/lock/probe-free.stderr).
        Tf::V1_0_3 => include_str!("../fixtures/terraform/lock/probe-free.stderr").to_string(),
        // Issue 23 finding 4, as 1.11.4 printed it (s3/client.go `Unlock`: `failed to retrieve
        // lock info for lock ID %q: %s`, the format string in the 1.11.4 binary).
        Tf::V1_11 => format!(
            "Failed to unlock state: failed to retrieve lock info for lock ID \"{PROBE_ID}\": unexpected end of JSON input\n"
        ),
    }
}

/// What `force-unlock` prints when the lock table cannot be read (network).
fn unreachable_output(tf: Tf) -> String {
    match tf {
        // Measured (tests/fixtures/terraform/lock/probe-endpoint-down.stderr).
        Tf::V1_0_3 => {
            include_str!("../fixtures/terraform/lock/probe-endpoint-down.stderr").to_string()
        }
        // From the source (the AWS SDK v2's wording after the same format string).
        Tf::V1_11 => format!(
            "Failed to unlock state: failed to retrieve lock info for lock ID \"{PROBE_ID}\": operation error DynamoDB: GetItem, exceeded maximum number of attempts, 3, https response error StatusCode: 0, RequestID: , request send failed, Post \"http://127.0.0.1:45999/\": dial tcp 127.0.0.1:45999: connect: connection refused\n"
        ),
    }
}

/// What `force-unlock` prints for lock `l` of state key `k`, taken by terraform `holder` (its
/// Version): 1.0.3's byte-exact shape (docs/notes/terraform-facts.md 3a; 1.11.4 has the same
/// `lock id %q does not match existing lock` and Lock Info template).
fn held_output(l: &Lock, k: LockKey, holder: Tf) -> String {
    let version = match holder {
        Tf::V1_0_3 => "1.0.3",
        Tf::V1_11 => "1.11.4",
    };
    let prefix = if k.1 == 0 {
        String::new()
    } else {
        format!("env:/{}/", workspace_name(k.1))
    };
    format!(
        "Failed to unlock state: lock id \"{PROBE_ID}\" does not match existing lock\nLock Info:\n  ID:        {}\n  Path:      tfstate/{prefix}states/s{}.tfstate\n  Operation: OperationTypeApply\n  Who:       {}\n  Version:   {version}\n  Created:   {}\n  Info:      \n\n",
        lock_id(l.id),
        k.0,
        l.who,
        go_time(l.created_ms)
    )
}

/// The model's lock `id` as terraform's UUID-shaped lock ID.
fn lock_id(id: u64) -> String {
    format!("5e1d6a0c-4f0b-4b3a-9f1e-{id:012x}")
}

/// The model's lock id of terraform's lock ID `id` (see [`lock_id`]).
fn model_lock_id(id: &str) -> Option<u64> {
    u64::from_str_radix(id.rsplit('-').next()?, 16).ok()
}

/// `ms` since the epoch as Go's time.Time String() in UTC, as terraform prints Created
/// (`2026-11-21 23:56:11.330240859 +0000 UTC`; the model's clocks have milliseconds).
fn go_time(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let (y, m, d) = tfinit::calendar::civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:03}000000 +0000 UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

#[test]
fn a_created_stamp_reads_back_through_lockinfo() {
    for ms in [
        EPOCH_MS,
        EPOCH_MS + 86_399_999,
        1_795_305_371_330,
        951_782_400_000,
    ] {
        assert_eq!(
            lockinfo::parse_go_time(&go_time(ms)),
            Some(ms),
            "{}",
            go_time(ms)
        );
    }
    assert_eq!(
        go_time(1_795_305_371_330),
        "2026-11-21 23:56:11.330000000 +0000 UTC"
    );
}

/// `terraform force-unlock -force <id>`: releases the lock if it still has that id.
/// As s3/client.go `Unlock` does it (docs/notes/terraform-facts.md 3d): a GetItem at one
/// moment compares the id, and only on a match a DeleteItem at a later moment deletes whatever
/// lock is there then, unconditionally (this is why recoveries go one at a time,
/// `recover.lock`). Whether the id matched: terraform's exit status.
pub async fn unlock(sim: &Sim, id: &str, judged: Judged) -> bool {
    let id: u64 = model_lock_id(id).unwrap_or(u64::MAX);
    let (read_at, delete_at, done, key) = sim.with(|w| {
        let dur = w.rng.range(200, 2000);
        let read_at = w.rng.range(w.now, w.now + dur);
        (
            read_at,
            w.rng.range(read_at, w.now + dur),
            w.now + dur,
            w.key_of(&judged.rec),
        )
    });
    let slot = Rc::new(std::cell::RefCell::new(false));
    let s2 = Rc::clone(&slot);
    sim.with(|w| {
        w.at(
            read_at,
            Ev::Call(Box::new(move |w| {
                // terraform dies with the helper's container: killed before the compare's
                // answer, it sends no delete (one sent before lands all the same).
                let Some(k) = key.filter(|_| w.helpers[judged.helper].alive) else {
                    return;
                };
                if w.locks.get(&k).map(|l| l.id) != Some(id) {
                    return;
                }
                *s2.borrow_mut() = true;
                let delete = move |w: &mut World| w.force_unlock(k, id, &judged);
                if delete_at == w.now {
                    delete(w);
                } else {
                    w.at(delete_at, Ev::Call(Box::new(delete)));
                }
            })),
        )
    });
    sim.sleep_until(done).await;
    let ok = *slot.borrow();
    ok
}

impl World {
    /// The key of the lock a run of `rec` takes: the state its directory's backend names, and
    /// its workspace.
    pub fn key_of(&self, rec: &Record) -> Option<LockKey> {
        let dir = self.cfg.dirs.get(dir_of(&rec.workdir)? as usize)?;
        let ws = (0..self.cfg.workspaces).find(|ws| workspace_name(*ws) == rec.workspace)?;
        Some((dir.state, ws))
    }

    /// A helper ended: `recover.lock` goes to the next waiter, its init hears of it.
    pub fn helper_exit(&mut self, h: usize) {
        if !self.helpers[h].alive {
            return;
        }
        self.helpers[h].alive = false;
        self.release_recover_lock(h);
        let now = self.now;
        if let Some(inc) = self.helpers[h].init.filter(|i| self.incs[*i].alive) {
            self.at(now, Ev::Loop(inc, LoopEv::HelperExit { helper: h }));
        }
    }

    /// Helper `h`'s flock on `recover.lock` is gone (it ended, or died).
    pub fn release_recover_lock(&mut self, h: usize) {
        self.store.recover_queue.retain(|x| *x != h);
        if self.store.recover_holder != Some(h) {
            return;
        }
        self.store.recover_holder = None;
        while let Some(next) = self.store.recover_queue.pop_front() {
            if self.helpers[next].alive {
                self.store.recover_holder = Some(next);
                let task = self.helpers[next].task;
                let now = self.now;
                self.at(now, Ev::Wake(task));
                break;
            }
        }
    }

    /// The force-unlock's delete lands: whatever lock is at `key` goes (its id was `id` when
    /// terraform compared it). Safety: its holder must be dead.
    pub fn force_unlock(&mut self, key: LockKey, id: u64, j: &Judged) {
        let Some(lock) = self.locks.remove(&key) else {
            return;
        };
        let holder = lock.holder;
        let other = lock.id != id;
        let id = lock.id;
        self.log(|| {
            format!(
                "helper {} force-unlocks lock {id} of process {holder} ({})",
                j.helper, j.why
            )
        });
        if self.procs[holder].state == PState::Dead {
            self.stats.unlocks += 1;
            return;
        }
        let cause = if other {
            Cause::UnlockRace
        } else {
            self.classify(holder, j)
        };
        let p = &self.procs[holder];
        let text = format!(
            "helper {} (of {}, TTL {} ms) force-unlocked lock {id} of state s{} {} held by live process {holder} (run {} of {} in /tf/w{}, TTL {} ms, started at {} ms), recovering record of run {} of {} in {} ({}), because: {}",
            j.helper,
            self.helpers[j.helper].me.key(),
            self.helpers[j.helper].ttl,
            key.0,
            workspace_name(key.1),
            p.run,
            self.incs[p.inc].key,
            p.workdir,
            self.incs[p.inc].ttl,
            p.started,
            j.rec.run_id,
            j.rec.owner.key(),
            j.rec.workdir,
            j.rec.who,
            j.why
        );
        self.fail(VKind::Safety(cause), text);
    }

    /// What made a helper unlock a live holder's lock.
    fn classify(&self, holder: usize, j: &Judged) -> Cause {
        let p = &self.procs[holder];
        let h = &self.helpers[j.helper];
        let own_run = self.incs[p.inc].owner.same_incarnation(&j.rec.owner)
            && p.run.to_string() == j.rec.run_id;
        if own_run {
            let key = &self.incs[p.inc].key;
            let shared = self
                .incs
                .iter()
                .enumerate()
                .any(|(i, x)| i != p.inc && x.alive && x.key == *key);
            if shared {
                return Cause::SharedKey;
            }
            if self.create_failed(p.inc, p.run) {
                return Cause::LandedButFailed;
            }
            if self.cfg.rules == Rules::New {
                // Issue 23 finding 3: the kernel "proved" it gone on a file that replaced its own.
                if j.why.contains("kernel freed") && self.lock_file_replaced(p.inc) {
                    return Cause::ReplacedLockFile;
                }
                // Finding 1: it beats and fences by a TTL longer than the one it was judged by.
                if self.incs[p.inc].ttl > h.ttl {
                    return Cause::OwnersTtl;
                }
                return Cause::Other;
            }
            if j.why.contains("earlier incarnation")
                || j.why.contains("restarted since")
                || j.hb_other
            {
                return Cause::SharedName;
            }
            let Some(stamped) = j.hb_stamped else {
                return Cause::Other;
            };
            // The heartbeat read was younger than the TTL in real time: only the two nodes'
            // wall clocks made it look older.
            if j.decided_at.saturating_sub(stamped) <= self.cfg.ttl {
                return Cause::Skew;
            }
            let stale = self
                .store
                .records
                .values()
                .any(|s| s.inc == p.inc && s.rec.run_id == p.run.to_string() && s.landed_stale);
            return if stale {
                Cause::StaleRecord
            } else {
                Cause::NoFence
            };
        }
        // Finding 2: a live run with the record's Who on the same state, in another directory.
        let rec_dir = dir_of(&j.rec.workdir);
        let same_state = rec_dir.is_some_and(|d| self.cfg.dirs[d as usize].state == p.key.0);
        if self.cfg.rules == Rules::New
            && p.who == j.rec.who
            && rec_dir != Some(p.workdir)
            && same_state
        {
            return Cause::SameState;
        }
        if Some(p.inc) == h.init && p.started >= h.started {
            return Cause::TwoHelpers;
        }
        if self.cfg.rules == Rules::New && Some(p.inc) == h.init && p.who == j.rec.who {
            return Cause::InitsLiveRun;
        }
        if p.who == j.rec.who && self.incs[p.inc].owner.same_incarnation(&j.rec.owner) {
            return Cause::OwnUnrecorded;
        }
        if p.who == j.rec.who && Some(p.inc) != h.init {
            return Cause::SameWho;
        }
        Cause::Other
    }

    /// Whether the file at incarnation `inc`'s lock path is not the one it locked.
    pub fn lock_file_replaced(&self, inc: usize) -> bool {
        let i = &self.incs[inc];
        self.store
            .lock_files
            .get(&i.key)
            .is_some_and(|f| i.lock_ino.is_some_and(|ino| ino != f.ino))
    }

    /// What the kernel of `node` says at time `t` of `owner`'s lock file, when it is the file
    /// `file` (`Store::incarnation_gone`): the file at the path is compared with `file` by the
    /// store's own rule (`same_lock_file`), then its flock is tested. On this kernel, whether
    /// every process holding it (the init that took it and its terraform runs) is gone; from
    /// another kernel, or on a copy nobody locked, "free", which proves nothing of the owner:
    /// the boot-id and inode checks must refuse it, not luck.
    pub fn incarnation_gone_at(
        &self,
        node: usize,
        owner: &Owner,
        file: FileId,
        t: Ms,
    ) -> Option<bool> {
        let found = self.store.lock_files.get(&owner.key())?;
        let id = FileId {
            dev: super::world::VOLUME_DEV,
            ino: found.ino,
        };
        if !tfinit::locks::store::same_lock_file(id, file) {
            return None;
        }
        match found.holder {
            Some(h) if self.incs[h].node == node => Some(!self.flock_held(h, t)),
            _ => Some(true),
        }
    }
}

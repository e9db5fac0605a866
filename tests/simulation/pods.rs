//! Pods and containers: what the environment does (a pod starts, restarts, is deleted or killed,
//! an OOM kill, `tfinit recover` by hand, a restore of `owners/`), and the life of an incarnation
//! (its start with its book and recorder, its death with every process of its container).

use tfinit::locks::book::Book;
use tfinit::locks::liveness::{Observer, LONGEST_TTL};
use tfinit::locks::record::Owner;

use super::init::Today;
use super::legacy;
use super::terraform::PState;

use super::world::{BookSide, Ev, Helper, Inc, LockFile, LoopEv, Ms, Rules, Spawn, World};

/// Something the environment does.
#[derive(Debug, Clone)]
pub enum EnvEv {
    /// A pod's container starts (its first incarnation).
    StartPod(usize),
    /// The pod's controller asks for a state-locking run (another live pod's if it is gone).
    Request {
        /// The pod.
        pod: usize,
        /// Where.
        workdir: u8,
        /// Which workspace.
        ws: u8,
    },
    /// The calm phase's observer asks for a run (progress is owed from here).
    Observe {
        /// The observer pod.
        pod: usize,
        /// Where.
        workdir: u8,
        /// Which workspace.
        ws: u8,
    },
    /// The pod dies with everything in it (node lost, SIGKILL); gone for good.
    KillPod(usize),
    /// The container restarts: PID 1 dies, a new incarnation starts `after` ms later.
    Restart {
        /// The pod.
        pod: usize,
        /// Delay.
        after: Ms,
    },
    /// The pod is deleted: SIGTERM, the kubelet's SIGKILL after `grace`.
    Terminate {
        /// The pod.
        pod: usize,
        /// terminationGracePeriodSeconds.
        grace: Ms,
    },
    /// The OOM killer SIGKILLs one terraform of the pod (its init lives on), one that waits for
    /// its lock (`-lock-timeout`) as well as one that holds it.
    Oom(usize),
    /// A person runs `tfinit recover` in the pod's container with TFINIT_OWNER_TTL `ttl` (the
    /// default, or nothing of the pod's environment).
    ManualRecover {
        /// The pod.
        pod: usize,
        /// Its TTL.
        ttl: Ms,
    },
    /// `owners/` is restored from a backup: every incarnation lock file is replaced by a copy (a
    /// new inode, flocked by nobody) while its holders keep the old one.
    RestoreOwners,
    /// A person deletes one tfinit Lease (or, `garbage`, edits it into something unreadable),
    /// of an owner none of whose Leases was touched yet (the Lease store).
    Hand {
        /// Edited into garbage rather than deleted.
        garbage: bool,
    },
    /// A fault, a freeze, a clock step or the calm phase, listed for the replay.
    Note(String),
}

impl World {
    /// A new incarnation of pod `pod`'s container.
    pub fn start_inc(&mut self, pod: usize) {
        let node = self.pods[pod].node;
        let owner = Owner {
            name: self.pods[pod].owner_name.clone(),
            boot_id: self.nodes[node].boot.clone(),
            started_ms: self.wall(node),
            pid: 1,
            pod_uid: Some(self.pods[pod].uid.clone()),
            // The real init draws 32 random bits; the index of the incarnation stands for bits
            // that never collide. The old rules had none.
            nonce: (self.cfg.rules == Rules::New).then_some(self.incs.len() as u32),
        };
        let now = self.mono(node);
        let ttl = std::time::Duration::from_millis(self.pods[pod].ttl);
        let rt = std::time::Duration::from_millis(self.cfg.record_timeout);
        let host = self.pods[pod].host.clone();
        let book = match self.cfg.rules {
            Rules::New => BookSide::New(Box::new(Today::new(
                Book::new(
                    std::path::Path::new("/state"),
                    owner.clone(),
                    Observer::new(ttl, LONGEST_TTL),
                    rt,
                    true,
                    host.clone(),
                    now,
                ),
                ttl,
                rt,
            ))),
            Rules::Legacy => BookSide::Old(Box::new(legacy::Book::new(
                owner.clone(),
                ttl,
                rt,
                host.clone(),
                now,
            ))),
        };
        let inc = self.incs.len();
        let task = self.spawn(Spawn::Recorder(inc), Some(inc));
        self.incs.push(Inc {
            pod,
            node,
            key: owner.key(),
            owner,
            host,
            ttl: self.pods[pod].ttl,
            lock_ino: None,
            alive: true,
            stopping: false,
            book,
            inbox: Vec::new(),
            requests: Vec::new(),
            writes: 0,
            rec_task: task,
            runs: Default::default(),
            next_run: 1,
            wake_at: None,
            helpers: Vec::new(),
            holds_lock: false,
            beat_landed: None,
            died_at: None,
            wake_pending: None,
            rec_idle: false,
        });
        self.pods[pod].inc = Some(inc);
        let key = self.incs[inc].key.clone();
        self.log(|| format!("pod {pod} starts incarnation {inc} ({key})"));
    }

    /// PID 1 of incarnation `inc` dies: every process of its container with it.
    pub fn kill_inc(&mut self, inc: usize, why: &str) {
        if !self.incs[inc].alive {
            return;
        }
        let key = self.incs[inc].key.clone();
        self.log(|| format!("incarnation {inc} ({key}) dies: {why}"));
        self.incs[inc].alive = false;
        self.incs[inc].died_at = Some(self.now);
        let task = self.incs[inc].rec_task;
        self.task_alive[task] = false;
        for p in 0..self.procs.len() {
            if self.procs[p].inc == inc && self.procs[p].state != PState::Dead {
                let pr = &mut self.procs[p];
                pr.state = PState::Dead;
                pr.killed = true;
                pr.died = self.now;
                pr.gen += 1;
                self.holders.retain(|h| *h != p);
            }
        }
        for h in self.incs[inc].helpers.clone() {
            if self.helpers[h].alive {
                self.helpers[h].alive = false;
                let t = self.helpers[h].task;
                self.task_alive[t] = false;
                self.release_recover_lock(h);
            }
        }
    }

    /// Environment event number `n`.
    pub fn on_env(&mut self, n: usize) {
        let ev = self.env[n].1.clone();
        match ev {
            EnvEv::StartPod(pod) => {
                if !self.pods[pod].gone {
                    self.start_inc(pod);
                }
            }
            EnvEv::Request { pod, workdir, ws } => {
                let target = self.live_inc(pod);
                if let Some(inc) = target {
                    let now = self.now;
                    self.at(
                        now,
                        Ev::Loop(
                            inc,
                            LoopEv::Request {
                                workdir,
                                ws,
                                observed: false,
                            },
                        ),
                    );
                }
            }
            EnvEv::Observe { pod, workdir, ws } => {
                if let Some(inc) = self.pods[pod].inc.filter(|i| self.incs[*i].alive) {
                    let now = self.now;
                    self.at(
                        now,
                        Ev::Loop(
                            inc,
                            LoopEv::Request {
                                workdir,
                                ws,
                                observed: self.cfg.progress,
                            },
                        ),
                    );
                }
            }
            EnvEv::KillPod(pod) => {
                self.pods[pod].gone = true;
                if let Some(inc) = self.pods[pod].inc {
                    self.kill_inc(inc, "pod killed (node lost)");
                }
            }
            EnvEv::Restart { pod, after } => {
                if let Some(inc) = self.pods[pod].inc.filter(|i| self.incs[*i].alive) {
                    self.kill_inc(inc, "container restart (PID 1 killed)");
                    let t = self.now + after;
                    self.at(
                        t,
                        Ev::Call(Box::new(move |w| {
                            if !w.pods[pod].gone {
                                w.start_inc(pod);
                            }
                        })),
                    );
                }
            }
            EnvEv::Terminate { pod, grace } => {
                self.pods[pod].gone = true;
                if let Some(inc) = self.pods[pod].inc.filter(|i| self.incs[*i].alive) {
                    self.stop_inc(inc);
                    let t = self.now + grace;
                    self.at(t, Ev::Hard(pod));
                }
            }
            EnvEv::Oom(pod) => {
                if let Some(inc) = self.pods[pod].inc {
                    // Any of its terraform processes, one waiting for its lock as well.
                    let live: Vec<usize> = (0..self.procs.len())
                        .filter(|p| {
                            self.procs[*p].inc == inc && self.procs[*p].state != PState::Dead
                        })
                        .collect();
                    if !live.is_empty() {
                        let p = live[self.rng.pick(live.len())];
                        self.sigkill(p);
                    }
                }
            }
            EnvEv::ManualRecover { pod, ttl } => self.manual_recover(pod, ttl),
            EnvEv::RestoreOwners => {
                for f in self.store.lock_files.values_mut() {
                    self.store.next_ino += 1;
                    *f = LockFile {
                        ino: self.store.next_ino,
                        holder: None,
                    };
                }
                self.log(|| {
                    "owners/ restored from a backup: every lock file is a new, free copy".into()
                });
            }
            EnvEv::Hand { garbage } => self.hand(garbage),
            EnvEv::Note(_) => {}
        }
    }

    /// `tfinit recover` by hand in pod `pod`'s container, with TFINIT_OWNER_TTL `ttl`: a new
    /// incarnation of the pod's owner name (client/control.rs `recover_all`), every record, no
    /// watches of the init's, no live runs.
    fn manual_recover(&mut self, pod: usize, ttl: u64) {
        let Some(inc) = self.pods[pod].inc.filter(|i| self.incs[*i].alive) else {
            return;
        };
        let node = self.incs[inc].node;
        let me = Owner {
            name: self.pods[pod].owner_name.clone(),
            boot_id: self.nodes[node].boot.clone(),
            started_ms: self.wall(node),
            pid: 4242,
            pod_uid: None,
            nonce: Some(1_000_000 + self.helpers.len() as u32),
        };
        let h = self.helpers.len();
        let task = self.spawn(Spawn::Helper(h), None);
        self.helpers.push(Helper {
            init: None,
            node,
            me,
            ttl,
            tf: self.pods[pod].tf,
            workdir: None,
            task,
            alive: true,
            live: Vec::new(),
            started: self.now,
        });
        self.stats.helpers += 1;
        self.incs[inc].helpers.push(h);
        self.log(|| format!("tfinit recover by hand in pod {pod} (TTL {ttl} ms): helper {h}"));
    }

    /// The live, accepting incarnation of `pod`, else of any pod.
    fn live_inc(&self, pod: usize) -> Option<usize> {
        let ok = |i: usize| self.incs[i].alive && !self.incs[i].stopping;
        self.pods[pod].inc.filter(|i| ok(*i)).or_else(|| {
            let n = self.pods.len();
            (1..n)
                .map(|d| (pod + d) % n)
                .find_map(|p| self.pods[p].inc.filter(|i| ok(*i)))
        })
    }
}

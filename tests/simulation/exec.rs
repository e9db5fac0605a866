//! The deterministic executor: the recorders and recovery helpers are async tasks polled in
//! simulated time, every volume operation of theirs a timed operation (`Sim::read`,
//! `Sim::write`) that takes effect at one moment between its start and its end.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use tfinit::locks::record::{Heartbeat, Owner, Record};

use super::check::{VKind, STEP_LIMIT};
use super::world::{Ev, Ms, Spawn, TaskId, World, WriteOutcome};

/// A task's future.
pub type Task = Pin<Box<dyn Future<Output = ()>>>;

struct Noop;
impl Wake for Noop {
    fn wake(self: Arc<Self>) {}
}

/// The world and its tasks.
pub struct Sim {
    /// The world.
    pub w: RefCell<World>,
    futs: RefCell<Vec<Option<Task>>>,
    waker: Waker,
    /// Makes the future of a task to spawn (the recorder's or a helper's).
    task: fn(Rc<Sim>, Spawn) -> Task,
}

impl Sim {
    /// A simulation of `w` whose tasks `task` makes.
    pub fn new(w: World, task: fn(Rc<Sim>, Spawn) -> Task) -> Rc<Sim> {
        Rc::new(Sim {
            w: RefCell::new(w),
            futs: RefCell::new(Vec::new()),
            waker: Waker::from(Arc::new(Noop)),
            task,
        })
    }

    /// Now.
    pub fn now(&self) -> Ms {
        self.w.borrow().now
    }

    /// Runs `f` on the world.
    pub fn with<T>(&self, f: impl FnOnce(&mut World) -> T) -> T {
        f(&mut self.w.borrow_mut())
    }

    /// Waits until simulated time `t`.
    pub fn sleep_until(&self, t: Ms) -> Until<'_> {
        Until {
            sim: self,
            t,
            armed: false,
        }
    }

    /// A read of the volume from `node`: `f` sees the volume as it is at one moment between
    /// now and the read's end.
    pub async fn read<T: 'static>(&self, node: usize, f: impl FnOnce(&World) -> T + 'static) -> T {
        let (at, done) = self.with(|w| w.op_timing(node));
        let now = self.now();
        if at == now {
            let v = self.with(|w| f(w));
            self.sleep_until(done).await;
            return v;
        }
        if at == done {
            self.sleep_until(done).await;
            return self.with(|w| f(w));
        }
        let slot = Rc::new(RefCell::new(None));
        let s2 = Rc::clone(&slot);
        self.with(|w| {
            w.at(
                at,
                Ev::Call(Box::new(move |w| {
                    *s2.borrow_mut() = Some(f(w));
                })),
            )
        });
        self.sleep_until(done).await;
        let v = slot.borrow_mut().take();
        v.expect("the read's snapshot was taken before its end")
    }

    /// A write to the volume from `node`: `f` applies it at one moment between now and the
    /// write's end (even if the writer dies meanwhile: the request is on its way).
    pub async fn write(
        &self,
        node: usize,
        f: impl FnOnce(&mut World) + 'static,
    ) -> Result<(), String> {
        let (at, done, outcome) = self.with(|w| {
            let (at, done) = w.op_timing(node);
            (at, done, w.write_outcome(node, at))
        });
        if outcome != WriteOutcome::Fails {
            if at == self.now() {
                self.with(f);
            } else {
                self.with(|w| w.at(at, Ev::Call(Box::new(f))));
            }
        }
        self.sleep_until(done).await;
        match outcome {
            WriteOutcome::Lands => Ok(()),
            WriteOutcome::LandsWithError => Err("EIO (the write landed, its fsync failed)".into()),
            WriteOutcome::Fails => Err("No space left on device".into()),
        }
    }

    /// Runs the events until the schedule ends or an invariant fails.
    pub fn run(self: &Rc<Self>) {
        loop {
            self.start_spawned();
            let Some(ev) = self.w.borrow_mut().next_event() else {
                break;
            };
            match ev {
                Ev::Wake(task) => self.poll(task),
                Ev::Call(f) => f(&mut self.w.borrow_mut()),
                other => self.w.borrow_mut().handle(other),
            }
            let mut w = self.w.borrow_mut();
            w.stats.steps += 1;
            if w.stats.steps > STEP_LIMIT {
                let text = format!("more than {STEP_LIMIT} steps: something wakes in a loop");
                w.fail(VKind::Runaway, text);
            }
            w.check();
            if w.violation.is_some() {
                break;
            }
        }
        // Futures hold the Sim: drop them to free the schedule.
        self.futs.borrow_mut().clear();
    }

    fn start_spawned(self: &Rc<Self>) {
        let spawns = std::mem::take(&mut self.w.borrow_mut().spawns);
        for (id, what) in spawns {
            let fut = (self.task)(Rc::clone(self), what);
            let mut futs = self.futs.borrow_mut();
            if futs.len() <= id {
                futs.resize_with(id + 1, || None);
            }
            futs[id] = Some(fut);
            let mut w = self.w.borrow_mut();
            let now = w.now;
            w.at(now, Ev::Wake(id));
        }
    }

    fn poll(self: &Rc<Self>, task: TaskId) {
        {
            let mut w = self.w.borrow_mut();
            if !w.task_alive.get(task).copied().unwrap_or(false) {
                return;
            }
            // A frozen pod's recorder thread runs when the freeze ends.
            if let Some(inc) = w.task_inc[task] {
                let pod = w.incs[inc].pod;
                if let Some(end) = w.frozen_until(pod) {
                    w.at(end, Ev::Wake(task));
                    return;
                }
            }
            w.current = task;
        }
        let Some(mut fut) = self.futs.borrow_mut().get_mut(task).and_then(Option::take) else {
            return;
        };
        let mut cx = Context::from_waker(&self.waker);
        let done = fut.as_mut().poll(&mut cx).is_ready();
        let alive = self.w.borrow().task_alive[task];
        if !done && alive {
            self.futs.borrow_mut()[task] = Some(fut);
        } else {
            self.w.borrow_mut().task_alive[task] = false;
        }
    }
}

// What the recorder and the helpers read of the volume, and a create's completion.

/// Every record on the volume, at one moment.
pub async fn list(sim: &Sim, node: usize) -> Vec<(u64, Rc<Record>)> {
    if sim.with(|w| w.cfg.leases) {
        let mut kube = super::lease_store::Client::new(node);
        return kube.records(sim).await.map(|l| l.0).unwrap_or_default();
    }
    sim.read(node, |w| {
        w.store
            .records
            .iter()
            .map(|(id, s)| (*id, Rc::clone(&s.rec)))
            .collect()
    })
    .await
}

/// The heartbeat file of incarnation `owner` (today's layout).
pub async fn read_heartbeat(
    sim: &Sim,
    node: usize,
    owner: &Owner,
) -> Result<Option<Heartbeat>, String> {
    if sim.with(|w| w.cfg.leases) {
        let mut kube = super::lease_store::Client::new(node);
        return kube.read_heartbeat(sim, owner).await;
    }
    let key = owner.key();
    let owner = owner.clone();
    let hb = sim
        .read(node, move |w| {
            w.store
                .beat(&key)
                .filter(|b| b.hb.v == 2 && b.hb.owner.same_incarnation(&owner))
                .map(|b| (*b.hb).clone())
        })
        .await;
    // The simulated volume answers every read (its faults hang or fail writes).
    Ok(hb)
}

/// The heartbeat file of owner name `name` (the old layout), with when its stamp was taken.
pub async fn read_heartbeat_by_name(sim: &Sim, node: usize, name: &str) -> Option<(Heartbeat, Ms)> {
    let name = name.to_string();
    sim.read(node, move |w| {
        w.store.beat(&name).map(|b| ((*b.hb).clone(), b.stamped))
    })
    .await
}

/// The future of [`Sim::sleep_until`].
pub struct Until<'a> {
    sim: &'a Sim,
    t: Ms,
    armed: bool,
}

impl Future for Until<'_> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        if self.sim.now() >= self.t {
            return Poll::Ready(());
        }
        if !self.armed {
            self.armed = true;
            let t = self.t;
            self.sim.with(|w| w.wake_current_at(t));
        }
        Poll::Pending
    }
}

/// Waits until `cond` holds on the world, or until `until` (Ms::MAX: no time limit).
pub struct WaitFor<'a, F: Fn(&World) -> bool + Unpin> {
    sim: &'a Sim,
    until: Ms,
    cond: F,
    armed: bool,
}

impl<'a, F: Fn(&World) -> bool + Unpin> WaitFor<'a, F> {
    /// Waits on `sim` for `cond`, at the latest until `until`.
    pub fn new(sim: &'a Sim, until: Ms, cond: F) -> Self {
        WaitFor {
            sim,
            until,
            cond,
            armed: false,
        }
    }
}

impl<F: Fn(&World) -> bool + Unpin> Future for WaitFor<'_, F> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let (ready, now) = {
            let w = this.sim.w.borrow();
            ((this.cond)(&w), w.now)
        };
        if ready || now >= this.until {
            return Poll::Ready(());
        }
        if !this.armed && this.until != Ms::MAX {
            this.armed = true;
            let t = this.until;
            this.sim.with(|w| w.wake_current_at(t));
        }
        Poll::Pending
    }
}

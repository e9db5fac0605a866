//! The simulated Kubernetes API server of the Lease store (issue 24): Leases by name with a
//! `resourceVersion` and a `uid`; a create of a name that exists is 409 AlreadyExists, an update
//! on a stale `resourceVersion` is 409 Conflict, an update or delete of a missing Lease is 404; a
//! delete may carry a precondition. What a Lease holds lives where the file store's model keeps
//! it (`Store::beats`, `Store::records`), so the invariants read one truth for both stores.
//!
//! Every request takes time and applies at one moment between its start and its answer, as a
//! volume operation does (`exec.rs`). The schedule's fault windows (`world::FaultKind`) mean, on
//! the API (of the whole cluster, or of one node's network):
//! - `Hang`: the API down. A request is refused at once (no connection, nothing sent), or hangs:
//!   answered after the window when that is within the client's 10 s request deadline, else no
//!   answer (`Timeout`), and a write that hung may still apply when the server comes back.
//! - `FailWrites`: 429 Too Many Requests with a `Retry-After` of 1 to 3 s (nothing applied), for
//!   every write and a quarter of the reads (the API sheds writes: renewals are refused while
//!   reads work).
//! - `LostReply`: a create, update or delete applies, and its answer is lost (`AnswerLost`).
//! - `Slow`: up to a TTL more per request; past the 10 s deadline the client gives up
//!   (`Timeout`) while the request still applies.
//!
//! The client side is the real one where it decides: `tfinit::kube::RetryPolicy::delay` (which
//! answers are sent again, after how long, `Retry-After` honoured) on the real `Error`s, within
//! the store's 10 s budget (`kube::DEFAULT_BUDGET`).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use tfinit::kube::{Error, Op, RetryPolicy, Status, Verb};

use super::exec::Sim;
use super::world::{FaultKind, Ms, World};

/// The client's deadline of one request (`kube::transport::Deadlines::default().request`).
pub const REQUEST_DEADLINE: Ms = 10_000;
/// How long one store call keeps retrying (`kube::DEFAULT_BUDGET`).
pub const BUDGET: Ms = 10_000;
/// The pods' namespace.
pub const NAMESPACE: &str = "ctl";
/// The recovery Lease's name (`kube::RECOVERY_NAME`).
pub const RECOVERY: &str = "tfinit-recovery";

/// What a Lease holds, as far as the model needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// The heartbeat of the incarnation of this key (its content: `Store::beats`).
    Beat(String),
    /// Record `id` (its content: `Store::records`).
    Record(u64),
    /// The right to recover, held by `holder` for `ttl_ms`.
    Recovery {
        /// `holderIdentity`: one per attempt of a helper.
        holder: String,
        /// `leaseDurationSeconds`, in ms (rounded up to whole seconds).
        ttl_ms: Ms,
    },
    /// Edited by hand into something that is no heartbeat or record.
    Garbage,
    /// A record set aside (`tfinit.dev/kind=corrupt`): no list of records finds it.
    Aside,
}

/// A Lease.
#[derive(Debug, Clone)]
pub struct Obj {
    /// `metadata.resourceVersion`.
    pub rv: u64,
    /// `metadata.uid`.
    pub uid: u64,
    /// What it holds.
    pub body: Body,
}

/// Why the server refused a request (409 or 404).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// 404.
    NotFound,
    /// 409 Conflict: a stale `resourceVersion`, or a delete's precondition that fails.
    Conflict,
    /// 409 AlreadyExists.
    AlreadyExists,
}

/// A delete's precondition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pre {
    /// None.
    None,
    /// The very version (`Precondition::unchanged`).
    Rv(u64),
    /// The same object, whatever its version.
    Uid(u64),
}

/// The API server's Leases.
#[derive(Debug, Default)]
pub struct Api {
    /// Leases by name.
    pub objs: BTreeMap<String, Obj>,
    next_rv: u64,
    next_uid: u64,
    /// The owner keys whose objects a person deleted or edited (one object per owner).
    pub touched: Vec<String>,
}

impl Api {
    fn rv(&mut self) -> u64 {
        self.next_rv += 1;
        self.next_rv
    }

    /// A create (POST).
    pub fn create(&mut self, name: &str, body: Body) -> Result<Obj, Refusal> {
        if self.objs.contains_key(name) {
            return Err(Refusal::AlreadyExists);
        }
        self.next_uid += 1;
        let obj = Obj {
            rv: self.rv(),
            uid: self.next_uid,
            body,
        };
        self.objs.insert(name.to_string(), obj.clone());
        Ok(obj)
    }

    /// An update (PUT) of the version `rv`.
    pub fn update(&mut self, name: &str, rv: u64, body: Body) -> Result<Obj, Refusal> {
        let next = self.next_rv + 1;
        let obj = self.objs.get_mut(name).ok_or(Refusal::NotFound)?;
        if obj.rv != rv {
            return Err(Refusal::Conflict);
        }
        self.next_rv = next;
        obj.rv = next;
        obj.body = body;
        Ok(obj.clone())
    }

    /// A delete on precondition `pre`; the object deleted.
    pub fn delete(&mut self, name: &str, pre: Pre) -> Result<Obj, Refusal> {
        let obj = self.objs.get(name).ok_or(Refusal::NotFound)?;
        let holds = match pre {
            Pre::None => true,
            Pre::Rv(rv) => obj.rv == rv,
            Pre::Uid(uid) => obj.uid == uid,
        };
        if !holds {
            return Err(Refusal::Conflict);
        }
        Ok(self.objs.remove(name).expect("just found"))
    }

    /// A get.
    pub fn get(&self, name: &str) -> Result<Obj, Refusal> {
        self.objs.get(name).cloned().ok_or(Refusal::NotFound)
    }

    /// A person edits `name` by hand: a new version holding `body`.
    pub fn edit(&mut self, name: &str, body: Body) {
        let rv = self.rv();
        if let Some(o) = self.objs.get_mut(name) {
            o.rv = rv;
            o.body = body;
        }
    }
}

/// What happens to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Applied at its moment, answered at its end.
    Answered,
    /// Nothing sent (the API down: no connection).
    Unreachable,
    /// 429 with this `Retry-After`, nothing applied.
    TooMany(Ms),
    /// No answer within the deadline; applied (at its moment) or not.
    Timeout { applies: bool },
    /// Applied, the answer lost.
    Lost,
}

impl World {
    /// The fate of a request of `verb` from `node` starting now: (fate, moment, end).
    fn api_fate(&mut self, node: usize, verb: Verb) -> (Fate, Ms, Ms) {
        let now = self.now;
        let (at, done) = self.op_timing_plain(node, now);
        let write = !verb.is_read();
        if let Some(end) = self.fault_end(node, now, FaultKind::Hang) {
            if self.rng.chance(400) {
                let t = now + self.rng.range(1, 50);
                return (Fate::Unreachable, t, t);
            }
            let answer = end + (done - now);
            let at = self.rng.range(end, answer);
            if answer <= now + REQUEST_DEADLINE {
                return (Fate::Answered, at, answer);
            }
            let applies = write && self.rng.chance(500);
            return (Fate::Timeout { applies }, at, now + REQUEST_DEADLINE);
        }
        // Writes shed (a quarter of the reads too): a renewal is refused while reads work.
        if self.fault_end(node, now, FaultKind::FailWrites).is_some()
            && (write || self.rng.chance(250))
        {
            let wait = self.rng.range(1, 3) * 1000;
            return (Fate::TooMany(wait), done, done);
        }
        if done > now + REQUEST_DEADLINE {
            // Slow past the deadline: the client gives up, the request goes on.
            return (Fate::Timeout { applies: true }, at, now + REQUEST_DEADLINE);
        }
        if write && self.fault_end(node, at, FaultKind::LostReply).is_some() {
            return (Fate::Lost, at, done);
        }
        (Fate::Answered, at, done)
    }

    /// When the fault `kind` that covers `node` at `t` ends, if one does.
    pub fn fault_end(&self, node: usize, t: Ms, kind: FaultKind) -> Option<Ms> {
        self.faults
            .iter()
            .filter(|f| {
                f.kind == kind && f.from <= t && t < f.to && f.node.is_none_or(|n| n == node)
            })
            .map(|f| f.to)
            .max()
    }
}

/// The client's error for `verb` on `name` of what happened.
fn error(verb: Verb, name: Option<&str>, what: Result<Refusal, Fate>) -> Error {
    let op = Op {
        verb,
        namespace: NAMESPACE.into(),
        name: name.map(str::to_string),
    };
    let status = |code: u16, reason: &str| {
        Box::new(Status {
            code,
            reason: reason.into(),
            message: String::new(),
            details: None,
        })
    };
    match what {
        Ok(Refusal::NotFound) => Error::NotFound {
            op,
            status: status(404, "NotFound"),
        },
        Ok(Refusal::Conflict) => Error::Conflict {
            op,
            status: status(409, "Conflict"),
        },
        Ok(Refusal::AlreadyExists) => Error::AlreadyExists {
            op,
            status: status(409, "AlreadyExists"),
        },
        Err(Fate::Unreachable) => Error::Connect {
            server: "https://10.0.0.1:443".into(),
            detail: "connection refused".into(),
            op,
        },
        Err(Fate::TooMany(ms)) => Error::TooManyRequests {
            retry_after: Some(Duration::from_millis(ms)),
            op,
            status: status(429, "TooManyRequests"),
        },
        Err(Fate::Timeout { .. }) => Error::Timeout {
            after: Duration::from_millis(REQUEST_DEADLINE),
            phase: "global".into(),
            op,
        },
        Err(Fate::Lost | Fate::Answered) => Error::AnswerLost {
            detail: "connection reset".into(),
            op,
        },
    }
}

/// One request of `verb` on `name` from `node`: `apply` is what the server does with it, at its
/// moment (if it gets there); the answer comes at its end.
pub async fn call<T: 'static>(
    sim: &Sim,
    node: usize,
    verb: Verb,
    name: Option<&str>,
    apply: impl FnOnce(&mut World) -> Result<T, Refusal> + 'static,
) -> Result<T, Error> {
    let (fate, at, done) = sim.with(|w| w.api_fate(node, verb));
    let applies = matches!(
        fate,
        Fate::Answered | Fate::Lost | Fate::Timeout { applies: true }
    );
    let slot: Rc<RefCell<Option<Result<T, Refusal>>>> = Rc::new(RefCell::new(None));
    if applies && at >= done && at > sim.now() {
        // At its very end (as `Sim::read` does: another wake-up of this task at that time may
        // come before a call scheduled then).
        sim.sleep_until(done).await;
        let r = sim.with(apply);
        if fate != Fate::Answered {
            return Err(error(verb, name, Err(fate)));
        }
        return r.map_err(|r| error(verb, name, Ok(r)));
    }
    if applies {
        let s2 = Rc::clone(&slot);
        let f = move |w: &mut World| *s2.borrow_mut() = Some(apply(w));
        if at <= sim.now() {
            sim.with(f);
        } else {
            sim.with(|w| w.at(at, super::world::Ev::Call(Box::new(f))));
        }
    }
    sim.sleep_until(done).await;
    if fate != Fate::Answered {
        return Err(error(verb, name, Err(fate)));
    }
    let answer = slot.borrow_mut().take();
    match answer.expect("applied before its answer") {
        Ok(v) => Ok(v),
        Err(r) => Err(error(verb, name, Ok(r))),
    }
}

/// [`call`] sent again as the real `RetryPolicy` says, within the store's budget
/// (`KubeStore::retried`).
pub async fn retried<T: 'static>(
    sim: &Sim,
    node: usize,
    verb: Verb,
    name: Option<&str>,
    apply: impl Fn(&mut World) -> Result<T, Refusal> + Clone + 'static,
) -> Result<T, Error> {
    let policy = RetryPolicy::default();
    let deadline = sim.now() + BUDGET;
    let mut failures = 0;
    loop {
        let e = match call(sim, node, verb, name, apply.clone()).await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        failures += 1;
        let jitter = sim.with(|w| w.rng.below(1000)) as f64 / 1000.0;
        let Some(wait) = policy.delay(failures, &e, jitter) else {
            return Err(e);
        };
        let wake = sim.now() + wait.as_millis() as Ms;
        if wake >= deadline {
            return Err(e);
        }
        sim.sleep_until(wake).await;
    }
}

//! The right to recover of the Lease store (src/locks/store/kube/recovery.rs) step by step: the
//! Lease `tfinit-recovery` taken with a create that fails when it exists; a Lease left by a
//! holder judged by the liveness rule (its `resourceVersion` watched unchanged, on the waiter's
//! own monotonic clock, for the `leaseDurationSeconds` its holder wrote; then deleted on the
//! precondition that it is still that version); renewed every TTL/3 by a thread of the holder
//! (`Spawn::Renewer`: a task of its own, which dies with the helper's process); the holder's
//! fence (`RecoveryLock::held`: 2/3 of its duration after the last renewal that landed was sent),
//! checked before each force-unlock; deleted (the same object) when the recovery ends.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tfinit::kube::{Error, Verb};

use super::api::{retried, Body, Pre, RECOVERY};
use super::exec::Sim;
use super::lease_store::once;
use super::world::{Ms, Spawn};

/// How often a waiter reads the Lease again (recovery.rs `POLL`).
const POLL: Duration = Duration::from_millis(500);

/// A helper's recovery Lease, while it holds it.
#[derive(Debug, Clone)]
pub struct Right {
    /// Its `holderIdentity`.
    pub holder: String,
    /// The duration it states, ms (whole seconds).
    pub ttl_ms: Ms,
    /// Its version as last written.
    pub rv: u64,
    /// Its uid.
    pub uid: u64,
    /// Until when it is surely the helper's (its node's monotonic clock): the very cell of the
    /// `RecoveryLock` the helper's `Store::lock_recovery` returned, which `held_at` reads.
    pub fence: Arc<Mutex<Instant>>,
    /// The recovery ended: the renewer stops.
    pub released: bool,
}

/// `leaseDurationSeconds` of `ttl`, in ms.
fn stated(ttl: Duration) -> Ms {
    (ttl.as_millis() as Ms).div_ceil(1000).max(1) * 1000
}

/// `recovery::fenced`: 2/3 of the duration.
fn fenced(ttl_ms: Ms) -> Duration {
    Duration::from_millis(ttl_ms * 2 / 3)
}

/// Node `node`'s clock now.
fn mono(sim: &Sim, node: usize) -> Instant {
    sim.with(|w| w.mono(node))
}

/// `recovery::take` for helper `h` (on `node`, incarnation key `me`, stating `ttl`), waiting up
/// to `wait` ms; false when it did not come (another recovery holds it, or no answer).
pub async fn take(sim: &Sim, h: usize, node: usize, me: &str, ttl: Duration, wait: Ms) -> bool {
    let deadline = mono(sim, node) + Duration::from_millis(wait);
    let tag = sim.with(|w| w.rng.next_u64() as u32);
    let holder = format!("{me}/recovery-{tag:08x}");
    let ttl_ms = stated(ttl);
    let mut seen: Option<(u64, Instant)> = None;
    // When the first create whose outcome is unknown was sent (recovery.rs `unknown_since`).
    let mut unknown_since: Option<Instant> = None;
    loop {
        let mine = Body::Recovery {
            holder: holder.clone(),
            ttl_ms,
        };
        // The hold counts from the sending (recovery.rs `sent`).
        let sent = mono(sim, node);
        let created = retried(sim, node, Verb::Create, Some(RECOVERY), move |w| {
            w.api.create(RECOVERY, mine.clone())
        })
        .await;
        let found = match created {
            Ok(o) => {
                let since = unknown_since.unwrap_or(sent);
                return hold(sim, h, holder, ttl_ms, since, o.rv, o.uid);
            }
            Err(
                e
                @ (Error::AlreadyExists { .. } | Error::AnswerLost { .. } | Error::Timeout { .. }),
            ) => {
                if !matches!(e, Error::AlreadyExists { .. }) {
                    unknown_since.get_or_insert(sent);
                }
                match retried(sim, node, Verb::Get, Some(RECOVERY), |w| {
                    w.api.get(RECOVERY)
                })
                .await
                {
                    Ok(o) => o,
                    Err(Error::NotFound { .. }) => continue,
                    Err(_) => return false,
                }
            }
            Err(_) => return false,
        };
        let (their, their_ttl) = match &found.body {
            Body::Recovery { holder, ttl_ms } => (holder.clone(), *ttl_ms),
            _ => (String::new(), 1000),
        };
        if their == holder {
            // Our own create, whose answer was lost: stored at the earliest when it was sent.
            let since = unknown_since.unwrap_or(sent);
            return hold(sim, h, holder, ttl_ms, since, found.rv, found.uid);
        }
        let now = mono(sim, node);
        match seen {
            Some((v, since)) if v == found.rv => {
                if now.saturating_duration_since(since) >= Duration::from_millis(their_ttl) {
                    sim.with(|w| {
                        w.log(|| format!("helper {h} takes the recovery Lease of {their}: unrenewed for its duration"))
                    });
                    let rv = found.rv;
                    let r = once(sim, node, Verb::Delete, move |w| {
                        w.api.delete(RECOVERY, Pre::Rv(rv))
                    })
                    .await;
                    match r {
                        Ok(_) | Err(Error::NotFound { .. } | Error::Conflict { .. }) => {}
                        Err(_) => return false,
                    }
                    seen = None;
                    continue;
                }
            }
            _ => seen = Some((found.rv, now)),
        }
        if now + POLL > deadline {
            return false;
        }
        let t = sim.with(|w| w.nodes[node].real_at(now + POLL));
        sim.sleep_until(t.max(sim.now() + 1)).await;
    }
}

/// The Lease (`holder`, stating `ttl_ms`, its create sent at `sent` or earlier) is helper `h`'s:
/// its fence from the sending, its renewer started.
fn hold(sim: &Sim, h: usize, holder: String, ttl_ms: Ms, sent: Instant, rv: u64, uid: u64) -> bool {
    sim.with(|w| {
        let fence = Arc::new(Mutex::new(sent + fenced(ttl_ms)));
        w.log(|| format!("helper {h} holds the recovery Lease as {holder}"));
        w.rights.insert(
            h,
            Right {
                holder,
                ttl_ms,
                rv,
                uid,
                fence,
                released: false,
            },
        );
        w.spawn(Spawn::Renewer(h), None);
    });
    true
}

/// The renewer thread of helper `h` (recovery.rs `renew`), until the recovery ends or the
/// helper's process dies.
pub async fn renewer(sim: std::rc::Rc<Sim>, h: usize) {
    let (node, ttl_ms) = sim.with(|w| (w.helpers[h].node, w.rights[&h].ttl_ms));
    let every = Duration::from_millis(ttl_ms / 3).max(Duration::from_millis(100));
    loop {
        let next = mono(&sim, node) + every;
        let t = sim.with(|w| w.nodes[node].real_at(next));
        sim.sleep_until(t).await;
        let Some(r) = sim.with(|w| w.rights.get(&h).filter(|r| !r.released).cloned()) else {
            return;
        };
        if !sim.with(|w| w.helpers[h].alive) {
            return;
        }
        let sent = mono(&sim, node);
        let body = Body::Recovery {
            holder: r.holder.clone(),
            ttl_ms,
        };
        let rv = r.rv;
        let updated = once(&sim, node, Verb::Update, move |w| {
            w.api.update(RECOVERY, rv, body)
        })
        .await;
        match updated {
            Ok(o) => sim.with(|w| {
                if let Some(r) = w.rights.get_mut(&h) {
                    r.rv = o.rv;
                    let mut fence = r.fence.lock().expect("one thread at a time");
                    *fence = (*fence).max(sent + fenced(ttl_ms));
                }
            }),
            Err(Error::Conflict { .. }) => {
                let got = once(&sim, node, Verb::Get, |w| w.api.get(RECOVERY)).await;
                let ours = |o: &super::api::Obj| matches!(&o.body, Body::Recovery { holder, .. } if *holder == r.holder);
                match got {
                    // Renewed by an update whose answer was lost: ours still.
                    Ok(o) if ours(&o) => sim.with(|w| {
                        if let Some(r) = w.rights.get_mut(&h) {
                            r.rv = o.rv;
                        }
                    }),
                    Ok(_) | Err(Error::NotFound { .. }) => {
                        sim.with(|w| {
                            let now = w.mono(node);
                            if let Some(r) = w.rights.get_mut(&h) {
                                *r.fence.lock().expect("one thread at a time") = now;
                            }
                            w.log(|| format!("helper {h}'s recovery Lease was taken by another"));
                        });
                        return;
                    }
                    Err(_) => {}
                }
            }
            Err(_) => {}
        }
    }
}

/// The recovery of helper `h` ended: the renewer stops, the Lease is deleted while it is still
/// the same object (`Held`'s drop).
pub async fn release(sim: &Sim, h: usize, node: usize) {
    let Some(uid) = sim.with(|w| {
        w.rights.get_mut(&h).map(|r| {
            r.released = true;
            r.uid
        })
    }) else {
        return;
    };
    let _ = once(sim, node, Verb::Delete, move |w| {
        w.api.delete(RECOVERY, Pre::Uid(uid))
    })
    .await;
    sim.with(|w| w.rights.remove(&h));
}

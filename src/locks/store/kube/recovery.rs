//! The right to recover in a namespace: the Lease [`RECOVERY_NAME`], taken with a create (which
//! fails when it exists), renewed every TTL/3 by a thread of the holder, deleted when the
//! recovery ends. Pods on different nodes share no directory to `flock` in; this is the file
//! store's `recover.lock` for them.
//!
//! A Lease left by a holder that died is judged by the liveness rule (src/locks/liveness.rs): the
//! waiter watches its `resourceVersion` on its own monotonic clock, and once it has not changed
//! for the `leaseDurationSeconds` its holder wrote, deletes it on the precondition that it is
//! still that very version (so a renewal that lands meanwhile wins) and creates its own. No
//! clock of another machine is read (`renewTime` is for people).

use std::io;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::kube::{Client, Error, Lease, Precondition, RetryPolicy};
use crate::locks::record::Owner;

use super::io_error::io_error;
use super::layout::{recovery_lease, RECOVERY_NAME};
use super::RecoveryLock;

/// How often a waiter reads the Lease again.
const POLL: Duration = Duration::from_millis(500);

/// Takes the recovery Lease of `client`'s namespace for `me` (stating `ttl`), waiting up to
/// `wait` for its holder to release it or to be watched dead; each request is sent again as
/// `retry` says for up to `budget`.
pub(super) fn take(
    client: &Arc<Client>,
    retry: RetryPolicy,
    budget: Duration,
    me: &Owner,
    ttl: Duration,
    wait: Duration,
) -> io::Result<RecoveryLock> {
    let deadline = Instant::now() + wait;
    let retried = |f: &dyn Fn() -> Result<Lease, Error>| retry.run(Instant::now() + budget, f);
    // Unique per attempt: a create whose answer was lost is recognised as ours when read back.
    let holder = format!("{}/recovery-{:08x}", me.key(), crate::sys::random_u32());
    let ttl_ms = ttl.as_millis() as u64;
    // The version of the Lease last seen, and when it was first seen (this process's clock).
    let mut seen: Option<(String, Instant)> = None;
    // When the first create whose outcome is unknown (its answer lost, or none in time) was
    // sent: if the Lease turns out ours, it may have been stored as early as that.
    let mut unknown_since: Option<Instant> = None;
    loop {
        let mine = recovery_lease(&holder, ttl_ms, None);
        // A waiter counts from when it first sees the Lease, which may be as soon as the server
        // stored it, long before its answer reaches us: the hold counts from the sending.
        let sent = Instant::now();
        let found = match retried(&|| client.create(&mine)) {
            Ok(l) => return Ok(hold(client, holder, ttl, l, unknown_since.unwrap_or(sent))),
            Err(
                e
                @ (Error::AlreadyExists { .. } | Error::AnswerLost { .. } | Error::Timeout { .. }),
            ) => {
                if !matches!(e, Error::AlreadyExists { .. }) {
                    unknown_since.get_or_insert(sent);
                }
                match retried(&|| client.get(RECOVERY_NAME)) {
                    Ok(l) => l,
                    Err(Error::NotFound { .. }) => continue,
                    Err(e) => return Err(io_error(e)),
                }
            }
            Err(e) => return Err(io_error(e)),
        };
        if found.spec.holder_identity.as_deref() == Some(holder.as_str()) {
            // Our own create, whose answer was lost: stored at the earliest when it was sent.
            let since = unknown_since.unwrap_or(sent);
            return Ok(hold(client, holder, ttl, found, since));
        }
        let version = found.metadata.resource_version.clone().unwrap_or_default();
        let stated = Duration::from_secs(
            found
                .spec
                .lease_duration_seconds
                .filter(|s| *s > 0)
                .unwrap_or(1) as u64,
        );
        match &seen {
            Some((v, since)) if *v == version => {
                if since.elapsed() >= stated {
                    tracing::warn!(
                        holder = found.spec.holder_identity.as_deref().unwrap_or(""),
                        unchanged_for = ?since.elapsed(),
                        "the recovery Lease was not renewed for the duration its holder stated: its recovery is over, taking it"
                    );
                    match client.delete(RECOVERY_NAME, Some(&Precondition::unchanged(&found))) {
                        Ok(()) | Err(Error::NotFound { .. } | Error::Conflict { .. }) => {}
                        Err(e) => return Err(io_error(e)),
                    }
                    seen = None;
                    continue;
                }
            }
            _ => seen = Some((version, Instant::now())),
        }
        if Instant::now() + POLL > deadline {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "another recovery holds Lease {}/{RECOVERY_NAME} (holder {}) and did not end within {wait:?}",
                    client.namespace(),
                    found.spec.holder_identity.as_deref().unwrap_or("unknown"),
                ),
            ));
        }
        thread::sleep(POLL);
    }
}

/// The held Lease, renewed by a thread until dropped, then deleted.
struct Held {
    stop: Option<mpsc::Sender<()>>,
    renewer: Option<thread::JoinHandle<()>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.renewer.take() {
            let _ = t.join();
        }
    }
}

/// Holds `lease`, created by a request sent at `sent` (or earlier).
fn hold(
    client: &Arc<Client>,
    holder: String,
    ttl: Duration,
    lease: Lease,
    sent: Instant,
) -> RecoveryLock {
    let client = Arc::clone(client);
    let every = (ttl / 3).max(Duration::from_millis(100));
    let ttl_ms = ttl.as_millis() as u64;
    // Sure for 2/3 of the duration after the create was sent, not after its answer came: a
    // waiter may have first seen the Lease as soon as it was stored.
    let fence = Arc::new(Mutex::new(sent + fenced(ttl)));
    let (stop, stopped) = mpsc::channel::<()>();
    let renewed = Arc::clone(&fence);
    let renewer = thread::Builder::new()
        .name("tfinit-recovery-lease".into())
        .spawn(move || renew(&client, &holder, ttl_ms, lease, every, &stopped, &renewed))
        .ok();
    RecoveryLock {
        _held: Box::new(Held {
            stop: Some(stop),
            renewer,
        }),
        fence: Some(fence),
    }
}

/// How long after a renewal was sent the Lease is surely still ours: 2/3 of its duration, as
/// the owner's fence counts its heartbeat.
fn fenced(ttl: Duration) -> Duration {
    ttl * 2 / 3
}

/// Renews `lease` every `every` until `stopped` ends, then deletes it (only while it is still
/// ours: the same object, whoever renewed it last).
fn renew(
    client: &Client,
    holder: &str,
    ttl_ms: u64,
    mut lease: Lease,
    every: Duration,
    stopped: &mpsc::Receiver<()>,
    fence: &Mutex<Instant>,
) {
    let ttl = Duration::from_millis(ttl_ms);
    let renewed = |sent: Instant| {
        if let Ok(mut until) = fence.lock() {
            *until = (*until).max(sent + fenced(ttl));
        }
    };
    while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
        let sent = Instant::now();
        match client.update(&recovery_lease(holder, ttl_ms, Some(&lease))) {
            Ok(l) => {
                lease = l;
                renewed(sent);
            }
            Err(Error::Conflict { .. }) => match client.get(RECOVERY_NAME) {
                // Renewed by an update whose answer was lost: ours still, renewed then at best.
                Ok(l) if l.spec.holder_identity.as_deref() == Some(holder) => lease = l,
                Ok(_) | Err(Error::NotFound { .. }) => {
                    if let Ok(mut until) = fence.lock() {
                        *until = Instant::now();
                    }
                    tracing::warn!(
                        "the recovery Lease was taken by another pod while this recovery ran (it was not renewed in time)"
                    );
                    return;
                }
                Err(e) => tracing::warn!(error = %e, "cannot renew the recovery Lease"),
            },
            Err(e) => tracing::warn!(error = %e, "cannot renew the recovery Lease"),
        }
    }
    let same = Precondition {
        uid: lease.metadata.uid.clone(),
        resource_version: None,
    };
    match client.delete(RECOVERY_NAME, Some(&same)) {
        Ok(()) | Err(Error::NotFound { .. } | Error::Conflict { .. }) => {}
        Err(e) => tracing::warn!(
            error = %e,
            "cannot delete the recovery Lease: the next recovery takes it once it has watched it unrenewed for its duration"
        ),
    }
}

//! [`KubeStore`]: records and heartbeats as Leases of the pod's namespace, through the API server
//! (issue 24), for pods that share no volume. Objects, names and sizes: `layout.rs`; the right to
//! recover: `recovery.rs`. A record's id is the Lease's namespace and name
//! ([`RecordId::lease`]).
//!
//! Every call blocks for as long as the API server takes, within the client's deadlines and a
//! retry budget ([`KubeStore::with_budget`]): only the recorder thread and helper processes call
//! it, never the PID-1 loop. What each answer does:
//!
//! | answer | what the store does |
//! |---|---|
//! | 429, 5xx, no connection | sent again after a backoff with jitter, at least `Retry-After`, within the budget ([`RetryPolicy`]) |
//! | 401 | the client reads the token again and sends once more; a second 401 is the error |
//! | 403 | the error, naming the Role rule that allows it ([`crate::kube::ROLE_RULE`]) |
//! | 404 of the namespace | the error, naming the namespace |
//! | 409 on a write (the Lease changed, or exists) | the Lease is read again and the change applied to it: never dropped |
//! | a write whose answer is lost or late | the Lease is read again and the change applied to it (a repeat of the same content is harmless) |
//! | a record Lease whose record cannot be read | set aside: relabelled `tfinit.dev/kind=corrupt`, kept for a person |
//!
//! The kernel's proof (an incarnation's lock file) is the file store's alone: [`KubeStore`] has
//! none, so its owners are judged by their heartbeats only.

mod io_error;
mod layout;
mod recovery;

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::kube::{Client, Error, Lease, Precondition, RetryPolicy};
use crate::locks::record::{age, Found, Heartbeat, Owner, Record};
use io_error::io_error;

use super::{Aside, Change, RecordId, RecoveryLock, Store};

pub use io_error::io_error as io_error_of;
pub use layout::{
    heartbeat_name, record_name, Kind, MAX_ANNOTATIONS, RECORD_LIST_BUDGET, RECOVERY_NAME,
};

/// How long one store call may keep retrying by default: about the client-go renewal deadline.
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(10);

/// Most requests of one batch in flight at once ([`Store::apply`]).
const IN_FLIGHT: usize = 16;

/// The store in the Leases of one namespace.
pub struct KubeStore {
    client: Arc<Client>,
    retry: RetryPolicy,
    budget: Duration,
    /// Who holds this store's recovery Lease when it takes it, and for how long it says it lives.
    holder: Owner,
    ttl: Duration,
    /// The Lease of each name as last written or read: the base of its next update (with its
    /// `resourceVersion`), so a write is one request unless another writer came between.
    known: Mutex<HashMap<String, Lease>>,
}

impl KubeStore {
    /// A store over `client`, for incarnation `me` with TTL `ttl` (what its recovery Lease
    /// states), retrying each call for up to [`DEFAULT_BUDGET`].
    pub fn new(client: Client, me: &Owner, ttl: Duration) -> KubeStore {
        KubeStore {
            client: Arc::new(client),
            retry: RetryPolicy::default(),
            budget: DEFAULT_BUDGET,
            holder: me.clone(),
            ttl,
            known: Mutex::new(HashMap::new()),
        }
    }

    /// The same store retrying each call with `retry` for up to `budget`.
    pub fn with_budget(mut self, retry: RetryPolicy, budget: Duration) -> KubeStore {
        self.retry = retry;
        self.budget = budget;
        self
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        self.client.namespace()
    }

    /// `f` sent again as the retry policy says, within the budget.
    fn retried<T>(&self, f: impl FnMut() -> Result<T, Error>) -> Result<T, Error> {
        self.retry.run(Instant::now() + self.budget, f)
    }

    fn remember(&self, lease: &Lease) {
        if let Ok(mut k) = self.known.lock() {
            k.insert(lease.metadata.name.clone(), lease.clone());
        }
    }

    fn forget(&self, name: &str) {
        if let Ok(mut k) = self.known.lock() {
            k.remove(name);
        }
    }

    fn known(&self, name: &str) -> Option<Lease> {
        self.known.lock().ok()?.get(name).cloned()
    }

    /// Reads `name` (None when it does not exist).
    fn get(&self, name: &str) -> Result<Option<Lease>, Error> {
        match self.retried(|| self.client.get(name)) {
            Ok(l) => {
                self.remember(&l);
                Ok(Some(l))
            }
            Err(Error::NotFound { .. }) => {
                self.forget(name);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Writes the Lease `name` as `make` makes it from the Lease as it is (None: it does not
    /// exist): an update of the Lease as last known, or a create. A conflict (the Lease changed,
    /// or exists), a Lease gone, and an answer lost or late are each resolved by reading the
    /// Lease again and applying `make` to it: the change is never dropped, and applying it
    /// twice is harmless.
    fn put(&self, name: &str, make: impl Fn(Option<&Lease>) -> Lease) -> Result<Lease, Error> {
        /// Reads again and re-applies at most this often: each round means another writer won
        /// the race, which a live pod's own Leases see rarely.
        const ROUNDS: u32 = 5;
        let mut base = self.known(name);
        let mut last = None;
        for _ in 0..ROUNDS {
            let written = match &base {
                Some(b) => self.retried(|| self.client.update(&make(Some(b)))),
                None => self.retried(|| self.client.create(&make(None))),
            };
            match written {
                Ok(l) => {
                    self.remember(&l);
                    return Ok(l);
                }
                Err(
                    e @ (Error::Conflict { .. }
                    | Error::AlreadyExists { .. }
                    | Error::NotFound { .. }
                    | Error::AnswerLost { .. }
                    | Error::Timeout { .. }),
                ) => {
                    tracing::debug!(error = %e, "reading the Lease again to apply the change to it");
                    last = Some(e);
                    base = self.get(name)?;
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.expect("a round ended in an error"))
    }

    /// The Leases of `selector`, readable or not, by name.
    fn list_leases(&self, selector: &str) -> Result<crate::kube::LeaseList, Error> {
        let mut list = self.retried(|| self.client.list(selector))?;
        list.items
            .sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Ok(list)
    }

    /// The Lease name of `id`, or the error of an id that names no Lease of this namespace.
    fn name_of<'a>(&self, id: &'a RecordId) -> io::Result<&'a str> {
        id.as_lease_in(self.namespace()).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{id} is not a record of the Leases of namespace {}",
                    self.namespace()
                ),
            )
        })
    }

    /// Every heartbeat of `selector`'s Leases (unreadable ones skipped).
    fn beats(&self, selector: &str) -> io::Result<Vec<Heartbeat>> {
        let list = self.list_leases(selector).map_err(io_error)?;
        Ok(list.items.iter().filter_map(layout::heartbeat_of).collect())
    }
}

impl Store for KubeStore {
    fn location(&self) -> String {
        format!(
            "the Leases of namespace {} at {}",
            self.namespace(),
            self.client.server()
        )
    }

    /// Proves the Leases of the namespace listable (403 names the Role rule). Writing is proven
    /// by the first heartbeat, which creates its Lease (404 of the namespace shows there). There
    /// are no temporary objects to remove.
    fn open(&self, _stale_temp: Duration) -> io::Result<()> {
        self.list_leases(&layout::selector(Kind::Heartbeat))
            .map(|_| ())
            .map_err(io_error)
    }

    fn list(&self) -> Vec<Found> {
        let ns = self.namespace().to_string();
        let list = match self.list_leases(&layout::selector(Kind::Record)) {
            Ok(l) => l,
            Err(e) => return vec![Found::Unlisted(e.to_string())],
        };
        let mut out: Vec<Found> = list
            .items
            .iter()
            .map(|l| layout::found_of(&ns, l))
            .collect();
        out.extend(
            list.unreadable
                .iter()
                .map(|u| layout::unreadable_item(&ns, u.name.as_deref(), &u.detail)),
        );
        for l in list.items {
            self.remember(&l);
        }
        out
    }

    fn read(&self, id: &RecordId) -> io::Result<Record> {
        let name = self.name_of(id)?;
        let lease = self
            .get(name)
            .map_err(io_error)?
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{id} is gone")))?;
        match layout::found_of(self.namespace(), &lease) {
            Found::Record(_, r) => Ok(*r),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{id} is not a lock-owner record"),
            )),
        }
    }

    fn write(&self, record: &Record) -> io::Result<RecordId> {
        let name = layout::record_name(record);
        // Refused here, with the reason, rather than written for every reader to find corrupt.
        layout::record_lease(record, None).map_err(|problem| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "lock-owner record {} not written, it would not read back: {problem}",
                    RecordId::lease(self.namespace(), &name)
                ),
            )
        })?;
        self.put(&name, |base| {
            layout::record_lease(record, base).expect("it fitted without a base")
        })
        .map_err(io_error)?;
        Ok(RecordId::lease(self.namespace(), &name))
    }

    /// A batch's requests in flight together, one thread each (at most [`IN_FLIGHT`] at a time):
    /// a record is a Lease of its own, so a batch of 16 takes about one request's time, not 16
    /// (ureq keeps a connection per request in flight). Each change is retried and re-applied
    /// on a conflict as a single write is.
    fn apply(&self, changes: &[Change]) -> Vec<io::Result<RecordId>> {
        let one = |c: &Change| self.apply_one(c);
        if changes.len() <= 1 {
            return changes.iter().map(one).collect();
        }
        let mut out = Vec::with_capacity(changes.len());
        for chunk in changes.chunks(IN_FLIGHT) {
            std::thread::scope(|s| {
                let threads: Vec<_> = chunk
                    .iter()
                    .map(|c| {
                        let spawned = std::thread::Builder::new()
                            .name("tfinit-lease".into())
                            .spawn_scoped(s, move || one(c));
                        // No thread (a limit reached): this change in this thread instead.
                        spawned.map_err(|_| c)
                    })
                    .collect();
                out.extend(threads.into_iter().map(|t| match t {
                    Ok(t) => {
                        t.join().unwrap_or_else(|_| {
                            Err(io::Error::other("the request's thread panicked"))
                        })
                    }
                    Err(c) => one(c),
                }));
            });
        }
        out
    }

    fn remove(&self, id: &RecordId) -> io::Result<()> {
        let name = self.name_of(id)?;
        match self.retried(|| self.client.delete(name, None)) {
            Ok(()) | Err(Error::NotFound { .. }) => {
                self.forget(name);
                Ok(())
            }
            Err(e) => Err(io_error(e)),
        }
    }

    /// Relabels the record's Lease (`tfinit.dev/kind=corrupt` or `manual`, the reason in
    /// `tfinit.dev/aside`) so no list of records finds it again; its id stays. Only the Lease
    /// as read is set aside: one changed since (its owner rewrote it) is a conflict, and is
    /// judged again by the next reader.
    fn set_aside(&self, id: &RecordId, why: &Aside) -> io::Result<RecordId> {
        let name = self.name_of(id)?;
        let lease = self
            .get(name)
            .map_err(io_error)?
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{id} is gone")))?;
        let aside = layout::aside(&lease, why);
        let l = self
            .retried(|| self.client.update(&aside))
            .map_err(io_error)?;
        self.remember(&l);
        Ok(id.clone())
    }

    /// A Lease that does not exist, or holds no heartbeat of `owner` (edited by hand: its owner's
    /// next beat rewrites it), is an answer (None); an API that did not answer, or refused, is
    /// the error.
    fn read_heartbeat(&self, owner: &Owner) -> io::Result<Option<Heartbeat>> {
        let lease = self.get(&layout::heartbeat_name(owner)).map_err(io_error)?;
        Ok(lease
            .as_ref()
            .and_then(layout::heartbeat_of)
            .filter(|hb| hb.owner.same_incarnation(owner)))
    }

    fn heartbeats_named(&self, name: &str) -> io::Result<Vec<Heartbeat>> {
        let mut out: Vec<Heartbeat> = self
            .beats(&layout::selector_named(name))?
            .into_iter()
            .filter(|hb| hb.owner.name == name)
            .collect();
        out.sort_by_key(|hb| hb.owner.incarnation());
        Ok(out)
    }

    fn heartbeats(&self) -> io::Result<Vec<Heartbeat>> {
        self.beats(&layout::selector(Kind::Heartbeat))
    }

    fn write_heartbeat(&self, hb: &Heartbeat) -> io::Result<()> {
        let name = layout::heartbeat_name(&hb.owner);
        self.put(&name, |base| layout::heartbeat_lease(hb, base))
            .map(|_| ())
            .map_err(io_error)
    }

    /// Deletes the heartbeat Leases of incarnations with no record in `records` whose heartbeat
    /// was last written longer than `older_than` ago, each only as read (a precondition on its
    /// `resourceVersion`: one renewed since stays). No kernel proves a Lease's writer gone:
    /// `listed_all` changes nothing here.
    fn prune_heartbeats(&self, records: &[Record], me: &Owner, older_than: Duration, _: bool) {
        let Ok(list) = self.list_leases(&layout::selector(Kind::Heartbeat)) else {
            return;
        };
        for lease in list.items {
            let Some(hb) = layout::heartbeat_of(&lease) else {
                continue;
            };
            let has_record = records.iter().any(|r| r.owner.same_incarnation(&hb.owner));
            if hb.owner.same_incarnation(me) || has_record || age(hb.updated_ms) <= older_than {
                continue;
            }
            let name = &lease.metadata.name;
            match self
                .client
                .delete(name, Some(&Precondition::unchanged(&lease)))
            {
                Ok(()) | Err(Error::NotFound { .. }) => self.forget(name),
                Err(e) => tracing::debug!(error = %e, "stale heartbeat Lease not removed"),
            }
        }
    }

    fn lock_recovery(&self, wait: Duration) -> io::Result<RecoveryLock> {
        recovery::take(
            &self.client,
            self.retry,
            self.budget,
            &self.holder,
            self.ttl,
            wait,
        )
    }
}

//! Which store records go to (TFINIT_STORE), decided where the store is first opened: on the
//! recorder thread or in a helper process, never on the PID-1 loop.
//!
//! | TFINIT_STORE | in-cluster configuration | first answer to a list of Leases | records go to |
//! |---|---|---|---|
//! | `file` | (not read) | (none sent) | TFINIT_STATE_DIR |
//! | `auto` (default) | missing (not in a pod, no token) | (none sent) | TFINIT_STATE_DIR, one line saying why and the Role rule |
//! | `auto` | a kubelet variable overridden (a host name, a bad port) | (none sent) | TFINIT_STATE_DIR, one warning saying why |
//! | `auto` | there | 200 | the Leases of the namespace |
//! | `auto` | there | 401, 403 | TFINIT_STATE_DIR, one line saying why and the Role rule |
//! | `auto` | there | none (down, hung, 5xx, 429) | nowhere yet: the store has not answered (the `Unseen` rule), asked again at the next open |
//! | `kubernetes` | missing | (none sent) | nowhere: every open fails, saying why |
//! | `kubernetes` | there | any | the Leases of the namespace (an error is the store's error) |
//!
//! With the Leases chosen, TFINIT_STATE_DIR, where it is a usable directory, is read too: a pod
//! whose predecessor wrote files (an upgrade, a changed setting) still finds their records, and
//! the incarnation's lock file stays there so the kernel's proof keeps the container-restart
//! fast path. New records and heartbeats go to the Leases only.

use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::config::StoreSetting;
use crate::kube::{Client, Config, ConfigError, Deadlines, ROLE_RULE};
use crate::locks::record::{FileId, Found, Heartbeat, Owner, Record};

use super::{Aside, Change, FileStore, KubeStore, RecordId, RecoveryLock, Store};

/// The store for `setting`: files in `state_dir`, Leases of the pod's namespace for incarnation
/// `me` (stating `ttl`), or the choice between them made at the first call. Reads the in-cluster
/// configuration's files (small, local) but sends nothing.
pub fn chosen(
    setting: StoreSetting,
    state_dir: &Path,
    me: &Owner,
    ttl: Duration,
) -> Box<dyn Store> {
    if setting == StoreSetting::File {
        return Box::new(FileStore::new(state_dir));
    }
    let api = match Config::in_cluster() {
        Ok(config) => Ok(KubeStore::new(
            Client::new(config, Deadlines::default()),
            me,
            ttl,
        )),
        // The kubelet sets both variables right in every pod: a value it never writes is an
        // override gone wrong, a warning, not the quiet "not in a pod" of the files' line.
        Err(e @ (ConfigError::NotAnIp { .. } | ConfigError::InvalidPort { .. }))
            if setting == StoreSetting::Auto =>
        {
            tracing::warn!(state_dir = %state_dir.display(), "{}", files_instead(&e.to_string()));
            return Box::new(FileStore::new(state_dir));
        }
        Err(e) => Err(e.to_string()),
    };
    chosen_with(setting, state_dir, api)
}

/// The line that says records go to TFINIT_STATE_DIR with `auto`, and `why`.
fn files_instead(why: &str) -> String {
    format!(
        "lock-owner records go to TFINIT_STATE_DIR: {why}. In a pod whose service account may list \
         Leases in its namespace (a Role with the rule {ROLE_RULE}, bound by a RoleBinding), they \
         go to the Kubernetes API and need no volume"
    )
}

/// [`chosen`] with the Kubernetes store given (`api`), or why there is none.
pub fn chosen_with(
    setting: StoreSetting,
    state_dir: &Path,
    api: Result<KubeStore, String>,
) -> Box<dyn Store> {
    let file = FileStore::new(state_dir);
    let choice = match (setting, api) {
        (StoreSetting::File, _) => return Box::new(file),
        (StoreSetting::Kubernetes, Ok(kube)) => Choice::Kube(kube),
        (StoreSetting::Kubernetes, Err(e)) => Choice::Unusable(format!(
            "TFINIT_STORE=kubernetes, but the Kubernetes API cannot be found: {e}"
        )),
        (StoreSetting::Auto, Ok(kube)) => Choice::Undecided(kube, None),
        (StoreSetting::Auto, Err(e)) => {
            tracing::info!(state_dir = %state_dir.display(), "{}", files_instead(&e));
            return Box::new(file);
        }
    };
    Box::new(Chosen {
        file,
        choice: Mutex::new(choice),
    })
}

/// The store TFINIT_STORE chose, or is choosing.
struct Chosen {
    file: FileStore,
    choice: Mutex<Choice>,
}

enum Choice {
    /// `auto`, and the API has not answered yet; the last probe that got no answer: when it
    /// ended, and its error.
    Undecided(KubeStore, Option<(Instant, String)>),
    /// The Leases; the files too, for reading, when the state directory opened.
    Kube(KubeStore),
    /// Files only (`auto`, and the API refused the service account).
    File,
    /// `kubernetes`, and there is no API to use: why.
    Unusable(String),
}

/// What a call goes to.
enum Target<'a> {
    Kube(&'a KubeStore, Option<&'a FileStore>),
    File(&'a FileStore),
    /// No store to write to: why (`kubernetes` with no API to use: nothing of it can be read
    /// from this pod either).
    None(String),
    /// `auto`, and the API has not answered yet: why. Its records are unknown, not absent.
    Unanswered(String),
}

impl Chosen {
    fn with<T>(&self, f: impl FnOnce(Target<'_>) -> T) -> T {
        let mut choice = match self.choice.lock() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        };
        // A helper process reads without opening: it decides at its first call.
        let unanswered = decide(&mut choice, &self.file).err();
        match &*choice {
            Choice::Kube(k) => f(Target::Kube(k, self.file_readable().then_some(&self.file))),
            Choice::File => f(Target::File(&self.file)),
            Choice::Undecided(..) => f(Target::Unanswered(match unanswered {
                Some(e) => format!("the Kubernetes API has not answered yet: {e}"),
                None => "the Kubernetes API has not answered yet".into(),
            })),
            Choice::Unusable(why) => f(Target::None(why.clone())),
        }
    }

    /// Whether the state directory holds tfinit's directories (it opened, now or before).
    fn file_readable(&self) -> bool {
        self.file.dir().join("records").is_dir()
    }
}

/// Decides an `auto` store (`choice`) on the API's first answer; the error of an API that did
/// not answer (the choice stays open).
fn decide(choice: &mut Choice, file: &FileStore) -> io::Result<()> {
    let Choice::Undecided(kube, last) = choice else {
        return Ok(());
    };
    // Each probe may take the client's whole budget (10 s) of a thread: the calls that follow a
    // probe with no answer (the opening's listing, a helper's reads) take its answer instead of
    // sending again, for a while.
    if let Some((at, e)) = last.as_ref().filter(|(at, _)| at.elapsed() < PROBE_EVERY) {
        return Err(none(format!(
            "{e} (asked {:.1}s ago)",
            at.elapsed().as_secs_f64()
        )));
    }
    match kube.open(Duration::ZERO) {
        Ok(()) => {
            tracing::info!(store = %kube.location(), "lock-owner records go to the Kubernetes API");
            if let Choice::Undecided(kube, _) = std::mem::replace(choice, Choice::File) {
                *choice = Choice::Kube(kube);
            }
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            tracing::warn!(
                state_dir = %file.dir().display(),
                "lock-owner records go to TFINIT_STATE_DIR: the Kubernetes API refused this pod's service account ({e}). A Role in the pod's namespace with the rule {ROLE_RULE}, bound to the service account by a RoleBinding, lets them go to the API with no volume"
            );
            *choice = Choice::File;
            Ok(())
        }
        // Down, hung, shedding load: a store that has not answered yet, as a hung volume.
        Err(e) => {
            *last = Some((Instant::now(), e.to_string()));
            Err(e)
        }
    }
}

/// How long the answer of a probe that got none stands for the API's (the recorder tries the
/// opening again every TTL/3, so a probe goes out at least that often).
const PROBE_EVERY: Duration = Duration::from_secs(2);

fn none(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, why)
}

impl Store for Chosen {
    fn location(&self) -> String {
        self.with(|t| match t {
            Target::Kube(k, _) => k.location(),
            Target::File(f) => f.location(),
            Target::None(why) | Target::Unanswered(why) => format!("no store yet ({why})"),
        })
    }

    fn open(&self, stale_temp: Duration) -> io::Result<()> {
        self.with(|t| match t {
            Target::Kube(k, _) => {
                k.open(stale_temp)?;
                // Read too where usable; a pod without the volume has none, which is fine.
                if let Err(e) = self.file.open(stale_temp) {
                    tracing::debug!(state_dir = %self.file.dir().display(), error = %e, "TFINIT_STATE_DIR is not read beside the Kubernetes API");
                }
                Ok(())
            }
            Target::File(f) => f.open(stale_temp),
            Target::None(why) | Target::Unanswered(why) => Err(none(why)),
        })
    }

    fn list(&self) -> Vec<Found> {
        self.with(|t| match t {
            Target::Kube(k, f) => {
                let mut all = k.list();
                all.extend(f.map(FileStore::list).unwrap_or_default());
                all
            }
            Target::File(f) => f.list(),
            // Which records the store holds is unknown while it has not answered: not "none".
            Target::Unanswered(why) => vec![Found::Unlisted(why)],
            Target::None(_) => Vec::new(),
        })
    }

    fn read(&self, id: &RecordId) -> io::Result<Record> {
        self.with(|t| match t {
            Target::Kube(k, _) if !id.in_files() => k.read(id),
            Target::Kube(_, _) | Target::File(_) => self.file.read(id),
            Target::None(why) | Target::Unanswered(why) => Err(none(why)),
        })
    }

    fn write(&self, record: &Record) -> io::Result<RecordId> {
        self.with(|t| match t {
            // A record of the files (a predecessor's, marked by a recovery) is rewritten there.
            Target::Kube(_, Some(f)) if f.holds(record) => f.write(record),
            Target::Kube(k, _) => k.write(record),
            Target::File(f) => f.write(record),
            Target::None(why) | Target::Unanswered(why) => Err(none(why)),
        })
    }

    fn apply(&self, changes: &[Change]) -> Vec<io::Result<RecordId>> {
        self.with(|t| match t {
            // A batch is the recorder's, of this incarnation's own records: the API's. A record
            // in the files (a predecessor's) is marked or removed by a recovery through `write`
            // and `remove`, which find it there.
            Target::Kube(k, _) => k.apply(changes),
            Target::File(f) => f.apply(changes),
            Target::None(why) | Target::Unanswered(why) => {
                changes.iter().map(|_| Err(none(why.clone()))).collect()
            }
        })
    }

    fn remove(&self, id: &RecordId) -> io::Result<()> {
        self.with(|t| match t {
            Target::Kube(k, _) if !id.in_files() => k.remove(id),
            Target::Kube(_, _) | Target::File(_) => self.file.remove(id),
            Target::None(why) | Target::Unanswered(why) => Err(none(why)),
        })
    }

    fn set_aside(&self, id: &RecordId, why: &Aside) -> io::Result<RecordId> {
        self.with(|t| match t {
            Target::Kube(k, _) if !id.in_files() => k.set_aside(id, why),
            Target::Kube(_, _) | Target::File(_) => self.file.set_aside(id, why),
            Target::None(text) | Target::Unanswered(text) => Err(none(text)),
        })
    }

    /// With the Leases chosen, a heartbeat the API has not is looked for in the files (a
    /// predecessor's); the API's error is the answer's, whatever the files hold.
    fn read_heartbeat(&self, owner: &Owner) -> io::Result<Option<Heartbeat>> {
        self.with(|t| match t {
            Target::Kube(k, f) => match k.read_heartbeat(owner)? {
                Some(hb) => Ok(Some(hb)),
                None => f.map_or(Ok(None), |f| f.read_heartbeat(owner)),
            },
            Target::File(f) => f.read_heartbeat(owner),
            Target::None(why) | Target::Unanswered(why) => Err(none(why)),
        })
    }

    fn heartbeats_named(&self, name: &str) -> io::Result<Vec<Heartbeat>> {
        self.with(|t| match t {
            Target::Kube(k, f) => {
                let mut all = k.heartbeats_named(name)?;
                all.extend(
                    f.map(|f| f.heartbeats_named(name))
                        .transpose()?
                        .unwrap_or_default(),
                );
                Ok(all)
            }
            Target::File(f) => f.heartbeats_named(name),
            Target::None(why) | Target::Unanswered(why) => Err(none(why)),
        })
    }

    fn heartbeats(&self) -> io::Result<Vec<Heartbeat>> {
        self.with(|t| match t {
            Target::Kube(k, f) => {
                let mut all = k.heartbeats()?;
                all.extend(
                    f.map(FileStore::heartbeats)
                        .transpose()?
                        .unwrap_or_default(),
                );
                Ok(all)
            }
            Target::File(f) => f.heartbeats(),
            Target::None(why) | Target::Unanswered(why) => Err(none(why)),
        })
    }

    fn write_heartbeat(&self, hb: &Heartbeat) -> io::Result<()> {
        self.with(|t| match t {
            Target::Kube(k, _) => k.write_heartbeat(hb),
            Target::File(f) => f.write_heartbeat(hb),
            Target::None(why) | Target::Unanswered(why) => Err(none(why)),
        })
    }

    fn prune_heartbeats(
        &self,
        records: &[Record],
        me: &Owner,
        older_than: Duration,
        listed_all: bool,
    ) {
        self.with(|t| match t {
            Target::Kube(k, f) => {
                k.prune_heartbeats(records, me, older_than, listed_all);
                if let Some(f) = f {
                    f.prune_heartbeats(records, me, older_than, listed_all);
                }
            }
            Target::File(f) => f.prune_heartbeats(records, me, older_than, listed_all),
            Target::None(_) | Target::Unanswered(_) => {}
        })
    }

    fn hold_incarnation_lock(&self, me: &Owner) -> io::Result<Option<(OwnedFd, FileId)>> {
        self.with(|t| match t {
            Target::Kube(_, Some(f)) | Target::File(f) => f.hold_incarnation_lock(me),
            Target::Kube(_, None) | Target::None(_) | Target::Unanswered(_) => Ok(None),
        })
    }

    fn incarnation_gone(&self, owner: &Owner, file: FileId) -> Option<bool> {
        self.with(|t| match t {
            Target::Kube(_, Some(f)) | Target::File(f) => f.incarnation_gone(owner, file),
            Target::Kube(_, None) | Target::None(_) | Target::Unanswered(_) => None,
        })
    }

    fn lock_recovery(&self, wait: Duration) -> io::Result<RecoveryLock> {
        self.with(|t| match t {
            Target::Kube(k, f) => {
                let api = k.lock_recovery(wait)?;
                let files = f.map(|f| f.lock_recovery(wait)).transpose()?;
                let fence = api.fence.clone();
                Ok(RecoveryLock {
                    _held: Box::new((api, files)),
                    fence,
                })
            }
            Target::File(f) => f.lock_recovery(wait),
            Target::None(why) | Target::Unanswered(why) => Err(none(why)),
        })
    }
}

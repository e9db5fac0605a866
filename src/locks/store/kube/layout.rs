//! The Kubernetes store's objects: what each Lease is named, labelled and holds, and how a Lease
//! read back becomes a record or a heartbeat. Pure functions: the requests are `mod.rs`'s.
//!
//! | object | name | `tfinit.dev/kind` | holds |
//! |---|---|---|---|
//! | an incarnation's heartbeat | `OWNER-tfinit-INCARNATION` | `heartbeat` | `holderIdentity` (the incarnation's key), `leaseDurationSeconds` (its TTL), `renewTime` (every beat), the [`Heartbeat`] as JSON in `tfinit.dev/heartbeat` |
//! | one record | `OWNER-tfinit-INCARNATION-RUN` | `record` | the [`Record`] as JSON in `tfinit.dev/record` |
//! | a record set aside | (unchanged) | `corrupt` or `manual` | its text as found, and why in `tfinit.dev/aside` |
//! | the right to recover | [`RECOVERY_NAME`] | `recovery` | `holderIdentity`, `leaseDurationSeconds`, `renewTime` |
//!
//! Every Lease carries `app.kubernetes.io/managed-by=tfinit` (what a pod lists) and, but the
//! recovery Lease, `tfinit.dev/owner` (the owner name, or its hash when it is no label value).
//! Names come from [`lease_name`]: `POD-SUFFIX` when that is a DNS subdomain, else hashed, so any
//! owner name makes a valid name of at most 253 characters. No Lease has an `ownerReference`: the
//! garbage collector would delete a dead pod's records exactly when they are needed.
//!
//! Sizes: the API takes at most 256 KiB of annotations per object ([`MAX_ANNOTATIONS`], keys and
//! values). One object per record, and a record's `argv` and `in_progress` each capped at
//! [`RECORD_LIST_BUDGET`] (96 KiB) instead of the file store's 128 KiB: 192 KiB of lists and the
//! rest of a record (paths, names: a few KiB) fit with room to spare. A record that would still
//! not fit (paths of tens of KiB) is refused with the reason, as the file store refuses one over
//! its read limit.

use std::collections::BTreeMap;

use super::{Aside, RecordId};
use crate::kube::{label_value, lease_name, Lease, MicroTime};
use crate::locks::record::{
    parse_record, Found, Heartbeat, Owner, Record, Unread, HEARTBEAT_FORMAT,
};

/// The label every tfinit Lease carries, and its value.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "tfinit");
/// The label that says what a Lease is ([`Kind`]).
pub const KIND: &str = "tfinit.dev/kind";
/// The label of the owner name (or its hash): `heartbeats_named` selects on it.
pub const OWNER: &str = "tfinit.dev/owner";
/// The annotation holding a record.
pub const RECORD: &str = "tfinit.dev/record";
/// The annotation holding a heartbeat.
pub const HEARTBEAT: &str = "tfinit.dev/heartbeat";
/// The annotation saying why a record was set aside.
pub const ASIDE: &str = "tfinit.dev/aside";
/// The name of the Lease held by the one recovery that runs in a namespace.
pub const RECOVERY_NAME: &str = "tfinit-recovery";
/// The API's limit on an object's annotations, keys and values together.
pub const MAX_ANNOTATIONS: usize = 256 * 1024;
/// What `argv` and, separately, `in_progress` may take of a record in a Lease.
pub const RECORD_LIST_BUDGET: usize = 96 * 1024;

/// What a tfinit Lease is, by its [`KIND`] label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An incarnation's heartbeat.
    Heartbeat,
    /// A record in force.
    Record,
    /// The right to recover.
    Recovery,
    /// A record set aside as unreadable.
    Corrupt,
    /// A record set aside for a person.
    Manual,
}

impl Kind {
    /// The label's value.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Heartbeat => "heartbeat",
            Kind::Record => "record",
            Kind::Recovery => "recovery",
            Kind::Corrupt => "corrupt",
            Kind::Manual => "manual",
        }
    }
}

/// The label selector of every tfinit Lease of `kind`.
pub fn selector(kind: Kind) -> String {
    format!("{}={},{KIND}={}", MANAGED_BY.0, MANAGED_BY.1, kind.label())
}

/// The label selector of the heartbeats of owner name `name` (and possibly of others whose name
/// hashes alike: callers check the name).
pub fn selector_named(name: &str) -> String {
    format!(
        "{},{OWNER}={}",
        selector(Kind::Heartbeat),
        label_value(name)
    )
}

/// The name of `owner`'s heartbeat Lease.
pub fn heartbeat_name(owner: &Owner) -> String {
    lease_name(&owner.name, &format!("tfinit-{}", owner.incarnation()))
}

/// The name of `record`'s Lease.
pub fn record_name(record: &Record) -> String {
    lease_name(
        &record.owner.name,
        &format!("tfinit-{}-{}", record.owner.incarnation(), record.run_id),
    )
}

/// Whole seconds of `ms`, rounded up, at least 1 (what `leaseDurationSeconds` takes).
fn seconds(ms: u64) -> i32 {
    ms.div_ceil(1000).clamp(1, i32::MAX as u64) as i32
}

/// `base` (the Lease as last read, to update it; None to create one) with tfinit's labels of
/// `kind` for `owner`, and `holder` as its holder: what the server keeps that tfinit does not
/// write (other labels and annotations, `acquireTime`, unknown fields) stays.
fn ours(base: Option<&Lease>, name: &str, kind: Kind, owner: Option<&str>, holder: &str) -> Lease {
    let mut l = base.cloned().unwrap_or_else(|| Lease::named(name));
    let labels = &mut l.metadata.labels;
    labels.insert(MANAGED_BY.0.into(), MANAGED_BY.1.into());
    labels.insert(KIND.into(), kind.label().into());
    if let Some(owner) = owner {
        labels.insert(OWNER.into(), label_value(owner));
    }
    l.spec.holder_identity = Some(holder.to_string());
    if l.spec.acquire_time.is_none() {
        l.spec.acquire_time = Some(MicroTime::now());
    }
    l
}

/// The heartbeat Lease of `hb` (updated from `base` when given): renewed now, for the TTL the
/// heartbeat states.
pub fn heartbeat_lease(hb: &Heartbeat, base: Option<&Lease>) -> Lease {
    let name = heartbeat_name(&hb.owner);
    let mut l = ours(
        base,
        &name,
        Kind::Heartbeat,
        Some(&hb.owner.name),
        &hb.owner.key(),
    );
    l.spec.lease_duration_seconds = hb.ttl_ms.map(seconds);
    l.spec.renew_time = Some(MicroTime::now());
    let json = serde_json::to_string(hb).unwrap_or_default();
    l.metadata.annotations.insert(HEARTBEAT.into(), json);
    l
}

/// The Lease of `record` (updated from `base` when given), its lists fitted to
/// [`RECORD_LIST_BUDGET`]; Err with the reason when it would not read back or not fit in the
/// API's annotations.
pub fn record_lease(record: &Record, base: Option<&Lease>) -> Result<Lease, String> {
    let json = serde_json::to_string(&*record.fitted_within(RECORD_LIST_BUDGET))
        .map_err(|e| e.to_string())?;
    parse_record(json.as_bytes()).map_err(|e| e.to_string())?;
    let name = record_name(record);
    let mut l = ours(
        base,
        &name,
        Kind::Record,
        Some(&record.owner.name),
        &record.owner.key(),
    );
    l.spec.lease_duration_seconds = record.ttl_ms.map(seconds);
    l.metadata.annotations.insert(RECORD.into(), json);
    let size = annotations_size(&l.metadata.annotations);
    if size > MAX_ANNOTATIONS {
        return Err(format!(
            "it would take {size} bytes of annotations, more than the {MAX_ANNOTATIONS} the API takes (its paths or names are that long)"
        ));
    }
    Ok(l)
}

/// The recovery Lease held by `holder` for `ttl_ms` (updated from `base` when given), renewed now.
pub fn recovery_lease(holder: &str, ttl_ms: u64, base: Option<&Lease>) -> Lease {
    let mut l = ours(base, RECOVERY_NAME, Kind::Recovery, None, holder);
    l.spec.lease_duration_seconds = Some(seconds(ttl_ms));
    l.spec.renew_time = Some(MicroTime::now());
    l
}

/// `lease` set aside for `why`: no longer a record to any list, kept for a person with its text
/// as found.
pub fn aside(lease: &Lease, why: &Aside) -> Lease {
    let mut l = lease.clone();
    let (kind, text) = match why {
        Aside::Corrupt(problem) => (Kind::Corrupt, problem.as_str()),
        Aside::Manual => (Kind::Manual, "its lock must be released by hand"),
    };
    l.metadata.labels.insert(KIND.into(), kind.label().into());
    l.metadata.annotations.insert(ASIDE.into(), text.into());
    l
}

/// The bytes annotations take as the API counts them: keys and values.
pub fn annotations_size(annotations: &BTreeMap<String, String>) -> usize {
    annotations.iter().map(|(k, v)| k.len() + v.len()).sum()
}

/// The heartbeat `lease` holds: None when it holds none of the current format, or one that is not
/// of the incarnation its name says (a copy under another name proves nothing of either).
pub fn heartbeat_of(lease: &Lease) -> Option<Heartbeat> {
    let hb: Heartbeat = serde_json::from_str(lease.metadata.annotations.get(HEARTBEAT)?).ok()?;
    (hb.v == HEARTBEAT_FORMAT && heartbeat_name(&hb.owner) == lease.metadata.name).then_some(hb)
}

/// What a record Lease `lease` of namespace `ns` is to a reader.
pub fn found_of(ns: &str, lease: &Lease) -> Found {
    let id = RecordId::lease(ns, &lease.metadata.name);
    let Some(json) = lease.metadata.annotations.get(RECORD) else {
        return Found::Corrupt(id, format!("no {RECORD} annotation"));
    };
    match parse_record(json.as_bytes()) {
        Ok(r) => Found::Record(id, Box::new(r)),
        Err(problem) => match problem.future() {
            Some(v) => Found::Future(id, v),
            None => Found::Corrupt(id, problem.to_string()),
        },
    }
}

/// An item of a list that is no Lease this client reads: left alone (the server validated it as
/// a Lease, so it is no garbage of tfinit's making), read again by the next listing.
pub fn unreadable_item(ns: &str, name: Option<&str>, detail: &str) -> Found {
    let id = RecordId::lease(ns, name.unwrap_or("(no name)"));
    Found::LeftAlone(id, Unread::Failed(detail.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::{is_dns_subdomain, is_label_value};
    use crate::locks::record::{now_ms, sample, LIST_BUDGET};

    // The file store's lists alone would fill the API's limit: the reason for the smaller budget.
    const _: () =
        assert!(2 * LIST_BUDGET >= MAX_ANNOTATIONS && 2 * RECORD_LIST_BUDGET < MAX_ANNOTATIONS);

    fn owner(name: &str) -> Owner {
        Owner::current(name, None)
    }

    fn beat(o: &Owner) -> Heartbeat {
        Heartbeat {
            v: HEARTBEAT_FORMAT,
            owner: o.clone(),
            seq: 7,
            updated_ms: now_ms(),
            holds_lock: false,
            host: "pod-a".into(),
            ttl_ms: Some(30_500),
            lock_file: None,
        }
    }

    #[test]
    fn names_are_valid_for_any_owner_name_and_differ_per_incarnation_and_run() {
        let long = "p".repeat(253);
        for name in ["pod-a", "Pod_A.x", &long, "a.-b", "9"] {
            let o = owner(name);
            let mut r = sample(&o);
            let hb = heartbeat_name(&o);
            let rec = record_name(&r);
            assert!(is_dns_subdomain(&hb), "{hb}");
            assert!(is_dns_subdomain(&rec), "{rec}");
            r.run_id = "r2".into();
            assert_ne!(rec, record_name(&r));
            assert_ne!(hb, heartbeat_name(&owner(name)), "another incarnation");
            assert!(is_label_value(&label_value(name)));
        }
        let o = owner("pod-a");
        assert!(heartbeat_name(&o).starts_with("pod-a-tfinit-"));
    }

    #[test]
    fn a_heartbeat_lease_states_the_holder_its_ttl_and_reads_back() {
        let o = owner("pod-a");
        let hb = beat(&o);
        let l = heartbeat_lease(&hb, None);
        assert_eq!(l.spec.holder_identity.as_deref(), Some(o.key().as_str()));
        assert_eq!(l.spec.lease_duration_seconds, Some(31), "rounded up");
        assert!(l.spec.renew_time.is_some() && l.spec.acquire_time.is_some());
        assert_eq!(l.metadata.labels[KIND], "heartbeat");
        assert_eq!(l.metadata.labels[MANAGED_BY.0], MANAGED_BY.1);
        assert_eq!(heartbeat_of(&l), Some(hb.clone()));
        // A copy under another incarnation's name proves nothing.
        let mut copy = l.clone();
        copy.metadata.name = heartbeat_name(&owner("pod-a"));
        assert_eq!(heartbeat_of(&copy), None);
        // An update keeps what the server holds and tfinit does not write.
        let mut base = l.clone();
        base.metadata.resource_version = Some("42".into());
        base.metadata.labels.insert("team".into(), "infra".into());
        let acquired = base.spec.acquire_time;
        let next = heartbeat_lease(&Heartbeat { seq: 8, ..hb }, Some(&base));
        assert_eq!(next.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(next.metadata.labels["team"], "infra");
        assert_eq!(next.spec.acquire_time, acquired);
        assert_eq!(heartbeat_of(&next).unwrap().seq, 8);
    }

    #[test]
    fn a_record_reads_back_and_garbage_is_corrupt() {
        let r = sample(&owner("pod-a"));
        let l = record_lease(&r, None).unwrap();
        assert_eq!(l.metadata.labels[KIND], "record");
        assert!(!l.metadata.other.contains_key("ownerReferences"));
        match found_of("ns", &l) {
            Found::Record(id, got) => {
                assert_eq!(*got, r);
                assert_eq!(id, RecordId::lease("ns", &record_name(&r)));
            }
            other => panic!("{other:?}"),
        }
        let mut bad = l.clone();
        bad.metadata
            .annotations
            .insert(RECORD.into(), "{garbage".into());
        assert!(matches!(found_of("ns", &bad), Found::Corrupt(_, _)));
        bad.metadata.annotations.remove(RECORD);
        assert!(matches!(found_of("ns", &bad), Found::Corrupt(_, p) if p.contains(RECORD)));
        bad.metadata
            .annotations
            .insert(RECORD.into(), r#"{"v":99}"#.into());
        assert!(matches!(found_of("ns", &bad), Found::Future(_, 99)));
        let set = aside(&l, &Aside::Corrupt("bad".into()));
        assert_eq!(set.metadata.labels[KIND], "corrupt");
        assert_eq!(set.metadata.annotations[ASIDE], "bad");
    }

    #[test]
    fn the_largest_record_fits_in_the_apis_annotations() {
        let mut r = sample(&owner(&"o".repeat(63)));
        // Both lists far over any budget, with entries JSON escapes make longer.
        r.argv = vec!["\"x\\".repeat(100); 10_000];
        r.in_progress = vec!["module.a.null_resource.b[\"k\"]".into(); 100_000];
        r.workdir = format!("/{}", "w".repeat(4000));
        r.cwd = r.workdir.clone();
        r.data_dir = Some(r.workdir.clone());
        let l = record_lease(&r, None).unwrap();
        let size = annotations_size(&l.metadata.annotations);
        assert!(size <= MAX_ANNOTATIONS, "{size}");
        assert!(
            size > 2 * RECORD_LIST_BUDGET * 9 / 10,
            "the lists keep most of it: {size}"
        );
        let Found::Record(_, back) = found_of("ns", &l) else {
            panic!("reads back")
        };
        assert!(back
            .argv
            .last()
            .unwrap()
            .contains("more arguments not recorded"));
        // Paths far longer than any file system takes do not fit: refused with the reason.
        r.cwd = format!("/{}", "c".repeat(MAX_ANNOTATIONS));
        let err = record_lease(&r, None).unwrap_err();
        assert!(err.contains("bytes of annotations"), "{err}");
    }

    #[test]
    fn selectors_name_the_kind_and_owner() {
        assert_eq!(
            selector(Kind::Record),
            "app.kubernetes.io/managed-by=tfinit,tfinit.dev/kind=record"
        );
        assert!(selector_named("pod-a").ends_with(",tfinit.dev/owner=pod-a"));
        let l = recovery_lease("me/x", 30_000, None);
        assert_eq!(l.metadata.name, RECOVERY_NAME);
        assert_eq!(l.spec.lease_duration_seconds, Some(30));
        assert_eq!(l.metadata.labels[KIND], "recovery");
    }
}

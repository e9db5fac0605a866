//! The Kubernetes Lease store (src/locks/store/kube/) against the stand-in API server over real
//! TLS: records and heartbeats as Leases (names, labels, holder, duration, no ownerReference),
//! the answers it must resolve without losing a change (409 re-read and re-applied, a lost
//! answer, a Lease deleted by hand, 429 with Retry-After, 5xx, a rotated token), the ones it must
//! surface with one clear message (403 with the Role rule, a missing namespace, an API that does
//! not answer), a record Lease edited into garbage (set aside), and the recovery Lease (one
//! holder at a time, a dead holder's taken once watched unrenewed for its duration).

mod common;

use std::io;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tfinit::kube::{Lease, RetryPolicy, ROLE_RULE};
use tfinit::locks::record::{now_ms, Found, Heartbeat, Owner, Record, FORMAT, HEARTBEAT_FORMAT};
use tfinit::locks::store::kube::{heartbeat_name, record_name, RECOVERY_NAME};
use tfinit::locks::store::{Change, KubeStore, Store};

use common::kube_cluster::{have_deps, Cluster, NS};

/// The owner TTL of these tests' incarnations.
const TTL: Duration = Duration::from_secs(3);

/// A quick retry policy: the tests' faults are cured by the second or third attempt.
const RETRY: RetryPolicy = RetryPolicy {
    first: Duration::from_millis(50),
    max: Duration::from_millis(500),
    attempts: 5,
};

fn store(c: &Cluster, me: &Owner) -> KubeStore {
    KubeStore::new(c.client(), me, TTL).with_budget(RETRY, Duration::from_secs(10))
}

fn beat(me: &Owner, seq: u64) -> Heartbeat {
    Heartbeat {
        v: HEARTBEAT_FORMAT,
        owner: me.clone(),
        seq,
        updated_ms: now_ms(),
        holds_lock: false,
        host: me.name.clone(),
        ttl_ms: Some(TTL.as_millis() as u64),
        lock_file: None,
    }
}

fn record(me: &Owner, run: &str) -> Record {
    Record {
        v: FORMAT,
        owner: me.clone(),
        who: format!("@{}", me.name),
        run_id: run.into(),
        cwd: "/tf/x".into(),
        workdir: "/tf/x".into(),
        workspace: "default".into(),
        subcommand: "apply".into(),
        argv: vec!["apply".into(), "-auto-approve".into()],
        started_ms: now_ms(),
        in_progress: vec![],
        updated_ms: now_ms(),
        ended: None,
        needs_person: None,
        ttl_ms: Some(TTL.as_millis() as u64),
        data_dir: None,
    }
}

/// The Lease `name` as the stand-in holds it (its admin view: never faulted, never logged).
fn stored(c: &Cluster, name: &str) -> Option<Value> {
    let path = format!("/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{name}");
    let (code, v) = c.api.call("GET", &path, None, "application/json");
    (code == 200).then_some(v)
}

fn records(s: &KubeStore) -> Vec<Record> {
    s.list()
        .into_iter()
        .filter_map(|f| match f {
            Found::Record(_, r) => Some(*r),
            _ => None,
        })
        .collect()
}

#[test]
fn records_and_heartbeats_live_in_leases_of_the_namespace() {
    if !have_deps() {
        return;
    }
    let c = Cluster::start("kstore-basic");
    let me = Owner::current("provider-terraform-7d9f8-x2b4q", None);
    let s = store(&c, &me);
    s.open(TTL).expect("the Leases can be listed");
    s.write_heartbeat(&beat(&me, 1)).unwrap();
    let hb = stored(&c, &heartbeat_name(&me)).expect("the heartbeat Lease exists");
    assert_eq!(hb["spec"]["holderIdentity"], me.key());
    assert_eq!(hb["spec"]["leaseDurationSeconds"], 3);
    assert!(hb["spec"]["renewTime"].is_string());
    assert_eq!(
        hb["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "tfinit"
    );
    assert_eq!(hb["metadata"]["labels"]["tfinit.dev/kind"], "heartbeat");
    assert!(hb["metadata"].get("ownerReferences").is_none());
    let renewed = hb["spec"]["renewTime"].clone();

    s.write_heartbeat(&beat(&me, 2)).unwrap();
    assert_eq!(s.read_heartbeat(&me).unwrap().map(|h| h.seq), Some(2));
    let hb = stored(&c, &heartbeat_name(&me)).unwrap();
    assert_ne!(hb["spec"]["renewTime"], renewed, "renewed every beat");
    assert_eq!(s.heartbeats().unwrap().len(), 1);
    assert_eq!(s.heartbeats_named(&me.name).unwrap().len(), 1);
    assert!(s.heartbeats_named("provider-terraform").unwrap().is_empty());

    // A record: written, listed, read, rewritten, removed.
    let mut rec = record(&me, "r1");
    let id = s.write(&rec).unwrap();
    assert_eq!(id.to_string(), format!("Lease {NS}/{}", record_name(&rec)));
    assert_eq!(id.as_lease_in(NS), Some(record_name(&rec).as_str()));
    let l = stored(&c, &record_name(&rec)).unwrap();
    assert_eq!(l["metadata"]["labels"]["tfinit.dev/kind"], "record");
    assert!(l["metadata"].get("ownerReferences").is_none());
    assert_eq!(records(&s), [rec.clone()]);
    rec.in_progress = vec!["null_resource.a".into()];
    assert_eq!(s.write(&rec).unwrap(), id);
    assert_eq!(s.read(&id).unwrap(), rec);
    s.remove(&id).unwrap();
    s.remove(&id).expect("a missing record is fine");
    assert!(records(&s).is_empty());

    // A second store of another pod sees the first one's heartbeat and records.
    let other = Owner::current("pod-b", None);
    let s2 = store(&c, &other);
    s.write(&record(&me, "r2")).unwrap();
    assert_eq!(records(&s2).len(), 1);
    assert_eq!(s2.read_heartbeat(&me).unwrap().map(|h| h.seq), Some(2));
}

#[test]
fn a_conflict_is_read_again_and_the_change_applied_not_dropped() {
    if !have_deps() {
        return;
    }
    let c = Cluster::start("kstore-409");
    let me = Owner::current("pod-a", None);
    let s = store(&c, &me);
    s.write_heartbeat(&beat(&me, 1)).unwrap();
    // Another writer (a person's `kubectl label`) changes the Lease: this store's copy is stale.
    let client = c.client();
    let mut l = client.get(&heartbeat_name(&me)).unwrap();
    l.metadata.labels.insert("team".into(), "infra".into());
    client.update(&l).unwrap();
    c.api.clear_requests();
    s.write_heartbeat(&beat(&me, 2)).unwrap();
    assert_eq!(c.codes(), [409, 200, 200], "update, get, update");
    let hb = stored(&c, &heartbeat_name(&me)).unwrap();
    assert_eq!(hb["metadata"]["labels"]["team"], "infra", "theirs kept");
    assert_eq!(
        s.read_heartbeat(&me).unwrap().unwrap().seq,
        2,
        "ours applied"
    );
}

#[test]
fn a_lost_answer_and_a_lease_deleted_by_hand_lose_nothing() {
    if !have_deps() {
        return;
    }
    let c = Cluster::start("kstore-lost");
    let me = Owner::current("pod-a", None);
    let s = store(&c, &me);
    let mut rec = record(&me, "r1");
    s.write(&rec).unwrap();
    c.api
        .faults(json!({"lose": {"update leases": {"times": 1}}}));
    rec.in_progress = vec!["null_resource.a".into()];
    s.write(&rec).expect("read again after the lost answer");
    assert_eq!(records(&s), [rec.clone()]);

    // Deleted by hand: the next write creates it again.
    c.api.delete(&format!(
        "/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{}",
        record_name(&rec)
    ));
    rec.in_progress.clear();
    s.write(&rec).expect("created again");
    assert_eq!(records(&s), [rec]);
}

#[test]
fn throttling_and_server_errors_are_waited_out() {
    if !have_deps() {
        return;
    }
    let c = Cluster::start("kstore-429");
    let me = Owner::current("pod-a", None);
    let s = store(&c, &me);
    s.write_heartbeat(&beat(&me, 1)).unwrap();
    c.api.faults(json!({
        "throttle": {"update leases": {"retry_after": 1, "times": 1}},
        "fail": {"list leases": {"code": 503, "times": 2}},
    }));
    c.api.clear_requests();
    let start = Instant::now();
    s.write_heartbeat(&beat(&me, 2)).unwrap();
    assert!(
        start.elapsed() >= Duration::from_secs(1),
        "Retry-After honoured"
    );
    assert_eq!(c.codes(), [429, 200]);
    assert_eq!(
        s.heartbeats().unwrap().len(),
        1,
        "the list is sent again after two 503s"
    );
}

#[test]
fn a_rotated_token_is_read_again() {
    if !have_deps() {
        return;
    }
    let c = Cluster::start("kstore-401");
    let me = Owner::current("pod-a", None);
    let s = store(&c, &me);
    s.write_heartbeat(&beat(&me, 1)).unwrap();
    std::fs::write(&c.tokens, "token-2\n").unwrap();
    std::fs::write(c.sa.join("token"), "token-2\n").unwrap();
    c.api.clear_requests();
    s.write_heartbeat(&beat(&me, 2)).unwrap();
    assert_eq!(c.codes(), [401, 200]);
}

#[test]
fn forbidden_and_a_missing_namespace_are_one_clear_error() {
    if !have_deps() {
        return;
    }
    let c = Cluster::start("kstore-403");
    let me = Owner::current("pod-a", None);
    let s = store(&c, &me);
    c.api.faults(json!({"forbid": ["list leases"]}));
    let e = s.open(TTL).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
    assert!(e.to_string().contains(ROLE_RULE), "{e}");
    // Rights removed while the pod runs: the heartbeat cannot land, and says why.
    c.api.faults(json!({"forbid": ["create leases"]}));
    let e = s.write_heartbeat(&beat(&me, 1)).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
    assert!(e.to_string().contains(ROLE_RULE), "{e}");
    assert_eq!(c.codes().last(), Some(&403), "403 is not retried");

    c.api.faults(json!({}));
    c.api.namespace(NS, false);
    let e = s.write_heartbeat(&beat(&me, 1)).unwrap_err();
    assert!(
        e.to_string()
            .contains(&format!("namespace {NS} does not exist")),
        "{e}"
    );
}

#[test]
fn an_api_that_does_not_answer_is_a_store_not_answering() {
    if !have_deps() {
        return;
    }
    let c = Cluster::start("kstore-hung");
    let me = Owner::current("pod-a", None);
    let s = KubeStore::new(c.client(), &me, TTL).with_budget(RETRY, Duration::from_secs(1));
    c.api.faults(json!({"stall": ["list leases"]}));
    let start = Instant::now();
    let e = s.open(TTL).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    c.api.faults(json!({}));
    s.open(TTL).expect("answers again");
}

#[test]
fn a_read_the_api_does_not_answer_is_an_error_never_a_missing_heartbeat() {
    if !have_deps() {
        return;
    }
    let c = Cluster::start("kstore-noanswer");
    let me = Owner::current("pod-a", None);
    let s = KubeStore::new(c.client(), &me, TTL).with_budget(RETRY, Duration::from_secs(1));
    s.write_heartbeat(&beat(&me, 1)).unwrap();
    s.write(&record(&me, "r1")).unwrap();
    let gone = Owner::current("pod-gone", None);
    // Answered: ours is there, another incarnation's is not (no Lease: None, as an answer).
    assert_eq!(s.read_heartbeat(&me).unwrap().map(|h| h.seq), Some(1));
    assert_eq!(s.read_heartbeat(&gone).unwrap(), None);
    // Down, hung, refusing: no answer, never "missing" (an observer would watch "missing,
    // unchanged" for a TTL and call a live owner dead).
    for (fault, what) in [
        (json!({"fail": {"get leases": {"code": 503}}}), "503"),
        (json!({"stall": ["get leases"]}), "hung"),
        (json!({"forbid": ["get leases"]}), "403"),
    ] {
        c.api.faults(fault);
        let read = s.read_heartbeat(&me);
        assert!(read.is_err(), "{what}: {read:?}");
        assert!(s.read_heartbeat(&gone).is_err(), "{what}");
        c.api.faults(json!({}));
    }
    // A listing with no answer: the heartbeats are an error, the records are unknown (not
    // none).
    c.api
        .faults(json!({"fail": {"list leases": {"code": 500}}}));
    assert!(s.heartbeats().is_err());
    assert!(s.heartbeats_named(&me.name).is_err());
    let found = s.list();
    assert!(
        matches!(&found[..], [Found::Unlisted(why)] if why.contains("500")),
        "{found:?}"
    );
    c.api.faults(json!({}));
    assert_eq!(records(&s).len(), 1);
    assert_eq!(s.heartbeats().unwrap().len(), 1);
}

#[test]
fn a_record_lease_edited_into_garbage_is_set_aside() {
    if !have_deps() {
        return;
    }
    let c = Cluster::start("kstore-garbage");
    let me = Owner::current("pod-a", None);
    let s = store(&c, &me);
    let rec = record(&me, "r1");
    s.write(&rec).unwrap();
    let client = c.client();
    let mut l: Lease = client.get(&record_name(&rec)).unwrap();
    l.metadata
        .annotations
        .insert("tfinit.dev/record".into(), "{\"v\": 4, \"owner\": ".into());
    client.update(&l).unwrap();
    assert!(s.sweep().is_empty(), "nothing readable");
    let aside = stored(&c, &record_name(&rec)).expect("kept for a person");
    assert_eq!(aside["metadata"]["labels"]["tfinit.dev/kind"], "corrupt");
    assert!(aside["metadata"]["annotations"]["tfinit.dev/aside"]
        .as_str()
        .unwrap()
        .contains("not a record"));
    assert!(s.list().is_empty(), "never read again");
}

#[test]
fn a_record_over_the_apis_limit_is_fitted_and_the_stand_in_enforces_it() {
    if !have_deps() {
        return;
    }
    let c = Cluster::start("kstore-size");
    let me = Owner::current("pod-a", None);
    let s = store(&c, &me);
    let mut rec = record(&me, "r1");
    rec.in_progress = vec!["module.m.null_resource.x[\"key\"]".into(); 50_000];
    rec.argv = vec!["-target=module.m.null_resource.x".into(); 50_000];
    s.write(&rec).expect("fitted to the budget");
    let back = records(&s).pop().unwrap();
    assert!(back
        .in_progress
        .last()
        .unwrap()
        .contains("more resources in progress not recorded"));
    // What the API refuses (the stand-in checks the limit as the real one does).
    let mut l = Lease::named("too-big");
    l.metadata
        .annotations
        .insert("x".into(), "y".repeat(256 * 1024));
    let e = c.client().create(&l).unwrap_err();
    assert!(
        e.to_string()
            .contains("Too long: must have at most 262144 bytes"),
        "{e}"
    );
}

#[test]
fn one_recovery_at_a_time_and_a_dead_holders_lease_is_taken() {
    if !have_deps() {
        return;
    }
    let c = Cluster::start("kstore-recovery");
    let a = store(&c, &Owner::current("pod-a", None));
    let b = store(&c, &Owner::current("pod-b", None));
    let held = a.lock_recovery(Duration::from_secs(1)).unwrap();
    let e = b.lock_recovery(Duration::from_secs(2)).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "{e}");
    assert!(e.to_string().contains(RECOVERY_NAME), "{e}");
    drop(held);
    assert!(stored(&c, RECOVERY_NAME).is_none(), "deleted when released");
    let held = b.lock_recovery(Duration::from_secs(1)).unwrap();
    drop(held);

    // A holder that died: its Lease says 1 s and is never renewed. Taken once this pod has seen
    // it unchanged for 1 s on its own clock, and not before.
    let mut dead = Lease::named(RECOVERY_NAME);
    dead.spec.holder_identity = Some("pod-z/dead".into());
    dead.spec.lease_duration_seconds = Some(1);
    c.client().create(&dead).unwrap();
    let start = Instant::now();
    let held = a.lock_recovery(Duration::from_secs(5)).unwrap();
    assert!(
        start.elapsed() >= Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    let l = stored(&c, RECOVERY_NAME).unwrap();
    assert!(l["spec"]["holderIdentity"]
        .as_str()
        .unwrap()
        .starts_with("pod-a/"));
    // A live holder renews (every TTL/3) and is never taken, however long the wait.
    let e = b.lock_recovery(TTL * 2).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "{e}");
    drop(held);
}

#[test]
fn a_recovery_lease_that_cannot_be_renewed_is_no_longer_surely_held() {
    if !have_deps() {
        return;
    }
    let c = Cluster::start("kstore-fence");
    let a = store(&c, &Owner::current("pod-a", None));
    let held = a.lock_recovery(Duration::from_secs(1)).unwrap();
    assert!(held.held());
    // Renewals land: still held after more than its duration.
    std::thread::sleep(TTL + Duration::from_millis(500));
    assert!(held.held(), "renewed every TTL/3");
    // The API stops answering renewals: within 2/3 of the duration after the last one that
    // landed, the holder knows it may no longer act (a waiter takes it only after all of it).
    // They stop right after one lands (every TTL/3): the time read once the stall is set is
    // after that last renewal, and at most a few polls after it, so it is a tight bound.
    let renewals = || {
        c.api
            .requests()
            .iter()
            .filter(|(verb, name, code)| {
                verb == "update" && name == "tfinit-recovery" && *code == 200
            })
            .count()
    };
    let before = renewals();
    let wait = Instant::now() + TTL;
    while renewals() == before {
        assert!(
            Instant::now() < wait,
            "no renewal of the recovery Lease in {TTL:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    c.api.faults(json!({"stall": ["update leases"]}));
    held_at_most_two_thirds(Instant::now(), "the renewals stopped landing", || {
        held.held()
    });
    c.api.faults(json!({}));
    drop(held);
}

/// Asks `held` until it says no, which must be by 2/3 of the duration after `since` (`what`
/// happened then). The time is read before each question, so an answer "held" came at that
/// time or later: this test's own lateness under load (a poll that wakes late) cannot fail it.
fn held_at_most_two_thirds(since: Instant, what: &str, held: impl Fn() -> bool) {
    let limit = since + TTL * 2 / 3;
    loop {
        let asked = Instant::now();
        if !held() {
            return;
        }
        assert!(
            asked <= limit,
            "still held {:?} after {what} (2/3 of the duration: {:?})",
            asked - since,
            TTL * 2 / 3
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The recovery Lease is surely held for 2/3 of its duration after its create was *sent*: the
/// server may store it long before the answer comes back, and a waiter counts from when it
/// first sees it. With the create's answer 1.5 s late and no renewal landing, the holder knows
/// by 2 s after it asked that it may no longer act; counted from the answer it would believe
/// itself the holder until 3.5 s, after a waiter may have taken the Lease (3 s).
#[test]
fn a_recovery_lease_whose_create_was_answered_late_is_counted_from_the_request() {
    if !have_deps() {
        return;
    }
    let c = Cluster::start("kstore-late");
    let a = store(&c, &Owner::current("pod-a", None));
    c.api.faults(json!({
        "late": {"create leases": {"ms": 1500, "times": 1}},
        "stall": ["update leases"],
    }));
    let asked_first = Instant::now();
    let held = a.lock_recovery(Duration::from_secs(1)).unwrap();
    assert!(
        asked_first.elapsed() >= Duration::from_millis(1500),
        "the create's answer came late"
    );
    held_at_most_two_thirds(asked_first, "the create was sent", || held.held());
    c.api.faults(json!({}));
    drop(held);
}

#[test]
fn a_batch_of_record_writes_is_in_flight_together_and_nothing_of_it_is_lost() {
    if !have_deps() {
        return;
    }
    const DELAY_MS: u64 = 400;
    let c = Cluster::start("kstore-batch");
    let me = Owner::current("pod-a", None);
    let s = store(&c, &me);
    s.open(TTL).unwrap();
    c.api.faults(json!({"slow": {
        "create leases": {"ms": DELAY_MS},
        "update leases": {"ms": DELAY_MS},
        "get leases": {"ms": DELAY_MS},
        "delete leases": {"ms": DELAY_MS},
    }}));
    let batch: Vec<Change> = (1..=8)
        .map(|i| Change::Put(Box::new(record(&me, &format!("r{i}")))))
        .collect();
    let t0 = Instant::now();
    let ids: Vec<_> = s.apply(&batch).into_iter().map(Result::unwrap).collect();
    let took = t0.elapsed();
    // One after the other the eight would take 3.2 s; together about one request's time. The
    // bound leaves a loaded machine half of the difference.
    assert!(
        took < Duration::from_millis(DELAY_MS * 8 / 2),
        "8 creates at {DELAY_MS} ms each took {took:?}"
    );
    assert_eq!(records(&s).len(), 8, "every record of the batch is stored");
    // A batch of removals and a rewrite; a conflict on one (the Lease changed by another
    // writer) is re-read and re-applied, not dropped.
    c.api.faults(json!({}));
    let mut r1 = record(&me, "r1");
    r1.in_progress = vec!["null_resource.a".into()];
    let mut changed = stored(&c, &record_name(&r1)).unwrap();
    changed["metadata"]["annotations"]["x"] = "y".into();
    let path = format!(
        "/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{}",
        record_name(&r1)
    );
    let (code, _) = c.api.call("PUT", &path, Some(&changed), "application/json");
    assert_eq!(code, 200);
    let second: Vec<Change> = std::iter::once(Change::Put(Box::new(r1.clone())))
        .chain(ids[1..].iter().cloned().map(Change::Remove))
        .collect();
    let results = s.apply(&second);
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(records(&s), [r1]);
    // Negative: a record that would not read back fails alone, the rest of its batch lands.
    let mut bad = record(&me, "r9");
    bad.workdir = format!("/{}", "d".repeat(300 * 1024));
    let results = s.apply(&[
        Change::Put(Box::new(bad)),
        Change::Put(Box::new(record(&me, "r10"))),
    ]);
    assert!(results[0].is_err() && results[1].is_ok(), "{results:?}");
    assert_eq!(records(&s).len(), 2);
}

//! TFINIT_STORE's choice (src/locks/store/choose.rs) against the stand-in API server: `auto`
//! takes the Leases when the service account may list them, the files on 403 or without an
//! in-cluster configuration, and neither while the API does not answer (a store that has not
//! answered yet); with the Leases chosen, a predecessor's record files are still read.

mod common;

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;
use tfinit::config::StoreSetting;
use tfinit::kube::RetryPolicy;
use tfinit::locks::record::{now_ms, Found, Heartbeat, Owner, Record, FORMAT, HEARTBEAT_FORMAT};
use tfinit::locks::store::kube::heartbeat_name;
use tfinit::locks::store::{chosen_with, FileStore, KubeStore, RecordId, Store};

use common::kube_cluster::{have_deps, Cluster, NS};
use common::wait_for;

const TTL: Duration = Duration::from_secs(3);

/// The Kubernetes store of the pod, retrying briefly.
fn api(c: &Cluster, me: &Owner) -> Result<KubeStore, String> {
    let retry = RetryPolicy {
        first: Duration::from_millis(50),
        max: Duration::from_millis(200),
        attempts: 3,
    };
    Ok(KubeStore::new(c.client(), me, TTL).with_budget(retry, Duration::from_secs(2)))
}

fn state_dir(c: &Cluster) -> PathBuf {
    let d = c.tmp.join("state");
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn beat(me: &Owner) -> Heartbeat {
    Heartbeat {
        v: HEARTBEAT_FORMAT,
        owner: me.clone(),
        seq: 1,
        updated_ms: now_ms(),
        holds_lock: false,
        host: me.name.clone(),
        ttl_ms: Some(TTL.as_millis() as u64),
        lock_file: None,
    }
}

fn record(me: &Owner) -> Record {
    Record {
        v: FORMAT,
        owner: me.clone(),
        who: format!("@{}", me.name),
        run_id: "r1".into(),
        cwd: "/tf/x".into(),
        workdir: "/tf/x".into(),
        workspace: "default".into(),
        subcommand: "apply".into(),
        argv: vec!["apply".into()],
        started_ms: now_ms(),
        in_progress: vec![],
        updated_ms: now_ms(),
        ended: None,
        needs_person: None,
        ttl_ms: Some(TTL.as_millis() as u64),
        data_dir: None,
    }
}

fn lease_exists(c: &Cluster, name: &str) -> bool {
    let path = format!("/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{name}");
    c.api.call("GET", &path, None, "application/json").0 == 200
}

fn heartbeat_file(dir: &Path, me: &Owner) -> PathBuf {
    dir.join("owners")
        .join(format!("{}.{}.json", me.name, me.incarnation()))
}

#[test]
fn auto_takes_the_leases_when_the_service_account_may_list_them() {
    if !have_deps() {
        return;
    }
    let c = Cluster::start("choice-api");
    let me = Owner::current("pod-a", None);
    let dir = state_dir(&c);
    let s = chosen_with(StoreSetting::Auto, &dir, api(&c, &me));
    s.open(TTL).unwrap();
    assert!(
        s.location().contains(&format!("namespace {NS}")),
        "{}",
        s.location()
    );
    s.write_heartbeat(&beat(&me)).unwrap();
    assert!(lease_exists(&c, &heartbeat_name(&me)));
    assert!(!heartbeat_file(&dir, &me).exists(), "no file written");
}

#[test]
fn auto_takes_the_files_when_the_api_refuses_the_service_account() {
    if !have_deps() {
        return;
    }
    let c = Cluster::start("choice-403");
    let me = Owner::current("pod-a", None);
    let dir = state_dir(&c);
    c.api.faults(json!({"forbid": ["list leases"]}));
    let s = chosen_with(StoreSetting::Auto, &dir, api(&c, &me));
    s.open(TTL).unwrap();
    assert_eq!(s.location(), dir.display().to_string());
    s.write_heartbeat(&beat(&me)).unwrap();
    assert!(heartbeat_file(&dir, &me).exists());
    assert!(!lease_exists(&c, &heartbeat_name(&me)));
    // The choice holds: the API allowing it later changes nothing in this incarnation.
    c.api.faults(json!({}));
    s.write_heartbeat(&beat(&me)).unwrap();
    assert!(!lease_exists(&c, &heartbeat_name(&me)));
}

#[test]
fn auto_without_an_answer_is_a_store_that_has_not_answered_yet() {
    if !have_deps() {
        return;
    }
    let c = Cluster::start("choice-down");
    let me = Owner::current("pod-a", None);
    let dir = state_dir(&c);
    c.api
        .faults(json!({"fail": {"list leases": {"code": 503}}}));
    let s = chosen_with(StoreSetting::Auto, &dir, api(&c, &me));
    let e = s.open(TTL).unwrap_err();
    assert!(e.to_string().contains("has not answered yet"), "{e}");
    // The calls right after a probe with no answer take its answer: nothing more is sent (each
    // probe may hold a thread for the client's whole budget).
    let sent = c.codes().len();
    let e = s.write_heartbeat(&beat(&me)).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotConnected, "{e}");
    assert!(!dir.join("owners").exists(), "no fallback to the files");
    // What it holds is unknown, not nothing: a listing and a read are no answers.
    let found = s.list();
    assert!(
        matches!(&found[..], [Found::Unlisted(why)] if why.contains("has not answered yet")),
        "{found:?}"
    );
    assert!(s.read_heartbeat(&me).is_err());
    assert!(s.heartbeats().is_err());
    assert_eq!(c.codes().len(), sent, "no probe within 2 s of the last");
    c.api.faults(json!({}));
    let asked = Instant::now();
    wait_for(Duration::from_secs(10), "the API's answer", || {
        s.open(TTL).ok()
    });
    assert!(
        asked.elapsed() < Duration::from_secs(4),
        "{:?}",
        asked.elapsed()
    );
    s.write_heartbeat(&beat(&me)).unwrap();
    assert!(lease_exists(&c, &heartbeat_name(&me)));
}

#[test]
fn without_an_in_cluster_configuration_auto_is_the_files_and_kubernetes_is_unusable() {
    let dir = std::env::temp_dir().join(format!("tfinit-choice-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let s = chosen_with(StoreSetting::Auto, &dir, Err("not in a pod".into()));
    assert_eq!(s.location(), dir.display().to_string());
    let s = chosen_with(StoreSetting::Kubernetes, &dir, Err("not in a pod".into()));
    let e = s.open(TTL).unwrap_err();
    assert!(
        e.to_string().contains(
            "TFINIT_STORE=kubernetes, but the Kubernetes API cannot be found: not in a pod"
        ),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_predecessors_record_files_are_read_beside_the_leases() {
    if !have_deps() {
        return;
    }
    let c = Cluster::start("choice-both");
    let dir = state_dir(&c);
    // A pod of a tfinit with only files left a record there (a file of one record, the layout
    // of those versions).
    let old = Owner::current("pod-old", None);
    let files = FileStore::new(&dir);
    files.open(TTL).unwrap();
    let rec = record(&old);
    let path = files.path_of(&rec);
    std::fs::write(&path, serde_json::to_vec(&rec).unwrap()).unwrap();
    let old_id = RecordId::file(&path);
    // And one of a tfinit with files per incarnation.
    let mid = Owner::current("pod-mid", None);
    let mid_id = files.write(&record(&mid)).unwrap();
    assert!(mid_id.as_member().is_some(), "{mid_id}");

    let me = Owner::current("pod-new", None);
    let s = chosen_with(StoreSetting::Auto, &dir, api(&c, &me));
    s.open(TTL).unwrap();
    let new_id = s.write(&record(&me)).unwrap();
    let mut ids: Vec<RecordId> = s
        .list()
        .into_iter()
        .filter_map(|f| match f {
            Found::Record(id, _) => Some(id),
            _ => None,
        })
        .collect();
    ids.sort();
    let mut want = vec![old_id.clone(), mid_id.clone(), new_id.clone()];
    want.sort();
    assert_eq!(ids, want, "both stores' records");
    assert_eq!(s.read(&old_id).unwrap().owner, old);
    s.remove(&old_id).unwrap();
    assert!(
        !old_id.as_file().unwrap().exists(),
        "removed from the files"
    );
    // A recovery marks the predecessor's record (rewritten in its file, not sent to the API),
    // then removes it.
    let mut marked = record(&mid);
    marked.in_progress = vec!["null_resource.a".into()];
    assert_eq!(s.write(&marked).unwrap(), mid_id);
    assert_eq!(s.read(&mid_id).unwrap().in_progress, marked.in_progress);
    s.remove(&mid_id).unwrap();
    assert!(
        !files.incarnation_path(&mid).exists(),
        "its last record gone"
    );
    assert!(new_id.as_lease_in(NS).is_some(), "{new_id}");
    s.remove(&new_id).unwrap();
    assert!(s.list().is_empty());
}

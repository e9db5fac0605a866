//! The incarnation's file of records: a batch is one file, records in it are read, removed and
//! set aside one by one, and the first layout's files are still read and kept where they are.

use std::fs;
use std::path::PathBuf;

use super::super::{Aside, Change, FileStore, RecordId, Store};
use super::FILE_FORMAT;
use crate::locks::record::{sample, Found, Owner, Record};

fn temp_store(name: &str) -> (PathBuf, FileStore) {
    let dir = std::env::temp_dir().join(format!("tfinit-inc-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    let store = FileStore::new(&dir);
    store.prepare().unwrap();
    (dir, store)
}

fn run(owner: &Owner, i: u32) -> Record {
    let mut r = sample(owner);
    r.run_id = format!("r{i}");
    r.workdir = format!("/tf/{i}");
    r
}

/// The names of the files in `records/`, sorted.
/// Runs 1..=n of `owner` written in one batch: their ids.
fn put_runs(store: &FileStore, owner: &Owner, n: u32) -> Vec<RecordId> {
    let batch: Vec<Change> = (1..=n)
        .map(|i| Change::Put(Box::new(run(owner, i))))
        .collect();
    store
        .apply(&batch)
        .into_iter()
        .map(Result::unwrap)
        .collect()
}

fn files(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir.join("records"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn records(store: &FileStore) -> Vec<(RecordId, Record)> {
    store
        .list()
        .into_iter()
        .map(|f| match f {
            Found::Record(id, r) => (id, *r),
            other => panic!("not a record: {other:?}"),
        })
        .collect()
}

#[test]
fn a_batch_of_sixteen_records_is_one_file_read_back_record_by_record() {
    let (dir, store) = temp_store("batch");
    let owner = Owner::current("pod-a", None);
    let ids = put_runs(&store, &owner, 16);
    let file = store.incarnation_path(&owner);
    assert_eq!(
        files(&dir),
        [file.file_name().unwrap().to_string_lossy().into_owned()],
        "one file for the incarnation"
    );
    let text = fs::read_to_string(&file).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["v"], FILE_FORMAT);
    assert_eq!(ids[2], RecordId::member(&file, "r3"));
    let listed = records(&store);
    assert_eq!(listed.len(), 16);
    assert!(listed
        .iter()
        .any(|(id, r)| *id == ids[2] && r.workdir == "/tf/3"));
    assert_eq!(store.read(&ids[2]).unwrap().workdir, "/tf/3");
    // A rewrite of one record and a removal of another: one batch, each in place.
    let mut r5 = run(&owner, 5);
    r5.in_progress = vec!["null_resource.a".into()];
    let second = [Change::Put(Box::new(r5)), Change::Remove(ids[0].clone())];
    let results = store.apply(&second);
    assert_eq!(results[0].as_ref().unwrap(), &ids[4]);
    assert_eq!(results[1].as_ref().unwrap(), &ids[0]);
    assert_eq!(
        store.read(&ids[4]).unwrap().in_progress,
        ["null_resource.a"]
    );
    assert!(store.read(&ids[0]).is_err(), "removed");
    assert_eq!(records(&store).len(), 15);
    // Removing one by one (a recovery) rewrites the file; the last removal removes it.
    for id in &ids[1..] {
        store.remove(id).unwrap();
    }
    store.remove(&ids[1]).unwrap();
    assert!(files(&dir).is_empty(), "{:?}", files(&dir));
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn one_record_set_aside_leaves_the_others_of_its_incarnation() {
    let (dir, store) = temp_store("aside");
    let owner = Owner::current("pod-a", None);
    let ids = put_runs(&store, &owner, 3);
    let aside = store.set_aside(&ids[1], &Aside::Manual).unwrap();
    let path = aside.as_file().unwrap().to_path_buf();
    assert!(
        path.to_string_lossy().ends_with(".r2.json.manual"),
        "{}",
        path.display()
    );
    let kept: Record = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    assert_eq!(kept.workdir, "/tf/2", "the record set aside is whole");
    let left: Vec<String> = records(&store).into_iter().map(|(_, r)| r.run_id).collect();
    assert_eq!(left, ["r1", "r3"]);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_damaged_record_in_an_incarnations_file_is_set_aside_alone_by_the_sweep() {
    let (dir, store) = temp_store("damaged");
    let owner = Owner::current("pod-a", None);
    let file = store.incarnation_path(&owner);
    let good = serde_json::to_value(run(&owner, 1)).unwrap();
    let mut bad = serde_json::to_value(run(&owner, 2)).unwrap();
    bad["workdir"] = "relative".into();
    let text = serde_json::json!({"v": FILE_FORMAT, "records": [good, bad]});
    fs::write(&file, text.to_string()).unwrap();
    let found = store.list();
    assert!(
        found
            .iter()
            .any(|f| matches!(f, Found::Corrupt(id, _) if *id == RecordId::member(&file, "r2"))),
        "{found:?}"
    );
    let swept = store.sweep();
    assert_eq!(swept.len(), 1);
    assert_eq!(swept[0].1.run_id, "r1");
    assert!(dir
        .join(format!(
            "records/{}.{}.r2.json.corrupt",
            owner.name,
            owner.incarnation()
        ))
        .exists());
    assert_eq!(records(&store).len(), 1, "the good one stays");
    // Negative: a truncated incarnation's file is corrupt as a whole, and a newer format's is
    // left alone.
    fs::write(
        &file,
        format!("{{\"v\":{FILE_FORMAT},\"records\":[{{\"v\":4,"),
    )
    .unwrap();
    assert!(matches!(&store.list()[..], [Found::Corrupt(id, _)] if id.as_file() == Some(&*file)));
    fs::write(
        &file,
        format!("{{\"v\":{},\"records\":[]}}", FILE_FORMAT + 1),
    )
    .unwrap();
    assert!(matches!(&store.list()[..], [Found::Future(_, v)] if *v == FILE_FORMAT + 1));
    assert!(store.sweep().is_empty());
    assert!(file.exists(), "a newer tfinit's file is left alone");
    // A record of a newer record format (no `records` field) is a record still, left alone.
    fs::write(&file, r#"{"v":5,"owner":{"name":"pod-y"}}"#).unwrap();
    assert!(matches!(&store.list()[..], [Found::Future(_, 5)]));
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn records_of_the_first_layout_are_still_read_rewritten_in_place_and_removed() {
    let (dir, store) = temp_store("old");
    // A predecessor from before the incarnation's file: one file per run.
    let old = Owner::current("pod-old", None);
    let rec = run(&old, 7);
    let path = store.path_of(&rec);
    fs::write(&path, serde_json::to_vec(&rec).unwrap()).unwrap();
    let listed = records(&store);
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].0, RecordId::file(&path));
    assert_eq!(listed[0].1, rec);
    // A recovery marks it: rewritten where it is, not moved into an incarnation's file.
    let mut marked = rec.clone();
    marked.needs_person = Some(crate::locks::record::NeedsPerson {
        reported_by: "pod-b".into(),
        ms: 5,
        lock_id: "id".into(),
        command: "terraform force-unlock id".into(),
    });
    assert_eq!(store.write(&marked).unwrap(), RecordId::file(&path));
    assert!(!store.incarnation_path(&old).exists());
    assert_eq!(store.read(&RecordId::file(&path)).unwrap(), marked);
    // Beside a new incarnation's file, both are listed.
    let me = Owner::current("pod-new", None);
    store.write(&run(&me, 1)).unwrap();
    assert_eq!(records(&store).len(), 2);
    store.remove(&RecordId::file(&path)).unwrap();
    assert_eq!(records(&store).len(), 1);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_batch_that_cannot_be_written_fails_every_change_of_its_file_and_changes_nothing() {
    let (dir, store) = temp_store("fails");
    let owner = Owner::current("pod-a", None);
    let first = store.write(&run(&owner, 1)).unwrap();
    let mut bad = run(&owner, 2);
    bad.workdir = "relative".into();
    let batch = [
        Change::Put(Box::new(bad)),
        Change::Put(Box::new(run(&owner, 3))),
    ];
    let results = store.apply(&batch);
    let e = results[0].as_ref().unwrap_err().to_string();
    assert!(e.contains("not written") && e.contains("relative"), "{e}");
    assert!(results[1].is_ok(), "a record refused alone: the rest lands");
    // The file cannot be written (records/ is read-only to this test only as root: replace the
    // incarnation's file by a directory): every change of the batch fails, nothing is lost.
    let file = store.incarnation_path(&owner);
    let saved = fs::read(&file).unwrap();
    fs::remove_file(&file).unwrap();
    fs::create_dir(&file).unwrap();
    let results = store.apply(&[
        Change::Put(Box::new(run(&owner, 4))),
        Change::Remove(first.clone()),
    ]);
    assert!(results.iter().all(Result::is_err), "{results:?}");
    fs::remove_dir(&file).unwrap();
    fs::write(&file, saved).unwrap();
    let left: Vec<String> = records(&store).into_iter().map(|(_, r)| r.run_id).collect();
    assert_eq!(left, ["r1", "r3"]);
    fs::remove_dir_all(&dir).unwrap();
}

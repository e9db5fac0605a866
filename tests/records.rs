//! Lock-owner records and heartbeats on disk, with a fake terraform (an sh script after the shim on
//! PATH): when a record is written and removed, what it holds and never holds, the heartbeat,
//! damaged record files and unusable state directories. tfinit runs as PID 1 of a PID and UTS
//! namespace (a pod). The recovery of real locks is in tests/locks_*.rs.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Value};

use common::pods::{heartbeat_file, now_ms, walk, Place, Pod, PodSpec, NOBODY_UID, STEP};
use common::{tfinit, wait_for};

/// The pods' TFINIT_OWNER_TTL.
const TTL: Duration = Duration::from_secs(3);

/// A pod's world: a state dir, a working directory, the shim and a fake terraform (`script` is
/// its body; it sees $STATE, $OUT).
struct FakeWorld {
    place: Place,
    path: String,
}

impl std::ops::Deref for FakeWorld {
    type Target = Place;
    fn deref(&self) -> &Place {
        &self.place
    }
}

impl FakeWorld {
    fn new(name: &str, fake_terraform: &str) -> FakeWorld {
        let mut place = Place::new(name, None, TTL);
        let fake = place.tmp.join("fake");
        fs::create_dir_all(&fake).unwrap();
        let tf = fake.join("terraform");
        fs::write(&tf, format!("#!/bin/sh\n{fake_terraform}\n")).unwrap();
        fs::set_permissions(&tf, fs::Permissions::from_mode(0o755)).unwrap();
        let path = format!("{}:{}:/usr/bin:/bin", place.shim.display(), fake.display());
        place.terraform_dir = fake;
        let w = FakeWorld { place, path };
        w.give_to_pods();
        w
    }

    fn out(&self) -> PathBuf {
        self.tmp.join("out")
    }

    /// Starts a pod named `name` (as `uid` when given) whose controller is the sh `script`; the
    /// fake terraform sees $STATE and $OUT.
    fn pod(&self, name: &str, uid: Option<u32>, script: &str, env: &[(&str, &str)]) -> Pod {
        let mut all = vec![
            ("STATE", self.state.display().to_string()),
            ("OUT", self.out().display().to_string()),
        ];
        all.extend(env.iter().map(|(k, v)| (*k, v.to_string())));
        Pod::start(
            self,
            PodSpec {
                name,
                uid,
                script: script.to_string(),
                env: all,
            },
        )
    }

    fn record_files(&self) -> Vec<PathBuf> {
        let mut v: Vec<_> = fs::read_dir(self.state.join("records"))
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        v.retain(|p| {
            !p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(".tfinit")
        });
        v.sort();
        v
    }

    fn records(&self) -> Vec<Value> {
        self.record_files()
            .iter()
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .flat_map(|p| {
                common::pods::records_in(serde_json::from_slice(&fs::read(p).unwrap()).unwrap())
            })
            .collect()
    }
}

fn have_deps() -> bool {
    common::can_unshare()
}

/// For the tests whose pod runs as uid NOBODY_UID (setpriv): root only.
fn have_root() -> bool {
    common::require_root("the pod runs as uid 4321 (setpriv)")
}

/// The fake terraform copies the records dir as it is at its own start into $OUT.<n>, then exits
/// with $FAKE_EXIT.
const SNAPSHOT: &str = r#"n=$(ls -d "$OUT".[0-9]* 2>/dev/null | wc -l); n=$((n+1))
mkdir -p "$OUT.$n"; cp "$STATE"/records/*.json "$OUT.$n"/ 2>/dev/null
exit "${FAKE_EXIT:-0}""#;

fn snapshot(w: &FakeWorld, n: usize) -> Vec<Value> {
    let dir = PathBuf::from(format!("{}.{n}", w.out().display()));
    let mut v: Vec<Value> = fs::read_dir(&dir)
        .map(|rd| {
            rd.flatten()
                .flat_map(|e| {
                    common::pods::records_in(
                        serde_json::from_slice(&fs::read(e.path()).unwrap()).unwrap(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort_by_key(|r| r["run_id"].as_str().unwrap_or("").to_string());
    v
}

#[test]
fn the_record_is_on_disk_before_terraform_starts_and_gone_once_it_exits_by_itself() {
    if !have_deps() || !have_root() {
        return;
    }
    let w = FakeWorld::new("rec-life", SNAPSHOT);
    fs::create_dir_all(w.ws.join("sub")).unwrap();
    w.give_to_pods();
    let script = "terraform -chdir=sub apply -auto-approve -var=password=hunter2 -var 'token=abc123' \
                  -var-file=prod.tfvars -input=false && FAKE_EXIT=3 terraform destroy -auto-approve; \
                  echo \"codes $?\" > \"$OUT-codes\"; \
                  USER=alice HOME=/tmp terraform plan";
    let mut pod = w.pod(
        "pod-r",
        Some(NOBODY_UID),
        script,
        &[
            ("POD_UID", "6b1c-uid"),
            ("TF_VAR_db_password", "envsecret42"),
            ("AWS_SECRET_ACCESS_KEY", "envsecret43"),
        ],
    );
    assert!(pod.wait().success(), "{}", pod.log());
    assert_eq!(
        common::read(&w.tmp.join("out-codes")),
        "codes 3\n",
        "exit codes relayed"
    );

    // Each terraform saw its own record already on disk when it started.
    let boot = fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let first = snapshot(&w, 1);
    assert_eq!(first.len(), 1, "{first:?}");
    let r = &first[0];
    assert_eq!(r["v"], 4);
    assert_eq!(r["owner"]["name"], "pod-r");
    assert_eq!(r["owner"]["boot_id"], boot.trim());
    assert_eq!(r["owner"]["pid"], 1);
    assert_eq!(r["owner"]["pod_uid"], "6b1c-uid");
    let nonce = r["owner"]["nonce"].as_u64().expect("a nonce in the owner");
    assert!(
        w.state
            .join("owners")
            .read_dir()
            .unwrap()
            .flatten()
            .any(|e| e
                .file_name()
                .to_string_lossy()
                .ends_with(&format!("-{nonce:08x}.json"))),
        "the heartbeat file's name ends with the nonce"
    );
    assert!(r["owner"]["started_ms"].as_u64().unwrap() <= r["started_ms"].as_u64().unwrap());
    assert_eq!(
        r["who"], "@pod-r",
        "no passwd entry, no USER: an empty user"
    );
    assert_eq!(r["run_id"], "r1");
    assert_eq!(r["cwd"], w.ws.to_str().unwrap());
    assert_eq!(r["workdir"], w.ws.join("sub").to_str().unwrap());
    assert_eq!(r["workspace"], "default");
    assert_eq!(r["subcommand"], "apply");
    assert_eq!(
        r["argv"],
        json!([
            "-chdir=sub",
            "apply",
            "-auto-approve",
            "-var=<redacted>",
            "-var",
            "<redacted>",
            "-var-file=<redacted>",
            "-input=false"
        ])
    );
    assert_eq!(r["in_progress"], json!([]));
    assert!(r.get("ended").is_none());
    let second = snapshot(&w, 2);
    assert_eq!(second.len(), 1, "the first record was removed at exit 0");
    assert_eq!(second[0]["subcommand"], "destroy");
    assert_eq!(second[0]["run_id"], "r2");
    let third = snapshot(&w, 3);
    assert_eq!(third.len(), 1, "removed at exit 3 as well");
    assert_eq!(
        third[0]["who"], "alice@pod-r",
        "without a passwd entry Go takes $USER when $HOME is set too"
    );
    assert!(w.records().is_empty(), "{:?}", w.records());
    // Never a secret or an environment value, anywhere in the state directory.
    for f in walk(&w.state).into_iter().chain(walk(&w.tmp.join("out.1"))) {
        let body = common::read(&f);
        for secret in [
            "hunter2",
            "abc123",
            "prod.tfvars",
            "envsecret42",
            "envsecret43",
        ] {
            assert!(!body.contains(secret), "{secret} in {}", f.display());
        }
    }
}

#[test]
fn the_record_names_the_workspace_the_shim_read_in_the_runs_data_directory() {
    if !have_deps() {
        return;
    }
    let w = FakeWorld::new("rec-ws", SNAPSHOT);
    // -chdir=sub: the stored workspace is read in sub, not in the shim's cwd (which names another).
    fs::create_dir_all(w.ws.join("sub/.terraform")).unwrap();
    fs::create_dir_all(w.ws.join(".terraform")).unwrap();
    fs::create_dir_all(w.ws.join("sub/data")).unwrap();
    fs::write(w.ws.join("sub/.terraform/environment"), "staging\n").unwrap();
    fs::write(w.ws.join(".terraform/environment"), "wrong").unwrap();
    fs::write(w.ws.join("sub/data/environment"), "moved").unwrap();
    w.give_to_pods();
    let script = "terraform -chdir=sub apply -auto-approve && \
                  TF_DATA_DIR=data terraform -chdir=sub apply -auto-approve && \
                  TF_WORKSPACE=prod terraform -chdir=sub apply -auto-approve && \
                  TF_DATA_DIR=nowhere terraform -chdir=sub apply -auto-approve";
    // As a uid without a passwd entry where that can be done (root); a normal user's pod runs as
    // that user, which reads the same workspace files.
    let uid = common::is_root().then_some(NOBODY_UID);
    let mut pod = w.pod("pod-ws", uid, script, &[]);
    assert!(pod.wait().success(), "{}", pod.log());
    let workspace = |n: usize| {
        let recs = snapshot(&w, n);
        assert_eq!(recs.len(), 1, "run {n}: {recs:?}");
        recs[0]["workspace"].as_str().unwrap_or("").to_string()
    };
    assert_eq!(
        workspace(1),
        "staging",
        ".terraform/environment in cwd + -chdir"
    );
    assert_eq!(workspace(2), "moved", "$TF_DATA_DIR/environment");
    assert_eq!(
        workspace(3),
        "prod",
        "TF_WORKSPACE comes before the stored one"
    );
    assert_eq!(workspace(4), "default", "no stored workspace: default");
}

#[test]
fn commands_that_take_no_lock_write_no_record() {
    if !have_deps() {
        return;
    }
    let w = FakeWorld::new(
        "rec-nolock",
        r#"ls "$STATE"/records/*.json 2>/dev/null | wc -l | tr -d ' ' >> "$OUT""#,
    );
    let none = [
        "output -json",
        "show -json",
        "version",
        "validate",
        "providers",
        "state list",
        "state pull",
        "workspace select default",
        "plan -lock=false",
        "plan -lock=true -lock=0",
        "apply -lock=false -auto-approve",
        "apply -auto-approve -help",
        "force-unlock -force 1234",
    ];
    let locking = [
        "plan",
        "apply -auto-approve",
        "destroy -auto-approve",
        "refresh",
        "import a.b id",
        "taint a.b",
        "untaint a.b",
        "state rm a.b",
        "state mv a.b a.c",
        "state push x.tfstate",
        "state replace-provider -auto-approve a b",
        // Go's flag package: the last -lock wins, and flags end at the first operand.
        "plan -lock=false -lock=true",
        "apply plan.tfplan -lock=false",
        // A remote backend's StateMgr takes the lock to create a missing state, whatever -lock
        // says: init (even -backend=false, which loads the backend the last init stored),
        // workspace new, workspace select -or-create.
        "init -input=false",
        "init -input=false -lock=false",
        "init -input=false -backend=false",
        "workspace new -lock=false feature",
        "workspace select -or-create feature",
    ];
    // A finished run's record is removed by the recorder right after the shim got its exit code:
    // before the next command, wait (with a deadline) until it is gone, so each count is its own.
    let gone = r#"i=0; while ls "$STATE"/records/*.json >/dev/null 2>&1; do i=$((i+1)); if [ $i -gt 500 ]; then echo "a finished run's record stayed 5 s" >> "$OUT"; break; fi; sleep 0.01; done; "#;
    let script: String = none
        .iter()
        .chain(locking.iter())
        .map(|c| format!("terraform {c}; {gone}"))
        .collect();
    let mut pod = w.pod("pod-r", None, &script, &[]);
    assert!(pod.wait().success(), "{}", pod.log());
    let counts: Vec<String> = common::read(&w.out()).lines().map(str::to_string).collect();
    assert_eq!(counts.len(), none.len() + locking.len(), "{counts:?}");
    for (c, n) in none.iter().chain(locking.iter()).zip(&counts) {
        let want = if none.contains(c) { "0" } else { "1" };
        assert_eq!(n, want, "records while `terraform {c}` ran");
    }
}

#[test]
fn a_terraform_that_may_have_left_its_lock_keeps_its_record_marked_with_how_it_ended() {
    if !have_deps() {
        return;
    }
    // $HOW picks the ending; the record is on disk with the in-progress set before it.
    let w = FakeWorld::new(
        "rec-ended",
        r#"[ "$HOW" = none ] && exit 0
echo "null_resource.x: Creating..."
f=$(grep -l "/$HOW\"" "$STATE"/records/*.json)
i=0; until grep -q null_resource.x "$f"; do
  i=$((i+1)); [ $i -gt 1200 ] && { echo "waited 60 s for null_resource.x in the record $f" >&2; exit 3; }
  sleep 0.05; done
case "$HOW" in
  kill) kill -9 $$ ;;
  panicwrap) exit 255 ;;
  release) printf '\nError: Error releasing the state lock\n\n' >&2; exit 1 ;;
  *) exit 1 ;;
esac"#,
    );
    for d in ["kill", "panicwrap", "release", "fail"] {
        fs::create_dir_all(w.ws.join(d)).unwrap();
    }
    w.give_to_pods();
    let script = "for h in kill panicwrap release fail; do (cd $h && HOW=$h terraform apply -auto-approve); done; true";
    let mut pod = w.pod("pod-r", None, script, &[]);
    assert!(pod.wait().success(), "{}", pod.log());
    assert!(!pod.log().contains("waited 60 s"), "{}", pod.log());
    let recs = w.records();
    let by_dir = |d: &str| {
        recs.iter()
            .find(|r| r["workdir"].as_str().unwrap().ends_with(&format!("/{d}")))
            .cloned()
    };
    for (d, how) in [
        ("kill", "killed by SIGKILL"),
        ("panicwrap", "exit code 255"),
        ("release", "Error releasing the state lock"),
    ] {
        let r = by_dir(d).unwrap_or_else(|| panic!("record of {d} kept: {recs:?}"));
        let ended = r["ended"]["how"].as_str().unwrap();
        assert!(ended.contains(how), "{d}: {ended}");
        assert!(r["ended"]["ms"].as_u64().unwrap() >= r["started_ms"].as_u64().unwrap());
        assert_eq!(r["in_progress"], json!(["null_resource.x"]), "{d}");
    }
    assert!(
        by_dir("fail").is_none(),
        "a plain failure exits by itself: removed"
    );
    assert_eq!(recs.len(), 3);

    // The next state-locking run in such a directory checks first. `kill` is initialised with
    // local state (a data directory without a backend), whose lock ends with its process: the
    // record just goes. `panicwrap` was never initialised: its backend is unknown (a new pod's
    // fresh directory before its first init), so its record stays.
    fs::create_dir_all(w.ws.join("kill/.terraform")).unwrap();
    let mut pod = w.pod(
        "pod-r",
        None,
        "(cd kill && HOW=none terraform plan); (cd panicwrap && HOW=none terraform plan)",
        &[],
    );
    pod.wait();
    let log = pod.log();
    assert!(
        log.contains("lock ends with its process; record removed"),
        "{log}"
    );
    assert!(
        log.contains("is not initialised") && log.contains("could not read the state lock"),
        "{log}"
    );
    assert_eq!(w.records().len(), 2);
    assert!(by_dir("panicwrap").is_some());
}

/// The promise (docs/records.md): the heartbeat is refreshed every third of the TTL, so a reader
/// never sees it older than TTL/3, plus 1 s of slack for a loaded machine. Checked at every read
/// while the pod lives (4 s, more than one period); how regular the beats are is the benchmarks'
/// business, not a test's.
#[test]
fn the_heartbeat_is_refreshed_every_third_of_the_ttl() {
    if !have_deps() {
        return;
    }
    let w = FakeWorld::new("rec-heartbeat", "exit 0");
    let mut pod = w.pod("pod-r", None, "sleep 4", &[]);
    let read = || -> Option<(u64, Value, SystemTime)> {
        let hb_file = heartbeat_file(&w.state, "pod-r")?;
        let v: Value = serde_json::from_slice(&fs::read(&hb_file).ok()?).ok()?;
        let mtime = fs::metadata(&hb_file).ok()?.modified().ok()?;
        Some((v["updated_ms"].as_u64()?, v, mtime))
    };
    let (first, hb, first_mtime) = wait_for(STEP, "the first heartbeat", read);
    assert_eq!(hb["v"], 2);
    let mut seq = hb["seq"].as_u64().expect("a sequence number");
    assert_eq!(hb["owner"]["name"], "pod-r");
    let bound = TTL.as_millis() as u64 / 3 + 1000;
    let mut beats = vec![first];
    // Between beats the recorder's thread ends (it is started again for each): the idle init is
    // one thread.
    let pid1 = pod.pid1();
    let mut threads_seen = Vec::new();
    let deadline = Instant::now() + STEP;
    while pod.child.try_wait().expect("try_wait the pod").is_none() {
        if let Ok(tasks) = fs::read_dir(format!("/proc/{pid1}/task")) {
            let n = tasks.count();
            if !threads_seen.contains(&n) {
                threads_seen.push(n);
            }
        }
        assert!(
            Instant::now() < deadline,
            "the pod (sh -c 'sleep 4') still runs after {STEP:?}"
        );
        if let Some((ms, v, mtime)) = read() {
            let age = now_ms().saturating_sub(ms);
            assert!(
                age <= bound,
                "the heartbeat is {age} ms old, more than TTL/3 + 1 s = {bound} ms; beats {beats:?}"
            );
            if ms != *beats.last().unwrap() {
                assert_eq!(v["owner"], hb["owner"], "the same incarnation");
                assert!(mtime > first_mtime);
                assert!(
                    ms > *beats.last().unwrap(),
                    "beats go forward: {beats:?} then {ms}"
                );
                let next = v["seq"].as_u64().expect("a sequence number");
                assert!(
                    next > seq,
                    "each beat has a new sequence number: {seq} then {next}"
                );
                seq = next;
                beats.push(ms);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(pod.wait().success(), "{}", pod.log());
    // Over 4 s with an age bound of 2 s, the heartbeat must have been refreshed.
    assert!(beats.len() >= 2, "no refresh in 4 s: {beats:?}");
    assert!(
        threads_seen.contains(&1),
        "the init never ran as one thread between heartbeats (thread counts seen: {threads_seen:?})"
    );
}

/// Progress is written as soon as it is seen (issue: 5 of 78 orphans in the chaos run died inside
/// the old once-a-second window, unnamed). The stand-in terraform prints one line, then waits
/// until the record on the volume shows the set that line makes, before printing the next: each
/// set is in the record before the next line is printed. `RECORD_WAIT` bounds each wait (a
/// deadline for a loaded machine, not a measurement: the figure is in scripts/bench-storage.sh).
#[test]
fn each_in_progress_set_is_in_the_record_before_terraform_prints_its_next_line() {
    if !have_deps() {
        return;
    }
    const RECORD_WAIT_CS: u32 = 1000;
    let w = FakeWorld::new(
        "rec-progress",
        &format!(
            r#"shows() {{ i=0; while [ $i -lt {RECORD_WAIT_CS} ]; do
  cat "$STATE"/records/*.json 2>/dev/null | tr -d ' \n' | grep -qF "\"in_progress\":$1" && return 0
  i=$((i+1)); sleep 0.01; done
  echo "waited {RECORD_WAIT_CS} cs for the record to show in_progress $1" >&2; exit 3; }}
echo 'null_resource.a: Creating...'; shows '["null_resource.a"]'
echo 'null_resource.b[0]: Creating...'; shows '["null_resource.a","null_resource.b[0]"]'
echo 'null_resource.a: Creation complete after 0s [id=1]'; shows '["null_resource.b[0]"]'
echo 'module.m.null_resource.c["x"]: Creating...'; shows '["module.m.null_resource.c[\"x\"]","null_resource.b[0]"]'
echo 'null_resource.b[0]: Creation complete after 1s [id=2]'; shows '["module.m.null_resource.c[\"x\"]"]'
echo 'module.m.null_resource.c["x"]: Creation complete after 1s [id=3]'; shows '[]'"#
        ),
    );
    let mut pod = w.pod("pod-r", None, "terraform apply -auto-approve", &[]);
    assert!(pod.wait().success(), "{}", pod.log());
    let log = pod.log();
    assert!(!log.contains("waited"), "{log}");
    assert!(
        w.records().is_empty(),
        "terraform exited by itself: its record is removed"
    );
    // Negative case: a set that no line makes never shows, so the wait gives up with its message.
    let w = FakeWorld::new(
        "rec-progress-neg",
        r#"i=0; while [ $i -lt 100 ]; do
  cat "$STATE"/records/*.json 2>/dev/null | tr -d ' \n' | grep -qF '"in_progress":["null_resource.z"]' && exit 0
  i=$((i+1)); sleep 0.01; done
echo "waited 100 cs for the record to show in_progress z" >&2; exit 3"#,
    );
    let mut pod = w.pod("pod-n", None, "terraform apply -auto-approve", &[]);
    assert!(!pod.wait().success(), "{}", pod.log());
    assert!(pod.log().contains("waited 100 cs"), "{}", pod.log());
}

#[test]
fn unreadable_record_files_are_set_aside_and_never_stop_the_init() {
    if !have_deps() || !have_root() {
        return;
    }
    let w = FakeWorld::new("rec-corrupt", "exit 0");
    let records = w.state.join("records");
    fs::create_dir_all(&records).unwrap();
    let good = json!({
        "v": 1,
        "owner": {"name": "pod-x", "boot_id": "b", "started_ms": 1, "pid": 1},
        "who": "@pod-x", "run_id": "r1", "workdir": w.ws, "subcommand": "apply",
        "argv": ["apply"], "started_ms": 2, "updated_ms": 2,
    })
    .to_string();
    let future = json!({"v": 5, "owner": {"name": "pod-y"}, "workdir": w.ws, "new_field": [1, 2]})
        .to_string();
    let files: [(&str, &[u8]); 4] = [
        ("truncated.json", &good.as_bytes()[..good.len() / 2]),
        ("empty.json", b""),
        ("garbage.json", b"\xff\xfe\x00garbage{{{"),
        ("future.json", future.as_bytes()),
    ];
    for (name, bytes) in files {
        fs::write(records.join(name), bytes).unwrap();
    }
    w.give_to_pods();

    // A dry run reports them and changes nothing.
    let dry = common::run_output(
        Command::new(tfinit())
            .args(["recover", "--dry-run"])
            .env_clear()
            .env("PATH", &w.path)
            .env("TFINIT_STATE_DIR", &w.state),
        STEP,
    );
    let dry_text = String::from_utf8_lossy(&dry.stderr).to_string();
    assert_eq!(
        dry_text.matches("cannot be read (dry run").count(),
        3,
        "{dry_text}"
    );
    assert_eq!(w.record_files().len(), 4);

    let mut pod = w.pod(
        "pod-r",
        Some(NOBODY_UID),
        "terraform apply -auto-approve && terraform apply -auto-approve",
        &[],
    );
    let st = pod.wait();
    let log = pod.log();
    assert!(st.success(), "{log}");
    assert_eq!(log.matches("was renamed aside").count(), 3, "{log}");
    assert_eq!(
        log.matches("of a newer tfinit format is left alone")
            .count(),
        1,
        "{log}"
    );
    let names: Vec<String> = w
        .record_files()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().to_string())
        .collect();
    assert_eq!(
        names,
        [
            "empty.json.corrupt",
            "future.json",
            "garbage.json.corrupt",
            "truncated.json.corrupt"
        ]
    );
    assert_eq!(common::read(&records.join("future.json")), future);
    assert_eq!(
        fs::read(records.join("truncated.json.corrupt")).unwrap(),
        &good.as_bytes()[..good.len() / 2]
    );
}

#[test]
fn an_unusable_state_dir_gives_one_warning_and_terraform_still_runs() {
    if !have_deps() || !have_root() {
        return;
    }
    for case in ["missing", "a file", "read-only"] {
        let w = FakeWorld::new("rec-unusable", "exit 0");
        let dir = w.tmp.join("unusable");
        match case {
            "missing" => {}
            "a file" => fs::write(&dir, b"not a directory").unwrap(),
            _ => {
                // Owned by root, mode 0755: not writable for the pod's uid.
                fs::create_dir_all(&dir).unwrap();
                fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
            }
        }
        let dir_s = dir.to_str().unwrap().to_string();
        let mut pod = w.pod(
            "pod-r",
            Some(NOBODY_UID),
            "terraform apply -auto-approve && terraform plan && sleep 1.5",
            &[("TFINIT_STATE_DIR", &dir_s)],
        );
        let st = pod.wait();
        let log = pod.log();
        assert!(st.success(), "{case}: {log}");
        assert_eq!(
            log.matches("the lock-owner record store is not usable")
                .count(),
            1,
            "{case}: {log}"
        );
        assert_eq!(log.matches("terraform exited").count(), 2, "{case}: {log}");
        assert!(
            !log.contains("cannot write the lock-owner record"),
            "{case}: {log}"
        );
        assert!(!log.contains("heartbeat"), "{case}: {log}");
        if case == "read-only" {
            assert_eq!(fs::read_dir(&dir).unwrap().count(), 0, "nothing written");
        }
    }
}

//! Lock-owner records and heartbeats on disk, with a fake terraform (an sh script after the shim on
//! PATH): when a record is written and removed, what it holds and never holds, the heartbeat,
//! damaged record files and unusable state directories. tfinit runs as PID 1 of a PID and UTS
//! namespace (a pod). The recovery of real locks is in tests/locks.rs.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use common::{shim_dir, tfinit, wait_for, TempDir};

/// A uid without a passwd entry.
const NOBODY_UID: u32 = 4321;

/// Bound for anything that takes a few seconds at most.
const STEP: Duration = Duration::from_secs(60);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A pod's world: a state dir, a working directory, the shim and a fake terraform (`script` is
/// its body; it sees $STATE, $OUT).
struct World {
    tmp: TempDir,
    state: PathBuf,
    ws: PathBuf,
    path: String,
}

impl World {
    fn new(name: &str, fake_terraform: &str) -> World {
        let tmp = TempDir::new(name);
        let state = tmp.join("state");
        let ws = tmp.join("ws");
        fs::create_dir_all(&state).unwrap();
        fs::create_dir_all(&ws).unwrap();
        let fake = tmp.join("fake");
        fs::create_dir_all(&fake).unwrap();
        let tf = fake.join("terraform");
        fs::write(&tf, format!("#!/bin/sh\n{fake_terraform}\n")).unwrap();
        fs::set_permissions(&tf, fs::Permissions::from_mode(0o755)).unwrap();
        let path = format!(
            "{}:{}:/usr/bin:/bin",
            shim_dir(&tmp).display(),
            fake.display()
        );
        let w = World {
            tmp,
            state,
            ws,
            path,
        };
        w.chown_all();
        w
    }

    fn chown_all(&self) {
        let st = Command::new("chown")
            .args(["-R", &format!("{NOBODY_UID}:{NOBODY_UID}")])
            .arg(&self.tmp.0)
            .status()
            .unwrap();
        assert!(st.success());
    }

    fn out(&self) -> PathBuf {
        self.tmp.join("out")
    }

    /// Starts a pod named `name` (as `uid` when given) whose controller is the sh `script`.
    fn pod(&self, name: &str, uid: Option<u32>, script: &str, env: &[(&str, &str)]) -> Pod {
        let log = self.tmp.join(&format!("{name}-{}.log", now_ms()));
        let f = fs::File::create(&log).unwrap();
        let drop_privileges = match uid {
            Some(u) => format!("setpriv --reuid {u} --regid {u} --clear-groups "),
            None => String::new(),
        };
        let mut c = Command::new("unshare");
        c.args(["--pid", "--fork", "--mount-proc", "--kill-child", "--uts"])
            .arg("sh")
            .arg("-c")
            .arg(format!(
                "hostname {name} && exec {drop_privileges}\"$0\" \"$@\""
            ))
            .arg(tfinit())
            .args(["--", "sh", "-c", script])
            .current_dir(&self.ws)
            .env_clear()
            .env("PATH", &self.path)
            .env("STATE", &self.state)
            .env("OUT", self.out())
            .env("TFINIT_STATE_DIR", &self.state)
            .env("TFINIT_RUN_DIR", self.tmp.join(&format!("run-{name}")))
            .env("TFINIT_OWNER_TTL", "3s")
            .env("TFINIT_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f);
        for (k, v) in env {
            c.env(k, v);
        }
        Pod {
            child: c.spawn().unwrap(),
            log,
        }
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
            .map(|p| serde_json::from_slice(&fs::read(p).unwrap()).unwrap())
            .collect()
    }
}

struct Pod {
    child: Child,
    log: PathBuf,
}

impl Pod {
    fn wait(&mut self) -> ExitStatus {
        common::wait_child(&mut self.child, STEP, "pod")
    }

    fn log(&self) -> String {
        common::read(&self.log)
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn have_deps() -> bool {
    common::require(common::is_root(), "root (PID namespaces, setpriv)")
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// The fake terraform copies the records dir as it is at its own start into $OUT.<n>, then exits
/// with $FAKE_EXIT.
const SNAPSHOT: &str = r#"n=$(ls -d "$OUT".[0-9]* 2>/dev/null | wc -l); n=$((n+1))
mkdir -p "$OUT.$n"; cp "$STATE"/records/*.json "$OUT.$n"/ 2>/dev/null
exit "${FAKE_EXIT:-0}""#;

fn snapshot(w: &World, n: usize) -> Vec<Value> {
    let dir = PathBuf::from(format!("{}.{n}", w.out().display()));
    let mut v: Vec<Value> = fs::read_dir(&dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| serde_json::from_slice(&fs::read(e.path()).unwrap()).unwrap())
                .collect()
        })
        .unwrap_or_default();
    v.sort_by_key(|r| r["run_id"].as_str().unwrap_or("").to_string());
    v
}

#[test]
fn the_record_is_on_disk_before_terraform_starts_and_gone_once_it_exits_by_itself() {
    if !have_deps() {
        return;
    }
    let w = World::new("rec-life", SNAPSHOT);
    fs::create_dir_all(w.ws.join("sub")).unwrap();
    w.chown_all();
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
    assert_eq!(r["v"], 1);
    assert_eq!(r["owner"]["name"], "pod-r");
    assert_eq!(r["owner"]["boot_id"], boot.trim());
    assert_eq!(r["owner"]["pid"], 1);
    assert_eq!(r["owner"]["pod_uid"], "6b1c-uid");
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
fn commands_that_take_no_lock_write_no_record() {
    if !have_deps() {
        return;
    }
    let w = World::new(
        "rec-nolock",
        r#"ls "$STATE"/records/*.json 2>/dev/null | wc -l | tr -d ' ' >> "$OUT""#,
    );
    let none = [
        "init -input=false",
        "output -json",
        "show -json",
        "version",
        "validate",
        "providers",
        "state list",
        "state pull",
        "workspace select default",
        "plan -lock=false",
        "apply -lock=false -auto-approve",
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
    ];
    let script: String = none
        .iter()
        .chain(locking.iter())
        .map(|c| format!("terraform {c}; "))
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
    let w = World::new(
        "rec-ended",
        r#"[ "$HOW" = none ] && exit 0
echo "null_resource.x: Creating..."
f=$(grep -l "/$HOW\"" "$STATE"/records/*.json)
while ! grep -q null_resource.x "$f"; do sleep 0.05; done
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
    w.chown_all();
    let script = "for h in kill panicwrap release fail; do (cd $h && HOW=$h terraform apply -auto-approve); done; true";
    let mut pod = w.pod("pod-r", None, script, &[]);
    assert!(pod.wait().success(), "{}", pod.log());
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

    // The next state-locking run in such a directory checks first; these directories were never
    // initialised (local state), whose lock ends with its process: the record just goes.
    let mut pod = w.pod("pod-r", None, "cd kill && HOW=none terraform plan", &[]);
    pod.wait();
    let log = pod.log();
    assert!(
        log.contains("lock ends with its process; record removed"),
        "{log}"
    );
    assert_eq!(w.records().len(), 2);
}

#[test]
fn the_heartbeat_is_refreshed_every_third_of_the_ttl() {
    if !have_deps() {
        return;
    }
    let w = World::new("rec-heartbeat", "exit 0");
    let mut pod = w.pod("pod-r", None, "sleep 4", &[]);
    let hb_file = w.state.join("owners/pod-r.json");
    let read = || -> Option<(u64, Value, SystemTime)> {
        let v: Value = serde_json::from_slice(&fs::read(&hb_file).ok()?).ok()?;
        let mtime = fs::metadata(&hb_file).ok()?.modified().ok()?;
        Some((v["updated_ms"].as_u64()?, v, mtime))
    };
    let (first, hb, first_mtime) = wait_for(STEP, "the first heartbeat", read);
    assert_eq!(hb["v"], 1);
    assert_eq!(hb["owner"]["name"], "pod-r");
    let mut beats = vec![first];
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(2600) {
        if let Some((ms, v, mtime)) = read() {
            if ms != *beats.last().unwrap() {
                assert_eq!(v["owner"], hb["owner"], "the same incarnation");
                assert!(mtime > first_mtime);
                beats.push(ms);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(pod.wait().success());
    // TTL 3s: a beat every 1s, so two more within 2.6s, each about 1s after the last.
    assert!(beats.len() >= 3, "{beats:?}");
    for pair in beats.windows(2) {
        let gap = pair[1] - pair[0];
        assert!((900..=1600).contains(&gap), "gap {gap} ms in {beats:?}");
    }
}

#[test]
fn the_in_progress_set_follows_the_output_and_is_rewritten_at_most_once_a_second() {
    if !have_deps() {
        return;
    }
    let w = World::new(
        "rec-progress",
        r#"echo 'null_resource.a: Creating...'; echo 'null_resource.b[0]: Creating...'
sleep 0.2; echo 'null_resource.a: Creation complete after 0s [id=1]'
sleep 0.2; echo 'module.m.null_resource.c["x"]: Creating...'
sleep 1.2; echo 'null_resource.b[0]: Creation complete after 1s [id=2]'
sleep 2.5"#,
    );
    let mut pod = w.pod("pod-r", None, "terraform apply -auto-approve", &[]);
    let mut seen: Vec<(u64, Value)> = Vec::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(6) {
        if let Some(r) = w.records().first() {
            let ms = r["updated_ms"].as_u64().unwrap();
            if seen.last().map(|(m, _)| *m) != Some(ms) {
                seen.push((ms, r["in_progress"].clone()));
            }
        }
        if pod.child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(pod.wait().success(), "{}", pod.log());
    let sets: Vec<&Value> = seen.iter().map(|(_, s)| s).collect();
    assert_eq!(
        sets.last().copied(),
        Some(&json!(["module.m.null_resource.c[\"x\"]"])),
        "{seen:?}"
    );
    assert!(
        sets.contains(&&json!([
            "module.m.null_resource.c[\"x\"]",
            "null_resource.b[0]"
        ])),
        "{seen:?}"
    );
    for pair in seen.windows(2) {
        assert!(
            pair[1].0 - pair[0].0 >= 990,
            "rewritten {} ms apart: {seen:?}",
            pair[1].0 - pair[0].0
        );
    }
    assert!(w.records().is_empty());
}

#[test]
fn unreadable_record_files_are_set_aside_and_never_stop_the_init() {
    if !have_deps() {
        return;
    }
    let w = World::new("rec-corrupt", "exit 0");
    let records = w.state.join("records");
    fs::create_dir_all(&records).unwrap();
    let good = json!({
        "v": 1,
        "owner": {"name": "pod-x", "boot_id": "b", "started_ms": 1, "pid": 1},
        "who": "@pod-x", "run_id": "r1", "workdir": w.ws, "subcommand": "apply",
        "argv": ["apply"], "started_ms": 2, "updated_ms": 2,
    })
    .to_string();
    let future = json!({"v": 2, "owner": {"name": "pod-y"}, "workdir": w.ws, "new_field": [1, 2]})
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
    w.chown_all();

    // A dry run reports them and changes nothing.
    let dry = Command::new(tfinit())
        .args(["recover", "--dry-run"])
        .env_clear()
        .env("PATH", &w.path)
        .env("TFINIT_STATE_DIR", &w.state)
        .output()
        .unwrap();
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
    if !have_deps() {
        return;
    }
    for case in ["missing", "a file", "read-only"] {
        let w = World::new("rec-unusable", "exit 0");
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
            log.matches("TFINIT_STATE_DIR is not usable").count(),
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

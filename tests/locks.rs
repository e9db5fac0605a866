//! Stuck state locks and their safe release, end to end against a real remote backend: terraform
//! 1.0.3 with the s3 backend on moto (S3 + a DynamoDB lock table, one server per test, stopped
//! when the test ends, also on failure). Pods are PID namespaces with their own hostname and a
//! shared TFINIT_STATE_DIR; "the pod dies" is SIGKILL of its PID 1, so everything in it dies at
//! once, as on a node loss. Controllers are small sh loops that retry `terraform apply` like a
//! provider's reconcile loop.
//!
//! Facts these tests rely on are in docs/notes/terraform-facts.md; the rules in docs/records.md.

mod common;

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use common::{deps, shim_dir, tfinit, wait_for, TempDir};

/// TFINIT_OWNER_TTL of the pods (short, so a dead owner is seen dead quickly).
const TTL: Duration = Duration::from_secs(3);

/// The pause between two attempts of a controller loop.
const RETRY: Duration = Duration::from_secs(1);

/// A uid without a passwd entry: terraform writes its Who as `@<hostname>`.
const NOBODY_UID: u32 = 4321;

/// Bound for steps that take a few seconds at most.
const STEP: Duration = Duration::from_secs(60);

/// The state key every test uses (each test has its own moto server).
const STATE: &str = "tfstate/tfinit/terraform.tfstate";

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Whether everything these tests need is here (root, terraform, the null provider, moto).
fn have_deps() -> bool {
    common::require(common::is_root(), "root (PID namespaces, setpriv)")
        && common::require(
            deps().join("bin/terraform").is_file(),
            ".test-deps/bin/terraform (scripts/install-test-deps.sh)",
        )
        && common::require(
            deps()
                .join("plugins/registry.terraform.io/hashicorp/null")
                .is_dir(),
            ".test-deps/plugins with hashicorp/null",
        )
        && common::require(
            deps().join("venv/bin/moto_server").is_file(),
            ".test-deps/venv/bin/moto_server",
        )
        && common::require(
            Path::new("/usr/bin/setpriv").exists() || Path::new("/bin/setpriv").exists(),
            "setpriv (util-linux)",
        )
}

// ----- moto -----

/// A moto server (S3 + DynamoDB) on 127.0.0.1 for one test, with bucket `tfstate` and lock table
/// `tflock`. Killed on drop, so also when the test panics; and by the kernel if the test thread
/// dies without unwinding (PR_SET_PDEATHSIG).
struct Moto {
    child: Child,
    port: u16,
}

impl Moto {
    fn start(tmp: &TempDir) -> Moto {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = fs::File::create(tmp.join("moto.log")).unwrap();
        let mut cmd = Command::new(deps().join("venv/bin/moto_server"));
        cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        // SAFETY: prctl is async-signal-safe and touches no memory of ours.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd.spawn().expect("start moto_server");
        let moto = Moto { child, port };
        wait_for(Duration::from_secs(30), "moto_server to answer", || {
            http(port, "GET", "/moto-api/", "", "").ok()
        });
        let (status, body) = http(port, "PUT", "/tfstate", "s3", "").unwrap();
        assert_eq!(status, 200, "create bucket: {body}");
        let table = json!({
            "TableName": "tflock",
            "AttributeDefinitions": [{"AttributeName": "LockID", "AttributeType": "S"}],
            "KeySchema": [{"AttributeName": "LockID", "KeyType": "HASH"}],
            "BillingMode": "PAY_PER_REQUEST",
        });
        moto.dynamodb("CreateTable", &table);
        moto
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn dynamodb(&self, op: &str, body: &Value) -> Value {
        let (status, text) = http(self.port, "POST", op, "dynamodb", &body.to_string()).unwrap();
        assert_eq!(status, 200, "DynamoDB {op}: {text}");
        serde_json::from_str(&text).unwrap()
    }

    /// The lock item's Info (terraform's LockInfo JSON), if the state is locked.
    fn lock(&self) -> Option<Value> {
        let item = self.dynamodb(
            "GetItem",
            &json!({"TableName": "tflock", "Key": {"LockID": {"S": STATE}}}),
        );
        let info = item.get("Item")?.get("Info")?.get("S")?.as_str()?;
        Some(serde_json::from_str(info).unwrap())
    }

    /// Every item of the lock table (locks and the `-md5` digests).
    fn items(&self) -> Vec<Value> {
        let scan = self.dynamodb("Scan", &json!({"TableName": "tflock"}));
        scan["Items"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 request to moto. `service` names the AWS service in a (fake) SigV4 header, which
/// is how moto routes a request; for DynamoDB `path` is the operation.
fn http(
    port: u16,
    method: &str,
    path: &str,
    service: &str,
    body: &str,
) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut head = String::new();
    let target = if service == "dynamodb" {
        head.push_str(&format!("X-Amz-Target: DynamoDB_20120810.{path}\r\n"));
        head.push_str("Content-Type: application/x-amz-json-1.0\r\n");
        "/"
    } else {
        path
    };
    if !service.is_empty() {
        head.push_str(&format!(
            "Authorization: AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/{service}/aws4_request, SignedHeaders=host, Signature=0\r\n"
        ));
    }
    write!(
        s,
        "{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Length: {}\r\n{head}\r\n{body}",
        body.len()
    )?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let status = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

// ----- workspace, terraform -----

/// A test's world: one moto, one terraform working directory (initialised), a shared state dir.
struct World {
    tmp: TempDir,
    moto: Moto,
    ws: PathBuf,
    state: PathBuf,
    shim: PathBuf,
}

impl World {
    fn new(name: &str) -> World {
        let tmp = TempDir::new(name);
        let moto = Moto::start(&tmp);
        let ws = tmp.join("ws");
        fs::create_dir_all(&ws).unwrap();
        fs::copy(
            common::repo().join("tests/fixtures/s3/main.tf"),
            ws.join("main.tf"),
        )
        .unwrap();
        let state = tmp.join("state");
        fs::create_dir_all(&state).unwrap();
        let shim = shim_dir(&tmp);
        let w = World {
            tmp,
            moto,
            ws,
            state,
            shim,
        };
        let out = w.terraform(&[
            "init",
            "-input=false",
            "-no-color",
            &format!("-plugin-dir={}", deps().join("plugins").display()),
            &format!("-backend-config=endpoint={}", w.moto.endpoint()),
            &format!("-backend-config=dynamodb_endpoint={}", w.moto.endpoint()),
        ]);
        assert!(out.status.success(), "terraform init: {}", text(&out));
        // Pods may run as a uid without a passwd entry.
        let st = Command::new("chown")
            .args(["-R", &format!("{NOBODY_UID}:{NOBODY_UID}")])
            .arg(&w.tmp.0)
            .status()
            .unwrap();
        assert!(st.success());
        w
    }

    /// Runs the real terraform directly (not through tfinit) in the working directory, as root.
    fn terraform(&self, args: &[&str]) -> std::process::Output {
        let mut c = Command::new(deps().join("bin/terraform"));
        c.args(args)
            .current_dir(&self.ws)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", "/root")
            .env("CHECKPOINT_DISABLE", "1")
            .env("TF_VAR_sleep", "0")
            .stdin(Stdio::null());
        common::run_output(&mut c, STEP)
    }

    /// Asserts the state is whole: no lock, nothing left to do, every resource in it.
    fn assert_state_consistent(&self) {
        assert_eq!(self.moto.lock(), None, "the lock must be free");
        let locks: Vec<_> = self
            .moto
            .items()
            .into_iter()
            .filter(|i| !i["LockID"]["S"].as_str().unwrap_or("").ends_with("-md5"))
            .collect();
        assert!(locks.is_empty(), "lock table: {locks:?}");
        let plan = self.terraform(&[
            "plan",
            "-detailed-exitcode",
            "-input=false",
            "-no-color",
            "-lock-timeout=0s",
        ]);
        assert_eq!(
            plan.status.code(),
            Some(0),
            "plan must find nothing to do: {}",
            text(&plan)
        );
        let list = self.terraform(&["state", "list"]);
        let names = String::from_utf8_lossy(&list.stdout).to_string();
        for r in ["null_resource.a", "null_resource.b", "null_resource.c"] {
            assert!(names.lines().any(|l| l == r), "{r} in state: {names}");
        }
    }

    fn records(&self) -> Vec<(PathBuf, Value)> {
        records(&self.state)
    }

    /// Writes a record file by hand (the format of docs/records.md).
    fn plant_record(&self, file: &str, rec: &Value) -> PathBuf {
        let dir = self.state.join("records");
        fs::create_dir_all(&dir).unwrap();
        let p = dir.join(file);
        fs::write(&p, serde_json::to_vec_pretty(rec).unwrap()).unwrap();
        self.give_state_to_pods();
        p
    }

    /// Writes an owner's heartbeat by hand.
    fn plant_heartbeat(&self, owner: &str, hb: &Value) {
        let dir = self.state.join("owners");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(format!("{owner}.json")), hb.to_string()).unwrap();
        self.give_state_to_pods();
    }

    /// Files made by the test (root) become the pods' (uid NOBODY_UID), as on a shared volume.
    fn give_state_to_pods(&self) {
        let st = Command::new("chown")
            .args(["-R", &format!("{NOBODY_UID}:{NOBODY_UID}")])
            .arg(&self.state)
            .status()
            .unwrap();
        assert!(st.success());
    }
}

fn records(state: &Path) -> Vec<(PathBuf, Value)> {
    let Ok(rd) = fs::read_dir(state.join("records")) else {
        return Vec::new();
    };
    let mut out: Vec<_> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter_map(|p| {
            let v = serde_json::from_slice(&fs::read(&p).ok()?).ok()?;
            Some((p, v))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

// ----- pods -----

/// How a pod runs.
struct PodSpec<'a> {
    name: &'a str,
    /// Some: drop to this uid (and gid) inside the namespace, after setting the hostname.
    uid: Option<u32>,
    /// The controller: an sh script.
    script: String,
    /// Extra environment of the pod (the controller's and terraform's).
    env: Vec<(&'a str, String)>,
}

/// A pod: tfinit as PID 1 of its own PID and UTS namespace.
struct Pod {
    child: Child,
    log: PathBuf,
}

impl Pod {
    fn start(w: &World, spec: PodSpec) -> Pod {
        let log = w.tmp.join(&format!("{}-{}.log", spec.name, now_ms()));
        let f = fs::File::create(&log).unwrap();
        let drop_privileges = match spec.uid {
            Some(u) => format!("setpriv --reuid {u} --regid {u} --clear-groups "),
            None => String::new(),
        };
        let run_dir = w.tmp.join(&format!("run-{}-{}", spec.name, now_ms()));
        let mut c = Command::new("unshare");
        c.args(["--pid", "--fork", "--mount-proc", "--kill-child", "--uts"])
            .arg("sh")
            .arg("-c")
            .arg(format!(
                "hostname {} && exec {drop_privileges}\"$0\" \"$@\"",
                spec.name
            ))
            .arg(tfinit())
            .args(["--", "sh", "-c", &spec.script])
            .current_dir(&w.ws)
            .env_clear()
            .env(
                "PATH",
                format!(
                    "{}:{}:/usr/bin:/bin",
                    w.shim.display(),
                    deps().join("bin").display()
                ),
            )
            .env("CHECKPOINT_DISABLE", "1")
            .env("TFINIT_STATE_DIR", &w.state)
            .env("TFINIT_RUN_DIR", &run_dir)
            .env("TFINIT_OWNER_TTL", format!("{}s", TTL.as_secs()))
            .env("TFINIT_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f);
        for (k, v) in &spec.env {
            c.env(k, v);
        }
        Pod {
            child: c.spawn().expect("start the pod"),
            log,
        }
    }

    fn log(&self) -> String {
        common::read(&self.log)
    }

    /// The pod dies at once (node loss): SIGKILL to its PID 1 takes the whole namespace down.
    fn kill(&mut self) {
        let unshare = self.child.id();
        let children =
            fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children")).unwrap();
        let pid1: i32 = children.split_whitespace().next().unwrap().parse().unwrap();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid1),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        self.wait();
    }

    fn wait(&mut self) -> ExitStatus {
        common::wait_child(&mut self.child, STEP, "pod")
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let unshare = self.child.id();
            if let Ok(c) = fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children")) {
                for p in c.split_whitespace().filter_map(|p| p.parse().ok()) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(p),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A controller that runs one apply and records its exit code and end time in `out`.
fn apply_once(out: &Path, extra: &str) -> String {
    format!(
        "terraform apply -auto-approve -input=false -no-color {extra} > {o}.1 2>&1; echo \"done $? $(date +%s%3N)\" >> {o}",
        o = out.display()
    )
}

/// A controller that retries `terraform apply` every RETRY until it succeeds or `max` attempts
/// failed; each attempt's output goes to `out.N`, and a line `ok|fail N START_MS END_MS` to `out`.
fn apply_until_success(out: &Path, max: u32) -> String {
    format!(
        "n=0; while :; do n=$((n+1)); s=$(date +%s%3N); \
         if terraform apply -auto-approve -input=false -no-color > {o}.$n 2>&1; then echo \"ok $n $s $(date +%s%3N)\" >> {o}; exit 0; fi; \
         echo \"fail $n $s $(date +%s%3N)\" >> {o}; [ $n -ge {max} ] && exit 1; sleep {r}; done",
        o = out.display(),
        r = RETRY.as_secs()
    )
}

#[derive(Debug, Clone)]
struct Attempt {
    n: u32,
    ok: bool,
    start: u64,
    end: u64,
}

fn attempts(out: &Path) -> Vec<Attempt> {
    common::read(out)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 4 && (f[0] == "ok" || f[0] == "fail")).then(|| Attempt {
                ok: f[0] == "ok",
                n: f[1].parse().unwrap(),
                start: f[2].parse().unwrap(),
                end: f[3].parse().unwrap(),
            })
        })
        .collect()
}

fn heartbeat_ms(state: &Path, owner: &str) -> u64 {
    let hb: Value =
        serde_json::from_slice(&fs::read(state.join(format!("owners/{owner}.json"))).unwrap())
            .unwrap();
    hb["updated_ms"].as_u64().unwrap()
}

/// Starts pod-a's apply and waits until it holds the lock with null_resource.a creating (b done,
/// c not started) and its record says so.
fn pod_a_mid_apply(w: &World, name: &str, uid: Option<u32>, json_output: bool) -> (Pod, Value) {
    let mut flags = String::from("-var=token=hunter2");
    if json_output {
        flags.push_str(" -json");
    }
    let pod = Pod::start(
        w,
        PodSpec {
            name,
            uid,
            script: apply_once(&w.tmp.join("pod-a.out"), &flags),
            env: vec![
                ("TF_VAR_sleep", "30".into()),
                ("TF_VAR_undeclared_secret", "envsecret42".into()),
                ("AWS_SECRET_ACCESS_KEY", "envsecret43".into()),
            ],
        },
    );
    let rec = wait_for(
        STEP,
        "pod-a's record to show null_resource.a in progress",
        || {
            let recs = w.records();
            let (_, r) = recs.first()?;
            (r["in_progress"] == json!(["null_resource.a"])).then(|| r.clone())
        },
    );
    wait_for(STEP, "pod-a's lock in DynamoDB", || w.moto.lock());
    (pod, rec)
}

// ----- the tests -----

#[test]
fn a_pod_killed_mid_apply_leaves_a_stuck_lock_that_the_next_pod_releases_by_itself() {
    if !have_deps() {
        return;
    }
    let w = World::new("lock-kill");
    let (mut pod_a, rec) = pod_a_mid_apply(&w, "pod-a", Some(NOBODY_UID), false);

    // The record names the run exactly as terraform's lock will, and holds no secret.
    assert_eq!(rec["v"], 1);
    assert_eq!(rec["who"], "@pod-a", "uid {NOBODY_UID} has no passwd entry");
    assert_eq!(rec["owner"]["name"], "pod-a");
    assert_eq!(rec["subcommand"], "apply");
    assert_eq!(rec["workdir"], w.ws.to_str().unwrap());
    assert_eq!(rec["workspace"], "default");
    assert!(rec["argv"]
        .as_array()
        .unwrap()
        .contains(&json!("-var=<redacted>")));
    for f in walk(&w.state) {
        let body = common::read(&f);
        for secret in ["hunter2", "envsecret42", "envsecret43"] {
            assert!(!body.contains(secret), "{secret} in {}", f.display());
        }
    }

    let kill_ms = now_ms();
    pod_a.kill();

    // The lock is stuck, held by exactly the Who the record predicted.
    let lock = w.moto.lock().expect("the lock is stuck after the pod died");
    assert_eq!(lock["Who"], rec["who"]);
    let stuck = w.terraform(&["plan", "-input=false", "-no-color", "-lock-timeout=0s"]);
    assert!(
        text(&stuck).contains("Error acquiring the state lock"),
        "{}",
        text(&stuck)
    );
    assert_eq!(w.records().len(), 1, "the record survives the pod");
    let hb = heartbeat_ms(&w.state, "pod-a");

    // pod-b, same workspace path, reconciles by itself.
    let out = w.tmp.join("pod-b.out");
    let mut pod_b = Pod::start(
        &w,
        PodSpec {
            name: "pod-b",
            uid: Some(NOBODY_UID),
            script: apply_until_success(&out, 30),
            env: vec![("TF_VAR_sleep", "0".into())],
        },
    );
    let st = pod_b.wait();
    let log = pod_b.log();
    assert!(st.success(), "pod-b never succeeded: {log}");
    let tries = attempts(&out);
    let ok = tries.last().unwrap();
    assert!(ok.ok);
    // Nothing was released while pod-a's heartbeat was younger than the TTL.
    for t in &tries {
        if t.start < hb + TTL.as_millis() as u64 {
            assert!(
                !t.ok,
                "attempt {} succeeded before pod-a was dead: {tries:?}",
                t.n
            );
        }
    }
    // Released within the TTL plus one retry (plus the failed attempt that waited for it).
    let longest_fail = tries
        .iter()
        .filter(|t| !t.ok)
        .map(|t| t.end - t.start)
        .max()
        .unwrap_or(0);
    let bound = kill_ms + (TTL + RETRY).as_millis() as u64 + longest_fail + 1000;
    assert!(
        ok.start <= bound,
        "reconciled {} ms after the kill (bound {} ms): {tries:?}",
        ok.start - kill_ms,
        bound - kill_ms
    );
    assert!(log.contains("force-unlocked its state lock"), "{log}");
    assert!(log.contains(lock["ID"].as_str().unwrap()), "{log}");
    assert!(w.records().is_empty(), "record removed: {:?}", w.records());
    w.assert_state_consistent();
}

#[test]
fn a_lock_held_by_another_host_is_never_unlocked_whatever_records_exist() {
    if !have_deps() {
        return;
    }
    let w = World::new("lock-laptop");
    // Somebody's laptop (not a pod) runs the apply and dies holding the lock.
    let mut laptop = Command::new("unshare");
    laptop
        .args(["--pid", "--fork", "--mount-proc", "--kill-child", "--uts"])
        .args(["sh", "-c", "hostname laptop && exec \"$0\" \"$@\""])
        .arg(deps().join("bin/terraform"))
        .args(["apply", "-auto-approve", "-input=false", "-no-color"])
        .current_dir(&w.ws)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", "/root")
        .env("CHECKPOINT_DISABLE", "1")
        .env("TF_VAR_sleep", "30")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut laptop = Pod {
        child: laptop.spawn().unwrap(),
        log: w.tmp.join("laptop.log"),
    };
    let lock = wait_for(STEP, "the laptop's lock", || w.moto.lock());
    assert_eq!(lock["Who"], "root@laptop");
    laptop.kill();
    let created = parse_rfc3339_ms(lock["Created"].as_str().unwrap());

    // Records of dead pods in this directory: pod-a's (another Who), and an old pod that happened
    // to be called "laptop" too but died minutes before this lock was taken.
    let dead = |name: &str, who: &str, started: u64| {
        json!({
            "v": 1,
            "owner": {"name": name, "boot_id": "0", "started_ms": started - 1000, "pid": 1},
            "who": who, "run_id": "r1", "cwd": w.ws, "workdir": w.ws, "workspace": "default",
            "subcommand": "apply", "argv": ["apply", "-auto-approve"],
            "started_ms": started, "in_progress": ["null_resource.a"], "updated_ms": started,
        })
    };
    let other_who = w.plant_record(
        "pod-a.0-1-1.r1.json",
        &dead("pod-a", "@pod-a", now_ms() - 60_000),
    );
    let old = created - 600_000;
    let old_pod = w.plant_record("laptop.0-1-1.r1.json", &dead("laptop", "root@laptop", old));
    w.plant_heartbeat(
        "laptop",
        &json!({"v": 1, "owner": {"name": "laptop", "boot_id": "0", "started_ms": old - 1000, "pid": 1}, "updated_ms": old + 60_000}),
    );

    let out = w.tmp.join("pod-b.out");
    let mut pod_b = Pod::start(
        &w,
        PodSpec {
            name: "pod-b",
            uid: Some(NOBODY_UID),
            script: apply_until_success(&out, 5),
            env: vec![("TF_VAR_sleep", "0".into())],
        },
    );
    let st = pod_b.wait();
    let log = pod_b.log();
    assert!(
        !st.success(),
        "pod-b must fail while the laptop holds the lock: {log}"
    );
    let tries = attempts(&out);
    assert_eq!(tries.len(), 5);
    assert!(tries.last().unwrap().end - tries[0].start > (TTL + RETRY).as_millis() as u64);
    for t in &tries {
        let o = common::read(&out.with_extension(format!("out.{}", t.n)));
        assert!(o.contains("Error acquiring the state lock"), "{o}");
        assert!(o.contains("Who:       root@laptop"), "{o}");
    }
    assert_eq!(
        w.moto.lock(),
        Some(lock.clone()),
        "the laptop's lock is untouched"
    );
    assert!(!log.contains("force-unlocked"), "{log}");
    assert!(
        log.contains("its Who \"root@laptop\" is not the dead run's \"@pod-a\""),
        "{log}"
    );
    assert!(
        log.contains("after the dead run's owner was last known alive"),
        "{log}"
    );
    assert!(
        !other_who.exists() && !old_pod.exists(),
        "records of runs that hold no lock are removed"
    );

    // By hand, too: nothing is released.
    w.plant_record(
        "pod-a.0-1-1.r2.json",
        &dead("pod-a", "@pod-a", now_ms() - 60_000),
    );
    let out = recover_by_hand(&w, &[]);
    assert_eq!(w.moto.lock(), Some(lock), "`tfinit recover` leaves it too");
    assert!(
        out.contains("held by root@laptop is not the dead run's"),
        "{out}"
    );
}

#[test]
fn a_pod_starting_during_a_live_pods_apply_never_unlocks_it_and_succeeds_after() {
    if !have_deps() {
        return;
    }
    let w = World::new("lock-rolling");
    // pod-a's apply lasts two TTLs: only its heartbeat tells pod-b that it is alive.
    let a_out = w.tmp.join("pod-a.out");
    let mut pod_a = Pod::start(
        &w,
        PodSpec {
            name: "pod-a",
            uid: None,
            script: apply_once(&a_out, ""),
            env: vec![("TF_VAR_sleep", (2 * TTL.as_secs()).to_string())],
        },
    );
    let lock = wait_for(STEP, "pod-a's lock", || w.moto.lock());
    assert_eq!(lock["Who"], "root@pod-a");
    let b_out = w.tmp.join("pod-b.out");
    let mut pod_b = Pod::start(
        &w,
        PodSpec {
            name: "pod-b",
            uid: None,
            script: apply_until_success(&b_out, 30),
            env: vec![("TF_VAR_sleep", "0".into())],
        },
    );
    assert!(pod_a.wait().success(), "{}", pod_a.log());
    let a_done: Vec<u64> = common::read(&a_out)
        .lines()
        .filter_map(|l| l.strip_prefix("done 0 ").map(|t| t.trim().parse().unwrap()))
        .collect();
    assert_eq!(
        a_done.len(),
        1,
        "pod-a's apply succeeded: {}",
        common::read(&a_out)
    );
    assert!(common::read(&a_out.with_extension("out.1")).contains("Apply complete!"));
    assert!(pod_b.wait().success(), "{}", pod_b.log());

    let tries = attempts(&b_out);
    let failed: Vec<_> = tries.iter().filter(|t| !t.ok).collect();
    assert!(
        !failed.is_empty(),
        "pod-b overlapped pod-a's apply: {tries:?}"
    );
    // Each failure is terraform's own lock error; while pod-a held the lock it names its ID (an
    // attempt that raced pod-a's release may find no Lock Info left to print).
    let outputs: Vec<String> = failed
        .iter()
        .map(|t| common::read(&b_out.with_extension(format!("out.{}", t.n))))
        .collect();
    for o in &outputs {
        assert!(o.contains("Error acquiring the state lock"), "{o}");
    }
    assert!(
        outputs
            .iter()
            .any(|o| o.contains(lock["ID"].as_str().unwrap())),
        "{outputs:?}"
    );
    // Nothing of pod-b's succeeded while pod-a's apply ran, and pod-a released its own lock.
    for t in &tries {
        if t.end < a_done[0] {
            assert!(
                !t.ok,
                "attempt {} succeeded during pod-a's apply: {tries:?}",
                t.n
            );
        }
    }
    assert!(tries.last().unwrap().ok);
    assert!(
        !common::read(&a_out.with_extension("out.1")).contains("Error releasing the state lock")
    );
    let log = pod_b.log();
    assert!(!log.contains("force-unlock"), "{log}");
    assert!(
        !log.contains("checking the state lock"),
        "pod-a's record was never taken for dead: {log}"
    );
    assert!(w.records().is_empty());
    w.assert_state_consistent();
}

#[test]
fn a_restarted_pod_releases_its_predecessors_lock_at_once_and_logs_the_orphan_candidates() {
    if !have_deps() {
        return;
    }
    let w = World::new("lock-orphans");
    // -json output this time: the record follows its apply_start / apply_complete lines.
    let (mut pod_a, rec) = pod_a_mid_apply(&w, "pod-a", Some(NOBODY_UID), true);
    assert_eq!(rec["in_progress"], json!(["null_resource.a"]));
    pod_a.kill();
    let lock = w.moto.lock().expect("stuck");

    // The same pod name again (a container restart, a StatefulSet pod replaced): its earlier
    // incarnation is dead without waiting for the TTL.
    let out = w.tmp.join("pod-a2.out");
    let mut again = Pod::start(
        &w,
        PodSpec {
            name: "pod-a",
            uid: Some(NOBODY_UID),
            script: apply_until_success(&out, 1),
            env: vec![
                ("TF_VAR_sleep", "0".into()),
                ("TFINIT_OWNER_TTL", "30s".into()),
            ],
        },
    );
    let st = again.wait();
    let log = again.log();
    assert!(st.success(), "the first attempt succeeds: {log}");
    assert!(log.contains("earlier incarnation of this owner"), "{log}");
    assert!(
        log.contains(&format!(
            "force-unlocked its state lock {}",
            lock["ID"].as_str().unwrap()
        )),
        "{log}"
    );
    let line = log.lines().find(|l| l.contains("force-unlocked")).unwrap();
    assert!(
        line.contains("Resources that may exist outside the state"),
        "{line}"
    );
    assert!(
        line.contains("orphan_candidates=[\"null_resource.a\"]"),
        "{line}"
    );
    assert!(
        !line.contains("null_resource.b") && !line.contains("null_resource.c"),
        "{line}"
    );
    w.assert_state_consistent();
}

#[test]
fn force_unlock_off_never_unlocks_and_recover_dry_run_changes_nothing() {
    if !have_deps() {
        return;
    }
    let w = World::new("lock-off");
    let (mut pod_a, _) = pod_a_mid_apply(&w, "pod-a", None, false);
    pod_a.kill();
    let lock = w.moto.lock().expect("stuck");
    assert_eq!(lock["Who"], "root@pod-a");
    let (rec_path, _) = w.records().pop().unwrap();
    let rec_bytes = fs::read(&rec_path).unwrap();

    let out = w.tmp.join("pod-b.out");
    let mut pod_b = Pod::start(
        &w,
        PodSpec {
            name: "pod-b",
            uid: None,
            script: apply_until_success(&out, 5),
            env: vec![
                ("TF_VAR_sleep", "0".into()),
                ("TFINIT_FORCE_UNLOCK", "off".into()),
            ],
        },
    );
    assert!(!pod_b.wait().success());
    let tries = attempts(&out);
    assert!(tries.last().unwrap().start > heartbeat_ms(&w.state, "pod-a") + TTL.as_millis() as u64);
    assert_eq!(w.moto.lock(), Some(lock.clone()));
    assert_eq!(fs::read(&rec_path).unwrap(), rec_bytes, "record untouched");
    assert!(!pod_b.log().contains("force-unlock"), "{}", pod_b.log());

    let dry = recover_by_hand(&w, &["--dry-run"]);
    assert!(
        dry.contains(&format!(
            "would force-unlock lock {}",
            lock["ID"].as_str().unwrap()
        )),
        "{dry}"
    );
    assert!(dry.contains("orphan candidates: null_resource.a"), "{dry}");
    assert_eq!(w.moto.lock(), Some(lock.clone()), "dry run leaves the lock");
    assert_eq!(
        fs::read(&rec_path).unwrap(),
        rec_bytes,
        "dry run leaves the record"
    );
    assert!(
        !w.state.join("recover.lock").exists(),
        "a dry run writes nothing, not even the recovery lock"
    );

    let real = recover_by_hand(&w, &[]);
    assert!(
        real.contains(&format!(
            "force-unlocked lock {}",
            lock["ID"].as_str().unwrap()
        )),
        "{real}"
    );
    assert_eq!(w.moto.lock(), None);
    assert!(!rec_path.exists());
}

#[test]
fn a_terraform_killed_inside_a_live_pod_has_its_lock_released_by_that_pods_next_run() {
    if !have_deps() {
        return;
    }
    let w = World::new("lock-oom");
    // The OOM killer picks terraform's wrapped child (the process that holds the lock); the
    // panicwrap parent then exits 255, the pod lives on and its controller retries.
    let out = w.tmp.join("pod-a.out");
    let script = format!(
        "TF_VAR_sleep=30 terraform apply -auto-approve -input=false -no-color > {o}.1 2>&1; echo \"first $?\" >> {o}; \
         TF_VAR_sleep=0 terraform apply -auto-approve -input=false -no-color > {o}.2 2>&1; echo \"second $?\" >> {o}",
        o = out.display()
    );
    let mut pod = Pod::start(
        &w,
        PodSpec {
            name: "pod-a",
            uid: Some(NOBODY_UID),
            script,
            env: vec![],
        },
    );
    wait_for(
        STEP,
        "the record to show null_resource.a in progress",
        || {
            let recs = w.records();
            (recs.first()?.1["in_progress"] == json!(["null_resource.a"])).then_some(())
        },
    );
    let lock = wait_for(STEP, "the lock", || w.moto.lock());
    let child = wrapped_terraform(&w.ws).expect("terraform's wrapped child");
    nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL).unwrap();
    pod.wait();
    let log = pod.log();
    assert_eq!(
        common::read(&out),
        "first 255\nsecond 0\n",
        "the killed run exits 255, the very next one succeeds: {log}"
    );
    assert!(
        log.contains("terraform ended without releasing its state lock for sure"),
        "{log}"
    );
    assert!(log.contains("exit code 255"), "{log}");
    assert!(
        log.contains(&format!(
            "force-unlocked its state lock {}",
            lock["ID"].as_str().unwrap()
        )),
        "{log}"
    );
    assert!(w.records().is_empty());
    w.assert_state_consistent();
}

/// The terraform process whose parent is terraform too (panicwrap's child) working in `ws`.
fn wrapped_terraform(ws: &Path) -> Option<nix::unistd::Pid> {
    let comm = |pid: &str| fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid = e.file_name().to_string_lossy().to_string();
        if !pid.chars().all(|c| c.is_ascii_digit()) || comm(&pid).trim() != "terraform" {
            return None;
        }
        if fs::read_link(format!("/proc/{pid}/cwd")).ok()? != ws {
            return None;
        }
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let ppid = stat.rsplit_once(") ")?.1.split(' ').nth(1)?.to_string();
        (comm(&ppid).trim() == "terraform")
            .then(|| nix::unistd::Pid::from_raw(pid.parse().unwrap()))
    })
}

/// `tfinit recover ARGS` by hand (as an operator would, with `kubectl exec`), as root on the host.
fn recover_by_hand(w: &World, args: &[&str]) -> String {
    let mut c = Command::new(tfinit());
    c.arg("recover")
        .args(args)
        .current_dir(&w.tmp.0)
        .env_clear()
        .env(
            "PATH",
            format!("{}:/usr/bin:/bin", deps().join("bin").display()),
        )
        .env("HOME", "/root")
        .env("CHECKPOINT_DISABLE", "1")
        .env("TFINIT_STATE_DIR", &w.state)
        .env("TFINIT_OWNER_TTL", format!("{}s", TTL.as_secs()));
    let o = common::run_output(&mut c, STEP);
    text(&o)
}

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

/// `2026-11-21T23:56:11.330240859Z` (UTC, as terraform writes Created in its lock JSON) in ms.
fn parse_rfc3339_ms(s: &str) -> u64 {
    let s = s.trim_end_matches('Z');
    let (date, time) = s.split_once('T').unwrap();
    let go = format!("{date} {time} +0000 UTC");
    tfinit::locks::lockinfo::parse_go_time(&go).unwrap()
}

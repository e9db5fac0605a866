//! Pods for the lock tests (tests/locks_*.rs on s3, tests/kubernetes.rs): tfinit as PID 1 of its
//! own PID and UTS namespace with a controller script, sharing a TFINIT_STATE_DIR; controller
//! scripts; reading records, attempts and heartbeats back.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use super::launch::{As, Config, Launch, Out};
use super::{deps, tfinit, wait_for, TempDir};

/// The pause between two attempts of a controller loop.
pub const RETRY: Duration = Duration::from_secs(1);

/// Bound for steps that take a few seconds at most.
pub const STEP: Duration = Duration::from_secs(60);

/// A uid without a passwd entry, for pods that run as a user (provider-terraform's 2000 has none):
/// terraform writes its Who as `@<hostname>`.
pub const NOBODY_UID: u32 = 4321;

/// Where pods run, the part every test's world has: its temp dir (logs go there), the terraform
/// working directory, the shared TFINIT_STATE_DIR, the directory with the `terraform` shim, the
/// pods' TFINIT_OWNER_TTL and the directory of the terraform the shim runs. A world holds one
/// and derefs to it, so `Pod::start(&world, ..)` and `world.state` work on any world.
pub struct Place {
    /// The test's temp dir.
    pub tmp: TempDir,
    /// The terraform working directory the pods run in.
    pub ws: PathBuf,
    /// The shared TFINIT_STATE_DIR.
    pub state: PathBuf,
    /// The directory with the `terraform` shim (a link to tfinit).
    pub shim: PathBuf,
    /// The pods' TFINIT_OWNER_TTL.
    pub ttl: Duration,
    /// The terraform after the shim on PATH: the real one of the test dependencies by default
    /// (a world of another version sets its [`super::terraform::Terraform::dir`]).
    pub terraform_dir: PathBuf,
}

impl Place {
    /// The records in the shared state dir, with their contents.
    pub fn records(&self) -> Vec<(PathBuf, Value)> {
        records(&self.state)
    }

    /// Waits (up to [`STEP`]) until the first record shows exactly `in_progress`; returns it.
    pub fn wait_in_progress(&self, whose: &str, in_progress: &[&str]) -> Value {
        wait_for(
            STEP,
            &format!("{whose}'s record to show {in_progress:?} in progress"),
            || {
                let recs = self.records();
                let (_, r) = recs.first()?;
                (r["in_progress"] == serde_json::json!(in_progress)).then(|| r.clone())
            },
        )
    }

    /// Gives everything in the test's temp dir to [`NOBODY_UID`], for pods that run as it. As a
    /// normal user it does nothing: the files are already ours, and so are the pods (root in
    /// their user namespace is this user); only root can give them to another uid.
    pub fn give_to_pods(&self) {
        if !super::is_root() {
            return;
        }
        let st = Command::new("chown")
            .args(["-R", &format!("{NOBODY_UID}:{NOBODY_UID}")])
            .arg(&self.tmp.0)
            .status()
            .expect("run chown");
        assert!(
            st.success(),
            "chown -R {NOBODY_UID} {}",
            self.tmp.0.display()
        );
    }

    /// A fresh temp dir `name` with `ws/` (the configuration tests/fixtures/CONFIG when given:
    /// [`super::config_dir`]), `state/` and the shim.
    pub fn new(name: &str, config: Option<&str>, ttl: Duration) -> Place {
        let tmp = TempDir::new(name);
        let ws = tmp.join("ws");
        fs::create_dir_all(&ws).unwrap();
        if let Some(c) = config {
            super::config_dir(c, &ws);
        }
        let state = tmp.join("state");
        fs::create_dir_all(&state).unwrap();
        let shim = super::shim_dir(&tmp);
        Place {
            tmp,
            ws,
            state,
            shim,
            ttl,
            terraform_dir: deps().join("bin"),
        }
    }

    /// The real terraform of this place ([`Place::terraform_dir`]), run directly (not through
    /// tfinit), as root, in the working directory, with a clean environment (TF_VAR_sleep=0).
    pub fn terraform_command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(self.terraform_dir.join("terraform"));
        c.args(args)
            .current_dir(&self.ws)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", "/root")
            .env("CHECKPOINT_DISABLE", "1")
            .env("TF_VAR_sleep", "0")
            .stdin(Stdio::null());
        c
    }
}

/// Whether what every pod test needs is here: root (`why`: what the pods do that needs it),
/// terraform and the null provider of the test dependencies.
pub fn have_pod_deps(why: &str) -> bool {
    super::require_root(why)
        && super::require(
            deps().join("bin/terraform").is_file(),
            ".test-deps/bin/terraform (scripts/install-test-deps.sh)",
        )
        && super::require(
            deps()
                .join("plugins/registry.terraform.io/hashicorp/null")
                .is_dir(),
            ".test-deps/plugins with hashicorp/null",
        )
}

/// Now, ms since the epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The records (`records/*.json`) of a state directory, parsed, sorted by path: each record of
/// an incarnation's file (`{"v":5,"records":[...]}`, docs/records.md) with that file's path, in
/// the file's order.
pub fn records(state: &Path) -> Vec<(PathBuf, Value)> {
    let Ok(rd) = fs::read_dir(state.join("records")) else {
        return Vec::new();
    };
    let mut files: Vec<_> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter_map(|p| {
            let v = serde_json::from_slice(&fs::read(&p).ok()?).ok()?;
            Some((p, v))
        })
        .collect();
    files.sort_by(|a, b| a.0.cmp(&b.0));
    files
        .into_iter()
        .flat_map(|(p, v)| records_in(v).into_iter().map(move |r| (p.clone(), r)))
        .collect()
}

/// The records a file of `records/` holds: those of an incarnation's file, or the file's one.
pub fn records_in(v: Value) -> Vec<Value> {
    match v.get("records").and_then(Value::as_array) {
        Some(records) => records.clone(),
        None => vec![v],
    }
}

/// stdout then stderr of a finished command.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// How a pod runs.
pub struct PodSpec<'a> {
    /// Its hostname and TFINIT_OWNER (the default).
    pub name: &'a str,
    /// Some: drop to this uid (and gid) inside the namespace, after setting the hostname.
    pub uid: Option<u32>,
    /// The controller: an sh script.
    pub script: String,
    /// Extra environment of the pod (the controller's and terraform's).
    pub env: Vec<(&'a str, String)>,
}

/// A pod: tfinit as PID 1 of its own PID and UTS namespace.
pub struct Pod {
    /// `unshare`, whose child is the pod's PID 1.
    pub child: Child,
    /// Everything the pod printed.
    pub log: PathBuf,
}

impl Pod {
    /// Starts a pod in `w`'s working directory, on this node (the kernel's own boot id).
    pub fn start(w: &Place, spec: PodSpec) -> Pod {
        Pod::start_on(w, spec, None)
    }

    /// Starts a pod as if on another node: `boot_id` replaces the kernel's boot id inside the
    /// pod (a bind mount in its mount namespace), so no kernel proof about the processes of a
    /// pod of this node applies to it, and it must watch heartbeats as a pod elsewhere would.
    pub fn start_on_other_node(w: &Place, spec: PodSpec, boot_id: &str) -> Pod {
        Pod::start_on(w, spec, Some(boot_id))
    }

    fn start_on(w: &Place, spec: PodSpec, boot_id: Option<&str>) -> Pod {
        let log = w.tmp.0.join(format!("{}-{}.log", spec.name, now_ms()));
        let prelude = boot_id.map(|id| {
            let file = w.tmp.0.join(format!("boot_id-{}-{}", spec.name, now_ms()));
            fs::write(&file, format!("{id}\n")).unwrap();
            format!(
                "mount --bind {} /proc/sys/kernel/random/boot_id",
                file.display()
            )
        });
        let run_dir = w.tmp.0.join(format!("run-{}-{}", spec.name, now_ms()));
        let l = Launch {
            hostname: Some(spec.name.to_string()),
            uid: spec.uid,
            bare_env: Some(format!(
                "{}:{}:/usr/bin:/bin",
                w.shim.display(),
                w.terraform_dir.display()
            )),
            cwd: Some(w.ws.clone()),
            stdout: Out::File(log.clone()),
            stderr: Out::File(log.clone()),
            // The pod dies with the test, also when the test thread dies without unwinding.
            die_with_test: true,
            prelude,
            ..Launch::new(
                As::Pid1,
                Config::default()
                    .set("TFINIT_STATE_DIR", &w.state)
                    .set("TFINIT_RUN_DIR", &run_dir)
                    .set("TFINIT_OWNER_TTL", format!("{}s", w.ttl.as_secs()))
                    .set("TFINIT_LOG", "debug")
                    .with(&spec.env),
                &["sh", "-c", &spec.script],
            )
        };
        Pod {
            child: l.spawn(),
            log,
        }
    }

    /// Everything the pod printed so far.
    pub fn log(&self) -> String {
        super::read(&self.log)
    }

    /// While this pod's run (its one terraform) may live, the state lock `now` (None: free)
    /// is its own `lock`. Another's only once this pod's init has reaped that terraform: the
    /// controller's `done` comes later (its shim is answered once terraform's output is
    /// drained, and a stopped local-exec's `sleep` may hold the pipes a while), and another pod
    /// may take the lock in between (CI-like runs at 2 cores saw it, in kubernetes_leases.rs and
    /// kubernetes.rs). Whether that other pod force-unlocked anything is the caller's check.
    pub fn assert_its_lock_while_it_runs(&self, now: Option<Value>, lock: &Value) {
        if let Some(now) = now.filter(|now| now != lock) {
            let log = self.log();
            assert!(
                log.contains("terraform exited"),
                "the pod's lock replaced while its run lived: {now} in place of {lock}; {log}"
            );
        }
    }

    /// The pod's PID 1 (tfinit), as this process sees it.
    pub fn pid1(&self) -> nix::unistd::Pid {
        let unshare = self.child.id();
        let children =
            fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children")).unwrap();
        let pid1: i32 = children.split_whitespace().next().unwrap().parse().unwrap();
        nix::unistd::Pid::from_raw(pid1)
    }

    /// Sends `sig` to the pod's PID 1 (SIGTERM: the kubelet's graceful termination).
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(self.pid1(), sig).unwrap();
    }

    /// The pod dies at once (node loss): SIGKILL to its PID 1 takes the whole namespace down.
    pub fn kill(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGKILL);
        self.wait();
    }

    /// Whether the pod still runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits for the pod to end (within [`STEP`]).
    pub fn wait(&mut self) -> ExitStatus {
        super::wait_child(&mut self.child, STEP, "pod")
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
pub fn apply_once(out: &Path, extra: &str) -> String {
    format!(
        "terraform apply -auto-approve -input=false -no-color {extra} > {o}.1 2>&1; echo \"done $? $(date +%s%3N)\" >> {o}",
        o = out.display()
    )
}

/// A controller that retries `terraform apply` every RETRY until it succeeds or `max` attempts
/// failed; each attempt's output goes to `out.N`, and a line `ok|fail N START_MS END_MS` to `out`.
pub fn apply_until_success(out: &Path, max: u32) -> String {
    format!(
        "n=0; while :; do n=$((n+1)); s=$(date +%s%3N); \
         if terraform apply -auto-approve -input=false -no-color > {o}.$n 2>&1; then echo \"ok $n $s $(date +%s%3N)\" >> {o}; exit 0; fi; \
         echo \"fail $n $s $(date +%s%3N)\" >> {o}; [ $n -ge {max} ] && exit 1; sleep {r}; done",
        o = out.display(),
        r = RETRY.as_secs()
    )
}

/// One attempt of an [`apply_until_success`] controller.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// 1, 2, ...
    pub n: u32,
    /// Whether the apply succeeded.
    pub ok: bool,
    /// Start, ms since the epoch.
    pub start: u64,
    /// End, ms since the epoch.
    pub end: u64,
}

/// The attempts an [`apply_until_success`] controller wrote to `out`.
pub fn attempts(out: &Path) -> Vec<Attempt> {
    super::read(out)
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

/// The heartbeat file of `owner`'s latest incarnation (`owners/<owner>.<incarnation>.json`: one
/// per incarnation), if one was written.
pub fn heartbeat_file(state: &Path, owner: &str) -> Option<PathBuf> {
    let prefix = format!("{owner}.");
    fs::read_dir(state.join("owners"))
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let inc = name.strip_prefix(&prefix)?.strip_suffix(".json")?;
            // `<8 hex>-<started ms>-<pid>`: the latest incarnation started last.
            let started: u64 = inc.split('-').nth(1)?.parse().ok()?;
            (!inc.contains('.')).then_some((started, e.path()))
        })
        .max()
        .map(|(_, p)| p)
}

/// When `owner`'s latest incarnation last refreshed its heartbeat, ms since the epoch.
pub fn heartbeat_ms(state: &Path, owner: &str) -> u64 {
    let file = heartbeat_file(state, owner).expect("a heartbeat file of the owner");
    let hb: Value = serde_json::from_slice(&fs::read(file).unwrap()).unwrap();
    hb["updated_ms"].as_u64().unwrap()
}

/// `tfinit recover ARGS` by hand (as an operator would, with `kubectl exec`), as root on the host,
/// with `extra` environment and the place's terraform.
pub fn recover_by_hand(w: &Place, args: &[&str], extra: &[(&str, &str)]) -> Output {
    let mut c = Command::new(tfinit());
    recover_by_hand_with(&mut c, w, args, extra)
}

/// `tfinit recover ARGS` by hand inside `pod`'s container (`kubectl exec`): in its mount, UTS and
/// PID namespaces (its hostname, its node's boot id), with `extra` environment (the service
/// account's, for the Lease store) and the place's terraform.
pub fn recover_in_pod(w: &Place, pod: &Pod, args: &[&str], extra: &[(&str, &str)]) -> Output {
    let mut c = Command::new("nsenter");
    c.args(["-t", &pod.pid1().to_string(), "-m", "-u", "-p", "--"])
        .arg(tfinit());
    recover_by_hand_with(&mut c, w, args, extra)
}

fn recover_by_hand_with(
    c: &mut Command,
    w: &Place,
    args: &[&str],
    extra: &[(&str, &str)],
) -> Output {
    c.arg("recover")
        .args(args)
        .current_dir(&w.tmp.0)
        .env_clear()
        .env(
            "PATH",
            format!("{}:/usr/bin:/bin", w.terraform_dir.display()),
        )
        .env("HOME", "/root")
        .env("CHECKPOINT_DISABLE", "1")
        .env("TFINIT_STATE_DIR", &w.state)
        .env("TFINIT_OWNER_TTL", format!("{}s", w.ttl.as_secs()));
    for (k, v) in extra {
        c.env(k, v);
    }
    super::run_output(c, STEP)
}

/// Every file under `dir`.
pub fn walk(dir: &Path) -> Vec<PathBuf> {
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

/// `ms` since the epoch as Go's time.Time in Lock Info's JSON (RFC 3339, UTC), via date(1).
pub fn rfc3339(ms: u64) -> String {
    let out = Command::new("date")
        .args(["-u", "-d", &format!("@{}.{:03}", ms / 1000, ms % 1000)])
        .arg("+%Y-%m-%dT%H:%M:%S.%3NZ")
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// `2026-11-21T23:56:11.330240859Z` (UTC, as terraform writes Created in its lock JSON) in ms.
pub fn parse_rfc3339_ms(s: &str) -> u64 {
    let s = s.trim_end_matches('Z');
    let (date, time) = s.split_once('T').unwrap();
    let go = format!("{date} {time} +0000 UTC");
    tfinit::locks::lockinfo::parse_go_time(&go).unwrap()
}

/// Writes a record file by hand into `state` (the format of docs/records.md), owned by `uid` as
/// the pods' own files are on a shared volume.
pub fn plant_record(state: &Path, uid: u32, file: &str, rec: &Value) -> PathBuf {
    let dir = state.join("records");
    fs::create_dir_all(&dir).unwrap();
    let p = dir.join(file);
    fs::write(&p, serde_json::to_vec_pretty(rec).unwrap()).unwrap();
    chown(state, uid);
    p
}

/// Writes an owner's heartbeat by hand into `state`, owned by `uid`.
pub fn plant_heartbeat(state: &Path, uid: u32, owner: &str, hb: &Value) {
    let dir = state.join("owners");
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join(format!("{owner}.json")), hb.to_string()).unwrap();
    chown(state, uid);
}

/// `chown -R uid:uid path`: files made by the test (root) become the pods'.
pub fn chown(path: &Path, uid: u32) {
    let st = Command::new("chown")
        .args(["-R", &format!("{uid}:{uid}")])
        .arg(path)
        .status()
        .unwrap();
    assert!(st.success());
}

/// The process of the terraform binary `exe` that holds the lock of a run in `ws`: panicwrap's
/// worker (whose parent runs `exe` too) under terraform 1.0.3, the one process under 1.1 and
/// later. (The shim, a `terraform` link to tfinit, is not one of them.)
pub fn lock_holding_terraform(ws: &Path, exe: &Path) -> Option<nix::unistd::Pid> {
    let exe = fs::canonicalize(exe).ok()?;
    let runs = |pid: &str| fs::read_link(format!("/proc/{pid}/exe")).ok().as_ref() == Some(&exe);
    let ours: Vec<(String, String)> = fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_string_lossy().to_string();
            if !pid.chars().all(|c| c.is_ascii_digit()) || !runs(&pid) {
                return None;
            }
            if fs::read_link(format!("/proc/{pid}/cwd")).ok()? != ws {
                return None;
            }
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let ppid = stat.rsplit_once(") ")?.1.split(' ').nth(1)?.to_string();
            Some((pid, ppid))
        })
        .collect();
    let holder = match ours.as_slice() {
        [(pid, _)] => pid,
        many => &many.iter().find(|(_, ppid)| runs(ppid))?.0,
    };
    Some(nix::unistd::Pid::from_raw(holder.parse().ok()?))
}

/// The terraform process whose parent is terraform too (panicwrap's child) working in `ws`.
pub fn wrapped_terraform(ws: &Path) -> Option<nix::unistd::Pid> {
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
        let mut fields = stat.rsplit_once(") ")?.1.split(' ');
        let ppid = fields.nth(1)?.to_string();
        // A worker is a Go program running (several threads), not a child terraform forked and
        // has yet to exec (a provider, local-exec's shell): one thread, terraform's name and
        // cwd. Under load a scan caught one (kubernetes.rs, single-process shape, 2026-12-06).
        let threads: u32 = fields.nth(15)?.parse().ok()?; // field 20, num_threads
        (threads > 1 && comm(&ppid).trim() == "terraform")
            .then(|| nix::unistd::Pid::from_raw(pid.parse().unwrap()))
    })
}

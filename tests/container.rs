//! tfinit in a real container runtime (Docker), as users adopt it: the image is built with the
//! repository's Dockerfile (through scripts/build-image.sh) on top of a FROM-scratch stand-in for a
//! provider-terraform image (busybox, terraform 1.0.3, the null provider, and a controller stand-in
//! that runs terraform from PATH and SIGKILLs it when SIGTERM cancels its context). State and lock
//! live on a moto server on the host (host network). Checked from the outside: `docker stop` and
//! `docker kill` timings and exit codes, the lock table, the state, the lock-owner records on the
//! state volume, and the container's logs.
//!
//! Without a Docker engine every test here says so in one line and passes (set
//! TFINIT_REQUIRE_DOCKER=1 to make that a failure). Containers and images are named `tfinit-test-*`
//! with this process's pid, removed when a test ends (containers) or the test binary exits
//! (images), and left-overs of test processes that died are removed at the next run.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use common::{deps, repo, require, run_output, TempDir};
use serde_json::Value;

/// One container scenario at a time: they measure `docker stop` timings on a 2-core machine.
static SERIAL: Mutex<()> = Mutex::new(());

/// Crossplane runs provider pods as uid/gid 2000.
const POD_USER: &str = "2000:2000";

/// Longest wait for anything that is not an apply (container start, terraform init, moto).
const START: Duration = Duration::from_secs(60);

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn pid() -> u32 {
    std::process::id()
}

// ----- docker ------------------------------------------------------------------------------------

/// Runs `docker ARGS` with a deadline.
fn docker(args: &[&str], timeout: Duration) -> Output {
    let mut c = Command::new("docker");
    c.args(args).stdin(Stdio::null());
    run_output(&mut c, timeout)
}

/// `docker ARGS`, which must succeed; returns its stdout.
fn docker_ok(args: &[&str], timeout: Duration) -> String {
    let out = docker(args, timeout);
    assert!(
        out.status.success(),
        "docker {} failed ({}):\n{}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The engine's version, or why there is none.
fn engine() -> &'static Result<String, String> {
    static ENGINE: OnceLock<Result<String, String>> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let found = Command::new("docker")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if found.is_err() {
            return Err("no docker command".into());
        }
        let out = docker(&["info", "--format", "{{.ServerVersion}}"], START);
        let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if out.status.success() && !version.is_empty() {
            Ok(version)
        } else {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let first = stderr.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
            Err(format!("`docker info` failed: {}", first.trim()))
        }
    })
}

/// Whether a Docker engine answers; prints the one-line skip notice when not.
fn have_docker() -> bool {
    match engine() {
        Ok(_) => true,
        Err(why) => {
            if std::env::var_os("TFINIT_REQUIRE_DOCKER").is_some() {
                panic!("TFINIT_REQUIRE_DOCKER is set but there is no Docker engine: {why}");
            }
            // libtest names each test's thread after the test.
            let current = std::thread::current();
            let test = current.name().unwrap_or("container test");
            eprintln!("SKIP {test}: no Docker engine ({why})");
            false
        }
    }
}

/// Whether the process that a name's `<pid>` suffix names is gone.
fn owner_gone(pid_text: &str) -> bool {
    pid_text
        .parse::<u32>()
        .is_ok_and(|p| p != pid() && !Path::new(&format!("/proc/{p}")).exists())
}

/// Removes containers and images that earlier test processes (now dead) left behind.
fn remove_leftovers() {
    let names = docker_ok(
        &[
            "ps",
            "-a",
            "--filter",
            "name=tfinit-test-",
            "--format",
            "{{.Names}}",
        ],
        START,
    );
    for n in names.lines().filter(|n| n.starts_with("tfinit-test-")) {
        if n.rsplit('-').next().is_some_and(owner_gone) {
            let _ = docker(&["rm", "-f", n], START);
        }
    }
    let images = docker_ok(
        &[
            "images",
            "--filter",
            "reference=tfinit-test-*",
            "--format",
            "{{.Repository}}:{{.Tag}}",
        ],
        START,
    );
    for i in images.lines() {
        if i.rsplit(":p").next().is_some_and(owner_gone) {
            let _ = docker(&["rmi", "-f", i], START);
        }
    }
}

/// Image tags this process built, removed at exit.
static IMAGES: Mutex<Vec<String>> = Mutex::new(Vec::new());

extern "C" fn remove_images_at_exit() {
    let tags = IMAGES.lock().map(|v| v.clone()).unwrap_or_default();
    if !tags.is_empty() {
        let mut args = vec!["rmi", "-f"];
        args.extend(tags.iter().map(String::as_str));
        let _ = Command::new("docker")
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// `tfinit-test-<what>:p<pid>`, registered for removal when the test binary exits.
fn image_tag(what: &str) -> String {
    static AT_EXIT: OnceLock<()> = OnceLock::new();
    AT_EXIT.get_or_init(|| {
        remove_leftovers();
        // SAFETY: registers a plain function; it runs once at exit, after the tests.
        unsafe { libc::atexit(remove_images_at_exit) };
    });
    let tag = format!("tfinit-test-{what}:p{}", pid());
    IMAGES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(tag.clone());
    tag
}

/// Builds an image from `dockerfile` with `context`.
fn build(tag: &str, dockerfile: &Path, context: &Path) {
    docker_ok(
        &[
            "build",
            "-q",
            "-t",
            tag,
            "-f",
            &dockerfile.display().to_string(),
            &context.display().to_string(),
        ],
        Duration::from_secs(600),
    );
}

/// scripts/build-image.sh with the tfinit under test (the real Dockerfile, target image-prebuilt).
fn build_tfinit_image(base: &str, tag: &str) {
    let mut c = Command::new(repo().join("scripts/build-image.sh"));
    c.args(["--no-pull", "--tfinit"])
        .arg(common::tfinit())
        .args([base, tag]);
    let out = run_output(&mut c, Duration::from_secs(600));
    assert!(
        out.status.success(),
        "scripts/build-image.sh {base} {tag} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `docker image inspect -f '{{json .Config.FIELD}}'`, parsed.
fn image_config(tag: &str, field: &str) -> Value {
    let text = docker_ok(
        &[
            "image",
            "inspect",
            "-f",
            &format!("{{{{json .Config.{field}}}}}"),
            tag,
        ],
        START,
    );
    serde_json::from_str(text.trim()).expect("docker prints JSON")
}

/// A container of this test process, removed (with its logs printed when the test failed) on drop.
struct Container {
    name: String,
}

impl Container {
    /// `docker run -d` of `image` as the pod would run it: host network (moto is on the host's
    /// loopback), uid/gid 2000, `hostname`, the state volume at /var/lib/tfinit, `env`.
    fn run(
        what: &str,
        image: &str,
        hostname: &str,
        state: &Path,
        env: &[(String, String)],
    ) -> Self {
        let name = format!("tfinit-test-{what}-{}", pid());
        let _ = docker(&["rm", "-f", &name], START);
        let volume = format!("{}:/var/lib/tfinit", state.display());
        let label = format!("tfinit-test.pid={}", pid());
        let mut args: Vec<String> = [
            "run",
            "-d",
            "--name",
            &name,
            "--label",
            &label,
            "--network",
            "host",
            "--hostname",
            hostname,
            "--user",
            POD_USER,
            "-v",
            &volume,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for (k, v) in env {
            args.push("-e".into());
            args.push(format!("{k}={v}"));
        }
        args.push(image.to_string());
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        docker_ok(&argv, START);
        Container { name }
    }

    /// stdout and stderr of the container so far.
    fn logs(&self) -> String {
        let out = docker(&["logs", &self.name], START);
        let mut s = String::from_utf8_lossy(&out.stdout).into_owned();
        s.push_str(&String::from_utf8_lossy(&out.stderr));
        s
    }

    /// Polls the logs (every 200 ms) until they contain `text`; panics after `timeout`.
    fn wait_log(&self, text: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if self.logs().contains(text) {
                return;
            }
            assert!(
                self.running() || self.logs().contains(text),
                "container {} exited before printing {text:?}",
                self.name
            );
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {text:?} in the logs of {}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn state(&self, field: &str) -> String {
        docker_ok(
            &[
                "inspect",
                "-f",
                &format!("{{{{.State.{field}}}}}"),
                &self.name,
            ],
            START,
        )
        .trim()
        .to_string()
    }

    fn running(&self) -> bool {
        self.state("Running") == "true"
    }

    fn exit_code(&self) -> i32 {
        self.state("ExitCode").parse().expect("an exit code")
    }

    /// `docker stop -t SECS`; returns how long it took.
    fn stop(&self, secs: u32) -> Duration {
        let t0 = Instant::now();
        docker_ok(
            &["stop", "-t", &secs.to_string(), &self.name],
            Duration::from_secs(u64::from(secs) + 60),
        );
        t0.elapsed()
    }

    /// `docker kill` (SIGKILL to the container's PID 1: the whole container dies at once).
    fn kill(&self) {
        docker_ok(&["kill", &self.name], START);
        docker_ok(&["wait", &self.name], START);
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let logs = self.logs();
            let tail: Vec<&str> = logs.lines().rev().take(80).collect();
            eprintln!("---- last lines of the logs of {} ----", self.name);
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
        }
        let _ = docker(&["rm", "-f", &self.name], START);
    }
}

// ----- the images --------------------------------------------------------------------------------

/// tfinit's image on the provider stand-in image; both built once per test process (under SERIAL).
fn tfinit_image() -> &'static str {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let fixtures = repo().join("tests/fixtures/container");
        let ctx = TempDir::new("provider-image");
        let copy = |from: &Path, to: &str| {
            let st = Command::new("cp")
                .arg("-a")
                .arg(from)
                .arg(ctx.join(to))
                .status()
                .expect("cp");
            assert!(st.success(), "cp -a {} {to} failed", from.display());
        };
        copy(Path::new("/bin/busybox"), "busybox");
        copy(&deps().join("bin/terraform"), "terraform");
        copy(&deps().join("plugins"), "plugins");
        copy(&fixtures.join("workspace"), "workspace");
        copy(&fixtures.join("provider.sh"), "provider.sh");
        let provider = image_tag("provider");
        build(&provider, &fixtures.join("provider.Dockerfile"), &ctx.0);
        let tfinit = image_tag("image");
        build_tfinit_image(&provider, &tfinit);
        tfinit
    })
}

/// Whether everything the workspace scenarios need is here (skips or fails through `require`).
fn have_scenario_deps() -> bool {
    let busybox_static = Command::new("file")
        .args(["-L", "/bin/busybox"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("statically linked"))
        .unwrap_or(false);
    require(
        busybox_static,
        "a static /bin/busybox (Debian's busybox-static; scripts/install-test-deps.sh)",
    ) && require(
        deps().join("bin/terraform").is_file()
            && deps().join("plugins/registry.terraform.io").is_dir(),
        "terraform 1.0.3 and the null provider in .test-deps (scripts/install-test-deps.sh)",
    ) && require(
        deps().join("venv/bin/moto_server").exists(),
        "moto_server in .test-deps/venv (scripts/install-test-deps.sh)",
    )
}

// ----- moto (state and lock) -------------------------------------------------------------------

/// A moto server of this test (S3 bucket `tfstate`, DynamoDB table `tflock`), stopped on drop.
struct Moto {
    port: u16,
}

impl Moto {
    fn start() -> Moto {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut c = Command::new(repo().join("scripts/moto.sh"));
        c.args(["start", &port.to_string()]);
        let out = run_output(&mut c, Duration::from_secs(90));
        assert!(
            out.status.success(),
            "scripts/moto.sh start {port} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Moto { port }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn query(&self, what: &str, key: &str) -> Value {
        const PY: &str = r#"
import json, sys, boto3
ep, what, key = sys.argv[1:4]
kw = dict(endpoint_url=ep, region_name="us-east-1", aws_access_key_id="test", aws_secret_access_key="test")
if what == "locks":
    items = boto3.client("dynamodb", **kw).scan(TableName="tflock")["Items"]
    print(json.dumps([json.loads(i["Info"]["S"]) for i in items
                      if i["LockID"]["S"] == "tfstate/" + key and "Info" in i]))
else:
    s3 = boto3.client("s3", **kw)
    try:
        print(s3.get_object(Bucket="tfstate", Key=key)["Body"].read().decode())
    except s3.exceptions.NoSuchKey:
        print("null")
"#;
        let mut c = Command::new(deps().join("venv/bin/python"));
        c.args(["-c", PY, &self.endpoint(), what, key]);
        let out = run_output(&mut c, START);
        assert!(
            out.status.success(),
            "querying moto ({what}) failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("JSON from the query")
    }

    /// The lock items (terraform's LockInfo) held on the state `key`.
    fn locks(&self, key: &str) -> Vec<Value> {
        match self.query("locks", key) {
            Value::Array(v) => v,
            other => panic!("unexpected lock query result {other}"),
        }
    }

    /// The state stored under `key` (Null when there is none).
    fn state(&self, key: &str) -> Value {
        self.query("state", key)
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = Command::new(repo().join("scripts/moto.sh"))
            .args(["stop", &self.port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        // Keep the server's log only when the test failed.
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(deps().join(format!("run/moto-{}.log", self.port)));
        }
    }
}

// ----- one workspace ---------------------------------------------------------------------------

/// A workspace of the controller stand-in: its state key, its state volume, its moto.
struct Workspace {
    moto: Moto,
    uid: String,
    key: String,
    state_dir: TempDir,
}

impl Workspace {
    fn new(name: &str) -> Workspace {
        let state_dir = TempDir::new(&format!("state-{name}"));
        // The pod's uid owns its volume (an emptyDir is world-writable; a PVC gets fsGroup).
        nix::unistd::chown(
            &state_dir.0,
            Some(nix::unistd::Uid::from_raw(2000)),
            Some(nix::unistd::Gid::from_raw(2000)),
        )
        .expect("chown the state volume");
        let uid = format!("ws-{name}-{}", pid());
        Workspace {
            moto: Moto::start(),
            key: format!("tfinit-container/{uid}.tfstate"),
            uid,
            state_dir,
        }
    }

    /// The environment of the controller stand-in plus `extra`.
    fn env(&self, extra: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut env = vec![
            ("WORKSPACE_UID".to_string(), self.uid.clone()),
            ("STATE_KEY".into(), self.key.clone()),
            ("BACKEND_ENDPOINT".into(), self.moto.endpoint()),
            ("EXIT_ON_TERM".into(), CONTROLLER_EXIT.to_string()),
            // Output of runs whose shim is gone is logged at debug.
            ("TFINIT_LOG".into(), "debug".into()),
        ];
        env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        env
    }

    /// The lock-owner records on the state volume.
    fn records(&self) -> Vec<PathBuf> {
        std::fs::read_dir(self.state_dir.join("records"))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default()
    }

    /// The instances of null_resource.a in the stored state.
    fn instances(&self) -> Vec<Value> {
        let state = self.moto.state(&self.key);
        state["resources"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["type"] == "null_resource" && r["name"] == "a")
            .flat_map(|r| r["instances"].as_array().cloned().unwrap_or_default())
            .collect()
    }
}

/// The stand-in controller's exit code after SIGTERM (distinct from 0, 137 and 143).
const CONTROLLER_EXIT: i32 = 3;

/// terraform prints this once the slow creation is under way.
const APPLYING: &str = "null_resource.a: Provisioning with 'local-exec'...";

/// Starts a container and waits until the apply holds the lock and its creation is under way.
fn start_apply(ws: &Workspace, what: &str, hostname: &str, extra: &[(&str, &str)]) -> Container {
    let c = Container::run(
        what,
        tfinit_image(),
        hostname,
        &ws.state_dir.0,
        &ws.env(extra),
    );
    c.wait_log(APPLYING, START);
    let locks = ws.moto.locks(&ws.key);
    assert_eq!(locks.len(), 1, "the apply holds the state lock: {locks:?}");
    c
}

// ----- the scenarios -----------------------------------------------------------------------------

#[test]
fn docker_stop_during_a_slow_apply_lets_the_apply_complete_and_exits_early_with_the_controllers_code(
) {
    let _serial = serial();
    if !have_docker() || !have_scenario_deps() {
        return;
    }
    let ws = Workspace::new("complete");
    // Default budget: 30 s grace, terraform's SIGTERM at 20 s. The creation takes 12 s.
    let c = start_apply(
        &ws,
        "complete",
        "tfinit-test-pod-complete",
        &[("TF_VAR_sleep", "12")],
    );

    let took = c.stop(30);
    eprintln!("measured: docker stop -t 30 during the apply took {took:?}");

    let logs = c.logs();
    assert_eq!(
        c.exit_code(),
        CONTROLLER_EXIT,
        "the controller's exit code is relayed"
    );
    assert!(
        took < Duration::from_secs(20),
        "the container exits once the apply is done, long before the 30 s timeout: took {took:?}"
    );
    assert!(
        logs.contains("provider: SIGKILL to pid"),
        "the controller killed its terraform (the shim)"
    );
    assert!(
        logs.contains("Apply complete! Resources: 1 added"),
        "the apply completed:\n{logs}"
    );
    assert!(
        !logs.contains("Interrupt received"),
        "terraform must not be interrupted:\n{logs}"
    );
    assert!(
        !logs.contains("SIGKILL to terraform"),
        "terraform must not be killed:\n{logs}"
    );
    assert_eq!(
        ws.moto.locks(&ws.key),
        Vec::<Value>::new(),
        "no lock is left"
    );
    let inst = ws.instances();
    assert_eq!(inst.len(), 1, "the resource is in the state");
    assert!(inst[0].get("status").is_none(), "and not tainted: {inst:?}");
    assert_eq!(
        ws.records(),
        Vec::<PathBuf>::new(),
        "the lock-owner record is removed"
    );
}

#[test]
fn docker_stop_with_a_short_timeout_stops_terraform_gracefully_before_dockers_sigkill() {
    let _serial = serial();
    if !have_docker() || !have_scenario_deps() {
        return;
    }
    let ws = Workspace::new("graceful");
    // The budget of `docker stop -t 8`: terraform's SIGTERM at 8 - 5 = 3 s, SIGKILL at 7 s. The
    // creation would take 2 minutes.
    let c = start_apply(
        &ws,
        "graceful",
        "tfinit-test-pod-graceful",
        &[
            ("TF_VAR_sleep", "120"),
            ("TFINIT_GRACE_PERIOD", "8s"),
            ("TFINIT_STOP_TIMEOUT", "5s"),
            ("TFINIT_KILL_MARGIN", "1s"),
        ],
    );

    let took = c.stop(8);
    eprintln!("measured: docker stop -t 8 during the apply took {took:?}");

    let logs = c.logs();
    assert_eq!(
        c.exit_code(),
        CONTROLLER_EXIT,
        "tfinit exits with the controller's code, not Docker's SIGKILL (137):\n{logs}"
    );
    assert!(
        took < Duration::from_secs(8),
        "the container exits before Docker's SIGKILL: took {took:?}"
    );
    assert!(
        took >= Duration::from_millis(2500),
        "terraform is left alone until its step 3 s into the stop, not stopped at once: took {took:?}"
    );
    assert!(
        logs.contains("SIGTERM to terraform (graceful stop"),
        "tfinit asked terraform to stop:\n{logs}"
    );
    assert!(
        logs.contains("Interrupt received"),
        "terraform stopped gracefully:\n{logs}"
    );
    assert!(
        !logs.contains("Two interrupts received"),
        "terraform got exactly one interrupt:\n{logs}"
    );
    assert!(
        !logs.contains("SIGKILL to terraform"),
        "terraform must not be killed:\n{logs}"
    );
    assert_eq!(
        ws.moto.locks(&ws.key),
        Vec::<Value>::new(),
        "no lock is left"
    );
    assert!(
        logs.lines().any(|l| l.contains("terraform exited")
            && l.contains("subcommand=apply")
            && l.contains("exit=exit code 1")),
        "terraform exited by itself after the interrupt (exit code 1, not a signal):\n{logs}"
    );
    assert_eq!(
        ws.records(),
        Vec::<PathBuf>::new(),
        "terraform exited by itself: no record is kept"
    );
}

#[test]
fn a_container_killed_mid_apply_leaves_a_lock_that_the_next_container_on_the_same_state_volume_recovers(
) {
    let _serial = serial();
    if !have_docker() || !have_scenario_deps() {
        return;
    }
    let ws = Workspace::new("recover");
    // A dead owner is one whose heartbeat is older than the TTL.
    let ttl = ("TFINIT_OWNER_TTL", "3s");
    let first_host = "tfinit-test-pod-old";
    let first = start_apply(
        &ws,
        "recover-old",
        first_host,
        &[ttl, ("TF_VAR_sleep", "120")],
    );
    let held = ws.moto.locks(&ws.key).remove(0);
    assert_eq!(
        held["Who"],
        format!("@{first_host}"),
        "uid 2000 has no passwd entry: Who is @hostname"
    );
    assert_eq!(
        ws.records().len(),
        1,
        "the run has a lock-owner record on the state volume"
    );

    first.kill();

    assert_eq!(
        ws.moto.locks(&ws.key),
        vec![held.clone()],
        "SIGKILL of the whole container leaves the lock behind"
    );
    assert_eq!(ws.records().len(), 1, "and the record with it");
    drop(first);

    // A replacement pod: another hostname, the same workspace and state volume, a quick creation.
    let second = Container::run(
        "recover-new",
        tfinit_image(),
        "tfinit-test-pod-new",
        &ws.state_dir.0,
        &ws.env(&[ttl, ("TF_VAR_sleep", "1")]),
    );
    let t0 = Instant::now();
    second.wait_log("provider: reconciled", Duration::from_secs(120));
    eprintln!(
        "measured: the replacement container reconciled {:?} after it started (TFINIT_OWNER_TTL=3s)",
        t0.elapsed()
    );

    let logs = second.logs();
    let id = held["ID"].as_str().expect("a lock ID");
    assert!(
        logs.lines()
            .any(|l| l.contains("force-unlocked its state lock") && l.contains(id)),
        "tfinit released exactly the dead owner's lock {id}:\n{logs}"
    );
    assert!(
        logs.contains("Apply complete! Resources: 1 added"),
        "the workspace reconciled:\n{logs}"
    );
    assert_eq!(
        ws.moto.locks(&ws.key),
        Vec::<Value>::new(),
        "no lock is left"
    );
    let inst = ws.instances();
    assert_eq!(inst.len(), 1, "the resource is in the state");
    assert!(
        inst[0].get("status").is_none(),
        "created by the new pod, not tainted: {inst:?}"
    );
    assert_eq!(
        ws.records(),
        Vec::<PathBuf>::new(),
        "the dead owner's record is gone"
    );
}

// ----- the image ---------------------------------------------------------------------------------

/// A base image FROM scratch with busybox and the given Dockerfile lines.
fn busybox_base(what: &str, lines: &str) -> String {
    let ctx = TempDir::new(&format!("base-{what}"));
    std::fs::copy("/bin/busybox", ctx.join("busybox")).expect("copy busybox");
    std::fs::write(
        ctx.join("Dockerfile"),
        format!("FROM scratch\nCOPY busybox /bin/busybox\n{lines}\n"),
    )
    .unwrap();
    let tag = image_tag(what);
    build(&tag, &ctx.join("Dockerfile"), &ctx.0);
    tag
}

fn have_busybox() -> bool {
    require(
        Path::new("/bin/busybox").is_file(),
        "/bin/busybox (Debian's busybox-static; scripts/install-test-deps.sh)",
    )
}

/// What the stand-in provider of the base images prints about where it runs.
const REPORT: &str = r#"echo "argv: $0 $*"; echo "pid1: $(cat /proc/1/comm)"; t=$(command -v terraform); echo "terraform: $t -> $(readlink $t)"; echo "PATH: $PATH"; exit 5"#;

#[test]
fn an_image_built_on_a_base_runs_the_bases_entrypoint_and_cmd_under_tfinit() {
    let _serial = serial();
    if !have_docker() || !have_busybox() {
        return;
    }
    // Like provider-terraform: the controller is the ENTRYPOINT; here with a CMD too, and no PATH.
    let base = busybox_base(
        "base-entrypoint",
        &format!(
            "ENTRYPOINT {}\nCMD [\"--debug\", \"two words\"]",
            serde_json::json!(["/bin/busybox", "sh", "-c", REPORT, "provider"])
        ),
    );
    let tag = image_tag("image-entrypoint");

    build_tfinit_image(&base, &tag);

    assert_eq!(
        image_config(&tag, "Entrypoint"),
        serde_json::json!(["/usr/local/bin/tfinit", "--"])
    );
    assert_eq!(
        image_config(&tag, "Cmd"),
        serde_json::json!([
            "/bin/busybox",
            "sh",
            "-c",
            REPORT,
            "provider",
            "--debug",
            "two words"
        ]),
        "CMD is the base's ENTRYPOINT followed by its CMD"
    );
    let out = docker(&["run", "--rm", "--user", POD_USER, &tag], START);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(5),
        "the controller's exit code is the container's:\n{stdout}"
    );
    assert!(
        stdout.contains("argv: provider --debug two words"),
        "{stdout}"
    );
    assert!(
        stdout.contains("pid1: tfinit"),
        "tfinit is PID 1:\n{stdout}"
    );
    assert!(
        stdout.contains("terraform: /opt/tfinit/bin/terraform -> /usr/local/bin/tfinit"),
        "the shim comes first on PATH:\n{stdout}"
    );
    assert!(
        stdout.contains(
            "PATH: /opt/tfinit/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        ),
        "a base without PATH gets Docker's default after the shim:\n{stdout}"
    );
}

#[test]
fn an_image_built_on_a_base_keeps_the_bases_cmd_and_path() {
    let _serial = serial();
    if !have_docker() || !have_busybox() {
        return;
    }
    let cmd = serde_json::json!(["/bin/busybox", "sh", "-c", REPORT, "provider", "from-cmd"]);
    let base = busybox_base("base-cmd", &format!("ENV PATH=/custom/bin:/bin\nCMD {cmd}"));
    let tag = image_tag("image-cmd");

    build_tfinit_image(&base, &tag);

    assert_eq!(image_config(&tag, "Cmd"), cmd, "the base's CMD is kept");
    assert_eq!(
        image_config(&tag, "Entrypoint"),
        serde_json::json!(["/usr/local/bin/tfinit", "--"])
    );
    let out = docker(&["run", "--rm", &tag], START);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(5), "{stdout}");
    assert!(stdout.contains("argv: provider from-cmd"), "{stdout}");
    assert!(stdout.contains("pid1: tfinit"), "{stdout}");
    assert!(
        stdout.contains("PATH: /opt/tfinit/bin:/custom/bin:/bin"),
        "the base's PATH follows the shim's directory:\n{stdout}"
    );

    // An image that already runs tfinit is refused rather than wrapped twice (tfinit -- tfinit --).
    let mut c = Command::new(repo().join("scripts/build-image.sh"));
    c.args(["--no-pull", "--tfinit"])
        .arg(common::tfinit())
        .args([tag.as_str(), "tfinit-test-never-built:latest"]);
    let out = run_output(&mut c, START);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("already runs tfinit")
            && stderr.contains("build from the image it was made from"),
        "the refusal says what to do: {stderr}"
    );
    assert!(
        !docker(
            &["image", "inspect", "tfinit-test-never-built:latest"],
            START
        )
        .status
        .success(),
        "nothing was built"
    );
}

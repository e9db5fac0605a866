//! The container tests' harness (tests/container_*.rs): the Docker engine, the tfinit image, one
//! container ([`Container`]) and a workspace of the controller stand-in on moto ([`Workspace`]).
#![allow(dead_code)]

use crate::common;
use crate::common::launch::Config;
use crate::common::moto::Moto;
use crate::common::{deps, repo, require, run_output, TempDir};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// One container scenario at a time: they measure `docker stop` timings on a 2-core machine.
pub static SERIAL: Mutex<()> = Mutex::new(());

/// Crossplane runs provider pods as uid/gid 2000.
pub const POD_USER: &str = "2000:2000";

/// Longest wait for anything that is not an apply (container start, terraform init, moto).
pub const START: Duration = Duration::from_secs(60);

pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn pid() -> u32 {
    std::process::id()
}

/// Runs `docker ARGS` with a deadline.
pub fn docker(args: &[&str], timeout: Duration) -> Output {
    let mut c = Command::new("docker");
    c.args(args).stdin(Stdio::null());
    run_output(&mut c, timeout)
}

/// `docker ARGS`, which must succeed; returns its stdout.
pub fn docker_ok(args: &[&str], timeout: Duration) -> String {
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
pub fn engine() -> &'static Result<String, String> {
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
pub fn have_docker() -> bool {
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
pub fn owner_gone(pid_text: &str) -> bool {
    pid_text
        .parse::<u32>()
        .is_ok_and(|p| p != pid() && !Path::new(&format!("/proc/{p}")).exists())
}

/// Removes containers and images that earlier test processes (now dead) left behind.
pub fn remove_leftovers() {
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
pub static IMAGES: Mutex<Vec<String>> = Mutex::new(Vec::new());

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
pub fn image_tag(what: &str) -> String {
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
pub fn build(tag: &str, dockerfile: &Path, context: &Path) {
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
pub fn build_tfinit_image(base: &str, tag: &str) {
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

/// A container of this test process, removed (with its logs printed when the test failed) on drop.
pub struct Container {
    pub name: String,
}

impl Container {
    /// `docker run -d` of `image` as the pod would run it: host network (moto is on the host's
    /// loopback), uid/gid 2000, `hostname`, the state volume at /var/lib/tfinit, `env`.
    pub fn run(
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
    pub fn logs(&self) -> String {
        let out = docker(&["logs", &self.name], START);
        let mut s = String::from_utf8_lossy(&out.stdout).into_owned();
        s.push_str(&String::from_utf8_lossy(&out.stderr));
        s
    }

    /// Polls the logs (every 200 ms) until they contain `text`; panics after `timeout`.
    pub fn wait_log(&self, text: &str, timeout: Duration) {
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

    pub fn state(&self, field: &str) -> String {
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

    pub fn running(&self) -> bool {
        self.state("Running") == "true"
    }

    pub fn exit_code(&self) -> i32 {
        self.state("ExitCode").parse().expect("an exit code")
    }

    /// `docker stop -t SECS`; returns how long it took.
    pub fn stop(&self, secs: u32) -> Duration {
        let t0 = Instant::now();
        docker_ok(
            &["stop", "-t", &secs.to_string(), &self.name],
            Duration::from_secs(u64::from(secs) + 60),
        );
        t0.elapsed()
    }

    /// `docker kill` (SIGKILL to the container's PID 1: the whole container dies at once).
    pub fn kill(&self) {
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

/// tfinit's image on the provider stand-in image; both built once per test process (under SERIAL).
pub fn tfinit_image() -> &'static str {
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
pub fn have_scenario_deps() -> bool {
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

/// A workspace of the controller stand-in: its state key, its state volume, its moto.
pub struct Workspace {
    pub moto: Moto,
    pub uid: String,
    pub key: String,
    pub state_dir: TempDir,
}

impl Workspace {
    pub fn new(name: &str) -> Workspace {
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

    /// The environment of the controller stand-in plus `extra`: the same [`Config`] every other
    /// harness gives tfinit, here as `docker run -e` pairs (the image's entrypoint is tfinit).
    pub fn env(&self, extra: &[(&str, &str)]) -> Vec<(String, String)> {
        Config::default()
            .set("WORKSPACE_UID", &self.uid)
            .set("STATE_KEY", &self.key)
            .set("BACKEND_ENDPOINT", self.moto.endpoint())
            .set("EXIT_ON_TERM", CONTROLLER_EXIT.to_string())
            // Output of runs whose shim is gone is logged at debug.
            .set("TFINIT_LOG", "debug")
            .with(extra)
            .pairs()
    }

    /// The lock-owner records on the state volume.
    pub fn records(&self) -> Vec<PathBuf> {
        std::fs::read_dir(self.state_dir.join("records"))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default()
    }

    /// The instances of null_resource.a in the stored state.
    pub fn instances(&self) -> Vec<Value> {
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
pub const CONTROLLER_EXIT: i32 = 3;

/// terraform prints this once the slow creation is under way.
pub const APPLYING: &str = "null_resource.a: Provisioning with 'local-exec'...";

/// Starts a container and waits until the apply holds the lock and its creation is under way.
pub fn start_apply(
    ws: &Workspace,
    what: &str,
    hostname: &str,
    extra: &[(&str, &str)],
) -> Container {
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

//! The one way the tests start tfinit as an init (issue 14): PID 1 of a new PID namespace, as in
//! a container, or a plain child subreaper of the test ([`As`]). Every harness builds on
//! [`Launch`]: the PID-1 tests' `pid1_init`, the shim tests' `shim::ShimInit`, the load and bad-input
//! tests' `helper_init`, the slow fixture's `SlowInit` (shutdown, drain, storage) and the pods of
//! `pods` (locks, records, kubernetes). The Docker tests give `docker run` the same [`Config`].
//!
//! What it decides, once for all of them: the test's inherited `TFINIT_*`/`TF_*` variables never
//! reach tfinit ([`common::scrub`] and [`TFINIT_VARS`]); a pod starts from an empty environment;
//! the namespace wrapping (hostname, mounts, uid) is one `sh -c` that ends in `exec tfinit`, so
//! tfinit keeps the pid it started with; the host pid is found the same way everywhere.
#![allow(dead_code)]

use crate::common::{self, TFINIT_VARS};
use std::ffi::{OsStr, OsString};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How tfinit runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum As {
    /// PID 1 of a new PID namespace with its own /proc (unshare), as in a container.
    Pid1,
    /// A plain process of the host: it must register as child subreaper to get orphans.
    Subreaper,
}

/// tfinit's configuration: the variables a pod spec would set, in order (a later one replaces an
/// earlier one of the same name).
#[derive(Debug, Clone, Default)]
pub struct Config {
    pub vars: Vec<(String, OsString)>,
}

impl Config {
    /// `TFINIT_RUN_DIR` and `TFINIT_STATE_DIR` (created here), the two every init needs.
    pub fn dirs(run_dir: &Path, state_dir: &Path) -> Config {
        std::fs::create_dir_all(state_dir)
            .unwrap_or_else(|e| panic!("create the state dir {}: {e}", state_dir.display()));
        Config::default()
            .set("TFINIT_RUN_DIR", run_dir)
            .set("TFINIT_STATE_DIR", state_dir)
    }

    /// Sets `name` (replacing an earlier value).
    pub fn set(mut self, name: &str, value: impl AsRef<OsStr>) -> Config {
        self.vars.retain(|(k, _)| k != name);
        self.vars
            .push((name.to_string(), value.as_ref().to_owned()));
        self
    }

    /// Sets every pair of `vars`, in order.
    pub fn with<K: AsRef<str>, V: AsRef<OsStr>>(mut self, vars: &[(K, V)]) -> Config {
        for (k, v) in vars {
            self = self.set(k.as_ref(), v);
        }
        self
    }

    /// The value of `name`, if set.
    pub fn get(&self, name: &str) -> Option<&OsStr> {
        self.vars
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_os_str())
    }

    /// `NAME=VALUE` pairs as text (for `docker run -e`).
    pub fn pairs(&self) -> Vec<(String, String)> {
        self.vars
            .iter()
            .map(|(k, v)| (k.clone(), v.to_string_lossy().into_owned()))
            .collect()
    }
}

/// Where one of tfinit's output streams goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Out {
    Null,
    /// A pipe the caller reads (`child.stdout` / `child.stderr`).
    Piped,
    /// A file, created (truncated); stdout and stderr to the same path share one file.
    File(PathBuf),
}

impl Out {
    fn stdio(&self) -> Stdio {
        match self {
            Out::Null => Stdio::null(),
            Out::Piped => Stdio::piped(),
            Out::File(p) => std::fs::File::create(p)
                .unwrap_or_else(|e| panic!("create {}: {e}", p.display()))
                .into(),
        }
    }
}

/// How to start one tfinit.
#[derive(Debug, Clone)]
pub struct Launch {
    pub how: As,
    /// PID 1 only: the namespace's hostname (a new UTS namespace), as a pod's name.
    pub hostname: Option<String>,
    /// sh commands run before tfinit is exec'd (as the namespace's root for PID 1: mounts, or a
    /// `trap` that leaves signals ignored); `set -e` holds.
    pub prelude: Option<String>,
    /// PID 1 only: the uid and gid tfinit runs as (setpriv, no supplementary groups), as a pod's
    /// `runAsUser`.
    pub uid: Option<u32>,
    /// `Some(PATH)`: an empty environment with only this PATH, CHECKPOINT_DISABLE and `config`,
    /// as a pod has. `None`: the test's environment scrubbed of TFINIT_*/TF_* ([`common::scrub`]).
    pub bare_env: Option<String>,
    pub config: Config,
    /// tfinit's working directory (the controller inherits it).
    pub cwd: Option<PathBuf>,
    /// tfinit's arguments: `--` and the controller.
    pub args: Vec<OsString>,
    pub stdout: Out,
    pub stderr: Out,
    /// tfinit (unshare, for PID 1) dies with the test process (PR_SET_PDEATHSIG), also when the
    /// test thread dies without unwinding.
    pub die_with_test: bool,
}

impl Launch {
    /// `how`, with `config`, output to /dev/null, running `--` and `controller`.
    pub fn new<S: AsRef<OsStr>>(how: As, config: Config, controller: &[S]) -> Launch {
        let mut args = vec![OsString::from("--")];
        args.extend(controller.iter().map(|a| a.as_ref().to_owned()));
        Launch {
            how,
            hostname: None,
            prelude: None,
            uid: None,
            bare_env: None,
            config,
            cwd: None,
            args,
            stdout: Out::Null,
            stderr: Out::Null,
            die_with_test: false,
        }
    }

    /// The `sh -c` script that runs before tfinit, if anything must (hostname, prelude, uid).
    fn wrapper(&self) -> Option<String> {
        let mut script = vec!["set -e".to_string()];
        if let Some(h) = &self.hostname {
            assert_eq!(self.how, As::Pid1, "a hostname needs a namespace");
            script.push(format!("hostname {h}"));
        }
        if let Some(p) = &self.prelude {
            script.push(p.clone());
        }
        let setpriv = match self.uid {
            Some(u) => {
                assert_eq!(self.how, As::Pid1, "changing uid is for a pod");
                format!("setpriv --reuid {u} --regid {u} --clear-groups ")
            }
            None => String::new(),
        };
        if script.len() == 1 && setpriv.is_empty() {
            return None;
        }
        script.push(format!("exec {setpriv}\"$0\" \"$@\""));
        Some(script.join("; "))
    }

    /// The command that starts tfinit this way (not yet spawned).
    pub fn command(&self) -> Command {
        let mut c = match self.how {
            As::Pid1 => {
                let mut c = common::unshare();
                c.args(["--pid", "--fork", "--mount-proc", "--kill-child"]);
                if self.hostname.is_some() {
                    c.arg("--uts");
                }
                if let Some(script) = self.wrapper() {
                    c.args(["sh", "-c", &script]);
                }
                c.arg(common::tfinit());
                c
            }
            As::Subreaper => match self.wrapper() {
                Some(script) => {
                    let mut c = Command::new("sh");
                    c.args(["-c", &script]).arg(common::tfinit());
                    c
                }
                None => Command::new(common::tfinit()),
            },
        };
        c.args(&self.args);
        match &self.bare_env {
            Some(path) => {
                c.env_clear()
                    .env("PATH", path)
                    .env("CHECKPOINT_DISABLE", "1");
            }
            None => {
                common::scrub(&mut c);
                for v in TFINIT_VARS {
                    c.env_remove(v);
                }
            }
        }
        for (k, v) in &self.config.vars {
            c.env(k, v);
        }
        if let Some(d) = &self.cwd {
            c.current_dir(d);
        }
        c.stdin(Stdio::null());
        match (&self.stdout, &self.stderr) {
            // One file for both: one open file description (one offset), so neither stream
            // overwrites the other.
            (Out::File(a), Out::File(b)) if a == b => {
                let f = std::fs::File::create(a)
                    .unwrap_or_else(|e| panic!("create {}: {e}", a.display()));
                c.stdout(f.try_clone().expect("dup the log file")).stderr(f);
            }
            (out, err) => {
                c.stdout(out.stdio()).stderr(err.stdio());
            }
        }
        if self.die_with_test {
            // SAFETY: prctl is async-signal-safe and touches no memory of ours.
            unsafe {
                c.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
        }
        c
    }

    /// Starts it.
    pub fn spawn(&self) -> Child {
        self.command()
            .spawn()
            .unwrap_or_else(|e| panic!("start tfinit ({:?}): {e}", self.how))
    }
}

/// tfinit's pid as the test sees it: the child itself for a subreaper, or, under `unshare
/// --fork`, unshare's child once it has exec'd tfinit (waited for up to `within`).
pub fn host_pid(how: As, child: &Child, within: Duration) -> i32 {
    match how {
        As::Subreaper => child.id() as i32,
        As::Pid1 => common::tfinit_under(child.id() as i32, within),
    }
}

//! What tfinit knows about a terraform command line: its subcommand, whether it takes the state
//! lock, where it runs (`-chdir`), how to show it without secrets, and where the real binary is.

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Placeholder for redacted values.
pub const REDACTED: &str = "<redacted>";

/// Options whose value is always redacted (they carry variables and backend credentials).
const SECRET_OPTIONS: [&str; 3] = ["var", "var-file", "backend-config"];

/// Key fragments that make a `KEY=VALUE` argument's value a secret.
const SECRET_KEYS: [&str; 9] = [
    "password",
    "passwd",
    "secret",
    "token",
    "key",
    "credential",
    "auth",
    "private",
    "cert",
];

/// Subcommands that acquire the state lock (terraform 1.x, internal/command/*: each of these
/// has a `-lock` flag and calls the backend's state locker). Two-word forms are joined by a space.
/// See docs/notes/terraform-facts.md for the sources.
pub const LOCKING: [&str; 14] = [
    "apply",
    "destroy",
    "plan",
    "refresh",
    "import",
    "taint",
    "untaint",
    "console",
    "state mv",
    "state rm",
    "state push",
    "state replace-provider",
    "workspace new",
    "workspace delete",
];

/// A parsed terraform command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    /// `apply`, `state rm`, `version`... or empty when there is none (`terraform -version`).
    pub subcommand: String,
    /// The `-chdir=DIR` global option, if given.
    pub chdir: Option<String>,
}

impl Invocation {
    /// Parses terraform's arguments (without argv[0]).
    pub fn parse(args: &[String]) -> Invocation {
        let mut chdir = None;
        let mut words: Vec<&str> = Vec::new();
        for a in args {
            if words.is_empty() {
                if let Some(d) = a
                    .strip_prefix("-chdir=")
                    .or_else(|| a.strip_prefix("--chdir="))
                {
                    chdir = Some(d.to_string());
                    continue;
                }
                if a.starts_with('-') {
                    continue;
                }
                words.push(a);
                if !matches!(a.as_str(), "state" | "workspace" | "providers") {
                    break;
                }
            } else {
                if !a.starts_with('-') {
                    words.push(a);
                }
                break;
            }
        }
        Invocation {
            subcommand: words.join(" "),
            chdir,
        }
    }

    /// Whether this command acquires the state lock (and so needs a lock-owner record).
    ///
    /// `init` counts whatever `-lock` says (only `-backend=false` keeps it off the backend): a
    /// remote backend's StateMgr takes the lock to create a workspace's missing state (Operation
    /// `init`) and ignores -lock, and tfinit cannot know the backend before the first init.
    pub fn takes_lock(&self, args: &[String]) -> bool {
        if self.subcommand == "init" {
            return !args.iter().any(|a| {
                a.strip_prefix("--")
                    .or_else(|| a.strip_prefix('-'))
                    .and_then(|o| o.strip_prefix("backend="))
                    .is_some_and(go_false)
            });
        }
        if !LOCKING.contains(&self.subcommand.as_str()) {
            return false;
        }
        // -lock=false disables locking.
        !args
            .iter()
            .any(|a| a == "-lock=false" || a == "--lock=false")
    }

    /// The directory terraform works in: cwd, or cwd joined with -chdir.
    pub fn workdir(&self, cwd: &Path) -> PathBuf {
        match &self.chdir {
            Some(d) => cwd.join(d),
            None => cwd.to_path_buf(),
        }
    }
}

/// Whether Go's flag package reads `v` as false (strconv.ParseBool).
fn go_false(v: &str) -> bool {
    matches!(v, "0" | "f" | "F" | "false" | "FALSE" | "False")
}

/// argv with the values of -var, -var-file, -backend-config and secret-looking `KEY=VALUE`
/// arguments replaced by `<redacted>`.
pub fn redact(args: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len());
    let mut redact_next = false;
    for a in args {
        if redact_next {
            out.push(REDACTED.to_string());
            redact_next = false;
            continue;
        }
        let opt = a.strip_prefix("--").or_else(|| a.strip_prefix('-'));
        if let Some(opt) = opt {
            let (name, value) = match opt.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (opt, None),
            };
            if SECRET_OPTIONS.contains(&name) {
                match value {
                    Some(_) => out.push(format!(
                        "{}={REDACTED}",
                        &a[..a.len() - value.map_or(0, |v| v.len()) - 1]
                    )),
                    None => {
                        out.push(a.clone());
                        redact_next = true;
                    }
                }
                continue;
            }
        }
        out.push(redact_secret_pair(a));
    }
    out
}

fn redact_secret_pair(a: &str) -> String {
    if let Some((k, _)) = a.split_once('=') {
        let lower = k.to_ascii_lowercase();
        if SECRET_KEYS.iter().any(|s| lower.contains(s)) {
            return format!("{k}={REDACTED}");
        }
    }
    a.to_string()
}

/// Why the real terraform binary cannot be found.
#[derive(Debug, thiserror::Error)]
pub enum FindError {
    /// TFINIT_TERRAFORM points at something unusable.
    #[error("TFINIT_TERRAFORM={path:?} {problem}: set it to the real terraform binary, e.g. TFINIT_TERRAFORM=/usr/local/bin/terraform.real")]
    BadOverride {
        /// The value.
        path: String,
        /// What is wrong.
        problem: &'static str,
    },
    /// Nothing on PATH but ourselves.
    #[error("no real {name} on PATH={path:?} besides tfinit's own shim: install {name} later on PATH than the shim, or set TFINIT_TERRAFORM to its path")]
    NotOnPath {
        /// terraform or tofu.
        name: String,
        /// PATH as searched.
        path: String,
    },
}

/// Finds the real binary for `name` (terraform or tofu): TFINIT_TERRAFORM wins, else the first
/// `name` on PATH that is not this very executable (compared by resolved path).
pub fn find_real(
    name: &str,
    override_path: Option<&OsStr>,
    path_var: Option<&OsStr>,
) -> Result<PathBuf, FindError> {
    let me = std::fs::canonicalize("/proc/self/exe").ok();
    if let Some(p) = override_path.filter(|p| !p.is_empty()) {
        let pb = PathBuf::from(p);
        let shown = pb.to_string_lossy().to_string();
        if !is_executable(&pb) {
            return Err(FindError::BadOverride {
                path: shown,
                problem: "is not an executable file",
            });
        }
        if me.is_some() && std::fs::canonicalize(&pb).ok() == me {
            return Err(FindError::BadOverride {
                path: shown,
                problem: "is tfinit itself (the shim)",
            });
        }
        return Ok(pb);
    }
    let path_text = path_var
        .map(|p| p.to_string_lossy().to_string())
        .unwrap_or_default();
    for dir in std::env::split_paths(path_var.unwrap_or_default()) {
        if dir.as_os_str().is_empty() {
            continue;
        }
        let candidate = dir.join(name);
        if !is_executable(&candidate) {
            continue;
        }
        if me.is_some() && std::fs::canonicalize(&candidate).ok() == me {
            continue;
        }
        return Ok(candidate);
    }
    Err(FindError::NotOnPath {
        name: name.to_string(),
        path: path_text,
    })
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn subcommands() {
        assert_eq!(
            Invocation::parse(&s(&["apply", "-auto-approve"])).subcommand,
            "apply"
        );
        assert_eq!(
            Invocation::parse(&s(&["-chdir=x", "plan"]))
                .chdir
                .as_deref(),
            Some("x")
        );
        assert_eq!(
            Invocation::parse(&s(&["state", "rm", "a.b"])).subcommand,
            "state rm"
        );
        assert_eq!(
            Invocation::parse(&s(&["state", "-lock=false", "rm"])).subcommand,
            "state"
        );
        assert_eq!(Invocation::parse(&s(&["-version"])).subcommand, "");
        assert_eq!(
            Invocation::parse(&s(&["workspace", "new", "x"])).subcommand,
            "workspace new"
        );
    }

    #[test]
    fn locking() {
        let a = s(&["apply", "-auto-approve"]);
        assert!(Invocation::parse(&a).takes_lock(&a));
        let a = s(&["apply", "-lock=false"]);
        assert!(!Invocation::parse(&a).takes_lock(&a));
        // init may take the lock (to create a missing state), -lock=false or not.
        for c in [
            &["init"][..],
            &["init", "-lock=false"],
            &["-chdir=x", "init", "-input=false", "-backend=true"],
        ] {
            let a = s(c);
            assert!(Invocation::parse(&a).takes_lock(&a), "{c:?}");
        }
        for c in [
            &["init", "-backend=false"][..],
            &["init", "--backend=0"],
            &["output", "-json"],
            &["show"],
            &["version"],
            &["providers"],
            &["validate"],
            &["state", "list"],
        ] {
            let a = s(c);
            assert!(!Invocation::parse(&a).takes_lock(&a), "{c:?}");
        }
        let a = s(&["state", "rm", "x"]);
        assert!(Invocation::parse(&a).takes_lock(&a));
    }

    #[test]
    fn redaction() {
        let got = redact(&s(&[
            "apply",
            "-var=password=hunter2",
            "-var",
            "token=abc",
            "-var-file=secrets.tfvars",
            "--backend-config=access_key=AKIA",
            "-backend-config",
            "x.hcl",
            "db_password=p",
            "-auto-approve",
            "-target=aws_s3_bucket.key",
        ]));
        assert_eq!(
            got,
            s(&[
                "apply",
                "-var=<redacted>",
                "-var",
                "<redacted>",
                "-var-file=<redacted>",
                "--backend-config=<redacted>",
                "-backend-config",
                "<redacted>",
                "db_password=<redacted>",
                "-auto-approve",
                "-target=aws_s3_bucket.key",
            ])
        );
        assert!(!got.join(" ").contains("hunter2"));
    }
}

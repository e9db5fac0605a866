//! The terraform binaries the integration tests run, so a test can run its body once per version:
//! terraform 1.0.3 of the test dependencies ([`Terraform::legacy`]: scripts/install-test-deps.sh
//! installs it; panicwrap, a wrapper and a wrapped child, or one process with `TF_FORK=0`) and,
//! where one is present, a modern terraform ([`Terraform::modern`]: 1.1 or later, one process;
//! `$TFINIT_TEST_MODERN_TERRAFORM`, else /usr/local/bin/terraform, 1.11.4 on the development and
//! CI machines). No package registry this suite can reach ships a terraform after 1.0.3, so the
//! modern one is never installed: without it, its tests print one SKIP line per test binary
//! saying where it was looked for, and pass.
//!
//! `each_terraform!(name)` makes `name::terraform_1_0_3` and `name::terraform_modern` of a
//! scenario `fn name(tf: &Terraform)`; `Shape::Modern` (tests/common/mod.rs) is the modern
//! terraform for the tests written per process shape. Both use the null provider 2.1.2 of the
//! test dependencies through `-plugin-dir` ([`plugin_dir_arg`]): a protocol 5 provider, which
//! 1.11.4 runs as 1.0.3 does.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use super::{deps, require};

/// The variable that names a modern terraform to test with (a path), before /usr/local/bin.
pub const MODERN_VAR: &str = "TFINIT_TEST_MODERN_TERRAFORM";

/// Where a modern terraform is looked for when [`MODERN_VAR`] is unset.
pub const MODERN_DEFAULT: &str = "/usr/local/bin/terraform";

/// One terraform binary and its version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Terraform {
    path: PathBuf,
    version: (u32, u32, u32),
}

/// How a state on the s3 backend is locked: a DynamoDB table (`dynamodb_table = "tflock"`), the
/// S3-native lock object `<key>.tflock` (`use_lockfile`, terraform 1.10+), or both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum S3Lock {
    /// The DynamoDB table `tflock` ([`super::moto::Moto`] creates it).
    Table,
    /// The lock object next to the state.
    Object,
    /// Both: terraform takes the object, then the table's item.
    Both,
}

impl Terraform {
    /// terraform 1.0.3 of the test dependencies, with the null provider; None (a SKIP line, or a
    /// failure under CI and scripts/test.sh, which install it) when missing.
    pub fn legacy() -> Option<Terraform> {
        static FOUND: OnceLock<Option<Terraform>> = OnceLock::new();
        let found = FOUND.get_or_init(|| {
            let path = deps().join("bin/terraform");
            let plugins = deps().join("plugins/registry.terraform.io/hashicorp/null/2.1.2");
            if !(path.is_file() && plugins.is_dir()) {
                return None;
            }
            Some(Terraform {
                version: version_of(&path).unwrap_or((1, 0, 3)),
                path,
            })
        });
        require(
            found.is_some(),
            "terraform 1.0.3 + the null provider in .test-deps (scripts/install-test-deps.sh)",
        )
        .then(|| found.clone())
        .flatten()
    }

    /// The modern terraform (1.1 or later): `$TFINIT_TEST_MODERN_TERRAFORM`, else
    /// /usr/local/bin/terraform. None when there is none, or it does not run, or it is older:
    /// then one SKIP line per test binary says which and where it was looked for. Never a
    /// failure, not even under CI: no script here can install one. The null provider comes from
    /// the test dependencies, so [`Terraform::legacy`]'s check applies too.
    pub fn modern() -> Option<Terraform> {
        static FOUND: OnceLock<Option<Terraform>> = OnceLock::new();
        Terraform::legacy()?;
        FOUND
            .get_or_init(|| {
                let (path, whence) = match std::env::var_os(MODERN_VAR) {
                    Some(p) => (PathBuf::from(p), format!("${MODERN_VAR}")),
                    None => (
                        PathBuf::from(MODERN_DEFAULT),
                        format!("{MODERN_DEFAULT} (${MODERN_VAR} unset)"),
                    ),
                };
                let skip = |why: String| {
                    eprintln!(
                        "SKIP: the tests on a modern terraform (1.1 or later): {why}; looked for {whence}"
                    );
                    None
                };
                if !path.is_file() {
                    return skip(format!("{} does not exist", path.display()));
                }
                let Some(version) = version_of(&path) else {
                    return skip(format!(
                        "{} does not answer `version -json`",
                        path.display()
                    ));
                };
                if version < (1, 1, 0) {
                    return skip(format!(
                        "{} is terraform {}.{}.{}, not 1.1 or later",
                        path.display(),
                        version.0,
                        version.1,
                        version.2
                    ));
                }
                Some(Terraform { path, version })
            })
            .clone()
    }

    /// The binary.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A directory whose `terraform` is this binary, for PATH (after the shim): its own
    /// directory when the file is named `terraform`, else a directory of links in /tmp.
    pub fn dir(&self) -> PathBuf {
        let parent = self.path.parent().unwrap_or(Path::new("/"));
        if self.path.file_name().is_some_and(|n| n == "terraform") {
            return parent.to_path_buf();
        }
        let dir = PathBuf::from(format!(
            "/tmp/tfinit-test-terraform-{}-{}",
            nix::unistd::getuid(),
            self.version()
        ));
        let _ = std::fs::create_dir_all(&dir);
        let link = dir.join("terraform");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&self.path, &link)
            .unwrap_or_else(|e| panic!("link {} to {}: {e}", link.display(), self.path.display()));
        dir
    }

    /// Its version, `1.0.3`, `1.11.4`.
    pub fn version(&self) -> String {
        let (a, b, c) = self.version;
        format!("{a}.{b}.{c}")
    }

    /// Whether it is at least `major.minor`.
    pub fn at_least(&self, major: u32, minor: u32) -> bool {
        (self.version.0, self.version.1) >= (major, minor)
    }

    /// Whether the started `terraform` is panicwrap's wrapper around a worker (before 1.1; the
    /// worker holds the lock), not the one process that does the work.
    pub fn panicwrap(&self) -> bool {
        !self.at_least(1, 1)
    }

    /// Whether the s3 backend has `use_lockfile` (the S3-native lock object: 1.10 and later).
    pub fn s3_lock_object(&self) -> bool {
        self.at_least(1, 10)
    }

    /// The `-backend-config=` arguments of an s3 backend on moto at `endpoint` that differ by
    /// version (the fixtures keep the rest; tests/fixtures/s3/main.tf is written for 1.0.3, and
    /// s3_pods.rs takes its `dynamodb_table` and `force_path_style` out for 1.6+): 1.6 renamed `endpoint`, `dynamodb_endpoint` and
    /// `force_path_style` to `endpoints = { s3, dynamodb }` and `use_path_style` (the old names
    /// still work, with a deprecation warning), and asks for the account id unless
    /// `skip_requesting_account_id`, which 1.0.3 does not know (it silently accepts unknown
    /// keys, but the new block would name none of its endpoints). `lock` picks the lock.
    pub fn s3_backend_config(&self, endpoint: &str, lock: S3Lock) -> Vec<String> {
        assert!(
            lock == S3Lock::Table || self.s3_lock_object(),
            "terraform {} has no use_lockfile",
            self.version()
        );
        let mut args = if self.at_least(1, 6) {
            vec![
                format!("endpoints={{s3=\"{endpoint}\",dynamodb=\"{endpoint}\"}}"),
                "use_path_style=true".into(),
                "skip_requesting_account_id=true".into(),
            ]
        } else {
            vec![
                format!("endpoint={endpoint}"),
                format!("dynamodb_endpoint={endpoint}"),
                "force_path_style=true".into(),
            ]
        };
        match lock {
            S3Lock::Table => args.push("dynamodb_table=tflock".into()),
            S3Lock::Object => args.push("use_lockfile=true".into()),
            S3Lock::Both => {
                args.push("dynamodb_table=tflock".into());
                args.push("use_lockfile=true".into());
            }
        }
        args.into_iter()
            .map(|a| format!("-backend-config={a}"))
            .collect()
    }

    /// This terraform as a command, with an environment free of the caller's terraform settings
    /// ([`super::scrub`]).
    pub fn command(&self) -> Command {
        let mut c = Command::new(&self.path);
        super::scrub(&mut c);
        c
    }
}

/// `-plugin-dir=` of the test dependencies' providers (the null provider 2.1.2), for `init`.
pub fn plugin_dir_arg() -> String {
    format!("-plugin-dir={}", deps().join("plugins").display())
}

/// What `terraform version -json` says of `path` (1.0.3 has `-json` too), within 30 s.
fn version_of(path: &Path) -> Option<(u32, u32, u32)> {
    let mut c = Command::new(path);
    super::scrub(&mut c).args(["version", "-json"]);
    let child = c
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .ok()?;
    let out = super::wait_output_until(
        child,
        std::time::Instant::now() + Duration::from_secs(30),
        "terraform version -json",
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let mut parts = v["terraform_version"]
        .as_str()?
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().ok());
    Some((parts.next()??, parts.next()??, parts.next()??))
}

/// Generates one test per terraform version for a scenario `fn name(tf: &Terraform)` of the file
/// that declares `#[macro_use] mod common;`: `name::terraform_1_0_3` and `name::terraform_modern`
/// (one SKIP line per test binary when no modern terraform is present).
#[allow(unused_macros)]
macro_rules! each_terraform {
    ($name:ident) => {
        mod $name {
            #[test]
            fn terraform_1_0_3() {
                if let Some(tf) = $crate::common::terraform::Terraform::legacy() {
                    super::$name(&tf)
                }
            }
            #[test]
            fn terraform_modern() {
                if let Some(tf) = $crate::common::terraform::Terraform::modern() {
                    super::$name(&tf)
                }
            }
        }
    };
}

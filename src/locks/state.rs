//! Which state a run's lock guards: a lock belongs to a state (the backend and the settings that
//! name its storage, plus the workspace), never to the directory text a run was started in. Two
//! directories (a symbolic link and its target, two objects whose backends share a key, one
//! working directory per reconcile) can lock one state, and a recovery must count a live run in
//! any of them as a possible holder.
//!
//! Read beside the loop only (the recovery helper): the PID-1 loop never reads a working
//! directory. The rule is one-sided on purpose: two states are different only when they provably
//! differ (a naming setting both stored, with two values; two backend types; two workspaces).
//! Everything tfinit cannot read or follow (a directory not initialised yet, a backend whose
//! settings it does not know, a setting that comes from the environment, a live `init` that may
//! be changing the backend) counts as possibly the same state.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::mutation::{self, Guard};

/// What a run's lock guards, as far as tfinit can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateOf {
    /// The backend settings that name the state, as terraform stored them.
    Known(StateKey),
    /// Not known (the text says why): may be any state.
    Unsure(String),
}

/// A state by what names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateKey {
    /// The backend type (`s3`, `kubernetes`, ..., `local`).
    pub backend: String,
    /// The settings that name the state's storage, by name; None: terraform stored no value (it
    /// comes from the environment or a default), so it proves no difference.
    pub settings: BTreeMap<&'static str, Option<String>>,
    /// The workspace.
    pub workspace: String,
}

/// The settings that name a state's storage (and so its lock), per backend type, from each
/// backend's schema in terraform's and OpenTofu's internal/backend/remote-state/*/backend.go.
/// A backend not listed is unknown: [`StateOf::Unsure`].
fn naming(backend: &str) -> Option<&'static [&'static str]> {
    Some(match backend {
        // `endpoint` stands for `endpoints.s3` too (terraform 1.6+ and OpenTofu).
        "s3" => &[
            "bucket",
            "key",
            "workspace_key_prefix",
            "region",
            "endpoint",
        ],
        "kubernetes" => &["namespace", "secret_suffix", "host"],
        "gcs" => &["bucket", "prefix"],
        "azurerm" => &["storage_account_name", "container_name", "key"],
        "consul" => &["address", "path"],
        "pg" => &["conn_str", "schema_name"],
        "http" => &["address", "lock_address"],
        "oss" | "cos" => &["bucket", "prefix", "key"],
        "local" => &["path", "workspace_dir"],
        _ => return None,
    })
}

/// Whether a run of `a` and a run of `b` may lock the same state: unless they provably differ.
pub fn may_share(a: &StateOf, b: &StateOf) -> bool {
    let (StateOf::Known(a), StateOf::Known(b)) = (a, b) else {
        return true;
    };
    if a.backend != b.backend || a.workspace != b.workspace {
        return false;
    }
    !a.settings
        .iter()
        .any(|(k, va)| matches!((va, b.settings.get(k)), (Some(va), Some(Some(vb))) if va != vb))
}

/// The state a run in `workdir` (whose TF_DATA_DIR was `data_dir`, when it set one) locks for
/// `workspace`: read from the data directory's `terraform.tfstate`, where `terraform init` stores
/// the backend settings after merging `-backend-config`. Resolves symbolic links. Blocking I/O:
/// for the recovery helper only.
pub fn read(workdir: &Path, data_dir: Option<&Path>, workspace: &str) -> StateOf {
    if let Some(by_text) = by_text(workdir, workspace) {
        return by_text;
    }
    let dir = match fs::canonicalize(workdir) {
        Ok(d) => d,
        Err(e) => return StateOf::Unsure(format!("{} cannot be resolved: {e}", workdir.display())),
    };
    let data = match data_dir {
        Some(d) => dir.join(d),
        None => dir.join(".terraform"),
    };
    let file = data.join("terraform.tfstate");
    let mut bytes = Vec::new();
    match fs::File::open(&file) {
        Ok(f) => {
            if let Err(e) = f.take(1 << 20).read_to_end(&mut bytes) {
                return StateOf::Unsure(format!("{} cannot be read: {e}", file.display()));
            }
        }
        // Initialised without a backend: the local one, in the working directory.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && data.is_dir() => {
            return local(&dir, &serde_json::Value::Null, workspace)
        }
        Err(_) if !data.is_dir() => {
            return StateOf::Unsure(format!(
                "{} is not initialised ({} does not exist)",
                dir.display(),
                data.display()
            ))
        }
        Err(e) => return StateOf::Unsure(format!("{} cannot be read: {e}", file.display())),
    }
    match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(v) => of_backend_file(&v, &dir, workspace),
        Err(e) => StateOf::Unsure(format!("{} is not JSON: {e}", file.display())),
    }
}

/// With the state identity turned off (mutation builds only: `mutation::Guard::StateIdentity`),
/// the state as the rules before issue 23 named it: by the working directory's text and the
/// workspace. None otherwise (always, in every other build).
pub fn by_text(workdir: &Path, workspace: &str) -> Option<StateOf> {
    if mutation::on(Guard::StateIdentity) {
        return None;
    }
    let text = workdir.to_string_lossy().into_owned();
    Some(StateOf::Known(StateKey {
        backend: "directory".into(),
        settings: BTreeMap::from([("path", Some(text))]),
        workspace: workspace.to_string(),
    }))
}

/// The state named by a parsed `terraform.tfstate` of a data directory (`v`), for a run in the
/// resolved working directory `dir`. Pure.
pub fn of_backend_file(v: &serde_json::Value, dir: &Path, workspace: &str) -> StateOf {
    let backend = v.get("backend").filter(|b| !b.is_null());
    let Some(backend) = backend else {
        return local(dir, &serde_json::Value::Null, workspace);
    };
    let Some(kind) = backend.get("type").and_then(|t| t.as_str()) else {
        return StateOf::Unsure("its backend has no type".into());
    };
    let null = serde_json::Value::Null;
    let config = backend.get("config").unwrap_or(&null);
    if kind == "local" {
        return local(dir, config, workspace);
    }
    let Some(keys) = naming(kind) else {
        return StateOf::Unsure(format!(
            "tfinit does not know which settings of the {kind} backend name its state"
        ));
    };
    let settings = keys
        .iter()
        .map(|k| {
            let value = match (kind, *k) {
                ("s3", "endpoint") => text(config.get("endpoints").and_then(|e| e.get("s3")))
                    .or_else(|| text(config.get("endpoint"))),
                _ => text(config.get(*k)),
            };
            (*k, value)
        })
        .collect();
    StateOf::Known(StateKey {
        backend: kind.to_string(),
        settings,
        workspace: workspace.to_string(),
    })
}

/// The local backend: its state file, resolved against the working directory.
fn local(dir: &Path, config: &serde_json::Value, workspace: &str) -> StateOf {
    let path = |k: &str, default: &str| -> Option<String> {
        let p: PathBuf = dir.join(text(config.get(k)).unwrap_or_else(|| default.into()));
        Some(p.to_string_lossy().into_owned())
    };
    let settings = BTreeMap::from([
        ("path", path("path", "terraform.tfstate")),
        (
            "workspace_dir",
            path("workspace_dir", "terraform.tfstate.d"),
        ),
    ]);
    StateOf::Known(StateKey {
        backend: "local".into(),
        settings,
        workspace: workspace.to_string(),
    })
}

/// A stored setting as text: None when terraform stored none (null, absent or empty).
fn text(v: Option<&serde_json::Value>) -> Option<String> {
    match v? {
        serde_json::Value::Null => None,
        serde_json::Value::String(s) if s.is_empty() => None,
        serde_json::Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// Why a run of `subcommand` with `argv` (and, for a live run, its environment `env`) may lock a
/// state other than the one its data directory names now, if it may: `init` (with or without
/// `-reconfigure`, `-migrate-state`, `-backend-config`) may be changing the backend while it
/// runs, and so may any command given `-backend-config` through `TF_CLI_ARGS`.
pub fn unsure_reason(subcommand: &str, argv: &[String], env: &[String]) -> Option<String> {
    if subcommand == "init" {
        return Some("an `init` may be changing the backend".into());
    }
    let flag = |a: &str| a.trim_start_matches('-').starts_with("backend-config");
    if argv.iter().any(|a| a.starts_with('-') && flag(a)) {
        return Some("it was given -backend-config".into());
    }
    let cli_args = env.iter().find(|kv| {
        kv.split_once('=').is_some_and(|(k, v)| {
            (k == "TF_CLI_ARGS" || k.starts_with("TF_CLI_ARGS_")) && v.contains("-backend-config")
        })
    });
    cli_args.map(|_| "TF_CLI_ARGS gives it -backend-config".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn s3(key: &str, ws: &str) -> StateOf {
        let v = json!({"version": 3, "backend": {"type": "s3", "config": {
            "bucket": "b", "key": key, "region": "eu-west-1", "endpoints": {"s3": "http://127.0.0.1:5000"},
            "workspace_key_prefix": null, "dynamodb_table": "locks"
        }}});
        of_backend_file(&v, Path::new("/tf/a"), ws)
    }

    #[test]
    fn states_differ_only_when_a_naming_setting_provably_differs() {
        assert!(may_share(&s3("k", "default"), &s3("k", "default")));
        assert!(!may_share(&s3("k", "default"), &s3("other", "default")));
        assert!(!may_share(&s3("k", "default"), &s3("k", "staging")));
        // A setting stored in one and left to the environment in the other: maybe the same.
        let v = json!({"backend": {"type": "s3", "config": {"bucket": "b", "key": "k", "region": null}}});
        let from_env = of_backend_file(&v, Path::new("/tf/b"), "default");
        assert!(may_share(&s3("k", "default"), &from_env));
        // Another backend type: another state.
        let k8s = json!({"backend": {"type": "kubernetes", "config": {"secret_suffix": "k", "namespace": "ns"}}});
        assert!(!may_share(
            &s3("k", "default"),
            &of_backend_file(&k8s, Path::new("/tf/a"), "default")
        ));
    }

    #[test]
    fn what_tfinit_cannot_read_may_be_any_state() {
        let unsure = StateOf::Unsure("not initialised".into());
        assert!(may_share(&unsure, &s3("k", "default")));
        assert!(may_share(&s3("other", "x"), &unsure));
        let v = json!({"backend": {"type": "remote", "config": {"organization": "o"}}});
        assert!(matches!(
            of_backend_file(&v, Path::new("/tf/a"), "default"),
            StateOf::Unsure(_)
        ));
    }

    #[test]
    fn the_older_s3_endpoint_setting_names_the_same_endpoint() {
        let old = json!({"backend": {"type": "s3", "config": {
            "bucket": "b", "key": "k", "region": "eu-west-1", "endpoint": "http://127.0.0.1:5000"}}});
        let old = of_backend_file(&old, Path::new("/tf/x"), "default");
        assert!(may_share(&old, &s3("k", "default")));
        let elsewhere = json!({"backend": {"type": "s3", "config": {
            "bucket": "b", "key": "k", "region": "eu-west-1", "endpoint": "http://127.0.0.1:5001"}}});
        let elsewhere = of_backend_file(&elsewhere, Path::new("/tf/x"), "default");
        assert!(!may_share(&elsewhere, &s3("k", "default")));
    }

    #[test]
    fn a_symlinked_directory_names_the_same_state_as_its_target() {
        let base = std::env::temp_dir().join(format!("tfinit-state-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        let a = base.join("a");
        fs::create_dir_all(a.join(".terraform")).unwrap();
        fs::write(
            a.join(".terraform/terraform.tfstate"),
            r#"{"backend": {"type": "kubernetes", "config": {"secret_suffix": "s", "namespace": "ns"}}}"#,
        )
        .unwrap();
        std::os::unix::fs::symlink(&a, base.join("link")).unwrap();
        let direct = read(&a, None, "default");
        assert!(matches!(direct, StateOf::Known(_)));
        assert_eq!(read(&base.join("link"), None, "default"), direct);
        // The local backend resolves its file through the link too.
        let b = base.join("b");
        fs::create_dir_all(b.join(".terraform")).unwrap();
        std::os::unix::fs::symlink(&b, base.join("link-b")).unwrap();
        assert_eq!(
            read(&base.join("link-b"), None, "default"),
            read(&b, None, "default")
        );
        assert!(!may_share(&read(&b, None, "default"), &direct));
        // Not initialised: unsure.
        let c = base.join("c");
        fs::create_dir_all(&c).unwrap();
        assert!(matches!(read(&c, None, "default"), StateOf::Unsure(_)));
        // TF_DATA_DIR elsewhere: read there.
        let data = base.join("data");
        fs::create_dir_all(&data).unwrap();
        fs::copy(
            a.join(".terraform/terraform.tfstate"),
            data.join("terraform.tfstate"),
        )
        .unwrap();
        assert_eq!(read(&c, Some(&data), "default"), direct);
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn runs_that_may_change_the_backend_are_unsure() {
        let none: Vec<String> = Vec::new();
        assert!(unsure_reason("init", &none, &none).is_some());
        assert!(unsure_reason("apply", &["-backend-config=key=x".into()], &none).is_some());
        assert!(unsure_reason(
            "apply",
            &none,
            &["TF_CLI_ARGS_apply=-backend-config=x".into()]
        )
        .is_some());
        assert_eq!(
            unsure_reason("apply", &["-auto-approve".into()], &none),
            None
        );
        // A value that merely mentions it is no flag.
        assert_eq!(
            unsure_reason("apply", &["-var=x=-backend-config".into()], &none),
            None
        );
    }
}

//! The terraform workspace a run works on, and terraform's data directory of a working directory
//! (`.terraform`, or `$TF_DATA_DIR`): where `terraform workspace select` stores the workspace and
//! `terraform init` the backend.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use super::names::valid_workspace;
use crate::protocol::env_value;

/// terraform's data directory of `workdir`: `$TF_DATA_DIR` (`tf_data_dir`, relative to `workdir`
/// when relative) when set and not empty, else `.terraform`. The one place this is resolved: the
/// shim passes its environment's value, the recovery helper its own (the run's).
pub fn data_dir(workdir: &Path, tf_data_dir: Option<&OsStr>) -> PathBuf {
    let dir = tf_data_dir
        .filter(|d| !d.is_empty())
        .unwrap_or(OsStr::new(".terraform"));
    workdir.join(dir)
}

/// The terraform workspace a run with `args` and environment `env` works on:
/// `workspace new|delete NAME` lock NAME's state; otherwise $TF_WORKSPACE, else `stored` (the
/// workspace `terraform workspace select` stored in the data directory, which the shim reads and
/// sends: see [`stored_workspace`]), else `default`. Pure: reads no file.
pub fn workspace_of(
    args: &[String],
    subcommand: &str,
    env: &[String],
    stored: Option<&str>,
) -> String {
    if subcommand == "workspace new" || subcommand == "workspace delete" {
        let verb = subcommand.trim_start_matches("workspace ");
        let name = args
            .iter()
            .skip_while(|a| *a != "workspace")
            .skip_while(|a| *a != verb)
            .skip(1)
            .find(|a| !a.starts_with('-'));
        if let Some(n) = name.filter(|n| valid_workspace(n)) {
            return n.clone();
        }
    }
    if let Some(w) = env_value(env, "TF_WORKSPACE").filter(|w| valid_workspace(w)) {
        return w.to_string();
    }
    match stored.filter(|w| valid_workspace(w)) {
        Some(w) => w.to_string(),
        None => "default".to_string(),
    }
}

/// The workspace stored in the data directory of `workdir` (`environment` in [`data_dir`]), if
/// there is a valid one. Reads a file in a working directory: only the shim calls it, in its own
/// process, never the init's loop.
pub fn stored_workspace(env: &[String], workdir: &Path) -> Option<String> {
    let tf_data_dir = env_value(env, "TF_DATA_DIR").map(OsStr::new);
    let stored =
        std::fs::read_to_string(data_dir(workdir, tf_data_dir).join("environment")).ok()?;
    let stored = stored.trim();
    valid_workspace(stored).then(|| stored.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_from_args_env_and_data_dir() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let dir = std::env::temp_dir().join(format!("tfinit-ws-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join(".terraform")).unwrap();
        assert_eq!(stored_workspace(&[], &dir), None);
        assert_eq!(workspace_of(&s(&["apply"]), "apply", &[], None), "default");
        std::fs::write(dir.join(".terraform/environment"), "staging\n").unwrap();
        let stored = stored_workspace(&[], &dir);
        assert_eq!(stored.as_deref(), Some("staging"));
        assert_eq!(
            workspace_of(&s(&["apply"]), "apply", &[], stored.as_deref()),
            "staging"
        );
        assert_eq!(
            workspace_of(
                &s(&["apply"]),
                "apply",
                &s(&["TF_WORKSPACE=prod"]),
                stored.as_deref()
            ),
            "prod"
        );
        assert_eq!(
            workspace_of(
                &s(&["workspace", "new", "-lock-timeout=1s", "feature"]),
                "workspace new",
                &s(&["TF_WORKSPACE=prod"]),
                stored.as_deref()
            ),
            "feature"
        );
        // TF_DATA_DIR moves the file; the default one is then not read.
        std::fs::create_dir_all(dir.join("data")).unwrap();
        std::fs::write(dir.join("data/environment"), "other").unwrap();
        assert_eq!(
            stored_workspace(&s(&["TF_DATA_DIR=data"]), &dir).as_deref(),
            Some("other")
        );
        // A stored value that is no valid workspace name is not used, read or sent.
        std::fs::write(dir.join(".terraform/environment"), "../../etc").unwrap();
        assert_eq!(stored_workspace(&[], &dir), None);
        assert_eq!(
            workspace_of(&s(&["plan"]), "plan", &[], Some("../../etc")),
            "default"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_data_directory_is_tf_data_dir_when_set_and_not_empty() {
        let w = Path::new("/tf/x");
        assert_eq!(data_dir(w, None), Path::new("/tf/x/.terraform"));
        assert_eq!(
            data_dir(w, Some(OsStr::new(""))),
            Path::new("/tf/x/.terraform")
        );
        assert_eq!(
            data_dir(w, Some(OsStr::new("data"))),
            Path::new("/tf/x/data")
        );
        assert_eq!(data_dir(w, Some(OsStr::new("/abs"))), Path::new("/abs"));
    }
}

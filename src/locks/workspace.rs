//! The terraform workspace a run works on, and terraform's data directory of a working directory
//! (`.terraform`, or `$TF_DATA_DIR`): where `terraform workspace select` stores the workspace and
//! `terraform init` the backend.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use super::names::valid_workspace;
use crate::protocol::env_value;
use crate::terraform::Invocation;

/// terraform's data directory of `workdir`: `$TF_DATA_DIR` (`tf_data_dir`, relative to `workdir`
/// when relative) when set and not empty, else `.terraform`. The one place this is resolved: the
/// shim passes its environment's value, the recovery helper its own (the run's).
pub fn data_dir(workdir: &Path, tf_data_dir: Option<&OsStr>) -> PathBuf {
    let dir = tf_data_dir
        .filter(|d| !d.is_empty())
        .unwrap_or(OsStr::new(".terraform"));
    workdir.join(dir)
}

/// The terraform workspace a run works on: the workspace its command names
/// (`workspace new|delete|select -or-create NAME`: [`Invocation::workspace_arg`]); otherwise
/// $TF_WORKSPACE, else `stored` (the workspace `terraform workspace select` stored in the data
/// directory, which the shim reads and sends: see [`stored_workspace`]), else `default`. Pure:
/// reads no file.
pub fn workspace_of(invocation: &Invocation, env: &[String], stored: Option<&str>) -> String {
    if let Some(n) = invocation.workspace_arg().filter(|n| valid_workspace(n)) {
        return n.to_string();
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
        let run = |args: &[&str], env: &[&str], stored: Option<&str>| {
            let env = s(env);
            workspace_of(&Invocation::parse(&s(args), &env), &env, stored)
        };
        let dir = std::env::temp_dir().join(format!("tfinit-ws-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join(".terraform")).unwrap();
        assert_eq!(stored_workspace(&[], &dir), None);
        assert_eq!(run(&["apply"], &[], None), "default");
        std::fs::write(dir.join(".terraform/environment"), "staging\n").unwrap();
        let stored = stored_workspace(&[], &dir);
        assert_eq!(stored.as_deref(), Some("staging"));
        assert_eq!(run(&["apply"], &[], stored.as_deref()), "staging");
        assert_eq!(
            run(&["apply"], &["TF_WORKSPACE=prod"], stored.as_deref()),
            "prod"
        );
        assert_eq!(
            run(
                &["workspace", "new", "-lock-timeout=1s", "feature"],
                &["TF_WORKSPACE=prod"],
                stored.as_deref()
            ),
            "feature"
        );
        // NAME is the first operand as Go's flag package reads it: `-lock-timeout 1s` takes the
        // next argument as its value, so `1s` is no workspace.
        assert_eq!(
            run(
                &["workspace", "new", "-lock-timeout", "1s", "feature"],
                &[],
                stored.as_deref()
            ),
            "feature"
        );
        // `select -or-create` creates NAME under NAME's lock; `env` is the old name of `workspace`.
        assert_eq!(
            run(
                &["workspace", "select", "-or-create", "feature"],
                &[],
                stored.as_deref()
            ),
            "feature"
        );
        assert_eq!(
            run(&["env", "new", "--", "feature"], &[], stored.as_deref()),
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
        assert_eq!(run(&["plan"], &[], Some("../../etc")), "default");
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

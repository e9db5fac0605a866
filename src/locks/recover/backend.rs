//! What a working directory was initialised with (its data directory's `terraform.tfstate`: the
//! backend's type and configuration), and the command a person runs to release a lock terraform
//! cannot (kubernetes Lease, s3 DynamoDB item).

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::locks::lockinfo::LockInfo;
use crate::locks::record::Record;
use crate::locks::workspace::data_dir;

/// The data directory of the run of `rec`: the TF_DATA_DIR it recorded (format 4: none recorded
/// means it set none); for an older record, this helper's own (the run's environment).
pub(super) fn record_data_dir(rec: &Record) -> PathBuf {
    match (&rec.data_dir, rec.v >= 4) {
        (Some(d), _) => PathBuf::from(d),
        (None, true) => data_dir(Path::new(&rec.workdir), None),
        (None, false) => run_data_dir(Path::new(&rec.workdir)),
    }
}

/// The backend type a working directory was initialised with (`.terraform/terraform.tfstate`,
/// or `$TF_DATA_DIR/terraform.tfstate`); None when not initialised or local.
pub fn backend_type(workdir: &Path) -> Option<String> {
    read_data_dir(&run_data_dir(workdir)).backend
}

/// The backend configuration a working directory was initialised with (its `config` object, as
/// terraform stored it after merging -backend-config), when there is one.
pub fn backend_config(workdir: &Path) -> Option<serde_json::Value> {
    read_data_dir(&run_data_dir(workdir)).config
}

/// What a run's data directory holds, as far as recovery asks.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DataDir {
    /// The directory exists (`terraform init` ran there, or is running).
    pub exists: bool,
    /// The backend type terraform stored (`.terraform/terraform.tfstate`); None: local or none.
    pub backend: Option<String>,
    /// The backend configuration terraform stored (after merging -backend-config), if any.
    pub config: Option<serde_json::Value>,
}

/// What data directory `data_dir` holds: whether it exists, and the backend's type and
/// configuration terraform stored there (one read of its `terraform.tfstate`).
pub(super) fn read_data_dir(data_dir: &Path) -> DataDir {
    let mut stored = backend_file(data_dir);
    let backend = stored.as_mut().and_then(|v| v.get_mut("backend"));
    let kind = backend
        .as_ref()
        .and_then(|b| b.get("type")?.as_str())
        .map(str::to_string);
    DataDir {
        exists: data_dir.is_dir(),
        backend: kind,
        config: backend.and_then(|b| Some(b.get_mut("config")?.take())),
    }
}

/// The namespace and name of terraform's Lease for `workspace` on the kubernetes backend
/// (client.go: `lock-tfstate-<workspace>-<secret_suffix>`; the namespace defaults to
/// $KUBE_NAMESPACE, else `default`, as backend.go does).
pub fn kubernetes_lease(config: &serde_json::Value, workspace: &str) -> (String, String) {
    let text = |k: &str| {
        config
            .get(k)
            .and_then(|v| v.as_str())
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    };
    let namespace = text("namespace")
        .or_else(|| {
            std::env::var("KUBE_NAMESPACE")
                .ok()
                .filter(|n| !n.is_empty())
        })
        .unwrap_or_else(|| "default".into());
    let suffix = text("secret_suffix").unwrap_or_default();
    (namespace, format!("lock-tfstate-{workspace}-{suffix}"))
}

/// The command a person runs to release `info`, a lock terraform cannot release because the
/// state is missing: for kubernetes, a merge patch that empties the Lease's holder and lock info
/// (what terraform's own Unlock does); for s3, a DynamoDB delete of exactly that lock item.
pub fn release_command(
    backend: &str,
    config: &serde_json::Value,
    workspace: &str,
    info: &LockInfo,
) -> String {
    match backend {
        "kubernetes" => {
            let (namespace, lease) = kubernetes_lease(config, workspace);
            let patch = serde_json::json!({
                "metadata": {"annotations": {"app.terraform.io/lock-info": null}},
                "spec": {"holderIdentity": null},
            });
            format!(
                "kubectl -n {} patch lease {} --type=merge -p {}",
                shell_quote(&namespace),
                shell_quote(&lease),
                shell_quote(&patch.to_string())
            )
        }
        "s3" => {
            let table = config
                .get("dynamodb_table")
                .and_then(|v| v.as_str())
                .unwrap_or("TABLE");
            let endpoint = config
                .get("dynamodb_endpoint")
                .and_then(|v| v.as_str())
                .filter(|e| !e.is_empty())
                .map(|e| format!(" --endpoint-url {}", shell_quote(e)))
                .unwrap_or_default();
            let key = serde_json::json!({"LockID": {"S": info.path}});
            let id = serde_json::json!({":id": {"S": info.id}});
            format!(
                "aws dynamodb delete-item{endpoint} --table-name {} --key {} --condition-expression 'contains(Info, :id)' --expression-attribute-values {}",
                shell_quote(table),
                shell_quote(&key.to_string()),
                shell_quote(&id.to_string())
            )
        }
        other => format!(
            "the {other} backend's own tools: remove the lock {} of state {} (terraform cannot, while the state is missing)",
            info.id, info.path
        ),
    }
}

/// `s` as one shell word: single-quoted, with each `'` written as `'\''`.
fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@,".contains(c))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// terraform's data directory of `workdir` for this process, which runs with the run's environment
/// (its TF_DATA_DIR).
fn run_data_dir(workdir: &Path) -> PathBuf {
    data_dir(workdir, std::env::var_os("TF_DATA_DIR").as_deref())
}

/// `terraform.tfstate` of the data directory `data_dir`, parsed.
fn backend_file(data_dir: &Path) -> Option<serde_json::Value> {
    let file = data_dir.join("terraform.tfstate");
    let mut bytes = Vec::new();
    fs::File::open(file)
        .ok()?
        .take(1 << 20)
        .read_to_end(&mut bytes)
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

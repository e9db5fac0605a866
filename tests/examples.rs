//! The adoption artifacts agree with tfinit: the Kubernetes manifests in examples/kubernetes/ (parsed
//! with PyYAML from .test-deps; each workload's tfinit settings are validated by tfinit's own
//! command-line and configuration code, and its budget, volume, downward-API fields and preStop
//! hook are checked), and the Dockerfile (its two final stages identical, the entrypoint, the shim
//! on PATH, the build context).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use clap::Parser;
use common::dockerfile::dockerfile;
use common::{deps, repo, require};
use serde_json::Value;
use tfinit::cli::{Cli, Command as Sub, InitArgs};
use tfinit::config::{InitConfig, StoreSetting};
use tfinit::duration::parse_duration;

/// Room between tfinit's deadline and the kubelet's SIGKILL: the preStop hook's start, the
/// delivery of SIGTERM, the kubelet's own timing.
const MARGIN: Duration = Duration::from_secs(30);

/// A pod name as the downward API would give it, for settings taken from `metadata.name`.
const POD_NAME: &str = "provider-terraform-7d9f8b6c5-x2x9q";

fn python_with_yaml() -> Option<PathBuf> {
    let py = deps().join("venv/bin/python");
    let ok = Command::new(&py)
        .args(["-c", "import yaml"])
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some(py)
}

/// The YAML documents of a file, as JSON values (PyYAML's safe loader: what kubectl would accept
/// as YAML, not its schema).
fn yaml_docs(py: &Path, file: &Path) -> Vec<Value> {
    let out = Command::new(py)
        .args([
            "-c",
            "import json, sys, yaml\nprint(json.dumps([d for d in yaml.safe_load_all(open(sys.argv[1])) if d is not None]))",
        ])
        .arg(file)
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "{} is not valid YAML:\n{}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    match serde_json::from_slice(&out.stdout).expect("JSON from python") {
        Value::Array(docs) => docs,
        other => panic!("unexpected {other}"),
    }
}

fn examples() -> Vec<PathBuf> {
    let dir = repo().join("examples/kubernetes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("examples/kubernetes/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    files
}

/// Every `TFINIT_*` variable name that appears as a string literal in src/ (what tfinit reads).
fn known_variables() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut stack = vec![repo().join("src")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            for (i, _) in text.match_indices("\"TFINIT_") {
                let name: String = text[i + 1..]
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                if text[i + 1 + name.len()..].starts_with('"') {
                    out.insert(name);
                }
            }
        }
    }
    out
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|s| s.as_str().expect("a string").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// An environment variable of a container: a literal value or a downward-API field.
#[derive(Debug, Clone, PartialEq)]
enum EnvVar {
    Value(String),
    Field(String),
    Other,
}

fn env_of(container: &Value) -> BTreeMap<String, EnvVar> {
    container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let name = e["name"].as_str().expect("env name").to_string();
            let var = if let Some(v) = e.get("value") {
                EnvVar::Value(match v {
                    Value::String(s) => s.clone(),
                    other => {
                        panic!("env {name}: value must be a string in Kubernetes, got {other}")
                    }
                })
            } else if let Some(f) = e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                EnvVar::Field(f.to_string())
            } else {
                EnvVar::Other
            };
            (name, var)
        })
        .collect()
}

/// What the Dockerfile's image runs: `ENTRYPOINT ["/usr/local/bin/tfinit", "--"]`.
fn image_entrypoint() -> Vec<String> {
    let df = dockerfile();
    let image = df.stage("image");
    let ep = image
        .iter()
        .find_map(|i| i.strip_prefix("ENTRYPOINT "))
        .expect("the image stage sets ENTRYPOINT");
    serde_json::from_str(ep).expect("ENTRYPOINT in exec form")
}

/// `assert!` that returns the message as an error instead of panicking.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

/// `assert_eq!` that returns the message (and both sides) as an error.
macro_rules! ensure_eq {
    ($a:expr, $b:expr, $($msg:tt)+) => {
        if $a != $b {
            return Err(format!("{}: {:?} != {:?}", format!($($msg)+), $a, $b));
        }
    };
}

/// Checks one workload's pod spec; `file_docs` are the other documents of its file. Returns what
/// is wrong (a Result, not a panic, so the negative test needs no panic hook).
fn check_workload(
    file: &str,
    kind: &str,
    pod: &Value,
    container: &Value,
    file_docs: &[Value],
) -> Result<(), String> {
    let ctx = format!("{file} ({kind}, container {})", container["name"]);
    let entrypoint = image_entrypoint();

    // The command: the image's entrypoint, then the controller (not its flags).
    let command = strings(&container["command"]);
    ensure!(
        command.len() >= 3 && command[..2] == entrypoint[..] && !command[2].starts_with('-'),
        "{ctx}: command must be {entrypoint:?} followed by the controller, got {command:?}"
    );
    let cli = Cli::try_parse_from(&command)
        .map_err(|e| format!("{ctx}: tfinit rejects {command:?}: {e}"))?;
    ensure!(
        cli.command.is_none(),
        "{ctx}: the command runs the init, not a subcommand"
    );
    let main: Vec<String> = cli
        .main
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    ensure_eq!(
        main.as_slice(),
        &command[2..],
        "{ctx}: everything after -- is the controller's command"
    );

    // Every TFINIT_* variable is one tfinit reads, and together they are a configuration tfinit
    // accepts (it refuses, e.g., STOP_TIMEOUT + KILL_MARGIN >= GRACE_PERIOD).
    let env = env_of(container);
    let known = known_variables();
    for name in env.keys().filter(|n| n.starts_with("TFINIT_")) {
        ensure!(
            known.contains(name),
            "{ctx}: tfinit does not read {name} (it reads {known:?})"
        );
    }
    let mut odd = Vec::new();
    let mut value = |k: &str| match env.get(k) {
        Some(EnvVar::Value(v)) => Some(v.clone()),
        Some(EnvVar::Field(f)) if f == "metadata.name" => Some(POD_NAME.to_string()),
        Some(other) => {
            odd.push(format!("{k} is {other:?}"));
            None
        }
        None => None,
    };
    let args = InitArgs {
        forward: value("TFINIT_FORWARD"),
        rewrite: value("TFINIT_REWRITE"),
        grace_period: value("TFINIT_GRACE_PERIOD"),
        stop_timeout: value("TFINIT_STOP_TIMEOUT"),
        kill_margin: value("TFINIT_KILL_MARGIN"),
        log: value("TFINIT_LOG"),
        log_format: value("TFINIT_LOG_FORMAT"),
        run_dir: value("TFINIT_RUN_DIR").map(PathBuf::from),
        state_dir: value("TFINIT_STATE_DIR").map(PathBuf::from),
        store: value("TFINIT_STORE"),
        owner: value("TFINIT_OWNER"),
        owner_ttl: value("TFINIT_OWNER_TTL"),
        older_owner_ttl: value("TFINIT_OLDER_OWNER_TTL"),
        record_timeout: value("TFINIT_RECORD_TIMEOUT"),
        force_unlock: value("TFINIT_FORCE_UNLOCK"),
        metrics_addr: value("TFINIT_METRICS_ADDR"),
        max_runs: value("TFINIT_MAX_RUNS"),
    };
    ensure!(odd.is_empty(), "{ctx}: tfinit needs values: {odd:?}");
    let cfg = InitConfig::from_args(&args, None)
        .map_err(|e| format!("{ctx}: tfinit refuses its settings: {e}"))?;
    // Records in files need TFINIT_STATE_DIR on a volume; in Leases (auto, kubernetes) no volume.
    let files = cfg.store == StoreSetting::File;
    let required: &[&str] = if files {
        &[
            "TFINIT_GRACE_PERIOD",
            "TFINIT_STOP_TIMEOUT",
            "TFINIT_STATE_DIR",
            "TFINIT_OWNER_TTL",
        ]
    } else {
        &[
            "TFINIT_GRACE_PERIOD",
            "TFINIT_STOP_TIMEOUT",
            "TFINIT_OWNER_TTL",
        ]
    };
    for &k in required {
        ensure!(
            env.contains_key(k),
            "{ctx}: set {k} explicitly (its default does not fit runs of minutes)"
        );
    }

    // Identity from the downward API: the pod name (unique per pod) and the pod UID.
    ensure_eq!(
        env.get("TFINIT_OWNER"),
        Some(&EnvVar::Field("metadata.name".into())),
        "{ctx}: TFINIT_OWNER must be the pod's name (never a fixed name)"
    );
    let uid = env.get("TFINIT_POD_UID").or_else(|| env.get("POD_UID"));
    ensure_eq!(
        uid,
        Some(&EnvVar::Field("metadata.uid".into())),
        "{ctx}: TFINIT_POD_UID (or POD_UID) must come from metadata.uid"
    );

    // The state directory is a mounted volume of the pod; with the Lease store, the service
    // account may manage Leases (Crossplane's providers may already).
    let mounts = container["volumeMounts"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mount = mounts
        .iter()
        .find(|m| m["mountPath"].as_str().map(Path::new) == Some(cfg.state_dir.as_path()));
    if !files && mount.is_none() {
        if kind == "Deployment" {
            may_manage_leases(&ctx, pod, file_docs)?;
        }
    } else {
        check_state_volume(&ctx, kind, pod, mount, &cfg, file_docs)?;
    }
    check_hook_and_budget(&ctx, pod, container, command, &cfg)
}

/// The Role rule the Lease store needs (tfinit::kube::ROLE_RULE), bound to the pod's service
/// account by a RoleBinding, all in the example's file.
fn may_manage_leases(ctx: &str, pod: &Value, file_docs: &[Value]) -> Result<(), String> {
    let sa = pod["serviceAccountName"]
        .as_str()
        .ok_or_else(|| format!("{ctx}: the Lease store needs the pod's serviceAccountName"))?;
    let verbs = ["get", "list", "create", "update", "delete"];
    let role = file_docs
        .iter()
        .find(|d| {
            d["kind"] == "Role"
                && d["rules"].as_array().into_iter().flatten().any(|r| {
                    strings(&r["apiGroups"])
                        .iter()
                        .any(|g| g == "coordination.k8s.io")
                        && strings(&r["resources"]).iter().any(|x| x == "leases")
                        && verbs
                            .iter()
                            .all(|v| strings(&r["verbs"]).iter().any(|x| x == v))
                })
        })
        .ok_or_else(|| {
            format!(
                "{ctx}: no Role in the file with the rule {}",
                tfinit::kube::ROLE_RULE
            )
        })?;
    let bound = file_docs.iter().any(|d| {
        d["kind"] == "RoleBinding"
            && d["roleRef"]["kind"] == "Role"
            && d["roleRef"]["name"] == role["metadata"]["name"]
            && d["subjects"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|s| s["kind"] == "ServiceAccount" && s["name"] == sa)
    });
    ensure!(
        bound,
        "{ctx}: no RoleBinding binds the Role to the service account {sa}"
    );
    ensure!(
        file_docs
            .iter()
            .any(|d| d["kind"] == "ServiceAccount" && d["metadata"]["name"] == sa),
        "{ctx}: the ServiceAccount {sa} is not in the file"
    );
    Ok(())
}

/// TFINIT_STATE_DIR is a writable volume of the pod (`mount`: what is mounted there).
fn check_state_volume(
    ctx: &str,
    kind: &str,
    pod: &Value,
    mount: Option<&Value>,
    cfg: &InitConfig,
    file_docs: &[Value],
) -> Result<(), String> {
    let mount = mount.ok_or_else(|| {
        format!(
            "{ctx}: nothing is mounted at TFINIT_STATE_DIR={:?}",
            cfg.state_dir
        )
    })?;
    ensure!(
        mount["readOnly"] != true,
        "{ctx}: the state volume must be writable"
    );
    let volume = pod["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == mount["name"])
        .ok_or_else(|| format!("{ctx}: the pod has no volume {}", mount["name"]))?;
    if let Some(claim) = volume["persistentVolumeClaim"]["claimName"].as_str() {
        let pvc = file_docs
            .iter()
            .find(|d| d["kind"] == "PersistentVolumeClaim" && d["metadata"]["name"] == claim)
            .ok_or_else(|| {
                format!("{ctx}: the PersistentVolumeClaim {claim} is not in the file")
            })?;
        if strings(&pvc["spec"]["accessModes"])
            .iter()
            .any(|m| m == "ReadWriteOnce")
            && kind == "Deployment"
        {
            ensure_eq!(
                file_docs
                    .iter()
                    .find(|d| d["kind"] == "Deployment")
                    .unwrap()["spec"]["strategy"]["type"],
                "Recreate",
                "{ctx}: a ReadWriteOnce volume needs strategy Recreate (one pod at a time)"
            );
        }
        ensure!(
            pod["securityContext"]["fsGroup"].is_number(),
            "{ctx}: a PVC needs fsGroup to be writable by the pod's uid"
        );
    } else {
        ensure!(
            volume.get("emptyDir").is_some(),
            "{ctx}: the state volume is an emptyDir or a PVC"
        );
    }
    Ok(())
}

/// The preStop hook and the shutdown budget of the workload running `command`.
fn check_hook_and_budget(
    ctx: &str,
    pod: &Value,
    container: &Value,
    command: Vec<String>,
    cfg: &InitConfig,
) -> Result<(), String> {
    // The preStop hook drains with a timeout, with the same binary.
    let hook = strings(&container["lifecycle"]["preStop"]["exec"]["command"]);
    ensure_eq!(
        hook.first(),
        command.first(),
        "{ctx}: the preStop hook runs tfinit: {hook:?}"
    );
    let drain = Cli::try_parse_from(&hook)
        .map_err(|e| format!("{ctx}: tfinit rejects the hook {hook:?}: {e}"))?;
    let Some(Sub::Drain {
        wait: true,
        timeout: Some(t),
    }) = drain.command
    else {
        return Err(format!(
            "{ctx}: the preStop hook must be `tfinit drain --wait --timeout D`, got {hook:?}"
        ));
    };
    let drain_timeout =
        parse_duration(&t).map_err(|e| format!("{ctx}: drain --timeout {t:?}: {e}"))?;

    // The budget: the kubelet counts the hook inside the grace period, tfinit's clock starts at
    // SIGTERM.
    let tgps = pod["terminationGracePeriodSeconds"]
        .as_u64()
        .ok_or_else(|| format!("{ctx}: set terminationGracePeriodSeconds"))?;
    let need = drain_timeout + cfg.grace_period + MARGIN;
    ensure!(
        Duration::from_secs(tgps) >= need,
        "{ctx}: terminationGracePeriodSeconds {tgps} < drain --timeout {drain_timeout:?} + TFINIT_GRACE_PERIOD {:?} + {MARGIN:?}",
        cfg.grace_period
    );
    Ok(())
}

#[test]
fn the_kubernetes_examples_parse_and_agree_with_tfinits_variables() {
    let Some(py) = python_with_yaml() else {
        require(
            false,
            "PyYAML in .test-deps/venv (scripts/install-test-deps.sh)",
        );
        return;
    };
    let files = examples();
    assert!(
        files.len() >= 2,
        "examples/kubernetes/ has the Crossplane and the Deployment examples"
    );
    let mut kinds = BTreeSet::new();
    for file in &files {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let docs = yaml_docs(&py, file);
        let mut workloads = 0;
        for doc in &docs {
            assert!(
                doc["apiVersion"].is_string()
                    && doc["kind"].is_string()
                    && doc["metadata"]["name"].is_string(),
                "{name}: every document has apiVersion, kind and metadata.name: {doc}"
            );
            kinds.insert(doc["kind"].as_str().unwrap().to_string());
            match doc["kind"].as_str().unwrap() {
                "DeploymentRuntimeConfig" => {
                    assert_eq!(doc["apiVersion"], "pkg.crossplane.io/v1beta1", "{name}");
                    let spec = &doc["spec"]["deploymentTemplate"]["spec"];
                    assert!(
                        spec["selector"].is_object(),
                        "{name}: deploymentTemplate.spec.selector is required (`{{}}` will do)"
                    );
                    let pod = &spec["template"]["spec"];
                    let container = pod["containers"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find(|c| c["name"] == "package-runtime")
                        .unwrap_or_else(|| {
                            panic!(
                                "{name}: Crossplane only merges a container named package-runtime"
                            )
                        });
                    check_workload(&name, "DeploymentRuntimeConfig", pod, container, &docs)
                        .unwrap_or_else(|e| panic!("{e}"));
                    let drc = doc["metadata"]["name"].as_str().unwrap();
                    assert!(
                        docs.iter().any(|d| d["kind"] == "Provider"
                            && d["spec"]["runtimeConfigRef"]["name"] == drc),
                        "{name}: a Provider refers to the DeploymentRuntimeConfig {drc}"
                    );
                    workloads += 1;
                }
                "Deployment" => {
                    let spec = &doc["spec"];
                    let labels = &spec["template"]["metadata"]["labels"];
                    for (k, v) in spec["selector"]["matchLabels"]
                        .as_object()
                        .expect("selector.matchLabels")
                    {
                        assert_eq!(
                            &labels[k], v,
                            "{name}: the selector matches the pod's labels"
                        );
                    }
                    let pod = &spec["template"]["spec"];
                    let containers: Vec<&Value> = pod["containers"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|c| strings(&c["command"]).first() == image_entrypoint().first())
                        .collect();
                    assert_eq!(containers.len(), 1, "{name}: one container runs tfinit");
                    check_workload(&name, "Deployment", pod, containers[0], &docs)
                        .unwrap_or_else(|e| panic!("{e}"));
                    workloads += 1;
                }
                _ => {}
            }
        }
        assert!(
            workloads > 0,
            "{name}: no DeploymentRuntimeConfig or Deployment to check"
        );
    }
    assert!(
        kinds.contains("DeploymentRuntimeConfig") && kinds.contains("Deployment"),
        "examples cover Crossplane and a plain Deployment: {kinds:?}"
    );
}

#[test]
fn the_examples_check_rejects_a_broken_budget_variable_command_volume_owner_or_hook() {
    let Some(py) = python_with_yaml() else {
        require(
            false,
            "PyYAML in .test-deps/venv (scripts/install-test-deps.sh)",
        );
        return;
    };
    let file = repo().join("examples/kubernetes/deployment.yaml");
    let docs = yaml_docs(&py, &file);
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .unwrap()
        .clone();
    let run = |mutate: &dyn Fn(&mut Value)| {
        let mut d = deployment.clone();
        mutate(&mut d);
        let docs: Vec<Value> = docs
            .iter()
            .map(|x| {
                if x["kind"] == "Deployment" {
                    d.clone()
                } else {
                    x.clone()
                }
            })
            .collect();
        let pod = &d["spec"]["template"]["spec"];
        check_workload("mutated", "Deployment", pod, &pod["containers"][0], &docs).is_err()
    };
    // The container's env entry named `name`.
    fn env_entry<'a>(d: &'a mut Value, name: &str) -> &'a mut Value {
        d["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .find(|e| e["name"] == name)
            .unwrap()
    }
    let caught = [
        ("the unchanged example", run(&|_| {}), false),
        (
            "a grace period the kubelet cuts short",
            run(&|d| d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 600.into()),
            true,
        ),
        (
            "a misspelt variable",
            run(&|d| env_entry(d, "TFINIT_GRACE_PERIOD")["name"] = "TFINIT_GRACE".into()),
            true,
        ),
        (
            "a stop timeout longer than the grace period",
            run(&|d| env_entry(d, "TFINIT_STOP_TIMEOUT")["value"] = "9m".into()),
            true,
        ),
        (
            "flags in place of the controller",
            run(&|d| {
                d["spec"]["template"]["spec"]["containers"][0]["command"] =
                    serde_json::json!(["/usr/local/bin/tfinit", "--", "--debug"])
            }),
            true,
        ),
        (
            "a state directory nothing is mounted at",
            run(&|d| {
                d["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]["mountPath"] =
                    "/data".into()
            }),
            true,
        ),
        (
            "a fixed owner name",
            run(&|d| {
                *env_entry(d, "TFINIT_OWNER") =
                    serde_json::json!({"name": "TFINIT_OWNER", "value": "my-controller"})
            }),
            true,
        ),
        (
            "a preStop hook that does not wait",
            run(&|d| {
                d["spec"]["template"]["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]
                    ["command"] = serde_json::json!(["/usr/local/bin/tfinit", "drain"])
            }),
            true,
        ),
    ];
    for (what, failed, want) in caught {
        assert_eq!(
            failed, want,
            "{what}: check failed = {failed}, expected {want}"
        );
    }
}

#[test]
fn a_lease_store_deployment_without_its_role_or_binding_is_rejected() {
    let Some(py) = python_with_yaml() else {
        require(
            false,
            "PyYAML in .test-deps/venv (scripts/install-test-deps.sh)",
        );
        return;
    };
    let docs = yaml_docs(
        &py,
        &repo().join("examples/kubernetes/deployment-leases.yaml"),
    );
    let check = |docs: &[Value]| {
        let d = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
        let pod = &d["spec"]["template"]["spec"];
        check_workload("mutated", "Deployment", pod, &pod["containers"][0], docs)
    };
    assert_eq!(check(&docs), Ok(()), "the unchanged example");
    for (what, drop) in [("the Role", "Role"), ("the RoleBinding", "RoleBinding")] {
        let without: Vec<Value> = docs.iter().filter(|d| d["kind"] != drop).cloned().collect();
        assert!(check(&without).is_err(), "without {what}");
    }
    let mut fewer = docs.clone();
    for d in fewer.iter_mut().filter(|d| d["kind"] == "Role") {
        d["rules"][0]["verbs"] = serde_json::json!(["get", "list"]);
    }
    let e = check(&fewer).unwrap_err();
    assert!(e.contains("no Role in the file with the rule"), "{e}");
}

// ----- the Dockerfile ----------------------------------------------------------------------------

#[test]
fn the_dockerfile_builds_on_base_image_with_tfinit_as_entrypoint_and_the_shim_first_on_path() {
    let df = dockerfile();
    assert!(
        df.globals.iter().any(|g| g == "ARG BASE_IMAGE"),
        "ARG BASE_IMAGE, without a default, before the first FROM: {:?}",
        df.globals
    );
    let last = df.stages.last().expect("stages");
    assert_eq!(
        last.0, "image",
        "the default target (the last stage) is `image`"
    );
    // The final stages: on the base, identical but for where tfinit comes from.
    let normalized = |name: &str| -> Vec<String> {
        let st = df.stages.iter().find(|s| s.0 == name).unwrap();
        assert_eq!(st.1, "${BASE_IMAGE}", "stage {name} builds on BASE_IMAGE");
        st.2.iter()
            .map(|i| {
                if i.starts_with("COPY ") && i.ends_with(" /usr/local/bin/tfinit") {
                    "COPY <tfinit> /usr/local/bin/tfinit".to_string()
                } else {
                    i.clone()
                }
            })
            .collect()
    };
    assert_eq!(
        normalized("image"),
        normalized("image-prebuilt"),
        "the two final stages drift apart"
    );
    assert!(normalized("image").contains(&"COPY <tfinit> /usr/local/bin/tfinit".to_string()));
    assert_eq!(image_entrypoint(), ["/usr/local/bin/tfinit", "--"]);

    // The shim: the overlay's symlink named terraform points at tfinit, and its directory comes
    // first on PATH.
    let shim = repo().join("docker/overlay/opt/tfinit/bin/terraform");
    let target =
        std::fs::read_link(&shim).expect("docker/overlay/opt/tfinit/bin/terraform is a symlink");
    assert_eq!(target, Path::new("/usr/local/bin/tfinit"));
    let image = df.stage("image");
    assert!(
        image.iter().any(|i| i == "COPY docker/overlay/ /"),
        "{image:?}"
    );
    let path = image
        .iter()
        .find_map(|i| i.strip_prefix("ENV PATH="))
        .expect("ENV PATH=");
    assert!(
        path.starts_with("/opt/tfinit/bin:${PATH"),
        "the shim's directory comes first: {path}"
    );
}

#[test]
fn the_docker_build_context_holds_everything_the_dockerfile_copies() {
    let df = dockerfile();
    let ignore = std::fs::read_to_string(repo().join(".dockerignore")).expect(".dockerignore");
    let included: Vec<&str> = ignore
        .lines()
        .filter_map(|l| l.trim().strip_prefix('!'))
        .map(|l| l.trim_end_matches('/'))
        .collect();
    assert!(
        ignore.lines().any(|l| l.trim() == "*"),
        ".dockerignore starts from nothing"
    );
    for (stage, _, instrs) in &df.stages {
        for i in instrs {
            let Some(args) = i.strip_prefix("COPY ") else {
                continue;
            };
            if args.starts_with("--from") {
                continue;
            }
            let parts: Vec<&str> = args.split_whitespace().collect();
            for src in &parts[..parts.len() - 1] {
                let src = src.trim_end_matches('/');
                if src == "." {
                    // The build stage copies the context: cargo needs these.
                    for need in [
                        "Cargo.toml",
                        "Cargo.lock",
                        ".cargo/config.toml",
                        "src",
                        "tests/support",
                    ] {
                        assert!(
                            included.contains(&need),
                            "stage {stage}: .dockerignore must let {need} in"
                        );
                        assert!(repo().join(need).exists(), "{need} exists");
                    }
                    continue;
                }
                assert!(
                    included.contains(&src),
                    "stage {stage} copies {src}: .dockerignore must let it in"
                );
            }
        }
    }
}

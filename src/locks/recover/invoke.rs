//! Runs the terraform CLI for a probe or an unlock: argv without a shell, in the dead run's
//! working directory, data directory and workspace, non-interactive, with a timeout.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long one terraform probe or unlock may take.
const TERRAFORM_TIMEOUT: Duration = Duration::from_secs(120);
/// Runs terraform with `args` in `workdir`, data directory `data_dir` and `workspace` (argv, no
/// shell), non-interactive, with a timeout. Returns whether it succeeded and its combined output.
pub(super) fn run_terraform(
    terraform: &Path,
    workdir: &Path,
    data_dir: &Path,
    workspace: &str,
    args: &[&str],
) -> Result<(bool, String), String> {
    let mut cmd = Command::new(terraform);
    cmd.args(args).current_dir(workdir);
    // The dead run's data directory, whatever the environment this helper was given says.
    if data_dir == crate::locks::workspace::data_dir(workdir, None) {
        cmd.env_remove("TF_DATA_DIR");
    } else {
        cmd.env("TF_DATA_DIR", data_dir);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("TF_INPUT", "0")
        .env("TF_IN_AUTOMATION", "1")
        .env("TF_WORKSPACE", workspace);
    // Extra arguments from the environment would change what the probe does; debug logs would
    // mix into the output it parses.
    for (k, _) in std::env::vars_os() {
        let k_text = k.to_string_lossy();
        if k_text.starts_with("TF_CLI_ARGS") || k_text.starts_with("TF_LOG") {
            cmd.env_remove(k);
        }
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", terraform.display()))?;
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        if let Some(o) = out.as_mut() {
            let _ = o.take(4 << 20).read_to_end(&mut s);
        }
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        if let Some(e) = err.as_mut() {
            let _ = e.take(4 << 20).read_to_end(&mut s);
        }
        s
    });
    let started = Instant::now();
    let deadline = started + TERRAFORM_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "terraform {} timed out after {}s",
                    args.join(" "),
                    TERRAFORM_TIMEOUT.as_secs()
                ));
            }
            Err(e) => return Err(format!("waiting for terraform failed: {e}")),
        }
    };
    let mut combined = reader.join().unwrap_or_default();
    combined.extend_from_slice(&err_reader.join().unwrap_or_default());
    // How long a probe or unlock took: with the watch, the recovery's whole latency.
    tracing::debug!(
        args = %args.join(" "), exit = %status, seconds = started.elapsed().as_secs_f64(),
        "terraform for the recovery finished"
    );
    Ok((
        status.success(),
        String::from_utf8_lossy(&combined).into_owned(),
    ))
}

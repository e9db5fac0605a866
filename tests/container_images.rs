//! Images built on a base keep the base's entrypoint, cmd and PATH, run under tfinit.
//!
//! tfinit in a real container runtime (Docker), as users adopt it: the image is built with the
//! repository's Dockerfile (through scripts/build-image.sh) on top of a FROM-scratch stand-in for a
//! provider-terraform image (busybox, terraform 1.0.3, the null provider, and a controller stand-in
//! that runs terraform from PATH and SIGKILLs it when SIGTERM cancels its context). State and lock
//! live on a moto server on the host (host network). Checked from the outside: `docker stop` and
//! `docker kill` timings and exit codes, the lock table, the state, the lock-owner records on the
//! state volume, and the container's logs.
//!
//! Without a Docker engine every test here says so in one line and passes (set
//! TFINIT_REQUIRE_DOCKER=1 to make that a failure). Containers and images are named `tfinit-test-*`
//! with this process's pid, removed when a test ends (containers) or the test binary exits
//! (images), and left-overs of test processes that died are removed at the next run.

mod common;
#[path = "common/docker.rs"]
mod docker;

use common::{repo, require, run_output, TempDir};
use docker::*;
use serde_json::Value;
use std::path::Path;
use std::process::Command;

/// `docker image inspect -f '{{json .Config.FIELD}}'`, parsed.
fn image_config(tag: &str, field: &str) -> Value {
    let text = docker_ok(
        &[
            "image",
            "inspect",
            "-f",
            &format!("{{{{json .Config.{field}}}}}"),
            tag,
        ],
        START,
    );
    serde_json::from_str(text.trim()).expect("docker prints JSON")
}

/// A base image FROM scratch with busybox and the given Dockerfile lines.
fn busybox_base(what: &str, lines: &str) -> String {
    let ctx = TempDir::new(&format!("base-{what}"));
    std::fs::copy("/bin/busybox", ctx.join("busybox")).expect("copy busybox");
    std::fs::write(
        ctx.join("Dockerfile"),
        format!("FROM scratch\nCOPY busybox /bin/busybox\n{lines}\n"),
    )
    .unwrap();
    let tag = image_tag(what);
    build(&tag, &ctx.join("Dockerfile"), &ctx.0);
    tag
}

fn have_busybox() -> bool {
    require(
        Path::new("/bin/busybox").is_file(),
        "/bin/busybox (Debian's busybox-static; scripts/install-test-deps.sh)",
    )
}

/// What the stand-in provider of the base images prints about where it runs.
const REPORT: &str = r#"echo "argv: $0 $*"; echo "pid1: $(cat /proc/1/comm)"; t=$(command -v terraform); echo "terraform: $t -> $(readlink $t)"; echo "PATH: $PATH"; exit 5"#;

#[test]
fn an_image_built_on_a_base_runs_the_bases_entrypoint_and_cmd_under_tfinit() {
    let _serial = serial();
    if !have_docker() || !have_busybox() {
        return;
    }
    // Like provider-terraform: the controller is the ENTRYPOINT; here with a CMD too, and no PATH.
    let base = busybox_base(
        "base-entrypoint",
        &format!(
            "ENTRYPOINT {}\nCMD [\"--debug\", \"two words\"]",
            serde_json::json!(["/bin/busybox", "sh", "-c", REPORT, "provider"])
        ),
    );
    let tag = image_tag("image-entrypoint");

    build_tfinit_image(&base, &tag);

    assert_eq!(
        image_config(&tag, "Entrypoint"),
        serde_json::json!(["/usr/local/bin/tfinit", "--"])
    );
    assert_eq!(
        image_config(&tag, "Cmd"),
        serde_json::json!([
            "/bin/busybox",
            "sh",
            "-c",
            REPORT,
            "provider",
            "--debug",
            "two words"
        ]),
        "CMD is the base's ENTRYPOINT followed by its CMD"
    );
    let out = docker(&["run", "--rm", "--user", POD_USER, &tag], START);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(5),
        "the controller's exit code is the container's:\n{stdout}"
    );
    assert!(
        stdout.contains("argv: provider --debug two words"),
        "{stdout}"
    );
    assert!(
        stdout.contains("pid1: tfinit"),
        "tfinit is PID 1:\n{stdout}"
    );
    assert!(
        stdout.contains("terraform: /opt/tfinit/bin/terraform -> /usr/local/bin/tfinit"),
        "the shim comes first on PATH:\n{stdout}"
    );
    assert!(
        stdout.contains(
            "PATH: /opt/tfinit/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        ),
        "a base without PATH gets Docker's default after the shim:\n{stdout}"
    );
}

#[test]
fn an_image_built_on_a_base_keeps_the_bases_cmd_and_path() {
    let _serial = serial();
    if !have_docker() || !have_busybox() {
        return;
    }
    let cmd = serde_json::json!(["/bin/busybox", "sh", "-c", REPORT, "provider", "from-cmd"]);
    let base = busybox_base("base-cmd", &format!("ENV PATH=/custom/bin:/bin\nCMD {cmd}"));
    let tag = image_tag("image-cmd");

    build_tfinit_image(&base, &tag);

    assert_eq!(image_config(&tag, "Cmd"), cmd, "the base's CMD is kept");
    assert_eq!(
        image_config(&tag, "Entrypoint"),
        serde_json::json!(["/usr/local/bin/tfinit", "--"])
    );
    let out = docker(&["run", "--rm", &tag], START);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(5), "{stdout}");
    assert!(stdout.contains("argv: provider from-cmd"), "{stdout}");
    assert!(stdout.contains("pid1: tfinit"), "{stdout}");
    assert!(
        stdout.contains("PATH: /opt/tfinit/bin:/custom/bin:/bin"),
        "the base's PATH follows the shim's directory:\n{stdout}"
    );

    // An image that already runs tfinit is refused rather than wrapped twice (tfinit -- tfinit --).
    let mut c = Command::new(repo().join("scripts/build-image.sh"));
    c.args(["--no-pull", "--tfinit"])
        .arg(common::tfinit())
        .args([tag.as_str(), "tfinit-test-never-built:latest"]);
    let out = run_output(&mut c, START);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("already runs tfinit")
            && stderr.contains("build from the image it was made from"),
        "the refusal says what to do: {stderr}"
    );
    assert!(
        !docker(
            &["image", "inspect", "tfinit-test-never-built:latest"],
            START
        )
        .status
        .success(),
        "nothing was built"
    );
}

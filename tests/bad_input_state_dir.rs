//! An unusable state dir or socket path is named in a warning and runs still work.
//!
//! Bad input to a running init (tfinit as PID 1 of a PID namespace, as in a container): a state
//! directory that is a file, read-only or on a full disk, or holds FIFOs where files go; a regular file where the control socket
//! goes; peers sending a gibibyte of garbage; terraform printing a gibibyte without a newline;
//! a thousand shims connecting at once. Each time the init must keep working (a normal run
//! through the shim succeeds afterwards and the init exits cleanly), and its messages must name
//! the path and say what to do.
//!
//! (The TFINIT_* variables with garbage values are tests/config_errors.rs.)

mod common;
#[path = "common/helper_init.rs"]
mod helper_init;

use common::{read, TempDir};
use helper_init::*;
use std::process::Stdio;
use std::time::{Duration, Instant};

#[test]
fn a_state_dir_that_is_a_file_is_named_in_a_warning_and_runs_still_work() {
    if !root() {
        return;
    }
    let tmp = TempDir::new("bad-state-file");
    let file = tmp.join("state-is-a-file");
    std::fs::write(&file, "not a directory\n").unwrap();
    let init = HelperInit::start(
        &tmp,
        Setup {
            state_dir: Some(&file),
            ..Setup::default()
        },
    );
    let line = init.log_line(&[
        "the lock-owner record store is not usable",
        file.to_str().unwrap(),
    ]);
    assert!(line.contains("mount a writable volume"), "no hint: {line}");
    init.assert_runs_work(&tmp);
    init.stop_cleanly();
    assert_eq!(read(&file), "not a directory\n", "the file was changed");
}

#[test]
fn a_read_only_state_dir_is_named_in_a_warning_and_runs_still_work() {
    if !root() {
        return;
    }
    let tmp = TempDir::new("bad-state-ro");
    let dir = tmp.join("state-ro");
    std::fs::create_dir_all(&dir).unwrap();
    let d = sh_quote(&dir);
    let init = HelperInit::start(
        &tmp,
        Setup {
            before: &format!("mount --bind {d} {d} && mount -o remount,bind,ro {d}"),
            state_dir: Some(&dir),
            ..Setup::default()
        },
    );
    let line = init.log_line(&[
        "the lock-owner record store is not usable",
        dir.to_str().unwrap(),
    ]);
    assert!(line.contains("Read-only file system"), "no cause: {line}");
    assert!(line.contains("mount a writable volume"), "no hint: {line}");
    init.assert_runs_work(&tmp);
    init.stop_cleanly();
    // The read-only mount was the namespace's own: underneath, nothing was written.
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert!(
        left.is_empty(),
        "files appeared under the read-only mount: {left:?}"
    );
}

#[test]
fn a_state_dir_on_a_full_disk_at_start_is_named_in_a_warning_and_runs_still_work() {
    if !root() {
        return;
    }
    let tmp = TempDir::new("bad-state-full");
    let dir = tmp.join("state-full");
    std::fs::create_dir_all(&dir).unwrap();
    let d = sh_quote(&dir);
    let init = HelperInit::start(
        &tmp,
        Setup {
            before: &format!("mount -t tmpfs -o size=16k tmpfs {d} && {}", fill(&d)),
            state_dir: Some(&dir),
            ..Setup::default()
        },
    );
    let line = init.log_line(&[
        "the lock-owner record store is not usable",
        dir.to_str().unwrap(),
    ]);
    assert!(line.contains("No space left on device"), "no cause: {line}");
    assert!(line.contains("mount a writable volume"), "no hint: {line}");
    init.assert_runs_work(&tmp);
    init.stop_cleanly();
}

#[test]
fn a_state_dir_that_fills_up_while_running_costs_the_records_but_not_the_runs() {
    if !root() {
        return;
    }
    let tmp = TempDir::new("bad-state-fills");
    let dir = tmp.join("state-fills");
    std::fs::create_dir_all(&dir).unwrap();
    let d = sh_quote(&dir);
    let filled = tmp.join("filled");
    let init = HelperInit::start(
        &tmp,
        Setup {
            before: &format!("mount -t tmpfs -o size=16k tmpfs {d}"),
            // The controller fills the disk once the init has set up its records: the recorder
            // opens the store beside the loop, and its last write of that set-up is the
            // heartbeat (a bounded wait for it; without it the fill would race the set-up).
            controller_first: &format!(
                "i=0; until ls {d}/owners/*.json >/dev/null 2>&1; do i=$((i+1)); [ $i -gt 1000 ] && echo 'waited 10 s for the heartbeat' >&2 && break; sleep 0.01; done; {} && touch {}",
                fill(&d),
                sh_quote(&filled)
            ),
            state_dir: Some(&dir),
            ..Setup::default()
        },
    );
    init.log_line(&["lock-owner records enabled", dir.to_str().unwrap()]);
    assert!(filled.exists(), "the controller did not fill the disk");
    assert!(!init.stderr().contains("not usable"), "{}", init.stderr());
    // A state-locking run: its record cannot be written; terraform runs all the same.
    init.assert_runs_work(&tmp);
    let line = init.log_line(&["lock-owner record", dir.to_str().unwrap(), "No space left"]);
    assert!(
        line.contains("free space") || line.contains("TFINIT_STATE_DIR"),
        "no hint about what to do: {line}"
    );
    // And again: a full disk is not a reason to stop accepting runs.
    init.assert_runs_work(&tmp);
    init.stop_cleanly();
}

#[test]
fn a_regular_file_at_the_socket_path_is_kept_and_named_and_shims_run_terraform_directly() {
    if !root() {
        return;
    }
    let tmp = TempDir::new("bad-sock-file");
    let run = tmp.join("run");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::set_permissions(&run, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let sock = tfinit::config::socket_path(&run);
    std::fs::write(&sock, "somebody's file\n").unwrap();
    let init = HelperInit::start(
        &tmp,
        Setup {
            run_dir: Some(&run),
            ..Setup::default()
        },
    );
    let line = init.log_line(&["control socket", sock.to_str().unwrap()]);
    assert!(line.contains("is not a socket"), "{line}");
    assert!(line.contains("remove it"), "no hint: {line}");
    assert!(
        line.contains("falls back"),
        "does not say what happens: {line}"
    );

    // The shim cannot reach the init and runs terraform itself (exec: same pid), with a warning
    // that names the socket.
    let log = tmp.join("fake.log");
    let mut cmd = init.shim(
        &["plan"],
        &[
            ("FAKE_TF_ECHO", "1"),
            ("FAKE_TF_EXIT", "4"),
            ("FAKE_TF_LOG", log.to_str().unwrap()),
        ],
    );
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    let shim_pid = child.id() as i32;
    let out = common::wait_output(child, SOON);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "args: plan\n");
    assert!(stderr.contains(sock.to_str().unwrap()), "{stderr}");
    assert!(stderr.contains("directly"), "{stderr}");
    assert_eq!(
        fake_pid_pgid(&log).0,
        shim_pid,
        "terraform was not run by the shim itself"
    );

    // The init still supervises its controller and exits cleanly; the file was never touched.
    init.stop_cleanly();
    assert_eq!(read(&sock), "somebody's file\n");
    assert!(std::fs::symlink_metadata(&sock).unwrap().is_file());
}

#[test]
fn fifos_in_records_and_as_recover_lock_are_named_in_warnings_and_never_hold_up_a_run() {
    if !root() {
        return;
    }
    // Much less than TFINIT_RECORD_TIMEOUT below: a run that starts only because its wait for
    // the record ran out is a failure.
    const DEADLINE: Duration = Duration::from_secs(10);
    let tmp = TempDir::new("bad-state-fifo");
    let state = tmp.join("state");
    let records = state.join("records");
    std::fs::create_dir_all(&records).unwrap();
    let mode = nix::sys::stat::Mode::from_bits_truncate(0o600);
    // Opening either for reading (or writing) without O_NONBLOCK waits for good for the other end.
    let fifo = records.join("stuck.json");
    nix::unistd::mkfifo(&fifo, mode).unwrap();
    let lock = state.join("recover.lock");
    nix::unistd::mkfifo(&lock, mode).unwrap();
    // A dead run's record in the run's working directory, so the run's lock check takes
    // recover.lock first (ended: over without watching its owner for a TTL).
    let work = tmp.join("work");
    let dead = serde_json::json!({
        "v": 1,
        "owner": {"name": "pod-gone", "boot_id": "b", "started_ms": 1, "pid": 1},
        "who": "@pod-gone", "run_id": "r1", "cwd": work, "workdir": work,
        "subcommand": "apply", "argv": ["apply"], "started_ms": 2, "updated_ms": 2,
        "ended": {"ms": 3, "how": "killed by SIGKILL"},
    });
    std::fs::write(
        records.join("pod-gone.b-1-1.r1.json"),
        serde_json::to_vec(&dead).unwrap(),
    )
    .unwrap();

    let init = HelperInit::start(
        &tmp,
        Setup {
            state_dir: Some(&state),
            env: &[
                ("TFINIT_RECORD_TIMEOUT", "60s"),
                ("TFINIT_FORCE_UNLOCK", "auto"),
            ],
            ..Setup::default()
        },
    );
    let started = Instant::now();
    let log = tmp.join("fake.log");
    let out = common::run_output(
        &mut init.shim(
            &["apply", "-auto-approve"],
            &[
                ("FAKE_TF_ECHO", "1"),
                ("FAKE_TF_EXIT", "0"),
                ("FAKE_TF_LOG", log.to_str().unwrap()),
            ],
        ),
        DEADLINE,
    );
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}\n{}", init.stderr());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "args: apply -auto-approve\n"
    );
    assert!(took < DEADLINE, "the run took {took:?}");
    assert!(!stderr.contains("directly"), "the shim fell back: {stderr}");

    let line = init.log_line(&["not a regular file", fifo.to_str().unwrap()]);
    assert!(
        line.contains("a FIFO") && line.contains("remove it"),
        "{line}"
    );
    let line = init.log_line(&["recover.lock", "without the lock check"]);
    assert!(
        line.contains(lock.to_str().unwrap())
            && line.contains("a FIFO")
            && line.contains("remove it"),
        "{line}"
    );
    let log = init.stop_cleanly();
    assert!(!log.contains("renamed aside"), "{log}");
    // Both are left for a person: neither moved nor replaced.
    for f in [&fifo, &lock] {
        let t = std::fs::symlink_metadata(f).unwrap().file_type();
        assert!(
            std::os::unix::fs::FileTypeExt::is_fifo(&t),
            "{} is no longer the FIFO",
            f.display()
        );
    }
}

//! A dead owner's stuck lock is released: by the next pod, by a restarted pod at once, by the
//! same pod's next run, or by a person with the command the init prints.
//!
//! Stuck state locks and their safe release, end to end against a real remote backend: terraform
//! 1.0.3 with the s3 backend on moto (S3 + a DynamoDB lock table, one server per test, stopped
//! when the test ends, also on failure); the first three also on the modern terraform
//! (`each_terraform!`, tests/common/terraform.rs), one process where 1.0.3 has two. Pods are PID namespaces with their own hostname and a
//! shared TFINIT_STATE_DIR; "the pod dies" is SIGKILL of its PID 1, so everything in it dies at
//! once, as on a node loss. Controllers are small sh loops that retry `terraform apply` like a
//! provider's reconcile loop.
//!
//! Facts these tests rely on are in docs/notes/terraform-facts.md; the rules in docs/records.md.

#[macro_use]
mod common;
#[path = "common/s3_pods.rs"]
mod s3_pods;

use common::pods::{
    self, apply_until_success, attempts, heartbeat_ms, lock_holding_terraform, now_ms, text, walk,
    Pod, PodSpec, RETRY, STEP,
};
use common::wait_for;
use s3_pods::*;
use serde_json::json;

each_terraform!(a_pod_killed_mid_apply_leaves_a_stuck_lock_that_the_next_pod_releases_by_itself);

fn a_pod_killed_mid_apply_leaves_a_stuck_lock_that_the_next_pod_releases_by_itself(tf: &Terraform) {
    if !have_deps() {
        return;
    }
    let w = S3World::with("lock-kill", tf, S3Lock::Table);
    let (mut pod_a, rec) = pod_a_mid_apply(&w, "pod-a", Some(NOBODY_UID), false);

    // The record names the run exactly as terraform's lock will, and holds no secret.
    assert_eq!(rec["v"], 4);
    assert_eq!(
        rec["ttl_ms"],
        TTL.as_millis() as u64,
        "the record states its owner's TTL"
    );
    assert_eq!(rec["who"], "@pod-a", "uid {NOBODY_UID} has no passwd entry");
    assert_eq!(rec["owner"]["name"], "pod-a");
    assert_eq!(rec["subcommand"], "apply");
    assert_eq!(rec["workdir"], w.ws.to_str().unwrap());
    assert_eq!(rec["workspace"], "default");
    assert!(rec["argv"]
        .as_array()
        .unwrap()
        .contains(&json!("-var=<redacted>")));
    for f in walk(&w.state) {
        let body = common::read(&f);
        for secret in ["hunter2", "envsecret42", "envsecret43"] {
            assert!(!body.contains(secret), "{secret} in {}", f.display());
        }
    }

    let kill_ms = now_ms();
    pod_a.kill();

    // The lock is stuck, held by exactly the Who the record predicted, by this terraform.
    let lock = w.held().expect("the lock is stuck after the pod died");
    assert_eq!(lock["Who"], rec["who"]);
    assert_eq!(lock["Version"], tf.version());
    let stuck = w.terraform(&["plan", "-input=false", "-no-color", "-lock-timeout=0s"]);
    assert!(
        text(&stuck).contains("Error acquiring the state lock"),
        "{}",
        text(&stuck)
    );
    let left = w.records();
    assert_eq!(left.len(), 1, "the record survives the pod");
    // Its resources in progress as the pod left them (the record is rewritten as they change,
    // so the copy taken mid-apply above may name fewer).
    let in_progress_at_death = left[0].1["in_progress"].as_array().unwrap().len();
    let hb = heartbeat_ms(&w.state, "pod-a");

    // pod-b, same workspace path, on another node, reconciles by itself: it watches pod-a's
    // heartbeat for a TTL on its own clock (no kernel proof reaches across nodes).
    let out = w.tmp.join("pod-b.out");
    // Once it succeeded, the controller asks the init for its metrics (`tfinit metrics`).
    let metrics = w.tmp.join("pod-b.metrics");
    let b_started = now_ms();
    let mut pod_b = Pod::start_on_other_node(
        &w,
        PodSpec {
            name: "pod-b",
            uid: Some(NOBODY_UID),
            script: format!(
                "( {} ); rc=$?; \"$TFINIT_TEST_BIN\" metrics > {} 2>&1; exit $rc",
                apply_until_success(&out, 30),
                metrics.display()
            ),
            env: vec![
                ("TF_VAR_sleep", "0".into()),
                ("TFINIT_TEST_BIN", common::tfinit().display().to_string()),
            ],
        },
        "00000000-0000-4000-8000-00000000000b",
    );
    let st = pod_b.wait();
    let log = pod_b.log();
    assert!(st.success(), "pod-b never succeeded: {log}");
    // Its recovery helper told the init what it did: one s3 lock force-unlocked, the dead run's
    // resources in progress counted as orphan candidates, no person needed.
    let scraped = common::read(&metrics);
    let value = |series: &str| -> Option<f64> {
        scraped
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    };
    assert_eq!(
        value("tfinit_force_unlocks_total{backend=\"s3\",outcome=\"unlocked\"}"),
        Some(1.0),
        "{scraped}"
    );
    assert_eq!(
        value("tfinit_orphan_candidates_total"),
        Some(in_progress_at_death as f64),
        "{scraped}"
    );
    assert_eq!(
        value("tfinit_recoveries_needing_a_person"),
        Some(0.0),
        "{scraped}"
    );
    let tries = attempts(&out);
    let ok = tries.last().unwrap();
    assert!(ok.ok);
    // Nothing was released before pod-b had watched pod-a's heartbeat for a TTL (its first
    // attempt waits in `recovering` meanwhile), nor while pod-a's heartbeat was younger.
    for t in tries.iter().filter(|t| t.ok) {
        assert!(
            t.end >= b_started + TTL.as_millis() as u64 && t.end >= hb + TTL.as_millis() as u64,
            "attempt {} succeeded before pod-b could know pod-a dead: {tries:?}",
            t.n
        );
    }
    // Released within the TTL plus one retry (plus the failed attempt that waited for it).
    let longest_fail = tries
        .iter()
        .filter(|t| !t.ok)
        .map(|t| t.end - t.start)
        .max()
        .unwrap_or(0);
    let bound = kill_ms + (TTL + RETRY).as_millis() as u64 + longest_fail + 1000;
    eprintln!(
        "measured: pod-b (another node) reconciled {} ms after pod-a was killed, {} ms after it started (TFINIT_OWNER_TTL={}s)",
        ok.end - kill_ms,
        ok.end - b_started,
        TTL.as_secs()
    );
    assert!(
        ok.start <= bound,
        "reconciled {} ms after the kill (bound {} ms): {tries:?}",
        ok.start - kill_ms,
        bound - kill_ms
    );
    assert!(log.contains("force-unlocked its state lock"), "{log}");
    assert!(log.contains(lock["ID"].as_str().unwrap()), "{log}");
    assert!(
        log.contains("to tell whether owner pod-a")
            && log.contains("its owner's heartbeat did not change in"),
        "pod-b watched pod-a's heartbeat for a TTL before it called it dead: {log}"
    );
    assert!(w.records().is_empty(), "record removed: {:?}", w.records());
    w.assert_state_consistent();
}

each_terraform!(
    a_restarted_pod_releases_its_predecessors_lock_at_once_and_logs_the_orphan_candidates
);

fn a_restarted_pod_releases_its_predecessors_lock_at_once_and_logs_the_orphan_candidates(
    tf: &Terraform,
) {
    if !have_deps() {
        return;
    }
    let w = S3World::with("lock-orphans", tf, S3Lock::Table);
    // -json output this time: the record follows its apply_start / apply_complete lines.
    let (mut pod_a, rec) = pod_a_mid_apply(&w, "pod-a", Some(NOBODY_UID), true);
    assert_eq!(rec["in_progress"], json!(["null_resource.a"]));
    pod_a.kill();
    let lock = w.held().expect("stuck");
    assert_eq!(lock["Version"], tf.version());

    // The same pod name again (a container restart, a StatefulSet pod replaced): its earlier
    // incarnation is dead without waiting for the TTL.
    let out = w.tmp.join("pod-a2.out");
    let mut again = Pod::start(
        &w,
        PodSpec {
            name: "pod-a",
            uid: Some(NOBODY_UID),
            script: apply_until_success(&out, 1),
            env: vec![
                ("TF_VAR_sleep", "0".into()),
                ("TFINIT_OWNER_TTL", "30s".into()),
            ],
        },
    );
    let st = again.wait();
    let log = again.log();
    assert!(st.success(), "the first attempt succeeds: {log}");
    assert!(
        log.contains("the kernel freed the lock file they all held"),
        "{log}"
    );
    assert!(
        log.contains(&format!(
            "force-unlocked its state lock {}",
            lock["ID"].as_str().unwrap()
        )),
        "{log}"
    );
    let line = log.lines().find(|l| l.contains("force-unlocked")).unwrap();
    assert!(
        line.contains("Resources that may exist outside the state"),
        "{line}"
    );
    assert!(
        line.contains("orphan_candidates=[\"null_resource.a\"]"),
        "{line}"
    );
    assert!(
        !line.contains("null_resource.b") && !line.contains("null_resource.c"),
        "{line}"
    );
    w.assert_state_consistent();
}

each_terraform!(a_terraform_killed_inside_a_live_pod_has_its_lock_released_by_that_pods_next_run);

fn a_terraform_killed_inside_a_live_pod_has_its_lock_released_by_that_pods_next_run(
    tf: &Terraform,
) {
    if !have_deps() {
        return;
    }
    let w = S3World::with("lock-oom", tf, S3Lock::Table);
    // The OOM killer picks the terraform process that holds the lock: 1.0.3's wrapped child (the
    // panicwrap parent then exits 255), or a modern terraform's one process (the shell sees 137).
    // The pod lives on and its controller retries.
    let out = w.tmp.join("pod-a.out");
    let script = format!(
        "TF_VAR_sleep=30 terraform apply -auto-approve -input=false -no-color > {o}.1 2>&1; echo \"first $?\" >> {o}; \
         TF_VAR_sleep=0 terraform apply -auto-approve -input=false -no-color > {o}.2 2>&1; echo \"second $?\" >> {o}",
        o = out.display()
    );
    let mut pod = Pod::start(
        &w,
        PodSpec {
            name: "pod-a",
            uid: Some(NOBODY_UID),
            script,
            env: vec![],
        },
    );
    w.wait_in_progress("the run", &["null_resource.a"]);
    let lock = wait_for(STEP, "the lock", || w.held());
    let holder = lock_holding_terraform(&w.ws, tf.path()).expect("the terraform holding the lock");
    nix::sys::signal::kill(holder, nix::sys::signal::Signal::SIGKILL).unwrap();
    pod.wait();
    let log = pod.log();
    let (code, how) = if tf.panicwrap() {
        (255, "exit code 255")
    } else {
        (137, "killed by SIGKILL")
    };
    assert_eq!(
        common::read(&out),
        format!("first {code}\nsecond 0\n"),
        "the killed run exits {code}, the very next one succeeds: {log}"
    );
    assert!(
        log.contains("terraform ended without releasing its state lock for sure"),
        "{log}"
    );
    assert!(log.contains(how), "{log}");
    assert!(
        log.contains(&format!(
            "force-unlocked its state lock {}",
            lock["ID"].as_str().unwrap()
        )),
        "{log}"
    );
    assert!(w.records().is_empty());
    w.assert_state_consistent();
}

#[test]
fn a_dead_runs_lock_on_a_missing_workspace_state_needs_a_person_and_the_command_releases_it() {
    if !have_deps() {
        return;
    }
    // s3 creates a non-default workspace's missing state object under a lock (Operation init),
    // so a kill in that window leaves a lock force-unlock cannot release: it loads the state
    // first, which tries to lock. Measured on moto, as on kubernetes.
    // The dead run's `workspace new feature` took the lock and died before writing the object.
    let w = S3World::new("lock-person");
    let lock_id = "tfstate/env:/feature/tfinit/terraform.tfstate";
    let started = now_ms() - 60_000;
    let owner = json!({"name": "pod-a", "boot_id": "0", "started_ms": started - 1000, "pid": 1});
    let rec = w.plant_record(
        "pod-a.0-1-1.r1.json",
        &json!({
            "v": 4, "ttl_ms": TTL.as_millis() as u64, "owner": owner, "who": "@pod-a", "run_id": "r1", "cwd": w.ws, "workdir": w.ws,
            "workspace": "feature", "subcommand": "workspace new", "argv": ["workspace", "new", "feature"],
            "started_ms": started, "in_progress": [], "updated_ms": started,
        }),
    );
    let info = json!({
        "ID": "11111111-2222-3333-4444-555555555555", "Operation": "init", "Info": "",
        "Who": "@pod-a", "Version": "1.0.3", "Path": lock_id,
        "Created": pods::rfc3339(started + 500),
    });
    w.moto.dynamodb(
        "PutItem",
        &json!({"TableName": "tflock", "Item": {"LockID": {"S": lock_id}, "Info": {"S": info.to_string()}}}),
    );
    let o = pods::recover_by_hand(&w, &[], &[]);
    let said = text(&o);
    assert_eq!(o.status.code(), Some(1), "{said}");
    let command = format!(
        "aws dynamodb delete-item --endpoint-url {} --table-name tflock --key '{{\"LockID\":{{\"S\":\"{lock_id}\"}}}}' --condition-expression 'contains(Info, :id)' --expression-attribute-values '{{\":id\":{{\"S\":\"11111111-2222-3333-4444-555555555555\"}}}}'",
        shell_word(&w.moto.endpoint())
    );
    assert!(
        said.contains("NEEDS A PERSON") && said.contains(&command),
        "{said}"
    );
    assert!(rec.exists(), "record kept");
    let scan = w.moto.items();
    assert!(
        scan.iter().any(|i| i["LockID"]["S"] == lock_id),
        "lock untouched: {scan:?}"
    );
    // The command's DeleteItem, as the aws CLI sends it; then recovery finds the lock free.
    w.moto.dynamodb(
        "DeleteItem",
        &json!({"TableName": "tflock", "Key": {"LockID": {"S": lock_id}},
                "ConditionExpression": "contains(Info, :id)",
                "ExpressionAttributeValues": {":id": {"S": "11111111-2222-3333-4444-555555555555"}}}),
    );
    let o = pods::recover_by_hand(&w, &[], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(!rec.exists(), "record removed");
    let list = w.terraform(&["workspace", "list", "-no-color"]);
    assert!(
        text(&list).contains("feature"),
        "the probe created the workspace's state: {}",
        text(&list)
    );
}

/// `s` as the release command quotes it (plain when it has no special characters).
fn shell_word(s: &str) -> String {
    if s.chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_./:=@,".contains(c))
    {
        s.to_string()
    } else {
        format!("'{s}'")
    }
}

/// Issue 18, finding 4: two recovery helpers once ran in one working directory, each with the
/// live runs as they were when it started, and a run could launch there while the other helper
/// still probed. Now one recovery at a time, and no state-locking run launches while it runs
/// (in any directory: another may lock the same state, issue 23). A dead owner's record (on another node: it must be watched for a TTL) and two applies
/// at once in its directory: one helper, the other run waits for it, and no terraform starts
/// before the helper is done.
#[test]
fn two_runs_in_one_directory_share_one_recovery_and_none_starts_before_it_ends() {
    if !have_deps() {
        return;
    }
    let w = S3World::new("lock-serial");
    let started = now_ms() - 60_000;
    let rec = w.plant_record(
        "pod-z.0-1-1.r1.json",
        &json!({
            "v": 4, "ttl_ms": TTL.as_millis() as u64,
            "owner": {"name": "pod-z", "boot_id": "0", "started_ms": started - 1000, "pid": 1},
            "who": "@pod-z", "run_id": "r1", "cwd": w.ws, "workdir": w.ws, "workspace": "default",
            "subcommand": "apply", "argv": ["apply", "-auto-approve"], "started_ms": started,
            "in_progress": [], "updated_ms": started,
        }),
    );
    let out = w.tmp.join("pair.out");
    let apply = |n: u32| {
        format!(
            "terraform apply -auto-approve -input=false -no-color -lock-timeout=60s > {o}.{n} 2>&1; echo \"done{n} $?\" >> {o}",
            o = out.display()
        )
    };
    let mut pod = Pod::start(
        &w,
        PodSpec {
            name: "pod-p",
            uid: Some(NOBODY_UID),
            script: format!("({}) & ({}) & wait", apply(1), apply(2)),
            env: vec![("TF_VAR_sleep", "0".into())],
        },
    );
    assert!(pod.wait().success(), "{}", pod.log());
    let log = pod.log();
    let done = common::read(&out);
    assert!(
        done.contains("done1 0") && done.contains("done2 0"),
        "{done}\n{log}"
    );
    assert_eq!(
        log.matches("lock recovery finished").count(),
        1,
        "one helper for the directory: {log}"
    );
    assert!(
        log.contains("a lock recovery runs: this run waits for it"),
        "{log}"
    );
    let finished = log.find("lock recovery finished").unwrap();
    let first_start = log.find("terraform started").unwrap();
    assert!(
        first_start > finished,
        "no terraform started in the directory while its recovery ran: {log}"
    );
    assert!(
        !rec.exists(),
        "the dead run's record was resolved (lock free)"
    );
}

//! `tfinit status`, `tfinit drain [--wait] [--timeout D]`, `tfinit resume`, `tfinit cancel`,
//! `tfinit recover`.

use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use super::{read_frame, write_frame};
use crate::config;
use crate::config::socket_path;
use crate::locks::handoff::RecoverArgs;
use crate::locks::names::RunId;
use crate::locks::record::Record;
use crate::locks::record_id::RecordId;
use crate::locks::recover::{self, Recovery, RecoveryOutcome};
use crate::locks::store;
use crate::protocol::{self, CancelRequest, Envelope, Kind, Reply, Request, Status};

/// Exit code when no init answers.
pub const EXIT_NO_INIT: i32 = 3;

/// Why a control request got no reply.
#[derive(Debug)]
enum AskError {
    /// No init answered, or the exchange broke: exit [`EXIT_NO_INIT`].
    NoInit(String),
    /// The init answered with a refusal (a client of another uid): exit 1, as for any request
    /// the init did not carry out.
    Refused(String),
}

impl AskError {
    /// The client's exit code.
    fn code(&self) -> i32 {
        match self {
            AskError::NoInit(_) => EXIT_NO_INIT,
            AskError::Refused(_) => 1,
        }
    }
}

impl std::fmt::Display for AskError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AskError::NoInit(e) | AskError::Refused(e) => f.write_str(e),
        }
    }
}

/// Sends one control request and returns the init's reply.
fn ask(request: Request) -> Result<Reply, AskError> {
    let path = socket_path(&config::client_run_dir());
    let mut sock = UnixStream::connect(&path).map_err(|e| {
        AskError::NoInit(format!(
            "no tfinit init answers on {} ({e}): run this inside the container whose entrypoint is tfinit, with the same TFINIT_RUN_DIR",
            path.display()
        ))
    })?;
    let body = serde_json::to_vec(&Envelope {
        v: protocol::VERSION,
        request,
    })
    .map_err(|e| AskError::NoInit(e.to_string()))?;
    // A write that fails may have met the init's refusal (a client of another uid is answered
    // and closed at once): that answer, when there is one, says more than the broken pipe.
    let sent = write_frame(&mut sock, Kind::Request, &body);
    let mut payload = Vec::new();
    let answer = read_frame(&mut sock, &mut payload);
    if let Err(e) = &sent {
        if !matches!(answer, Ok(Some(Kind::Exit))) {
            return Err(AskError::NoInit(format!("sending the request failed: {e}")));
        }
    }
    match answer {
        Ok(Some(Kind::Reply)) => serde_json::from_slice(&payload)
            .map_err(|e| AskError::NoInit(format!("malformed reply from the init: {e}"))),
        Ok(Some(Kind::Exit)) => {
            let note: protocol::ExitNote = serde_json::from_slice(&payload)
                .map_err(|e| AskError::NoInit(format!("malformed answer from the init: {e}")))?;
            // The note's text is the shim's, "tfinit: "-prefixed; callers add their own.
            let error = note
                .error
                .unwrap_or_else(|| "the init refused the request".into());
            Err(AskError::Refused(
                error
                    .strip_prefix("tfinit: ")
                    .map_or(error.clone(), str::to_string),
            ))
        }
        Ok(other) => Err(AskError::NoInit(format!(
            "unexpected answer from the init: {other:?}"
        ))),
        Err(e) => Err(AskError::NoInit(format!("reading the reply failed: {e}"))),
    }
}

fn print_status(status: &Status) {
    match serde_json::to_string_pretty(status) {
        Ok(s) => println!("{s}"),
        Err(e) => eprintln!("tfinit: cannot format the status: {e}"),
    }
}

fn simple(request: Request) -> i32 {
    exchange(request, |reply| {
        if let Some(s) = &reply.status {
            print_status(s);
        }
    })
}

/// Asks the init, prints what its reply holds (`show`) and its error; the exit code: 0 when it
/// did what was asked, 1 when not (or the init refused this client), 3 without an init.
fn exchange(request: Request, show: impl FnOnce(&Reply)) -> i32 {
    match ask(request) {
        Ok(reply) => {
            show(&reply);
            if let Some(e) = &reply.error {
                eprintln!("tfinit: {e}");
            }
            if reply.ok {
                0
            } else {
                1
            }
        }
        Err(e) => {
            eprintln!("tfinit: {e}");
            e.code()
        }
    }
}

/// `tfinit status`.
pub fn status() -> i32 {
    simple(Request::Status)
}

/// `tfinit metrics`: the metrics text on stdout.
pub fn metrics() -> i32 {
    match ask(Request::Metrics) {
        Ok(Reply {
            metrics: Some(text),
            ..
        }) => {
            print!("{text}");
            0
        }
        Ok(reply) => {
            eprintln!(
                "tfinit: the init sent no metrics ({}); is it older than this tfinit?",
                reply.error.unwrap_or_else(|| "no error given".into())
            );
            1
        }
        Err(e) => {
            eprintln!("tfinit: {e}");
            e.code()
        }
    }
}

/// `tfinit resume`.
pub fn resume() -> i32 {
    simple(Request::Resume)
}

/// `tfinit cancel RUN_ID | --workdir DIR [--force]`: prints what was done to each run; exits 0,
/// 1 when nothing was (no such run, the init is shutting down, a client of another uid), 2 for a
/// malformed id, 3 without an init.
pub fn cancel(run: Option<&str>, workdir: Option<&std::path::Path>, force: bool) -> i32 {
    if let Some(id) = run.filter(|id| RunId::parse(id).is_none()) {
        eprintln!(
            "tfinit: {id:?} is not a run id: ids are r and the run's number without leading zeros, e.g. r7, as `tfinit status` shows them"
        );
        return 2;
    }
    let workdir = match workdir.map(absolute_dir) {
        Some(Err(e)) => {
            eprintln!("tfinit: {e}");
            return 2;
        }
        Some(Ok(d)) => Some(d),
        None => None,
    };
    // The init matches runs by what the directory is (device and inode), stat'ed here so that
    // the init never stats a working directory; its text serves runs of older shims.
    let workdir_id = workdir.as_deref().and_then(super::file_id);
    let request = Request::Cancel(CancelRequest {
        run: run.map(str::to_string),
        workdir: workdir.map(|d| d.to_string_lossy().into_owned()),
        workdir_id,
        force,
    });
    exchange(request, |reply| {
        for line in &reply.cancelled {
            println!("{line}");
        }
    })
}

/// `--workdir DIR` as the init compares it with the runs of shims that sent no directory ids:
/// absolute (from here), symbolic links resolved when it exists (the shims report their working
/// directories that way), `.` and `..` resolved.
fn absolute_dir(dir: &std::path::Path) -> Result<std::path::PathBuf, String> {
    let abs = std::env::current_dir()
        .map_err(|e| format!("cannot read the current directory to make --workdir absolute ({e}): give an absolute --workdir"))?
        .join(dir);
    Ok(std::fs::canonicalize(&abs).unwrap_or_else(|_| crate::terraform::normal_dir(&abs)))
}

/// `tfinit drain [--wait] [--timeout D]`.
pub fn drain(wait: bool, timeout: Option<&str>) -> i32 {
    let timeout = match timeout.map(crate::duration::parse_duration) {
        None => None,
        Some(Ok(d)) => Some(d),
        Some(Err(e)) => {
            eprintln!(
                "tfinit: invalid --timeout={:?}: {e}; for example --timeout=5m",
                timeout.unwrap_or_default()
            );
            return 2;
        }
    };
    let reply = match ask(Request::Drain) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tfinit: {e}");
            return e.code();
        }
    };
    if !wait {
        if let Some(s) = &reply.status {
            print_status(s);
        }
        return if reply.ok { 0 } else { 1 };
    }
    let start = Instant::now();
    let mut last = reply.status;
    loop {
        if let Some(s) = &last {
            if s.runs.is_empty() {
                eprintln!("tfinit: drained: no terraform run in flight");
                return 0;
            }
        }
        if timeout.is_some_and(|t| start.elapsed() >= t) {
            let runs = last.map(|s| s.runs).unwrap_or_default();
            eprintln!(
                "tfinit: drain timed out after {}; {} run(s) still going:",
                crate::duration::fmt_duration(timeout.unwrap_or_default()),
                runs.len()
            );
            for r in runs {
                eprintln!(
                    "  {} pid {} {} in {} ({})",
                    r.id,
                    r.pid,
                    r.subcommand,
                    r.cwd,
                    if r.attached { "attached" } else { "abandoned" }
                );
            }
            return 1;
        }
        std::thread::sleep(Duration::from_millis(200));
        match ask(Request::Status) {
            Ok(r) => last = r.status,
            Err(e) => {
                // The init is gone (the container stops): nothing is in flight any more.
                eprintln!("tfinit: {e}");
                return 0;
            }
        }
    }
}

/// `tfinit recover [--dry-run]`: releases stale locks of dead owners for every record.
pub fn recover_all(dry_run: bool, terraform_override: Option<&std::path::Path>) -> i32 {
    let (cfg, terraform) = match recover_settings(terraform_override) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("tfinit: {e}");
            return 2;
        }
    };
    // A new incarnation of our name: it has no record, so every record is judged by what this
    // command sees (the live init's records are watched alive like any other owner's).
    let me = crate::locks::record::Owner::current(&cfg.owner, None);
    // The stores the init writes to (TFINIT_STORE: the Leases, the files, or both).
    let store = store::chosen(cfg.store, &cfg.state_dir, &me, cfg.owner_ttl);
    let files_only = store.location() == cfg.state_dir.display().to_string();
    if files_only && !cfg.state_dir.is_dir() {
        eprintln!(
            "tfinit: TFINIT_STATE_DIR={:?} is not a directory: nothing to recover",
            cfg.state_dir
        );
        return 1;
    }
    let recovery = Recovery {
        store,
        me,
        ttl: cfg.owner_ttl,
        older_ttl: cfg.older_owner_ttl,
        terraform,
        dry_run,
        live: Vec::new(),
        automatic: false,
        seen: Vec::new(),
    };
    let results = match recovery.run(None) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tfinit: {e}");
            return 1;
        }
    };
    if results.is_empty() {
        println!("no lock-owner records in {}", recovery.store.location());
    }
    for (path, rec, outcome) in &results {
        println!("{}", report_line(path, rec, outcome, dry_run));
    }
    i32::from(results.iter().any(|(_, _, o)| needs_attention(o)))
}

/// What `tfinit recover` works with: the records' settings from the environment (as the init
/// has them) and the real terraform.
fn recover_settings(
    terraform_override: Option<&std::path::Path>,
) -> Result<(config::InitConfig, std::path::PathBuf), String> {
    let args = crate::cli::InitArgs {
        state_dir: std::env::var_os("TFINIT_STATE_DIR").map(Into::into),
        store: std::env::var("TFINIT_STORE").ok(),
        owner: std::env::var("TFINIT_OWNER").ok(),
        owner_ttl: std::env::var("TFINIT_OWNER_TTL").ok(),
        older_owner_ttl: std::env::var("TFINIT_OLDER_OWNER_TTL").ok(),
        ..Default::default()
    };
    let cfg = config::InitConfig::from_args(&args, None).map_err(|e| e.to_string())?;
    let terraform = crate::terraform::find_real(
        "terraform",
        terraform_override.map(|p| p.as_os_str()),
        std::env::var_os("PATH").as_deref(),
    )
    .map_err(|e| e.to_string())?;
    Ok((cfg, terraform))
}

/// Whether `tfinit recover` exits 1 for this outcome: a person must look.
fn needs_attention(outcome: &RecoveryOutcome) -> bool {
    matches!(
        outcome,
        RecoveryOutcome::Unknown(_)
            | RecoveryOutcome::UnknownWording(_)
            | RecoveryOutcome::UnlockFailed(_)
            | RecoveryOutcome::NeedsPerson(..)
            | RecoveryOutcome::WaitingForPerson
    )
}

/// One record's line in `tfinit recover`'s output.
fn report_line(path: &RecordId, rec: &Record, outcome: &RecoveryOutcome, dry_run: bool) -> String {
    let what = outcome_text(rec, outcome, dry_run);
    let orphans = if rec.in_progress.is_empty() || *outcome == RecoveryOutcome::OwnerAlive {
        String::new()
    } else {
        format!(" [orphan candidates: {}]", rec.in_progress.join(", "))
    };
    format!(
        "{}: {} `terraform {}` in {} (Who {}): {what}{orphans}",
        path,
        rec.owner.name,
        rec.argv.join(" "),
        rec.workdir,
        rec.who
    )
}

/// What was done with the record (or would be, in a dry run), and why.
fn outcome_text(rec: &Record, outcome: &RecoveryOutcome, dry_run: bool) -> String {
    match outcome {
        RecoveryOutcome::OwnerAlive => "run may still be going (owner alive): left alone".to_string(),
        RecoveryOutcome::NothingToRelease(b) => format!(
            "{b} backend: its lock ends with its process; {}",
            removed(dry_run)
        ),
        RecoveryOutcome::Unsupported(b) => format!(
            "{b} backend: automatic recovery not supported, release by hand if terraform reports the lock held by {}; {}",
            rec.who,
            if dry_run { "record would be set aside" } else { "record set aside (*.manual)" }
        ),
        RecoveryOutcome::Free => format!("lock free; {}", removed(dry_run)),
        RecoveryOutcome::Unlocked(i) => format!(
            "{} lock {} (Who {}, Created {}); {}",
            if dry_run {
                "would force-unlock"
            } else {
                "force-unlocked"
            },
            i.id,
            i.who,
            i.created,
            removed(dry_run)
        ),
        RecoveryOutcome::HeldByOther(i, why) => format!(
            "lock {} held by {} is not the dead run's ({why}): left alone; {}",
            i.id,
            i.who,
            removed(dry_run)
        ),
        RecoveryOutcome::Ambiguous(i, why) => format!(
            "lock {} held by {} may not be the dead run's ({why}): left alone; record kept",
            i.id, i.who
        ),
        RecoveryOutcome::Unknown(m) => format!("could not read the lock: {m}; record kept"),
        RecoveryOutcome::UnknownWording(m) => format!(
            "terraform answered the lock probe in a wording this tfinit does not know ({m}): cannot tell whether the lock is free; record kept. Upgrade tfinit, or report the wording with your terraform version"
        ),
        RecoveryOutcome::UnlockFailed(m) => format!("force-unlock failed: {m}; record kept"),
        RecoveryOutcome::NeedsPerson(i, command) => format!(
            "NEEDS A PERSON: lock {} (Who {}, Operation {}) is the dead run's, but workspace {} has no state, so terraform cannot release it. Run: {command} ; then `tfinit recover` again. Restore the state or import the workspace's resources before the next apply creates them again; record kept",
            i.id, i.who, i.operation, rec.workspace
        ),
        // Only the init's automatic recovery skips a reported record.
        RecoveryOutcome::WaitingForPerson => "needs a person (reported before); record kept".to_string(),
    }
}

fn removed(dry_run: bool) -> &'static str {
    if dry_run {
        "record would be removed"
    } else {
        "record removed"
    }
}

/// The init's hidden recovery helper for one working directory (see `locks::recover`).
pub fn recover_helper(args: &[std::ffi::OsString]) -> i32 {
    crate::logging::init_client_at(tracing::Level::INFO);
    // Fail closed: without exactly what the init wrote, nothing is touched.
    let args = match RecoverArgs::from_argv(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!(
                "tfinit: {} is internal to tfinit (the init starts it before a state-locking run): {e}; no lock was touched",
                recover::HIDDEN_SUBCOMMAND
            );
            return 2;
        }
    };
    // The stores the init writes to, as the init was told (environment or --store).
    let store = store::chosen(args.store, &args.state_dir, &args.owner, args.ttl());
    let recovery = Recovery {
        store,
        me: args.owner.clone(),
        ttl: args.ttl(),
        older_ttl: args.older_ttl(),
        terraform: args.terraform.clone(),
        dry_run: false,
        live: args.live,
        automatic: true,
        seen: args.seen,
    };
    let results = match recovery.run(Some(&args.workdir)) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!("{e}; terraform starts without the lock check");
            return 1;
        }
    };
    tell_the_init(&results);
    let bad = results.iter().any(|(_, _, o)| {
        matches!(
            o,
            RecoveryOutcome::Unknown(_)
                | RecoveryOutcome::UnknownWording(_)
                | RecoveryOutcome::UnlockFailed(_)
                | RecoveryOutcome::NeedsPerson(..)
        )
    });
    if bad {
        1
    } else {
        0
    }
}

/// Writes one [`recover::HelperReport`] line per decided record to the pipe the init gave this
/// helper (`TFINIT_REPORT_FD`), for its metrics. Each line goes in one write(2) of less than
/// PIPE_BUF bytes, so lines of helpers that run at once never interleave. Best effort: the
/// metrics are the only loss when it fails.
fn tell_the_init(results: &[(RecordId, Box<Record>, RecoveryOutcome)]) {
    use std::io::Write;
    let Some(pipe) = std::env::var(recover::REPORT_FD_VAR)
        .ok()
        .and_then(|v| v.parse().ok())
        .and_then(crate::sys::take_inherited_fd)
    else {
        return;
    };
    let mut pipe = std::fs::File::from(pipe);
    for (path, rec, outcome) in results {
        let Some(kind) = outcome.label() else {
            continue;
        };
        // Cut so the line stays one write(2) below PIPE_BUF (paths may be long).
        let cut = |s: &str| s.chars().take(1000).collect::<String>();
        let report = recover::HelperReport {
            backend: recover::backend_type(std::path::Path::new(&rec.workdir))
                .unwrap_or_else(|| "other".into()),
            outcome: kind.label().into(),
            orphans: rec
                .in_progress
                .iter()
                .filter(|r| !r.starts_with(crate::locks::record::OMITTED_MARK))
                .count() as u64,
            unknown_wording: match outcome {
                RecoveryOutcome::UnknownWording(said) => Some(recover::UnknownWording {
                    record: cut(&path.to_string()),
                    workdir: cut(&rec.workdir),
                    said: said.clone(),
                }),
                _ => None,
            },
        };
        let Ok(mut line) = serde_json::to_vec(&report) else {
            continue;
        };
        line.push(b'\n');
        if line.len() < 4096 {
            let _ = pipe.write_all(&line);
        }
    }
}

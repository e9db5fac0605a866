//! Validated settings. A bad value stops tfinit before anything starts, with exit code 2 and one
//! message naming the variable (or flag), the value, and an example of a good one.

use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::parser::ValueSource;
use clap::ArgMatches;

use crate::cli::InitArgs;
use crate::duration::{fmt_duration, parse_duration, MAX_DURATION};
use crate::locks::names::owner_problem;
use crate::signals::{self, Rewrites};
use crate::sys::SigNo;

/// A configuration value that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("invalid {source_name}={value:?}: {problem}; for example {source_name}={example}")]
pub struct ConfigError {
    /// The variable or flag the value came from.
    pub source_name: String,
    /// The value as given.
    pub value: String,
    /// What is wrong with it.
    pub problem: String,
    /// A good value.
    pub example: String,
}

/// Where forwarded signals go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardTo {
    /// The main child's whole process group (default; what `kill -TERM -pgid` would do).
    Group,
    /// Only the main child's pid.
    Child,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Where lock-owner records live (TFINIT_STORE). Serialised as its word, for the recovery
/// helper's arguments (locks/handoff.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreSetting {
    /// Leases of the pod's namespace when its service account may list them, else the files
    /// of TFINIT_STATE_DIR (with one line saying why); decided when the store first answers.
    Auto,
    /// Leases of the pod's namespace (the in-cluster configuration must be there).
    Kubernetes,
    /// The files of TFINIT_STATE_DIR.
    File,
}

impl StoreSetting {
    /// The setting TFINIT_STORE names (as validated at start: trimmed, one of the three words).
    pub fn parse(value: &str) -> Option<StoreSetting> {
        match value.trim() {
            "auto" => Some(StoreSetting::Auto),
            "kubernetes" => Some(StoreSetting::Kubernetes),
            "file" => Some(StoreSetting::File),
            _ => None,
        }
    }
}

/// Everything the init needs, validated.
#[derive(Debug, Clone)]
pub struct InitConfig {
    /// Where forwarded signals go.
    pub forward: ForwardTo,
    /// Rewrites applied before forwarding.
    pub rewrite: Rewrites,
    /// Budget from the stop request to the hard kill.
    pub grace_period: Duration,
    /// Graceful SIGTERM to runs at deadline minus this; also the abandoned-run stop timeout.
    pub stop_timeout: Duration,
    /// SIGKILL of everything left at deadline minus this.
    pub kill_margin: Duration,
    /// Log level.
    pub log_level: tracing::Level,
    /// Log format.
    pub log_format: LogFormat,
    /// Directory of the control socket.
    pub run_dir: PathBuf,
    /// Directory of lock-owner records.
    pub state_dir: PathBuf,
    /// TFINIT_STORE: where lock-owner records live.
    pub store: StoreSetting,
    /// Owner name in records.
    pub owner: String,
    /// Heartbeat age after which an owner is dead.
    pub owner_ttl: Duration,
    /// TFINIT_OLDER_OWNER_TTL: what an owner whose heartbeat states no TTL (a tfinit before
    /// record format 4) is judged by.
    pub older_owner_ttl: Duration,
    /// How long a state-locking run waits in `recording` for its record (and the store to open).
    pub record_timeout: Duration,
    /// Whether stale locks of dead owners are released automatically.
    pub force_unlock: bool,
    /// TFINIT_METRICS_ADDR: where `GET /metrics` is served; None: no metrics server.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// TFINIT_MAX_RUNS: how many terraform runs may be past the queue at once; None: no limit.
    pub max_runs: Option<NonZeroUsize>,
    /// The pod's UID when the downward API provides it (TFINIT_POD_UID or POD_UID).
    pub pod_uid: Option<String>,
    /// Values ignored rather than refused, to log as warnings once the log is set up.
    pub warnings: Vec<ConfigWarning>,
}

/// A value tfinit ignores, as if unset, and says so (one line naming the variable).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigWarning {
    /// TFINIT_POD_UID or POD_UID is not UTF-8 (records are JSON text).
    #[error(
        "{var}={value:?} is not valid UTF-8: ignored as if unset (lock-owner records carry the pod's UID as text); set it from the downward API (fieldRef: metadata.uid), which gives a UUID"
    )]
    PodUidNotUtf8 {
        /// The variable.
        var: &'static str,
        /// Its value, invalid bytes shown as U+FFFD.
        value: String,
    },
}

/// Default grace period: Kubernetes' default terminationGracePeriodSeconds.
pub(crate) const DEFAULT_GRACE: Duration = Duration::from_secs(30);
/// Default stop timeout.
pub(crate) const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Default kill margin.
pub(crate) const DEFAULT_KILL_MARGIN: Duration = Duration::from_secs(2);
/// Default owner TTL.
pub(crate) const DEFAULT_OWNER_TTL: Duration = Duration::from_secs(30);
/// Default record timeout: covers a record write plus a heartbeat write on a slow volume.
pub(crate) const DEFAULT_RECORD_TIMEOUT: Duration = Duration::from_secs(30);
/// Default state directory.
pub(crate) const DEFAULT_STATE_DIR: &str = "/var/lib/tfinit";

/// The least TFINIT_KILL_MARGIN. After its SIGKILL the init reaps what is left and waits up to
/// 1 s (init/records.rs `EXIT_WAIT`) for the killed runs' records to be marked ended, all before
/// the runtime's own SIGKILL at the deadline: a shorter margin cuts that wait, and a record left
/// without its `ended` makes the next run's lock check wait for liveness instead of deciding at
/// once. 0 would put tfinit's kill step on the runtime's.
pub const MIN_KILL_MARGIN: Duration = Duration::from_secs(1);

/// How much longer than TFINIT_KILL_MARGIN TFINIT_STOP_TIMEOUT must be at the least. At shutdown
/// terraform gets its graceful SIGTERM at deadline − STOP_TIMEOUT and the SIGKILL at deadline −
/// KILL_MARGIN: the difference is all it has to write its state and release its lock, which on a
/// remote backend takes up to a second even with nothing left in flight. At or below the margin,
/// the SIGKILL would come with the SIGTERM or before it.
pub const MIN_STOP_GAP: Duration = Duration::from_secs(1);

/// The least TFINIT_RECORD_TIMEOUT. A record is four file operations (create, fsync, rename,
/// fsync of the directory), after a heartbeat of four more when the last is older than TTL/3:
/// 1 s leaves 125 ms for each, which a network volume under load takes. Less, and a healthy but
/// slow volume makes state-locking runs start without their record (and every run after them,
/// until a write lands), which is what the wait is for; 0 starts every run before its record.
pub const MIN_RECORD_TIMEOUT: Duration = Duration::from_secs(1);

/// The least TFINIT_OWNER_TTL: heartbeats are written every TTL/3.
pub const MIN_OWNER_TTL: Duration = Duration::from_secs(1);

/// The longest TFINIT_STATE_DIR: the longest path tfinit makes in it, a record's temporary file
/// `/records/` + a name of at most 255 bytes (locks/names.rs), must fit in PATH_MAX (4096 bytes
/// with the terminating NUL), or every write there fails with ENAMETOOLONG.
pub const MAX_STATE_DIR: usize = 4096 - 1 - "/records/".len() - 255;

/// A setting, by its clap id (the field of [`InitArgs`]): `grace_period` is the variable
/// `TFINIT_GRACE_PERIOD` and the flag `--grace-period`.
type Key = &'static str;

/// The environment variable of setting `key`.
fn env_of(key: Key) -> String {
    format!("TFINIT_{}", key.to_ascii_uppercase())
}

/// Names the source of a setting: the environment variable or the flag that gave it.
struct Namer<'a> {
    matches: Option<&'a ArgMatches>,
}

impl Namer<'_> {
    fn name(&self, key: Key) -> String {
        match self.matches.and_then(|m| m.value_source(key)) {
            Some(ValueSource::CommandLine) => {
                let flag: String = key
                    .chars()
                    .map(|c| if c == '_' { '-' } else { c })
                    .collect();
                format!("--{flag}")
            }
            _ => env_of(key),
        }
    }

    /// The error for `value` of `key`.
    fn bad(&self, key: Key, value: &str, problem: &str, example: &str) -> ConfigError {
        ConfigError {
            source_name: self.name(key),
            value: value.to_string(),
            problem: problem.to_string(),
            example: example.to_string(),
        }
    }

    /// Setting `key`'s value made by `parse`, when `given`; `parse`'s error is the problem the
    /// message names.
    fn parse<T>(
        &self,
        key: Key,
        given: Option<&str>,
        example: &str,
        parse: fn(&str) -> Result<T, String>,
    ) -> Result<Option<T>, ConfigError> {
        given
            .map(|v| parse(v).map_err(|p| self.bad(key, v, &p, example)))
            .transpose()
    }

    /// Which of `names` setting `key` is (its index); the first when not `given`.
    fn choice(
        &self,
        key: Key,
        given: Option<&str>,
        names: &[&str],
        example: &str,
    ) -> Result<usize, ConfigError> {
        let Some(v) = given.map(str::trim) else {
            return Ok(0);
        };
        match names.iter().position(|n| *n == v) {
            Some(i) => Ok(i),
            None => {
                let mut problem = String::from("must be ");
                for (i, name) in names.iter().enumerate() {
                    problem += if i == 0 { "" } else { " or " };
                    problem += name;
                }
                Err(self.bad(key, v, &problem, example))
            }
        }
    }

    /// An absolute path, `default` when not given.
    fn path(
        &self,
        key: Key,
        value: Option<&PathBuf>,
        default: PathBuf,
        example: &str,
    ) -> Result<PathBuf, ConfigError> {
        match value {
            None => Ok(default),
            Some(p) if p.as_os_str().is_empty() || !p.is_absolute() => Err(self.bad(
                key,
                &p.to_string_lossy(),
                "must be an absolute path",
                example,
            )),
            Some(p) => Ok(p.clone()),
        }
    }
}

/// Parses `TERM:INT,USR1:HUP`.
pub(crate) fn parse_rewrites(text: &str) -> Result<Rewrites, String> {
    let mut pairs = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (from, to) = item
            .split_once(':')
            .ok_or_else(|| format!("{item:?} is not FROM:TO"))?;
        let f = signals::parse(from).ok_or_else(|| format!("unknown signal {from:?}"))?;
        let t = signals::parse(to).ok_or_else(|| format!("unknown signal {to:?}"))?;
        if !signals::received_and_forwarded(f) {
            return Err(format!(
                "{} is never forwarded, so it cannot be rewritten",
                signals::name(f)
            ));
        }
        if pairs.iter().any(|(x, _): &(SigNo, SigNo)| *x == f) {
            return Err(format!("{} is rewritten twice", signals::name(f)));
        }
        pairs.push((f, t));
    }
    Ok(Rewrites::new(pairs))
}

/// The default control-socket directory for this user.
pub(crate) fn default_run_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => Path::new(&d).join("tfinit"),
        _ => PathBuf::from(format!("/tmp/tfinit-{}", nix::unistd::getuid())),
    }
}

/// The run directory clients use: TFINIT_RUN_DIR, else (unset, empty or blank, as for the
/// init) the default.
pub(crate) fn client_run_dir() -> PathBuf {
    match std::env::var_os("TFINIT_RUN_DIR") {
        Some(d) if !blank_path(&d) => PathBuf::from(d),
        _ => default_run_dir(),
    }
}

/// The longest socket path a Unix socket address holds (sun_path is 108 bytes with the NUL).
const MAX_SOCKET_PATH: usize = 107;

/// The control socket's file name in the run directory.
pub(crate) const SOCKET_NAME: &str = "tfinit.sock";

/// The control socket's path in run directory `run_dir`: where the init listens and clients
/// connect.
pub fn socket_path(run_dir: &Path) -> PathBuf {
    run_dir.join(SOCKET_NAME)
}

/// A text setting as given: None when unset, empty or blank (an empty variable counts as unset:
/// manifests and Helm charts often render `value: ""`).
fn given(value: &Option<String>) -> Option<&str> {
    value.as_deref().filter(|s| !s.trim().is_empty())
}

/// A path setting as given: None when unset, empty or blank (as any other setting; a path of
/// spaces is no directory anyone means).
fn given_path(value: &Option<PathBuf>) -> Option<&PathBuf> {
    value.as_ref().filter(|p| !blank_path(p.as_os_str()))
}

/// Whether a path setting's value counts as unset: empty, or only whitespace.
fn blank_path(p: &std::ffi::OsStr) -> bool {
    p.to_str().map_or(p.is_empty(), |s| s.trim().is_empty())
}

/// One duration of the shutdown budget, as an error names it.
struct Part {
    /// Where it came from (the variable or the flag).
    name: String,
    /// The text given, when not the default.
    given: Option<String>,
    value: Duration,
}

impl Part {
    fn new(n: &Namer, key: Key, given: Option<&str>, value: Duration) -> Part {
        Part {
            name: n.name(key),
            given: given.map(str::to_string),
            value,
        }
    }

    /// `TFINIT_STOP_TIMEOUT (10s, the default)`.
    fn shown(&self) -> String {
        let default = if self.given.is_some() {
            ""
        } else {
            ", the default"
        };
        format!("{} ({}{default})", self.name, fmt_duration(self.value))
    }
}

/// Whether a shutdown budget `[grace, stop, margin]` keeps every rule: the kill margin is at
/// least [`MIN_KILL_MARGIN`], the stop timeout at least [`MIN_STOP_GAP`] longer than it, and the
/// two together smaller than the grace period (at most a year, as any duration).
fn keeps_rules([grace, stop, margin]: [Duration; 3]) -> bool {
    margin >= MIN_KILL_MARGIN
        && stop >= margin + MIN_STOP_GAP
        && stop + margin < grace
        && grace <= MAX_DURATION
}

/// The rules of the budget, each checked once the one before holds: the kill margin leaves the
/// init time to exit (KILL_MARGIN ≥ 1s), the stop timeout leaves terraform time before the
/// SIGKILL (STOP_TIMEOUT ≥ KILL_MARGIN + 1s), and both fit in the grace period (STOP_TIMEOUT +
/// KILL_MARGIN < GRACE_PERIOD). The error names the durations where they came from and blames
/// one the user gave, with an example that keeps every rule beside the other two when there is
/// one.
fn check_budget(n: &Namer, args: &InitArgs, budget: [Duration; 3]) -> Result<(), ConfigError> {
    let [grace, stop, margin] = budget;
    let grace = Part::new(n, "grace_period", given(&args.grace_period), grace);
    let stop = Part::new(n, "stop_timeout", given(&args.stop_timeout), stop);
    let margin = Part::new(n, "kill_margin", given(&args.kill_margin), margin);
    let (g, s, m) = (grace.value, stop.value, margin.value);
    let second = Duration::from_secs(1);
    // What each part could be beside the other two: the grace period from just above their
    // sum, the stop timeout between the gap and what the grace period leaves, the margin up to
    // both of those.
    let grace_least = s + m + second;
    let stop_least = m + MIN_STOP_GAP;
    let stop_most = g.saturating_sub(m + second);
    let margin_most = s
        .saturating_sub(MIN_STOP_GAP)
        .min(g.saturating_sub(s + second));
    // The values to suggest for each part (0 grace, 1 stop, 2 margin), preferred first: the
    // least stop timeout or the largest margin for the gap, the least grace period or the
    // largest other two for the sum.
    let (problem, fixes): (String, Vec<(usize, Duration)>) = if m < MIN_KILL_MARGIN {
        let problem = format!(
            "must be at least {}: after its SIGKILL at the deadline minus the margin the init \
             reaps what is left and waits up to 1s for the killed runs' records to be marked \
             ended, all before the runtime's own SIGKILL at the deadline",
            fmt_duration(MIN_KILL_MARGIN)
        );
        let fixes = [
            (2, DEFAULT_KILL_MARGIN),
            (2, margin_most),
            (2, MIN_KILL_MARGIN),
        ];
        (problem, fixes.to_vec())
    } else if s < m + MIN_STOP_GAP {
        let problem = format!(
            "{} must be at least {} longer than {}: terraform gets its graceful SIGTERM at the \
             deadline minus the stop timeout and the SIGKILL at the deadline minus the kill \
             margin, and the difference is all it has to save its state and release its lock; \
             raise the stop timeout or lower the kill margin",
            stop.shown(),
            fmt_duration(MIN_STOP_GAP),
            margin.shown(),
        );
        let fixes = [
            (1, stop_least),
            (1, stop_most),
            (2, margin_most),
            (2, MIN_KILL_MARGIN),
        ];
        (problem, fixes.to_vec())
    } else if s + m >= g {
        let problem = format!(
            "{} + {} must be smaller than {}: raise the grace period (and the pod's \
             terminationGracePeriodSeconds) or lower the other two",
            stop.shown(),
            margin.shown(),
            grace.shown(),
        );
        let fixes = [
            (0, grace_least),
            (1, stop_most),
            (2, margin_most),
            (2, MIN_KILL_MARGIN),
        ];
        (problem, fixes.to_vec())
    } else {
        return Ok(());
    };
    let parts = [&grace, &stop, &margin];
    let given = |i: usize| parts[i].given.is_some();
    let fixed = |(i, v): (usize, Duration)| {
        let mut b = [g, s, m];
        b[i] = v;
        b
    };
    // A value the user gave is blamed, with a suggestion that keeps every rule; failing that,
    // one that mends the rule broken.
    let (i, example) = fixes
        .iter()
        .copied()
        .find(|&(i, v)| given(i) && keeps_rules(fixed((i, v))))
        .or_else(|| fixes.iter().copied().find(|&(i, _)| given(i)))
        .unwrap_or(fixes[0]);
    let blamed = parts[i];
    Err(ConfigError {
        source_name: blamed.name.clone(),
        value: blamed
            .given
            .clone()
            .unwrap_or_else(|| fmt_duration(blamed.value)),
        problem,
        example: fmt_duration(example),
    })
}

impl InitConfig {
    /// Validates the init's settings; `matches` (when given) lets errors name flags.
    pub fn from_args(args: &InitArgs, matches: Option<&ArgMatches>) -> Result<Self, ConfigError> {
        let n = Namer { matches };
        let (forward, rewrite) = forwarding(&n, args)?;
        let (grace_period, stop_timeout, kill_margin) = budget(&n, args)?;
        let (log_level, log_format) = logs(&n, args)?;
        let run_dir = run_dir(&n, args)?;
        let state_dir = state_dir(&n, args)?;
        let words = ["auto", "kubernetes", "file"];
        let store = n.choice("store", given(&args.store), &words, "auto")?;
        let store = StoreSetting::parse(words[store]).unwrap_or(StoreSetting::Auto);
        let owner = owner(&n, args)?;
        let (owner_ttl, record_timeout) = record_timers(&n, args)?;
        let older_owner_ttl = older_owner_ttl(&n, args)?;
        let unlock = given(&args.force_unlock);
        let force_unlock =
            [true, false][n.choice("force_unlock", unlock, &["auto", "off"], "auto")?];
        let metrics_addr = n.parse(
            "metrics_addr",
            given(&args.metrics_addr).map(str::trim),
            ":9102",
            crate::metrics_server::parse_addr,
        )?;
        let max_runs = n.parse("max_runs", given(&args.max_runs), "4", parse_max_runs)?;
        let mut warnings = Vec::new();
        let pod_uid = pod_uid(&mut warnings);
        Ok(InitConfig {
            forward,
            rewrite,
            grace_period,
            stop_timeout,
            kill_margin,
            log_level,
            log_format,
            run_dir,
            state_dir,
            store,
            owner,
            owner_ttl,
            older_owner_ttl,
            record_timeout,
            force_unlock,
            metrics_addr,
            max_runs,
            pod_uid,
            warnings,
        })
    }
}

/// Where forwarded signals go, and how they are rewritten first.
fn forwarding(n: &Namer, args: &InitArgs) -> Result<(ForwardTo, Rewrites), ConfigError> {
    let forward = given(&args.forward);
    let forward = [ForwardTo::Group, ForwardTo::Child]
        [n.choice("forward", forward, &["group", "child"], "group")?];
    let rewrite = n
        .parse(
            "rewrite",
            given(&args.rewrite),
            "TERM:INT,USR1:HUP",
            parse_rewrites,
        )?
        .unwrap_or_default();
    Ok((forward, rewrite))
}

/// The shutdown budget: grace period, stop timeout, kill margin, which must fit together.
fn budget(n: &Namer, args: &InitArgs) -> Result<(Duration, Duration, Duration), ConfigError> {
    let grace = n.parse(
        "grace_period",
        given(&args.grace_period),
        "30s",
        parse_duration,
    )?;
    let stop = n.parse(
        "stop_timeout",
        given(&args.stop_timeout),
        "10s",
        parse_duration,
    )?;
    let margin = n.parse(
        "kill_margin",
        given(&args.kill_margin),
        "2s",
        parse_duration,
    )?;
    let budget = [
        grace.unwrap_or(DEFAULT_GRACE),
        stop.unwrap_or(DEFAULT_STOP_TIMEOUT),
        margin.unwrap_or(DEFAULT_KILL_MARGIN),
    ];
    check_budget(n, args, budget)?;
    let [grace, stop, margin] = budget;
    Ok((grace, stop, margin))
}

/// The log's level and format.
fn logs(n: &Namer, args: &InitArgs) -> Result<(tracing::Level, LogFormat), ConfigError> {
    let text = given(&args.log).map(str::trim);
    let level = n.parse("log", text, "info", |v| {
        v.parse::<tracing::Level>()
            .map_err(|_| "must be error, warn, info, debug or trace".to_string())
    })?;
    let format = given(&args.log_format);
    let format = [LogFormat::Text, LogFormat::Json]
        [n.choice("log_format", format, &["text", "json"], "json")?];
    Ok((level.unwrap_or(tracing::Level::INFO), format))
}

/// The control socket's directory: a given one must leave room for the socket's name in a Unix
/// socket address.
fn run_dir(n: &Namer, args: &InitArgs) -> Result<PathBuf, ConfigError> {
    let run_dir = n.path(
        "run_dir",
        given_path(&args.run_dir),
        default_run_dir(),
        "/tmp/tfinit",
    )?;
    let socket = socket_path(&run_dir);
    if given_path(&args.run_dir).is_some() && socket.as_os_str().len() > MAX_SOCKET_PATH {
        return Err(n.bad(
            "run_dir",
            &run_dir.to_string_lossy(),
            &format!(
                "too long: the control socket's path ({} bytes with /{SOCKET_NAME}) must fit \
                 in {MAX_SOCKET_PATH} bytes, the size of a Unix socket address",
                socket.as_os_str().len()
            ),
            "/tmp/tfinit",
        ));
    }
    Ok(run_dir)
}

/// The records' directory: a given one must leave room for the longest path tfinit makes in it
/// ([`MAX_STATE_DIR`]).
fn state_dir(n: &Namer, args: &InitArgs) -> Result<PathBuf, ConfigError> {
    let given = given_path(&args.state_dir);
    let default = PathBuf::from(DEFAULT_STATE_DIR);
    let dir = n.path("state_dir", given, default, DEFAULT_STATE_DIR)?;
    let len = dir.as_os_str().len();
    if len > MAX_STATE_DIR {
        return Err(n.bad(
            "state_dir",
            &dir.to_string_lossy(),
            &format!(
                "too long: {len} bytes, and a path in it (a record's temporary file, \
                 /records/ and up to 255 bytes) must fit in the 4096 bytes of PATH_MAX, so the \
                 directory may have at most {MAX_STATE_DIR}"
            ),
            DEFAULT_STATE_DIR,
        ));
    }
    Ok(dir)
}

/// This owner's name in records: TFINIT_OWNER, else the hostname, checked alike (it becomes
/// file names just the same).
fn owner(n: &Namer, args: &InitArgs) -> Result<String, ConfigError> {
    let (owner, source) = match given(&args.owner) {
        None => (crate::sys::hostname(), env_of("owner")),
        Some(v) => (v.to_string(), n.name("owner")),
    };
    let Some(problem) = owner_problem(&owner) else {
        return Ok(owner);
    };
    let problem = match given(&args.owner) {
        None => format!("{problem} (the default, the hostname: set TFINIT_OWNER)"),
        Some(_) => problem,
    };
    Err(ConfigError {
        source_name: source,
        value: owner,
        problem,
        example: "provider-terraform-7d9f-abcde".into(),
    })
}

/// The owner TTL (at least 1 s: heartbeats every TTL/3) and the record timeout (at least
/// [`MIN_RECORD_TIMEOUT`]).
fn record_timers(n: &Namer, args: &InitArgs) -> Result<(Duration, Duration), ConfigError> {
    let ttl = n.parse("owner_ttl", given(&args.owner_ttl), "30s", |v| {
        let ttl = parse_duration(v)?;
        if ttl < MIN_OWNER_TTL {
            return Err("must be at least 1s (heartbeats are written every TTL/3)".into());
        }
        Ok(ttl)
    })?;
    let text = given(&args.record_timeout);
    let record_timeout = n.parse("record_timeout", text, "30s", |v| {
        let timeout = parse_duration(v)?;
        if timeout < MIN_RECORD_TIMEOUT {
            return Err(format!(
                "must be at least {}: a record takes up to eight file operations (with a \
                 heartbeat first), and a state-locking run whose record is not written in time \
                 starts without it (with 0, every one would)",
                fmt_duration(MIN_RECORD_TIMEOUT)
            ));
        }
        Ok(timeout)
    })?;
    Ok((
        ttl.unwrap_or(DEFAULT_OWNER_TTL),
        record_timeout.unwrap_or(DEFAULT_RECORD_TIMEOUT),
    ))
}

/// TFINIT_OLDER_OWNER_TTL: at least 1 s, like any TTL; by default the longest TTL tfinit accepts,
/// so that an owner that states no TTL is never judged by less than the one it ran with.
fn older_owner_ttl(n: &Namer, args: &InitArgs) -> Result<Duration, ConfigError> {
    let ttl = n.parse(
        "older_owner_ttl",
        given(&args.older_owner_ttl),
        "30s",
        |v| {
            let ttl = parse_duration(v)?;
            if ttl < Duration::from_secs(1) {
                return Err(
                    "must be at least 1s (the shortest TFINIT_OWNER_TTL tfinit accepts)".into(),
                );
            }
            Ok(ttl)
        },
    )?;
    Ok(ttl.unwrap_or(crate::locks::liveness::LONGEST_TTL))
}

/// TFINIT_MAX_RUNS: a whole number of runs, at least 1 (unset means no limit, so 0 would only be
/// a mistake: every run would wait forever). Digits only: usize's parser would take `+4`.
fn parse_max_runs(v: &str) -> Result<NonZeroUsize, String> {
    let v = v.trim();
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(
            "must be a whole number of runs, at least 1 (leave it unset for no limit)".to_string(),
        );
    }
    let n: usize = v.parse().map_err(|_| {
        format!(
            "overflows: a cap is at most {} runs (leave it unset for no limit)",
            usize::MAX
        )
    })?;
    NonZeroUsize::new(n).ok_or_else(|| {
        "must be at least 1: with 0 no terraform run could ever start (leave it unset for no limit)"
            .to_string()
    })
}

/// The pod's UID from the downward API: TFINIT_POD_UID, else POD_UID. Empty and blank count as
/// unset; a value that is not UTF-8 cannot go in a record (JSON text): it counts as unset too,
/// with a warning, rather than be dropped in silence (the records would lack the UID and nobody
/// would know why) or stop the init (the variable may be set by something else than tfinit's
/// manifest).
fn pod_uid(warnings: &mut Vec<ConfigWarning>) -> Option<String> {
    for var in ["TFINIT_POD_UID", "POD_UID"] {
        match std::env::var(var) {
            Ok(v) if !v.trim().is_empty() => return Some(v),
            Ok(_) | Err(std::env::VarError::NotPresent) => {}
            Err(std::env::VarError::NotUnicode(raw)) => {
                warnings.push(ConfigWarning::PodUidNotUtf8 {
                    var,
                    value: raw.to_string_lossy().into_owned(),
                });
            }
        }
    }
    None
}

#[cfg(test)]
mod tests;

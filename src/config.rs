//! Validated settings. A bad value stops tfinit before anything starts, with exit code 2 and one
//! message naming the variable (or flag), the value, and an example of a good one.

use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::parser::ValueSource;
use clap::ArgMatches;

use crate::cli::InitArgs;
use crate::duration::{fmt_duration, parse_duration};
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

/// The run directory clients use: TFINIT_RUN_DIR, else the default.
pub(crate) fn client_run_dir() -> PathBuf {
    match std::env::var_os("TFINIT_RUN_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
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

/// A path setting as given: None when unset or empty.
fn given_path(value: &Option<PathBuf>) -> Option<&PathBuf> {
    value.as_ref().filter(|p| !p.as_os_str().is_empty())
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

/// STOP_TIMEOUT + KILL_MARGIN must be smaller than GRACE_PERIOD. The error names all three where
/// they came from and blames one the user gave (the grace period first: it is the one lowered to
/// match a pod), with an example that fits the other two.
fn check_budget(n: &Namer, args: &InitArgs, budget: [Duration; 3]) -> Result<(), ConfigError> {
    let [grace, stop, margin] = budget;
    if stop + margin < grace {
        return Ok(());
    }
    let grace = Part::new(n, "grace_period", given(&args.grace_period), grace);
    let stop = Part::new(n, "stop_timeout", given(&args.stop_timeout), stop);
    let margin = Part::new(n, "kill_margin", given(&args.kill_margin), margin);
    let problem = format!(
        "{} + {} must be smaller than {}: raise the grace period (and the pod's \
         terminationGracePeriodSeconds) or lower the other two",
        stop.shown(),
        margin.shown(),
        grace.shown(),
    );
    let second = Duration::from_secs(1);
    let fits = |total: &Part, other: &Part| {
        total
            .value
            .checked_sub(other.value + second)
            .filter(|d| !d.is_zero())
            .map(fmt_duration)
    };
    let grace_example = fmt_duration(stop.value + margin.value + second);
    let candidates = [
        (&grace, Some(grace_example.clone())),
        (&stop, fits(&grace, &margin)),
        (&margin, fits(&grace, &stop)),
    ];
    let (blamed, example) = candidates
        .into_iter()
        .find_map(|(part, example)| Some((part, example.filter(|_| part.given.is_some())?)))
        .unwrap_or((&grace, grace_example));
    Err(ConfigError {
        source_name: blamed.name.clone(),
        value: blamed
            .given
            .clone()
            .unwrap_or_else(|| fmt_duration(blamed.value)),
        problem,
        example,
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
        let state_dir = n.path(
            "state_dir",
            given_path(&args.state_dir),
            PathBuf::from(DEFAULT_STATE_DIR),
            DEFAULT_STATE_DIR,
        )?;
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
            owner,
            owner_ttl,
            older_owner_ttl,
            record_timeout,
            force_unlock,
            metrics_addr,
            max_runs,
            pod_uid: pod_uid(),
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
    let durations = [
        ("grace_period", &args.grace_period, DEFAULT_GRACE, "30s"),
        (
            "stop_timeout",
            &args.stop_timeout,
            DEFAULT_STOP_TIMEOUT,
            "10s",
        ),
        ("kill_margin", &args.kill_margin, DEFAULT_KILL_MARGIN, "2s"),
    ];
    let [grace, stop, margin] = durations.map(|(key, value, default, example)| {
        let d = n.parse(key, given(value), example, parse_duration)?;
        Ok(d.unwrap_or(default))
    });
    let budget = [grace?, stop?, margin?];
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

/// The owner TTL (at least 1 s: heartbeats every TTL/3) and the record timeout.
fn record_timers(n: &Namer, args: &InitArgs) -> Result<(Duration, Duration), ConfigError> {
    let ttl = n.parse("owner_ttl", given(&args.owner_ttl), "30s", |v| {
        let ttl = parse_duration(v)?;
        if ttl < Duration::from_secs(1) {
            return Err("must be at least 1s (heartbeats are written every TTL/3)".into());
        }
        Ok(ttl)
    })?;
    let text = given(&args.record_timeout);
    let record_timeout = n.parse("record_timeout", text, "30s", parse_duration)?;
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
/// a mistake: every run would wait forever).
fn parse_max_runs(v: &str) -> Result<NonZeroUsize, String> {
    let n: usize = v.trim().parse().map_err(|_| {
        "must be a whole number of runs, at least 1 (leave it unset for no limit)".to_string()
    })?;
    NonZeroUsize::new(n).ok_or_else(|| {
        "must be at least 1: with 0 no terraform run could ever start (leave it unset for no limit)"
            .to_string()
    })
}

/// The pod's UID from the downward API: TFINIT_POD_UID, else POD_UID.
fn pod_uid() -> Option<String> {
    ["TFINIT_POD_UID", "POD_UID"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.trim().is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::locks::names::MAX_OWNER_LEN;

    #[test]
    fn rewrites() {
        let r = parse_rewrites("TERM:INT, USR1:HUP").unwrap();
        assert_eq!(r.apply(libc::SIGTERM), libc::SIGINT);
        assert_eq!(r.apply(libc::SIGUSR1), libc::SIGHUP);
        assert!(parse_rewrites("TERM").is_err());
        assert!(parse_rewrites("TERM:NOPE").is_err());
        assert!(parse_rewrites("CHLD:TERM").is_err());
        assert!(parse_rewrites("SEGV:TERM").is_err());
        assert!(parse_rewrites("TERM:INT,TERM:HUP").is_err());
        assert!(
            parse_rewrites("KILL:TERM").is_err(),
            "SIGKILL never reaches the init"
        );
        assert!(
            parse_rewrites("PIPE:HUP").is_err(),
            "SIGPIPE is never forwarded"
        );
        assert!(parse_rewrites("RTMIN+1:TERM").is_ok());
    }

    #[test]
    fn budget_must_fit() {
        let args = InitArgs {
            grace_period: Some("10s".into()),
            stop_timeout: Some("9s".into()),
            kill_margin: Some("1s".into()),
            ..Default::default()
        };
        let e = InitConfig::from_args(&args, None).unwrap_err().to_string();
        assert!(
            e.contains("TFINIT_STOP_TIMEOUT") && e.contains("9s") && e.contains("10s"),
            "{e}"
        );
    }

    #[test]
    fn errors_name_variable_value_and_example() {
        let args = InitArgs {
            grace_period: Some("soon".into()),
            ..Default::default()
        };
        let e = InitConfig::from_args(&args, None).unwrap_err().to_string();
        assert!(e.contains("TFINIT_GRACE_PERIOD=\"soon\""), "{e}");
        assert!(e.contains("for example TFINIT_GRACE_PERIOD=30s"), "{e}");
    }

    #[test]
    fn empty_values_count_as_unset() {
        let args = InitArgs {
            grace_period: Some(String::new()),
            forward: Some(" ".into()),
            ..Default::default()
        };
        let cfg = InitConfig::from_args(&args, None).unwrap();
        assert_eq!(cfg.grace_period, DEFAULT_GRACE);
        assert_eq!(cfg.forward, ForwardTo::Group);
    }

    #[test]
    fn an_owner_name_longer_than_its_files_allow_is_refused_with_its_length_and_the_maximum() {
        let longest = "p".repeat(MAX_OWNER_LEN);
        let with = |owner: &str| InitArgs {
            owner: Some(owner.to_string()),
            ..Default::default()
        };
        let cfg = InitConfig::from_args(&with(&longest), None).unwrap();
        assert_eq!(cfg.owner, longest);
        let too_long = format!("{longest}p");
        let e = InitConfig::from_args(&with(&too_long), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("TFINIT_OWNER={too_long:?}")), "{e}");
        assert!(
            e.contains("is 110 bytes long") && e.contains("at most 109"),
            "{e}"
        );
        assert!(
            e.contains("for example TFINIT_OWNER=provider-terraform"),
            "{e}"
        );
    }
}

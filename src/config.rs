//! Validated settings. A bad value stops tfinit before anything starts, with exit code 2 and one
//! message naming the variable (or flag), the value, and an example of a good one.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::parser::ValueSource;
use clap::ArgMatches;

use crate::cli::InitArgs;
// The longest owner name follows from the names the store gives its files: computed there.
use crate::locks::store::MAX_OWNER_LEN;
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
    /// How long a state-locking run waits in `recording` for its record (and the store to open).
    pub record_timeout: Duration,
    /// Whether stale locks of dead owners are released automatically.
    pub force_unlock: bool,
    /// The pod's UID when the downward API provides it (TFINIT_POD_UID or POD_UID).
    pub pod_uid: Option<String>,
}

/// Default grace period: Kubernetes' default terminationGracePeriodSeconds.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);
/// Default stop timeout.
pub const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Default kill margin.
pub const DEFAULT_KILL_MARGIN: Duration = Duration::from_secs(2);
/// Default owner TTL.
pub const DEFAULT_OWNER_TTL: Duration = Duration::from_secs(30);
/// Default record timeout: covers a record write plus a heartbeat write on a slow volume.
pub const DEFAULT_RECORD_TIMEOUT: Duration = Duration::from_secs(30);
/// Default state directory.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/tfinit";

/// Names the source of a setting: the environment variable or the flag that gave it.
struct Namer<'a> {
    matches: Option<&'a ArgMatches>,
}

impl Namer<'_> {
    fn name(&self, id: &str, env: &str, flag: &str) -> String {
        match self.matches.and_then(|m| m.value_source(id)) {
            Some(ValueSource::CommandLine) => format!("--{flag}"),
            _ => env.to_string(),
        }
    }
}

fn bad(source_name: String, value: &str, problem: &str, example: &str) -> ConfigError {
    ConfigError {
        source_name,
        value: value.to_string(),
        problem: problem.to_string(),
        example: example.to_string(),
    }
}

/// Parses `30s`, `5m`, `1h30m`, `250ms` or plain seconds (`30`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("empty duration".into());
    }
    if let Ok(secs) = t.parse::<u64>() {
        return checked_secs(secs);
    }
    let mut total_ms: u128 = 0;
    let mut rest = t;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!("expected a number at {rest:?}"));
        }
        let n: u128 = rest[..digits]
            .parse()
            .map_err(|_| "number too large".to_string())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let ms_per = match unit {
            "ms" => 1,
            "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            "" => return Err("a number needs a unit when more follow".into()),
            other => return Err(format!("unknown unit {other:?} (use ms, s, m or h)")),
        };
        total_ms = total_ms
            .checked_add(n.checked_mul(ms_per).ok_or("duration too large")?)
            .ok_or("duration too large")?;
    }
    if total_ms > MAX_DURATION.as_millis() {
        return Err("longer than a year".into());
    }
    Ok(Duration::from_millis(total_ms as u64))
}

/// Durations beyond this are refused: a grace period of years is a typo.
const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

fn checked_secs(secs: u64) -> Result<Duration, String> {
    if secs > MAX_DURATION.as_secs() {
        return Err("longer than a year".into());
    }
    Ok(Duration::from_secs(secs))
}

fn duration_setting(
    namer: &Namer,
    value: Option<&str>,
    id: &str,
    env: &str,
    flag: &str,
    default: Duration,
    example: &str,
) -> Result<Duration, ConfigError> {
    match value {
        None => Ok(default),
        Some(v) => parse_duration(v).map_err(|p| bad(namer.name(id, env, flag), v, &p, example)),
    }
}

/// Parses `TERM:INT,USR1:HUP`.
pub fn parse_rewrites(text: &str) -> Result<Rewrites, String> {
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
pub fn default_run_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => Path::new(&d).join("tfinit"),
        _ => PathBuf::from(format!("/tmp/tfinit-{}", nix::unistd::getuid())),
    }
}

/// The run directory clients use: TFINIT_RUN_DIR, else the default.
pub fn client_run_dir() -> PathBuf {
    match std::env::var_os("TFINIT_RUN_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => default_run_dir(),
    }
}

fn path_setting(
    namer: &Namer,
    value: Option<&PathBuf>,
    id: &str,
    env: &str,
    flag: &str,
    default: PathBuf,
    example: &str,
) -> Result<PathBuf, ConfigError> {
    match value {
        None => Ok(default),
        Some(p) if p.as_os_str().is_empty() || !p.is_absolute() => Err(bad(
            namer.name(id, env, flag),
            &p.to_string_lossy(),
            "must be an absolute path",
            example,
        )),
        Some(p) => Ok(p.clone()),
    }
}

/// The longest socket path a Unix socket address holds (sun_path is 108 bytes with the NUL).
const MAX_SOCKET_PATH: usize = 107;

/// The socket's file name in the run directory (see `init::setup::socket_path`).
const SOCKET_NAME: &str = "tfinit.sock";

/// STOP_TIMEOUT + KILL_MARGIN must be smaller than GRACE_PERIOD. The error names all three where
/// they came from and blames one the user gave (the grace period first: it is the one lowered to
/// match a pod), with an example that fits the other two.
fn check_budget(
    n: &Namer,
    args: &InitArgs,
    grace: Duration,
    stop: Duration,
    margin: Duration,
) -> Result<(), ConfigError> {
    if stop + margin < grace {
        return Ok(());
    }
    let grace_name = n.name("grace_period", "TFINIT_GRACE_PERIOD", "grace-period");
    let stop_name = n.name("stop_timeout", "TFINIT_STOP_TIMEOUT", "stop-timeout");
    let margin_name = n.name("kill_margin", "TFINIT_KILL_MARGIN", "kill-margin");
    let shown = |name: &str, d: Duration, given: &Option<String>| {
        let default = if given.is_some() { "" } else { ", the default" };
        format!("{name} ({}{default})", fmt_duration(d))
    };
    let problem = format!(
        "{} + {} must be smaller than {}: raise the grace period (and the pod's \
         terminationGracePeriodSeconds) or lower the other two",
        shown(&stop_name, stop, &args.stop_timeout),
        shown(&margin_name, margin, &args.kill_margin),
        shown(&grace_name, grace, &args.grace_period),
    );
    let second = Duration::from_secs(1);
    let fits = |total: Duration, other: Duration| {
        total
            .checked_sub(other + second)
            .filter(|d| !d.is_zero())
            .map(fmt_duration)
    };
    let grace_example = fmt_duration(stop + margin + second);
    let candidates = [
        (
            args.grace_period.is_some(),
            &grace_name,
            &args.grace_period,
            grace,
            Some(grace_example.clone()),
        ),
        (
            args.stop_timeout.is_some(),
            &stop_name,
            &args.stop_timeout,
            stop,
            fits(grace, margin),
        ),
        (
            args.kill_margin.is_some(),
            &margin_name,
            &args.kill_margin,
            margin,
            fits(grace, stop),
        ),
    ];
    let (name, given, value, example) = candidates
        .into_iter()
        .find_map(|(blamed, name, given, value, example)| {
            Some((name, given, value, example.filter(|_| blamed)?))
        })
        .unwrap_or((&grace_name, &args.grace_period, grace, grace_example));
    Err(ConfigError {
        source_name: name.clone(),
        value: given.clone().unwrap_or_else(|| fmt_duration(value)),
        problem,
        example,
    })
}

impl InitConfig {
    /// Validates the init's settings; `matches` (when given) lets errors name flags.
    pub fn from_args(args: &InitArgs, matches: Option<&ArgMatches>) -> Result<Self, ConfigError> {
        let n = Namer { matches };
        // An empty variable counts as unset: manifests and Helm charts often render `value: ""`.
        let args = &args.without_empty();
        let forward = match args.forward.as_deref().map(str::trim) {
            None | Some("group") => ForwardTo::Group,
            Some("child") => ForwardTo::Child,
            Some(v) => {
                return Err(bad(
                    n.name("forward", "TFINIT_FORWARD", "forward"),
                    v,
                    "must be group or child",
                    "group",
                ))
            }
        };
        let rewrite = match args.rewrite.as_deref() {
            None => Rewrites::default(),
            Some(v) => parse_rewrites(v).map_err(|p| {
                bad(
                    n.name("rewrite", "TFINIT_REWRITE", "rewrite"),
                    v,
                    &p,
                    "TERM:INT,USR1:HUP",
                )
            })?,
        };
        let grace_period = duration_setting(
            &n,
            args.grace_period.as_deref(),
            "grace_period",
            "TFINIT_GRACE_PERIOD",
            "grace-period",
            DEFAULT_GRACE,
            "30s",
        )?;
        let stop_timeout = duration_setting(
            &n,
            args.stop_timeout.as_deref(),
            "stop_timeout",
            "TFINIT_STOP_TIMEOUT",
            "stop-timeout",
            DEFAULT_STOP_TIMEOUT,
            "10s",
        )?;
        let kill_margin = duration_setting(
            &n,
            args.kill_margin.as_deref(),
            "kill_margin",
            "TFINIT_KILL_MARGIN",
            "kill-margin",
            DEFAULT_KILL_MARGIN,
            "2s",
        )?;
        check_budget(&n, args, grace_period, stop_timeout, kill_margin)?;
        let log_level = match args.log.as_deref().map(str::trim) {
            None => tracing::Level::INFO,
            Some(v) => v.parse::<tracing::Level>().map_err(|_| {
                bad(
                    n.name("log", "TFINIT_LOG", "log"),
                    v,
                    "must be error, warn, info, debug or trace",
                    "info",
                )
            })?,
        };
        let log_format = match args.log_format.as_deref().map(str::trim) {
            None | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(v) => {
                return Err(bad(
                    n.name("log_format", "TFINIT_LOG_FORMAT", "log-format"),
                    v,
                    "must be text or json",
                    "json",
                ))
            }
        };
        let run_dir = path_setting(
            &n,
            args.run_dir.as_ref(),
            "run_dir",
            "TFINIT_RUN_DIR",
            "run-dir",
            default_run_dir(),
            "/tmp/tfinit",
        )?;
        if args.run_dir.is_some() {
            let socket = run_dir.join(SOCKET_NAME);
            if socket.as_os_str().len() > MAX_SOCKET_PATH {
                return Err(bad(
                    n.name("run_dir", "TFINIT_RUN_DIR", "run-dir"),
                    &run_dir.to_string_lossy(),
                    &format!(
                        "too long: the control socket's path ({} bytes with /{SOCKET_NAME}) must fit \
                         in {MAX_SOCKET_PATH} bytes, the size of a Unix socket address",
                        socket.as_os_str().len()
                    ),
                    "/tmp/tfinit",
                ));
            }
        }
        let state_dir = path_setting(
            &n,
            args.state_dir.as_ref(),
            "state_dir",
            "TFINIT_STATE_DIR",
            "state-dir",
            PathBuf::from(DEFAULT_STATE_DIR),
            DEFAULT_STATE_DIR,
        )?;
        // The default is checked like a given value: it becomes file names just the same.
        let (owner, owner_source) = match args.owner.as_deref() {
            None => (hostname(), "TFINIT_OWNER".to_string()),
            Some(v) => (v.to_string(), n.name("owner", "TFINIT_OWNER", "owner")),
        };
        if let Some(problem) = owner_problem(&owner) {
            let problem = match args.owner {
                None => format!("{problem} (the default, the hostname: set TFINIT_OWNER)"),
                Some(_) => problem,
            };
            return Err(bad(
                owner_source,
                &owner,
                &problem,
                "provider-terraform-7d9f-abcde",
            ));
        }
        let owner_ttl = duration_setting(
            &n,
            args.owner_ttl.as_deref(),
            "owner_ttl",
            "TFINIT_OWNER_TTL",
            "owner-ttl",
            DEFAULT_OWNER_TTL,
            "30s",
        )?;
        if owner_ttl < Duration::from_secs(1) {
            return Err(bad(
                n.name("owner_ttl", "TFINIT_OWNER_TTL", "owner-ttl"),
                args.owner_ttl.as_deref().unwrap_or_default(),
                "must be at least 1s (heartbeats are written every TTL/3)",
                "30s",
            ));
        }
        let record_timeout = duration_setting(
            &n,
            args.record_timeout.as_deref(),
            "record_timeout",
            "TFINIT_RECORD_TIMEOUT",
            "record-timeout",
            DEFAULT_RECORD_TIMEOUT,
            "30s",
        )?;
        let force_unlock = match args.force_unlock.as_deref().map(str::trim) {
            None | Some("auto") => true,
            Some("off") => false,
            Some(v) => {
                return Err(bad(
                    n.name("force_unlock", "TFINIT_FORCE_UNLOCK", "force-unlock"),
                    v,
                    "must be auto or off",
                    "auto",
                ))
            }
        };
        let pod_uid = ["TFINIT_POD_UID", "POD_UID"]
            .iter()
            .find_map(|k| std::env::var(k).ok().filter(|v| !v.trim().is_empty()));
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
            record_timeout,
            force_unlock,
            pod_uid,
        })
    }
}

impl InitArgs {
    /// A copy where empty or blank values are None.
    fn without_empty(&self) -> InitArgs {
        let text = |v: &Option<String>| v.clone().filter(|s| !s.trim().is_empty());
        let path = |v: &Option<PathBuf>| v.clone().filter(|p| !p.as_os_str().is_empty());
        InitArgs {
            forward: text(&self.forward),
            rewrite: text(&self.rewrite),
            grace_period: text(&self.grace_period),
            stop_timeout: text(&self.stop_timeout),
            kill_margin: text(&self.kill_margin),
            log: text(&self.log),
            log_format: text(&self.log_format),
            run_dir: path(&self.run_dir),
            state_dir: path(&self.state_dir),
            owner: text(&self.owner),
            owner_ttl: text(&self.owner_ttl),
            record_timeout: text(&self.record_timeout),
            force_unlock: text(&self.force_unlock),
        }
    }
}

/// What is wrong with `s` as this init's owner name, if anything: it must be a [`valid_owner`]
/// and at most [`MAX_OWNER_LEN`] bytes, so that every file name tfinit makes of it fits in the
/// 255 bytes a file system takes.
pub fn owner_problem(s: &str) -> Option<String> {
    if s.len() > MAX_OWNER_LEN {
        return Some(format!(
            "is {} bytes long; an owner name may have at most {MAX_OWNER_LEN}, so that the names of its files in TFINIT_STATE_DIR fit in 255 bytes",
            s.len()
        ));
    }
    (!valid_owner(s)).then(|| {
        format!(
            "must be 1 to {MAX_OWNER_LEN} characters of letters, digits, '.', '-' or '_', not starting with '.'"
        )
    })
}

/// Whether `s` can name an owner in a record or heartbeat read back (it is part of file names in
/// the state directory). Up to 253 bytes, as any tfinit accepted before [`MAX_OWNER_LEN`]: a
/// record is not corrupt for a name this init would refuse at start.
pub fn valid_owner(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        && !s.starts_with('.')
}

/// The hostname as terraform's `os.Hostname()` sees it (the pod name in Kubernetes).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| {
            nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
        })
        .unwrap_or_else(|| "localhost".into())
}

/// Formats a duration as `1h30m`, `45s`, `250ms`.
pub fn fmt_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms % 1000 != 0 {
        return format!("{ms}ms");
    }
    let s = ms / 1000;
    let (h, m, s) = (s / 3600, (s / 60) % 60, s % 60);
    let mut out = String::new();
    if h > 0 {
        out += &format!("{h}h");
    }
    if m > 0 {
        out += &format!("{m}m");
    }
    if s > 0 || out.is_empty() {
        out += &format!("{s}s");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration(" 2s "), Ok(Duration::from_secs(2)));
        for bad in [
            "",
            "-1",
            "1.5s",
            "s",
            "10x",
            "1h30",
            "99999999999999999999",
            "9999h",
            "30 s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn formats_durations() {
        assert_eq!(fmt_duration(Duration::from_secs(5400)), "1h30m");
        assert_eq!(fmt_duration(Duration::from_secs(0)), "0s");
        assert_eq!(fmt_duration(Duration::from_millis(1500)), "1500ms");
    }

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
    fn owners() {
        assert!(valid_owner("pod-0"));
        assert!(!valid_owner(""));
        assert!(!valid_owner("../x"));
        assert!(!valid_owner("a/b"));
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
            e.contains("is 119 bytes long") && e.contains("at most 118"),
            "{e}"
        );
        assert!(
            e.contains("for example TFINIT_OWNER=provider-terraform"),
            "{e}"
        );
        // A record of an older tfinit's longer name still reads (it is not corrupt).
        assert!(valid_owner(&"p".repeat(253)));
    }
}

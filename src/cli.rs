//! The command line: `tfinit [OPTIONS] -- COMMAND [ARGS...]` and the client subcommands.
//!
//! Every init setting is also a `TFINIT_*` environment variable; a flag wins over the variable.
//! Values are taken as text here and validated in [`crate::config`], so that a bad value's error
//! names where it came from (the variable or the flag), the value, and a good example. Hence the
//! lenient parsers below: clap's own would refuse an empty path or a non-UTF-8 value with a message
//! that names neither the variable nor a good value.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::builder::{OsStringValueParser, TypedValueParser};
use clap::{Args, Parser, Subcommand};

/// Any text; bytes that are not UTF-8 become U+FFFD, which validation then refuses by name.
fn text() -> impl TypedValueParser<Value = String> {
    OsStringValueParser::new().map(|s| s.to_string_lossy().into_owned())
}

/// Any path, empty included (an empty value counts as unset; see `config`).
fn path() -> impl TypedValueParser<Value = PathBuf> {
    OsStringValueParser::new().map(PathBuf::from)
}

/// tfinit: PID 1 for containers of controllers that drive terraform.
#[derive(Debug, Parser)]
#[command(
    name = "tfinit",
    version,
    about = "PID 1 for containers of Kubernetes controllers that drive the terraform CLI",
    long_about = "tfinit runs COMMAND (the controller) as PID 1's child: it reaps zombies, forwards \
signals, and keeps terraform runs started through its `terraform` shim alive and stops them \
gracefully inside the container's grace period.\n\nUsage as an entrypoint: tfinit [OPTIONS] -- COMMAND [ARGS...]",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
pub struct Cli {
    /// Init settings (each also an environment variable).
    #[command(flatten)]
    pub init: InitArgs,

    /// A client subcommand, run inside a container whose PID 1 is tfinit.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// The controller to run, after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    pub main: Vec<OsString>,
}

/// Settings of the init. Texts, validated by `config::InitConfig::from_args`.
#[derive(Debug, Args, Default)]
pub struct InitArgs {
    /// Where forwarded signals go: `group` (the controller's process group) or `child`.
    #[arg(long, env = "TFINIT_FORWARD", value_name = "group|child", value_parser = text())]
    pub forward: Option<String>,

    /// Signal rewrites applied before forwarding, e.g. `TERM:INT,USR1:HUP`.
    #[arg(long, env = "TFINIT_REWRITE", value_name = "FROM:TO,...", value_parser = text())]
    pub rewrite: Option<String>,

    /// Budget from the first SIGTERM (or the controller's exit) to the hard kill. Match the pod's
    /// terminationGracePeriodSeconds. Default 30s; more than STOP_TIMEOUT + KILL_MARGIN.
    #[arg(long, env = "TFINIT_GRACE_PERIOD", value_name = "DURATION", value_parser = text())]
    pub grace_period: Option<String>,

    /// How long before the deadline terraform runs get their one graceful SIGTERM; also how long an
    /// abandoned run may take to stop before its group is SIGKILLed. Default 10s; at least
    /// KILL_MARGIN + 1s.
    #[arg(long, env = "TFINIT_STOP_TIMEOUT", value_name = "DURATION", value_parser = text())]
    pub stop_timeout: Option<String>,

    /// How long before the deadline everything left is SIGKILLed. Default 2s; at least 1s.
    #[arg(long, env = "TFINIT_KILL_MARGIN", value_name = "DURATION", value_parser = text())]
    pub kill_margin: Option<String>,

    /// Log level: error, warn, info, debug, trace. Default info.
    #[arg(long = "log", env = "TFINIT_LOG", value_name = "LEVEL", value_parser = text())]
    pub log: Option<String>,

    /// Log format on stderr: `text` or `json` (one object per line). Default text.
    #[arg(long, env = "TFINIT_LOG_FORMAT", value_name = "text|json", value_parser = text())]
    pub log_format: Option<String>,

    /// Directory of the init's control socket. Default $XDG_RUNTIME_DIR/tfinit or /tmp/tfinit-<uid>.
    #[arg(long, env = "TFINIT_RUN_DIR", value_name = "DIR", value_parser = path())]
    pub run_dir: Option<PathBuf>,

    /// Directory for lock-owner records and heartbeats (mount a volume). Default /var/lib/tfinit.
    #[arg(long, env = "TFINIT_STATE_DIR", value_name = "DIR", value_parser = path())]
    pub state_dir: Option<PathBuf>,

    /// This owner's name in lock-owner records. Default: the hostname (the pod name).
    #[arg(long, env = "TFINIT_OWNER", value_name = "NAME", value_parser = text())]
    pub owner: Option<String>,

    /// An owner whose heartbeat is older than this is dead. Default 30s.
    #[arg(long, env = "TFINIT_OWNER_TTL", value_name = "DURATION", value_parser = text())]
    pub owner_ttl: Option<String>,

    /// The longest TFINIT_OWNER_TTL older tfinits (record format 3 or older, whose heartbeats do
    /// not say their TTL) ran with: their owners are judged by it. Default: a year (the longest
    /// TTL tfinit accepts), so their dead runs' locks wait for a person or for this setting.
    #[arg(long, env = "TFINIT_OLDER_OWNER_TTL", value_name = "DURATION", value_parser = text())]
    pub older_owner_ttl: Option<String>,

    /// How long a state-locking run waits for its lock-owner record to be written. Default 30s;
    /// at least 1s.
    #[arg(long, env = "TFINIT_RECORD_TIMEOUT", value_name = "DURATION", value_parser = text())]
    pub record_timeout: Option<String>,

    /// `auto`: release a stale state lock provably held by a dead previous owner; `off`: never.
    #[arg(long, env = "TFINIT_FORCE_UNLOCK", value_name = "auto|off", value_parser = text())]
    pub force_unlock: Option<String>,

    /// Where lock-owner records live: `auto` (Leases of the pod's namespace when its service
    /// account may list them, else TFINIT_STATE_DIR), `kubernetes` or `file`. Default auto.
    #[arg(long, env = "TFINIT_STORE", value_name = "auto|kubernetes|file", value_parser = text())]
    pub store: Option<String>,

    /// Serve Prometheus metrics at `GET /metrics` on this address, e.g. `:9102`. Default: off.
    #[arg(long, env = "TFINIT_METRICS_ADDR", value_name = "[HOST]:PORT", value_parser = text())]
    pub metrics_addr: Option<String>,

    /// At most this many terraform runs at once (read-only commands excepted); more wait in the
    /// state `queued`, in arrival order. Default: no limit.
    #[arg(long, env = "TFINIT_MAX_RUNS", value_name = "N", value_parser = text())]
    pub max_runs: Option<String>,
}

/// Client subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run terraform through the init (what the `terraform` shim does): `tfinit terraform -- ARGS`.
    Terraform {
        /// terraform's arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Run OpenTofu through the init: `tfinit tofu -- ARGS`.
    Tofu {
        /// tofu's arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Print the init's phase and its terraform runs as JSON.
    Status,
    /// Print the init's Prometheus metrics (what `GET /metrics` on TFINIT_METRICS_ADDR serves).
    Metrics,
    /// Refuse new terraform runs (what a preStop hook runs); --wait until none is in flight.
    Drain {
        /// Wait until no run is in flight.
        #[arg(long)]
        wait: bool,
        /// Give up waiting after this long (exit 1, listing the runs still going). Default: no limit.
        #[arg(long, value_name = "DURATION", requires = "wait")]
        timeout: Option<String>,
    },
    /// Leave draining: accept terraform runs again.
    Resume,
    /// Stop one terraform run (ids as `tfinit status` shows them, e.g. r7), or every run in a
    /// directory: its one graceful SIGTERM, SIGKILL to its group TFINIT_STOP_TIMEOUT later.
    Cancel {
        /// The run's id (`r7`), as `tfinit status` shows it.
        #[arg(
            value_name = "RUN_ID",
            required_unless_present = "workdir",
            conflicts_with = "workdir"
        )]
        run: Option<String>,
        /// Every run whose working directory (its cwd, or cwd + -chdir) is DIR: the same directory
        /// (device and inode), whatever path reached it.
        #[arg(long, value_name = "DIR", value_parser = path())]
        workdir: Option<PathBuf>,
        /// SIGKILL the run's process group at once instead (terraform cannot release its lock).
        #[arg(long)]
        force: bool,
    },
    /// Release stale state locks of dead owners now, for every record in the state directory.
    Recover {
        /// Print what would be done, change nothing.
        #[arg(long)]
        dry_run: bool,
        /// The real terraform binary (default: TFINIT_TERRAFORM or the next terraform on PATH).
        #[arg(long, env = "TFINIT_TERRAFORM", value_name = "PATH")]
        terraform: Option<PathBuf>,
    },
}

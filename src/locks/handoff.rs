//! What the init hands its recovery helper (`tfinit __recover`): one typed document, written by
//! the init and read back by the helper with serde, never parsed by hand. The helper fails
//! closed: a missing, malformed or unknown argument or field makes it exit 2 with every lock
//! untouched, since what it carries (this init's live runs, its observations) is exactly what
//! keeps the helper off the locks of runs that are still going.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::book::LiveRun;
use super::liveness::Seen;
use super::record::Owner;
use crate::config::StoreSetting;

/// The only flag the helper takes; its value is the JSON of [`RecoverArgs`].
pub const ARGS_FLAG: &str = "--args-json";

/// Version of [`RecoverArgs`]: the init and its helper are one binary, so a mismatch means the
/// binary was replaced under a running init (the helper then refuses).
pub const VERSION: u32 = 2;

/// Linux's limit on one argument (MAX_ARG_STRLEN, 32 pages): a larger document cannot be passed
/// and the helper is not started (the run waits for no recovery, the lock is left alone).
pub const MAX_ARG: usize = 32 * 4096 - 1;

/// Everything a recovery helper is told.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecoverArgs {
    /// [`VERSION`].
    pub v: u32,
    /// The working directory whose records it recovers (as the run gave it).
    pub workdir: PathBuf,
    /// The real terraform.
    pub terraform: PathBuf,
    /// TFINIT_STATE_DIR.
    pub state_dir: PathBuf,
    /// The init's TFINIT_STORE, however it was given (environment or `--store`): the helper
    /// must read the stores the init writes to (version 2; version 1 read the environment, so an
    /// init given `--store` left its helper on the default).
    pub store: StoreSetting,
    /// This incarnation: its own live records are never recovered.
    pub owner: Owner,
    /// The init's TFINIT_OWNER_TTL, ms.
    pub ttl_ms: u64,
    /// The init's TFINIT_OLDER_OWNER_TTL, ms.
    pub older_ttl_ms: u64,
    /// The init's live state-locking runs, recorded or not.
    pub live: Vec<LiveRun>,
    /// What the init has seen of other incarnations' heartbeats.
    pub seen: Vec<Seen>,
}

/// Why the helper's command line was refused.
#[derive(Debug, thiserror::Error)]
pub enum HandoffError {
    /// Not exactly `--args-json JSON`.
    #[error("expected exactly `{ARGS_FLAG} JSON`, got {0}")]
    Shape(String),
    /// The value is not UTF-8.
    #[error("the value of {ARGS_FLAG} is not UTF-8")]
    NotUtf8,
    /// The JSON does not parse as the arguments (a field missing, unknown or of the wrong type).
    #[error("the value of {ARGS_FLAG} is malformed: {0}")]
    Json(#[from] serde_json::Error),
    /// Another version.
    #[error("arguments of version {0}, this tfinit reads {VERSION} (was the binary replaced under a running init?)")]
    Version(u32),
    /// A value that cannot be right.
    #[error("{0}")]
    Invalid(String),
    /// Too large to pass as one argument.
    #[error("the arguments take {0} bytes, more than one argument may ({MAX_ARG})")]
    TooLarge(usize),
}

impl RecoverArgs {
    /// The helper's command line after its subcommand.
    pub fn to_argv(&self) -> Result<Vec<OsString>, HandoffError> {
        let json = serde_json::to_string(self)?;
        if json.len() > MAX_ARG {
            return Err(HandoffError::TooLarge(json.len()));
        }
        Ok(vec![ARGS_FLAG.into(), json.into()])
    }

    /// Reads the helper's command line (after its subcommand); anything but what
    /// [`RecoverArgs::to_argv`] writes is refused.
    pub fn from_argv(args: &[OsString]) -> Result<RecoverArgs, HandoffError> {
        let [flag, value] = args else {
            return Err(HandoffError::Shape(format!("{} arguments", args.len())));
        };
        if flag != ARGS_FLAG {
            return Err(HandoffError::Shape(format!("{:?}", flag.to_string_lossy())));
        }
        let text = value.to_str().ok_or(HandoffError::NotUtf8)?;
        let args: RecoverArgs = serde_json::from_str(text)?;
        if args.v != VERSION {
            return Err(HandoffError::Version(args.v));
        }
        args.check()?;
        Ok(args)
    }

    fn check(&self) -> Result<(), HandoffError> {
        if self.terraform.as_os_str().is_empty() {
            return Err(HandoffError::Invalid("no terraform to run".into()));
        }
        let absolute = [("workdir", &self.workdir), ("state_dir", &self.state_dir)];
        if let Some((name, p)) = absolute.iter().find(|(_, p)| !p.is_absolute()) {
            return Err(HandoffError::Invalid(format!(
                "{name} {} is not an absolute path",
                p.display()
            )));
        }
        if self.ttl_ms < 1000 || self.older_ttl_ms < 1000 {
            return Err(HandoffError::Invalid(format!(
                "TTLs of {} ms and {} ms: tfinit's TTLs are at least 1 s",
                self.ttl_ms, self.older_ttl_ms
            )));
        }
        Ok(())
    }

    /// TFINIT_OWNER_TTL.
    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms)
    }

    /// TFINIT_OLDER_OWNER_TTL.
    pub fn older_ttl(&self) -> Duration {
        Duration::from_millis(self.older_ttl_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> RecoverArgs {
        RecoverArgs {
            v: VERSION,
            workdir: "/tf/a".into(),
            terraform: "/usr/local/bin/terraform".into(),
            state_dir: "/var/lib/tfinit".into(),
            store: StoreSetting::File,
            owner: Owner::current("pod-a", None),
            ttl_ms: 30_000,
            older_ttl_ms: 30_000,
            live: vec![LiveRun {
                workdir: "/tf/a".into(),
                workspace: "default".into(),
                who: "@pod-a".into(),
                data_dir: None,
                started_ms: 1,
                unsure: None,
            }],
            seen: vec![],
        }
    }

    #[test]
    fn what_the_init_writes_the_helper_reads() {
        let a = args();
        assert_eq!(RecoverArgs::from_argv(&a.to_argv().unwrap()).unwrap(), a);
    }

    #[test]
    fn anything_else_is_refused() {
        let good = args().to_argv().unwrap();
        let json: serde_json::Value = serde_json::from_str(good[1].to_str().unwrap()).unwrap();
        let with = |f: &dyn Fn(&mut serde_json::Value)| {
            let mut v = json.clone();
            f(&mut v);
            vec![OsString::from(ARGS_FLAG), OsString::from(v.to_string())]
        };
        let refused: Vec<Vec<OsString>> = vec![
            vec![],
            vec![good[0].clone()],
            vec!["--live-json".into(), good[1].clone()],
            vec![good[0].clone(), good[1].clone(), "--extra".into()],
            vec![good[0].clone(), "{".into()],
            // The very list that keeps the helper off live locks, malformed.
            with(&|v| v["live"] = serde_json::json!("not a list")),
            with(&|v| v["live"][0]["who"] = serde_json::json!(7)),
            with(&|v| {
                v.as_object_mut().unwrap().remove("live");
            }),
            with(&|v| v["surprise"] = serde_json::json!(true)),
            with(&|v| v["v"] = serde_json::json!(VERSION + 1)),
            with(&|v| v["workdir"] = serde_json::json!("relative")),
            with(&|v| v["ttl_ms"] = serde_json::json!(0)),
            // The stores to read: only the init's words, and never left to a default.
            with(&|v| v["store"] = serde_json::json!("s3")),
            with(&|v| {
                v.as_object_mut().unwrap().remove("store");
            }),
            // An init of version 1 (no store: its helper read TFINIT_STORE).
            with(&|v| {
                v["v"] = serde_json::json!(1);
                v.as_object_mut().unwrap().remove("store");
            }),
        ];
        for argv in refused {
            assert!(RecoverArgs::from_argv(&argv).is_err(), "{argv:?}");
        }
        use std::os::unix::ffi::OsStringExt;
        let not_utf8 = vec![good[0].clone(), OsString::from_vec(vec![b'{', 0xff, b'}'])];
        assert!(matches!(
            RecoverArgs::from_argv(&not_utf8),
            Err(HandoffError::NotUtf8)
        ));
    }

    /// The helper reads the stores the init writes to however the init was told (`--store` on
    /// its command line leaves TFINIT_STORE unset): the setting travels in the arguments.
    #[test]
    fn the_store_setting_travels_in_the_arguments_as_its_word() {
        for (setting, word) in [
            (StoreSetting::Auto, "auto"),
            (StoreSetting::Kubernetes, "kubernetes"),
            (StoreSetting::File, "file"),
        ] {
            let a = RecoverArgs {
                store: setting,
                ..args()
            };
            let argv = a.to_argv().unwrap();
            let json: serde_json::Value = serde_json::from_str(argv[1].to_str().unwrap()).unwrap();
            assert_eq!(json["store"], word);
            assert_eq!(RecoverArgs::from_argv(&argv).unwrap().store, setting);
        }
    }

    #[test]
    fn a_document_too_large_for_one_argument_is_not_passed() {
        let mut a = args();
        a.live = vec![a.live[0].clone(); 2000];
        assert!(matches!(a.to_argv(), Err(HandoffError::TooLarge(_))));
    }
}

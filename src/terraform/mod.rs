//! What tfinit knows about a terraform command line: its subcommand, whether it takes the state
//! lock, whether it only reads (TFINIT_MAX_RUNS never queues it), where it runs (`-chdir`), how to
//! show it without secrets, and where the real binary is.

mod find;
mod flags;
mod redact;

use crate::protocol::env_value;
use std::path::{Path, PathBuf};

pub use find::find_real;
use flags::{Reader, Reading, Readings};
pub use redact::redact;

/// How a subcommand comes to hold the state lock of the working directory's backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockRule {
    /// Locks unless its `-lock` flag ends up false: the command (or backend/local's `localRun`)
    /// locks through `clistate.NewLocker` only `if stateLock`, and a false `-lock` leaves it the
    /// no-op locker.
    UnlessLockFalse,
    /// Locks whatever `-lock` says: a remote backend's `StateMgr` creates a missing workspace state
    /// under the lock (Operation `init`) before any `-lock` check, or the command has no `-lock`.
    Always,
    /// Locks only when `-or-create` ends up true: a missing workspace is then created as for
    /// [`LockRule::Always`]; without it the command only writes the local workspace name.
    WithOrCreate,
}

/// The subcommands that may take the state lock, and how (terraform 1.0 to 1.17-dev, OpenTofu 1.6
/// to 1.13-dev; sources in docs/notes/terraform-facts.md, section 11). No other subcommand locks
/// the working directory's state: `output`, `show`, `graph`, `validate`, `get`, `test`,
/// `providers ...`, `state list|show|pull`, `workspace list|show`, `force-unlock`, `login`...
/// `env` is terraform's hidden old name for `workspace`; `state move|remove` are OpenTofu's (1.7+)
/// names for `state mv|rm`. Two-word commands are joined by one space.
pub const LOCKING: &[(&str, LockRule)] = &[
    // backend/local's localRun locks through the operation's StateLocker.
    ("apply", LockRule::UnlessLockFalse),
    ("destroy", LockRule::UnlessLockFalse),
    ("plan", LockRule::UnlessLockFalse),
    ("refresh", LockRule::UnlessLockFalse),
    ("import", LockRule::UnlessLockFalse),
    // The command itself: `if c.stateLock { clistate.NewLocker(...).Lock(stateMgr, ...) }`.
    ("taint", LockRule::UnlessLockFalse),
    ("untaint", LockRule::UnlessLockFalse),
    ("state mv", LockRule::UnlessLockFalse),
    ("state move", LockRule::UnlessLockFalse),
    ("state rm", LockRule::UnlessLockFalse),
    ("state remove", LockRule::UnlessLockFalse),
    ("state push", LockRule::UnlessLockFalse),
    ("state replace-provider", LockRule::UnlessLockFalse),
    ("workspace delete", LockRule::UnlessLockFalse),
    ("env delete", LockRule::UnlessLockFalse),
    // init (even -backend=false: it loads the backend stored by the last init) and workspace new
    // call the backend's StateMgr for a workspace that may not exist yet; -lock only governs init's
    // state migration and workspace new's -state copy.
    ("init", LockRule::Always),
    ("workspace new", LockRule::Always),
    ("env new", LockRule::Always),
    // No -lock flag: its flag set forces stateLock on (terraform up to 1.14, every OpenTofu).
    ("console", LockRule::Always),
    ("workspace select", LockRule::WithOrCreate),
    ("env select", LockRule::WithOrCreate),
];

/// The two-word commands of terraform and OpenTofu: mitchellh/cli takes a second word into the
/// subcommand only when the pair is one of them (`state rmx a` is `state` with operands).
const NESTED: &[&str] = &[
    "env delete",
    "env list",
    "env new",
    "env select",
    "metadata functions",
    "providers lock",
    "providers mirror",
    "providers schema",
    "state identities",
    "state list",
    "state ls",
    "state move",
    "state mv",
    "state pull",
    "state push",
    "state remove",
    "state replace-provider",
    "state rm",
    "state show",
    "workspace delete",
    "workspace list",
    "workspace new",
    "workspace select",
    "workspace show",
];

/// A parsed terraform command line.
///
/// It is read the way terraform and OpenTofu read it: main.go takes `-chdir=DIR` off the front
/// and inserts `TF_CLI_ARGS` and `TF_CLI_ARGS_<subcommand>` after the subcommand, mitchellh/cli
/// finds the subcommand and answers `-h` with help, and the subcommand's Go `flag.FlagSet` reads
/// flags up to its first operand or `--`, the last occurrence of a flag winning. Where tfinit
/// cannot follow that exactly (a flag it does not know, a value Go rejects, shell quoting in
/// `TF_CLI_ARGS`), a subcommand that may lock counts as locking: a needless record costs a file,
/// a missing one leaves a lock that no later run can prove stale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    /// `apply`, `state rm`, `version`... or empty when there is none (`terraform -version`).
    pub subcommand: String,
    /// The `-chdir=DIR` global option, if given.
    pub chdir: Option<String>,
    /// Whether the run takes the state lock.
    locks: bool,
    /// NAME of `workspace new|delete|select NAME` (or `env ...`), when read exactly.
    workspace_arg: Option<String>,
    /// Whether terraform only prints help or its version (`-help`, `-version` read as flags).
    prints_only: bool,
}

/// The subcommands that read and print and never change anything nor wait on a lock, which
/// TFINIT_MAX_RUNS never queues (besides help and version flags, and no subcommand at all).
pub const READ_ONLY: [&str; 6] = ["version", "providers", "output", "show", "validate", "fmt"];

impl Invocation {
    /// Parses terraform's arguments (without `argv[0]`) in the run's environment (`KEY=VALUE`).
    pub fn parse(args: &[String], env: &[String]) -> Invocation {
        let (chdir, args) = take_chdir(args);
        let typed = find_subcommand(&args).map_or(String::new(), |(s, e)| args[s..e].join(" "));
        let merged = merge_env_args(&args, &typed, env);
        let env_unsure = merged.is_none();
        let args = merged.unwrap_or(args);
        let Some((start, end)) = find_subcommand(&args) else {
            return Invocation {
                subcommand: String::new(),
                chdir,
                locks: env_unsure,
                workspace_arg: None,
                prints_only: !env_unsure,
            };
        };
        let subcommand = args[start..end].join(" ");
        let rule = LOCKING
            .iter()
            .find(|(name, _)| *name == subcommand)
            .map(|(_, rule)| *rule);
        let read = Readings {
            global: Reading::before_subcommand(&args[..start]),
            go: Reading::of(&args[end..], Reader::Go),
            urfave: Reading::of(&args[end..], Reader::Urfave),
        };
        let locks = if env_unsure {
            // Words tfinit could not split may complete `state` into `state rm`.
            rule.is_some()
                || NESTED
                    .iter()
                    .any(|n| n.starts_with(&format!("{subcommand} ")))
        } else {
            read.locks(rule)
        };
        let names_workspace = matches!(
            subcommand.as_str(),
            "workspace new"
                | "workspace delete"
                | "workspace select"
                | "env new"
                | "env delete"
                | "env select"
        );
        let exact = !env_unsure && !read.global.unsure && !read.go.unsure;
        let Readings { global, go, .. } = &read;
        let prints_only = !env_unsure
            && !global.unsure
            && (global.help || global.version || go.help || go.version);
        Invocation {
            workspace_arg: read.go.operand.filter(|_| names_workspace && exact),
            subcommand,
            chdir,
            locks,
            prints_only,
        }
    }

    /// Whether this command acquires the state lock (and so needs a lock-owner record). See
    /// [`LOCKING`] for which subcommands do and [`Invocation`] for how the flags are read.
    pub fn takes_lock(&self) -> bool {
        self.locks
    }

    /// Whether the run only reads and prints ([`READ_ONLY`], or help and version): it never waits
    /// for a place under TFINIT_MAX_RUNS and takes none.
    pub fn read_only(&self) -> bool {
        self.prints_only || READ_ONLY.contains(&self.subcommand.as_str())
    }

    /// The NAME of `workspace new|delete|select NAME` (or `env ...`): the workspace whose state
    /// such a run locks. None for other commands, or when the arguments could not be read exactly.
    pub fn workspace_arg(&self) -> Option<&str> {
        self.workspace_arg.as_deref()
    }

    /// The directory terraform works in: cwd, or cwd joined with -chdir.
    pub fn workdir(&self, cwd: &Path) -> PathBuf {
        match &self.chdir {
            Some(d) => cwd.join(d),
            None => cwd.to_path_buf(),
        }
    }
}

/// `dir` with `.` and `..` resolved as text (no file system call: the init compares directories
/// this way in its loop), e.g. `/tf/x/../y/.` is `/tf/y`.
pub fn normal_dir(dir: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in dir.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                // `/..` is `/`; a relative path keeps the `..` it cannot resolve.
                if !out.pop() && !out.has_root() {
                    out.push(c);
                }
            }
            other => out.push(other),
        }
    }
    out
}

/// terraform's extractChdirOption: among the leading arguments that start with `-`, the last
/// `-chdir=DIR` is the directory and is removed (earlier ones stay, and terraform then refuses
/// them as flags before the subcommand). `-chdir` or `-chdir=` alone make terraform exit 1 and
/// are left in place. Only one dash: `--chdir=DIR` is not the option.
fn take_chdir(args: &[String]) -> (Option<String>, Vec<String>) {
    let mut found = None;
    for (i, a) in args.iter().enumerate() {
        if !a.starts_with('-') {
            break;
        }
        if a == "-chdir" || a == "-chdir=" {
            return (None, args.to_vec());
        }
        if let Some(dir) = a.strip_prefix("-chdir=") {
            found = Some((i, dir.to_string()));
        }
    }
    let mut rest = args.to_vec();
    let dir = found.map(|(i, dir)| {
        rest.remove(i);
        dir
    });
    (dir, rest)
}

/// mitchellh/cli's processArgs: the subcommand is the first argument that is neither empty nor a
/// flag, joined with the next when the pair is a two-word command. Returns where its words start
/// and end in `args`; None when `--` or an argument with a space comes first (terraform then
/// prints its help and runs nothing).
fn find_subcommand(args: &[String]) -> Option<(usize, usize)> {
    for (i, a) in args.iter().enumerate() {
        if a == "--" {
            return None;
        }
        if a.is_empty() || a.starts_with('-') {
            continue;
        }
        if a.contains(' ') {
            return None;
        }
        let nested = args
            .get(i + 1)
            .is_some_and(|b| NESTED.iter().any(|n| n.split_once(' ') == Some((a, b))));
        return Some((i, if nested { i + 2 } else { i + 1 }));
    }
    None
}

/// terraform's mergeEnvArgs for `TF_CLI_ARGS`, then `TF_CLI_ARGS_<subcommand>` (spaces and dashes
/// as `_`): each value's words go right after the first argument equal to the subcommand's last
/// word (at the front when there is none), so the command-specific words end up first and the
/// command line's own arguments last. None when a value has characters go-shellwords interprets
/// (quotes, `\`, `$`, parentheses, backquotes, `;&|<>`): tfinit splits only plain words on
/// space, tab, CR and LF, which every go-shellwords version splits the same way.
fn merge_env_args(args: &[String], subcommand: &str, env: &[String]) -> Option<Vec<String>> {
    const SHELL: [char; 12] = ['\\', '\'', '"', '`', '$', '(', ')', ';', '&', '|', '<', '>'];
    let search = subcommand.rsplit(' ').next().unwrap_or_default();
    let mut merged = args.to_vec();
    let specific = format!("TF_CLI_ARGS_{}", subcommand.replace(['-', ' '], "_"));
    for name in ["TF_CLI_ARGS", specific.as_str()] {
        let Some(value) = env_value(env, name) else {
            continue;
        };
        if value.contains(SHELL) {
            return None;
        }
        let words = value
            .split([' ', '\t', '\r', '\n'])
            .filter(|w| !w.is_empty())
            .map(str::to_string);
        let at = merged.iter().position(|a| a == search).map_or(0, |i| i + 1);
        merged.splice(at..at, words);
    }
    Some(merged)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(super) fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    /// Whether terraform with `args` (after `argv[0]`) and environment `env` takes the state lock.
    pub(super) fn locks_with(env: &[&str], args: &[&str]) -> bool {
        Invocation::parse(&s(args), &s(env)).takes_lock()
    }

    pub(super) fn locks(args: &[&str]) -> bool {
        locks_with(&[], args)
    }

    pub(super) fn subcommand(args: &[&str]) -> String {
        Invocation::parse(&s(args), &[]).subcommand
    }

    pub(super) fn chdir(args: &[&str]) -> Option<String> {
        Invocation::parse(&s(args), &[]).chdir
    }

    /// Asserts `locks(case) == want` for every case, naming the case that fails.
    pub(super) fn expect(want: bool, cases: &[&[&str]]) {
        for c in cases {
            assert_eq!(locks(c), want, "{c:?}");
        }
    }

    #[test]
    fn the_subcommand_is_the_first_word_or_a_registered_pair() {
        assert_eq!(subcommand(&["apply", "-auto-approve"]), "apply");
        assert_eq!(subcommand(&["state", "rm", "a.b"]), "state rm");
        assert_eq!(subcommand(&["workspace", "new", "x"]), "workspace new");
        assert_eq!(subcommand(&["env", "new", "x"]), "env new");
        assert_eq!(subcommand(&["state", "remove", "a.b"]), "state remove");
        assert_eq!(subcommand(&["", "plan"]), "plan");
        // A second word that is no registered pair is an operand; a flag ends the words.
        assert_eq!(subcommand(&["state", "rmx", "a.b"]), "state");
        assert_eq!(subcommand(&["state", "-lock=false", "rm"]), "state");
        assert_eq!(subcommand(&["-version"]), "");
        assert_eq!(subcommand(&["--", "apply"]), "");
        assert_eq!(subcommand(&["apply now"]), "");
    }

    #[test]
    fn chdir_is_the_last_single_dash_option_before_the_subcommand() {
        assert_eq!(chdir(&["-chdir=x", "plan"]).as_deref(), Some("x"));
        assert_eq!(
            chdir(&["-chdir=a", "-chdir=b", "plan"]).as_deref(),
            Some("b")
        );
        assert_eq!(chdir(&["plan", "-chdir=x"]), None);
        assert_eq!(chdir(&["--chdir=x", "plan"]), None);
        assert_eq!(chdir(&["-chdir=", "plan"]), None);
        assert_eq!(subcommand(&["-chdir=x", "plan"]), "plan");
    }

    #[test]
    fn init_locks_whatever_its_flags_say() {
        // A remote backend's StateMgr creates a missing workspace state under the lock; with
        // -backend=false init still loads the backend the last init stored.
        expect(
            true,
            &[
                &["init"],
                &["init", "-lock=false"],
                &["init", "-backend=false"],
                &["init", "--backend=0"],
                &["-chdir=x", "init", "-input=false", "-backend=true"],
            ],
        );
    }

    #[test]
    fn workspace_new_locks_even_with_lock_false() {
        expect(
            true,
            &[
                &["workspace", "new", "x"],
                &["workspace", "new", "-lock=false", "x"],
                &["env", "new", "x"],
            ],
        );
    }

    #[test]
    fn workspace_select_locks_only_with_or_create() {
        expect(
            true,
            &[
                &["workspace", "select", "-or-create", "x"],
                &["workspace", "select", "-or-create=true", "x"],
                &["env", "select", "-or-create", "x"],
                // Go ignores it there; OpenTofu 1.13 reads it.
                &["workspace", "select", "x", "-or-create"],
            ],
        );
        expect(
            false,
            &[
                &["workspace", "select", "x"],
                &["workspace", "select", "-or-create=false", "x"],
                &["workspace", "select", "-or-create", "-or-create=f", "x"],
            ],
        );
    }

    #[test]
    fn workspace_delete_and_the_state_commands_honour_lock_false() {
        expect(
            true,
            &[
                &["workspace", "delete", "x"],
                &["env", "delete", "-force", "x"],
                &["state", "rm", "a.b"],
                &["state", "push", "-force", "s.tfstate"],
                &["state", "replace-provider", "-auto-approve", "a", "b"],
                &["untaint", "-allow-missing", "a.b"],
            ],
        );
        expect(
            false,
            &[
                &["workspace", "delete", "-lock=false", "x"],
                &["state", "mv", "-dry-run", "-lock=false", "a", "b"],
                &["taint", "-lock=false", "a.b"],
            ],
        );
    }

    #[test]
    fn opentofu_aliases_lock_like_the_commands_they_name() {
        expect(
            true,
            &[&["state", "move", "a", "b"], &["state", "remove", "a"]],
        );
        expect(
            false,
            &[&["state", "remove", "-lock=false", "a"], &["state", "ls"]],
        );
    }

    #[test]
    fn operations_lock_in_every_mode() {
        expect(
            true,
            &[
                &["apply", "-auto-approve"],
                &["apply", "plan.tfplan"],
                &["apply", "-refresh-only", "-auto-approve"],
                &["destroy", "-auto-approve"],
                &["plan", "-refresh=false"],
                &["plan", "-destroy", "-out=p"],
                &["refresh"],
                &["import", "a.b", "id"],
                &["console"],
                &["console", "-var", "x=1"],
            ],
        );
    }

    #[test]
    fn read_only_commands_never_lock() {
        expect(
            false,
            &[
                &[],
                &["output", "-json"],
                &["show"],
                &["show", "plan.tfplan"],
                &["graph"],
                &["validate"],
                &["version"],
                &["get"],
                &["fmt", "-check"],
                &["test"],
                &["login"],
                &["providers"],
                &["providers", "lock"],
                &["providers", "schema", "-json"],
                &["metadata", "functions", "-json"],
                &["state", "list"],
                &["state", "show", "a.b"],
                &["state", "pull"],
                &["state"],
                &["state", "-lock=false", "rm", "a.b"],
                &["workspace", "list"],
                &["workspace", "show"],
                &["force-unlock", "-force", "id"],
                &["typo", "-lock=true"],
            ],
        );
    }

    #[test]
    fn directories_are_compared_with_dot_and_dot_dot_resolved_as_text() {
        for (given, normal) in [
            ("/tf/x/../y/.", "/tf/y"),
            ("/tf//x/", "/tf/x"),
            ("/..", "/"),
            ("/tf/x/sub/..", "/tf/x"),
            ("rel/../..", ".."),
        ] {
            assert_eq!(normal_dir(Path::new(given)), Path::new(normal), "{given}");
        }
    }

    #[test]
    fn read_only_runs_are_the_printing_subcommands_and_help_and_version() {
        let read_only = |args: &[&str], env: &[&str]| {
            let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            let env: Vec<String> = env.iter().map(|a| a.to_string()).collect();
            Invocation::parse(&args, &env).read_only()
        };
        for args in [
            &[][..],
            &["version"],
            &["-version"],
            &["-chdir=x", "output", "-json"],
            &["show", "-json"],
            &["validate"],
            &["fmt", "-check"],
            &["providers"],
            &["apply", "-help"],
            &["plan", "-version"],
        ] {
            assert!(read_only(args, &[]), "{args:?}");
        }
        for args in [
            &["apply", "-auto-approve"][..],
            &["plan"],
            &["init"],
            &["providers", "lock"],
            &["state", "rm", "a.b"],
            &["apply", "--", "-help"],
        ] {
            assert!(!read_only(args, &[]), "{args:?}");
        }
        assert!(
            !read_only(&["-version"], &["TF_CLI_ARGS=\"x\""]),
            "an environment tfinit cannot read may change what runs"
        );
    }

    #[test]
    fn help_and_version_flags_run_nothing() {
        expect(
            false,
            &[
                &["apply", "-h"],
                &["apply", "-auto-approve", "-help"],
                &["plan", "--help"],
                &["init", "-h"],
                &["-help", "apply"],
                &["apply", "-version"],
                &["-v", "apply"],
                &["workspace", "new", "--version"],
            ],
        );
        // After `--`, or as a flag's value, they are arguments like any other.
        expect(true, &[&["apply", "--", "-h"], &["apply", "-target", "-h"]]);
    }

    #[test]
    fn tf_cli_args_go_after_the_subcommand_and_before_the_command_line() {
        assert!(!locks_with(&["TF_CLI_ARGS=-lock=false"], &["apply"]));
        assert!(!locks_with(
            &["TF_CLI_ARGS_state_rm=-lock=false"],
            &["state", "rm", "a"]
        ));
        assert!(!locks_with(
            &["TF_CLI_ARGS_workspace_delete=-force  -lock=false\t"],
            &["workspace", "delete", "x"]
        ));
        // The command line's own flags come last and win; another command's variable is ignored.
        assert!(locks_with(
            &["TF_CLI_ARGS_apply=-lock=false"],
            &["apply", "-lock=true"]
        ));
        assert!(locks_with(&["TF_CLI_ARGS_plan=-lock=false"], &["apply"]));
        // An operand from the environment ends the flags before the command line's -lock=false.
        assert!(locks_with(
            &["TF_CLI_ARGS_apply=p.tfplan"],
            &["apply", "-lock=false"]
        ));
        // go-shellwords would unquote this; tfinit does not guess how.
        assert!(locks_with(
            &["TF_CLI_ARGS=-var 'a=b c'"],
            &["apply", "-lock=false"]
        ));
        assert!(locks_with(&["TF_CLI_ARGS=\"-lock=false\""], &["apply"]));
        // Unsplit words might also turn `state` into `state rm`; they change no read-only command.
        assert!(locks_with(&["TF_CLI_ARGS_state=\"rm\""], &["state", "a.b"]));
        assert!(!locks_with(&["TF_CLI_ARGS='-no-color'"], &["output"]));
        // The first of duplicate variables counts, as for Go's os.Getenv; empty means unset.
        assert!(locks_with(
            &["TF_CLI_ARGS=-lock=true", "TF_CLI_ARGS=-lock=false"],
            &["apply"]
        ));
        assert!(locks_with(&["TF_CLI_ARGS="], &["apply"]));
        // The environment can run version instead.
        assert!(!locks_with(&["TF_CLI_ARGS=-version"], &["apply"]));
    }

    #[test]
    fn workspace_commands_name_the_workspace_they_lock() {
        let arg = |args: &[&str]| {
            Invocation::parse(&s(args), &[])
                .workspace_arg()
                .map(str::to_string)
        };
        assert_eq!(arg(&["workspace", "new", "x"]).as_deref(), Some("x"));
        assert_eq!(
            arg(&["workspace", "new", "-state", "old.tfstate", "x"]).as_deref(),
            Some("x")
        );
        assert_eq!(
            arg(&["env", "select", "-or-create", "--", "x"]).as_deref(),
            Some("x")
        );
        assert_eq!(arg(&["workspace", "delete", "-force"]), None);
        assert_eq!(arg(&["workspace", "new", "-unknown", "x"]), None);
        assert_eq!(arg(&["apply", "x"]), None);
    }
}

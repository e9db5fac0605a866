//! How terraform (Go's flag package) and OpenTofu 1.13 (urfave/cli) read a subcommand's
//! arguments: the last `-lock`, `-or-create`, help and version flags, and where reading stops.

use super::LockRule;

/// Flags of the locking subcommands that take no value (Go `BoolVar`: `-name` or `-name=BOOL`,
/// never `-name BOOL`), over terraform 1.0 to 1.17-dev and OpenTofu 1.6 to 1.13-dev. No flag is a
/// bool in one of them and takes a value in another.
const BOOL_FLAGS: &[&str] = &[
    "allow-deferral",
    "allow-missing",
    "allow-missing-config",
    "auto-approve",
    "backend",
    "cloud",
    "compact-warnings",
    "concise",
    "consolidate-errors",
    "consolidate-warnings",
    "create-default-workspace",
    "destroy",
    "detailed-exitcode",
    "dry-run",
    "enable-pluggable-state-storage-experiment",
    "force",
    "force-copy",
    "get",
    "ignore-remote-version",
    "input",
    "json",
    "lock",
    "migrate-state",
    "minimal-refresh",
    "no-color",
    "or-create",
    "plan",
    "reconfigure",
    "refresh",
    "refresh-only",
    "show-sensitive",
    "suppress-forget-errors",
    "upgrade",
];

/// Flags of the locking subcommands that take a value (`-name=V` or `-name V`), same versions.
const VALUE_FLAGS: &[&str] = &[
    "backend-config",
    "backup",
    "backup-out",
    "config",
    "deprecation",
    "exclude",
    "exclude-file",
    "from-module",
    "generate-config-out",
    "invoke",
    "json-into",
    "lock-timeout",
    "lockfile",
    "out",
    "parallelism",
    "plugin-dir",
    "policies",
    "replace",
    "scope",
    "state",
    "state-out",
    "state-provider-lock-file",
    "target",
    "target-file",
    "test-directory",
    "var",
    "var-file",
];

/// The two ways a subcommand's arguments are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reader {
    /// Go's flag package (terraform; OpenTofu up to 1.12, and 1.13 with
    /// TOFU_EXPERIMENTAL_CLI_ENABLED=false): flags end at the first operand, at `-`, or after `--`.
    Go,
    /// urfave/cli v3, OpenTofu 1.13's default (unreleased): flags are also read after operands, up
    /// to `--` or `-`. Read too so that a `-lock=true` there is not missed.
    Urfave,
}

/// What one reader found in a command line's arguments.
#[derive(Debug, Default)]
pub(super) struct Reading {
    /// The last `-lock` value read.
    pub(super) lock: Option<bool>,
    /// The last `-or-create` value read.
    pub(super) or_create: Option<bool>,
    /// `-h`, `-help` or `--help` read as a flag: help is printed and nothing runs.
    pub(super) help: bool,
    /// `-v`, `-version` or `--version` read as a flag: terraform runs `version` instead.
    pub(super) version: bool,
    /// Where Go's flag package stopped: the first operand ([`Reader::Go`] only).
    pub(super) operand: Option<String>,
    /// Reading stopped at something it cannot follow exactly.
    pub(super) unsure: bool,
}

impl Reading {
    /// Reads a subcommand's arguments as `reader` does. Stops at help or version (nothing runs)
    /// and at anything it cannot follow (then `unsure`).
    pub(super) fn of(args: &[String], reader: Reader) -> Reading {
        let mut r = Reading::default();
        let mut rest = args.iter();
        while let Some(a) = rest.next() {
            // Meta.process and arguments.ParseView remove these wherever they are, before the flag
            // set reads anything.
            if is_view_word(a) {
                continue;
            }
            if a == "--" {
                if reader == Reader::Go {
                    r.operand = rest.find(|a| !is_view_word(a)).cloned();
                }
                break;
            }
            if reader == Reader::Urfave && a.trim() != a && a.trim().starts_with('-') {
                // urfave trims an argument before looking at it; Go does not.
                r.unsure = true;
                break;
            }
            if a == "-" || !a.starts_with('-') {
                match reader {
                    Reader::Go => {
                        r.operand = Some(a.clone());
                        break;
                    }
                    Reader::Urfave if a == "-" => break,
                    Reader::Urfave => continue,
                }
            }
            if matches!(a.as_str(), "-h" | "-help" | "--help") {
                r.help = true;
                break;
            }
            if matches!(a.as_str(), "-v" | "-version" | "--version") {
                r.version = true;
                break;
            }
            let body = a.strip_prefix("--").unwrap_or(&a[1..]);
            if body.is_empty() || body.starts_with(['-', '=']) {
                // Go: "bad flag syntax", the command exits 1.
                r.unsure = true;
                break;
            }
            if reader == Reader::Urfave
                && !a.starts_with("--")
                && !body.starts_with(char::is_alphabetic)
            {
                // urfave takes `-1...` and what follows as operands.
                break;
            }
            let (name, value) = match body.split_once('=') {
                Some((name, value)) => (name, Some(value)),
                None => (body, None),
            };
            if BOOL_FLAGS.contains(&name) {
                // Go's ParseBool; it rejects `-lock=` and `-lock=yes`, and the command exits 1.
                let Some(on) = value.map_or(Some(true), go_bool) else {
                    r.unsure = true;
                    break;
                };
                match name {
                    "lock" => r.lock = Some(on),
                    "or-create" => r.or_create = Some(on),
                    _ => {}
                }
            } else if VALUE_FLAGS.contains(&name) || value.is_some() {
                // A view word as the value: Go gets the word after it (the view word is gone by
                // then), urfave gets the view word itself.
                if value.is_none() && rest.next().is_none_or(|v| is_view_word(v)) {
                    r.unsure = true;
                    break;
                }
            } else {
                // Unknown, without `=`: whether it takes the next argument is unknown.
                r.unsure = true;
                break;
            }
        }
        r
    }

    /// Reads the arguments before the subcommand. terraform refuses every flag there ("Invalid
    /// flags before the subcommand") but help, version and the `-chdir=DIR` it already took.
    pub(super) fn before_subcommand(args: &[String]) -> Reading {
        let mut r = Reading::default();
        for a in args {
            match a.as_str() {
                "" => {}
                "-h" | "-help" | "--help" => r.help = true,
                "-v" | "-version" | "--version" => r.version = true,
                _ if a.starts_with("-chdir=") && a.len() > "-chdir=".len() => {}
                _ => {
                    r.unsure = true;
                    break;
                }
            }
        }
        r
    }
}

/// The readings of one command line: the arguments before the subcommand, and the subcommand's
/// own as each [`Reader`] reads them.
pub(super) struct Readings {
    pub(super) global: Reading,
    pub(super) go: Reading,
    pub(super) urfave: Reading,
}

impl Readings {
    /// Whether a subcommand with `rule` (None: one that never locks) takes the lock: unless
    /// nothing runs, when terraform (Go's flag package) or OpenTofu 1.13 (urfave/cli) would lock,
    /// or when tfinit could not follow the command line.
    pub(super) fn locks(&self, rule: Option<LockRule>) -> bool {
        let Readings { global, go, urfave } = self;
        if global.unsure {
            return rule.is_some();
        }
        if global.help || global.version || urfave.help || urfave.version {
            // Help is printed, or `version` runs instead: nothing touches the state.
            return false;
        }
        let unsure = go.unsure || urfave.unsure;
        match rule {
            None => false,
            Some(LockRule::Always) => true,
            Some(LockRule::UnlessLockFalse) => {
                unsure || go.lock != Some(false) || urfave.lock != Some(false)
            }
            Some(LockRule::WithOrCreate) => {
                unsure || go.or_create == Some(true) || urfave.or_create == Some(true)
            }
        }
    }
}

/// Arguments terraform and OpenTofu remove from a subcommand's arguments before its flags are
/// read (Meta.process: `-no-color`; arguments.ParseView: the others).
fn is_view_word(a: &str) -> bool {
    matches!(
        a,
        "-no-color"
            | "-compact-warnings"
            | "-concise"
            | "-consolidate-warnings"
            | "-consolidate-warnings=true"
            | "-consolidate-warnings=false"
            | "-consolidate-errors"
            | "-consolidate-errors=true"
            | "-consolidate-errors=false"
    ) || a.starts_with("-deprecation=module:")
}

/// Go's strconv.ParseBool, which reads `-name=VALUE` of a bool flag.
fn go_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{expect, locks};

    #[test]
    fn the_last_lock_flag_wins() {
        expect(
            true,
            &[
                &["plan", "-lock=false", "-lock=true"],
                &["apply", "-lock=false", "-lock"],
            ],
        );
        expect(
            false,
            &[
                &["plan", "-lock=true", "-lock=false"],
                &["apply", "-lock", "-lock=0"],
            ],
        );
    }

    #[test]
    fn every_spelling_go_reads_as_false_turns_locking_off() {
        for v in ["0", "f", "F", "false", "FALSE", "False"] {
            for dashes in ["-", "--"] {
                let flag = format!("{dashes}lock={v}");
                assert!(!locks(&["apply", &flag]), "{flag}");
            }
        }
        for v in ["1", "t", "T", "true", "TRUE", "True"] {
            assert!(locks(&["apply", &format!("-lock={v}")]), "{v}");
        }
        expect(true, &[&["apply", "-lock"], &["apply", "--lock"]]);
    }

    #[test]
    fn a_bool_flag_never_takes_the_next_argument() {
        // `-lock false` is -lock=true followed by the operand "false" (a plan file name).
        expect(
            true,
            &[&["apply", "-lock", "false"], &["plan", "-lock", "0"]],
        );
    }

    #[test]
    fn flags_end_at_the_first_operand_or_after_a_double_dash() {
        expect(
            true,
            &[
                &["apply", "plan.tfplan", "-lock=false"],
                &["state", "rm", "a.b", "-lock=false"],
                &["taint", "a.b", "-lock=false"],
                &["apply", "--", "-lock=false"],
                &["apply", "-", "-lock=false"],
            ],
        );
        expect(false, &[&["apply", "-lock=false", "plan.tfplan"]]);
    }

    #[test]
    fn a_lock_turned_on_after_an_operand_counts() {
        // OpenTofu 1.13's urfave/cli reads flags after operands too.
        expect(
            true,
            &[&["apply", "-lock=false", "plan.tfplan", "-lock=true"]],
        );
        expect(
            false,
            &[&["apply", "-lock=false", "plan.tfplan", "-lock=false"]],
        );
    }

    #[test]
    fn a_value_flag_takes_the_next_argument_even_a_lock_flag() {
        expect(
            true,
            &[
                &["apply", "-target", "-lock=false"],
                &["plan", "-var-file", "-lock=false"],
                &["state", "mv", "-state-out", "-lock=false", "a", "b"],
            ],
        );
        expect(
            false,
            &[
                &["plan", "-var", "x=1", "-lock=false"],
                &["plan", "-lock-timeout", "5s", "-lock=false", "-out", "p"],
                &["import", "-config", "dir", "-lock=false", "a.b", "id"],
            ],
        );
    }

    #[test]
    fn view_words_are_removed_before_flags_are_read() {
        expect(
            false,
            &[
                &["plan", "-no-color", "-lock=false"],
                &["apply", "-lock=false", "-no-color", "-compact-warnings"],
                &[
                    "plan",
                    "-concise",
                    "-deprecation=module:none",
                    "-lock=false",
                ],
            ],
        );
        // Go gives -out the word after -no-color (which is gone by then); urfave gives it
        // -no-color: not knowing which, it locks.
        expect(true, &[&["plan", "-out", "-no-color", "-lock=false"]]);
    }

    #[test]
    fn flags_tfinit_cannot_follow_count_as_locking() {
        expect(
            true,
            &[
                // Unknown, no `=`: it may take -lock=false as its value.
                &["apply", "-some-new-flag", "-lock=false"],
                // Values Go's ParseBool rejects, bad syntax, a missing value.
                &["apply", "-lock=yes"],
                &["apply", "-lock="],
                &["apply", "---lock=false"],
                &["apply", "-lock=false", "-lock-timeout"],
            ],
        );
        // With `=` an unknown flag takes nothing else.
        expect(false, &[&["apply", "-some-new-flag=1", "-lock=false"]]);
    }
}

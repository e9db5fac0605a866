//! Bad configuration stops tfinit before anything starts: exit code 2 and one line naming the
//! variable (or the flag that gave the value), the value, and a good example. An empty value (or a
//! blank one) counts as unset, from a variable or a flag (README: manifests and Helm charts often
//! render `value: ""`). Every setting's range (README, "Configuration") is checked at both ends:
//! the value just past a bound is refused, the value on it accepted.

mod common;

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::process::Command;
use std::time::Duration;

use common::launch::{As, Config, Launch};
use common::{tfinit, TempDir};

/// One setting: its variable, its flag, the example its messages give, and values it refuses.
struct Setting {
    var: &'static str,
    flag: &'static str,
    example: &'static str,
    /// Garbage, negative and huge values (`HUGE` is replaced by a 10,000-character one).
    bad: &'static [&'static str],
    /// A value that works, for the flag-wins-over-variable checks.
    good: &'static str,
}

const HUGE: &str = "<huge>";

const DURATION_BAD: &[&str] = &[
    "soon",
    "-5s",
    "-1",
    "1.5s",
    "30 s",
    "10x",
    "9999h",
    "99999999999999999999999999",
    HUGE,
];

const SETTINGS: &[Setting] = &[
    Setting {
        var: "TFINIT_GRACE_PERIOD",
        flag: "--grace-period",
        example: "30s",
        bad: DURATION_BAD,
        good: "40s",
    },
    Setting {
        var: "TFINIT_STOP_TIMEOUT",
        flag: "--stop-timeout",
        example: "10s",
        bad: DURATION_BAD,
        good: "5s",
    },
    Setting {
        var: "TFINIT_KILL_MARGIN",
        flag: "--kill-margin",
        example: "2s",
        // Plus the two under its least value (1s).
        bad: &[
            "soon",
            "-5s",
            "-1",
            "1.5s",
            "30 s",
            "10x",
            "9999h",
            "99999999999999999999999999",
            "0",
            "999ms",
            HUGE,
        ],
        good: "1s",
    },
    Setting {
        var: "TFINIT_OWNER_TTL",
        flag: "--owner-ttl",
        example: "30s",
        // Plus one that parses but is too short for TTL/3 heartbeats.
        bad: &[
            "soon",
            "-5s",
            "-1",
            "1.5s",
            "9999h",
            "99999999999999999999999999",
            "500ms",
            "0",
            HUGE,
        ],
        good: "20s",
    },
    Setting {
        var: "TFINIT_RECORD_TIMEOUT",
        flag: "--record-timeout",
        example: "30s",
        // Plus the two under its least value (1s): runs would start before their record.
        bad: &[
            "soon",
            "-5s",
            "-1",
            "1.5s",
            "30 s",
            "10x",
            "9999h",
            "99999999999999999999999999",
            "0",
            "999ms",
            HUGE,
        ],
        good: "10s",
    },
    Setting {
        var: "TFINIT_FORWARD",
        flag: "--forward",
        example: "group",
        bad: &["everyone", "-1", "Group child", HUGE],
        good: "child",
    },
    Setting {
        var: "TFINIT_REWRITE",
        flag: "--rewrite",
        example: "TERM:INT,USR1:HUP",
        bad: &[
            "TERM",
            "TERM:NOPE",
            "NOPE:TERM",
            "-1:2",
            "TERM:65",
            "TERM:INT,TERM:HUP",
            "CHLD:TERM",
            "SEGV:TERM",
            "PIPE:HUP",
            "KILL:TERM",
            HUGE,
        ],
        good: "USR1:HUP",
    },
    Setting {
        var: "TFINIT_LOG",
        flag: "--log",
        example: "info",
        bad: &["loud", "-1", "9", HUGE],
        good: "warn",
    },
    Setting {
        var: "TFINIT_LOG_FORMAT",
        flag: "--log-format",
        example: "json",
        bad: &["xml", "-1", HUGE],
        good: "text",
    },
    Setting {
        var: "TFINIT_RUN_DIR",
        flag: "--run-dir",
        example: "/tmp/tfinit",
        // The last one is absolute but too long for a Unix socket's address.
        bad: &["relative/dir", "-1", "/<long>"],
        good: "<tmp>/run2",
    },
    Setting {
        var: "TFINIT_STATE_DIR",
        flag: "--state-dir",
        example: "/var/lib/tfinit",
        bad: &["relative/dir", "-1", "."],
        good: "<tmp>/state2",
    },
    Setting {
        var: "TFINIT_OWNER",
        flag: "--owner",
        example: "provider-terraform-7d9f-abcde",
        bad: &["a/b", "../x", ".hidden", "has space", HUGE],
        good: "pod-0",
    },
    Setting {
        var: "TFINIT_FORCE_UNLOCK",
        flag: "--force-unlock",
        example: "auto",
        bad: &["yes", "-1", HUGE],
        good: "off",
    },
    Setting {
        var: "TFINIT_METRICS_ADDR",
        flag: "--metrics-addr",
        example: ":9102",
        bad: &[
            "9102",
            ":http",
            "127.0.0.1:99999",
            "no-such-host.invalid:9102",
            ":+80",
            ":080",
            ":65536",
            "::1:9102",
            "10.1:9102",
            HUGE,
        ],
        good: "127.0.0.1:0",
    },
    Setting {
        var: "TFINIT_MAX_RUNS",
        flag: "--max-runs",
        example: "4",
        // 0 would let no run ever start: unset is "no limit".
        bad: &[
            "0",
            "00",
            "two",
            "-1",
            "1.5",
            "99999999999999999999999999",
            HUGE,
        ],
        good: "3",
    },
];

/// A finished `tfinit ... -- touch MARKER`: its code, its stderr, whether the command ran.
struct Outcome {
    code: Option<i32>,
    stderr: String,
    started: bool,
}

fn expand(v: &str, tmp: &TempDir) -> String {
    match v {
        HUGE => "x".repeat(10_000),
        "/<long>" => format!("/{}", "d".repeat(200)),
        v => v.replace("<tmp>", &tmp.0.display().to_string()),
    }
}

/// Runs `tfinit ARGS -- touch MARKER` with `env` (after clearing every TFINIT_* variable and
/// pointing the run and state directories into a temp dir).
fn run(env: &[(&str, &OsStr)], args: &[&str]) -> Outcome {
    let tmp = TempDir::new("config");
    let marker = tmp.join("started");
    let config = Config::dirs(&tmp.join("run"), &tmp.join("state"))
        .set("TFINIT_OWNER", "config-test")
        .with(env);
    let mut l = Launch::new(
        As::Subreaper,
        config,
        &[OsStr::new("touch"), marker.as_os_str()],
    );
    l.args = args
        .iter()
        .map(OsString::from)
        .chain(l.args.iter().cloned())
        .collect();
    let mut c = l.command();
    let out = common::run_output(&mut c, Duration::from_secs(30));
    Outcome {
        code: out.status.code(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        started: marker.exists(),
    }
}

fn run_env(var: &str, value: &str) -> Outcome {
    run(&[(var, OsStr::new(value))], &[])
}

/// Asserts exit 2, nothing started, one line naming `name` with `value` and an example.
fn assert_refused(o: &Outcome, name: &str, value: &str, what: &str) {
    assert_eq!(o.code, Some(2), "{what}: {}", o.stderr);
    assert!(!o.started, "{what}: the command ran anyway");
    let line = o.stderr.trim_end();
    assert_eq!(line.lines().count(), 1, "{what}: not one line: {line}");
    assert!(line.starts_with("tfinit: invalid "), "{what}: {line}");
    assert!(
        line.contains(&format!("{name}={value:?}")),
        "{what}: names {name}={value:?}? {line}"
    );
    assert!(
        line.contains(&format!("for example {name}=")),
        "{what}: no example: {line}"
    );
}

#[test]
fn every_bad_variable_value_stops_tfinit_with_exit_2_and_one_line_naming_it() {
    for s in SETTINGS {
        for raw in s.bad {
            let tmp = TempDir::new("value");
            let v = expand(raw, &tmp);
            let o = run_env(s.var, &v);
            assert_refused(&o, s.var, &v, &format!("{}={raw}", s.var));
            assert!(
                o.stderr
                    .contains(&format!("for example {}={}", s.var, s.example)),
                "{}",
                o.stderr
            );
        }
    }
}

#[test]
fn a_cap_of_zero_runs_is_refused_saying_why_and_what_to_do() {
    let o = run_env("TFINIT_MAX_RUNS", "0");
    assert_refused(&o, "TFINIT_MAX_RUNS", "0", "TFINIT_MAX_RUNS=0");
    assert!(
        o.stderr.contains("must be at least 1") && o.stderr.contains("leave it unset for no limit"),
        "{}",
        o.stderr
    );
}

#[test]
fn a_bad_flag_value_is_named_by_the_flag_not_the_variable() {
    for s in SETTINGS {
        let tmp = TempDir::new("flag");
        let raw = s.bad[0];
        let v = expand(raw, &tmp);
        let o = run(&[], &[&format!("{}={v}", s.flag)]);
        assert_refused(&o, s.flag, &v, &format!("{}={raw}", s.flag));
        assert!(
            !o.stderr.contains(s.var),
            "{}: names the variable: {}",
            s.flag,
            o.stderr
        );
    }
}

#[test]
fn a_flag_wins_over_its_variable() {
    for s in SETTINGS {
        let tmp = TempDir::new("wins");
        // A bad variable does not matter when the flag gives a good value...
        let bad = expand(s.bad[0], &tmp);
        let good = expand(s.good, &tmp);
        let o = run(
            &[(s.var, OsStr::new(&bad))],
            &[&format!("{}={good}", s.flag)],
        );
        assert_eq!(o.code, Some(0), "{}: {}", s.flag, o.stderr);
        assert!(o.started, "{}", s.flag);
        // ...and a bad flag is refused even when the variable is good, naming the flag.
        let o = run(
            &[(s.var, OsStr::new(&good))],
            &[&format!("{}={bad}", s.flag)],
        );
        assert_refused(&o, s.flag, &bad, s.flag);
    }
}

#[test]
fn an_empty_or_blank_value_counts_as_unset() {
    for s in SETTINGS {
        // Paths too: a directory of spaces is no directory anyone means.
        for v in ["", "   "] {
            let o = run_env(s.var, v);
            assert_eq!(o.code, Some(0), "{}={v:?}: {}", s.var, o.stderr);
            assert!(o.started, "{}={v:?}", s.var);
        }
        let o = run(&[], &[&format!("{}=", s.flag)]);
        assert_eq!(o.code, Some(0), "{}=: {}", s.flag, o.stderr);
    }
}

#[test]
fn a_value_that_is_not_utf8_is_refused_naming_the_variable() {
    for s in SETTINGS.iter().filter(|s| !s.var.ends_with("_DIR")) {
        let v = OsString::from(OsStr::from_bytes(b"\xff\xfe"));
        let o = run(&[(s.var, &v)], &[]);
        assert_eq!(o.code, Some(2), "{}: {}", s.var, o.stderr);
        assert!(!o.started);
        assert_eq!(o.stderr.trim_end().lines().count(), 1, "{}", o.stderr);
        assert!(
            o.stderr.contains(&format!("invalid {}=", s.var)),
            "{}",
            o.stderr
        );
    }
}

#[test]
fn an_owner_name_too_long_for_its_file_names_is_refused_with_its_length_and_the_maximum() {
    // 109 bytes: src/locks/names.rs MAX_OWNER_LEN (a record's temporary file name is the owner
    // plus 146 bytes at most, and a file name has at most 255).
    let longest = "p".repeat(109);
    let o = run_env("TFINIT_OWNER", &longest);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(o.started, "the longest owner name did not start");
    let too_long = format!("{longest}p");
    for (name, o) in [
        ("TFINIT_OWNER", run_env("TFINIT_OWNER", &too_long)),
        ("--owner", run(&[], &[&format!("--owner={too_long}")])),
    ] {
        assert_refused(&o, name, &too_long, "an owner name of 110 bytes");
        assert!(
            o.stderr.contains("is 110 bytes long") && o.stderr.contains("at most 109"),
            "{}",
            o.stderr
        );
        assert!(
            o.stderr
                .contains(&format!("for example {name}=provider-terraform-7d9f-abcde")),
            "{}",
            o.stderr
        );
    }
}

fn assert_budget(o: &Outcome, names: [&str; 3], values: [&str; 3]) {
    assert_eq!(o.code, Some(2), "{}", o.stderr);
    assert!(!o.started);
    let line = o.stderr.trim_end();
    assert_eq!(line.lines().count(), 1, "{line}");
    for (n, v) in names.iter().zip(values) {
        assert!(
            line.contains(&format!("{n} ({v}")),
            "{n} ({v}) missing: {line}"
        );
    }
    assert!(line.contains("for example "), "{line}");
}

#[test]
fn stop_timeout_plus_kill_margin_not_below_the_grace_period_names_all_three() {
    let names = [
        "TFINIT_STOP_TIMEOUT",
        "TFINIT_KILL_MARGIN",
        "TFINIT_GRACE_PERIOD",
    ];
    // Only the grace period given: the defaults (10s + 2s) no longer fit; the grace period is blamed.
    let o = run_env("TFINIT_GRACE_PERIOD", "5s");
    assert_budget(&o, names, ["10s", "2s", "5s"]);
    assert!(
        o.stderr.contains("invalid TFINIT_GRACE_PERIOD=\"5s\""),
        "{}",
        o.stderr
    );
    // Equal is not smaller.
    let o = run(
        &[
            ("TFINIT_GRACE_PERIOD", OsStr::new("5s")),
            ("TFINIT_STOP_TIMEOUT", OsStr::new("3s")),
            ("TFINIT_KILL_MARGIN", OsStr::new("2s")),
        ],
        &[],
    );
    assert_budget(&o, names, ["3s", "2s", "5s"]);
    // Only the stop timeout given: it is blamed, and the example fits the default 30s budget.
    let o = run_env("TFINIT_STOP_TIMEOUT", "29s");
    assert_budget(&o, names, ["29s", "2s", "30s"]);
    assert!(
        o.stderr.contains("invalid TFINIT_STOP_TIMEOUT=\"29s\""),
        "{}",
        o.stderr
    );
    // Just fitting is fine: the sum 1 ms under the grace period, the stop timeout 1 s over the
    // margin.
    let o = run(
        &[
            ("TFINIT_GRACE_PERIOD", OsStr::new("5001ms")),
            ("TFINIT_STOP_TIMEOUT", OsStr::new("3s")),
            ("TFINIT_KILL_MARGIN", OsStr::new("2s")),
        ],
        &[],
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
}

#[test]
fn the_budget_message_names_flags_when_flags_gave_the_values() {
    let o = run(
        &[],
        &["--grace-period=5s", "--stop-timeout=3s", "--kill-margin=2s"],
    );
    assert_budget(
        &o,
        ["--stop-timeout", "--kill-margin", "--grace-period"],
        ["3s", "2s", "5s"],
    );
    assert!(!o.stderr.contains("TFINIT_"), "{}", o.stderr);
    // Mixed: each named where it came from.
    let o = run(
        &[("TFINIT_GRACE_PERIOD", OsStr::new("5s"))],
        &["--stop-timeout=4s"],
    );
    assert_budget(
        &o,
        [
            "--stop-timeout",
            "TFINIT_KILL_MARGIN",
            "TFINIT_GRACE_PERIOD",
        ],
        ["4s", "2s", "5s"],
    );
}

#[test]
fn the_example_in_a_budget_message_is_itself_a_good_value() {
    for (var, value) in [
        ("TFINIT_GRACE_PERIOD", "5s"),
        ("TFINIT_STOP_TIMEOUT", "29s"),
        ("TFINIT_KILL_MARGIN", "25s"),
    ] {
        let o = run_env(var, value);
        assert_eq!(o.code, Some(2), "{}", o.stderr);
        let example = o
            .stderr
            .trim_end()
            .rsplit_once(&format!("for example {var}="))
            .map(|(_, e)| e.to_string())
            .unwrap_or_else(|| panic!("no example for {var}: {}", o.stderr));
        let o = run_env(var, &example);
        assert_eq!(
            o.code,
            Some(0),
            "{var}={example} (the suggested value) refused: {}",
            o.stderr
        );
    }
}

/// One bound of a setting's range: the value just past it (refused, saying `why`) and the value
/// on it (accepted), with the other settings at their defaults.
struct Bound {
    var: &'static str,
    refused: &'static str,
    why: &'static str,
    accepted: &'static str,
}

/// Every documented bound (README, "Configuration"). Durations are at most a year (8760h).
const BOUNDS: &[Bound] = &[
    Bound {
        var: "TFINIT_GRACE_PERIOD",
        // Over TFINIT_STOP_TIMEOUT + TFINIT_KILL_MARGIN (10s + 2s by default).
        refused: "12s",
        why: "must be smaller than TFINIT_GRACE_PERIOD",
        accepted: "12001ms",
    },
    Bound {
        var: "TFINIT_GRACE_PERIOD",
        refused: "8761h",
        why: "longer than a year",
        accepted: "8760h",
    },
    Bound {
        var: "TFINIT_STOP_TIMEOUT",
        // At least TFINIT_KILL_MARGIN (2s by default) + 1s.
        refused: "2999ms",
        why: "must be at least 1s longer than TFINIT_KILL_MARGIN (2s, the default)",
        accepted: "3s",
    },
    Bound {
        var: "TFINIT_STOP_TIMEOUT",
        // Under TFINIT_GRACE_PERIOD - TFINIT_KILL_MARGIN (30s - 2s by default).
        refused: "28s",
        why: "must be smaller than TFINIT_GRACE_PERIOD (30s, the default)",
        accepted: "27999ms",
    },
    Bound {
        var: "TFINIT_KILL_MARGIN",
        refused: "999ms",
        why: "must be at least 1s: after its SIGKILL",
        accepted: "1s",
    },
    Bound {
        var: "TFINIT_KILL_MARGIN",
        // At most TFINIT_STOP_TIMEOUT (10s by default) - 1s.
        refused: "9001ms",
        why: "TFINIT_STOP_TIMEOUT (10s, the default) must be at least 1s longer",
        accepted: "9s",
    },
    Bound {
        var: "TFINIT_RECORD_TIMEOUT",
        refused: "999ms",
        why: "must be at least 1s: a record takes up to eight file operations",
        accepted: "1s",
    },
    Bound {
        var: "TFINIT_RECORD_TIMEOUT",
        refused: "8761h",
        why: "longer than a year",
        accepted: "8760h",
    },
    Bound {
        var: "TFINIT_OWNER_TTL",
        refused: "999ms",
        why: "must be at least 1s (heartbeats are written every TTL/3)",
        accepted: "1s",
    },
    Bound {
        var: "TFINIT_OWNER_TTL",
        refused: "8761h",
        why: "longer than a year",
        accepted: "8760h",
    },
    Bound {
        var: "TFINIT_OLDER_OWNER_TTL",
        refused: "999ms",
        why: "must be at least 1s (the shortest TFINIT_OWNER_TTL tfinit accepts)",
        accepted: "1s",
    },
    Bound {
        var: "TFINIT_OLDER_OWNER_TTL",
        refused: "8761h",
        why: "longer than a year",
        accepted: "8760h",
    },
    Bound {
        var: "TFINIT_MAX_RUNS",
        refused: "0",
        why: "must be at least 1",
        accepted: "1",
    },
    Bound {
        var: "TFINIT_MAX_RUNS",
        refused: "18446744073709551616",
        why: "overflows: a cap is at most 18446744073709551615 runs",
        accepted: "18446744073709551615",
    },
    Bound {
        var: "TFINIT_METRICS_ADDR",
        refused: "127.0.0.1:65536",
        why: "with a port from 0 to 65535",
        accepted: "127.0.0.1:65535",
    },
    Bound {
        var: "TFINIT_RUN_DIR",
        // The control socket's path (the directory + /tfinit.sock) in 107 bytes.
        refused: "<run dir of 96 bytes>",
        why: "must fit in 107 bytes",
        accepted: "<run dir of 95 bytes>",
    },
    Bound {
        var: "TFINIT_STATE_DIR",
        refused: "<state dir of 3832 bytes>",
        why: "too long: 3832 bytes",
        accepted: "<state dir of 3831 bytes>",
    },
    Bound {
        var: "TFINIT_OWNER",
        refused: "<owner of 110 bytes>",
        why: "at most 109",
        accepted: "<owner of 109 bytes>",
    },
];

/// A bound's value: `<NAME of N bytes>` becomes a value of N bytes (a path in `tmp` for
/// directories).
fn bound_value(v: &str, tmp: &TempDir) -> String {
    let Some(rest) = v.strip_prefix('<') else {
        return v.to_string();
    };
    let n: usize = rest
        .split_whitespace()
        .find_map(|w| w.parse().ok())
        .expect("a length");
    if rest.starts_with("owner") {
        return "p".repeat(n);
    }
    let base = tmp.0.display().to_string() + "/";
    assert!(base.len() < n, "the temp dir is too long for {v}");
    let mut path = base;
    // Components of at most 200 bytes, so the directory can be made where it fits.
    while path.len() < n {
        let room = (n - path.len()).min(200);
        let part = if room > 1 && path.len() + room < n {
            "d".repeat(room - 1) + "/"
        } else {
            "d".repeat(room)
        };
        path += &part;
    }
    path
}

#[test]
fn every_range_bound_refuses_the_value_past_it_and_accepts_the_value_on_it() {
    for b in BOUNDS {
        let tmp = TempDir::new("bound");
        let refused = bound_value(b.refused, &tmp);
        let o = run_env(b.var, &refused);
        assert_refused(&o, b.var, &refused, &format!("{}={}", b.var, b.refused));
        assert!(
            o.stderr.contains(b.why),
            "{}={}: {}",
            b.var,
            b.refused,
            o.stderr
        );
        let accepted = bound_value(b.accepted, &tmp);
        let o = run_env(b.var, &accepted);
        assert_eq!(
            o.code,
            Some(0),
            "{}={} (on the bound) refused: {}",
            b.var,
            b.accepted,
            o.stderr
        );
        assert!(o.started, "{}={}", b.var, b.accepted);
    }
}

#[test]
fn an_overflowing_duration_says_it_overflows() {
    for v in [
        "99999999999999999999999999",
        "99999999999999999999999999999999999999999s",
    ] {
        let o = run_env("TFINIT_GRACE_PERIOD", v);
        assert_refused(&o, "TFINIT_GRACE_PERIOD", v, v);
        assert!(
            o.stderr
                .contains(&format!("{v} overflows: a duration is at most a year")),
            "{}",
            o.stderr
        );
        assert!(!o.stderr.contains("needs a unit"), "{}", o.stderr);
    }
}

#[test]
fn a_pod_uid_that_is_not_utf8_is_ignored_with_one_warning_naming_it() {
    let bad = OsString::from(OsStr::from_bytes(b"\xff\xfe-uid"));
    for var in ["TFINIT_POD_UID", "POD_UID"] {
        let o = run(&[(var, &bad)], &[]);
        assert_eq!(o.code, Some(0), "{var}: {}", o.stderr);
        assert!(o.started, "{var}: the command ran");
        let warned: Vec<&str> = o
            .stderr
            .lines()
            .filter(|l| l.contains("not valid UTF-8"))
            .collect();
        assert_eq!(warned.len(), 1, "{var}: one warning: {}", o.stderr);
        assert!(
            warned[0].contains("WARN") && warned[0].contains(&format!("{var}=\"")),
            "{var}: {}",
            warned[0]
        );
    }
    // A good one: no warning.
    let o = run_env("POD_UID", "0e3c3f4c-1d4e-4b8a-9a57-7e4c0c1f0a11");
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(!o.stderr.contains("not valid UTF-8"), "{}", o.stderr);
}

#[test]
fn without_a_command_tfinit_exits_2_and_shows_the_usage() {
    let mut c = Command::new(tfinit());
    common::scrub(&mut c).env("TFINIT_RUN_DIR", "/nonexistent-run-dir");
    let out = common::run_output(&mut c, Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("no command to run") && stderr.contains("tfinit -- "),
        "{stderr}"
    );
}

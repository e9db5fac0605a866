//! Every setting parsed from the environment and the flags, good values and bad.

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
    // Paths too: a blank directory is no directory anyone means.
    let args = InitArgs {
        run_dir: Some(PathBuf::from("   ")),
        state_dir: Some(PathBuf::from(" \t ")),
        ..Default::default()
    };
    let cfg = InitConfig::from_args(&args, None).unwrap();
    assert_eq!(cfg.run_dir, default_run_dir());
    assert_eq!(cfg.state_dir, PathBuf::from(DEFAULT_STATE_DIR));
}

/// The budget `[grace, stop, margin]` as given texts, validated.
fn budget_of(grace: &str, stop: &str, margin: &str) -> Result<InitConfig, String> {
    let text = |v: &str| (!v.is_empty()).then(|| v.to_string());
    let args = InitArgs {
        grace_period: text(grace),
        stop_timeout: text(stop),
        kill_margin: text(margin),
        ..Default::default()
    };
    InitConfig::from_args(&args, None).map_err(|e| e.to_string())
}

#[test]
fn each_bound_of_the_shutdown_budget_refuses_the_value_past_it_and_takes_the_one_on_it() {
    // The kill margin: at least 1s.
    assert!(budget_of("", "", "999ms")
        .unwrap_err()
        .contains("must be at least 1s: after its SIGKILL"));
    assert!(budget_of("", "", "0").is_err());
    assert_eq!(
        budget_of("", "", "1s").unwrap().kill_margin,
        MIN_KILL_MARGIN
    );
    // The stop timeout: at least 1s longer than the kill margin (2s by default).
    let e = budget_of("", "2999ms", "").unwrap_err();
    assert!(
        e.contains("TFINIT_STOP_TIMEOUT (2999ms) must be at least 1s longer than TFINIT_KILL_MARGIN (2s, the default)"),
        "{e}"
    );
    assert!(e.contains("for example TFINIT_STOP_TIMEOUT=3s"), "{e}");
    assert!(budget_of("", "0", "").is_err());
    assert_eq!(
        budget_of("", "3s", "").unwrap().stop_timeout,
        Duration::from_secs(3)
    );
    // The kill margin below the stop timeout by 1s (10s by default).
    let e = budget_of("", "", "9001ms").unwrap_err();
    assert!(e.contains("for example TFINIT_KILL_MARGIN=9s"), "{e}");
    assert!(budget_of("", "", "9s").is_ok());
    // Both inside the grace period (30s by default): smaller, not equal.
    assert!(budget_of("", "28s", "2s").is_err());
    assert!(budget_of("", "27999ms", "2s").is_ok());
    assert!(
        budget_of("3s", "2s", "1s").is_err(),
        "the least grace period is over 3s"
    );
    assert!(budget_of("3001ms", "2s", "1s").is_ok());
    // At most a year, as any duration.
    assert!(budget_of("8761h", "", "").is_err());
    assert!(budget_of("8760h", "", "").is_ok());
}

/// Whichever rule a budget breaks, the example the error gives is one that works, when one
/// exists beside the other two values: tried over a grid of given and default values.
#[test]
fn the_example_of_every_refused_budget_is_accepted_in_its_place() {
    let values = [
        "", "0", "1s", "2s", "3s", "5s", "10s", "12s", "29s", "30s", "40s",
    ];
    let mut refused = 0;
    for grace in values {
        for stop in values {
            for margin in values {
                let Err(e) = budget_of(grace, stop, margin) else {
                    continue;
                };
                refused += 1;
                let (name, example) = e
                    .rsplit_once("; for example ")
                    .and_then(|(_, ex)| ex.split_once('='))
                    .unwrap_or_else(|| panic!("no example: {e}"));
                let mut fixed = [grace, stop, margin];
                let i = [
                    "TFINIT_GRACE_PERIOD",
                    "TFINIT_STOP_TIMEOUT",
                    "TFINIT_KILL_MARGIN",
                ]
                .iter()
                .position(|n| *n == name)
                .unwrap_or_else(|| panic!("names no duration: {e}"));
                fixed[i] = example;
                // A fix that keeps every rule exists when some value of the blamed part
                // does; the example is then one.
                let fixable = values.iter().chain(&[example]).any(|v| {
                    let mut b = [grace, stop, margin];
                    b[i] = v;
                    budget_of(b[0], b[1], b[2]).is_ok()
                });
                let [g, s, m] = fixed;
                let after = budget_of(g, s, m);
                assert!(
                    after.is_ok() || !fixable,
                    "{grace:?} {stop:?} {margin:?}: {e}\n  the example refused: {after:?}"
                );
            }
        }
    }
    assert!(refused > 100, "the grid covers the rules: {refused}");
}

#[test]
fn a_record_timeout_under_a_second_is_refused_since_runs_would_start_without_records() {
    let with = |v: &str| InitArgs {
        record_timeout: Some(v.into()),
        ..Default::default()
    };
    for bad in ["0", "0s", "999ms"] {
        let e = InitConfig::from_args(&with(bad), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("must be at least 1s") && e.contains("starts without it"),
            "{e}"
        );
    }
    let cfg = InitConfig::from_args(&with("1s"), None).unwrap();
    assert_eq!(cfg.record_timeout, MIN_RECORD_TIMEOUT);
}

#[test]
fn a_state_directory_too_long_for_the_paths_made_in_it_is_refused() {
    let with = |len: usize| InitArgs {
        state_dir: Some(PathBuf::from(format!("/{}", "d".repeat(len - 1)))),
        ..Default::default()
    };
    assert_eq!(MAX_STATE_DIR, 3831);
    assert!(InitConfig::from_args(&with(MAX_STATE_DIR), None).is_ok());
    let e = InitConfig::from_args(&with(MAX_STATE_DIR + 1), None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("too long: 3832 bytes") && e.contains("at most 3831"),
        "{e}"
    );
}

#[test]
fn a_cap_of_runs_is_digits_and_one_too_large_for_a_number_is_said_to_overflow() {
    assert_eq!(parse_max_runs(" 4 ").unwrap().get(), 4);
    for bad in ["+4", "-4", "4.0", "0x4"] {
        assert!(
            parse_max_runs(bad).unwrap_err().contains("whole number"),
            "{bad}"
        );
    }
    assert!(parse_max_runs("99999999999999999999999999")
        .unwrap_err()
        .contains("overflows"));
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

#[test]
fn the_store_is_auto_by_default_and_a_bad_one_is_named_with_the_choices() {
    let cfg = InitConfig::from_args(&InitArgs::default(), None).unwrap();
    assert_eq!(cfg.store, StoreSetting::Auto);
    for (v, want) in [
        ("kubernetes", StoreSetting::Kubernetes),
        (" file ", StoreSetting::File),
        ("auto", StoreSetting::Auto),
    ] {
        let args = InitArgs {
            store: Some(v.into()),
            ..Default::default()
        };
        assert_eq!(InitConfig::from_args(&args, None).unwrap().store, want);
    }
    let args = InitArgs {
        store: Some("k8s".into()),
        ..Default::default()
    };
    let e = InitConfig::from_args(&args, None).unwrap_err().to_string();
    assert_eq!(
        e,
        "invalid TFINIT_STORE=\"k8s\": must be auto or kubernetes or file; for example TFINIT_STORE=auto"
    );
}

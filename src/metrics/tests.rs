//! The metrics as a scrape reads them.

use super::*;

fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn every_series_moves_with_what_it_counts() {
    let m = Metrics::new("1.2.3");
    let t = m.render();
    assert!(t.ends_with("# EOF\n"), "{t}");
    assert!(t.contains("tfinit_build_info{version=\"1.2.3\"} 1"), "{t}");
    let ok = "tfinit_runs_total{subcommand=\"apply\",outcome=\"succeeded\"}";
    assert_eq!(value(&t, ok), None, "made at first use: {t}");
    m.run_ended("apply", RunOutcome::Succeeded, Duration::from_secs(3));
    m.run_ended("frobnicate", RunOutcome::Failed, Duration::from_millis(10));
    m.run_ended("plan", RunOutcome::Refused, Duration::ZERO);
    m.reaped(3);
    m.forwarded(libc::SIGTERM);
    m.forwarded(crate::sys::sigrtmin() + 3);
    m.forwarded(libc::SIGCHLD);
    m.recovered(Backend::S3, UnlockOutcome::Unlocked, 2);
    m.recovered(Backend::parse("etcdv3"), UnlockOutcome::Ambiguous, 5);
    m.unknown_wording(Backend::S3);
    m.unknown_wording(Backend::S3);
    m.unknown_wording(Backend::parse("etcdv3"));
    m.set_needing_person(1);
    m.set_runs([0, 1, 2, 3, 4]);
    m.set_store_state(StoreStatus::Open);
    m.set_phase(Phase::Draining);
    m.cancelled(Cancel::Graceful);
    m.accept_paused(Listener::Control, Pause::Descriptors);
    m.dropped(Listener::Metrics, Dropped::Evicted);
    m.set_control_connections(3);
    m.set_heartbeat(Instant::now() - Duration::from_secs(2));
    let t = m.render();
    assert_eq!(value(&t, ok), Some(1.0), "{t}");
    assert_eq!(
        value(
            &t,
            "tfinit_runs_total{subcommand=\"other\",outcome=\"failed\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &t,
            "tfinit_runs_total{subcommand=\"plan\",outcome=\"refused\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &t,
            "tfinit_run_duration_seconds_count{subcommand=\"apply\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&t, "tfinit_run_duration_seconds_count{subcommand=\"plan\"}"),
        None,
        "refused runs have no duration"
    );
    assert_eq!(value(&t, "tfinit_zombies_reaped_total"), Some(3.0));
    assert_eq!(
        value(&t, "tfinit_signals_forwarded_total{signal=\"SIGTERM\"}"),
        Some(1.0)
    );
    assert_eq!(
        value(&t, "tfinit_signals_forwarded_total{signal=\"SIGRTMIN+3\"}"),
        Some(1.0)
    );
    assert_eq!(
        value(&t, "tfinit_signals_forwarded_total{signal=\"other\"}"),
        Some(1.0)
    );
    assert_eq!(
        value(
            &t,
            "tfinit_force_unlocks_total{backend=\"s3\",outcome=\"unlocked\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &t,
            "tfinit_force_unlocks_total{backend=\"other\",outcome=\"ambiguous\"}"
        ),
        Some(1.0),
        "an unknown backend counts as other"
    );
    assert_eq!(
        value(
            &t,
            "tfinit_lock_probe_unknown_wording_total{backend=\"s3\"}"
        ),
        Some(2.0)
    );
    assert_eq!(
        value(
            &t,
            "tfinit_lock_probe_unknown_wording_total{backend=\"other\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&t, "tfinit_orphan_candidates_total"),
        Some(2.0),
        "only a released lock's resources are orphan candidates"
    );
    assert_eq!(value(&t, "tfinit_recoveries_needing_a_person"), Some(1.0));
    assert_eq!(
        value(&t, "tfinit_cancels_total{how=\"graceful\"}"),
        Some(1.0)
    );
    assert_eq!(value(&t, "tfinit_cancels_total{how=\"force\"}"), Some(0.0));
    assert_eq!(value(&t, "tfinit_runs{state=\"stopping\"}"), Some(4.0));
    assert_eq!(
        value(&t, "tfinit_records_store_state{state=\"open\"}"),
        Some(1.0)
    );
    assert_eq!(
        value(&t, "tfinit_records_store_state{state=\"failed\"}"),
        Some(0.0)
    );
    assert_eq!(
        value(&t, "tfinit_shutdown_phase{phase=\"draining\"}"),
        Some(1.0)
    );
    assert_eq!(
        value(&t, "tfinit_shutdown_phase{phase=\"running\"}"),
        Some(0.0)
    );
    assert_eq!(
        value(
            &t,
            "tfinit_accept_pauses_total{listener=\"control\",reason=\"descriptors\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &t,
            "tfinit_connections_dropped_total{listener=\"metrics\",reason=\"evicted\"}"
        ),
        Some(1.0)
    );
    assert_eq!(value(&t, "tfinit_control_connections"), Some(3.0));
    let age = value(&t, "tfinit_heartbeat_age_seconds").unwrap();
    assert!((2.0..10.0).contains(&age), "{age}");
}

#[test]
fn a_metric_with_no_heartbeat_yet_is_left_out() {
    let t = Metrics::new("x").render();
    assert!(!t.contains("tfinit_heartbeat_age_seconds"), "{t}");
}

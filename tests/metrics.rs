//! Prometheus metrics (issue 20): `GET /metrics` on TFINIT_METRICS_ADDR, scraped with a real HTTP
//! client (curl), and `tfinit metrics` through the control socket. Each counter is read before
//! and after the scenario that should move it, and nothing else moves it.
//!
//! tfinit runs as PID 1 of its own PID namespace (`common::shim`), in the test's network
//! namespace, so the test reaches its metrics port on 127.0.0.1; the shims run in this process
//! with the helper's fake terraform.

#[macro_use]
mod common;

use std::net::TcpListener;
use std::process::Command;

use nix::sys::signal::Signal;

use common::shim::*;
use common::{curl, free_port, have_curl, metric as value, wait_for};

#[test]
fn metrics_are_scraped_over_http_and_each_counter_moves_with_its_scenario() {
    if !fake_available() || !have_curl() {
        return;
    }
    let port = free_port();
    let (tmp, init, tf) = fake_setup(
        "metrics",
        &[("TFINIT_METRICS_ADDR", format!("127.0.0.1:{port}"))],
    );
    let url = format!("http://127.0.0.1:{port}/metrics");
    let (head, before) = wait_for(SHORT, "the metrics server", || curl(&url));
    assert!(
        head.contains("application/openmetrics-text"),
        "OpenMetrics text: {head}"
    );
    assert!(before.ends_with("# EOF\n"), "{before}");
    let version = format!(
        "tfinit_build_info{{version=\"{}\"}}",
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(value(&before, &version), Some(1.0), "{before}");
    assert_eq!(
        value(&before, "tfinit_shutdown_phase{phase=\"running\"}"),
        Some(1.0)
    );
    let ok = "tfinit_runs_total{subcommand=\"version\",outcome=\"succeeded\"}";
    let failed = "tfinit_runs_total{subcommand=\"plan\",outcome=\"failed\"}";
    let refused = "tfinit_runs_total{subcommand=\"apply\",outcome=\"refused\"}";
    for s in [ok, failed, refused] {
        assert_eq!(value(&before, s), None, "made at first use: {s}: {before}");
    }
    for reason in ["denied", "missing", "unanswered", "other"] {
        let s = format!("tfinit_heartbeat_write_failures_total{{reason=\"{reason}\"}}");
        assert_eq!(
            value(&before, &s),
            Some(0.0),
            "made up front: {s}: {before}"
        );
    }
    let reaped_before = value(&before, "tfinit_zombies_reaped_total").unwrap();

    // A run that succeeds and one that fails.
    let mut version = tf.shim(&tmp.0, &["version"]);
    version.env("FAKE_TF_EXIT", "0");
    assert_eq!(run(version, None, SHORT).status.code(), Some(0));
    let mut plan = tf.shim(&tmp.0, &["plan"]);
    plan.env("FAKE_TF_EXIT", "3");
    assert_eq!(run(plan, None, SHORT).status.code(), Some(3));
    let after = wait_for(SHORT, "both runs counted", || {
        let (_, t) = curl(&url)?;
        (value(&t, ok) == Some(1.0) && value(&t, failed) == Some(1.0)).then_some(t)
    });
    assert_eq!(
        value(
            &after,
            "tfinit_run_duration_seconds_count{subcommand=\"plan\"}"
        ),
        Some(1.0)
    );
    assert!(
        value(&after, "tfinit_zombies_reaped_total").unwrap() >= reaped_before + 2.0,
        "both terraforms were reaped: {after}"
    );
    assert_eq!(value(&after, refused), None, "nothing refused yet");

    // A forwarded signal.
    let usr1 = "tfinit_signals_forwarded_total{signal=\"SIGUSR1\"}";
    assert_eq!(value(&after, usr1), None, "no SIGUSR1 yet");
    init.signal(Signal::SIGUSR1);
    wait_for(SHORT, "SIGUSR1 counted", || {
        let (_, t) = curl(&url)?;
        (value(&t, usr1) == Some(1.0)).then_some(())
    });

    // Draining: the phase shows, and a refused run counts.
    let ctl = |what: &str| {
        let mut c = common::nsenter(init.pid);
        c.arg(common::tfinit())
            .arg(what)
            .env("TFINIT_RUN_DIR", &init.run_dir);
        run(c, None, SHORT)
    };
    assert_eq!(ctl("drain").status.code(), Some(0));
    let apply = tf.shim(&tmp.0, &["apply"]);
    assert_eq!(run(apply, None, SHORT).status.code(), Some(75));
    let drained = wait_for(SHORT, "the refusal counted", || {
        let (_, t) = curl(&url)?;
        (value(&t, refused) == Some(1.0)).then_some(t)
    });
    assert_eq!(
        value(&drained, "tfinit_shutdown_phase{phase=\"draining\"}"),
        Some(1.0)
    );
    assert_eq!(
        value(&drained, "tfinit_shutdown_phase{phase=\"running\"}"),
        Some(0.0)
    );
    assert_eq!(ctl("resume").status.code(), Some(0));

    // `tfinit metrics` through the socket prints the same families.
    let o = ctl("metrics");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let printed = text(&o.stdout);
    assert_eq!(value(&printed, ok), Some(1.0), "{printed}");
    assert_eq!(value(&printed, refused), Some(1.0), "{printed}");
    assert_eq!(
        value(&printed, "tfinit_shutdown_phase{phase=\"running\"}"),
        Some(1.0)
    );

    // Only /metrics is served.
    let other = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "5",
        ])
        .arg(format!("http://127.0.0.1:{port}/"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&other.stdout), "404");
}

#[test]
fn a_scraper_that_never_reads_costs_the_loop_nothing_it_forwards_and_serves_on() {
    if !fake_available() || !have_curl() {
        return;
    }
    let port = free_port();
    let (tmp, init, tf) = fake_setup(
        "metrics-stuck",
        &[("TFINIT_METRICS_ADDR", format!("127.0.0.1:{port}"))],
    );
    let url = format!("http://127.0.0.1:{port}/metrics");
    wait_for(SHORT, "the metrics server", || curl(&url));
    // Clients that connect and never send, and one that asks and never reads.
    let mut stuck = Vec::new();
    for _ in 0..4 {
        stuck.push(std::net::TcpStream::connect(("127.0.0.1", port)).unwrap());
    }
    use std::io::Write;
    let mut deaf = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    deaf.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
    // The loop forwards, runs terraform and answers the socket meanwhile.
    init.signal(Signal::SIGUSR2);
    let mut version = tf.shim(&tmp.0, &["version"]);
    version.env("FAKE_TF_EXIT", "0");
    assert_eq!(run(version, None, SHORT).status.code(), Some(0));
    let t = wait_for(SHORT, "a scrape beside the stuck ones", || curl(&url));
    assert_eq!(
        value(&t.1, "tfinit_signals_forwarded_total{signal=\"SIGUSR2\"}"),
        Some(1.0),
        "{}",
        t.1
    );
    drop(stuck);
    drop(deaf);
}

#[test]
fn a_metrics_port_in_use_is_one_warning_and_the_init_runs_without_the_server() {
    if !fake_available() {
        return;
    }
    let held = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let (tmp, init, tf) = fake_setup(
        "metrics-in-use",
        &[("TFINIT_METRICS_ADDR", format!("127.0.0.1:{port}"))],
    );
    init.wait_log("cannot be served", SHORT);
    assert_eq!(init.log().matches("TFINIT_METRICS_ADDR=").count(), 1);
    let mut version = tf.shim(&tmp.0, &["version"]);
    version.env("FAKE_TF_EXIT", "0");
    assert_eq!(
        run(version, None, SHORT).status.code(),
        Some(0),
        "the init runs on"
    );
}

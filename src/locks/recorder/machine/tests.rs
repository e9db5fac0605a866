//! The machine alone, without a thread or a store: each decision from a clock reading and the
//! outcomes fed back.

use std::io;
use std::time::{Duration, Instant};

use super::{Held, Machine, Next, Now, Op, Out, Outcome};
use crate::locks::names::RunId;
use crate::locks::record_id::RecordId;
use crate::locks::recorder::tests::{me, record};
use crate::locks::recorder::{Completion, Work, WriteError};
use crate::locks::store::Change;

const TTL: Duration = Duration::from_secs(30);

fn at(t0: Instant, ms: u64) -> Now {
    Now {
        mono: t0 + Duration::from_millis(ms),
        wall_ms: 1_000_000 + ms,
    }
}

/// The request to create run `n`'s record (`r<n>`), with no environment.
fn create(n: u64) -> Work {
    Work::Create {
        run: RunId::from(n),
        record: record(&format!("r{n}")),
        env: Vec::new(),
    }
}

/// A new machine driven through its store's opening at `now` (first heartbeat, tidying) up to
/// the opening scan's listing, which it asks for.
fn up_to_listing(now: Now) -> Machine {
    let mut m = Machine::new(me(), TTL, "test".into());
    assert!(matches!(m.next(now), Next::Do(Op::Open { .. })));
    m.finished(
        Outcome::Opened {
            passwd_user: None,
            host: "h".into(),
            location: "test-store".into(),
            result: Ok(Held::NoFile),
        },
        now,
    );
    assert!(matches!(m.next(now), Next::Do(Op::WriteHeartbeat(_))));
    m.finished(Outcome::Wrote(Ok(())), now);
    assert!(matches!(m.next(now), Next::Do(Op::Tidy { .. })));
    m.finished(Outcome::Tidied, now);
    assert_eq!(m.next(now), Next::Do(Op::List));
    m
}

/// A machine whose store opened at `t0` (no records), with its messages taken.
fn opened(t0: Instant) -> Machine {
    let now = at(t0, 0);
    let mut m = up_to_listing(now);
    m.finished(
        Outcome::Listed {
            records: Vec::new(),
            unlisted: None,
        },
        now,
    );
    assert_eq!(
        m.next(now),
        Next::Do(Op::ReadHeartbeats {
            owners: Vec::new(),
            name: "pod-a".into()
        })
    );
    m.finished(
        Outcome::Heartbeats {
            each: Vec::new(),
            named: Ok(Vec::new()),
            named_started: now.mono,
            named_done: now.mono,
        },
        now,
    );
    let out = m.take_out();
    assert!(
        matches!(
            &out[..],
            [Out::Wake(Completion::Opened { result: Ok(()), .. })]
        ),
        "{out:?}"
    );
    m
}

#[test]
fn the_first_job_opens_the_store_and_the_heartbeat_follows_every_third_of_the_ttl() {
    let t0 = Instant::now();
    let mut m = opened(t0);
    assert_eq!(m.next(at(t0, 1)), Next::Wait(t0 + TTL / 3));
    let Next::Do(Op::WriteHeartbeat(hb)) = m.next(at(t0, 10_000)) else {
        panic!("the heartbeat is due");
    };
    assert_eq!(
        (hb.seq, hb.updated_ms, hb.host.as_str()),
        (2, 1_010_000, "h")
    );
}

#[test]
fn a_create_under_a_stale_heartbeat_waits_for_a_new_one_and_fails_without_it() {
    let t0 = Instant::now();
    let mut m = opened(t0);
    m.request(create(1));
    // 11 s after the last heartbeat that landed: older than TTL/3.
    let later = at(t0, 11_000);
    let mut ops = Vec::new();
    // The heartbeat's own job comes first (it is due too), and fails.
    while let Next::Do(op) = m.next(later) {
        ops.push(op.clone());
        match op {
            Op::WriteHeartbeat(_) => {
                m.finished(Outcome::Wrote(Err(io::Error::other("full"))), later);
            }
            other => panic!("nothing but heartbeats is written: {other:?}"),
        }
    }
    assert_eq!(ops.len(), 2, "{ops:?}");
    let created: Vec<_> = m
        .take_out()
        .into_iter()
        .filter_map(|o| match o {
            Out::Wake(Completion::Created { result, .. }) => Some(result),
            _ => None,
        })
        .collect();
    assert_eq!(created, [Err(WriteError::NoHeartbeat)]);
}

#[test]
fn a_create_under_a_fresh_heartbeat_is_written_at_once_with_its_who() {
    let t0 = Instant::now();
    let mut m = opened(t0);
    m.request(Work::Create {
        run: RunId::from(1),
        record: record("r1"),
        env: vec!["USER=bob".into(), "HOME=/home/bob".into()],
    });
    let Next::Do(Op::Apply(changes)) = m.next(at(t0, 5)) else {
        panic!("the create is written");
    };
    let [Change::Put(rec)] = &changes[..] else {
        panic!("one put: {changes:?}");
    };
    assert_eq!((rec.who.as_str(), rec.updated_ms), ("bob@h", 1_000_005));
}

/// The first operation of a create asked for at 15 s, the heartbeat of 10 s having failed (so
/// the last one that landed, at 0 s, is older than TTL/3, while the next is due only at 20 s).
fn create_after_a_failed_heartbeat() -> Op {
    let t0 = Instant::now();
    let mut m = opened(t0);
    assert!(matches!(
        m.next(at(t0, 10_000)),
        Next::Do(Op::WriteHeartbeat(_))
    ));
    m.finished(
        Outcome::Wrote(Err(io::Error::other("full"))),
        at(t0, 10_000),
    );
    m.request(create(1));
    let Next::Do(op) = m.next(at(t0, 15_000)) else {
        panic!("a job");
    };
    op
}

#[test]
fn a_create_after_a_failed_heartbeat_tries_a_heartbeat_first() {
    assert!(matches!(
        create_after_a_failed_heartbeat(),
        Op::WriteHeartbeat(_)
    ));
}

#[cfg(feature = "mutation")]
#[test]
fn with_the_fresh_heartbeat_guard_off_a_create_follows_a_stale_heartbeat() {
    let _off = crate::mutation::disable(crate::mutation::Guard::FreshHeartbeat);
    assert!(matches!(create_after_a_failed_heartbeat(), Op::Apply(_)));
}

#[test]
fn a_failed_removal_is_tried_again_after_the_next_heartbeat_that_lands() {
    let t0 = Instant::now();
    let mut m = opened(t0);
    let now = at(t0, 1);
    m.request(create(1));
    assert!(matches!(m.next(now), Next::Do(Op::Apply(_))));
    m.finished(Outcome::Applied(vec![Ok("r1".into())]), now);
    m.request(Work::Remove {
        run: RunId::from(1),
    });
    let remove = Op::Apply(vec![Change::Remove("r1".into())]);
    assert_eq!(m.next(now), Next::Do(remove.clone()));
    m.finished(Outcome::Applied(vec![Err(io::Error::other("EIO"))]), now);
    m.take_out();
    m.request(Work::Heartbeat);
    assert!(matches!(m.next(now), Next::Do(Op::WriteHeartbeat(_))));
    m.finished(Outcome::Wrote(Ok(())), now);
    assert_eq!(m.next(now), Next::Do(remove));
    m.finished(Outcome::Applied(vec![Ok("r1".into())]), now);
    let out = m.take_out();
    assert!(
        out.iter()
            .any(|o| matches!(o, Out::Wake(Completion::Removed { result: Ok(()), .. }))),
        "{out:?}"
    );
    // Then the rescan the heartbeat asks for.
    assert_eq!(m.next(now), Next::Do(Op::List));
}

#[test]
fn a_store_that_failed_at_open_is_listed_and_tried_again_quietly_on_the_heartbeats_clock() {
    let t0 = Instant::now();
    let mut m = Machine::new(me(), TTL, "test".into());
    let fail = |m: &mut Machine, now: Now| {
        assert!(matches!(m.next(now), Next::Do(Op::Open { .. })));
        m.finished(
            Outcome::Opened {
                passwd_user: None,
                host: "h".into(),
                location: "test-store".into(),
                result: Err("read-only file system".into()),
            },
            now,
        );
        // What can still be read: the records alone, no heartbeat.
        assert_eq!(m.next(now), Next::Do(Op::List));
        m.finished(
            Outcome::Listed {
                records: Vec::new(),
                unlisted: None,
            },
            now,
        );
        m.take_out()
    };
    let first = fail(&mut m, at(t0, 0));
    assert!(
        matches!(
            &first[..],
            [Out::Wake(Completion::Opened {
                result: Err(_),
                table: Some(_),
                ..
            })]
        ),
        "{first:?}"
    );
    // Nothing is written meanwhile; a create is refused at once.
    m.request(create(1));
    assert_eq!(m.next(at(t0, 1)), Next::Wait(t0 + TTL / 3));
    assert!(matches!(
        &m.take_out()[..],
        [
            Out::Wake(Completion::Created {
                result: Err(WriteError::NotOpen),
                ..
            }),
            Out::Done(1)
        ]
    ));
    // Another failure is news nobody waits for.
    let again = fail(&mut m, at(t0, 10_000));
    assert!(
        matches!(
            &again[..],
            [Out::Quiet(Completion::Opened { result: Err(_), .. })]
        ),
        "{again:?}"
    );
}

/// A heartbeat names the incarnation's lock file as held only while a descriptor of this very
/// try holds it: the first try took it and its first heartbeat failed (the descriptor dropped
/// with the try); the retry could not take it. The retry's heartbeat must not name the first
/// try's file, whose free flock would prove this live owner gone to a pod on the same node.
#[test]
fn a_lock_file_dropped_with_a_failed_opening_is_never_named_as_held_again() {
    let t0 = Instant::now();
    let mut m = Machine::new(me(), TTL, "test".into());
    let now = at(t0, 0);
    assert!(matches!(m.next(now), Next::Do(Op::Open { .. })));
    let id = crate::protocol::FileId { dev: 7, ino: 42 };
    m.finished(
        Outcome::Opened {
            passwd_user: None,
            host: "h".into(),
            location: "test-store".into(),
            result: Ok(Held::File(None, id)),
        },
        now,
    );
    let Next::Do(Op::WriteHeartbeat(first)) = m.next(now) else {
        panic!("the first heartbeat follows the opening");
    };
    assert!(first.holds_lock && first.lock_file == Some(id), "{first:?}");
    m.finished(Outcome::Wrote(Err(io::Error::other("volume away"))), now);
    // The failed opening's scan, then the retry on the heartbeat's clock.
    let mut t = 0;
    let retry = loop {
        t += 1_000;
        assert!(
            t < 60_000,
            "the opening is tried again within two heartbeat periods"
        );
        match m.next(at(t0, t)) {
            Next::Do(Op::Open { .. }) => break at(t0, t),
            Next::Do(Op::List) => m.finished(
                Outcome::Listed {
                    records: Vec::new(),
                    unlisted: None,
                },
                at(t0, t),
            ),
            Next::Do(Op::ReadHeartbeats { .. }) => m.finished(
                Outcome::Heartbeats {
                    each: Vec::new(),
                    named: Ok(Vec::new()),
                    named_started: at(t0, t).mono,
                    named_done: at(t0, t).mono,
                },
                at(t0, t),
            ),
            Next::Do(op) => panic!("unexpected {op:?}"),
            Next::Wait(_) => {}
        }
    };
    m.finished(
        Outcome::Opened {
            passwd_user: None,
            host: "h".into(),
            location: "test-store".into(),
            result: Ok(Held::Failed),
        },
        retry,
    );
    let Next::Do(Op::WriteHeartbeat(hb)) = m.next(retry) else {
        panic!("the retry's first heartbeat");
    };
    assert!(!hb.holds_lock, "{hb:?}");
    assert_eq!(hb.lock_file, None, "{hb:?}");
}

/// The puts and removals of a batch op, by run id (`r1`) or removed id.
fn batch(op: Next) -> Vec<String> {
    let Next::Do(Op::Apply(changes)) = op else {
        panic!("a batch: {op:?}");
    };
    changes
        .iter()
        .map(|c| match c {
            Change::Put(r) => format!("put {} {:?}", r.run_id, r.in_progress),
            Change::Remove(id) => format!("remove {id}"),
        })
        .collect()
}

/// The completions and the count of requests done since the last call.
fn answers(m: &mut Machine) -> (Vec<String>, usize) {
    let mut done = 0;
    let mut said = Vec::new();
    for o in m.take_out() {
        match o {
            Out::Done(n) => done += n,
            Out::Wake(c) | Out::Quiet(c) => said.push(match c {
                Completion::Created { run, result } => format!("created {run} {}", result.is_ok()),
                Completion::Written { run, result } => format!("written {run} {result:?}"),
                Completion::Ended { run, result } => format!("ended {run} {result:?}"),
                Completion::Removed { run, result } => format!("removed {run} {result:?}"),
                other => format!("{other:?}"),
            }),
        }
    }
    (said, done)
}

#[test]
fn sixteen_creates_queued_behind_a_batch_go_out_as_the_next_one() {
    let t0 = Instant::now();
    let mut m = opened(t0);
    let now = at(t0, 5);
    m.request(create(1));
    assert_eq!(batch(m.next(now)), ["put r1 []"]);
    // While the first batch is in flight, fifteen more runs start.
    for i in 2..=16 {
        m.request(create(i));
    }
    m.finished(Outcome::Applied(vec![Ok("/s/r1".into())]), now);
    assert_eq!(answers(&mut m), (vec!["created r1 true".to_string()], 1));
    let second = batch(m.next(now));
    assert_eq!(second.len(), 15, "one batch for the fifteen: {second:?}");
    assert_eq!(second[0], "put r2 []");
    let results = (2..=16)
        .map(|i| Ok(RecordId::file(format!("/s/r{i}"))))
        .collect();
    m.finished(Outcome::Applied(results), now);
    let (said, done) = answers(&mut m);
    assert_eq!((said.len(), done), (15, 15), "{said:?}");
    assert!(said.iter().all(|s| s.ends_with("true")), "{said:?}");
    assert!(matches!(m.next(now), Next::Wait(_)), "nothing left");
}

#[test]
fn a_batch_holds_one_change_per_run_and_answers_each_request_in_order() {
    let t0 = Instant::now();
    let mut m = opened(t0);
    let now = at(t0, 5);
    for run in ["r1", "r2"] {
        m.request(Work::Create {
            run: RunId::from(run[1..].parse::<u64>().unwrap()),
            record: record(run),
            env: Vec::new(),
        });
    }
    assert_eq!(batch(m.next(now)), ["put r1 []", "put r2 []"]);
    // r3 is created while r1's progress and end and r2's removal wait: r3's create and its
    // progress are one put, r1's end supersedes its progress, r4 has no record.
    for w in [
        Work::Create {
            run: RunId::from(3),
            record: record("r3"),
            env: Vec::new(),
        },
        crate::locks::recorder::tests::progress("r1", &["a"]),
        crate::locks::recorder::tests::progress("r3", &["x"]),
        crate::locks::recorder::tests::progress("r4", &["y"]),
        Work::End {
            run: RunId::from(1),
            ended: crate::locks::recorder::tests::ended(),
            in_progress: vec!["a".into(), "b".into()],
        },
        Work::Remove {
            run: RunId::from(2),
        },
    ] {
        m.request(w);
    }
    m.finished(
        Outcome::Applied(vec![Ok("/s/r1".into()), Ok("/s/r2".into())]),
        now,
    );
    answers(&mut m);
    let second = batch(m.next(now));
    assert_eq!(
        second,
        ["put r3 [\"x\"]", "put r1 [\"a\", \"b\"]", "remove /s/r2"]
    );
    // Negative: r4 had no record, so nothing of it is in the batch; it is answered at once.
    let (said, _) = answers(&mut m);
    assert_eq!(said, ["written r4 Err(NoRecord)"]);
    // The end fails: the run's record is tried again after the next heartbeat; the rest lands.
    m.finished(
        Outcome::Applied(vec![
            Ok("/s/r3".into()),
            Err(io::Error::other("EIO")),
            Ok("/s/r2".into()),
        ]),
        now,
    );
    let (said, done) = answers(&mut m);
    assert_eq!(
        said,
        [
            "created r3 true",
            "written r3 Ok(())",
            "ended r1 Err(Volume(Other, \"EIO\"))",
            "removed r2 Ok(())"
        ]
    );
    // r1's progress was superseded by its end in the queue (done then): four answered here.
    assert_eq!(done, 4);
    m.request(Work::Heartbeat);
    assert!(matches!(m.next(now), Next::Do(Op::WriteHeartbeat(_))));
    m.finished(Outcome::Wrote(Ok(())), now);
    assert_eq!(batch(m.next(now)), ["put r1 [\"a\", \"b\"]"]);
}

#[test]
fn a_batch_with_a_create_under_a_stale_heartbeat_follows_a_new_one_and_without_it_only_the_creates_fail(
) {
    let t0 = Instant::now();
    for lands in [true, false] {
        let mut m = opened(t0);
        let now = at(t0, 5);
        m.request(create(1));
        assert_eq!(batch(m.next(now)), ["put r1 []"]);
        m.finished(Outcome::Applied(vec![Ok("/s/r1".into())]), now);
        answers(&mut m);
        // 10.5 s on (the heartbeat's own clock is due at 10 s: answered first, failing), a
        // progress and a create wait.
        let later = at(t0, 10_500);
        m.request(crate::locks::recorder::tests::progress("r1", &["a"]));
        m.request(create(2));
        let mut ops = Vec::new();
        loop {
            match m.next(later) {
                Next::Do(Op::WriteHeartbeat(_)) => {
                    ops.push("heartbeat".to_string());
                    let r = if lands && ops.len() > 1 {
                        Ok(())
                    } else {
                        Err(io::Error::other("full"))
                    };
                    m.finished(Outcome::Wrote(r), later);
                }
                Next::Do(Op::Apply(changes)) => {
                    ops.push(format!("batch of {}", changes.len()));
                    let n = changes.len();
                    m.finished(
                        Outcome::Applied((0..n).map(|_| Ok("/s/x".into())).collect()),
                        later,
                    );
                }
                Next::Do(Op::List | Op::ReadHeartbeats { .. }) => {
                    unreachable!("no rescan after a failed heartbeat")
                }
                Next::Do(op) => panic!("{op:?}"),
                Next::Wait(_) => break,
            }
        }
        let (said, _) = answers(&mut m);
        if lands {
            // The failed one of the heartbeat's clock, then the batch's own, then the batch.
            assert_eq!(ops, ["heartbeat", "heartbeat", "batch of 2"], "{said:?}");
            assert!(said.contains(&"created r2 true".to_string()), "{said:?}");
        } else {
            assert_eq!(ops, ["heartbeat", "heartbeat", "batch of 1"], "{said:?}");
            assert!(said.contains(&"created r2 false".to_string()), "{said:?}");
            assert!(said.contains(&"written r1 Ok(())".to_string()), "{said:?}");
        }
    }
}

/// An opening whose scan lists one record of another incarnation and reads its heartbeat with
/// `answer`: the table the loop gets.
fn opening_table(
    answer: Result<Option<crate::locks::record::Heartbeat>, String>,
) -> crate::locks::recorder::Table {
    use crate::locks::record::Owner;
    use crate::locks::recorder::Entry;
    let now = at(Instant::now(), 0);
    let mut m = up_to_listing(now);
    let other = Owner {
        name: "pod-b".into(),
        ..me()
    };
    let mut theirs = record("r1");
    theirs.owner = other.clone();
    m.finished(
        Outcome::Listed {
            records: vec![Entry::of("/s/records/b.json".into(), &theirs)],
            unlisted: None,
        },
        now,
    );
    assert_eq!(
        m.next(now),
        Next::Do(Op::ReadHeartbeats {
            owners: vec![other.clone()],
            name: "pod-a".into()
        })
    );
    m.finished(
        Outcome::Heartbeats {
            each: vec![super::HeartbeatRead {
                owner: other,
                answer,
                started: now.mono,
                done: now.mono,
                proof: None,
            }],
            named: Err("the API did not answer".into()),
            named_started: now.mono,
            named_done: now.mono,
        },
        now,
    );
    match m.take_out().pop() {
        Some(Out::Wake(Completion::Opened {
            result: Ok(()),
            table: Some(table),
            ..
        })) => table,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_heartbeat_read_with_no_answer_is_no_observation_but_its_owner_stays_watched() {
    let table = opening_table(Err("503 Service Unavailable".into()));
    assert!(table.beats.is_empty(), "{:?}", table.beats);
    assert_eq!(table.unread.len(), 1);
    assert!(table.unread[0].starts_with("pod-b/"), "{:?}", table.unread);
    // An answer, even "there is none", is an observation.
    let table = opening_table(Ok(None));
    assert_eq!(table.beats.len(), 1);
    assert_eq!(table.beats[0].heartbeat, None);
    assert!(table.unread.is_empty());
}

#[test]
fn with_the_unanswered_read_guard_off_no_answer_counts_as_no_heartbeat() {
    use crate::mutation::{disable, Guard};
    let _off = disable(Guard::UnansweredRead);
    let table = opening_table(Err("503 Service Unavailable".into()));
    assert_eq!(table.beats.len(), 1, "the old rule: watched as missing");
    assert!(table.unread.is_empty());
}

#[test]
fn a_listing_with_no_answer_reaches_the_loop_as_unlisted() {
    let t0 = Instant::now();
    let mut m = Machine::new(me(), TTL, "test".into());
    let now = at(t0, 0);
    assert!(matches!(m.next(now), Next::Do(Op::Open { .. })));
    m.finished(
        Outcome::Opened {
            passwd_user: None,
            host: "h".into(),
            location: "test-store".into(),
            result: Err("the Kubernetes API has not answered yet".into()),
        },
        now,
    );
    assert_eq!(
        m.next(now),
        Next::Do(Op::List),
        "a failed store still lists"
    );
    m.finished(
        Outcome::Listed {
            records: Vec::new(),
            unlisted: Some("the Kubernetes API has not answered yet".into()),
        },
        now,
    );
    match m.take_out().pop() {
        Some(Out::Wake(Completion::Opened {
            result: Err(_),
            table: Some(t),
            ..
        })) => assert_eq!(
            t.unlisted.as_deref(),
            Some("the Kubernetes API has not answered yet")
        ),
        other => panic!("{other:?}"),
    }
}

//! The output follower (`tfinit::locks::follower::Follower`): it reads every byte terraform
//! prints in a state-locking run, so no output may make it panic or grow without bound, its
//! answer must not depend on how the output was split into reads, and for terraform's own
//! progress lines (human and `-json`, colored or not, split anywhere, among other output) the
//! resources it reports in progress must be exactly those a model of the events says.
//!
//! Input: raw output bytes; the same bytes also drive a generated event sequence (`arbitrary`).
#![no_main]

use std::collections::BTreeSet;

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use tfinit::locks::follower::Follower;

/// The follower's longest kept line (`MAX_LINE` in src/locks/follower.rs).
const MAX_LINE: usize = 64 << 10;

/// Resource addresses: plain, indexed, in modules, keys with spaces, quotes and colons.
const ADDRS: &[&str] = &[
    "null_resource.a",
    "null_resource.b[0]",
    "module.m.null_resource.c[\"x\"]",
    "module.m[1].module.n.aws_s3_bucket.this",
    "aws_instance.web[\"a b\"]",
    "_x.y",
    "kubernetes_manifest.cm[\"ns/name: v\"]",
    "null_resource.é",
];

#[derive(Debug, Clone, Copy)]
enum Ev {
    Start,
    Finish,
    /// A line about the resource that must change nothing.
    Noise,
}

/// One line of terraform output about `addr`, in the human or the `-json` format.
fn line(u: &mut Unstructured<'_>, addr: &str, ev: Ev) -> Result<String> {
    let json = u.ratio(1, 3)?;
    if json {
        let (kind, action) = match ev {
            Ev::Start => (
                "apply_start",
                *u.choose(&["create", "update", "delete", "replace"])?,
            ),
            Ev::Finish => (*u.choose(&["apply_complete", "apply_errored"])?, "create"),
            Ev::Noise => *u.choose(&[
                ("apply_start", "read"),
                ("apply_start", "noop"),
                ("apply_progress", "create"),
                ("planned_change", "create"),
                ("refresh_start", "read"),
            ])?,
        };
        let msg = serde_json::json!({
            "@level": "info",
            "@message": format!("{addr}: Creating..."),
            "type": kind,
            "hook": {"resource": {"addr": addr, "resource_type": "x"}, "action": action},
        });
        return Ok(msg.to_string());
    }
    let rest = match ev {
        Ev::Start => *u.choose(&[
            "Creating...",
            "Modifying... [id=1]",
            "Destroying... [id=i-0: 1]",
        ])?,
        Ev::Finish => *u.choose(&[
            "Creation complete after 2s [id=123]",
            "Modifications complete after 0s [id=1]",
            "Destruction complete after 1m3s",
        ])?,
        Ev::Noise => *u.choose(&[
            "Still creating... [10s elapsed]",
            "Refreshing state... [id=1]",
            "Reading...",
            "Read complete after 0s [id=1]",
        ])?,
    };
    let l = format!("{addr}: {rest}");
    Ok(if u.ratio(1, 3)? {
        format!("\x1b[0m\x1b[1m{l}\x1b[0m\x1b[0m")
    } else {
        l
    })
}

/// Feeds `bytes` of stream `idx` in pieces whose lengths `u` picks.
fn feed_split(f: &mut Follower, idx: usize, bytes: &[u8], u: &mut Unstructured<'_>) {
    let mut at = 0;
    while at < bytes.len() {
        let n = usize::from(u.arbitrary::<u8>().unwrap_or(255)).max(1) * 7;
        let end = (at + n).min(bytes.len());
        f.feed(idx, &bytes[at..end]);
        at = end;
    }
}

fuzz_target!(|data: &[u8]| {
    // Whatever terraform printed: the same set whether fed whole or a byte at a time. (Inputs
    // stay far below MAX_LINE: a line longer than that is dropped only when it arrives in pieces.)
    let mut whole = Follower::default();
    whole.feed(0, data);
    whole.feed(1, data);
    let mut bytes = Follower::default();
    for b in data {
        bytes.feed(0, std::slice::from_ref(b));
    }
    for chunk in data.chunks(3) {
        bytes.feed(1, chunk);
    }
    assert_eq!(
        whole.in_progress(),
        bytes.in_progress(),
        "split changed the result"
    );
    assert_eq!(
        whole.lock_trouble(),
        bytes.lock_trouble(),
        "split changed the lock trouble"
    );

    // Generated progress: each stream carries its own resources (terraform prints a resource's
    // lines on one stream), so the final set does not depend on how the streams interleave.
    let mut u = Unstructured::new(data);
    let mut model: BTreeSet<String> = BTreeSet::new();
    let mut trouble = false;
    // At most one line longer than the follower keeps (they are slow to generate).
    let mut long_line = false;
    let mut out: [Vec<u8>; 2] = [Vec::new(), Vec::new()];
    let n = u.int_in_range(0..=64).unwrap_or(0);
    for _ in 0..n {
        let Ok(i) = u.choose_index(ADDRS.len()) else {
            break;
        };
        let addr = ADDRS[i];
        let stream = i % 2;
        let Ok(ev) = u.choose(&[Ev::Start, Ev::Finish, Ev::Noise]).copied() else {
            break;
        };
        let Ok(text) = line(&mut u, addr, ev) else {
            break;
        };
        match ev {
            Ev::Start => {
                model.insert(addr.to_string());
            }
            Ev::Finish => {
                model.remove(addr);
            }
            Ev::Noise => {}
        }
        out[stream].extend_from_slice(text.as_bytes());
        out[stream].extend_from_slice(if u.ratio(1, 5).unwrap_or(false) {
            b"\r\n"
        } else {
            b"\n"
        });
        // Other output between progress lines, sometimes one longer than the follower keeps.
        match u.int_in_range(0..=9u8).unwrap_or(0) {
            0 => out[stream].extend_from_slice(b"\nPlan: 1 to add, 0 to change, 0 to destroy.\n"),
            1 => out[stream].extend_from_slice(b"Error: x: Creating... went wrong\n"),
            // terraform exits by itself but may leave its lock: the follower must notice.
            3 if u.ratio(1, 4).unwrap_or(false) => {
                trouble = true;
                const TROUBLE: [&[u8]; 2] = [
                    b"\x1b[31m\xe2\x94\x82\x1b[0m \x1b[1m\x1b[31mError: \x1b[0m\x1b[0m\x1b[1mError releasing the state lock\x1b[0m\n",
                    b"!!!!!!!!!!!!!!!!!!!!!!!!!!! TERRAFORM CRASH !!!!!!!!!!!!!!!!!!!!!!!!!!!!\n",
                ];
                let l = TROUBLE[usize::from(u.arbitrary::<bool>().unwrap_or(false))];
                out[stream].extend_from_slice(l);
            }
            2 if !long_line && u.ratio(1, 8).unwrap_or(false) => {
                long_line = true;
                out[stream].resize(
                    out[stream].len()
                        + MAX_LINE
                        + 1
                        + usize::from(u.arbitrary::<u8>().unwrap_or(0)),
                    b'x',
                );
                out[stream].push(b'\n');
            }
            _ => {}
        }
    }
    let mut f = Follower::default();
    let mut changed = false;
    feed_split(&mut f, 0, &out[0], &mut u);
    changed |= f.take_changed();
    feed_split(&mut f, 1, &out[1], &mut u);
    changed |= f.take_changed();
    let got: BTreeSet<String> = f.in_progress().into_iter().collect();
    assert_eq!(
        got,
        model,
        "output:\n{}\n---\n{}",
        String::from_utf8_lossy(&out[0]),
        String::from_utf8_lossy(&out[1])
    );
    if !model.is_empty() {
        assert!(changed, "the set changed but take_changed never said so");
    }
    assert!(!f.take_changed(), "take_changed did not reset");
    assert_eq!(
        f.lock_trouble().is_some(),
        trouble,
        "lock trouble: {:?}",
        f.lock_trouble()
    );
});

//! Reads what `terraform force-unlock -force <id that cannot match>` prints: the current holder's
//! Lock Info (a read-only probe for the backends whose Unlock compares the id first), or that the
//! lock is free, or neither (an error we do not understand: then nothing is touched).

use crate::mutation::{self, Guard};

/// The lock as terraform describes it (statemgr.LockInfo.String()).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LockInfo {
    /// Lock id, the argument force-unlock needs.
    pub id: String,
    /// State path.
    pub path: String,
    /// e.g. OperationTypeApply.
    pub operation: String,
    /// `user@hostname` of the holder.
    pub who: String,
    /// terraform version of the holder.
    pub version: String,
    /// Creation time as printed.
    pub created: String,
    /// Creation time, ms since the epoch, when it parses.
    pub created_ms: Option<u64>,
    /// Free text.
    pub info: String,
}

/// What the probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// Somebody holds the lock.
    Held(LockInfo),
    /// Somebody holds the lock, and terraform cannot load the state: it does not exist, and
    /// creating it needs the lock (`Failed to load state: ...` with a Lock Info). No terraform
    /// command can release such a lock, not even with its id: only the backend's own tools.
    HeldStateMissing(LockInfo),
    /// Nobody holds it.
    Free,
    /// Could not tell (network, credentials, an unknown message): touch nothing.
    Unknown(String),
}

/// Messages that mean "no lock is held", by backend, from terraform's source
/// (internal/backend/remote-state/*/client.go `Unlock`/`getLockInfo`). Matched only when no Lock
/// Info block was printed. s3 was measured (docs/notes/terraform-facts.md 3b).
const FREE_MARKERS: [(&str, &str); 4] = [
    // s3 (DynamoDB): GetItem finds no item, its empty Info attribute is not JSON.
    (
        "s3",
        "failed to retrieve lock info: unexpected end of JSON input",
    ),
    // kubernetes: the Lease has no holder.
    ("kubernetes", "state is already unlocked"),
    // azurerm: the blob has no lock metadata.
    (
        "azurerm",
        "failed to retrieve lock info: blob metadata \"terraformlockid\" was empty",
    ),
    // gcs: the lock object does not exist (the Lock Info then printed is a dummy, see below).
    ("gcs", "storage: object doesn't exist"),
];

/// The id gcs's `lockInfo` gives the dummy LockInfo it returns when no lock object exists
/// (`strconv.FormatInt(math.MinInt64, 10)`); that dummy carries the prober's own Who.
const GCS_NO_LOCK_ID: &str = "-9223372036854775808";

/// What `force-unlock` prints when it released something (or, for s3 without a lock table, when
/// there is no locking at all: docs/notes/terraform-facts.md 3c).
const UNLOCKED: &str = "Terraform state has been successfully unlocked!";

/// The id passed to the probe: it cannot match a real lock. gcs ids are object generations
/// (int64 microsecond timestamps; 0 would mean "no condition" and delete unconditionally), so it
/// gets the largest int64; the others use UUIDs.
pub fn probe_id(backend: &str) -> &'static str {
    match backend {
        "gcs" => "9223372036854775807",
        _ => "00000000-0000-0000-0000-000000000000",
    }
}

/// Backends whose Unlock checks the id before deleting: the probe is read-only there.
pub fn probe_safe(backend: &str) -> bool {
    matches!(backend, "s3" | "kubernetes" | "azurerm" | "gcs")
}

/// Whether `id` is a plain lock id we may pass to force-unlock (UUID-like or numeric).
pub fn plain_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        && !id.starts_with('-')
}

/// What terraform prints before the Lock Info when loading the state failed: the backend tried
/// to lock the state to create it (it does not exist) and found the lock held.
const STATE_LOAD_FAILED: &str = "Failed to load state:";

/// Parses the probe's combined output for `backend`; `success` is whether it exited 0.
pub fn parse_probe(backend: &str, success: bool, output: &str) -> Probe {
    parse_probe_of(backend, None, success, output)
}

/// [`parse_probe`], knowing the name of the backend's own lock object when there is one (the
/// kubernetes Lease `lock-tfstate-<workspace>-<suffix>`): its NotFound after the state loaded
/// means nobody holds the lock (a person deleted the Lease). Any other NotFound (the namespace,
/// another object) says nothing.
pub fn parse_probe_of(backend: &str, own_lock: Option<&str>, success: bool, output: &str) -> Probe {
    let flat = super::follower::strip_ansi(output);
    if let Some(info) = parse_lock_info(&flat) {
        if backend == "gcs" && info.id == GCS_NO_LOCK_ID {
            return Probe::Free;
        }
        let first = flat.lines().map(str::trim).find(|l| !l.is_empty());
        if first.is_some_and(|l| l.starts_with(STATE_LOAD_FAILED)) {
            return Probe::HeldStateMissing(info);
        }
        return Probe::Held(info);
    }
    if FREE_MARKERS
        .iter()
        .any(|(b, m)| *b == backend && flat.contains(m))
    {
        return Probe::Free;
    }
    if backend == "s3" && mutation::on(Guard::Wordings) && s3_free_naming_id(&flat) {
        return Probe::Free;
    }
    // kubernetes' Unlock reads the Lease only after the state loaded (so the namespace exists):
    // a NotFound of exactly this Lease there means it was deleted, and so nothing holds the lock.
    if let (Some(name), "kubernetes") = (own_lock, backend) {
        let lease_gone =
            format!("Failed to unlock state: leases.coordination.k8s.io {name:?} not found");
        if flat.lines().any(|l| l.trim() == lease_gone) {
            return Probe::Free;
        }
    }
    // An id that cannot match was "unlocked": the backend has no locking configured (s3
    // without dynamodb_table), so nothing can be held.
    if success && flat.contains(UNLOCKED) {
        return Probe::Free;
    }
    Probe::Unknown(first_line(&flat))
}

/// terraform 1.6+'s wording of a free s3 (DynamoDB) lock, which names the id it was given
/// (s3/client.go: `failed to retrieve lock info for lock ID %q: %s`; 1.11.4 prints
/// `failed to retrieve lock info for lock ID "<id>": unexpected end of JSON input`).
fn s3_free_naming_id(flat: &str) -> bool {
    const HEAD: &str = "failed to retrieve lock info for lock ID \"";
    flat.lines().any(|l| {
        l.find(HEAD)
            .and_then(|at| l[at + HEAD.len()..].split_once('"'))
            .is_some_and(|(id, tail)| {
                plain_id(id) && tail.trim_end() == ": unexpected end of JSON input"
            })
    })
}

/// The first non-empty line of terraform's `output`, without escape codes, at most 300
/// characters: what a message quotes of it.
pub fn first_line(output: &str) -> String {
    let flat = super::follower::strip_ansi(output);
    let first = flat
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("no output");
    first.chars().take(300).collect()
}

/// Parses the first `Lock Info:` block in `output` (statemgr.LockInfo.String(): one `  Key: value`
/// line per field, `Info` last). The first value of each field wins, and the block ends at `Info`,
/// so free text cannot override a field.
pub fn parse_lock_info(output: &str) -> Option<LockInfo> {
    let text = super::follower::strip_ansi(output);
    let start = text.find("Lock Info:")?;
    let mut info = LockInfo::default();
    let mut seen = std::collections::HashSet::new();
    for line in text[start + "Lock Info:".len()..].lines().skip(1).take(12) {
        // Error lines of the new UI are prefixed with a box-drawing bar.
        let l = line
            .trim_start_matches(|c: char| c.is_whitespace() || c == '\u{2502}')
            .trim_end();
        let Some((k, v)) = l.split_once(':') else {
            continue;
        };
        let key = k.trim();
        if !seen.insert(key.to_string()) {
            continue;
        }
        let v = v.trim().to_string();
        match key {
            "ID" => info.id = v,
            "Path" => info.path = v,
            "Operation" => info.operation = v,
            "Who" => info.who = v,
            "Version" => info.version = v,
            "Created" => {
                info.created_ms = parse_go_time(&v);
                info.created = v;
            }
            "Info" => {
                info.info = v;
                break;
            }
            _ => continue,
        }
    }
    let fields = ["ID", "Who", "Created"];
    (fields.iter().all(|f| seen.contains(*f)) && !info.id.is_empty()).then_some(info)
}

/// Parses Go's time.Time String(): `2006-01-02 15:04:05.999999999 -0700 MST` into ms since the
/// epoch (the zone abbreviation is ignored; the numeric offset is authoritative).
pub fn parse_go_time(s: &str) -> Option<u64> {
    let mut parts = s.split_whitespace();
    let date = parts.next()?;
    let time = parts.next()?;
    let offset = parts.next().unwrap_or("+0000");
    // Fields are plain ASCII digits of bounded length: no sign, no overflow, no slicing inside
    // a multi-byte character (all found by fuzz/fuzz_targets/lockinfo.rs).
    let mut d = date.split('-');
    let (y, mo, da) = (
        digits(d.next()?, 4)?,
        digits(d.next()?, 2)?,
        digits(d.next()?, 2)?,
    );
    if d.next().is_some() || !(1..=12).contains(&mo) || !(1..=31).contains(&da) {
        return None;
    }
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':');
    let (h, mi, se) = (
        digits(t.next()?, 2)?,
        digits(t.next()?, 2)?,
        digits(t.next()?, 2)?,
    );
    if t.next().is_some() || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let frac_digits: String = frac
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .take(3)
        .collect();
    let ms_frac: i64 = format!("{frac_digits:0<3}").parse().ok()?;
    let (sign, off) = match offset.split_at_checked(1)? {
        ("+", off) => (1, off),
        ("-", off) => (-1, off),
        _ => return None,
    };
    if off.len() != 4 {
        return None;
    }
    let off_min = digits(off.get(..2)?, 2)? * 60 + digits(off.get(2..)?, 2)?;
    let days = days_from_civil(y, mo, da);
    let secs = days * 86400 + h * 3600 + mi * 60 + se - sign * off_min * 60;
    let ms = secs.checked_mul(1000)?.checked_add(ms_frac)?;
    u64::try_from(ms).ok()
}

/// `s` as a number when it is 1 to `max` ASCII digits.
fn digits(s: &str, max: usize) -> Option<i64> {
    if s.is_empty() || s.len() > max || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real terraform 1.0.3 outputs (tests/fixtures/terraform/lock, docs/notes/terraform-facts.md).
    macro_rules! fixture {
        ($name:literal) => {
            include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fixtures/terraform/lock/",
                $name
            ))
        };
    }

    #[test]
    fn real_probe_of_a_held_s3_lock_gives_its_lock_info() {
        for out in [
            fixture!("probe-held.stderr"),
            fixture!("probe-held-color.stderr"),
        ] {
            let Probe::Held(i) = parse_probe("s3", false, out) else {
                panic!("not held: {out:?}")
            };
            assert_eq!(i.id, "e7f9146b-c044-abab-c58c-2e409467401c");
            assert_eq!(i.path, "tfstate/tfinit/terraform.tfstate");
            assert_eq!(i.operation, "OperationTypeApply");
            assert_eq!(i.who, "root@vm");
            assert_eq!(i.version, "1.0.3");
            assert_eq!(i.created, "2026-11-21 23:56:11.330240859 +0000 UTC");
            // 2026-11-21T23:56:11.330Z
            assert_eq!(i.created_ms, Some(1_795_305_371_330));
            assert_eq!(i.info, "");
            assert!(plain_id(&i.id));
        }
    }

    #[test]
    fn real_probe_keeps_the_empty_user_of_a_uid_without_passwd_entry() {
        let Probe::Held(i) = parse_probe("s3", false, fixture!("probe-held-who-podx.stderr"))
        else {
            panic!()
        };
        assert_eq!(i.who, "@pod-x");
        assert_eq!(i.id, "e2b7f19a-9b4c-e624-55c2-9de7d0e67a50");
        assert_eq!(
            i.created_ms,
            parse_go_time("2026-11-22 00:04:15.817 +0000 UTC")
        );
    }

    #[test]
    fn real_probe_of_a_free_s3_lock_is_free() {
        assert_eq!(
            parse_probe("s3", false, fixture!("probe-free.stderr")),
            Probe::Free
        );
        assert_eq!(
            parse_probe("s3", false, fixture!("probe-free-color.stderr")),
            Probe::Free
        );
    }

    #[test]
    fn real_probe_failures_are_unknown_never_free() {
        for (name, out) in [
            ("endpoint down", fixture!("probe-endpoint-down.stderr")),
            ("not initialised", fixture!("probe-not-initialized.stderr")),
            // Local state: the same text whether held or free, so it says nothing.
            ("local", fixture!("local-probe-held.stderr")),
        ] {
            assert!(
                matches!(parse_probe("s3", false, out), Probe::Unknown(_)),
                "{name}"
            );
        }
        let Probe::Unknown(m) = parse_probe("s3", false, fixture!("probe-endpoint-down.stderr"))
        else {
            panic!()
        };
        assert!(m.contains("RequestError"), "{m}");
    }

    #[test]
    fn lock_errors_of_plan_and_apply_parse_in_every_format() {
        // The lock error of a run (not the probe) carries the same block, also in JSON detail
        // strings and behind the box-drawing bars of the colour UI.
        let json: serde_json::Value = fixture!("plan-locked-json.stdout")
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v["type"] == "diagnostic")
            .unwrap();
        let detail = json["diagnostic"]["detail"].as_str().unwrap();
        for out in [
            fixture!("plan-locked.stderr"),
            fixture!("plan-locked-color.stderr"),
            detail,
        ] {
            let i = parse_lock_info(out).expect(out);
            assert_eq!(i.who, "root@vm");
            assert!(i.created_ms.is_some());
            assert!(plain_id(&i.id));
        }
    }

    #[test]
    fn unlock_success_means_free_only_when_it_exited_zero() {
        let out = fixture!("unlock-real.stdout");
        assert_eq!(parse_probe("s3", true, out), Probe::Free);
        assert!(matches!(parse_probe("s3", false, out), Probe::Unknown(_)));
    }

    #[test]
    fn terraform_1_11s_free_s3_lock_is_free() {
        let out = "Failed to unlock state: failed to retrieve lock info for lock ID \"00000000-0000-0000-0000-000000000000\": unexpected end of JSON input\n";
        assert_eq!(parse_probe("s3", false, out), Probe::Free);
        let down = "Failed to unlock state: failed to retrieve lock info for lock ID \"00000000-0000-0000-0000-000000000000\": operation error DynamoDB: GetItem, exceeded maximum number of attempts, 3\n";
        assert!(matches!(parse_probe("s3", false, down), Probe::Unknown(_)));
        assert!(matches!(
            parse_probe("kubernetes", false, out),
            Probe::Unknown(_)
        ));
    }

    #[test]
    fn free_markers_of_other_backends_do_not_count() {
        assert!(matches!(
            parse_probe(
                "s3",
                false,
                "Failed to unlock state: state is already unlocked"
            ),
            Probe::Unknown(_)
        ));
        assert_eq!(
            parse_probe(
                "kubernetes",
                false,
                "Failed to unlock state: state is already unlocked\n"
            ),
            Probe::Free
        );
        assert_eq!(
            parse_probe(
                "azurerm",
                false,
                "Failed to unlock state: failed to retrieve lock info: blob metadata \"terraformlockid\" was empty\n"
            ),
            Probe::Free
        );
    }

    /// Real terraform 1.0.3 outputs against the Kubernetes API stand-in (tests/kubernetes.rs).
    const KUBE_HELD: &str = "\x1b[31mFailed to unlock state: lock id \"00000000-0000-0000-0000-000000000000\" does not match existing lock\nLock Info:\n  ID:        75d31e9b-8f04-dfee-fda1-f3ac3c66598f\n  Path:      \n  Operation: OperationTypeApply\n  Who:       root@vm\n  Version:   1.0.3\n  Created:   2026-11-23 08:39:46.320336062 +0000 UTC\n  Info:      \n\x1b[0m\x1b[0m\n";
    const KUBE_STATE_MISSING: &str = "\x1b[31mFailed to load state: the state is already locked by another terraform client\nLock Info:\n  ID:        11111111-2222-3333-4444-555555555555\n  Path:      \n  Operation: init\n  Who:       @pod-a\n  Version:   1.0.3\n  Created:   2026-11-23 08:39:46.320336062 +0000 UTC\n  Info:      \n\x1b[0m\x1b[0m\n";
    const S3_STATE_MISSING: &str = "Failed to load state: failed to lock s3 state: ConditionalCheckFailedException: The conditional request failed\nLock Info:\n  ID:        11111111-2222-3333-4444-555555555555\n  Path:      tfstate/env:/feature/tfinit/terraform.tfstate\n  Operation: init\n  Who:       @pod-a\n  Version:   1.0.3\n  Created:   2026-11-23 08:39:46.320336062 +0000 UTC\n  Info:      \n\n";
    const LEASE: &str = "lock-tfstate-default-tfinit";

    #[test]
    fn kubernetes_held_free_and_state_missing() {
        let Probe::Held(i) = parse_probe_of("kubernetes", Some(LEASE), false, KUBE_HELD) else {
            panic!()
        };
        assert_eq!(
            (i.id.as_str(), i.path.as_str()),
            ("75d31e9b-8f04-dfee-fda1-f3ac3c66598f", "")
        );
        for (backend, out) in [("kubernetes", KUBE_STATE_MISSING), ("s3", S3_STATE_MISSING)] {
            let Probe::HeldStateMissing(i) = parse_probe_of(backend, Some(LEASE), false, out)
            else {
                panic!("{backend}")
            };
            assert_eq!((i.who.as_str(), i.operation.as_str()), ("@pod-a", "init"));
        }
        assert_eq!(
            parse_probe_of(
                "kubernetes",
                Some(LEASE),
                false,
                "\x1b[31mFailed to unlock state: state is already unlocked\x1b[0m\x1b[0m\n"
            ),
            Probe::Free
        );
    }

    #[test]
    fn only_a_notfound_of_this_locks_own_lease_is_free() {
        let gone = "\x1b[31mFailed to unlock state: leases.coordination.k8s.io \"lock-tfstate-default-tfinit\" not found\x1b[0m\x1b[0m\n";
        assert_eq!(
            parse_probe_of("kubernetes", Some(LEASE), false, gone),
            Probe::Free
        );
        // Another Lease, no name to compare, another backend: cannot tell.
        for (backend, name) in [
            ("kubernetes", Some("lock-tfstate-staging-tfinit")),
            ("kubernetes", None),
            ("s3", Some(LEASE)),
        ] {
            assert!(
                matches!(
                    parse_probe_of(backend, name, false, gone),
                    Probe::Unknown(_)
                ),
                "{backend} {name:?}"
            );
        }
        // What terraform prints for a missing namespace, a Forbidden, an unreachable server, a
        // missing Secret: never free, and the message has no escape codes.
        for out in [
            "\x1b[31mFailed to load state: namespaces \"tfinit\" not found\x1b[0m\x1b[0m\n",
            "\x1b[31mFailed to unlock state: leases.coordination.k8s.io \"lock-tfstate-default-tfinit\" is forbidden: User \"system:serviceaccount:tfinit:controller\" cannot get resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"tfinit\"\x1b[0m\x1b[0m\n",
            "\x1b[31mFailed to load state: secrets \"tfstate-default-tfinit\" is forbidden: User \"system:serviceaccount:tfinit:controller\" cannot get resource \"secrets\" in API group \"\" in the namespace \"tfinit\"\x1b[0m\x1b[0m\n",
            "\x1b[31mFailed to load state: Get \"http://127.0.0.1:1/api/v1/namespaces/tfinit/secrets/tfstate-default-tfinit\": dial tcp 127.0.0.1:1: connect: connection refused\x1b[0m\x1b[0m\n",
            "\x1b[31mFailed to unlock state: secrets \"tfstate-default-tfinit\" not found\x1b[0m\x1b[0m\n",
        ] {
            let Probe::Unknown(m) = parse_probe_of("kubernetes", Some(LEASE), false, out) else {
                panic!("{out}")
            };
            assert!(!m.contains('\x1b') && m.starts_with("Failed to"), "{m:?}");
        }
    }

    #[test]
    fn quoted_lines_have_no_escape_codes() {
        assert_eq!(
            first_line("\n\x1b[31mFailed to load state: x\x1b[0m\x1b[0m\nLock Info:\n"),
            "Failed to load state: x"
        );
        assert_eq!(first_line(""), "no output");
        assert_eq!(first_line(&"é".repeat(400)).chars().count(), 300);
    }

    #[test]
    fn gcs_dummy_lock_info_of_a_missing_lock_is_free() {
        let out = "Failed to unlock state: 1 error occurred:\n\t* storage: object doesn't exist\n\n\nLock Info:\n  ID:        -9223372036854775808\n  Path:      \n  Operation: \n  Who:       @pod-b\n  Version:   1.0.3\n  Created:   2026-11-22 00:00:00 +0000 UTC\n  Info:      \n\n";
        assert_eq!(parse_probe("gcs", false, out), Probe::Free);
    }

    #[test]
    fn free_text_after_info_cannot_override_fields() {
        let out = "Lock Info:\n  ID:        abc\n  Path:      p\n  Operation: OperationTypeApply\n  Who:       @pod-a\n  Version:   1.0.3\n  Created:   2026-11-22 00:00:00 +0000 UTC\n  Info:      x\n  Who:       @evil\n  ID:        other\n";
        let i = parse_lock_info(out).unwrap();
        assert_eq!((i.id.as_str(), i.who.as_str()), ("abc", "@pod-a"));
        assert!(
            parse_lock_info("Lock Info:\n  ID: x\n").is_none(),
            "Who and Created are required"
        );
    }

    #[test]
    fn go_times() {
        assert_eq!(parse_go_time("1970-01-01 00:00:00 +0000 UTC"), Some(0));
        assert_eq!(parse_go_time("1970-01-01 01:00:00.5 +0100 CET"), Some(500));
        assert_eq!(
            parse_go_time("2024-02-29 12:00:00 +0000 UTC"),
            Some(1_709_208_000_000)
        );
        assert_eq!(
            parse_go_time("2026-11-22 00:03:48.43198284 +0000 UTC"),
            Some(1_795_305_828_431)
        );
        assert_eq!(parse_go_time("garbage"), None);
        // Found by fuzzing: a multi-byte character in the offset, a huge year, signs.
        assert_eq!(parse_go_time("0999-12-31 23:59:00 +0\u{fffd}"), None);
        assert_eq!(parse_go_time("2024-01-01 00:00:00 +1\u{e9}1 UTC"), None);
        assert_eq!(
            parse_go_time("9223372036854775807-01-01 00:00:00 +0000 UTC"),
            None
        );
        assert_eq!(parse_go_time("2024-01-01 -1:00:00 +0000 UTC"), None);
        assert_eq!(parse_go_time("2024-+1-01 00:00:00 +0000 UTC"), None);
        assert_eq!(
            parse_go_time("0001-01-01 00:00:00 +0000 UTC"),
            None,
            "before 1970"
        );
        assert_eq!(parse_go_time("2024-13-01 00:00:00 +0000 UTC"), None);
    }

    #[test]
    fn plain_ids() {
        assert!(plain_id("5e1d6a0c-4f0b-2b3a-9f1e-0123456789ab"));
        assert!(plain_id("1700000000000000"));
        assert!(!plain_id("-force"));
        assert!(!plain_id(GCS_NO_LOCK_ID));
        assert!(!plain_id("a b"));
        assert!(!plain_id("x;rm -rf /"));
        assert!(!plain_id(""));
    }
}

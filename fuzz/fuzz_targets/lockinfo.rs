//! The Lock Info parser (`tfinit::locks::lockinfo`): what `terraform force-unlock` prints decides
//! whether a lock is released, so any output must parse without a panic, consistently, and a
//! Lock Info block as terraform prints it must give back exactly its fields; `parse_go_time`
//! must agree with a reference (chrono) on every valid time Go's `time.Time.String()` prints.
//!
//! Input: the probe's output as bytes (lossily UTF-8). The same bytes also drive a generated
//! Lock Info block and time (through `arbitrary`).
#![no_main]

use chrono::NaiveDate;
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use tfinit::locks::lockinfo::{parse_go_time, parse_lock_info, parse_probe, LockInfo, Probe};

const BACKENDS: [&str; 6] = ["s3", "kubernetes", "azurerm", "gcs", "local", "consul"];

/// Characters of generated field values: printable, some multi-byte, a colon, a bar, spaces.
const ALPHABET: &[char] = &[
    'a', 'z', 'A', 'Z', '0', '9', '-', '_', '.', '/', '@', ':', ' ', '=', '"', '│', 'é', '日', '[',
    ']',
];

/// A field value as terraform prints it: no line break, no escape, no whitespace at either end.
fn value(u: &mut Unstructured<'_>, max: usize) -> Result<String> {
    let n = u.int_in_range(0..=max)?;
    let mut s = String::new();
    for _ in 0..n {
        s.push(*u.choose(ALPHABET)?);
    }
    Ok(s.trim().to_string())
}

/// A time as Go's `Time.String()` prints it, and its Unix milliseconds by the reference.
fn go_time(u: &mut Unstructured<'_>) -> Result<(String, Option<u64>)> {
    let y: i32 = u.int_in_range(1..=9999)?;
    let mo: u32 = u.int_in_range(1..=12)?;
    let d: u32 = u.int_in_range(1..=31)?;
    let Some(date) = NaiveDate::from_ymd_opt(y, mo, d) else {
        return go_time_fixed();
    };
    let (h, mi, s): (u32, u32, u32) = (
        u.int_in_range(0..=23)?,
        u.int_in_range(0..=59)?,
        u.int_in_range(0..=59)?,
    );
    let nanos: u32 = u.int_in_range(0..=999_999_999)?;
    let off_min: i64 = u.int_in_range(-12 * 60..=14 * 60)?;
    let zone = *u.choose(&["UTC", "CET", "PST", "+0530", "-03", ""])?;
    let mono = u.ratio(1, 8)?;
    let naive = date.and_hms_nano_opt(h, mi, s, nanos).expect("valid time");
    let ms = naive.and_utc().timestamp_millis() - off_min * 60_000;
    // Go: fraction with trailing zeros removed, no dot when zero; offset ±hhmm; zone name.
    let mut frac = format!("{nanos:09}");
    while frac.ends_with('0') {
        frac.pop();
    }
    let frac = if frac.is_empty() {
        String::new()
    } else {
        format!(".{frac}")
    };
    let sign = if off_min < 0 { '-' } else { '+' };
    let mut text = format!(
        "{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02}{frac} {sign}{:02}{:02}",
        off_min.abs() / 60,
        off_min.abs() % 60
    );
    if !zone.is_empty() {
        text.push(' ');
        text.push_str(zone);
    }
    if mono {
        text.push_str(" m=+0.004108193");
    }
    Ok((text, u64::try_from(ms).ok()))
}

fn go_time_fixed() -> Result<(String, Option<u64>)> {
    Ok((
        "2026-11-21 23:56:11.330240859 +0000 UTC".into(),
        Some(1_795_305_371_330),
    ))
}

/// A Lock Info block as terraform prints it (plain, colored, or in the new UI's error box).
fn block(u: &mut Unstructured<'_>) -> Result<(String, LockInfo)> {
    let (created, created_ms) = go_time(u)?;
    let mut id = value(u, 40)?;
    if id.is_empty() {
        id = "e7f9146b-c044-abab-c58c-2e409467401c".into();
    }
    let info = LockInfo {
        id,
        path: value(u, 40)?,
        operation: value(u, 24)?,
        who: value(u, 24)?,
        version: value(u, 8)?,
        created,
        created_ms,
        info: value(u, 24)?,
    };
    let bar = if u.ratio(1, 3)? { "│ " } else { "" };
    let (on, off) = if u.ratio(1, 3)? {
        ("\x1b[31m", "\x1b[0m\x1b[0m")
    } else {
        ("", "")
    };
    let pad = |k: &str| format!("{bar}  {k}:{}", " ".repeat(11 - k.len()));
    let text = format!(
        "{on}{bar}Failed to unlock state: lock id \"00000000-0000-0000-0000-000000000000\" does not match existing lock\n\
         {bar}Lock Info:\n\
         {}{}\n{}{}\n{}{}\n{}{}\n{}{}\n{}{}\n{}{}\n{off}\n\
         {bar}Terraform acquires a lock when accessing your state to prevent others\n",
        pad("ID"), info.id, pad("Path"), info.path, pad("Operation"), info.operation,
        pad("Who"), info.who, pad("Version"), info.version, pad("Created"), info.created,
        pad("Info"), info.info,
    );
    Ok((text, info))
}

fuzz_target!(|data: &[u8]| {
    // Whatever terraform (or something in its place) printed.
    let text = String::from_utf8_lossy(data);
    let parsed = parse_lock_info(&text);
    if let Some(i) = &parsed {
        assert!(!i.id.is_empty(), "a lock without an id");
    }
    let exited_zero = data.first().is_some_and(|b| b & 1 == 1);
    for backend in BACKENDS {
        match parse_probe(backend, exited_zero, &text) {
            // The probe's verdict agrees with the block parser: held exactly when a block parses.
            Probe::Held(i) | Probe::HeldStateMissing(i) => {
                assert_eq!(Some(&i), parsed.as_ref());
            }
            Probe::Free => assert!(
                parsed.is_none(),
                "free although a lock block parsed: {parsed:?}"
            ),
            Probe::Unreadable(first) | Probe::Unknown(first) => {
                assert!(parsed.is_none());
                assert!(first.chars().count() <= 300, "an unbounded message");
            }
        }
    }
    for line in text.lines() {
        let _ = parse_go_time(line);
        if let Some((_, v)) = line.split_once(':') {
            let _ = parse_go_time(v.trim());
        }
    }

    // Generated: a valid time agrees with the reference, and a whole block reads back exactly.
    let mut u = Unstructured::new(data);
    if let Ok((t, want)) = go_time(&mut u) {
        assert_eq!(parse_go_time(&t), want, "parse_go_time({t:?})");
    }
    if let Ok((out, want)) = block(&mut u) {
        assert_eq!(parse_lock_info(&out).as_ref(), Some(&want), "block:\n{out}");
        assert_eq!(parse_probe("s3", false, &out), Probe::Held(want.clone()));
        // The same block after other output that mentions no lock.
        let noisy =
            format!("Acquiring state lock. This may take a few moments...\nError: x: y\n{out}");
        assert_eq!(parse_lock_info(&noisy), Some(want));
    }
});

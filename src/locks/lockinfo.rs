//! Reads what `terraform force-unlock -force <id that cannot match>` prints: the current holder's
//! Lock Info (a read-only probe for the backends whose Unlock compares the id first), or that the
//! lock is free, or neither (an error we do not understand: then nothing is touched).

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
    /// Nobody holds it.
    Free,
    /// Could not tell (network, credentials, an unknown message): touch nothing.
    Unknown(String),
}

/// Messages that mean "no lock is held", by backend, from terraform's source
/// (internal/backend/remote-state/*/client.go Unlock/getLockInfo). Matched only when no Lock
/// Info block was printed.
const FREE_MARKERS: [(&str, &str); 4] = [
    // s3 (DynamoDB): the lock item is missing, so its Info attribute is empty JSON.
    (
        "s3",
        "failed to retrieve lock info: unexpected end of JSON input",
    ),
    // kubernetes: the Lease has no holder.
    ("kubernetes", "state is already unlocked"),
    // azurerm: the blob has no lock metadata.
    ("azurerm", "failed to retrieve lock info: Blob not locked"),
    // gcs: the lock object does not exist.
    ("gcs", "storage: object doesn't exist"),
];

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

/// Parses the probe's combined output for `backend`.
pub fn parse_probe(backend: &str, output: &str) -> Probe {
    if let Some(info) = parse_lock_info(output) {
        return Probe::Held(info);
    }
    let flat = strip_ansi(output);
    if FREE_MARKERS
        .iter()
        .any(|(b, m)| *b == backend && flat.contains(m))
    {
        return Probe::Free;
    }
    let first = flat
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("no output");
    Probe::Unknown(first.chars().take(300).collect())
}

/// Parses a `Lock Info:` block anywhere in `output`.
pub fn parse_lock_info(output: &str) -> Option<LockInfo> {
    let text = strip_ansi(output);
    let start = text.find("Lock Info:")?;
    let mut info = LockInfo::default();
    let mut seen = 0;
    for line in text[start + "Lock Info:".len()..].lines().take(12) {
        // Error lines of the new UI are prefixed with a box-drawing bar.
        let l = line
            .trim_start_matches(|c: char| c.is_whitespace() || c == '│')
            .trim_end();
        let Some((k, v)) = l.split_once(':') else {
            continue;
        };
        let v = v.trim().to_string();
        match k.trim() {
            "ID" => info.id = v,
            "Path" => info.path = v,
            "Operation" => info.operation = v,
            "Who" => info.who = v,
            "Version" => info.version = v,
            "Created" => {
                info.created_ms = parse_go_time(&v);
                info.created = v;
            }
            "Info" => info.info = v,
            _ => continue,
        }
        seen += 1;
    }
    (seen >= 4 && !info.id.is_empty()).then_some(info)
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.next() == Some('[') {
                for c2 in chars.by_ref() {
                    if ('@'..='~').contains(&c2) {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// Parses Go's time.Time String(): `2006-01-02 15:04:05.999999999 -0700 MST` into ms since the
/// epoch (the zone abbreviation is ignored; the numeric offset is authoritative).
pub fn parse_go_time(s: &str) -> Option<u64> {
    let mut parts = s.split_whitespace();
    let date = parts.next()?;
    let time = parts.next()?;
    let offset = parts.next().unwrap_or("+0000");
    let mut d = date.split('-');
    let (y, mo, da): (i64, i64, i64) = (
        d.next()?.parse().ok()?,
        d.next()?.parse().ok()?,
        d.next()?.parse().ok()?,
    );
    if d.next().is_some() || !(1..=12).contains(&mo) || !(1..=31).contains(&da) {
        return None;
    }
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':');
    let (h, mi, se): (i64, i64, i64) = (
        t.next()?.parse().ok()?,
        t.next()?.parse().ok()?,
        t.next()?.parse().ok()?,
    );
    if h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let frac_digits: String = frac
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .take(3)
        .collect();
    let ms_frac: i64 = format!("{frac_digits:0<3}").parse().ok()?;
    let sign = match offset.as_bytes().first()? {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let off = &offset[1..];
    if off.len() != 4 {
        return None;
    }
    let off_min: i64 = off[..2].parse::<i64>().ok()? * 60 + off[2..].parse::<i64>().ok()?;
    let days = days_from_civil(y, mo, da);
    let secs = days * 86400 + h * 3600 + mi * 60 + se - sign * off_min * 60;
    let ms = secs.checked_mul(1000)?.checked_add(ms_frac)?;
    u64::try_from(ms).ok()
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

    const HELD: &str = "\nError: Failed to unlock state: lock id \"00000000-0000-0000-0000-000000000000\" does not match existing lock\n\nLock Info:\n  ID:        5e1d6a0c-4f0b-2b3a-9f1e-0123456789ab\n  Path:      tfstate/x/terraform.tfstate\n  Operation: OperationTypeApply\n  Who:       @pod-a\n  Version:   1.0.3\n  Created:   2026-11-21 23:59:59.123456789 +0000 UTC\n  Info:      \n\n";

    #[test]
    fn parses_held_lock() {
        let Probe::Held(i) = parse_probe("s3", HELD) else {
            panic!()
        };
        assert_eq!(i.id, "5e1d6a0c-4f0b-2b3a-9f1e-0123456789ab");
        assert_eq!(i.who, "@pod-a");
        assert_eq!(i.operation, "OperationTypeApply");
        assert_eq!(i.created_ms, Some(1_795_305_599_123));
    }

    #[test]
    fn free_and_unknown() {
        assert_eq!(
            parse_probe("s3", "Failed to unlock state: failed to retrieve lock info: unexpected end of JSON input\n"),
            Probe::Free
        );
        assert!(matches!(
            parse_probe("s3", "Error: NoCredentialProviders\n"),
            Probe::Unknown(_)
        ));
        // A free-marker of another backend does not count.
        assert!(matches!(
            parse_probe("s3", "state is already unlocked"),
            Probe::Unknown(_)
        ));
    }

    #[test]
    fn go_times() {
        assert_eq!(parse_go_time("1970-01-01 00:00:00 +0000 UTC"), Some(0));
        assert_eq!(parse_go_time("1970-01-01 01:00:00.5 +0100 CET"), Some(500));
        assert_eq!(
            parse_go_time("2024-02-29 12:00:00 +0000 UTC"),
            Some(1_709_208_000_000)
        );
        assert_eq!(parse_go_time("garbage"), None);
        assert_eq!(parse_go_time("2024-13-01 00:00:00 +0000 UTC"), None);
    }

    #[test]
    fn plain_ids() {
        assert!(plain_id("5e1d6a0c-4f0b-2b3a-9f1e-0123456789ab"));
        assert!(plain_id("1700000000000000"));
        assert!(!plain_id("-force"));
        assert!(!plain_id("a b"));
        assert!(!plain_id("x;rm -rf /"));
        assert!(!plain_id(""));
    }
}

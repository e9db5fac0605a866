//! terraform's output as text: plain lines without escape codes or diagnostic frames, the answer
//! in it, its first line to quote, the `Lock Info:` block, and the Go time in its `Created`.

use super::wordings::{NOT_THE_LOCK, UNLOCK_FAILED};
use super::LockInfo;

/// terraform's output as plain lines: escape codes removed, and the frame that terraform's
/// diagnostics and every OpenTofu 1.12+ error are drawn in (`╷`, `│ `, `╵`) taken off.
pub(super) fn plain(output: &str) -> String {
    let flat = crate::locks::follower::strip_ansi(output);
    let mut out = String::with_capacity(flat.len());
    for line in flat.lines() {
        if matches!(line.trim_end(), "╷" | "╵") {
            continue;
        }
        let line = line
            .strip_prefix('│')
            .map(|l| l.strip_prefix(' ').unwrap_or(l))
            .unwrap_or(line);
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The answer in `text` (plain): from the first line that begins (after any `Error: `) with
/// `Failed to unlock state: ` or one of [`NOT_THE_LOCK`], to the end, without trailing blank
/// lines. Warnings printed before it are not part of it.
pub(super) fn message(text: &str) -> Option<String> {
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        let body = line.strip_prefix("Error: ").unwrap_or(line);
        if body.starts_with(UNLOCK_FAILED) || NOT_THE_LOCK.iter().any(|p| body.starts_with(p)) {
            let from = at + (line.len() - body.len());
            return Some(text[from..].trim_end().to_string());
        }
        at += line.len();
    }
    None
}

/// The first non-empty line of terraform's `output`, without escape codes or a diagnostic's
/// frame, at most 300 characters: what a message quotes of it.
pub fn first_line(output: &str) -> String {
    let flat = plain(output);
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
    let text = crate::locks::follower::strip_ansi(output);
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
    let days = crate::calendar::days_from_civil(y, mo, da);
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

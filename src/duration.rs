//! Durations as people write them in settings (`30s`, `5m`, `1h30m`, `250ms`, plain seconds) and
//! as tfinit writes them in messages.

use std::time::Duration;

/// Parses `30s`, `5m`, `1h30m`, `250ms` or plain seconds (`30`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("empty duration".into());
    }
    // Digits only: u64's parser would also take a sign (`+30`), which no documented form has.
    if t.bytes().all(|b| b.is_ascii_digit()) {
        return t
            .parse::<u64>()
            .map_err(|_| overflows(t))
            .and_then(checked_secs);
    }
    let mut total_ms: u128 = 0;
    let mut rest = t;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!("expected a number at {rest:?}"));
        }
        let n: u128 = rest[..digits].parse().map_err(|_| overflows(t))?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let ms_per = match unit {
            "ms" => 1,
            "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            "" => return Err("a number needs a unit when more follow".into()),
            other => return Err(format!("unknown unit {other:?} (use ms, s, m or h)")),
        };
        total_ms = n
            .checked_mul(ms_per)
            .and_then(|ms| total_ms.checked_add(ms))
            .ok_or_else(|| overflows(t))?;
    }
    if total_ms > MAX_DURATION.as_millis() {
        return Err("longer than a year".into());
    }
    Ok(Duration::from_millis(total_ms as u64))
}

/// Durations beyond this are refused: a grace period of years is a typo.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// The problem of a duration `text` too large for any number to hold: said as such, since
/// "a number needs a unit" or "unknown unit" would send the reader looking for the wrong fault.
fn overflows(text: &str) -> String {
    format!("{text} overflows: a duration is at most a year (8760h)")
}

fn checked_secs(secs: u64) -> Result<Duration, String> {
    if secs > MAX_DURATION.as_secs() {
        return Err("longer than a year".into());
    }
    Ok(Duration::from_secs(secs))
}

/// Formats a duration as `1h30m`, `45s`, `250ms`.
pub fn fmt_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms % 1000 != 0 {
        return format!("{ms}ms");
    }
    let s = ms / 1000;
    let (h, m, s) = (s / 3600, (s / 60) % 60, s % 60);
    let mut out = String::new();
    if h > 0 {
        out += &format!("{h}h");
    }
    if m > 0 {
        out += &format!("{m}m");
    }
    if s > 0 || out.is_empty() {
        out += &format!("{s}s");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration(" 2s "), Ok(Duration::from_secs(2)));
        for bad in [
            "",
            "-1",
            "1.5s",
            "s",
            "10x",
            "1h30",
            "99999999999999999999",
            "9999h",
            "30 s",
            "+30",
            "+30s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn a_number_too_large_for_any_duration_is_said_to_overflow() {
        for huge in [
            "99999999999999999999",
            "99999999999999999999999999",
            "99999999999999999999999999999999999999999s",
            "340282366920938463463374607431768211455h",
            "1h9999999999999999999999999999999999999999ms",
        ] {
            let e = parse_duration(huge).unwrap_err();
            assert!(
                e.contains("overflows") && e.contains("at most a year"),
                "{huge}: {e}"
            );
        }
        // Within what a number holds but over the bound: named as the bound.
        assert_eq!(parse_duration("9999h").unwrap_err(), "longer than a year");
        assert_eq!(parse_duration("8760h"), Ok(MAX_DURATION));
    }

    #[test]
    fn formats_durations() {
        assert_eq!(fmt_duration(Duration::from_secs(5400)), "1h30m");
        assert_eq!(fmt_duration(Duration::from_secs(0)), "0s");
        assert_eq!(fmt_duration(Duration::from_millis(1500)), "1500ms");
    }
}

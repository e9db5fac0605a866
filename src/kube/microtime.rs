//! The API's `MicroTime`: an RFC 3339 time in UTC with microseconds
//! (`2006-01-02T15:04:05.000000Z`), as Leases carry `acquireTime` and `renewTime`. What the
//! server writes is always that form; a time with another offset or precision (RFC 3339 allows
//! both) is read too.
//!
//! These are the writer's wall clock: a record of what a holder said, never a measure of how old
//! a Lease is on another machine (a safety decision judges what it saw change on its own
//! monotonic clock).

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::calendar::{civil_from_days, days_from_civil};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A point in time to the microsecond, UTC, years 0000 to 9999.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MicroTime {
    /// Microseconds since 1970-01-01T00:00:00Z.
    micros: i64,
}

/// 0000-01-01T00:00:00Z and 9999-12-31T23:59:59.999999Z, in microseconds since the epoch.
const MIN_MICROS: i64 = -62_167_219_200_000_000;
const MAX_MICROS: i64 = 253_402_300_799_999_999;

impl MicroTime {
    /// This machine's wall clock now.
    pub fn now() -> MicroTime {
        MicroTime::from_system_time(SystemTime::now())
    }

    /// The time `micros` microseconds after the Unix epoch (clamped to years 0000-9999).
    pub fn from_unix_micros(micros: i64) -> MicroTime {
        MicroTime {
            micros: micros.clamp(MIN_MICROS, MAX_MICROS),
        }
    }

    /// Microseconds since the Unix epoch.
    pub fn unix_micros(self) -> i64 {
        self.micros
    }

    /// The same time as a `SystemTime` (to the microsecond).
    pub fn from_system_time(t: SystemTime) -> MicroTime {
        let micros = match t.duration_since(UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_micros()).unwrap_or(i64::MAX),
            Err(e) => i64::try_from(e.duration().as_micros()).map_or(i64::MIN, |m| -m),
        };
        MicroTime::from_unix_micros(micros)
    }

    /// This time as a `SystemTime`.
    pub fn to_system_time(self) -> SystemTime {
        let magnitude = Duration::from_micros(self.micros.unsigned_abs());
        if self.micros >= 0 {
            UNIX_EPOCH + magnitude
        } else {
            UNIX_EPOCH - magnitude
        }
    }

    /// Reads an RFC 3339 time: `YYYY-MM-DDTHH:MM:SS`, an optional fraction of up to nine
    /// digits (cut to microseconds), and `Z` or `+HH:MM`/`-HH:MM`.
    pub fn parse(s: &str) -> Result<MicroTime, String> {
        let bad =
            || format!("{s:?} is not an RFC 3339 time (for example 2026-11-26T13:45:00.000000Z)");
        let b = s.as_bytes();
        if b.len() < 20 {
            return Err(bad());
        }
        let num = |from: usize, len: usize| -> Result<i64, String> {
            let part = b.get(from..from + len).ok_or_else(bad)?;
            if !part.iter().all(u8::is_ascii_digit) {
                return Err(bad());
            }
            Ok(part.iter().fold(0, |n, d| n * 10 + i64::from(d - b'0')))
        };
        let sep = |at: usize, want: &[u8]| b.get(at).is_some_and(|c| want.contains(c));
        if !(sep(4, b"-") && sep(7, b"-") && sep(10, b"Tt") && sep(13, b":") && sep(16, b":")) {
            return Err(bad());
        }
        let (year, month, day) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
        let (hour, minute, second) = (num(11, 2)?, num(14, 2)?, num(17, 2)?);
        if !(1..=12).contains(&month)
            || day < 1
            || day > days_in_month(year, month)
            || hour > 23
            || minute > 59
            || second > 59
        {
            return Err(bad());
        }
        let mut at = 19;
        let mut micros = 0;
        if b[at] == b'.' {
            let digits = b[at + 1..]
                .iter()
                .take_while(|c| c.is_ascii_digit())
                .count();
            if digits == 0 || digits > 9 {
                return Err(bad());
            }
            let frac = num(at + 1, digits)?;
            micros = match digits {
                1..=6 => frac * 10_i64.pow(6 - digits as u32),
                _ => frac / 10_i64.pow(digits as u32 - 6),
            };
            at += 1 + digits;
        }
        let offset_minutes = match &b[at..] {
            [b'Z' | b'z'] => 0,
            [sign @ (b'+' | b'-'), _, _, b':', _, _] => {
                let (h, m) = (num(at + 1, 2)?, num(at + 4, 2)?);
                if h > 23 || m > 59 {
                    return Err(bad());
                }
                let total = h * 60 + m;
                if *sign == b'+' {
                    total
                } else {
                    -total
                }
            }
            _ => return Err(bad()),
        };
        let days = days_from_civil(year, month, day);
        let seconds = days * 86_400 + hour * 3_600 + minute * 60 + second - offset_minutes * 60;
        let total = seconds * 1_000_000 + micros;
        if !(MIN_MICROS..=MAX_MICROS).contains(&total) {
            return Err(bad());
        }
        Ok(MicroTime { micros: total })
    }
}

impl fmt::Display for MicroTime {
    /// `2026-11-26T13:45:00.123456Z`, the server's form.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let seconds = self.micros.div_euclid(1_000_000);
        let micros = self.micros.rem_euclid(1_000_000);
        let days = seconds.div_euclid(86_400);
        let of_day = seconds.rem_euclid(86_400);
        let (year, month, day) = civil_from_days(days);
        write!(
            f,
            "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{micros:06}Z",
            of_day / 3_600,
            of_day % 3_600 / 60,
            of_day % 60
        )
    }
}

impl Serialize for MicroTime {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MicroTime {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<MicroTime, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        MicroTime::parse(&text).map_err(serde::de::Error::custom)
    }
}

fn is_leap(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_servers_form_reads_and_writes_back_the_same() {
        for s in [
            "1970-01-01T00:00:00.000000Z",
            "2026-11-26T13:45:00.123456Z",
            "2000-02-29T23:59:59.999999Z",
            "1969-12-31T23:59:59.999999Z",
            "0000-01-01T00:00:00.000000Z",
            "9999-12-31T23:59:59.999999Z",
        ] {
            let t = MicroTime::parse(s).unwrap();
            assert_eq!(t.to_string(), s);
        }
        assert_eq!(
            MicroTime::parse("1970-01-01T00:00:01.5Z")
                .unwrap()
                .unix_micros(),
            1_500_000
        );
    }

    #[test]
    fn offsets_and_other_precisions_are_read_as_rfc_3339_says() {
        let a = MicroTime::parse("2026-11-26T14:45:00+01:00").unwrap();
        let b = MicroTime::parse("2026-11-26T13:45:00.000000Z").unwrap();
        assert_eq!(a, b);
        let c = MicroTime::parse("2026-11-26T13:45:00.123456789Z").unwrap();
        assert_eq!(c.to_string(), "2026-11-26T13:45:00.123456Z");
        let d = MicroTime::parse("2026-11-26T10:15:00-03:30").unwrap();
        assert_eq!(d, b);
    }

    #[test]
    fn garbage_and_impossible_dates_are_refused() {
        for s in [
            "",
            "yesterday",
            "2026-11-26",
            "2026-11-26T13:45:00",
            "2026-13-01T00:00:00Z",
            "2026-02-29T00:00:00Z",
            "2026-11-26T24:00:00Z",
            "2026-11-26T13:45:00.Z",
            "2026-11-26T13:45:00.1234567890Z",
            "2026-11-26T13:45:00+0100",
            "2026-11-26T13:45:00Z ",
            "+026-11-26T13:45:00Z",
        ] {
            assert!(MicroTime::parse(s).is_err(), "{s:?} was read");
        }
    }

    #[test]
    fn system_times_round_trip_to_the_microsecond() {
        let now = SystemTime::now();
        let t = MicroTime::from_system_time(now);
        let back = t.to_system_time();
        let diff = now.duration_since(back).unwrap();
        assert!(diff < Duration::from_micros(1), "{diff:?}");
        let before = UNIX_EPOCH - Duration::from_micros(1);
        assert_eq!(MicroTime::from_system_time(before).unix_micros(), -1);
        assert_eq!(MicroTime::from_unix_micros(-1).to_system_time(), before);
    }

    #[test]
    fn serde_uses_the_text_form() {
        let t = MicroTime::from_unix_micros(1_500_000);
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(json, "\"1970-01-01T00:00:01.500000Z\"");
        assert_eq!(serde_json::from_str::<MicroTime>(&json).unwrap(), t);
        assert!(serde_json::from_str::<MicroTime>("\"soon\"").is_err());
    }
}

//! What tfinit's names may be: run ids, owner names and workspace names, which all become parts
//! of file names in the state directory or arguments of terraform, and how long an owner name may
//! get so that every file name made of it fits in a file system.

use std::fmt;

/// A terraform run's id in this init: `r7` in logs, `tfinit status`, the shim's exit note and the
/// record's `run_id` (kept as that text on disk: a record read back is checked with
/// [`valid_run_id`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunId(u64);

impl RunId {
    /// The id of an init's first run, `r1`.
    pub const FIRST: RunId = RunId(1);

    /// The id of the run after this one.
    pub fn next(self) -> RunId {
        RunId(self.0 + 1)
    }

    /// Its number: 7 for `r7`.
    pub fn number(self) -> u64 {
        self.0
    }

    /// The id `s` writes, when it is one this init could have given (a u64), in the one form the
    /// init writes it (`r7`): `r007` is refused rather than read as `r7`, so that an id typed by
    /// hand names exactly the run `tfinit status` showed, never another one.
    pub fn parse(s: &str) -> Option<RunId> {
        let n = s.strip_prefix('r').filter(|_| valid_run_id(s))?;
        let id = n.parse().ok().map(RunId)?;
        (id.to_string() == s).then_some(id)
    }
}

impl From<u64> for RunId {
    fn from(n: u64) -> RunId {
        RunId(n)
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "r{}", self.0)
    }
}

/// Whether `s` is a run id as the init writes them: `r` and a decimal u64 (at most 20 digits).
pub fn valid_run_id(s: &str) -> bool {
    s.strip_prefix('r')
        .is_some_and(|n| (1..=20).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether `s` can be a terraform workspace name (terraform allows URL path segment characters).
pub fn valid_workspace(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 255
        && !s.starts_with('-')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '~' | '+'))
}

/// Whether `s` can name an owner in a record or heartbeat read back (it is part of file names in
/// the state directory). Up to 253 bytes, as any tfinit accepted before [`MAX_OWNER_LEN`]: a
/// record is not corrupt for a name this init would refuse at start.
pub fn valid_owner(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        && !s.starts_with('.')
}

/// What is wrong with `s` as this init's owner name, if anything: it must be a [`valid_owner`]
/// and at most [`MAX_OWNER_LEN`] bytes, so that every file name tfinit makes of it fits in the
/// 255 bytes a file system takes.
pub fn owner_problem(s: &str) -> Option<String> {
    if s.len() > MAX_OWNER_LEN {
        return Some(format!(
            "is {} bytes long; an owner name may have at most {MAX_OWNER_LEN}, so that the names of its files in TFINIT_STATE_DIR fit in 255 bytes",
            s.len()
        ));
    }
    (!valid_owner(s)).then(|| {
        format!(
            "must be 1 to {MAX_OWNER_LEN} characters of letters, digits, '.', '-' or '_', not starting with '.'"
        )
    })
}

/// The longest file name Linux file systems take (NAME_MAX: ext4, xfs, tmpfs, overlayfs, NFS).
pub(super) const NAME_MAX: usize = 255;
/// Decimal digits of the largest u64 (`18446744073709551615`).
const U64_DIGITS: usize = 20;
/// Decimal digits of the largest u32.
const U32_DIGITS: usize = 10;
/// Characters of the longest i32 (`-2147483648`): a record read back may carry any pid, and a
/// recovery writes such a record under its own name (`needs_person`).
const I32_CHARS: usize = 11;
/// `Owner::incarnation`: `<8 hex of the boot id, or noboot>-<started_ms>-<pid>-<8 hex nonce>`.
pub(super) const INCARNATION_MAX: usize = 8 + 1 + U64_DIGITS + 1 + I32_CHARS + 1 + 8;
/// A run id: `r<u64>` ([`valid_run_id`]).
const RUN_ID_MAX: usize = 1 + U64_DIGITS;
/// `store::fsio::unique_suffix`: `<pid u32>.<ms u64>.<nanoseconds < 10^9>.<counter u64>`.
pub(super) const SUFFIX_MAX: usize = U32_DIGITS + 1 + U64_DIGITS + 1 + 9 + 1 + U64_DIGITS;
/// What `store::fsio::temp_path` adds to a name: `.<name>.tmp.<suffix>`.
const TEMP_EXTRA: usize = 1 + ".tmp.".len() + SUFFIX_MAX;
/// What `FileStore::path_of` adds to the owner name: `<owner>.<incarnation>.<run>.json`.
const RECORD_EXTRA: usize = 1 + INCARNATION_MAX + 1 + RUN_ID_MAX + ".json".len();

/// The longest owner name (TFINIT_OWNER) whose every file fits in [`NAME_MAX`] bytes; [`owner_problem`]
/// refuses a longer one at start. The longest name tfinit writes is a record's temporary file:
///
/// ```text
/// incarnation  <boot>-<started_ms>-<pid>-<nonce>  8 + 1 + 20 + 1 + 11 + 1 + 8      = 50
/// record       <owner>.<incarnation>.r<run>.json  owner + 1 + 50 + 1 + 21 + 5       = owner + 78
/// suffix       <pid>.<ms>.<ns>.<n>               10 + 1 + 20 + 1 + 9 + 1 + 20      = 62
/// temporary    .<record>.tmp.<suffix>            1 + (owner + 78) + 5 + 62         = owner + 146
/// set aside    <record minus .json>.json.corrupt                                    = owner + 86
/// heartbeat    owners/<owner>.<incarnation>.json or .lock: owner + 56; temporary   = owner + 124
/// ```
///
/// so 255 - 146 = 109 bytes.
pub const MAX_OWNER_LEN: usize = NAME_MAX - RECORD_EXTRA - TEMP_EXTRA;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_show_as_r_and_their_number_and_read_back_as_valid() {
        let r7 = RunId::from(7);
        assert_eq!(r7.to_string(), "r7");
        assert_eq!(RunId::FIRST.next().to_string(), "r2");
        assert!(
            RunId::from(9) < RunId::from(10),
            "ordered by number, not by text"
        );
        assert!(valid_run_id(&RunId::from(u64::MAX).to_string()));
        assert_eq!(RunId::parse("r7"), Some(r7));
        assert_eq!(
            RunId::parse(&format!("r{}", u64::MAX)),
            Some(RunId::from(u64::MAX))
        );
        for bad in [
            "7",
            "r",
            "R7",
            "r-1",
            "r+7",
            "r7 ",
            "r99999999999999999999",
            "r07",
            "r00004",
            "r00",
        ] {
            assert_eq!(RunId::parse(bad), None, "{bad}");
        }
        assert_eq!(RunId::parse("r0"), Some(RunId::from(0)), "0 is written r0");
    }

    #[test]
    fn run_ids_are_r_and_a_number() {
        for ok in ["r1", "r42", &format!("r{}", u64::MAX)] {
            assert!(valid_run_id(ok), "{ok}");
        }
        for bad in [
            "",
            "r",
            "1",
            "R1",
            "r-1",
            "r1.json",
            "r1/x",
            &format!("r{}0", u64::MAX),
        ] {
            assert!(!valid_run_id(bad), "{bad}");
        }
    }

    #[test]
    fn owners() {
        assert!(valid_owner("pod-0"));
        assert!(!valid_owner(""));
        assert!(!valid_owner("../x"));
        assert!(!valid_owner("a/b"));
        // A record of an older tfinit's longer name still reads (it is not corrupt).
        assert!(valid_owner(&"p".repeat(253)));
    }
}

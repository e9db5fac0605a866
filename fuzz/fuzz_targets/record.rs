//! The lock-owner record parser (`tfinit::locks::record::parse_record`): any bytes found in
//! TFINIT_STATE_DIR/records (a torn write by another tool, a newer format, garbage) must give a
//! record or an error, never a panic; a record it accepts has this format's version and survives
//! a write and a read unchanged; and every record the init can write reads back as written.
//!
//! Input: the bytes of a record file. The same bytes also drive a generated record (through
//! `arbitrary`), which is written as the init writes it and parsed back.
#![no_main]

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};
use tfinit::locks::names::{valid_owner, valid_workspace};
use tfinit::locks::record::{parse_record, FORMAT, OLDEST_FORMAT};

/// A name from `chars`, 1 to `max` long, not starting with `.` or `-`.
fn name(u: &mut Unstructured<'_>, chars: &[u8], max: usize) -> Result<String> {
    let n = u.int_in_range(1..=max)?;
    let mut s = String::new();
    for i in 0..n {
        let c = *u.choose(chars)? as char;
        s.push(if i == 0 && (c == '.' || c == '-') {
            'x'
        } else {
            c
        });
    }
    Ok(s)
}

const OWNER_CHARS: &[u8] = b"abcxyz0189.-_";
const WORKSPACE_CHARS: &[u8] = b"abcXYZ019.-_~+";

/// A record as the init writes it, as JSON: every required field with arbitrary (valid) values,
/// the optional ones sometimes (built as JSON rather than as a `Record`, so that fields added
/// later with defaults need no change here).
fn record(u: &mut Unstructured<'_>) -> Result<Value> {
    let mut owner = json!({
        "name": name(u, OWNER_CHARS, 63)?,
        "boot_id": u.arbitrary::<String>()?,
        "started_ms": u.arbitrary::<u64>()?,
        "pid": u.arbitrary::<i32>()?,
    });
    if let Some(uid) = u.arbitrary::<Option<String>>()? {
        owner["pod_uid"] = json!(uid);
    }
    let mut rec = json!({
        "v": FORMAT,
        "owner": owner,
        "who": u.arbitrary::<String>()?,
        "run_id": format!("r{}", u.arbitrary::<u64>()?),
        "workdir": format!("/{}", u.arbitrary::<String>()?),
        "subcommand": u.arbitrary::<String>()?,
        "argv": u.arbitrary::<Vec<String>>()?,
        "started_ms": u.arbitrary::<u64>()?,
        "in_progress": u.arbitrary::<Vec<String>>()?,
        "updated_ms": u.arbitrary::<u64>()?,
    });
    if u.arbitrary()? {
        rec["cwd"] = json!(format!("/{}", u.arbitrary::<String>()?));
    }
    if u.arbitrary()? {
        rec["workspace"] = json!(name(u, WORKSPACE_CHARS, 90)?);
    }
    if u.arbitrary()? {
        rec["ended"] = json!({"ms": u.arbitrary::<u64>()?, "how": u.arbitrary::<String>()?});
    }
    Ok(rec)
}

fuzz_target!(|data: &[u8]| {
    // Whatever is on disk.
    if let Ok(r) = parse_record(data) {
        assert!(
            (OLDEST_FORMAT..=FORMAT).contains(&r.v),
            "accepted a record of a format version this tfinit does not read: {}",
            r.v
        );
        // Names that become file names and paths were checked.
        assert!(valid_owner(&r.owner.name), "{:?}", r.owner.name);
        assert!(r.workdir.starts_with('/'), "{:?}", r.workdir);
        assert!(valid_workspace(&r.workspace), "{:?}", r.workspace);
        let pretty = serde_json::to_vec_pretty(&r).expect("a parsed record serializes");
        assert_eq!(
            parse_record(&pretty).as_ref(),
            Ok(&r),
            "pretty write/read changed it"
        );
        let compact = serde_json::to_vec(&r).expect("a parsed record serializes");
        assert_eq!(
            parse_record(&compact).as_ref(),
            Ok(&r),
            "compact write/read changed it"
        );
    }
    // What the init writes (pretty JSON and a newline, as Store::create does).
    let mut u = Unstructured::new(data);
    if let Ok(value) = record(&mut u) {
        let r = parse_record(&serde_json::to_vec(&value).unwrap())
            .unwrap_or_else(|e| panic!("a record with every field did not parse: {e}: {value}"));
        assert_eq!(r.owner.name, value["owner"]["name"].as_str().unwrap());
        assert_eq!(
            r.in_progress.len(),
            value["in_progress"].as_array().unwrap().len()
        );
        let mut bytes = serde_json::to_vec_pretty(&r).expect("a record serializes");
        bytes.push(b'\n');
        assert_eq!(
            parse_record(&bytes),
            Ok(r.clone()),
            "a written record did not read back"
        );
        // A torn write (any strict prefix of the JSON) is never taken for a record.
        let json_len = bytes.len() - 1;
        let cut = usize::from(u.arbitrary::<u16>().unwrap_or(0)) % json_len;
        let torn = &bytes[..cut];
        if !torn.iter().all(u8::is_ascii_whitespace) {
            assert!(
                parse_record(torn).is_err(),
                "a torn record parsed: {:?}",
                String::from_utf8_lossy(torn)
            );
        }
        // An owner name that could leave the records directory is refused.
        let mut evil = value.clone();
        evil["owner"]["name"] = json!(format!("../{}", r.owner.name));
        assert!(parse_record(&serde_json::to_vec(&evil).unwrap()).is_err());
        // Another format version is refused.
        let mut future = value;
        future["v"] = json!(FORMAT + 1);
        let err = parse_record(&serde_json::to_vec(&future).unwrap()).unwrap_err();
        assert_eq!(err.future(), Some(FORMAT + 1), "{err}");
    }
});

//! The file store's records, one file per incarnation (group commit, record file format
//! [`FILE_FORMAT`]): `records/<owner>.<incarnation>.json` holds every record of that incarnation,
//! so one batch of the recorder ([`Store::apply`](super::Store::apply)) is one atomic write
//! (temporary file, fsync, rename, fsync of the directory) whatever its size, and 16 runs that
//! start together wait for two writes, not sixteen. A record in it is named
//! [`RecordId::member`] (the file and the record's run id); removing or setting aside one record
//! rewrites the file atomically, and the file goes when its last record does.
//!
//! The layout before it, one file per run (`records/<owner>.<incarnation>.<run>.json`, a record of
//! format up to [`FORMAT`]), is still read, rewritten in place and removed: a pod upgraded from an
//! older tfinit finds its predecessor's records. An older tfinit reads an incarnation's file as a
//! record of a newer format and leaves it alone (`Found::Future`).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::file::{no_records_here, FileStore};
use super::fsio::{aside_path, atomic_write, file_of, open_regular, remove, to_json, ReadError};
use super::{Aside, Change, RecordId};
use crate::locks::names::valid_run_id;
use crate::locks::record::{check_record, parse_record, Found, Owner, Record, Unread, MAX_FILE};

#[cfg(test)]
mod tests;

/// Format version of an incarnation's file of records (its records are of [`FORMAT`]).
pub const FILE_FORMAT: u32 = 5;

/// Largest incarnation file read or written: 64 records of the largest size
/// ([`Record::fitted`] keeps each far below [`MAX_FILE`]); the runs of one init are far fewer.
pub const MAX_INCARNATION_FILE: u64 = 64 * MAX_FILE;

/// An incarnation's file: its records (each checked as a record file's is when it is read).
#[derive(Debug, Serialize)]
struct IncarnationFile<'a> {
    v: u32,
    records: &'a [Record],
}

/// The key of record `i` of an incarnation's file: its run id, or `#<i>`.
fn key_of(i: usize, r: &Record) -> String {
    if valid_run_id(&r.run_id) {
        r.run_id.clone()
    } else {
        format!("#{i}")
    }
}

/// What a `records/*.json` file holds.
enum Content {
    /// One record (the first layout): its bytes.
    One(Vec<u8>),
    /// An incarnation's records.
    Many(Vec<Record>),
}

/// What `bytes`, read from a file of `records/`, hold; Err: the Found that says why not. An
/// incarnation's file is told by its shape (a list of `records`), not by its version alone: a
/// record of a newer format than [`FORMAT`](crate::locks::record::FORMAT) is a record still, left
/// alone as one.
fn content(id: RecordId, bytes: Vec<u8>) -> Result<Content, Found> {
    #[derive(Deserialize)]
    struct Shape {
        v: u32,
        records: Option<Vec<Record>>,
    }
    match serde_json::from_slice::<Shape>(&bytes) {
        Ok(Shape {
            v,
            records: Some(records),
        }) => match v {
            FILE_FORMAT => Ok(Content::Many(records)),
            v if v > FILE_FORMAT => Err(Found::Future(id, v)),
            v => Err(Found::Corrupt(
                id,
                format!("records of format {v} (an incarnation's file is format {FILE_FORMAT})"),
            )),
        },
        // A file of one record is never larger than MAX_FILE: a larger one is a tfinit's from
        // before the cap, maybe alive.
        _ if bytes.len() as u64 > MAX_FILE => {
            Err(Found::LeftAlone(id, Unread::TooLarge(bytes.len() as u64)))
        }
        // One record, or no record at all (an incarnation's file with an entry that is no record
        // included): parsed as one, it says why not.
        _ => Ok(Content::One(bytes)),
    }
}

/// The Found of one record's bytes at `id`.
fn found(id: RecordId, bytes: &[u8]) -> Found {
    match parse_record(bytes) {
        Ok(r) => Found::Record(id, Box::new(r)),
        Err(problem) => match problem.future() {
            Some(v) => Found::Future(id, v),
            None => Found::Corrupt(id, problem.to_string()),
        },
    }
}

/// A record as the store writes it, [`Record::fitted`], and its bytes alone: only when they read
/// back.
fn checked(record: &Record, name: &Path) -> io::Result<(Record, Vec<u8>)> {
    let fitted = record.fitted().into_owned();
    let bytes = to_json(&fitted);
    let problem = if bytes.len() as u64 > MAX_FILE {
        Some(format!(
            "it would be {} bytes, more than the {MAX_FILE} a reader takes (its paths or names are that long)",
            bytes.len()
        ))
    } else {
        parse_record(&bytes).err().map(|e| e.to_string())
    };
    match problem {
        Some(problem) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "lock-owner record {} of run {} not written, it would not read back: {problem}",
                name.display(),
                record.run_id
            ),
        )),
        None => Ok((fitted, bytes)),
    }
}

/// Reads a file of `records/` of at most [`MAX_INCARNATION_FILE`] bytes.
fn read_file(path: &Path) -> Result<Vec<u8>, ReadError> {
    use std::io::Read;
    let (f, meta) = open_regular(path, fs::OpenOptions::new().read(true))?;
    if meta.len() > MAX_INCARNATION_FILE {
        return Err(ReadError::TooLarge(meta.len()));
    }
    let mut buf = Vec::new();
    f.take(MAX_INCARNATION_FILE + 1)
        .read_to_end(&mut buf)
        .map_err(ReadError::Io)?;
    if buf.len() as u64 > MAX_INCARNATION_FILE {
        return Err(ReadError::TooLarge(buf.len() as u64));
    }
    Ok(buf)
}

/// The changes of a batch to one incarnation's file, in order: the change's index in the batch,
/// the record's key, its new content (None: removed).
type FileChanges = Vec<(usize, String, Option<Record>)>;

/// A copy of `e` for each change of one write (io::Error is not Clone).
fn copy(e: &io::Error) -> io::Error {
    io::Error::new(e.kind(), e.to_string())
}

impl FileStore {
    /// The file of every record of incarnation `owner`.
    pub fn incarnation_path(&self, owner: &Owner) -> PathBuf {
        self.records_dir()
            .join(format!("{}.{}.json", owner.name, owner.incarnation()))
    }

    /// Whether `record` is stored here already: its own file of the first layout, or its
    /// incarnation's file.
    pub fn holds(&self, record: &Record) -> bool {
        self.path_of(record).is_file() || self.incarnation_path(&record.owner).is_file()
    }

    /// Every record of `records/`, parsed or not, by file and by record inside an incarnation's
    /// file, in a stable order.
    pub(super) fn list_records(&self) -> Vec<Found> {
        let entries = match fs::read_dir(self.records_dir()) {
            Ok(entries) => entries,
            // Nothing was ever written here (no volume mounted, another path, not ours to read):
            // no records, as an answer.
            Err(e) if no_records_here(&e) => return Vec::new(),
            Err(e) => {
                return vec![Found::Unlisted(format!(
                    "{}: {e}",
                    self.records_dir().display()
                ))]
            }
        };
        let mut out = Vec::new();
        for e in entries.flatten() {
            let path = e.path();
            let hidden = e.file_name().to_string_lossy().starts_with('.');
            if hidden || path.extension().and_then(|x| x.to_str()) != Some("json") {
                continue;
            }
            let bytes = read_file(&path);
            let id = RecordId::file(&path);
            match bytes {
                // Removed since readdir (its run ended): not a problem.
                Err(ReadError::Io(e)) if e.kind() == io::ErrorKind::NotFound => {}
                Err(ReadError::Io(e)) if e.kind() == io::ErrorKind::PermissionDenied => {
                    out.push(Found::Unreadable(id, e.to_string()))
                }
                // Only a file read whole can be proven corrupt; anything else is left alone.
                Err(ReadError::Io(e)) => {
                    out.push(Found::LeftAlone(id, Unread::Failed(e.to_string())))
                }
                Err(ReadError::NotRegular(kind)) => {
                    out.push(Found::LeftAlone(id, Unread::NotRegular(kind)))
                }
                Err(ReadError::TooLarge(size)) => {
                    out.push(Found::LeftAlone(id, Unread::TooLarge(size)))
                }
                Ok(bytes) => match content(id.clone(), bytes) {
                    Ok(Content::One(bytes)) => out.push(found(id, &bytes)),
                    Ok(Content::Many(records)) => {
                        for (i, r) in records.into_iter().enumerate() {
                            let member = RecordId::member(&path, &key_of(i, &r));
                            out.push(match check_record(r) {
                                Ok(r) => Found::Record(member, Box::new(r)),
                                Err(problem) => match problem.future() {
                                    Some(v) => Found::Future(member, v),
                                    None => Found::Corrupt(member, problem.to_string()),
                                },
                            });
                        }
                    }
                    Err(f) => out.push(f),
                },
            }
        }
        out.sort_by(|a, b| found_id(a).cmp(&found_id(b)));
        out
    }

    /// The records of the incarnation's file at `path` (none when it is missing).
    fn members(&self, path: &Path) -> io::Result<Vec<Record>> {
        let bytes = match read_file(path) {
            Err(ReadError::Io(e)) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            r => r.map_err(|e| e.into_io(path))?,
        };
        match content(RecordId::file(path), bytes) {
            Ok(Content::Many(records)) => Ok(records),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} is not an incarnation's file of lock-owner records (format {FILE_FORMAT}): it is set aside by the next sweep, or check it by hand",
                    path.display()
                ),
            )),
        }
    }

    /// Writes the incarnation's file at `path` with `records`, atomically; removes it when none
    /// is left.
    fn write_members(&self, path: &Path, records: &[Record]) -> io::Result<()> {
        if records.is_empty() {
            return remove(path);
        }
        let n = records.len();
        let bytes = to_json(&IncarnationFile {
            v: FILE_FORMAT,
            records,
        });
        if bytes.len() as u64 > MAX_INCARNATION_FILE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} not written: {n} records would take {} bytes, more than the {MAX_INCARNATION_FILE} a reader takes; lower TFINIT_MAX_RUNS or shorten the runs' arguments",
                    path.display(),
                    bytes.len()
                ),
            ));
        }
        atomic_write(path, &bytes)
    }

    /// One record read by its id.
    pub(super) fn read_record(&self, id: &RecordId) -> io::Result<Record> {
        let not_a_record = |p: String| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{id} is not a lock-owner record: {p}"),
            )
        };
        if let Some((file, key)) = id.as_member() {
            let mut records = self.members(file)?;
            let (j, _) = find(&records, key).ok_or_else(|| missing(id))?;
            return check_record(records.swap_remove(j)).map_err(|p| not_a_record(p.to_string()));
        }
        let path = file_of(id)?;
        let bytes = read_file(path).map_err(|e| e.into_io(path))?;
        if bytes.len() as u64 > MAX_FILE {
            return Err(ReadError::TooLarge(bytes.len() as u64).into_io(path));
        }
        parse_record(&bytes).map_err(|p| not_a_record(p.to_string()))
    }

    /// Applies a batch: every change to one incarnation's file is one atomic write of it; a
    /// record of the first layout (its own file) is rewritten or removed there.
    pub(super) fn apply_changes(&self, changes: &[Change]) -> Vec<io::Result<RecordId>> {
        let mut results: Vec<Option<io::Result<RecordId>>> = changes.iter().map(|_| None).collect();
        // The changes of each incarnation's file, in order: (index, key, new content or None).
        let mut files: Vec<(PathBuf, FileChanges)> = Vec::new();
        for (i, c) in changes.iter().enumerate() {
            let (path, key, value) = match c {
                Change::Put(record) if self.path_of(record).is_file() => {
                    results[i] = Some(self.write_run_file(record));
                    continue;
                }
                Change::Put(record) => {
                    let path = self.incarnation_path(&record.owner);
                    match checked(record, &path) {
                        Ok((fitted, _)) => (path, record.run_id.clone(), Some(fitted)),
                        Err(e) => {
                            results[i] = Some(Err(e));
                            continue;
                        }
                    }
                }
                Change::Remove(id) => match id.as_member() {
                    Some((file, key)) => (file.to_path_buf(), key.to_string(), None),
                    None => {
                        results[i] = Some(file_of(id).and_then(remove).map(|()| id.clone()));
                        continue;
                    }
                },
            };
            match files.iter_mut().find(|(p, _)| *p == path) {
                Some((_, list)) => list.push((i, key, value)),
                None => files.push((path, vec![(i, key, value)])),
            }
        }
        for (path, list) in files {
            let written = self.members(&path).and_then(|mut records| {
                for (_, key, value) in &list {
                    let at = find(&records, key).map(|(j, _)| j);
                    match (at, value) {
                        (Some(j), Some(v)) => records[j] = v.clone(),
                        (None, Some(v)) => records.push(v.clone()),
                        (Some(j), None) => {
                            records.remove(j);
                        }
                        (None, None) => {}
                    }
                }
                self.write_members(&path, &records)
            });
            for (i, key, _) in list {
                results[i] = Some(match &written {
                    Ok(()) => Ok(RecordId::member(&path, &key)),
                    Err(e) => Err(copy(e)),
                });
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(io::Error::other("no change was made"))))
            .collect()
    }

    /// Writes `record` to its own file of the first layout (a predecessor's record a recovery
    /// marks is rewritten where it is).
    pub(super) fn write_run_file(&self, record: &Record) -> io::Result<RecordId> {
        let path = self.path_of(record);
        let (_, bytes) = checked(record, &path)?;
        atomic_write(&path, &bytes)?;
        Ok(RecordId::file(path))
    }

    /// Sets the record in an incarnation's file aside: its own file beside it
    /// (`<owner>.<incarnation>.<run>.json.corrupt` or `.manual`), then the incarnation's file
    /// rewritten without it.
    pub(super) fn set_member_aside(
        &self,
        file: &Path,
        key: &str,
        why: &Aside,
    ) -> io::Result<RecordId> {
        let mut records = self.members(file)?;
        let id = RecordId::member(file, key);
        let (j, v) = find(&records, key).ok_or_else(|| missing(&id))?;
        let stem = file.with_extension("");
        let own = PathBuf::from(format!(
            "{}.{}.json",
            stem.display(),
            key.trim_start_matches('#')
        ));
        let aside = aside_path(&own, why);
        atomic_write(&aside, &to_json(v))?;
        records.remove(j);
        self.write_members(file, &records)?;
        Ok(RecordId::file(aside))
    }
}

/// The record of key `key` in an incarnation's `records`, and where it is.
fn find<'a>(records: &'a [Record], key: &str) -> Option<(usize, &'a Record)> {
    records
        .iter()
        .enumerate()
        .find(|(i, v)| key_of(*i, v) == key)
}

fn missing(id: &RecordId) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{id}: no such record (removed since it was listed?)"),
    )
}

fn found_id(f: &Found) -> Option<&RecordId> {
    match f {
        Found::Record(p, _)
        | Found::Corrupt(p, _)
        | Found::Future(p, _)
        | Found::Unreadable(p, _)
        | Found::LeftAlone(p, _) => Some(p),
        Found::Unlisted(_) => None,
    }
}

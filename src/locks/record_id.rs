//! [`RecordId`]: which stored record, as its store names it (`locks::store`). Callers hold it,
//! print it and hand it back; only the store that made it looks inside (a file's path, a record
//! inside an incarnation's file, a Lease's namespace and name).

use std::fmt;
use std::path::{Path, PathBuf};

/// One record of one store: opaque to everything but the store that made it. It orders by store
/// and then by name, so a listing sorted by it is stable.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RecordId(Where);

/// Where a record is.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Where {
    /// A file of the file store holding one record (the layout before record files per
    /// incarnation, and records set aside).
    File(PathBuf),
    /// A record inside an incarnation's file of the file store: the file and the record's key
    /// there (its run id, or `#<index>` for one without a usable run id).
    Member { file: PathBuf, key: String },
    /// A Lease of the Kubernetes store: namespace and name.
    Lease { namespace: String, name: String },
}

impl RecordId {
    /// The record in the file at `path`.
    pub fn file(path: impl Into<PathBuf>) -> RecordId {
        RecordId(Where::File(path.into()))
    }

    /// The record `key` (its run id) in the incarnation's file at `file`.
    pub fn member(file: impl Into<PathBuf>, key: &str) -> RecordId {
        RecordId(Where::Member {
            file: file.into(),
            key: key.to_string(),
        })
    }

    /// The incarnation's file and the record's key in it, when the record is one of those.
    pub fn as_member(&self) -> Option<(&Path, &str)> {
        match &self.0 {
            Where::Member { file, key } => Some((file, key)),
            _ => None,
        }
    }

    /// Whether the record is one of the file store's (a file of its own, or one in an
    /// incarnation's file).
    pub fn in_files(&self) -> bool {
        matches!(self.0, Where::File(_) | Where::Member { .. })
    }

    /// The record in the Lease `namespace/name`.
    pub fn lease(namespace: &str, name: &str) -> RecordId {
        RecordId(Where::Lease {
            namespace: namespace.to_string(),
            name: name.to_string(),
        })
    }

    /// The file's path, when the record is a file.
    pub fn as_file(&self) -> Option<&Path> {
        match &self.0 {
            Where::File(p) => Some(p),
            Where::Member { .. } | Where::Lease { .. } => None,
        }
    }

    /// The Lease's name, when the record is in a Lease of `namespace`.
    pub fn as_lease_in(&self, namespace: &str) -> Option<&str> {
        match &self.0 {
            Where::Lease {
                namespace: ns,
                name,
            } if ns == namespace => Some(name),
            _ => None,
        }
    }
}

/// For unit tests: a file's path as an id (`"/s/records/r1.json".into()`).
#[cfg(test)]
impl From<&str> for RecordId {
    fn from(path: &str) -> RecordId {
        RecordId::file(path)
    }
}

/// For unit tests: a file's path as an id.
#[cfg(test)]
impl From<PathBuf> for RecordId {
    fn from(path: PathBuf) -> RecordId {
        RecordId::file(path)
    }
}

impl fmt::Display for RecordId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Where::File(p) => write!(f, "{}", p.display()),
            Where::Member { file, key } => write!(f, "{} (record {key})", file.display()),
            Where::Lease { namespace, name } => write!(f, "Lease {namespace}/{name}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_says_where_and_only_its_store_reads_it() {
        let f = RecordId::file("/state/records/a.json");
        let l = RecordId::lease("ns", "pod-a-tfinit-r1");
        assert_eq!(f.to_string(), "/state/records/a.json");
        assert_eq!(l.to_string(), "Lease ns/pod-a-tfinit-r1");
        assert_eq!(f.as_file(), Some(Path::new("/state/records/a.json")));
        assert_eq!(l.as_file(), None);
        assert_eq!(l.as_lease_in("ns"), Some("pod-a-tfinit-r1"));
        assert_eq!(l.as_lease_in("other"), None);
        assert_eq!(f.as_lease_in("ns"), None);
        assert!(f < l, "files sort before Leases");
        let m = RecordId::member("/state/records/pod-a.1.json", "r3");
        assert_eq!(m.to_string(), "/state/records/pod-a.1.json (record r3)");
        assert_eq!(m.as_file(), None, "a member is no file of its own");
        assert_eq!(
            m.as_member(),
            Some((Path::new("/state/records/pod-a.1.json"), "r3"))
        );
        assert!(m.in_files() && f.in_files() && !l.in_files());
    }
}

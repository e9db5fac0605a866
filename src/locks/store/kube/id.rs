//! A record's id in the Kubernetes store. The [`Store`](crate::locks::store::Store) seam names
//! records by [`RecordId`]; a Lease's is the text `lease:NAMESPACE/NAME`, which no file path a
//! file store makes starts with (those are absolute), so a reader of several stores tells them
//! apart.

use std::path::{Path, PathBuf};

use super::RecordId;

/// How the id of a record in a Lease starts.
const PREFIX: &str = "lease:";

/// The id of the record in Lease `namespace/name`.
pub fn lease_id(namespace: &str, name: &str) -> RecordId {
    PathBuf::from(format!("{PREFIX}{namespace}/{name}"))
}

/// The Lease's name of `id`, when it names a record in a Lease of `namespace`.
pub fn lease_of<'a>(id: &'a Path, namespace: &str) -> Option<&'a str> {
    let rest = id.to_str()?.strip_prefix(PREFIX)?;
    let (ns, name) = rest.split_once('/')?;
    (ns == namespace && !name.is_empty() && !name.contains('/')).then_some(name)
}

/// Whether `id` names a record in a Lease (of any namespace).
pub fn is_lease(id: &Path) -> bool {
    id.to_str().is_some_and(|s| s.starts_with(PREFIX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_id_names_its_namespace_and_lease_and_no_file() {
        let id = lease_id("ns", "pod-a-tfinit-r1");
        assert_eq!(id.display().to_string(), "lease:ns/pod-a-tfinit-r1");
        assert_eq!(lease_of(&id, "ns"), Some("pod-a-tfinit-r1"));
        assert_eq!(lease_of(&id, "other"), None);
        assert!(is_lease(&id));
        assert!(!id.is_absolute());
        let file = Path::new("/state/records/a.json");
        assert!(!is_lease(file));
        assert_eq!(lease_of(file, "ns"), None);
        assert_eq!(lease_of(Path::new("lease:ns/a/b"), "ns"), None);
    }
}

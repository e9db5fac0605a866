//! What differs per backend: the id a probe passes, whether probing is read-only, and how the
//! error its Unlock failed with reads (by the backend's tables of wordings, with the lists of
//! errors s3 with both locks and gcs give).

use super::wordings::{said, Says, AZURERM, GCS, KUBERNETES, S3_OBJECT, S3_TABLE};

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

/// What the message Unlock failed with (`m`, after `Failed to unlock state: `) says, by
/// `backend`'s wordings; None when it is in none of them.
pub(super) fn unlock_answer(backend: &str, own_lock: Option<&str>, m: &str) -> Option<Says> {
    let id = probe_id(backend);
    match backend {
        "s3" => {
            // Both locks (use_lockfile and a table): terraform 1.10 and later name each half,
            // measured 1.11.4 (lock-1.11.4/both-*); OpenTofu 1.10 and later list the object's
            // error, then the table's (source: Unlock, multierror.Append).
            if let Some(rest) = m.strip_prefix("failed to unlock both S3 and DynamoDB: S3 error: ")
            {
                let (object, table) = rest.rsplit_once(", DynamoDB error: ")?;
                return all([said(S3_OBJECT, object, id), said(S3_TABLE, table, id)]);
            }
            if let Some(items) = error_list(m) {
                let [object, table] = <[String; 2]>::try_from(items).ok()?;
                return all([said(S3_OBJECT, &object, id), said(S3_TABLE, &table, id)]);
            }
            said(S3_TABLE, m, id).or_else(|| said(S3_OBJECT, m, id))
        }
        "kubernetes" => {
            // The lock's own Lease is gone (a person deleted it; Unlock reads it only after the
            // state loaded, so the namespace exists): nothing holds the lock. Measured 1.0.3.
            let gone =
                own_lock.map(|name| format!("leases.coordination.k8s.io {name:?} not found"));
            if gone.as_deref() == Some(m) {
                return Some(Says::Free);
            }
            said(KUBERNETES, m, id)
        }
        "azurerm" => said(AZURERM, m, id),
        "gcs" => {
            let parts = error_list(m).unwrap_or_else(|| m.lines().map(str::to_string).collect());
            all(parts.iter().map(|p| said(GCS, p, id)))
        }
        _ => None,
    }
}

/// What several parts of one answer say together: free only when every part is; unknown when
/// any part is; held without a name when any part says so; else unreadable.
fn all(parts: impl IntoIterator<Item = Option<Says>>) -> Option<Says> {
    let parts: Vec<Option<Says>> = parts.into_iter().collect();
    if parts.is_empty() || parts.contains(&None) {
        return None;
    }
    Some(if parts.iter().all(|p| *p == Some(Says::Free)) {
        Says::Free
    } else if parts.contains(&Some(Says::HeldUnnamed)) {
        Says::HeldUnnamed
    } else {
        Says::Unreadable
    })
}

/// The errors of a go-multierror list (`2 errors occurred:` then one `\t* error` per error, an
/// error's further lines following it), or None when `m` is not one or its count is wrong.
pub(super) fn error_list(m: &str) -> Option<Vec<String>> {
    let mut lines = m.trim_end().lines();
    let head = lines.next()?;
    let n: usize = head
        .strip_suffix(" errors occurred:")
        .or_else(|| head.strip_suffix(" error occurred:"))?
        .parse()
        .ok()?;
    let mut items: Vec<String> = Vec::new();
    for line in lines {
        match (line.strip_prefix("\t* "), items.last_mut()) {
            (Some(item), _) => items.push(item.to_string()),
            (None, Some(last)) => {
                last.push('\n');
                last.push_str(line);
            }
            (None, None) => return None,
        }
    }
    (items.len() == n).then_some(items)
}

//! The wordings of a probe's answer, as tables per backend and lock kind, each wording with the
//! terraform and OpenTofu releases that print it and how that is known (measured or source), and
//! how a wording is matched against an answer.

/// What one wording says about the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Says {
    /// Nothing holds it.
    Free,
    /// Somebody holds it, but no Lock Info came with this part of the answer (OpenTofu prints
    /// only the S3 lock object's when both locks of a state fail): whose cannot be told.
    HeldUnnamed,
    /// terraform could not read it.
    Unreadable,
}

/// A wording as a pattern of what follows `Failed to unlock state: `: `*` is any text within a
/// line, `**` any text, `{id}` the probe's id ([`probe_id`](super::probe_id)). The first that
/// matches decides, so a free wording comes before the broader unreadable one it would also match.
pub(super) type Wording = (Says, &'static str);

/// The DynamoDB lock table's answers (s3 with `dynamodb_table`).
pub(super) const S3_TABLE: &[Wording] = &[
    // GetItem found no item, and its empty Info is not JSON. terraform 1.0 to 1.5: measured 1.0.3
    // (lock/probe-free), source v1.0.0 to v1.5.7 (getLockInfo, Unlock); OpenTofu 1.6 to 1.9:
    // source v1.6.0 to v1.9.x (the same text, through %w).
    (
        Says::Free,
        "failed to retrieve lock info: unexpected end of JSON input",
    ),
    // The same, terraform 1.6 and later: measured 1.11.4 (lock-1.11.4/probe-free), source
    // v1.6.0 to v1.15.0 and main (unlockWithDynamoDB since 1.10).
    (
        Says::Free,
        "failed to retrieve lock info for lock ID \"{id}\": unexpected end of JSON input",
    ),
    // OpenTofu 1.10 and later: source v1.10.0 to main (getLockInfoFromDynamoDB, no item).
    (
        Says::Free,
        "failed to retrieve lock info: no lock info found for: \"*\" within the DynamoDB table: *",
    ),
    // Held (the Lock Info block is read before any table): terraform 1.0 to 1.5 and OpenTofu,
    // measured 1.0.3 (lock/probe-held); terraform 1.6 and later, measured 1.11.4
    // (lock-1.11.4/probe-held).
    (
        Says::HeldUnnamed,
        "lock id \"{id}\" does not match existing lock",
    ),
    (
        Says::HeldUnnamed,
        "lock ID \"{id}\" does not match existing lock (\"*\")",
    ),
    // GetItem failed: measured 1.0.3 (lock/probe-endpoint-down: `RequestError: send request
    // failed` and a `caused by:` line), 1.11.4 (lock-1.11.4/probe-table-down: `Unable to retrieve
    // item from DynamoDB table "tflock": operation error DynamoDB: GetItem, ...`); OpenTofu: source.
    (Says::Unreadable, "failed to retrieve lock info: **"),
    (
        Says::Unreadable,
        "failed to retrieve lock info for lock ID \"{id}\": **",
    ),
];

/// The S3 lock object's answers (s3 with `use_lockfile`: `<key>.tflock`; terraform 1.10 and
/// later, OpenTofu 1.10 and later).
pub(super) const S3_OBJECT: &[Wording] = &[
    // GetObject answered 404 NoSuchKey: terraform, measured 1.11.4 (lock-1.11.4/lockfile-probe-free;
    // moto sends nothing after `NoSuchKey: `, S3 sends a message), source v1.10.0 to main
    // (unlockWithFile).
    (
        Says::Free,
        "unable to retrieve file from S3 bucket '*' with key '*.tflock': operation error S3: GetObject, https response error StatusCode: 404, RequestID: *, HostID: *, NoSuchKey:*",
    ),
    // OpenTofu, source v1.10.0 to main (s3Unlock: getLockInfoFromS3 passes the SDK's error on).
    (
        Says::Free,
        "failed to retrieve s3 lock info: operation error S3: GetObject, https response error StatusCode: 404, RequestID: *, HostID: *, NoSuchKey:*",
    ),
    // Held: terraform, measured 1.11.4 (lock-1.11.4/lockfile-probe-held); OpenTofu, source.
    (
        Says::HeldUnnamed,
        "lock ID '{id}' does not match the existing lock ID '*'",
    ),
    (
        Says::HeldUnnamed,
        "lock id \"{id}\" from s3 does not match existing lock",
    ),
    // GetObject or the body failed: terraform, source (measured only through the state's listing,
    // which fails first when S3 is down: lock-1.11.4/lockfile-probe-endpoint-down); OpenTofu, source.
    (
        Says::Unreadable,
        "unable to retrieve file from S3 bucket '*' with key '*': **",
    ),
    (
        Says::Unreadable,
        "failed to read the body of the S3 object: **",
    ),
    (
        Says::Unreadable,
        "failed to unmarshal JSON data into LockInfo struct: **",
    ),
    (Says::Unreadable, "failed to retrieve s3 lock info: **"),
];

/// The kubernetes backend's answers (a Lease `lock-tfstate-<workspace>-<suffix>`). The same text
/// in every release: measured terraform 1.0.3 on the API stand-in (docs/notes/terraform-facts.md
/// 9b), source terraform v1.0.0 to main and OpenTofu v1.6.0 to main (Unlock). The Lease's own
/// NotFound is read before this table ([`parse_probe_of`](super::parse_probe_of)).
pub(super) const KUBERNETES: &[Wording] = &[
    // The Lease has no holder.
    (Says::Free, "state is already unlocked"),
    (
        Says::HeldUnnamed,
        "lock id \"{id}\" does not match existing lock",
    ),
    // The API server's errors as client-go passes them on (measured: Forbidden, another
    // object's NotFound), and client-go's own transport errors (`Get "URL": dial tcp ...`).
    (Says::Unreadable, "leases.coordination.k8s.io \"*\" **"),
    (Says::Unreadable, "secrets \"*\" **"),
    (Says::Unreadable, "namespaces \"*\" **"),
    (Says::Unreadable, "the server **"),
    (Says::Unreadable, "Unauthorized"),
    (Says::Unreadable, "Get \"**"),
    (Says::Unreadable, "Put \"**"),
];

/// The azurerm backend's answers (the lock is a blob lease plus the blob's `terraformlockid`
/// metadata). The same text in every release: source terraform v1.0.0 to main and OpenTofu
/// v1.6.0 to main (getLockInfo, Unlock); not measured (no Azure stand-in here).
pub(super) const AZURERM: &[Wording] = &[
    // The blob has no lock metadata.
    (
        Says::Free,
        "failed to retrieve lock info: blob metadata \"terraformlockid\" was empty",
    ),
    (
        Says::HeldUnnamed,
        "lock id \"{id}\" does not match existing lock",
    ),
    (Says::Unreadable, "failed to retrieve lock info: **"),
];

/// The gcs backend's answers, one per error in its list: Unlock deletes the lock object only if
/// its generation is the probe's id, and on failure reads the lock (lockError) and lists the
/// delete's error, then the read's (terraform to 1.13 and OpenTofu to 1.7: go-multierror; terraform
/// 1.14 and later: errors.Join, one per line); OpenTofu 1.8 and later give the delete's error
/// alone when the read found no object (InconsistentRead). Source terraform v1.0.0 to main,
/// OpenTofu v1.6.0 to main; not measured (no GCS stand-in here).
pub(super) const GCS: &[Wording] = &[
    // storage.ErrObjectNotExist: no lock object (a delete or read answered 404).
    (Says::Free, "storage: object doesn't exist"),
    (Says::Unreadable, "googleapi: **"),
    (Says::Unreadable, "storage: **"),
    (Says::Unreadable, "Delete \"**"),
    (Says::Unreadable, "Get \"**"),
];

/// Answers about the working directory or the state, not the lock, whatever the backend:
/// terraform could not get as far as the lock. `Failed to load state:` (without a Lock Info):
/// measured 1.0.3 (kubernetes, docs 9b) and 1.11.4 (s3, lock-1.11.4/probe-endpoint-down: 1.6 and
/// later fail on the workspace listing). `Backend initialization required`: measured 1.0.3 and
/// 1.11.4 (probe-not-initialized). The others: source (unlock.go, meta_backend.go).
pub(super) const NOT_THE_LOCK: [&str; 4] = [
    "Failed to load state: ",
    "Error selecting workspace: ",
    "Backend initialization required",
    "Backend configuration changed",
];

/// What a probe's answer begins with when Unlock itself failed (unlock.go, every release).
pub(super) const UNLOCK_FAILED: &str = "Failed to unlock state: ";

/// What terraform prints before the Lock Info when loading the state failed: the backend tried
/// to lock the state to create it (it does not exist) and found the lock held.
pub(super) const STATE_LOAD_FAILED: &str = "Failed to load state:";

/// What `force-unlock` prints when it released something (or, for s3 without a lock table or
/// lock object, when there is no locking at all: measured 1.0.3 and 1.11.4,
/// probe-no-dynamodb-table, lock-1.11.4/probe-no-locking; OpenTofu 1.6 to 1.8, source).
pub(super) const UNLOCKED: [&str; 2] = [
    "Terraform state has been successfully unlocked!",
    "OpenTofu state has been successfully unlocked!",
];

/// What OpenTofu 1.9 and later print instead for s3 without a lock table or lock object
/// (`IsLockingEnabled`; 1.9 to 1.11 a plain line, 1.12 and later a diagnostic whose detail ends
/// with a period): nothing can hold a lock there. Source v1.9.0 to main.
pub(super) const LOCKING_DISABLED: [&str; 2] = [
    "Locking is disabled for this backend",
    "Locking is disabled for this backend.",
];

/// What the first of `wordings` that matches `m` says.
pub(super) fn said(wordings: &[Wording], m: &str, id: &str) -> Option<Says> {
    let m = m.trim();
    wordings
        .iter()
        .find(|(_, pattern)| matches(&pattern.replace("{id}", id), m))
        .map(|(says, _)| *says)
}

/// Whether `text` is all of `pattern`: `*` stands for any text within a line, `**` for any
/// text. Runs in time proportional to the pattern's parts times the text's length (the set of
/// positions each part can end at), whatever terraform printed.
pub(super) fn matches(pattern: &str, text: &str) -> bool {
    let text = text.as_bytes();
    // reach[i]: the parts so far can match text[..i].
    let mut reach = vec![false; text.len() + 1];
    reach[0] = true;
    let mut rest = pattern;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('*') {
            let any = after.starts_with('*');
            rest = if any { &after[1..] } else { after };
            for i in 1..=text.len() {
                reach[i] |= reach[i - 1] && (any || text[i - 1] != b'\n');
            }
        } else {
            let end = rest.find('*').unwrap_or(rest.len());
            let lit = &rest.as_bytes()[..end];
            rest = &rest[end..];
            let mut next = vec![false; text.len() + 1];
            for i in 0..=text.len().saturating_sub(lit.len()) {
                if reach[i] && text[i..].starts_with(lit) {
                    next[i + lit.len()] = true;
                }
            }
            reach = next;
        }
    }
    reach[text.len()]
}

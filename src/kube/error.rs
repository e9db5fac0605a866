//! What a request to the API server can end in, as the caller decides on it: one [`Error`]
//! variant per decision, each naming the request ([`Op`]) and saying what to do. An error answer
//! of the API server is a `Status` object (`reason`, `code`, `message`); [`Status`] keeps what a
//! decision or a message needs of it.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// The RBAC rule (of a Role in the pod's namespace, bound to its service account) that allows
/// every request of this client.
pub const ROLE_RULE: &str = "{apiGroups: [\"coordination.k8s.io\"], resources: [\"leases\"], \
                             verbs: [\"get\", \"list\", \"create\", \"update\", \"delete\"]}";

/// A request, as RBAC names its verb.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// GET of one Lease.
    Get,
    /// GET of the Leases of a namespace (by label selector).
    List,
    /// POST of a new Lease.
    Create,
    /// PUT of a Lease.
    Update,
    /// DELETE of a Lease.
    Delete,
}

impl Verb {
    /// The RBAC verb.
    pub fn rbac(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Delete => "delete",
        }
    }

    /// Whether sending the request again cannot change anything by itself (reads): what
    /// [`super::RetryPolicy`] may repeat after an answer that never came.
    pub fn is_read(self) -> bool {
        matches!(self, Verb::Get | Verb::List)
    }
}

/// The request an error is about: "update Lease tfinit/NAME".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// What was asked.
    pub verb: Verb,
    /// In which namespace.
    pub namespace: String,
    /// Of which Lease (none for a list).
    pub name: Option<String>,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.name {
            Some(name) => write!(f, "{} Lease {}/{}", self.verb.rbac(), self.namespace, name),
            None => write!(
                f,
                "{} Leases in namespace {}",
                self.verb.rbac(),
                self.namespace
            ),
        }
    }
}

/// The parts of an API `Status` answer that decisions and messages use.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Status {
    /// HTTP code as the server states it in the body.
    pub code: u16,
    /// `NotFound`, `Conflict`, `AlreadyExists`, `Forbidden`, `TooManyRequests`, ...
    pub reason: String,
    /// The server's sentence.
    pub message: String,
    /// What the status is about.
    pub details: Option<StatusDetails>,
}

/// `Status.details`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct StatusDetails {
    /// The object's name.
    pub name: String,
    /// Its API group (`coordination.k8s.io`).
    pub group: String,
    /// Its resource (`leases`; `namespaces` when the namespace is what is missing).
    pub kind: String,
    /// When to retry (429, some 5xx).
    pub retry_after_seconds: Option<u64>,
}

impl Status {
    /// The Status of an error answer's body, or, for a body that is no Status (a proxy's page),
    /// one with the text as its message.
    pub(super) fn of_answer(code: u16, body: &str) -> Status {
        match serde_json::from_str::<Status>(body) {
            Ok(s) if !s.reason.is_empty() || !s.message.is_empty() => s,
            _ => Status {
                code,
                message: preview(body),
                ..Status::default()
            },
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.reason.is_empty(), self.message.is_empty()) {
            (false, false) if self.message == self.reason => f.write_str(&self.message),
            (false, false) => write!(f, "{} ({})", self.message, self.reason),
            (true, false) => f.write_str(&self.message),
            (false, true) => f.write_str(&self.reason),
            (true, true) => write!(f, "no message (code {})", self.code),
        }
    }
}

/// Why a request to the API server failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// 401 even after the token was read again: the token is not (or no longer) valid.
    #[error(
        "{op}: 401 Unauthorized even after re-reading the token {token} ({status}); check that \
         the pod's service account token is mounted and current, and that the service account \
         still exists"
    )]
    Unauthorized {
        /// The request.
        op: Op,
        /// The token file.
        token: PathBuf,
        /// The server's answer, or why the token could not be read again.
        status: Box<Status>,
    },
    /// 403: RBAC does not allow it.
    #[error(
        "{op}: 403 Forbidden ({status}); a Role in namespace {ns} with the rule {ROLE_RULE}, \
         bound to the pod's service account by a RoleBinding, allows it",
        ns = op.namespace
    )]
    Forbidden {
        /// The request.
        op: Op,
        /// The server's answer.
        status: Box<Status>,
    },
    /// 404 of the Lease.
    #[error("{op}: 404 Not Found ({status}); the Lease does not exist (or was deleted)")]
    NotFound {
        /// The request.
        op: Op,
        /// The server's answer.
        status: Box<Status>,
    },
    /// 404 of the namespace itself (the server says `namespaces "NS" not found`).
    #[error(
        "{op}: the namespace {ns} does not exist ({status}); the pod's namespace file names a \
         namespace that is gone: recreate it or fix the service account's mount",
        ns = op.namespace
    )]
    NamespaceNotFound {
        /// The request.
        op: Op,
        /// The server's answer.
        status: Box<Status>,
    },
    /// 409 Conflict: the Lease changed since it was read (stale `resourceVersion`), or a delete's
    /// precondition no longer holds.
    #[error("{op}: 409 Conflict ({status}); get the Lease again and apply the change to it")]
    Conflict {
        /// The request.
        op: Op,
        /// The server's answer.
        status: Box<Status>,
    },
    /// 409 AlreadyExists: a create of a name that exists.
    #[error(
        "{op}: 409 AlreadyExists ({status}); get the existing Lease and decide on it (update it, \
         or leave it to its holder)"
    )]
    AlreadyExists {
        /// The request.
        op: Op,
        /// The server's answer.
        status: Box<Status>,
    },
    /// 429: the server sheds load.
    #[error(
        "{op}: 429 Too Many Requests ({status}); the API server sheds load: retry after {}",
        wait_text(*retry_after)
    )]
    TooManyRequests {
        /// `Retry-After` (or the Status's `retryAfterSeconds`).
        retry_after: Option<Duration>,
        /// The request.
        op: Op,
        /// The server's answer.
        status: Box<Status>,
    },
    /// 5xx: the server (or what is in front of it) failed; the request may have been applied
    /// (a 504 of a write), so a write is checked by reading again.
    #[error(
        "{op}: {code} from the API server ({status}); retry after {}, and after a write get the \
         Lease again first: it may have been applied",
        wait_text(*retry_after)
    )]
    ServerError {
        /// The HTTP code.
        code: u16,
        /// `Retry-After`, when the server sent one.
        retry_after: Option<Duration>,
        /// The request.
        op: Op,
        /// The server's answer.
        status: Box<Status>,
    },
    /// Another 4xx (400 BadRequest, 422 Invalid, ...): the request itself was refused.
    #[error(
        "{op}: {code} from the API server ({status}); the request was refused as it is: a bug \
         in tfinit (or an admission webhook refusing Leases), please report it with this message"
    )]
    Rejected {
        /// The HTTP code.
        code: u16,
        /// The request.
        op: Op,
        /// The server's answer.
        status: Box<Status>,
    },
    /// No whole answer before the request's deadline: it may or may not have been applied.
    #[error(
        "{op}: no answer within {after:?} ({phase}); the API server is slow or hung: a write may \
         or may not have been applied, get the Lease again to know"
    )]
    Timeout {
        /// The request's deadline.
        after: Duration,
        /// What was under way (ureq's phase: `global`, `receive response`, ...).
        phase: String,
        /// The request.
        op: Op,
    },
    /// No connection: TCP or TLS (an invalid server certificate among them). Nothing was
    /// sent.
    #[error("{op}: cannot reach the API server at {server}: {detail}")]
    Connect {
        /// `https://HOST:PORT`.
        server: String,
        /// What failed, and what to do.
        detail: String,
        /// The request.
        op: Op,
    },
    /// The connection ended after the request was sent and before the whole answer: the request
    /// may or may not have been applied.
    #[error(
        "{op}: the connection ended before the answer ({detail}); a write may or may not have \
         been applied: get the Lease again to know"
    )]
    AnswerLost {
        /// What the transport saw.
        detail: String,
        /// The request.
        op: Op,
    },
    /// An answer that is not what the API sends (not JSON, not a Lease): surfaced with its text.
    #[error("{op}: the answer cannot be read ({detail}): {}", preview(raw))]
    Malformed {
        /// Why it cannot be read.
        detail: String,
        /// The answer's text, whole.
        raw: String,
        /// The request.
        op: Op,
    },
    /// A request that was not sent because it is wrong as it stands (a caller's bug).
    #[error("{op}: not sent: {problem}")]
    Invalid {
        /// What is wrong.
        problem: String,
        /// The request.
        op: Op,
    },
}

impl Error {
    /// The request this error is about.
    pub fn op(&self) -> &Op {
        match self {
            Error::Unauthorized { op, .. }
            | Error::Forbidden { op, .. }
            | Error::NotFound { op, .. }
            | Error::NamespaceNotFound { op, .. }
            | Error::Conflict { op, .. }
            | Error::AlreadyExists { op, .. }
            | Error::TooManyRequests { op, .. }
            | Error::ServerError { op, .. }
            | Error::Rejected { op, .. }
            | Error::Timeout { op, .. }
            | Error::Connect { op, .. }
            | Error::AnswerLost { op, .. }
            | Error::Malformed { op, .. }
            | Error::Invalid { op, .. } => op,
        }
    }

    /// The error of an answer with an error code (401 included: the caller re-reads the token
    /// first). `retry_after` is the `Retry-After` header's.
    pub(super) fn of_answer(
        op: Op,
        code: u16,
        retry_after: Option<Duration>,
        body: &str,
        token: &std::path::Path,
    ) -> Error {
        let status = Box::new(Status::of_answer(code, body));
        let retry_after = retry_after.or_else(|| {
            status
                .details
                .as_ref()
                .and_then(|d| d.retry_after_seconds)
                .map(Duration::from_secs)
        });
        match code {
            401 => Error::Unauthorized {
                op,
                token: token.to_path_buf(),
                status,
            },
            403 => Error::Forbidden { op, status },
            404 if names_a_namespace(&status) => Error::NamespaceNotFound { op, status },
            404 => Error::NotFound { op, status },
            409 if status.reason == "AlreadyExists" => Error::AlreadyExists { op, status },
            409 => Error::Conflict { op, status },
            429 => Error::TooManyRequests {
                retry_after,
                op,
                status,
            },
            500..=599 => Error::ServerError {
                code,
                retry_after,
                op,
                status,
            },
            _ => Error::Rejected { code, op, status },
        }
    }
}

/// Whether a 404 is about the namespace (a create in one that does not exist answers
/// `namespaces "NS" not found`, details `{kind: namespaces}`) rather than the Lease.
fn names_a_namespace(status: &Status) -> bool {
    status
        .details
        .as_ref()
        .is_some_and(|d| d.kind == "namespaces" && d.group.is_empty())
}

/// "1s", or "a backoff" without a `Retry-After`.
fn wait_text(retry_after: Option<Duration>) -> String {
    match retry_after {
        Some(d) => format!("{d:?} (Retry-After)"),
        None => "a backoff".into(),
    }
}

/// The first 300 characters of an answer, for a message (the whole stays in the error).
pub(super) fn preview(raw: &str) -> String {
    const MAX: usize = 300;
    let trimmed = raw.trim();
    match trimmed.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}... ({} bytes)", &trimmed[..cut], raw.len()),
        None if trimmed.is_empty() => "an empty answer".into(),
        None => trimmed.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn op(verb: Verb) -> Op {
        Op {
            verb,
            namespace: "tfinit".into(),
            name: Some("a".into()),
        }
    }

    fn answer(code: u16, body: &str) -> Error {
        Error::of_answer(op(Verb::Create), code, None, body, Path::new("/sa/token"))
    }

    #[test]
    fn each_status_becomes_the_variant_a_caller_decides_on() {
        let e = answer(
            409,
            r#"{"kind":"Status","status":"Failure","reason":"AlreadyExists","code":409,
                "message":"leases.coordination.k8s.io \"a\" already exists"}"#,
        );
        assert!(matches!(e, Error::AlreadyExists { .. }), "{e}");
        let e = answer(
            409,
            r#"{"reason":"Conflict","code":409,"message":"modified"}"#,
        );
        assert!(matches!(e, Error::Conflict { .. }), "{e}");
        let e = answer(
            404,
            r#"{"reason":"NotFound","code":404,"message":"namespaces \"tfinit\" not found",
                "details":{"name":"tfinit","kind":"namespaces"}}"#,
        );
        assert!(matches!(e, Error::NamespaceNotFound { .. }), "{e}");
        let e = answer(
            404,
            r#"{"reason":"NotFound","code":404,"message":"leases.coordination.k8s.io \"a\" not found",
                "details":{"name":"a","group":"coordination.k8s.io","kind":"leases"}}"#,
        );
        assert!(matches!(e, Error::NotFound { .. }), "{e}");
        let e = answer(
            422,
            r#"{"reason":"Invalid","code":422,"message":"bad name"}"#,
        );
        assert!(matches!(e, Error::Rejected { code: 422, .. }), "{e}");
        let e = answer(502, "<html>Bad Gateway</html>");
        assert!(matches!(e, Error::ServerError { code: 502, .. }), "{e}");
        assert!(e.to_string().contains("<html>Bad Gateway</html>"), "{e}");
    }

    #[test]
    fn forbidden_names_the_role_rule_that_allows_it() {
        let e = answer(
            403,
            r#"{"reason":"Forbidden","code":403,"message":"leases.coordination.k8s.io is forbidden"}"#,
        );
        let text = e.to_string();
        assert!(text.contains("create Lease tfinit/a"), "{text}");
        assert!(text.contains("a Role in namespace tfinit"), "{text}");
        assert!(text.contains(ROLE_RULE), "{text}");
    }

    #[test]
    fn retry_after_comes_from_the_header_or_else_the_status() {
        let body = r#"{"reason":"TooManyRequests","code":429,"message":"Too many requests, please try again later.","details":{"retryAfterSeconds":3}}"#;
        let e = Error::of_answer(op(Verb::Get), 429, None, body, Path::new("t"));
        assert!(matches!(
            e,
            Error::TooManyRequests { retry_after: Some(d), .. } if d == Duration::from_secs(3)
        ));
        let e = Error::of_answer(
            op(Verb::Get),
            429,
            Some(Duration::from_secs(1)),
            body,
            Path::new("t"),
        );
        assert!(matches!(
            e,
            Error::TooManyRequests { retry_after: Some(d), .. } if d == Duration::from_secs(1)
        ));
    }

    #[test]
    fn previews_cut_long_answers_on_a_character_boundary() {
        let long = "é".repeat(400);
        let p = preview(&long);
        assert!(p.starts_with(&"é".repeat(300)), "{p}");
        assert!(p.ends_with("... (800 bytes)"), "{p}");
        assert_eq!(preview("  "), "an empty answer");
    }
}

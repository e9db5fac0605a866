//! The Lease operations of the pod's namespace: get, list by label selector, create, update,
//! delete. Each is one request (two after a 401: see [`super::transport`]) within the client's
//! [`Deadlines`], and ends in the Lease(s) or an [`Error`] a caller decides on. Nothing here
//! retries: a caller that wants to uses [`super::RetryPolicy`].
//!
//! | operation | request | what the API answers that is not success |
//! |---|---|---|
//! | [`Client::get`] | `GET .../leases/NAME` | NotFound |
//! | [`Client::list`] | `GET .../leases?labelSelector=SEL` | (an empty list; never NotFound, even without the namespace) |
//! | [`Client::create`] | `POST .../leases` | AlreadyExists; NamespaceNotFound |
//! | [`Client::update`] | `PUT .../leases/NAME`, with `metadata.resourceVersion` | Conflict when the Lease changed since; NotFound |
//! | [`Client::delete`] | `DELETE .../leases/NAME`, with `preconditions` if given | NotFound; Conflict when a precondition no longer holds |
//!
//! Every operation may also end in Unauthorized, Forbidden, TooManyRequests, ServerError,
//! Timeout, Connect, AnswerLost or Malformed (see [`Error`]).

use serde::Deserialize;
use serde_json::Value;
use ureq::http::Method;

use super::config::Config;
use super::error::{Error, Op, Verb};
use super::lease::{Body, Lease};
use super::names::is_dns_subdomain;
use super::transport::{Answer, Deadlines, Transport};

/// The Leases a list found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LeaseList {
    /// The list's `metadata.resourceVersion` (the collection's version when it was read).
    pub resource_version: String,
    /// Every Lease that reads as one.
    pub items: Vec<Lease>,
    /// Items that do not (a hand-made object the server accepted that this client cannot
    /// read): each with its name and text, so a caller can set it aside without losing the rest.
    pub unreadable: Vec<Unreadable>,
}

/// An item of a list that is not a readable Lease.
#[derive(Debug, Clone, PartialEq)]
pub struct Unreadable {
    /// Its `metadata.name`, when it has one.
    pub name: Option<String>,
    /// Why it cannot be read.
    pub detail: String,
    /// The item's JSON text.
    pub raw: String,
}

/// What must still hold for a delete to happen (the server answers 409 Conflict otherwise).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Precondition {
    /// The Lease is this object (not one deleted and created again under the same name).
    pub uid: Option<String>,
    /// The Lease is unchanged since this version.
    pub resource_version: Option<String>,
}

impl Precondition {
    /// The Lease as `lease` read it: same object, unchanged.
    pub fn unchanged(lease: &Lease) -> Precondition {
        Precondition {
            uid: lease.metadata.uid.clone(),
            resource_version: lease.metadata.resource_version.clone(),
        }
    }
}

/// A client of the Leases of one namespace (the pod's) on one API server. Safe to share between
/// threads; every call blocks up to its [`Deadlines`].
pub struct Client {
    transport: Transport,
    namespace: String,
}

/// The raw list: items are read one by one so that one bad item does not hide the rest.
#[derive(Deserialize)]
struct RawList {
    #[serde(default)]
    metadata: ListMeta,
    #[serde(default)]
    items: Option<Vec<Value>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ListMeta {
    #[serde(default)]
    resource_version: String,
}

impl Client {
    /// A client of the Leases of `config`'s namespace, with `deadlines` on every request.
    /// Nothing is sent yet.
    pub fn new(config: Config, deadlines: Deadlines) -> Client {
        let (transport, namespace) = Transport::new(config.into_parts(), deadlines);
        Client {
            transport,
            namespace,
        }
    }

    /// The namespace of the Leases.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// `https://HOST:PORT`.
    pub fn server(&self) -> &str {
        self.transport.server()
    }

    /// The Lease `name`.
    pub fn get(&self, name: &str) -> Result<Lease, Error> {
        let op = self.op(Verb::Get, Some(name))?;
        let answer = self.call(&op, Method::GET, &self.path(Some(name)), None)?;
        self.lease(&op, answer)
    }

    /// The Leases whose labels match `selector` (`key=value,key2=value2`, the API's syntax);
    /// all of them for an empty one.
    pub fn list(&self, selector: &str) -> Result<LeaseList, Error> {
        let op = self.op(Verb::List, None)?;
        let mut path = self.path(None);
        if !selector.is_empty() {
            path.push_str("?labelSelector=");
            path.extend(percent_encoding::utf8_percent_encode(
                selector,
                percent_encoding::NON_ALPHANUMERIC,
            ));
        }
        let answer = self.call(&op, Method::GET, &path, None)?;
        if answer.code != 200 {
            return Err(self.failure(op, answer));
        }
        let raw: RawList = serde_json::from_str(&answer.body).map_err(|e| Error::Malformed {
            detail: format!("not a LeaseList: {e}"),
            raw: answer.body.clone(),
            op: op.clone(),
        })?;
        let mut list = LeaseList {
            resource_version: raw.metadata.resource_version,
            ..LeaseList::default()
        };
        for item in raw.items.unwrap_or_default() {
            match serde_json::from_value::<Lease>(item.clone()) {
                Ok(lease) => list.items.push(lease),
                Err(e) => list.unreadable.push(Unreadable {
                    name: item["metadata"]["name"].as_str().map(str::to_string),
                    detail: e.to_string(),
                    raw: item.to_string(),
                }),
            }
        }
        Ok(list)
    }

    /// Creates `lease` (its `metadata.name` a DNS subdomain); the stored Lease, with its
    /// `resourceVersion` and `uid`. [`Error::AlreadyExists`] when the name is taken. A
    /// `resourceVersion` or `uid` in `lease` (one read before, created again) is not sent: the
    /// server gives a new object its own.
    pub fn create(&self, lease: &Lease) -> Result<Lease, Error> {
        let op = self.op(Verb::Create, Some(&lease.metadata.name))?;
        let body = if lease.metadata.resource_version.is_some() || lease.metadata.uid.is_some() {
            let mut new = lease.clone();
            new.metadata.resource_version = None;
            new.metadata.uid = None;
            self.body(&op, &new)?
        } else {
            self.body(&op, lease)?
        };
        let answer = self.call(&op, Method::POST, &self.path(None), Some(&body))?;
        self.lease(&op, answer)
    }

    /// Replaces the Lease with `lease`, only if it is still at `lease.metadata.resourceVersion`
    /// ([`Error::Conflict`] otherwise: read it again and re-apply). The stored Lease, with its new
    /// `resourceVersion`. A Lease without a `resourceVersion` is not sent (it would overwrite
    /// whatever another writer stored).
    pub fn update(&self, lease: &Lease) -> Result<Lease, Error> {
        let name = &lease.metadata.name;
        let op = self.op(Verb::Update, Some(name))?;
        if lease.metadata.resource_version.is_none() {
            return Err(Error::Invalid {
                problem: "the Lease has no metadata.resourceVersion: get it first".into(),
                op,
            });
        }
        let body = self.body(&op, lease)?;
        let answer = self.call(&op, Method::PUT, &self.path(Some(name)), Some(&body))?;
        self.lease(&op, answer)
    }

    /// Deletes the Lease `name`, if `precondition` still holds ([`Error::Conflict`] otherwise);
    /// [`Error::NotFound`] when it is gone already.
    pub fn delete(&self, name: &str, precondition: Option<&Precondition>) -> Result<(), Error> {
        let op = self.op(Verb::Delete, Some(name))?;
        let body = precondition.map(|p| {
            let mut pre = serde_json::Map::new();
            if let Some(uid) = &p.uid {
                pre.insert("uid".into(), uid.clone().into());
            }
            if let Some(rv) = &p.resource_version {
                pre.insert("resourceVersion".into(), rv.clone().into());
            }
            serde_json::json!({
                "kind": "DeleteOptions",
                "apiVersion": "v1",
                "preconditions": pre,
            })
            .to_string()
            .into_bytes()
        });
        let answer = self.call(&op, Method::DELETE, &self.path(Some(name)), body.as_deref())?;
        match answer.code {
            // 200 with the object or a Status, 202 when a finalizer delays it: gone or going.
            200 | 202 => Ok(()),
            _ => Err(self.failure(op, answer)),
        }
    }

    /// The request `verb` of `name`, refused before sending when `name` is no DNS subdomain
    /// (it would be part of the URL's path).
    fn op(&self, verb: Verb, name: Option<&str>) -> Result<Op, Error> {
        let op = Op {
            verb,
            namespace: self.namespace.clone(),
            name: name.map(str::to_string),
        };
        match name {
            Some(n) if !is_dns_subdomain(n) => Err(Error::Invalid {
                problem: format!(
                    "{n:?} is not a DNS subdomain (at most 253 of a-z, 0-9, '-' and '.'): make \
                     Lease names with lease_name()"
                ),
                op,
            }),
            _ => Ok(op),
        }
    }

    /// `/apis/coordination.k8s.io/v1/namespaces/NS/leases[/NAME]`.
    fn path(&self, name: Option<&str>) -> String {
        let base = format!(
            "/apis/coordination.k8s.io/v1/namespaces/{}/leases",
            self.namespace
        );
        match name {
            Some(n) => format!("{base}/{n}"),
            None => base,
        }
    }

    fn body(&self, op: &Op, lease: &Lease) -> Result<Vec<u8>, Error> {
        serde_json::to_vec(&Body::of(lease)).map_err(|e| Error::Invalid {
            problem: format!("the Lease cannot be written as JSON: {e}"),
            op: op.clone(),
        })
    }

    fn call(
        &self,
        op: &Op,
        method: Method,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<Answer, Error> {
        self.transport.call(op, method, path, body)
    }

    /// The Lease of a successful answer (200, 201 of a create), or the error of any other.
    fn lease(&self, op: &Op, answer: Answer) -> Result<Lease, Error> {
        if !(200..300).contains(&answer.code) {
            return Err(self.failure(op.clone(), answer));
        }
        serde_json::from_str(&answer.body).map_err(|e| Error::Malformed {
            detail: format!("not a Lease: {e}"),
            raw: answer.body,
            op: op.clone(),
        })
    }

    fn failure(&self, op: Op, answer: Answer) -> Error {
        if answer.code < 400 {
            // A success code this operation does not answer with (a 3xx, which is never
            // followed, or 204): not what the API sends.
            return Error::Malformed {
                detail: format!("unexpected HTTP {}", answer.code),
                raw: answer.body,
                op,
            };
        }
        Error::of_answer(
            op,
            answer.code,
            answer.retry_after,
            &answer.body,
            &self.transport.token_path(),
        )
    }
}

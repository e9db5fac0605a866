//! A `coordination.k8s.io/v1` Lease, typed: the metadata and spec fields this client knows, and
//! every other field kept as it came (`other`), so that an update written from a Lease that was
//! read sends back what another writer or a newer API server added (`managedFields`,
//! `ownerReferences`, `spec.strategy`, ...). `apiVersion` and `kind` are written on every request
//! and not kept.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::microtime::MicroTime;

/// The API group and version of Leases.
pub(super) const API_VERSION: &str = "coordination.k8s.io/v1";

/// A Lease.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Lease {
    /// Name, labels, annotations, and the server's `resourceVersion` and `uid`.
    #[serde(default, deserialize_with = "null_as_default")]
    pub metadata: ObjectMeta,
    /// Who holds it and since when.
    #[serde(default, deserialize_with = "null_as_default")]
    pub spec: LeaseSpec,
}

/// `metadata` of a Lease.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    /// The Lease's name (a DNS subdomain: see [`super::lease_name`]).
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    /// Its namespace (set by the server; the client sends requests to its own namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Labels (what a list selects on).
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub labels: BTreeMap<String, String>,
    /// Annotations (at most 256 KiB in all, the API's limit).
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub annotations: BTreeMap<String, String>,
    /// The version the server stored; an update sends it back, and is refused with 409
    /// Conflict when the Lease changed since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// The server's identity of this object (a Lease deleted and created again has another).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// Every other field, as the server sent it.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// `spec` of a Lease.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseSpec {
    /// Who holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder_identity: Option<String>,
    /// How long the holder says it lives without a renewal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_duration_seconds: Option<i32>,
    /// When the current holder took it (the holder's clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acquire_time: Option<MicroTime>,
    /// When the holder last renewed it (the holder's clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_time: Option<MicroTime>,
    /// How many times the holder changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_transitions: Option<i32>,
    /// Every other field, as the server sent it.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// `null` read as the empty value (`labels: null` is what a hand-written object may hold).
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// A Lease as a request body: with `apiVersion` and `kind`, which the server requires.
#[derive(Serialize)]
pub(super) struct Body<'a> {
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    kind: &'static str,
    #[serde(flatten)]
    lease: &'a Lease,
}

impl<'a> Body<'a> {
    /// The body of a create or update of `lease`.
    pub(super) fn of(lease: &'a Lease) -> Body<'a> {
        Body {
            api_version: API_VERSION,
            kind: "Lease",
            lease,
        }
    }
}

impl Lease {
    /// A Lease named `name`, with nothing else yet.
    pub fn named(name: &str) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: name.into(),
                ..ObjectMeta::default()
            },
            ..Lease::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Lease as kube-apiserver 1.31 answers it (trimmed managedFields).
    const FROM_SERVER: &str = r#"{
        "kind": "Lease", "apiVersion": "coordination.k8s.io/v1",
        "metadata": {
            "name": "pod-a-tfinit", "namespace": "tfinit",
            "uid": "5b0e0a1a-0000-4000-8000-000000000001", "resourceVersion": "4711",
            "creationTimestamp": "2026-11-26T13:00:00Z",
            "labels": {"app.kubernetes.io/managed-by": "tfinit"},
            "annotations": {"tfinit.dev/record": "{\"format\":5}"},
            "managedFields": [{"manager": "tfinit", "operation": "Update"}]
        },
        "spec": {
            "holderIdentity": "pod-a", "leaseDurationSeconds": 30,
            "acquireTime": "2026-11-26T13:00:00.000000Z", "renewTime": "2026-11-26T13:00:10.500000Z",
            "leaseTransitions": 0, "strategy": "OldestEmulationVersion"
        }
    }"#;

    #[test]
    fn a_lease_reads_typed_and_keeps_the_fields_it_does_not_know() {
        let lease: Lease = serde_json::from_str(FROM_SERVER).unwrap();
        assert_eq!(lease.metadata.name, "pod-a-tfinit");
        assert_eq!(lease.metadata.resource_version.as_deref(), Some("4711"));
        assert_eq!(lease.spec.holder_identity.as_deref(), Some("pod-a"));
        assert_eq!(lease.spec.lease_duration_seconds, Some(30));
        assert_eq!(
            lease.spec.renew_time.unwrap().to_string(),
            "2026-11-26T13:00:10.500000Z"
        );
        assert!(lease.metadata.other.contains_key("managedFields"));
        assert_eq!(lease.spec.other["strategy"], "OldestEmulationVersion");

        let sent: Value = serde_json::to_value(Body::of(&lease)).unwrap();
        let got: Value = serde_json::from_str(FROM_SERVER).unwrap();
        assert_eq!(sent, got, "an update sends back every field it read");
    }

    #[test]
    fn a_new_lease_sends_only_what_is_set() {
        let mut lease = Lease::named("x");
        lease.spec.holder_identity = Some("me".into());
        let sent = serde_json::to_value(Body::of(&lease)).unwrap();
        assert_eq!(
            sent,
            serde_json::json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": "x"}, "spec": {"holderIdentity": "me"}
            })
        );
    }

    #[test]
    fn nulls_read_as_absent() {
        let lease: Lease = serde_json::from_str(
            r#"{"metadata":{"name":"x","labels":null,"annotations":null},"spec":{"holderIdentity":null}}"#,
        )
        .unwrap();
        assert_eq!(lease.spec.holder_identity, None);
        assert!(lease.metadata.labels.is_empty());
        let lease: Lease =
            serde_json::from_str(r#"{"metadata":{"name":"x"},"spec":null}"#).unwrap();
        assert_eq!(lease.spec, LeaseSpec::default());
    }
}

//! tfinit's Kubernetes client (src/kube/) against the stand-in API server over real TLS
//! (tests/fixtures/kube/apiserver.py in HTTPS mode, its CA and certificate made here with
//! `openssl`): every Lease operation, and each answer a caller decides on: 401 and the token read
//! again, 403 naming the Role rule, 409 on a stale resourceVersion, 429 and its Retry-After, 5xx
//! and backoff, a hung server and the deadline, a certificate of another CA (refused), a lost
//! answer, a missing namespace. What the stand-in saw is read from its request log, over its
//! admin port.

mod common;

use std::time::{Duration, Instant};

use serde_json::json;
use tfinit::kube::{
    lease_name, Client, Config, ConfigError, Deadlines, Error, Lease, MicroTime, Precondition,
    RetryPolicy, ROLE_RULE, SERVICE_ACCOUNT_DIR, SERVICE_ACCOUNT_DIR_VAR,
};

use common::apiserver::ApiServer;
use common::kube_cluster::{have_deps, Cluster, DEADLINES, NS};
use common::pki::Pki;
use common::TempDir;

/// The labels the list tests select on.
const MANAGED: &str = "app.kubernetes.io/managed-by";

/// A Lease `name` held by `holder`, labelled as tfinit's.
fn lease(name: &str, holder: &str) -> Lease {
    let mut l = Lease::named(name);
    l.metadata.labels.insert(MANAGED.into(), "tfinit".into());
    l.metadata
        .annotations
        .insert("tfinit.dev/record".into(), r#"{"format":5}"#.into());
    l.spec.holder_identity = Some(holder.into());
    l.spec.lease_duration_seconds = Some(30);
    l.spec.acquire_time = Some(MicroTime::from_unix_micros(1_764_000_000_123_456));
    l.spec.renew_time = Some(MicroTime::now());
    l
}

#[test]
fn every_operation_works_over_tls() {
    if !have_deps() {
        return;
    }
    let c = Cluster::start("kube-ops");
    let client = c.client();
    assert_eq!(client.namespace(), NS);
    assert!(client.server().starts_with("https://127.0.0.1:"));

    let sent = lease("pod-a-tfinit", "pod-a");
    let created = client.create(&sent).expect("create");
    assert_eq!(created.metadata.namespace.as_deref(), Some(NS));
    assert!(created.metadata.uid.is_some());
    let rv1 = created.metadata.resource_version.clone().unwrap();
    assert_eq!(
        created.spec, sent.spec,
        "the spec round-trips, times to the microsecond"
    );
    assert_eq!(created.metadata.annotations, sent.metadata.annotations);

    let got = client.get("pod-a-tfinit").expect("get");
    assert_eq!(got, created);

    // Another Lease, of someone else: the selector tells them apart.
    let mut other = lease("someone-else", "x");
    other
        .metadata
        .labels
        .insert(MANAGED.into(), "terraform".into());
    client.create(&other).expect("create the other");
    let mine = client.list(&format!("{MANAGED}=tfinit")).expect("list");
    let names: Vec<_> = mine
        .items
        .iter()
        .map(|l| l.metadata.name.as_str())
        .collect();
    assert_eq!(names, ["pod-a-tfinit"]);
    assert!(mine.unreadable.is_empty());
    assert!(!mine.resource_version.is_empty());
    assert_eq!(client.list("").expect("list all").items.len(), 2);
    assert!(client.list("no-such-label").unwrap().items.is_empty());

    let mut renewed = got.clone();
    renewed.spec.renew_time = Some(MicroTime::now());
    renewed.spec.lease_transitions = Some(1);
    let updated = client.update(&renewed).expect("update");
    let rv2 = updated.metadata.resource_version.clone().unwrap();
    assert_ne!(rv1, rv2);
    assert_eq!(updated.spec.lease_transitions, Some(1));

    // A delete whose precondition is stale is refused; with the current one it happens.
    let e = client
        .delete("pod-a-tfinit", Some(&Precondition::unchanged(&got)))
        .unwrap_err();
    assert!(matches!(e, Error::Conflict { .. }), "{e}");
    assert!(e.to_string().contains("Precondition failed"), "{e}");
    let wrong_uid = Precondition {
        uid: Some("not-its-uid".into()),
        resource_version: None,
    };
    let e = client.delete("pod-a-tfinit", Some(&wrong_uid)).unwrap_err();
    assert!(matches!(e, Error::Conflict { .. }), "{e}");
    client
        .delete("pod-a-tfinit", Some(&Precondition::unchanged(&updated)))
        .expect("delete");
    let e = client.get("pod-a-tfinit").unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
    let e = client.delete("pod-a-tfinit", None).unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
    // Created again from the copy read before: a new object, with its own uid.
    let again = client.create(&updated).expect("create from a read copy");
    assert_ne!(again.metadata.uid, updated.metadata.uid);
    client.delete("pod-a-tfinit", None).unwrap();
    client
        .delete("someone-else", None)
        .expect("delete without precondition");
    assert!(client.list("").unwrap().items.is_empty());

    // Nothing but these requests reached the server, each answered as expected.
    assert_eq!(
        c.codes(),
        [201, 200, 201, 200, 200, 200, 200, 409, 409, 200, 404, 404, 201, 200, 200, 200]
    );
    assert!(!c.api.log_text().contains("OUTSIDE"));
}

#[test]
fn create_of_an_existing_name_is_already_exists_and_a_stale_update_is_a_conflict() {
    if !have_deps() {
        return;
    }
    let c = Cluster::start("kube-conflict");
    let client = c.client();
    let first = client.create(&lease("pod-a-tfinit", "pod-a")).unwrap();
    let e = client.create(&lease("pod-a-tfinit", "pod-b")).unwrap_err();
    assert!(matches!(e, Error::AlreadyExists { .. }), "{e}");
    assert!(e.to_string().contains("already exists"), "{e}");

    // Two writers read the same version; the second to write loses, and wins after a re-read.
    let mut a = first.clone();
    let mut b = first.clone();
    a.spec.holder_identity = Some("writer-a".into());
    b.spec.holder_identity = Some("writer-b".into());
    client.update(&a).expect("the first write");
    let e = client.update(&b).unwrap_err();
    assert!(matches!(e, Error::Conflict { .. }), "{e}");
    assert!(e.to_string().contains("get the Lease again"), "{e}");
    let mut fresh = client.get("pod-a-tfinit").unwrap();
    assert_eq!(fresh.spec.holder_identity.as_deref(), Some("writer-a"));
    fresh.spec.holder_identity = Some("writer-b".into());
    client.update(&fresh).expect("the re-applied write");

    // An update without a resourceVersion is never sent: it would overwrite blindly.
    let mut blind = lease("pod-a-tfinit", "blind");
    blind.metadata.resource_version = None;
    let e = client.update(&blind).unwrap_err();
    assert!(matches!(e, Error::Invalid { .. }), "{e}");
    assert_eq!(c.api.requests().len(), 6, "the blind update was not sent");
}

#[test]
fn an_update_keeps_the_fields_the_client_does_not_know() {
    if !have_deps() {
        return;
    }
    let c = Cluster::start("kube-unknown");
    let client = c.client();
    client.create(&lease("pod-a-tfinit", "pod-a")).unwrap();
    // Another writer (a newer API, a person with kubectl) adds fields this client has no name for.
    let path = format!("/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/pod-a-tfinit");
    let (_, mut raw) = c.api.call("GET", &path, None, "application/json");
    raw["spec"]["strategy"] = json!("OldestEmulationVersion");
    raw["metadata"]["finalizers"] = json!(["example.com/keep"]);
    let (code, _) = c.api.call("PUT", &path, Some(&raw), "application/json");
    assert_eq!(code, 200);

    let mut got = client.get("pod-a-tfinit").unwrap();
    got.spec.holder_identity = Some("pod-b".into());
    client.update(&got).unwrap();
    let (_, after) = c.api.call("GET", &path, None, "application/json");
    assert_eq!(after["spec"]["holderIdentity"], "pod-b");
    assert_eq!(after["spec"]["strategy"], "OldestEmulationVersion");
    assert_eq!(after["metadata"]["finalizers"], json!(["example.com/keep"]));
}

#[test]
fn a_rotated_token_is_read_again_after_a_401() {
    if !have_deps() {
        return;
    }
    let c = Cluster::start("kube-token");
    let client = c.client();
    client.list("").expect("the first token works");

    // The kubelet rotates the projected token: the server now takes only the new one.
    std::fs::write(&c.tokens, "token-2\n").unwrap();
    std::fs::write(c.sa.join("token"), "token-2\n").unwrap();
    c.api.clear_requests();
    client
        .list("")
        .expect("401, the token read again, and the request sent once more");
    assert_eq!(c.codes(), [401, 200]);

    // A token the server does not take, file or not: one retry, then Unauthorized.
    std::fs::write(&c.tokens, "token-3\n").unwrap();
    c.api.clear_requests();
    let e = client.get("anything").unwrap_err();
    assert!(matches!(e, Error::Unauthorized { .. }), "{e}");
    let text = e.to_string();
    assert!(
        text.contains(&c.sa.join("token").display().to_string()),
        "{text}"
    );
    assert_eq!(c.codes(), [401, 401], "exactly one retry");

    // The token file went away: named in the error.
    std::fs::remove_file(c.sa.join("token")).unwrap();
    let e = client.get("anything").unwrap_err();
    assert!(matches!(e, Error::Unauthorized { .. }), "{e}");
    assert!(e.to_string().contains("cannot be read again"), "{e}");
}

#[test]
fn forbidden_names_the_role_rule_that_allows_it() {
    if !have_deps() {
        return;
    }
    let c = Cluster::start("kube-forbidden");
    let client = c.client();
    c.api
        .faults(json!({"forbid": ["update leases", "list leases"]}));
    let created = client
        .create(&lease("pod-a-tfinit", "pod-a"))
        .expect("create is allowed");
    let e = client.update(&created).unwrap_err();
    assert!(matches!(e, Error::Forbidden { .. }), "{e}");
    let text = e.to_string();
    assert!(text.contains("cannot update resource \"leases\""), "{text}");
    assert!(
        text.contains(&format!(
            "a Role in namespace {NS} with the rule {ROLE_RULE}"
        )),
        "{text}"
    );
    let e = client.list("").unwrap_err();
    assert!(matches!(e, Error::Forbidden { .. }), "{e}");
    assert!(
        RetryPolicy::default().delay(1, &e, 0.0).is_none(),
        "403 is not retried"
    );
    c.api.faults(json!({}));
    client.update(&created).expect("allowed again");
}

#[test]
fn too_many_requests_waits_at_least_retry_after() {
    if !have_deps() {
        return;
    }
    let c = Cluster::start("kube-429");
    let client = c.client();
    client.create(&lease("pod-a-tfinit", "pod-a")).unwrap();
    c.api
        .faults(json!({"throttle": {"get leases": {"retry_after": 1, "times": 1}}}));
    let e = client.get("pod-a-tfinit").unwrap_err();
    match &e {
        Error::TooManyRequests { retry_after, .. } => {
            assert_eq!(*retry_after, Some(Duration::from_secs(1)), "{e}")
        }
        other => panic!("not a 429: {other}"),
    }

    c.api
        .faults(json!({"throttle": {"get leases": {"retry_after": 1, "times": 1}}}));
    c.api.clear_requests();
    let policy = RetryPolicy {
        first: Duration::from_millis(10),
        ..RetryPolicy::default()
    };
    let start = Instant::now();
    let got = policy
        .run(start + Duration::from_secs(20), || {
            client.get("pod-a-tfinit")
        })
        .expect("the retry after Retry-After succeeds");
    let waited = start.elapsed();
    assert_eq!(got.metadata.name, "pod-a-tfinit");
    assert!(
        waited >= Duration::from_secs(1),
        "retried after {waited:?}, before Retry-After"
    );
    assert_eq!(c.codes(), [429, 200]);

    // A Retry-After beyond the caller's deadline: no wait at all, the 429 comes back.
    c.api
        .faults(json!({"throttle": {"get leases": {"retry_after": 30}}}));
    let start = Instant::now();
    let e = policy
        .run(start + Duration::from_secs(5), || {
            client.get("pod-a-tfinit")
        })
        .unwrap_err();
    assert!(matches!(e, Error::TooManyRequests { .. }), "{e}");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn server_errors_are_retried_with_backoff_then_succeed() {
    if !have_deps() {
        return;
    }
    let c = Cluster::start("kube-500");
    let client = c.client();
    let created = client.create(&lease("pod-a-tfinit", "pod-a")).unwrap();
    c.api
        .faults(json!({"fail": {"update leases": {"code": 500, "times": 2}}}));
    c.api.clear_requests();
    let policy = RetryPolicy {
        first: Duration::from_millis(100),
        max: Duration::from_secs(1),
        attempts: 5,
    };
    let start = Instant::now();
    let updated = policy
        .run(start + Duration::from_secs(20), || client.update(&created))
        .expect("the third attempt succeeds");
    let waited = start.elapsed();
    assert_ne!(
        updated.metadata.resource_version,
        created.metadata.resource_version
    );
    assert_eq!(c.codes(), [500, 500, 200]);
    // 100 ms, then 200 ms, each plus up to half by jitter.
    assert!(waited >= Duration::from_millis(300), "{waited:?}");

    // Without a policy, the caller sees the 5xx as it is; 503 too.
    c.api.faults(json!({"fail": {"get leases": {"code": 503}}}));
    let e = client.get("pod-a-tfinit").unwrap_err();
    assert!(matches!(e, Error::ServerError { code: 503, .. }), "{e}");
    // And a policy's attempts end.
    let start = Instant::now();
    let e = policy
        .run(start + Duration::from_secs(20), || {
            client.get("pod-a-tfinit")
        })
        .unwrap_err();
    assert!(matches!(e, Error::ServerError { code: 503, .. }), "{e}");
}

#[test]
fn a_hung_server_ends_at_the_deadline() {
    if !have_deps() {
        return;
    }
    let c = Cluster::start("kube-hung");
    let deadline = Duration::from_secs(1);
    let client = c.client_with(Deadlines {
        connect: Duration::from_secs(1),
        request: deadline,
    });
    client.create(&lease("pod-a-tfinit", "pod-a")).unwrap();
    c.api.faults(json!({"stall": ["get leases"]}));
    let start = Instant::now();
    let e = client.get("pod-a-tfinit").unwrap_err();
    let took = start.elapsed();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    assert!(
        took >= deadline,
        "ended after {took:?}, before the deadline"
    );
    assert!(
        took < deadline + Duration::from_secs(2),
        "ended after {took:?}"
    );
    assert!(
        RetryPolicy::default().delay(1, &e, 0.0).is_some(),
        "a read is retried"
    );

    // A slow answer within the deadline arrives; one beyond it does not.
    c.api.faults(json!({"slow": {"get leases": {"ms": 300}}}));
    let start = Instant::now();
    client.get("pod-a-tfinit").expect("slow but in time");
    assert!(start.elapsed() >= Duration::from_millis(300));
    c.api.faults(json!({"slow": {"get leases": {"ms": 1500}}}));
    let e = client.get("pod-a-tfinit").unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    c.api.faults(json!({}));
    client
        .get("pod-a-tfinit")
        .expect("the server answers again");
}

#[test]
fn a_certificate_of_another_ca_is_refused() {
    if !have_deps() {
        return;
    }
    let c = Cluster::start("kube-wrong-ca");
    // The pod's ca.crt is another cluster's CA: the server's certificate does not verify.
    let other = Pki::new(&c.tmp.0, "other");
    std::fs::copy(&other.ca, c.sa.join("ca.crt")).unwrap();
    let client = c.client();
    let e = client.list("").unwrap_err();
    assert!(matches!(e, Error::Connect { .. }), "{e}");
    let text = e.to_string();
    assert!(text.contains("certificate is invalid"), "{text}");
    assert!(text.contains("refused"), "{text}");
    assert!(c.api.requests().is_empty(), "nothing was sent");
    // The server saw the client give up in the handshake.
    common::wait_for(
        Duration::from_secs(5),
        "the server's handshake error",
        || {
            c.api
                .log_text()
                .contains("TLS handshake error")
                .then_some(())
        },
    );

    // The right CA, for the same server: accepted (the refusal was the CA, nothing else).
    std::fs::copy(&c.pki.ca, c.sa.join("ca.crt")).unwrap();
    c.client()
        .list("")
        .expect("the cluster's CA verifies its server");
}

#[test]
fn a_certificate_for_another_name_is_refused() {
    if !have_deps() {
        return;
    }
    let tmp = TempDir::new("kube-wrong-name");
    let pki = Pki::for_names(&tmp.0, "cluster", "DNS:kubernetes.default.svc");
    let tokens = tmp.join("tokens");
    std::fs::write(&tokens, "t\n").unwrap();
    let api = ApiServer::start_tls(&tmp, NS, &pki, &tokens);
    let sa = tmp.join("sa");
    std::fs::create_dir_all(&sa).unwrap();
    std::fs::write(sa.join("token"), "t").unwrap();
    std::fs::copy(&pki.ca, sa.join("ca.crt")).unwrap();
    std::fs::write(sa.join("namespace"), NS).unwrap();
    let config = Config::from_dir("127.0.0.1", &api.port.to_string(), &sa).unwrap();
    let e = Client::new(config, DEADLINES).list("").unwrap_err();
    assert!(matches!(e, Error::Connect { .. }), "{e}");
    assert!(e.to_string().contains("certificate is invalid"), "{e}");
    assert!(api.requests().is_empty());
}

#[test]
fn kubeadm_shaped_rsa_certificates_are_verified_over_tls_1_3_and_1_2() {
    if !have_deps() {
        return;
    }
    for (name, options) in [
        ("kube-rsa-13", &[][..]),
        ("kube-rsa-12", &["--tls12-only"][..]),
    ] {
        let tmp = TempDir::new(name);
        let pki = Pki::rsa(&tmp.0, "cluster");
        let tokens = tmp.join("tokens");
        std::fs::write(&tokens, "t\n").unwrap();
        let api = ApiServer::start_tls_with(&tmp, NS, &pki, &tokens, options);
        let sa = tmp.join("sa");
        std::fs::create_dir_all(&sa).unwrap();
        std::fs::write(sa.join("token"), "t").unwrap();
        std::fs::copy(&pki.ca, sa.join("ca.crt")).unwrap();
        std::fs::write(sa.join("namespace"), NS).unwrap();
        let config = Config::from_dir("127.0.0.1", &api.port.to_string(), &sa).unwrap();
        let client = Client::new(config, DEADLINES);
        client
            .create(&lease("pod-a-tfinit", "pod-a"))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(client.list("").unwrap().items.len(), 1, "{name}");
        // And another CA's RSA certificate is refused the same way.
        let other = Pki::rsa(&tmp.0, "other");
        std::fs::copy(&other.ca, sa.join("ca.crt")).unwrap();
        let config = Config::from_dir("127.0.0.1", &api.port.to_string(), &sa).unwrap();
        let e = Client::new(config, DEADLINES).list("").unwrap_err();
        assert!(
            e.to_string().contains("certificate is invalid"),
            "{name}: {e}"
        );
    }
}

#[test]
fn a_lost_answer_is_resolved_by_reading_again() {
    if !have_deps() {
        return;
    }
    let c = Cluster::start("kube-lost");
    let client = c.client();
    let created = client.create(&lease("pod-a-tfinit", "pod-a")).unwrap();
    c.api
        .faults(json!({"lose": {"update leases": {"times": 1}}}));
    let mut renewed = created.clone();
    renewed.spec.holder_identity = Some("pod-b".into());
    let e = client.update(&renewed).unwrap_err();
    assert!(matches!(e, Error::AnswerLost { .. }), "{e}");
    assert!(e.to_string().contains("get the Lease again"), "{e}");
    assert!(
        RetryPolicy::default().delay(1, &e, 0.0).is_none(),
        "a write of unknown outcome is the caller's to resolve, not repeated blindly"
    );
    // The caller reads again: the update was applied.
    let now = client.get("pod-a-tfinit").expect("read again");
    assert_eq!(now.spec.holder_identity.as_deref(), Some("pod-b"));
    assert_ne!(
        now.metadata.resource_version,
        created.metadata.resource_version
    );
    // Sending the same update again (what a blind retry would do) is a conflict, never a double
    // write.
    let e = client.update(&renewed).unwrap_err();
    assert!(matches!(e, Error::Conflict { .. }), "{e}");
    assert_eq!(c.codes(), [201, 0, 200, 409]);
}

#[test]
fn a_missing_namespace_is_told_apart_from_a_missing_lease() {
    if !have_deps() {
        return;
    }
    let c = Cluster::start("kube-namespace");
    let client = c.client();
    c.api.namespace(NS, false);
    let e = client.create(&lease("pod-a-tfinit", "pod-a")).unwrap_err();
    assert!(matches!(e, Error::NamespaceNotFound { .. }), "{e}");
    assert!(
        e.to_string()
            .contains(&format!("the namespace {NS} does not exist")),
        "{e}"
    );
    // A get there answers as the real server does: the Lease is not found; a list is empty.
    let e = client.get("pod-a-tfinit").unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
    assert!(client.list("").unwrap().items.is_empty());
    c.api.namespace(NS, true);
    client
        .create(&lease("pod-a-tfinit", "pod-a"))
        .expect("the namespace is back");
}

#[test]
fn nothing_listening_is_a_connect_error_that_is_retried() {
    if !have_deps() {
        return;
    }
    let c = Cluster::start("kube-refused");
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = Config::from_dir("127.0.0.1", &port.to_string(), &c.sa).unwrap();
    let e = Client::new(config, DEADLINES).get("x").unwrap_err();
    assert!(matches!(e, Error::Connect { .. }), "{e}");
    assert!(e.to_string().contains("KUBERNETES_SERVICE_HOST"), "{e}");
    assert!(RetryPolicy::default().delay(1, &e, 0.0).is_some());
}

#[test]
fn names_made_by_lease_name_are_accepted_and_bad_names_are_not_sent() {
    if !have_deps() {
        return;
    }
    let c = Cluster::start("kube-names");
    let client = c.client();
    let long = "p".repeat(253);
    for pod in [
        "provider-terraform-7d9f8-x2b4q",
        "My_Pod",
        long.as_str(),
        "",
        "ä.b..c-",
    ] {
        let name = lease_name(pod, "tfinit");
        client
            .create(&lease(&name, "x"))
            .unwrap_or_else(|e| panic!("{pod:?} -> {name:?}: {e}"));
        assert_eq!(client.get(&name).unwrap().metadata.name, name);
    }
    let e = client.create(&lease("Not_A_Name", "x")).unwrap_err();
    assert!(matches!(e, Error::Invalid { .. }), "{e}");
    assert!(e.to_string().contains("lease_name"), "{e}");
    assert_eq!(c.api.requests().len(), 10, "the bad name was not sent");
    // The server refuses such a name too (422), as the real one does: the client's check is
    // the server's rule.
    let (code, v) = c.api.call(
        "POST",
        &format!("/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"),
        Some(&json!({"metadata": {"name": "Not_A_Name"}})),
        "application/json",
    );
    assert_eq!(code, 422, "{v}");
    assert_eq!(v["reason"], "Invalid");
}

#[test]
fn a_bad_service_account_directory_is_named() {
    if !have_deps() {
        return;
    }
    let c = Cluster::start("kube-sa");
    let port = c.api.port.to_string();
    std::fs::write(c.sa.join("namespace"), "Not_A_Namespace\n").unwrap();
    let e = Config::from_dir("127.0.0.1", &port, &c.sa).unwrap_err();
    assert!(matches!(e, ConfigError::InvalidNamespace { .. }), "{e}");
    std::fs::write(c.sa.join("namespace"), "").unwrap();
    let e = Config::from_dir("127.0.0.1", &port, &c.sa).unwrap_err();
    assert!(
        matches!(
            e,
            ConfigError::Empty {
                what: "namespace",
                ..
            }
        ),
        "{e}"
    );
    std::fs::write(c.sa.join("namespace"), NS).unwrap();
    // The server's key is no certificate: refused, not skipped.
    std::fs::copy(&c.pki.key, c.sa.join("ca.crt")).unwrap();
    let e = Config::from_dir("127.0.0.1", &port, &c.sa).unwrap_err();
    assert!(matches!(e, ConfigError::InvalidCa { .. }), "{e}");
    std::fs::remove_file(c.sa.join("ca.crt")).unwrap();
    let e = Config::from_dir("127.0.0.1", &port, &c.sa).unwrap_err();
    assert!(
        matches!(e, ConfigError::Unreadable { what: "ca.crt", .. }),
        "{e}"
    );
    // An IPv6 host is written in brackets (nothing listens there: the URL is what is checked).
    std::fs::copy(&c.pki.ca, c.sa.join("ca.crt")).unwrap();
    let v6 = Config::from_dir("::1", &port, &c.sa).unwrap();
    assert_eq!(v6.server(), format!("https://[::1]:{port}"));
}

/// What `in_cluster_child` is asked to find (unset: it is not running as the child).
const EXPECT: &str = "KUBE_CLIENT_TEST_EXPECT";

#[test]
fn in_cluster_reads_the_kubelets_variables_and_the_directory_setting() {
    if !have_deps() {
        return;
    }
    let c = Cluster::start("kube-in-cluster");
    // In a child process of this test binary: the environment is the process's, shared by every
    // thread of this one.
    let child = |env: &[(&str, &str)], expect: &str| {
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args(["--ignored", "--exact", "in_cluster_child", "--nocapture"])
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBERNETES_SERVICE_PORT")
            .env_remove(SERVICE_ACCOUNT_DIR_VAR)
            .env(EXPECT, expect);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = common::run_output(&mut cmd, Duration::from_secs(30));
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && text.contains("1 passed"), "{text}");
    };
    let port = c.api.port.to_string();
    let sa = c.sa.display().to_string();
    child(
        &[
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1"),
            ("KUBERNETES_SERVICE_PORT", &port),
            (SERVICE_ACCOUNT_DIR_VAR, &sa),
        ],
        "served",
    );
    child(
        &[
            ("KUBERNETES_SERVICE_PORT", &port),
            (SERVICE_ACCOUNT_DIR_VAR, &sa),
        ],
        "not-in-cluster",
    );
    // A name is refused before anything is read or sent: tfinit has no resolver.
    child(
        &[
            ("KUBERNETES_SERVICE_HOST", "kubernetes.default.svc"),
            ("KUBERNETES_SERVICE_PORT", &port),
            (SERVICE_ACCOUNT_DIR_VAR, &sa),
        ],
        "a-name",
    );
    // Without the setting: the kubelet's directory, which this machine does not have.
    child(
        &[
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1"),
            ("KUBERNETES_SERVICE_PORT", &port),
        ],
        "default-directory",
    );
}

/// The child of the test above (run only by it, as `--ignored --exact`).
#[test]
#[ignore = "run by in_cluster_reads_the_kubelets_variables_and_the_directory_setting"]
fn in_cluster_child() {
    let Ok(expect) = std::env::var(EXPECT) else {
        return; // Not run by its parent (`--include-ignored`): nothing to check.
    };
    let found = Config::in_cluster();
    match expect.as_str() {
        "served" => {
            let config = found.unwrap();
            assert_eq!(config.namespace(), NS);
            Client::new(config, DEADLINES)
                .list("")
                .expect("list in cluster");
        }
        "not-in-cluster" => {
            let e = found.unwrap_err();
            assert!(
                matches!(
                    e,
                    ConfigError::NotInCluster {
                        var: "KUBERNETES_SERVICE_HOST"
                    }
                ),
                "{e}"
            );
        }
        "a-name" => {
            let e = found.unwrap_err();
            assert!(matches!(e, ConfigError::NotAnIp { .. }), "{e}");
            let text = e.to_string();
            for part in [
                "KUBERNETES_SERVICE_HOST=\"kubernetes.default.svc\"",
                "is not an IP address",
                "10.96.0.1",
            ] {
                assert!(text.contains(part), "{part} in {text}");
            }
        }
        "default-directory" => match found {
            Err(ConfigError::Unreadable { path, .. }) => {
                assert_eq!(
                    path,
                    std::path::Path::new(SERVICE_ACCOUNT_DIR).join("token")
                )
            }
            other => panic!("{other:?}"),
        },
        other => panic!("unknown expectation {other}"),
    }
}

//! A small, blocking client of the Kubernetes API for `coordination.k8s.io/v1` Leases: the ground
//! of the Lease store (issue 24). It blocks for as long as the API server takes, up to its
//! deadlines: only the recorder thread and helper processes may call it, never the PID-1 loop.
//!
//! - [`Config`]: the in-cluster configuration as client-go's `rest.InClusterConfig` finds it
//!   (`KUBERNETES_SERVICE_HOST`, `KUBERNETES_SERVICE_PORT`, and `token`, `ca.crt`, `namespace` of
//!   the service-account directory, which `TFINIT_SERVICE_ACCOUNT_DIR` may move).
//! - [`Client`]: get, list by label selector, create, update (optimistic, on
//!   `metadata.resourceVersion`) and delete (optionally on a precondition) of [`Lease`]s in the
//!   pod's namespace, over HTTPS verified against `ca.crt` (never skipped), with a deadline on
//!   every request. The token is re-read at least once a minute and on every 401 (then the
//!   request is sent once more).
//! - [`Error`]: one variant per answer a caller decides on; every message says what to do.
//! - [`RetryPolicy`]: backoff with jitter for 429, 5xx and connection errors, honouring
//!   `Retry-After`. The client never retries by itself (but for the one retry after a 401): a
//!   caller chooses, and the policy's loop ends at the caller's deadline.
//! - [`lease_name`]: a valid Lease name (DNS subdomain) from any pod name and a suffix.
//!
//! The HTTPS stack is ureq 3 (HTTP/1.1) over rustls with ring (see Cargo.toml for what each
//! costs); nothing here parses HTTP or TLS by hand.

mod client;
mod config;
mod crypto;
mod error;
mod lease;
mod microtime;
mod names;
mod retry;
mod token;
mod transport;

pub use client::{Client, LeaseList, Precondition, Unreadable};
pub use config::{Config, ConfigError, SERVICE_ACCOUNT_DIR, SERVICE_ACCOUNT_DIR_VAR};
pub use error::{Error, Op, Status, Verb, ROLE_RULE};
pub use lease::{Lease, LeaseSpec, ObjectMeta};
pub use microtime::MicroTime;
pub use names::{
    is_dns_subdomain, is_label_value, label_value, lease_name, MAX_LABEL_VALUE, MAX_NAME,
};
pub use retry::{jitter, RetryPolicy};
pub use transport::Deadlines;

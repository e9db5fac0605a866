//! One HTTPS request to the API server, start to end within its deadlines: the bearer token
//! (fresh: [`super::token`]), the one retry after a 401, the answer read whole, and every failure
//! of the transport named as the caller decides on it ([`Error`]). HTTP/1.1 and TLS are ureq's
//! and rustls's; this file only configures and translates.
//!
//! The configuration, on purpose:
//! - TLS with rustls and ring (the algorithms of [`super::crypto`]), trusting only the service
//!   account's `ca.crt`; verification is never turned off (an invalid server certificate is a
//!   [`Error::Connect`] that says so).
//! - The server's IP address from the configuration, no name lookup (`TheServer`).
//! - A deadline on connecting (TCP, TLS) and one on the whole request (sending it and
//!   reading the whole answer): a hung server costs at most that, never a thread forever.
//! - No proxy from the environment: the API server is reached at the address the kubelet gave,
//!   inside the cluster (client-go honours HTTPS_PROXY; a controller's proxy setting for the
//!   outside world must not capture the API's traffic).
//! - No redirects (the API server sends none; a redirect would carry the token elsewhere).
//! - Connections are kept for reuse (a TLS handshake per request would cost the API server more
//!   than the request); ureq checks an idle one is still open before reusing it. ureq never sends
//!   a request twice by itself.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ureq::http::{header, Method, Request, Response};
use ureq::tls::{RootCerts, TlsConfig, TlsProvider};
use ureq::unversioned::resolver::{ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::NextTimeout;
use ureq::Body;

use super::config::Parts;
use super::error::{Error, Op, Status};
use super::token::Token;

/// The largest answer read (a list of many Leases, each up to the API's 1.5 MiB object limit
/// in theory; tfinit's own are far smaller). A larger one is [`Error::Malformed`].
const MAX_ANSWER: u64 = 64 << 20;

/// How long a request may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    /// To have a connection: DNS, TCP and the TLS handshake.
    pub connect: Duration,
    /// The whole request: connecting, sending, and reading the whole answer. After a 401 the
    /// request is sent once more, with a deadline of its own: a call takes at most twice this.
    pub request: Duration,
}

impl Default for Deadlines {
    /// 5 s to connect, 10 s in all: client-go's leader election renews within 10 s.
    fn default() -> Deadlines {
        Deadlines {
            connect: Duration::from_secs(5),
            request: Duration::from_secs(10),
        }
    }
}

/// What the server answered: a code, `Retry-After`, and the body.
pub(super) struct Answer {
    /// The HTTP status code.
    pub code: u16,
    /// `Retry-After`, in seconds (the API server's form; an HTTP date is ignored).
    pub retry_after: Option<Duration>,
    /// The body, whole.
    pub body: String,
}

/// The "resolver" of the agent: the API server's address from the configuration, for every
/// request (the agent sends to that server only; `https_only` and no redirects keep it so).
#[derive(Debug)]
struct TheServer(SocketAddr);

impl Resolver for TheServer {
    fn resolve(
        &self,
        _uri: &ureq::http::Uri,
        _config: &ureq::config::Config,
        _timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let mut addrs = self.empty();
        addrs.push(self.0);
        Ok(addrs)
    }
}

/// The HTTPS connection to one API server with one service account.
pub(super) struct Transport {
    agent: ureq::Agent,
    server: String,
    ca_path: PathBuf,
    token: Mutex<Token>,
    deadlines: Deadlines,
}

impl Transport {
    /// A transport for the configuration `parts`, with `deadlines` on every request.
    pub(super) fn new(parts: Parts, deadlines: Deadlines) -> (Transport, String) {
        let tls = TlsConfig::builder()
            .provider(TlsProvider::Rustls)
            .root_certs(RootCerts::Specific(Arc::new(parts.ca)))
            .unversioned_rustls_crypto_provider(super::crypto::provider())
            .build();
        let config = ureq::Agent::config_builder()
            .tls_config(tls)
            .https_only(true)
            .http_status_as_error(false)
            .proxy(None)
            .max_redirects(0)
            .timeout_connect(Some(deadlines.connect))
            .timeout_global(Some(deadlines.request))
            .user_agent(concat!("tfinit/", env!("CARGO_PKG_VERSION")))
            // Small buffers: the answers are small, and memory in a controller's pod is not.
            .input_buffer_size(32 << 10)
            .output_buffer_size(32 << 10)
            .max_idle_connections(2)
            .max_idle_connections_per_host(2)
            .build();
        // The connector is ureq's own (TCP, then rustls); the resolver is ours: the server's
        // address, never a lookup, so no resolver is linked (src/ip.rs says why).
        let agent = ureq::Agent::with_parts(
            config,
            ureq::unversioned::transport::DefaultConnector::default(),
            TheServer(parts.addr),
        );
        let transport = Transport {
            agent,
            server: parts.server,
            ca_path: parts.ca_path,
            token: Mutex::new(Token::new(parts.token_path, parts.token, Instant::now())),
            deadlines,
        };
        (transport, parts.namespace)
    }

    /// `https://HOST:PORT`.
    pub(super) fn server(&self) -> &str {
        &self.server
    }

    /// Sends `method` to `path` (from `/apis/...`, query included) with `body` (JSON), and reads
    /// the whole answer. After a 401 the token file is read again and the request sent once
    /// more; a second 401 is the answer.
    pub(super) fn call(
        &self,
        op: &Op,
        method: Method,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<Answer, Error> {
        let token = self.lock_token().current(Instant::now()).to_string();
        let answer = self.send(op, &method, path, body, &token)?;
        if answer.code != 401 {
            return Ok(answer);
        }
        let reread = self.lock_token().reread(Instant::now());
        if let Err(e) = reread {
            let path = self.lock_token().path().to_path_buf();
            return Err(Error::Unauthorized {
                op: op.clone(),
                token: path.clone(),
                status: Box::new(Status {
                    code: 401,
                    reason: "Unauthorized".into(),
                    message: format!("and {} cannot be read again: {e}", path.display()),
                    details: None,
                }),
            });
        }
        let token = self.lock_token().current(Instant::now()).to_string();
        self.send(op, &method, path, body, &token)
    }

    /// The token, whatever a panicking thread left (its value is a whole string either way).
    fn lock_token(&self) -> std::sync::MutexGuard<'_, Token> {
        self.token.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The token file (for messages).
    pub(super) fn token_path(&self) -> PathBuf {
        self.lock_token().path().to_path_buf()
    }

    /// One request, one answer.
    fn send(
        &self,
        op: &Op,
        method: &Method,
        path: &str,
        body: Option<&[u8]>,
        token: &str,
    ) -> Result<Answer, Error> {
        let request = Request::builder()
            .method(method.clone())
            .uri(format!("{}{path}", self.server))
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .header(header::ACCEPT, "application/json");
        let sent = match body {
            Some(b) => request
                .header(header::CONTENT_TYPE, "application/json")
                .body(b)
                .map(|r| self.agent.run(r)),
            None => request.body(()).map(|r| self.agent.run(r)),
        };
        let response = sent
            .map_err(|e| Error::Invalid {
                problem: format!("not a valid HTTP request: {e}"),
                op: op.clone(),
            })?
            .map_err(|e| self.transport_error(op, e))?;
        self.read(op, response)
    }

    /// The code, `Retry-After` and whole body of a response.
    fn read(&self, op: &Op, mut response: Response<Body>) -> Result<Answer, Error> {
        let code = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let body = response
            .body_mut()
            .with_config()
            .limit(MAX_ANSWER)
            .read_to_vec()
            .map_err(|e| self.transport_error(op, e))?;
        let body = String::from_utf8(body).map_err(|e| Error::Malformed {
            detail: "the answer is not UTF-8".into(),
            raw: String::from_utf8_lossy(e.as_bytes()).into_owned(),
            op: op.clone(),
        })?;
        Ok(Answer {
            code,
            retry_after,
            body,
        })
    }

    /// The [`Error`] of a failure below HTTP's answers: connecting, a deadline, a connection
    /// that ended, an answer that is not HTTP.
    fn transport_error(&self, op: &Op, e: ureq::Error) -> Error {
        use ureq::Error as U;
        let connect = |detail: String| Error::Connect {
            server: self.server.clone(),
            detail,
            op: op.clone(),
        };
        let lost = |detail: String| Error::AnswerLost {
            detail,
            op: op.clone(),
        };
        match e {
            U::Timeout(phase @ (ureq::Timeout::Resolve | ureq::Timeout::Connect)) => {
                connect(format!(
                    "no connection within {:?} ({phase}); check KUBERNETES_SERVICE_HOST and \
                     KUBERNETES_SERVICE_PORT, and that the API server is up",
                    self.deadlines.connect
                ))
            }
            U::Timeout(phase) => Error::Timeout {
                after: self.deadlines.request,
                phase: phase.to_string(),
                op: op.clone(),
            },
            U::Rustls(tls) => connect(self.tls_problem(&tls)),
            U::Tls(what) => connect(format!("TLS: {what}")),
            U::Io(io) => {
                if let Some(tls) = io.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                    return connect(self.tls_problem(tls));
                }
                use std::io::ErrorKind as K;
                match io.kind() {
                    K::ConnectionRefused
                    | K::AddrNotAvailable
                    | K::NetworkUnreachable
                    | K::HostUnreachable
                    | K::NetworkDown => connect(format!(
                        "{io}; check KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT, and \
                         that the API server is up"
                    )),
                    K::TimedOut | K::WouldBlock => Error::Timeout {
                        after: self.deadlines.request,
                        phase: io.to_string(),
                        op: op.clone(),
                    },
                    K::UnexpectedEof => lost("the server closed the connection".into()),
                    K::ConnectionReset => lost("the connection was reset".into()),
                    // getaddrinfo's failures have no ErrorKind of their own; std words them so.
                    _ if io.to_string().contains("failed to lookup address") => connect(format!(
                        "{io}; check KUBERNETES_SERVICE_HOST and the pod's DNS"
                    )),
                    // The request may have left: what happened to it is unknown.
                    _ => lost(io.to_string()),
                }
            }
            U::ConnectionFailed => connect("the connection failed".into()),
            U::Protocol(p) => lost(format!("not an HTTP answer: {p}")),
            U::BodyExceedsLimit(n) => Error::Malformed {
                detail: format!("the answer is larger than {n} bytes"),
                raw: String::new(),
                op: op.clone(),
            },
            U::LargeResponseHeader(got, max) => Error::Malformed {
                detail: format!("the answer's head is {got} bytes, over {max}"),
                raw: String::new(),
                op: op.clone(),
            },
            other => connect(other.to_string()),
        }
    }

    /// What a TLS failure means, refused either way: verification is never skipped.
    fn tls_problem(&self, e: &rustls::Error) -> String {
        match e {
            rustls::Error::InvalidCertificate(why) => format!(
                "TLS: the server's certificate is invalid ({why:?}) for the CA in {}: refused \
                 (verification is never skipped); check that ca.crt is the cluster's CA and that \
                 KUBERNETES_SERVICE_HOST is an address the API server's certificate names",
                self.ca_path.display()
            ),
            other => format!("TLS: {other}; refused"),
        }
    }
}

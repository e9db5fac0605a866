//! One moto server (fake S3 + DynamoDB) per test, for the s3-backend tests (tests/locks_*.rs,
//! tests/container_*.rs): started on a free port of 127.0.0.1 with bucket `tfstate` and lock
//! table `tflock`, read back over plain HTTP, killed when the test ends (also on a panic, and by
//! the kernel when the test thread dies without unwinding).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use super::{deps, wait_for, TempDir};

/// The bucket the s3 backend stores states in.
pub const BUCKET: &str = "tfstate";

/// A moto server of this test; killed on drop.
pub struct Moto {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Its log (moto.log), printed when the test fails.
    dir: TempDir,
}

impl Moto {
    /// Starts moto_server of the test dependencies and creates the bucket and the lock table;
    /// waits at most 30 s for it to answer.
    pub fn start() -> Moto {
        let dir = TempDir::new("moto");
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port for moto")
            .port();
        let log = std::fs::File::create(dir.join("moto.log")).unwrap();
        let mut cmd = Command::new(deps().join("venv/bin/moto_server"));
        cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        // SAFETY: prctl is async-signal-safe and touches no memory of ours.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd.spawn().expect("start moto_server");
        let moto = Moto { child, port, dir };
        wait_for(Duration::from_secs(30), "moto_server to answer", || {
            http(port, "GET", "/moto-api/", "", "").ok()
        });
        let (status, body) = http(port, "PUT", &format!("/{BUCKET}"), "s3", "").unwrap();
        assert_eq!(status, 200, "create bucket: {body}");
        let table = json!({
            "TableName": "tflock",
            "AttributeDefinitions": [{"AttributeName": "LockID", "AttributeType": "S"}],
            "KeySchema": [{"AttributeName": "LockID", "KeyType": "HASH"}],
            "BillingMode": "PAY_PER_REQUEST",
        });
        moto.dynamodb("CreateTable", &table);
        moto
    }

    /// Stops the server (SIGKILL) and waits for it: the backend stops answering, as when the
    /// endpoint is unreachable.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Its URL, for the backend's endpoint settings.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// One DynamoDB operation; its answer.
    pub fn dynamodb(&self, op: &str, body: &Value) -> Value {
        let (status, text) = http(self.port, "POST", op, "dynamodb", &body.to_string()).unwrap();
        assert_eq!(status, 200, "DynamoDB {op}: {text}");
        serde_json::from_str(&text).unwrap()
    }

    /// The Info (terraform's LockInfo JSON) of the lock item `lock_id` (`tfstate/KEY`), if held.
    pub fn lock(&self, lock_id: &str) -> Option<Value> {
        let item = self.dynamodb(
            "GetItem",
            &json!({"TableName": "tflock", "Key": {"LockID": {"S": lock_id}}}),
        );
        let info = item.get("Item")?.get("Info")?.get("S")?.as_str()?;
        Some(serde_json::from_str(info).unwrap())
    }

    /// Every item of the lock table (locks and the `-md5` digests).
    pub fn items(&self) -> Vec<Value> {
        let scan = self.dynamodb("Scan", &json!({"TableName": "tflock"}));
        scan["Items"].as_array().cloned().unwrap_or_default()
    }

    /// The LockInfo in the S3 lock object of the state `key` (`<key>.tflock`, terraform 1.10+'s
    /// `use_lockfile`), if there is one.
    pub fn lock_object(&self, key: &str) -> Option<Value> {
        let (status, body) = http(
            self.port,
            "GET",
            &format!("/{BUCKET}/{key}.tflock"),
            "s3",
            "",
        )
        .unwrap_or_else(|e| panic!("GET the lock object of {key} from moto: {e}"));
        match status {
            200 => {
                Some(serde_json::from_str(&body).unwrap_or_else(|e| {
                    panic!("the lock object of {key} is not JSON ({e}): {body}")
                }))
            }
            404 => None,
            _ => panic!("GET the lock object of {key} from moto: HTTP {status}: {body}"),
        }
    }

    /// The locks (their LockInfo) held on the state `key` of the bucket.
    pub fn locks(&self, key: &str) -> Vec<Value> {
        self.lock(&format!("{BUCKET}/{key}")).into_iter().collect()
    }

    /// The state stored under `key` (Null when there is none).
    pub fn state(&self, key: &str) -> Value {
        let (status, body) = http(self.port, "GET", &format!("/{BUCKET}/{key}"), "s3", "")
            .unwrap_or_else(|e| panic!("GET the state {key} from moto: {e}"));
        match status {
            200 => serde_json::from_str(&body)
                .unwrap_or_else(|e| panic!("the state {key} is not JSON ({e}): {body}")),
            404 => Value::Null,
            _ => panic!("GET the state {key} from moto: HTTP {status}: {body}"),
        }
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "----- moto.log -----\n{}",
                super::read(&self.dir.join("moto.log"))
            );
        }
    }
}

/// One HTTP/1.1 request to moto. `service` names the AWS service in a (fake) SigV4 header, which
/// is how moto routes a request; for DynamoDB `path` is the operation.
pub fn http(
    port: u16,
    method: &str,
    path: &str,
    service: &str,
    body: &str,
) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut head = String::new();
    let target = if service == "dynamodb" {
        head.push_str(&format!("X-Amz-Target: DynamoDB_20120810.{path}\r\n"));
        head.push_str("Content-Type: application/x-amz-json-1.0\r\n");
        "/"
    } else {
        path
    };
    if !service.is_empty() {
        head.push_str(&format!(
            "Authorization: AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/{service}/aws4_request, SignedHeaders=host, Signature=0\r\n"
        ));
    }
    write!(
        s,
        "{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Length: {}\r\n{head}\r\n{body}",
        body.len()
    )?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let status = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

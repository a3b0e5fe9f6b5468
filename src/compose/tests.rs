//! The client against wiremock and a hand-written loopback HTTP server (for chunked, cut and
//! silent streams, which wiremock cannot produce).

mod calls;
mod errors;
mod fuzz;
mod streams;

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use wiremock::{MockServer, ResponseTemplate};

use super::{ClientOptions, ComposeClient, ComposeRequest};

pub(super) const TOKEN: &str = "cm-secret-token";
pub(super) const R2: &str = "model-sg-glm53-w4afp8-tp4-r2";
pub(super) const FILE: &str = "prod/GLM-5.3-Flash-SGL-TP4-W4AFP8-LongContext.yaml";

pub(super) fn opts() -> ClientOptions {
    ClientOptions {
        connect_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(2),
        stream_idle_timeout: Duration::from_secs(2),
        ..ClientOptions::default()
    }
}

pub(super) fn client_for(base_url: &str, opts: ClientOptions) -> ComposeClient {
    ComposeClient::new(base_url, TOKEN, opts).expect("valid client")
}

pub(super) fn client(server: &MockServer) -> ComposeClient {
    client_for(&server.uri(), opts())
}

pub(super) fn env() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("GLM53_HICACHE_RAM_BUDGET".to_owned(), "406GiB".to_owned()),
        ("HF_TOKEN".to_owned(), "hf_very_secret".to_owned()),
    ])
}

pub(super) fn up_req(service: &str) -> ComposeRequest {
    ComposeRequest {
        tag: "v0.0.452".parse().expect("a valid name"),
        file: FILE.parse().expect("a valid name"),
        services: super::Services::one(service.parse().expect("a valid name")),
        env: env(),
        force_recreate: None,
    }
}

pub(super) fn down_req(service: &str) -> ComposeRequest {
    ComposeRequest {
        tag: "v0.0.451".parse().expect("a valid name"),
        file: FILE.parse().expect("a valid name"),
        services: super::Services::one(service.parse().expect("a valid name")),
        env: env(),
        force_recreate: None,
    }
}

/// NDJSON body: each line followed by `\n`.
pub(super) fn ndjson(lines: &[&str]) -> String {
    lines.iter().map(|l| format!("{l}\n")).collect()
}

pub(super) fn stream_body(body: impl Into<String>) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_raw(body.into(), "application/x-ndjson")
}

pub(super) fn error_body(status: u16, error: &str) -> ResponseTemplate {
    ResponseTemplate::new(status)
        .set_body_json(serde_json::json!({"status": "error", "error": error}))
}

pub(super) const OUT: &str =
    r#"{"event":"stdout","data":"Container model-sg-glm53-w4afp8-tp4-r2 Started"}"#;
pub(super) const ERR: &str = r#"{"event":"stderr","data":"Pulling model-sg-glm53-w4afp8-tp4-r2"}"#;
pub(super) const DONE_OK: &str = r#"{"event":"done","success":true,"exit_code":0}"#;

/// What the loopback server does after reading the request.
pub(super) enum Step {
    Write(Vec<u8>),
    Sleep(Duration),
}

/// Response head of a chunked NDJSON answer.
pub(super) fn chunked_head() -> Step {
    Step::Write(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\ntransfer-encoding: chunked\r\n\r\n"
            .to_vec(),
    )
}

/// One HTTP chunk carrying `data`.
pub(super) fn chunk(data: &str) -> Step {
    Step::Write(format!("{:x}\r\n{data}\r\n", data.len()).into_bytes())
}

/// The chunked body's terminator (a clean end).
pub(super) fn last_chunk() -> Step {
    Step::Write(b"0\r\n\r\n".to_vec())
}

/// A loopback server that answers one connection with `script`, then closes it.
pub(super) async fn scripted_server(script: Vec<Step>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let Ok((mut socket, _)) = listener.accept().await else {
            return;
        };
        read_request(&mut socket).await;
        for step in script {
            match step {
                Step::Write(bytes) => {
                    if socket.write_all(&bytes).await.is_err() {
                        return;
                    }
                    let _ = socket.flush().await;
                }
                Step::Sleep(d) => tokio::time::sleep(d).await,
            }
        }
        let _ = socket.shutdown().await;
    });
    format!("http://{addr}")
}

/// Reads the request head and its `content-length` body.
async fn read_request(socket: &mut tokio::net::TcpStream) {
    let mut buf = Vec::new();
    let mut byte = [0u8; 4096];
    for _ in 0..1000 {
        let Ok(n) = socket.read(&mut byte).await else {
            return;
        };
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&byte[..n]);
        let Some(head_end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        if buf.len() >= head_end + 4 + length {
            return;
        }
    }
}

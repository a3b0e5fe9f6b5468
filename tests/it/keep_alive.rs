//! A soak's probes reuse their connections: the `/health` prober and the compose
//! client each keep one keep-alive connection per host between probes, rather than opening
//! one per request. Counted on a loopback server that answers any number of requests per
//! connection and counts the connections it accepts.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use canaryd::compose::{ClientOptions, ComposeClient, LogsRequest};
use canaryd::probe::HealthProber;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A server answering every request with `{"status":"ok","output":<body>}` over
/// HTTP/1.1 keep-alive; the count is of the connections it accepted.
async fn counting_server(output: &'static str) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        for _ in 0..100 {
            let Ok((socket, _)) = listener.accept().await else {
                return;
            };
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve(socket, output));
        }
    });
    (format!("http://{addr}"), accepted)
}

async fn serve(mut socket: TcpStream, output: &'static str) {
    let body = serde_json::json!({"status": "ok", "output": output}).to_string();
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = [0u8; 4096];
    for _ in 0..1000 {
        // One request: its head, then its `content-length` body.
        let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") else {
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => pending.extend_from_slice(&buf[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&pending[..end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        if pending.len() < end + 4 + length {
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => pending.extend_from_slice(&buf[..n]),
            }
            continue;
        }
        pending.drain(..end + 4 + length);
        if socket.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}

#[tokio::test]
async fn health_samples_reuse_one_connection_per_host() {
    let (url, accepted) = counting_server("").await;
    let prober = HealthProber::new(Duration::from_secs(5));
    for probe in 0..5 {
        let sample = prober.sample(&format!("{url}/health")).await;
        assert!(sample.is_healthy(), "probe {probe}: {sample:?}");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "connections opened");
}

#[tokio::test]
async fn a_soaks_compose_reads_reuse_one_connection_per_host() {
    let ps = r#"{"ID":"a1","Names":"r2","Status":"Up 2 minutes"}"#;
    let (url, accepted) = counting_server(ps).await;
    let opts = ClientOptions {
        connect_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_secs(5),
        ..ClientOptions::default()
    };
    let client = ComposeClient::new(&url, "cm-token", opts).expect("client");
    let logs = LogsRequest {
        file: "prod/r2.yaml".parse().expect("a valid name"),
        service: "r2".parse().expect("a valid name"),
        tail: 500,
    };
    for probe in 0..5 {
        let found = client.ps_service("r2").await.expect("ps");
        assert_eq!(found.map(|c| c.id), Some("a1".to_owned()), "probe {probe}");
        assert_eq!(client.ps().await.expect("ps").len(), 1, "probe {probe}");
        client.logs(&logs).await.expect("logs");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "connections opened");
}

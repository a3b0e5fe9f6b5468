//! The analysis's scrapes: one keep-alive HTTP/1 connection per replica, kept for the step,
//! each with a read buffer of a fixed [`READ_BUF`] bytes.
//!
//! A connection per scrape (what reqwest's pool does when it keeps no idle connection) costs
//! a TCP handshake, a connection task and the client's layers every `interval`; reqwest's
//! pool instead keeps each idle connection's read buffer as large as a ~200 KiB page grew it
//! (76 MiB for 400 connections, see docs/performance.md). hyper's own HTTP/1 connection
//! takes an exact read size, so an idle one holds [`READ_BUF`]. A connection the engine closed
//! between scrapes is replaced once, at the next scrape (a GET is safe to send again);
//! `https://` pages go through reqwest.

use std::pin::Pin;
use std::time::Duration;

use hyper::body::Body as _;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;

use crate::domain::exposition::{FamilyLines, Page};

/// The read buffer of a connection, and so the largest body chunk.
pub(super) const READ_BUF: usize = 16 * 1024;

/// Where a replica's page is, and the connection to it, if one is open.
pub(super) struct Scraper {
    url: String,
    /// `host:port` and the path (with its query) of an `http://` URL; `None` sends through
    /// reqwest (`https://`, or a URL this cannot take apart).
    plain: Option<(String, String)>,
    sender: Option<http1::SendRequest<String>>,
}

impl Scraper {
    pub(super) fn new(url: &str) -> Scraper {
        let plain = reqwest::Url::parse(url)
            .ok()
            .filter(|u| u.scheme() == "http" && u.username().is_empty() && u.password().is_none())
            .and_then(|u| {
                // An IPv6 host comes bracketed, as `connect` and `Host` take it.
                let host = u.host_str()?.to_owned();
                let port = u.port_or_known_default()?;
                let path = match u.query() {
                    Some(q) => format!("{}?{q}", u.path()),
                    None => u.path().to_owned(),
                };
                Some((format!("{host}:{port}"), path))
            });
        Scraper {
            url: url.to_owned(),
            plain,
            sender: None,
        }
    }

    /// One scrape: the page's lines of `families`, parsed; `timeout` bounds all of it. Errors
    /// read as the probes' (`timeout`, `connection refused`, `request failed`, `HTTP 503`).
    pub(super) async fn scrape(
        &mut self,
        client: &reqwest::Client,
        families: &[&str],
        timeout: Duration,
    ) -> Result<Page, String> {
        let Some((authority, path)) = self.plain.clone() else {
            return super::scrape(client, &self.url, families).await;
        };
        match tokio::time::timeout(timeout, self.plain_scrape(&authority, &path, families)).await {
            Ok(Ok(page)) => Ok(page),
            Ok(Err(e)) => {
                self.sender = None;
                Err(e)
            }
            Err(_) => {
                // Mid-answer, maybe: the connection is not used again.
                self.sender = None;
                Err("timeout".to_owned())
            }
        }
    }

    async fn plain_scrape(
        &mut self,
        authority: &str,
        path: &str,
        families: &[&str],
    ) -> Result<Page, String> {
        let res = self.send(authority, path).await?;
        if !res.status().is_success() {
            return Err(format!("HTTP {}", res.status().as_u16()));
        }
        // Only the checks' families are kept as the body arrives: never the whole page.
        let mut lines = FamilyLines::new(families);
        let mut body = res.into_body();
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
            let frame = frame.map_err(|_| "body not read".to_owned())?;
            if let Ok(data) = frame.into_data() {
                lines.push(&data);
            }
        }
        lines.finish().map_err(|e| e.to_string())
    }

    /// The GET, on the kept connection if it is still open, else (or if the engine closed it
    /// under the request) on a new one.
    async fn send(
        &mut self,
        authority: &str,
        path: &str,
    ) -> Result<hyper::Response<hyper::body::Incoming>, String> {
        if let Some(mut sender) = self.sender.take() {
            if sender.ready().await.is_ok() {
                if let Ok(res) = sender.send_request(request(authority, path)?).await {
                    self.sender = Some(sender);
                    return Ok(res);
                }
            }
        }
        let mut sender = connect(authority).await?;
        let res = sender
            .send_request(request(authority, path)?)
            .await
            .map_err(|_| "request failed".to_owned())?;
        self.sender = Some(sender);
        Ok(res)
    }
}

fn request(authority: &str, path: &str) -> Result<hyper::Request<String>, String> {
    hyper::Request::get(path)
        .header(hyper::header::HOST, authority)
        .header(hyper::header::ACCEPT, "*/*")
        .body(String::new())
        .map_err(|e| e.to_string())
}

async fn connect(authority: &str) -> Result<http1::SendRequest<String>, String> {
    let stream = tokio::net::TcpStream::connect(authority)
        .await
        .map_err(|_| "connection refused".to_owned())?;
    let _ = stream.set_nodelay(true);
    let (sender, connection) = http1::Builder::new()
        .read_buf_exact_size(Some(READ_BUF))
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|_| "connection refused".to_owned())?;
    // Ends when `sender` is dropped (the step ended, or the connection is replaced).
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    const PAGE: &str = "# TYPE x_total counter\nx_total{priority=\"0\"} 3\nother 1\n";

    /// A loopback engine answering every GET with [`PAGE`] (`Connection: close` when
    /// `close`), counting the connections it accepted. At most `limit` of them.
    async fn engine(close: bool, limit: usize) -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}/metrics", listener.local_addr().expect("addr"));
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            for _ in 0..limit {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    // At most 10 requests on one connection.
                    for _ in 0..10 {
                        let mut read = 0;
                        while !buf[..read].windows(4).any(|w| w == b"\r\n\r\n") {
                            match socket.read(&mut buf[read..]).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => read += n,
                            }
                        }
                        let head = format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n{}\r\n",
                            PAGE.len(),
                            if close { "Connection: close\r\n" } else { "" }
                        );
                        let answer = [head.as_bytes(), PAGE.as_bytes()].concat();
                        if socket.write_all(&answer).await.is_err() || close {
                            return;
                        }
                    }
                });
            }
        });
        (url, accepted)
    }

    async fn three_scrapes(url: &str) -> Vec<Result<usize, String>> {
        let client = reqwest::Client::new();
        let mut scraper = Scraper::new(url);
        let mut out = Vec::new();
        for _ in 0..3 {
            let page = scraper
                .scrape(&client, &["x_total"], Duration::from_secs(10))
                .await;
            out.push(page.map(|p| p.counter("x_total").len()));
        }
        out
    }

    #[tokio::test]
    async fn scrapes_of_one_replica_share_one_connection() {
        let (url, accepted) = engine(false, 10).await;
        assert_eq!(three_scrapes(&url).await, vec![Ok(1), Ok(1), Ok(1)]);
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_connection_the_engine_closes_is_replaced_at_the_next_scrape() {
        let (url, accepted) = engine(true, 10).await;
        assert_eq!(three_scrapes(&url).await, vec![Ok(1), Ok(1), Ok(1)]);
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn an_engine_that_is_not_listening_is_connection_refused() {
        let port = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind")
            .local_addr()
            .expect("addr")
            .port();
        let url = format!("http://127.0.0.1:{port}/metrics");
        let refused = Err("connection refused".to_owned());
        assert_eq!(
            three_scrapes(&url).await,
            vec![refused.clone(), refused.clone(), refused]
        );
    }

    #[test]
    fn plain_http_urls_are_taken_apart_and_others_go_through_reqwest() {
        let plain = |url: &str| Scraper::new(url).plain;
        assert_eq!(
            plain("http://10.0.0.7:30001/metrics?x=1"),
            Some(("10.0.0.7:30001".to_owned(), "/metrics?x=1".to_owned()))
        );
        assert_eq!(
            plain("http://engine/metrics"),
            Some(("engine:80".to_owned(), "/metrics".to_owned()))
        );
        assert_eq!(
            plain("http://[::1]:9/m"),
            Some(("[::1]:9".to_owned(), "/m".to_owned()))
        );
        assert_eq!(plain("https://engine/metrics"), None);
        assert_eq!(plain("http://user:pw@engine/metrics"), None);
    }
}

//! What every request passes before its route: the refusals a hostile web page or client
//! meets (docs/reference.md#the-edge).
//!
//! - A body declared larger than the limit is refused 413 from its `Content-Length`, before a
//!   byte of it is read.
//! - Without `auth.tokens` (dev mode, or `serve` on loopback), anyone who can reach the port is
//!   an operator, and so is any web page the operator has open: a request whose `Host` is not a
//!   loopback name or the `listen` address is refused 421 (DNS rebinding), and a request that
//!   changes something (any method but GET and HEAD) whose `Origin` is not the daemon's own, or
//!   whose `Sec-Fetch-Site` is `cross-site`, is refused 403.
//! - Every answer says it is not to be framed or sniffed (`X-Frame-Options: DENY`,
//!   `Content-Security-Policy: frame-ancestors 'none'`, `X-Content-Type-Options: nosniff`).

use std::net::IpAddr;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::body::MAX_BODY_BYTES;
use super::{ApiError, AppState};

/// The policy of every answer; the dashboard's own is stricter (`dashboard.rs`).
pub(super) const FRAME_POLICY: &str = "frame-ancestors 'none'";

pub(super) async fn guard(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let refused = refusal(&state, req.method(), req.headers());
    let mut res = match refused {
        Some(error) => error.into_response(),
        None => next.run(req).await,
    };
    let headers = res.headers_mut();
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers
        .entry(header::CONTENT_SECURITY_POLICY)
        .or_insert(HeaderValue::from_static(FRAME_POLICY));
    res
}

fn refusal(state: &AppState, method: &Method, headers: &HeaderMap) -> Option<ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Some(ApiError::PayloadTooLarge(format!(
            "the body is larger than the limit of {MAX_BODY_BYTES} bytes (Content-Length)"
        )));
    }
    if !state.tokens.is_empty() {
        return None;
    }
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    if let Some(host) = host {
        if !is_local_host(host, state.config.listen.ip()) {
            return Some(ApiError::MisdirectedHost(format!(
                "Host {host} is not this daemon's: without auth.tokens it answers only to \
                 localhost, a loopback address or its listen address"
            )));
        }
    }
    if matches!(*method, Method::GET | Method::HEAD) {
        return None;
    }
    let site = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok());
    if site == Some("cross-site") {
        return Some(ApiError::Forbidden(
            "a cross-site request (Sec-Fetch-Site: cross-site) may not change anything \
             without auth.tokens"
                .into(),
        ));
    }
    let origin = headers
        .get(header::ORIGIN)
        .map(|v| v.to_str().unwrap_or("?"));
    if let Some(origin) = origin {
        let own = host.is_some_and(|host| origin_authority(origin) == Some(host));
        if !own {
            return Some(ApiError::Forbidden(format!(
                "Origin {origin} is not this daemon's: without auth.tokens only its own pages \
                 may change anything"
            )));
        }
    }
    None
}

/// `localhost`, `*.localhost`, a loopback address or the listen address, with any port.
fn is_local_host(host: &str, listen: IpAddr) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    if name == "localhost" || name.ends_with(".localhost") {
        return true;
    }
    name.parse::<IpAddr>()
        .is_ok_and(|ip| ip.is_loopback() || ip == listen)
}

/// `host:port` of an `Origin` (`http://host:port`); `None` for `null` and the like.
fn origin_authority(origin: &str) -> Option<&str> {
    let rest = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))?;
    Some(rest.trim_end_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_hosts_are_loopback_names_and_addresses_and_the_listen_address() {
        let listen: IpAddr = "127.0.0.1".parse().expect("ip");
        let lan: IpAddr = "10.1.2.3".parse().expect("ip");
        for host in [
            "localhost",
            "localhost:7878",
            "LOCALHOST:7878",
            "dash.localhost:7878",
            "127.0.0.1:7878",
            "127.0.0.2",
            "[::1]:7878",
            "[::1]",
        ] {
            assert!(is_local_host(host, listen), "{host}");
        }
        for host in [
            "evil.example:7878",
            "evil.example",
            "localhost.evil.example:7878",
            "10.1.2.3:7878",
            "[::2]:7878",
            "",
        ] {
            assert!(!is_local_host(host, listen), "{host}");
        }
        assert!(is_local_host("10.1.2.3:7878", lan), "the listen address");
    }

    #[test]
    fn an_origin_is_its_scheme_less_authority() {
        assert_eq!(
            origin_authority("http://127.0.0.1:7878"),
            Some("127.0.0.1:7878")
        );
        assert_eq!(origin_authority("https://a.b/"), Some("a.b"));
        assert_eq!(origin_authority("null"), None);
    }
}

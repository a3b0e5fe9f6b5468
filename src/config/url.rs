//! URL checks for the config: `http(s)://host[:port]`, with a path for health URLs.
//!
//! A small hand-written check rather than a URL crate: the accepted shape is narrow on
//! purpose (no credentials, no fragments, no other schemes).

/// Checks `http(s)://host[:port]` (plus a path when `with_path`); answers it without a
/// trailing slash.
pub(super) fn check_url(url: &str, with_path: bool) -> Result<String, String> {
    let shape = if with_path {
        "http(s)://host[:port]/path"
    } else {
        "http(s)://host[:port]"
    };
    let bad = |why: &str| Err(format!("\"{url}\" is not an {shape} URL: {why}"));
    let Some(rest) = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
    else {
        return bad("the scheme must be http:// or https://");
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    if authority.contains('@') {
        return bad("credentials do not belong in the URL (use token_env)");
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let Some((addr, after)) = v6.split_once(']') else {
            return bad("unclosed `[`");
        };
        if addr.is_empty()
            || !addr
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
        {
            return bad("invalid IPv6 address");
        }
        (addr, after.strip_prefix(':'))
    } else {
        match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let host_ok = !host.is_empty()
        && (authority.starts_with('[')
            || host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-'));
    if !host_ok {
        return bad("missing or invalid host name");
    }
    if let Some(port) = port {
        if !port.parse::<u16>().is_ok_and(|p| p > 0) {
            return bad("the port must be a number from 1 to 65535");
        }
    }
    if path
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == '#')
    {
        return bad("the path must not contain spaces or `#`");
    }
    if !with_path && path.len() > 1 {
        return bad("no path expected");
    }
    Ok(url.trim_end_matches('/').to_string())
}

/// `scheme://host[:port]` of a URL that [`check_url`] accepted (its path dropped).
pub(super) fn origin(url: &str) -> String {
    let scheme_end = url.find("://").map_or(0, |i| i + 3);
    match url[scheme_end..].find('/') {
        Some(slash) => url[..scheme_end + slash].to_string(),
        None => url.to_string(),
    }
}

//! Instant queries of a Prometheus server (`GET {url}/api/v1/query?query=…&time=…`), for
//! `analyze` steps with `source: prometheus`: one query at a time, answered with its one
//! sample, or a typed error with a stable code and the server's own message.
//!
//! What a value means is the step's business; this module only says what the server said.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

use crate::config::{PrometheusConfig, Secret};
use crate::domain::error_code::ErrorCode;

/// Longest part of a body kept in an error message.
const BODY_EXCERPT: usize = 300;

/// The one sample a query answered (an instant vector of one series, or a scalar).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    /// The value as Prometheus wrote it (`"0.25"`, `"NaN"`, `"+Inf"`).
    pub raw: String,
    /// The value parsed; NaN and infinities are kept as they are.
    #[serde(skip)]
    pub value: f64,
    /// The series' labels (empty for a scalar or an aggregate).
    pub labels: BTreeMap<String, String>,
}

/// Why a query gave no sample.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// Prometheus answered `status: error` (a PromQL syntax error is `bad_data`, HTTP 400).
    #[error("Prometheus refused the query (HTTP {status}, {error_type}): {message}")]
    Refused {
        status: u16,
        error_type: String,
        message: String,
    },
    /// A non-2xx answer that is not Prometheus's error shape (a proxy, a wrong URL).
    #[error("Prometheus answered HTTP {status}: {body}")]
    HttpStatus { status: u16, body: String },
    /// No answer within the query's time.
    #[error("Prometheus did not answer within {0:?}")]
    Timeout(Duration),
    /// No HTTP answer at all (connection refused, reset, DNS).
    #[error("Prometheus is unreachable: {0}")]
    Unreachable(String),
    /// A 2xx answer that is not Prometheus's JSON, or of a result type a check cannot use.
    #[error("Prometheus's answer is not usable: {0}")]
    BadAnswer(String),
    /// The query gave more than one series: a check needs one value per replica.
    #[error("the query returned {0} series; a check's query must return one (aggregate it, e.g. with sum or max)")]
    ManySeries(usize),
}

impl QueryError {
    /// The step's failure code for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Refused { .. } => ErrorCode::PrometheusQueryError,
            Self::HttpStatus { .. } => ErrorCode::PrometheusHttpStatus,
            Self::Timeout(_) => ErrorCode::PrometheusTimeout,
            Self::Unreachable(_) => ErrorCode::PrometheusUnreachable,
            Self::BadAnswer(_) => ErrorCode::PrometheusBadAnswer,
            Self::ManySeries(_) => ErrorCode::PrometheusManySeries,
        }
    }
}

/// A Prometheus client. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Prometheus {
    client: reqwest::Client,
    url: String,
    token: Option<Secret>,
    timeout: Duration,
}

impl Prometheus {
    /// A client of the configured server whose every query gives up after `timeout`.
    pub fn new(config: &PrometheusConfig, timeout: Duration) -> Self {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .build()
            .unwrap_or_default();
        Self {
            client,
            url: config.url.trim_end_matches('/').to_owned(),
            token: config.token.clone(),
            timeout,
        }
    }

    /// The server's base URL (no secret in it: the config refuses credentials in URLs).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The bearer token, for masking text that could echo it.
    pub fn token(&self) -> Option<&Secret> {
        self.token.as_ref()
    }

    /// Evaluates `query` at `time`: its one sample, `None` for an empty result.
    pub async fn instant(
        &self,
        query: &str,
        time: DateTime<Utc>,
    ) -> Result<Option<Sample>, QueryError> {
        let at = format!("{:.3}", time.timestamp_millis() as f64 / 1000.0);
        let mut req = self
            .client
            .get(format!("{}/api/v1/query", self.url))
            .query(&[("query", query), ("time", at.as_str())]);
        if let Some(token) = &self.token {
            req = req.bearer_auth(token.expose());
        }
        let res = req.send().await.map_err(|e| self.transport(&e))?;
        let status = res.status().as_u16();
        let body = res.text().await.map_err(|e| self.transport(&e))?;
        parse_answer(status, &body)
    }

    fn transport(&self, e: &reqwest::Error) -> QueryError {
        if e.is_timeout() {
            QueryError::Timeout(self.timeout)
        } else if e.is_connect() {
            QueryError::Unreachable("connection refused".to_owned())
        } else {
            QueryError::Unreachable("request failed".to_owned())
        }
    }
}

fn excerpt(body: &str) -> String {
    let text = body.trim();
    if text.chars().count() <= BODY_EXCERPT {
        return text.to_owned();
    }
    let cut: String = text.chars().take(BODY_EXCERPT).collect();
    format!("{cut}…")
}

/// What an answer of `/api/v1/query` means (pure, for the tests' tables).
pub fn parse_answer(status: u16, body: &str) -> Result<Option<Sample>, QueryError> {
    let json: Option<Value> = serde_json::from_str(body).ok();
    let field = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    if let Some(v) = json.as_ref().filter(|v| v["status"] == "error") {
        return Err(QueryError::Refused {
            status,
            error_type: field(v, "errorType").unwrap_or_else(|| "unknown".to_owned()),
            message: field(v, "error").unwrap_or_default(),
        });
    }
    if !(200..300).contains(&status) {
        return Err(QueryError::HttpStatus {
            status,
            body: excerpt(body),
        });
    }
    let Some(v) = json else {
        return Err(QueryError::BadAnswer(format!(
            "not JSON: {}",
            excerpt(body)
        )));
    };
    if v["status"] != "success" {
        return Err(QueryError::BadAnswer(format!(
            "status is {}, not \"success\"",
            v["status"]
        )));
    }
    let data = &v["data"];
    match data["resultType"].as_str() {
        Some("vector") => {
            let Some(result) = data["result"].as_array() else {
                return Err(QueryError::BadAnswer("a vector without `result`".into()));
            };
            match result.as_slice() {
                [] => Ok(None),
                [one] => {
                    let labels = one["metric"]
                        .as_object()
                        .map(|m| {
                            m.iter()
                                .map(|(k, v)| {
                                    (k.clone(), v.as_str().unwrap_or_default().to_owned())
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    point(&one["value"], labels).map(Some)
                }
                many => Err(QueryError::ManySeries(many.len())),
            }
        }
        Some("scalar") => point(&data["result"], BTreeMap::new()).map(Some),
        Some(other) => Err(QueryError::BadAnswer(format!(
            "a {other} result; a check's query must give an instant vector or a scalar"
        ))),
        None => Err(QueryError::BadAnswer("no `data.resultType`".into())),
    }
}

/// `[1700000000.123, "0.25"]`.
fn point(v: &Value, labels: BTreeMap<String, String>) -> Result<Sample, QueryError> {
    let raw = v
        .as_array()
        .filter(|p| p.len() == 2)
        .and_then(|p| p[1].as_str())
        .ok_or_else(|| QueryError::BadAnswer(format!("a sample is not [time, \"value\"]: {v}")))?;
    let value = match raw {
        "NaN" => f64::NAN,
        "+Inf" | "Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        text => text.parse::<f64>().map_err(|_| {
            QueryError::BadAnswer(format!("a sample value is not a number: {raw:?}"))
        })?,
    };
    Ok(Sample {
        raw: raw.to_owned(),
        value,
        labels,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use wiremock::matchers::{header, method, path, query_param};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    const ERROR: &str = r#"{"status":"error","errorType":"bad_data","error":"invalid parameter \"query\": 1:14: parse error: unclosed left parenthesis"}"#;

    fn vector(samples: &[&str]) -> String {
        let result: Vec<String> = samples
            .iter()
            .enumerate()
            .map(|(i, v)| {
                format!(r#"{{"metric":{{"container_name":"r{i}"}},"value":[1700000000.5,"{v}"]}}"#)
            })
            .collect();
        format!(
            r#"{{"status":"success","data":{{"resultType":"vector","result":[{}]}}}}"#,
            result.join(",")
        )
    }

    /// (what, status, body, the value's raw text or the error code, part of the message)
    type Row = (
        &'static str,
        u16,
        String,
        Result<Option<&'static str>, &'static str>,
        &'static str,
    );

    /// Every row is answered by a real HTTP server (wiremock) to the real client.
    #[tokio::test]
    async fn answers_map_to_a_sample_or_a_coded_error() {
        let scalar =
            r#"{"status":"success","data":{"resultType":"scalar","result":[1700000000,"2.5"]}}"#;
        let matrix = r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
        let table: Vec<Row> = vec![
            ("one sample", 200, vector(&["0.25"]), Ok(Some("0.25")), ""),
            ("no sample", 200, vector(&[]), Ok(None), ""),
            ("NaN is kept", 200, vector(&["NaN"]), Ok(Some("NaN")), ""),
            ("a scalar", 200, scalar.to_owned(), Ok(Some("2.5")), ""),
            ("two series", 200, vector(&["1", "2"]), Err("prometheus_many_series"), "returned 2 series"),
            ("bad PromQL", 400, ERROR.to_owned(), Err("prometheus_query_error"), "HTTP 400, bad_data): invalid parameter \"query\": 1:14: parse error"),
            ("execution error", 422, r#"{"status":"error","errorType":"execution","error":"many-to-many matching not allowed"}"#.to_owned(), Err("prometheus_query_error"), "execution): many-to-many"),
            ("overloaded", 503, r#"{"status":"error","errorType":"unavailable","error":"too many queries"}"#.to_owned(), Err("prometheus_query_error"), "too many queries"),
            ("a proxy's 502", 502, "<html>Bad Gateway</html>".to_owned(), Err("prometheus_http_status"), "HTTP 502: <html>Bad Gateway</html>"),
            ("a wrong path", 404, "404 page not found".to_owned(), Err("prometheus_http_status"), "HTTP 404: 404 page not found"),
            ("not JSON", 200, "hello".to_owned(), Err("prometheus_bad_answer"), "not JSON: hello"),
            ("a matrix", 200, matrix.to_owned(), Err("prometheus_bad_answer"), "a matrix result"),
            ("a bad value", 200, vector(&["lots"]), Err("prometheus_bad_answer"), "not a number: \"lots\""),
            ("no status", 200, "{}".to_owned(), Err("prometheus_bad_answer"), "not \"success\""),
        ];
        for (what, status, body, want, message) in table {
            let server = MockServer::start().await;
            Mock::given(method("GET"))
                .and(path("/api/v1/query"))
                .respond_with(ResponseTemplate::new(status).set_body_string(body))
                .mount(&server)
                .await;
            let prom = Prometheus::new(&config(&server.uri(), None), Duration::from_secs(5));
            let got = prom.instant("q", Utc::now()).await;
            match (got, want) {
                (Ok(sample), Ok(raw)) => {
                    assert_eq!(sample.as_ref().map(|s| s.raw.as_str()), raw, "{what}");
                }
                (Err(e), Err(code)) => {
                    assert_eq!(e.code(), code, "{what}: {e}");
                    assert!(e.to_string().contains(message), "{what}: {e}");
                }
                (got, _) => panic!("{what}: {got:?}"),
            }
        }
        let one = parse_answer(200, &vector(&["0.25"]))
            .expect("ok")
            .expect("one");
        assert_eq!(one.value, 0.25);
        assert_eq!(one.labels["container_name"], "r0");
        let nan = parse_answer(200, &vector(&["NaN"]))
            .expect("ok")
            .expect("one");
        assert!(nan.value.is_nan());
    }

    fn config(url: &str, token: Option<&str>) -> PrometheusConfig {
        PrometheusConfig {
            url: url.to_owned(),
            token: token.map(Secret::new),
        }
    }

    #[tokio::test]
    async fn a_query_is_sent_with_its_time_and_bearer() {
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .and(path("/prom/api/v1/query"))
            .and(query_param("query", "sum(up{service=\"r2\"})"))
            .and(query_param("time", "1700000000.500"))
            .and(header("authorization", "Bearer s3cret-token"))
            .respond_with(ResponseTemplate::new(200).set_body_string(vector(&["1"])))
            .expect(1)
            .mount(&server)
            .await;
        let prom = Prometheus::new(
            &config(&format!("{}/prom", server.uri()), Some("s3cret-token")),
            Duration::from_secs(5),
        );
        let time = DateTime::from_timestamp_millis(1_700_000_000_500).expect("time");
        let sample = prom.instant("sum(up{service=\"r2\"})", time).await;
        assert_eq!(sample.expect("ok").map(|s| s.value), Some(1.0));
    }

    #[tokio::test]
    async fn transport_failures_have_their_own_codes() {
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_string(vector(&["1"]))
                    .set_delay(Duration::from_secs(5)),
            )
            .mount(&server)
            .await;
        let slow = Prometheus::new(&config(&server.uri(), None), Duration::from_millis(200));
        let e = slow.instant("up", Utc::now()).await.expect_err("times out");
        assert_eq!(e.code(), "prometheus_timeout", "{e}");
        let Some(addr) = std::net::TcpListener::bind("127.0.0.1:0")
            .ok()
            .and_then(|l| l.local_addr().ok())
        else {
            panic!("no free port")
        };
        let gone = Prometheus::new(
            &config(&format!("http://{addr}"), None),
            Duration::from_secs(2),
        );
        let e = gone.instant("up", Utc::now()).await.expect_err("refused");
        assert_eq!(e.code(), "prometheus_unreachable", "{e}");
    }
}

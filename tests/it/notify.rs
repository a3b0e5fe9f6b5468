//! Webhook notifications from the transactional outbox: a receiver that fails at first, then
//! recovers, gets exactly one accepted delivery per event, and retries carry the same
//! `Idempotency-Key`; nothing is lost across a restart.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use canaryd::app::App;
use canaryd::config::sim::dev_config;
use canaryd::config::{DeliveryTuning, NotificationsConfig, Secret, WebhookConfig, WebhookFormat};
use canaryd::domain::notification::NotifyEvent;
use canaryd::engine::Engine;
use canaryd_sim::SimHost;
use serde_json::{json, Value};

use crate::helpers::{canaryd_async, fast_runbooks, sim_config, TestApp, R2};

/// One request the receiver saw.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    key: String,
    body: Value,
    accepted: bool,
}

#[derive(Default)]
struct ReceiverState {
    seen: Vec<Seen>,
    /// Requests still to refuse with 500.
    fail_next: usize,
    /// Requests still to accept but answer too late (the sender times out: unconfirmed).
    hang_next: usize,
}

/// A webhook receiver on 127.0.0.1:0.
#[derive(Clone)]
struct Receiver {
    addr: SocketAddr,
    state: Arc<Mutex<ReceiverState>>,
}

impl Receiver {
    async fn start(fail_next: usize, hang_next: usize) -> Receiver {
        let state = Arc::new(Mutex::new(ReceiverState {
            fail_next,
            hang_next,
            ..ReceiverState::default()
        }));
        let app = Router::new()
            .route("/{*path}", post(receive))
            .with_state(Arc::clone(&state));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind receiver");
        let addr = listener.local_addr().expect("receiver addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver { addr, state }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}/{path}", self.addr)
    }

    fn seen(&self) -> Vec<Seen> {
        self.state.lock().expect("receiver state").seen.clone()
    }

    fn set_fail_next(&self, n: usize) {
        self.state.lock().expect("receiver state").fail_next = n;
    }

    /// Accepted requests on `path`, one per Idempotency-Key (a receiver drops duplicates).
    fn accepted(&self, path: &str) -> BTreeMap<String, Seen> {
        let mut out = BTreeMap::new();
        for s in self.seen() {
            if s.accepted && s.path == path {
                out.entry(s.key.clone()).or_insert(s);
            }
        }
        out
    }

    /// Polls until `path` accepted `n` distinct keys (bounded: 400 × 25 ms).
    async fn wait_accepted(&self, path: &str, n: usize) -> BTreeMap<String, Seen> {
        for _ in 0..400 {
            let accepted = self.accepted(path);
            if accepted.len() >= n {
                return accepted;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!(
            "{path} never accepted {n} notifications; saw {:#?}",
            self.seen()
        );
    }
}

async fn receive(
    State(state): State<Arc<Mutex<ReceiverState>>>,
    axum::extract::Path(path): axum::extract::Path<String>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> StatusCode {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let (status, hang) = {
        let mut st = state.lock().expect("receiver state");
        let (accepted, status, hang) = if st.fail_next > 0 {
            st.fail_next -= 1;
            (false, StatusCode::INTERNAL_SERVER_ERROR, false)
        } else if st.hang_next > 0 {
            st.hang_next -= 1;
            // Processed, but the answer arrives after the sender gave up.
            (true, StatusCode::OK, true)
        } else {
            (true, StatusCode::OK, false)
        };
        st.seen.push(Seen {
            path,
            key,
            body,
            accepted,
        });
        (status, hang)
    };
    if hang {
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    status
}

fn webhook(
    name: &str,
    url: String,
    format: WebhookFormat,
    events: &[NotifyEvent],
) -> WebhookConfig {
    WebhookConfig {
        name: name.to_owned(),
        url: Secret::new(url),
        format,
        events: events.iter().copied().collect(),
    }
}

fn fast_delivery() -> DeliveryTuning {
    DeliveryTuning {
        timeout: Duration::from_millis(300),
        retry_initial: Duration::from_millis(20),
        retry_max: Duration::from_millis(200),
        max_attempts: 50,
        poll_interval: Duration::from_millis(50),
    }
}

/// A daemon with webhooks, on its own database (so it can be restarted on it).
struct NotifyingApp {
    url: String,
    engine: Engine,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl NotifyingApp {
    async fn boot(sim: &SimHost, db: PathBuf, webhooks: Vec<WebhookConfig>) -> NotifyingApp {
        NotifyingApp::boot_with(sim, db, webhooks, None).await
    }

    /// As `boot`, with the config's `public_url`.
    async fn boot_with(
        sim: &SimHost,
        db: PathBuf,
        webhooks: Vec<WebhookConfig>,
        public_url: Option<&str>,
    ) -> NotifyingApp {
        let env = sim_config().initial_env;
        let mut config = dev_config(sim, "127.0.0.1:0".parse().expect("addr"), db, env);
        config.public_url = public_url.map(str::to_owned);
        config.notifications = NotificationsConfig {
            webhooks,
            delivery: fast_delivery(),
        };
        let app = App::build(config, fast_runbooks())
            .await
            .expect("daemon builds");
        let url = format!("http://{}", app.local_addr().expect("bound"));
        let engine = app.engine();
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(app.run_until_stopped(async {
            let _ = rx.await;
        }));
        NotifyingApp {
            url,
            engine,
            stop,
            server,
        }
    }

    async fn start_canary(&self, tag: &str) -> String {
        let res = reqwest::Client::new()
            .post(format!("{}/v1/rollouts", self.url))
            .json(&TestApp::plan(tag))
            .send()
            .await
            .expect("daemon answers");
        assert_eq!(res.status(), 201);
        let body: Value = res.json().await.expect("json");
        body["id"].as_str().expect("id").to_owned()
    }

    async fn rollout(&self, id: &str) -> Value {
        reqwest::get(format!("{}/v1/rollouts/{id}", self.url))
            .await
            .expect("daemon answers")
            .json()
            .await
            .expect("json")
    }

    /// Polls until terminal (bounded: 300 × 50 ms).
    async fn wait_terminal(&self, id: &str) -> Value {
        for _ in 0..300 {
            let r = self.rollout(id).await;
            if matches!(
                r["status"].as_str(),
                Some("succeeded" | "failed" | "aborted")
            ) {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("rollout {id} did not finish: {:#}", self.rollout(id).await);
    }

    /// Polls until every delivery is settled (bounded: 400 × 25 ms); returns the counts.
    async fn wait_settled(&self) -> Vec<(String, i64)> {
        for _ in 0..400 {
            let counts = self.engine.store().delivery_counts().await.expect("counts");
            if !counts.iter().any(|(status, _)| status == "pending") {
                return counts;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("deliveries still pending");
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.server.await;
    }
}

/// Events in the order of the first request of each key.
fn events_in_order(receiver: &Receiver, path: &str) -> Vec<String> {
    let accepted = receiver.accepted(path);
    let mut order: Vec<(usize, String)> = accepted
        .values()
        .map(|s| {
            let first = receiver
                .seen()
                .iter()
                .position(|x| x.key == s.key)
                .unwrap_or(usize::MAX);
            (first, s.body["event"].as_str().unwrap_or("?").to_owned())
        })
        .collect();
    order.sort();
    order.into_iter().map(|(_, e)| e).collect()
}

#[tokio::test]
async fn a_receiver_that_fails_at_first_gets_every_event_once_with_the_same_key_on_retries() {
    let receiver = Receiver::start(3, 0).await;
    let sim = SimHost::start(sim_config()).await.expect("sim");
    let dir = tempfile::tempdir().expect("temp dir");
    let hooks = vec![
        webhook(
            "ops-json",
            receiver.url("json"),
            WebhookFormat::Json,
            &NotifyEvent::ALL,
        ),
        webhook(
            "chat",
            receiver.url("slack"),
            WebhookFormat::Slack,
            &[NotifyEvent::Succeeded, NotifyEvent::Failed],
        ),
    ];
    let app = NotifyingApp::boot(&sim, dir.path().join("canaryd.db"), hooks).await;
    let id = app.start_canary("v0.0.451").await;
    assert_eq!(app.wait_terminal(&id).await["status"], "succeeded");

    let json = receiver.wait_accepted("json", 2).await;
    let slack = receiver.wait_accepted("slack", 1).await;
    let counts = app.wait_settled().await;
    assert_eq!(
        counts,
        vec![("delivered".to_owned(), 3)],
        "3 deliveries, all confirmed"
    );
    assert_eq!(events_in_order(&receiver, "json"), ["started", "succeeded"]);

    let seen = receiver.seen();
    assert_eq!(
        seen.iter().filter(|s| !s.accepted).count(),
        3,
        "the first three requests were refused"
    );
    for s in &seen {
        assert!(
            s.key.starts_with("ob_"),
            "an Idempotency-Key on every request: {s:?}"
        );
        let on_path = if s.path == "json" { &json } else { &slack };
        let accepted = on_path
            .get(&s.key)
            .unwrap_or_else(|| panic!("request with key {} was never accepted on a retry", s.key));
        assert_eq!(s.body, accepted.body, "a retry sends the same body");
    }
    let accepted_count = seen.iter().filter(|s| s.accepted).count();
    assert_eq!(
        accepted_count, 3,
        "exactly one accepted delivery per event and webhook"
    );

    for (key, s) in &json {
        assert_eq!(s.body["id"], key.as_str(), "the key is the notification id");
        assert_eq!(s.body["rollout"]["id"], id.as_str());
        assert_eq!(s.body["rollout"]["service"], R2);
        assert!(s.body["text"].as_str().is_some_and(|t| t.contains(&id)));
    }
    let chat = slack.values().next().expect("one slack message");
    let text = chat.body["text"].as_str().expect("slack text");
    assert!(text.contains("succeeded") && text.contains(R2), "{text}");
    assert_eq!(
        chat.body.as_object().map(|o| o.len()),
        Some(1),
        "Slack gets only {{\"text\"}}: {}",
        chat.body
    );
    app.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn a_failed_canary_notifies_the_step_failure_the_failure_and_the_rollback() {
    let receiver = Receiver::start(0, 0).await;
    let app = {
        let sim = SimHost::start(sim_config()).await.expect("sim");
        (sim, tempfile::tempdir().expect("temp dir"))
    };
    let (sim, dir) = app;
    let hooks = vec![webhook(
        "all",
        receiver.url("all"),
        WebhookFormat::Json,
        &NotifyEvent::ALL,
    )];
    let app = NotifyingApp::boot(&sim, dir.path().join("canaryd.db"), hooks).await;
    sim.faults().set_logs_on_start(
        R2,
        Some(vec!["CUDA error 801: operation not supported".into()]),
    );
    let id = app.start_canary("v0.0.452").await;
    let failed = app.wait_terminal(&id).await;
    assert_eq!(failed["status"], "failed");
    sim.faults().set_logs_on_start(R2, None);
    let rb_id = failed["rolled_back_by"]
        .as_str()
        .expect("rolled back")
        .to_owned();
    assert_eq!(app.wait_terminal(&rb_id).await["status"], "succeeded");

    receiver.wait_accepted("all", 5).await;
    app.wait_settled().await;
    assert_eq!(
        events_in_order(&receiver, "all"),
        ["started", "step_failed", "failed", "started", "rolled_back"]
    );
    let accepted = receiver.accepted("all");
    let step_failed = accepted
        .values()
        .find(|s| s.body["event"] == "step_failed")
        .expect("step_failed");
    assert_eq!(step_failed.body["step"], "startup-logs");
    assert_eq!(
        step_failed.body["error"]["code"], "forbidden_log_line",
        "{}",
        step_failed.body
    );
    let rolled_back = accepted
        .values()
        .find(|s| s.body["event"] == "rolled_back")
        .expect("rolled_back");
    assert_eq!(rolled_back.body["rollout"]["id"], rb_id.as_str());
    assert_eq!(rolled_back.body["rollout"]["rollback_of"], id.as_str());
    app.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn notifications_survive_a_restart_and_an_unconfirmed_delivery_is_resent_with_its_key() {
    // Everything is refused while the first daemon runs; the first accepted request is
    // answered too late (processed, unconfirmed).
    let receiver = Receiver::start(usize::MAX, 1).await;
    let sim = SimHost::start(sim_config()).await.expect("sim");
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("canaryd.db");
    let hooks = || {
        vec![webhook(
            "ops",
            receiver.url("ops"),
            WebhookFormat::Json,
            &NotifyEvent::ALL,
        )]
    };
    let first = NotifyingApp::boot(&sim, db.clone(), hooks()).await;
    let id = first.start_canary("v0.0.451").await;
    assert_eq!(first.wait_terminal(&id).await["status"], "succeeded");
    first.stop().await;
    let refused_keys: std::collections::BTreeSet<String> =
        receiver.seen().into_iter().map(|s| s.key).collect();
    assert!(
        !refused_keys.is_empty(),
        "the first daemon tried to deliver"
    );

    receiver.set_fail_next(0);
    let second = NotifyingApp::boot(&sim, db, hooks()).await;
    let accepted = receiver.wait_accepted("ops", 2).await;
    second.wait_settled().await;
    assert_eq!(events_in_order(&receiver, "ops"), ["started", "succeeded"]);
    for key in &refused_keys {
        assert!(
            accepted.contains_key(key),
            "{key} was delivered after the restart"
        );
    }
    let seen = receiver.seen();
    let processed: Vec<&Seen> = seen.iter().filter(|s| s.accepted).collect();
    assert_eq!(
        processed.len(),
        3,
        "the unconfirmed delivery came again, nothing else twice: {processed:#?}"
    );
    let mut per_key: BTreeMap<&str, usize> = BTreeMap::new();
    for s in &processed {
        *per_key.entry(s.key.as_str()).or_default() += 1;
    }
    let mut per_key_counts: Vec<usize> = per_key.values().copied().collect();
    per_key_counts.sort_unstable();
    assert_eq!(
        per_key_counts,
        [1, 2],
        "two events; only the unconfirmed one came twice: {per_key:?}"
    );
    assert!(
        per_key.values().any(|&n| n == 2),
        "the resend of an unconfirmed delivery carries the same Idempotency-Key: {per_key:?}"
    );
    second.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn with_a_public_url_notifications_and_show_link_the_rollouts_page() {
    let receiver = Receiver::start(0, 0).await;
    let sim = SimHost::start(sim_config()).await.expect("sim");
    let dir = tempfile::tempdir().expect("temp dir");
    let hooks = vec![
        webhook(
            "json",
            receiver.url("json"),
            WebhookFormat::Json,
            &NotifyEvent::ALL,
        ),
        webhook(
            "chat",
            receiver.url("chat"),
            WebhookFormat::Slack,
            &NotifyEvent::ALL,
        ),
    ];
    let base = "https://canaryd.example.com";
    let app = NotifyingApp::boot_with(&sim, dir.path().join("canaryd.db"), hooks, Some(base)).await;
    let id = app.start_canary("v0.0.452").await;
    let r = app.wait_terminal(&id).await;
    assert_eq!(r["status"], "succeeded", "{r:#}");
    let page = format!("{base}/rollouts/{id}");
    assert_eq!(
        r["page_url"],
        page.as_str(),
        "the rollout's answer links its page"
    );

    receiver.wait_accepted("json", 2).await;
    receiver.wait_accepted("chat", 2).await;
    app.wait_settled().await;
    for seen in receiver.accepted("json").values() {
        assert_eq!(seen.body["rollout"]["url"], page.as_str(), "{}", seen.body);
        let text = seen.body["text"].as_str().expect("text");
        assert!(text.ends_with(&format!(" {page}")), "{text}");
    }
    for seen in receiver.accepted("chat").values() {
        let text = seen.body["text"].as_str().expect("text");
        assert!(text.ends_with(&format!(" {page}")), "{text}");
    }

    let show = canaryd_async(&["show", &id], &app.url).await;
    let out = String::from_utf8_lossy(&show.stdout);
    assert!(show.status.success(), "{out}");
    assert!(out.contains(&format!("page: {page}")), "{out}");
    app.stop().await;
    sim.shutdown().await;
}

/// Every field a user wrote reaches Slack escaped (safety rule 24): a reason with a channel
/// mention, a user mention and a disguised link notifies nobody and links nowhere.
#[tokio::test]
async fn a_slack_notification_escapes_mentions_and_links_the_user_wrote() {
    let receiver = Receiver::start(0, 0).await;
    let sim = SimHost::start(sim_config()).await.expect("sim");
    let dir = tempfile::tempdir().expect("temp dir");
    let hooks = vec![webhook(
        "chat",
        receiver.url("chat"),
        WebhookFormat::Slack,
        &[NotifyEvent::Started],
    )];
    let app = NotifyingApp::boot(&sim, dir.path().join("canaryd.db"), hooks).await;
    let mut plan = TestApp::plan("v0.0.452");
    plan["reason"] =
        json!("<!channel> <!here> <@U024BE7LH> see <http://evil.example|the runbook> & co");
    let res = reqwest::Client::new()
        .post(format!("{}/v1/rollouts", app.url))
        .json(&plan)
        .send()
        .await
        .expect("daemon answers");
    assert_eq!(res.status(), 201);
    let body: Value = res.json().await.expect("json");
    let id = body["id"].as_str().expect("id").to_owned();
    app.wait_terminal(&id).await;
    receiver.wait_accepted("chat", 1).await;
    let seen = receiver.accepted("chat");
    let text = seen
        .values()
        .next()
        .and_then(|s| s.body["text"].as_str().map(str::to_owned))
        .expect("a Slack text");
    assert!(
        text.contains(
            "&lt;!channel&gt; &lt;!here&gt; &lt;@U024BE7LH&gt; see \
             &lt;http://evil.example|the runbook&gt; &amp; co"
        ),
        "{text}"
    );
    assert!(!text.contains('<') && !text.contains('>'), "{text}");
    app.stop().await;
    sim.shutdown().await;
}

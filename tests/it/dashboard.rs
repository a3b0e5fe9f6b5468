//! The dashboard at `/`, driven in real headless Chromium through chromedriver (WebDriver is
//! JSON over HTTP: plain reqwest calls). Needs Debian's `chromium` and `chromium-driver`
//! (`.ci/run` installs them); without them these tests FAIL, unless CANARYD_SKIP_BROWSER=1.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use canaryd::app::App;
use canaryd::config::sim::dev_config;
use canaryd::config::{ApiToken, Role, Secret};
use canaryd::domain::runbook;
use canaryd_sim::SimHost;
use serde_json::{json, Value};

use crate::helpers::{fast_runbooks, sim_config, FAST_CANARY, HOST, R1, R2};

mod abort;
mod approve;
mod doctor;
mod left_down;
mod pages;
mod release;
mod verdict;

/// One browser at a time: two Chromiums on a 2-core CI box starve the daemons under test.
static BROWSER_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// The Chromium binary and chromedriver, or why the test cannot run.
fn browser_binaries() -> Option<(PathBuf, PathBuf)> {
    let chromium = ["/usr/lib/chromium/chromium", "/usr/bin/chromium"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists());
    let driver = ["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists());
    chromium.zip(driver)
}

/// An operator (`alice-secret`) and an on-call engineer (`oncall-secret`).
fn operator_and_oncall() -> Vec<ApiToken> {
    vec![
        ApiToken {
            name: "ops-alice".into(),
            role: Role::Operator,
            secret: Secret::new("alice-secret"),
        },
        ApiToken {
            name: "oncall".into(),
            role: Role::Oncall,
            secret: Secret::new("oncall-secret"),
        },
    ]
}

/// The binaries, `None` to skip (only with CANARYD_SKIP_BROWSER=1), or a failing test.
fn require_browser(test: &str) -> Option<(PathBuf, PathBuf)> {
    if let Some(found) = browser_binaries() {
        return Some(found);
    }
    if std::env::var("CANARYD_SKIP_BROWSER").as_deref() == Ok("1") {
        eprintln!(
            "\n!!!!!!!! SKIPPED {test}: no chromium/chromedriver and CANARYD_SKIP_BROWSER=1 !!!!!!!!\n\
             !!!!!!!! install them: apt-get install -y --no-install-recommends chromium chromium-driver\n"
        );
        return None;
    }
    panic!(
        "{test} needs Chromium and chromedriver: apt-get install -y --no-install-recommends \
         chromium chromium-driver (or set CANARYD_SKIP_BROWSER=1 to skip on a dev machine)"
    );
}

/// The fast canary followed by an analysis against the peer that judges `duration`.
fn canary_with_analysis(duration: &str) -> String {
    format!(
        "{}  - name: analysis\n    kind: analyze\n    warmup: 500ms\n    duration: {duration}\n    interval: 250ms\n    checks:\n      \
         - {{name: ttft_p95, histogram: \"sglang:time_to_first_token_seconds\", quantile: 0.95, max_ratio_to_peers: 1.2, min_requests: 20}}\n      \
         - {{name: took_traffic, counter: \"sglang:num_requests_total\", min: 1}}\n",
        FAST_CANARY.as_str()
    )
}

/// A daemon whose canary of r2 (an engine twice as slow as r1) failed its analysis judging
/// `duration`, with its automatic rollback ended: the daemon and the canary as the API shows it.
async fn failed_analysis(duration: &str) -> (Daemon, Value) {
    let daemon = Daemon::start_with(Vec::new(), &canary_with_analysis(duration)).await;
    daemon.sim.faults().set_engine_slowdown(R2, 2.0);
    let id = daemon.start_canary("v0.0.452", None).await;
    let r = daemon
        .wait_rollout(&id, None, |r| r["status"] == "failed")
        .await;
    assert_eq!(r["error"]["code"], "analysis_failed", "{r:#}");
    if let Some(rb) = r["rolled_back_by"].as_str() {
        daemon
            .wait_rollout(rb, None, |r| {
                r["status"] != "running" && r["status"] != "pending"
            })
            .await;
    }
    (daemon, r)
}

/// A daemon whose canary of r2 is held in its `health` step (r2 never turns healthy): the
/// daemon and the canary's id.
async fn canary_held_in_health() -> (Daemon, String) {
    let daemon = Daemon::start(Vec::new()).await;
    daemon.sim.faults().set_health_never(R2, true);
    let id = daemon.start_canary("v0.0.451", None).await;
    daemon
        .wait_rollout(&id, None, |r| {
            r["steps"].as_array().is_some_and(|s| {
                s.iter()
                    .any(|s| s["name"] == "health" && s["status"] == "running")
            })
        })
        .await;
    (daemon, id)
}

/// A test's turn with the browser: the binaries found and the one-browser lock held.
struct BrowserSlot {
    chromium: PathBuf,
    driver: PathBuf,
    _one_browser: tokio::sync::MutexGuard<'static, ()>,
}

/// Waits for the browser's turn; `None` to skip (see [`require_browser`]).
async fn browser_slot(test: &str) -> Option<BrowserSlot> {
    let (chromium, driver) = require_browser(test)?;
    Some(BrowserSlot {
        chromium,
        driver,
        _one_browser: BROWSER_LOCK.lock().await,
    })
}

impl BrowserSlot {
    /// A fresh headless Chromium session.
    async fn browser(&self) -> Browser {
        Browser::start(&self.chromium, &self.driver).await
    }
}

/// A headless Chromium session through chromedriver on a loopback port.
struct Browser {
    driver: Child,
    base: String,
    session: String,
    http: reqwest::Client,
    _profile: tempfile::TempDir,
}

impl Browser {
    async fn start(chromium: &Path, chromedriver: &Path) -> Browser {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
            l.local_addr().expect("addr").port()
        };
        let driver = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        let profile = tempfile::tempdir().expect("profile dir");
        let mut browser = Browser {
            driver,
            base,
            session: String::new(),
            http,
            _profile: profile,
        };
        // Bounded: 200 × 50 ms for chromedriver to listen.
        let mut ready = false;
        for _ in 0..200 {
            if let Ok(res) = browser
                .http
                .get(format!("{}/status", browser.base))
                .send()
                .await
            {
                let status: Value = res.json().await.unwrap_or(Value::Null);
                if status["value"]["ready"] == true {
                    ready = true;
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(ready, "chromedriver never became ready on port {port}");
        let profile_dir = browser._profile.path().display().to_string();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium.display().to_string(),
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                    format!("--user-data-dir={profile_dir}"),
                ],
            },
        }}});
        let res = browser.call("POST", "/session", Some(caps)).await;
        browser.session = res["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {res}"))
            .to_owned();
        browser
    }

    /// One WebDriver command; answers its `value` (panics on a WebDriver error).
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}{path}", self.base);
        let req = match method {
            "GET" => self.http.get(&url),
            "DELETE" => self.http.delete(&url),
            _ => self.http.post(&url).json(&body.unwrap_or(json!({}))),
        };
        let res = req.send().await.expect("chromedriver answers");
        let status = res.status();
        let value: Value = res.json().await.expect("WebDriver JSON");
        assert!(
            status.is_success(),
            "WebDriver {method} {path}: {status} {value}"
        );
        value["value"].clone()
    }

    fn at(&self, path: &str) -> String {
        format!("/session/{}{path}", self.session)
    }

    async fn open(&self, url: &str) {
        self.call("POST", &self.at("/url"), Some(json!({"url": url})))
            .await;
    }

    /// Runs `script` in the page and answers its return value.
    async fn eval(&self, script: &str) -> Value {
        self.call(
            "POST",
            &self.at("/execute/sync"),
            Some(json!({"script": script, "args": []})),
        )
        .await
    }

    /// Polls `script` until `ok` holds for its value (bounded: 300 × 50 ms).
    async fn wait_for(&self, what: &str, script: &str, ok: impl Fn(&Value) -> bool) -> Value {
        let mut last = Value::Null;
        for _ in 0..300 {
            last = self.eval(script).await;
            if ok(&last) {
                return last;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let page = self.eval("return document.body.innerText").await;
        panic!("the page never showed {what}; last value {last}; page:\n{page}");
    }

    async fn element(&self, css: &str) -> String {
        let found = self
            .call(
                "POST",
                &self.at("/element"),
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        found[ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("no element {css}: {found}"))
            .to_owned()
    }

    /// A real click (WebDriver element click: pointer events at the element's centre).
    async fn click(&self, css: &str) {
        let id = self.element(css).await;
        self.call("POST", &self.at(&format!("/element/{id}/click")), None)
            .await;
    }

    async fn type_into(&self, css: &str, text: &str) {
        let id = self.element(css).await;
        self.call(
            "POST",
            &self.at(&format!("/element/{id}/value")),
            Some(json!({"text": text})),
        )
        .await;
    }

    async fn quit(mut self) {
        let _ = self
            .http
            .delete(format!("{}/session/{}", self.base, self.session))
            .send()
            .await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
    }
}

/// A daemon whose canary waits on health up to 60 s, so a test can hold it mid-rollout.
struct Daemon {
    sim: SimHost,
    url: String,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    _dir: tempfile::TempDir,
}

impl Daemon {
    async fn start(tokens: Vec<ApiToken>) -> Daemon {
        let patient = FAST_CANARY.replace(
            "kind: wait_health, timeout: 3s",
            "kind: wait_health, timeout: 60s",
        );
        assert_ne!(patient, *FAST_CANARY, "the health timeout was patched");
        Daemon::start_with(tokens, &patient).await
    }

    /// As `start`, with the (patient) canary runbook's text edited by `edit`.
    async fn start_with_canary(tokens: Vec<ApiToken>, edit: impl Fn(String) -> String) -> Daemon {
        let patient = FAST_CANARY.replace(
            "kind: wait_health, timeout: 3s",
            "kind: wait_health, timeout: 60s",
        );
        Daemon::start_with(tokens, &edit(patient)).await
    }

    /// A daemon whose `single-replica-canary` runbook is `canary` (YAML).
    async fn start_with(tokens: Vec<ApiToken>, canary: &str) -> Daemon {
        let cfg = sim_config();
        let env = cfg.initial_env.clone();
        let sim = SimHost::start(cfg).await.expect("sim");
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = dev_config(
            &sim,
            "127.0.0.1:0".parse().expect("addr"),
            dir.path().join("canaryd.db"),
            env,
        );
        config.tokens = tokens;
        let mut runbooks = fast_runbooks();
        runbooks.insert(
            "single-replica-canary".into(),
            runbook::parse("single-replica-canary", "test", canary).expect("runbook"),
        );
        let app = App::build(config, runbooks).await.expect("daemon builds");
        let url = format!("http://{}", app.local_addr().expect("bound"));
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(app.run_until_stopped(async {
            let _ = rx.await;
        }));
        Daemon {
            sim,
            url,
            stop,
            server,
            _dir: dir,
        }
    }

    async fn request(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> Value {
        let client = reqwest::Client::new();
        let url = format!("{}{path}", self.url);
        let mut req = match method {
            "GET" => client.get(&url),
            _ => client.post(&url).json(&body.unwrap_or(json!({}))),
        };
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let res = req.send().await.expect("daemon answers");
        let status = res.status();
        let value: Value = res.json().await.expect("json");
        assert!(status.is_success(), "{method} {path}: {status} {value}");
        value
    }

    async fn start_canary(&self, tag: &str, token: Option<&str>) -> String {
        let plan = json!({"host": HOST, "file": crate::helpers::FILE, "service": R2,
                          "tag": tag, "reason": "dashboard test"});
        let r = self
            .request("POST", "/v1/rollouts", token, Some(plan))
            .await;
        r["id"].as_str().expect("id").to_owned()
    }

    /// Polls the API until `check` holds for the rollout (bounded: 300 × 50 ms).
    async fn wait_rollout(
        &self,
        id: &str,
        token: Option<&str>,
        check: impl Fn(&Value) -> bool,
    ) -> Value {
        for _ in 0..300 {
            let r = self
                .request("GET", &format!("/v1/rollouts/{id}"), token, None)
                .await;
            if check(&r) {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("rollout {id} never reached the expected state");
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.server.await;
        self.sim.shutdown().await;
    }
}

fn step_status(id: &str, step: &str) -> String {
    format!(
        "const e = document.querySelector('[data-rollout=\"{id}\"] [data-step=\"{step}\"]'); \
         return e ? e.getAttribute('data-status') : null;"
    )
}

#[tokio::test]
async fn the_dashboard_shows_replicas_and_a_running_rollout_advancing_live() {
    let Some(slot) = browser_slot("the dashboard test").await else {
        return;
    };
    let (daemon, id) = canary_held_in_health().await;

    let browser = slot.browser().await;
    browser.open(&format!("{}/", daemon.url)).await;
    let replicas = browser
        .wait_for(
            "both replicas",
            "return [...document.querySelectorAll('[data-replica]')].map(e => e.getAttribute('data-replica'))",
            |v| v.as_array().is_some_and(|a| a.len() == 2),
        )
        .await;
    assert_eq!(
        replicas,
        json!([format!("{HOST}/{R1}"), format!("{HOST}/{R2}")])
    );
    browser
        .wait_for(
            "the rollout waiting on health",
            &step_status(&id, "health"),
            |v| v == "running",
        )
        .await;
    assert_eq!(
        browser.eval(&step_status(&id, "snapshot")).await,
        "succeeded"
    );
    assert_eq!(browser.eval(&step_status(&id, "soak")).await, "pending");

    // The engine comes up: the same page (no reload) follows the rollout to its end.
    daemon.sim.faults().set_health_never(R2, false);
    browser
        .wait_for(
            "the health step succeeded",
            &step_status(&id, "health"),
            |v| v == "succeeded",
        )
        .await;
    browser
        .wait_for(
            "the rollout succeeded",
            &format!("const e = document.querySelector('[data-rollout=\"{id}\"]'); return e && e.getAttribute('data-status');"),
            |v| v == "succeeded",
        )
        .await;
    assert_eq!(browser.eval(&step_status(&id, "soak")).await, "succeeded");
    assert_eq!(
        browser
            .eval("return document.getElementById('live').textContent")
            .await,
        "live",
        "the page followed the rollout through its event stream, not by polling"
    );

    // History with a filter: the canary is there for status=succeeded, not for status=failed.
    browser
        .eval("document.querySelector('#filters [name=status]').value = 'failed'; return 0")
        .await;
    browser.click("#history-search").await;
    browser
        .wait_for(
            "no failed rollouts",
            "return document.querySelectorAll('[data-history]').length",
            |v| v == 0,
        )
        .await;
    browser
        .eval("document.querySelector('#filters [name=status]').value = 'succeeded'; return 0")
        .await;
    browser.click("#history-search").await;
    browser
        .wait_for(
            "the succeeded canary in the history",
            "return [...document.querySelectorAll('[data-history]')].map(e => e.getAttribute('data-history'))",
            |v| v == &json!([id]),
        )
        .await;
    browser.quit().await;
    daemon.stop().await;
}

#[tokio::test]
async fn the_rollback_button_asks_for_a_reason_and_a_confirmation_then_starts_a_rollback() {
    let Some(slot) = browser_slot("the dashboard rollback test").await else {
        return;
    };
    let daemon = Daemon::start(operator_and_oncall()).await;
    let canary = daemon.start_canary("v0.0.451", Some("alice-secret")).await;
    daemon
        .wait_rollout(&canary, Some("alice-secret"), |r| {
            r["status"] == "succeeded"
        })
        .await;

    let browser = slot.browser().await;
    browser.open(&format!("{}/", daemon.url)).await;
    browser
        .wait_for(
            "the missing token",
            "return document.getElementById('message').textContent",
            |v| v.as_str().is_some_and(|t| t.contains("unauthorized")),
        )
        .await;
    browser.type_into("#token", "oncall-secret").await;
    browser.click("#token-save").await;
    browser
        .wait_for(
            "r2 at v0.0.451",
            &format!("const e = document.querySelector('[data-replica=\"{HOST}/{R2}\"] [data-field=tag]'); return e && e.textContent;"),
            |v| v == "v0.0.451",
        )
        .await;
    assert_eq!(
        browser
            .eval("return localStorage.getItem('canaryd.token')")
            .await,
        "oncall-secret",
        "the token is kept in localStorage"
    );

    browser
        .click(&format!("[data-rollback=\"{HOST}/{R2}\"]"))
        .await;
    // No reason: nothing is sent.
    browser.click("#rollback-submit").await;
    assert_eq!(
        browser
            .eval("return document.getElementById('rollback-step2').hidden")
            .await,
        true,
        "no confirmation without a reason"
    );
    browser
        .type_into("#rollback-reason", "TTFT regression seen on the dashboard")
        .await;
    browser.click("#rollback-submit").await;
    let question = browser
        .wait_for(
            "the confirmation question",
            "return document.getElementById('rollback-step2').hidden ? null : document.getElementById('rollback-question').textContent",
            |v| v.is_string(),
        )
        .await;
    assert!(
        question.as_str().is_some_and(|q| q.contains(R2)),
        "{question}"
    );
    let before = daemon
        .request(
            "GET",
            "/v1/rollouts?kind=rollback",
            Some("oncall-secret"),
            None,
        )
        .await;
    assert_eq!(
        before["items"],
        json!([]),
        "nothing is sent before the confirmation"
    );

    browser.click("#rollback-confirm").await;
    let rollback_id = browser
        .wait_for(
            "the started rollback",
            "const e = document.querySelector('[data-rollback-id]'); return e && e.getAttribute('data-rollback-id');",
            |v| v.is_string(),
        )
        .await;
    let rollback_id = rollback_id.as_str().expect("id").to_owned();
    let rollback = daemon
        .wait_rollout(&rollback_id, Some("oncall-secret"), |r| {
            matches!(
                r["status"].as_str(),
                Some("succeeded" | "failed" | "aborted")
            )
        })
        .await;
    assert_eq!(rollback["kind"], "rollback");
    assert_eq!(
        rollback["actor"], "oncall",
        "sent with the token from the page"
    );
    assert_eq!(rollback["reason"], "TTFT regression seen on the dashboard");
    assert_eq!(rollback["service"], R2);
    assert_eq!(rollback["status"], "succeeded", "{rollback:#}");
    browser
        .wait_for(
            "the rollback followed to its end",
            &format!("const e = document.querySelector('[data-rollout=\"{rollback_id}\"]'); return e && e.getAttribute('data-status');"),
            |v| v == "succeeded",
        )
        .await;
    // The canary it undid says so in the history, and on its own page.
    browser.click("#history-search").await;
    browser
        .wait_for(
            "the canary marked rolled back in the history",
            &format!("const e = document.querySelector('[data-history=\"{canary}\"] [data-rolled-back-by]'); return e && e.textContent;"),
            |v| v.as_str() == Some(&format!("succeeded · rolled back by {rollback_id}")),
        )
        .await;
    browser
        .open(&format!("{}/rollouts/{canary}", daemon.url))
        .await;
    browser
        .wait_for(
            "the canary's page says it was rolled back",
            "const e = document.querySelector('#status [data-rolled-back-by]'); return e && e.textContent;",
            |v| v.as_str().is_some_and(|t| t.contains(&rollback_id)),
        )
        .await;
    browser.quit().await;
    daemon.stop().await;
}

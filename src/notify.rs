//! Webhook notifications, delivered from the transactional outbox
//! (docs/operator-guide.md#5-notifications).
//!
//! The outbox row of a notification is written in the same transaction as the audit event
//! that causes it (`store::outbox`), so a committed state change always has its notification
//! and a rolled-back one never does. This task then:
//!
//! 1. routes each new outbox row to the webhooks subscribed to its event (one
//!    `outbox_delivery` row per webhook, written with the routing mark in one transaction);
//! 2. delivers each due delivery: it **claims** the attempt first (attempts + 1 and the time
//!    of the next retry, committed), then POSTs with `Idempotency-Key: <outbox id>`, then marks
//!    it delivered on a 2xx, or records the error; the retry delay doubles from
//!    `retry_initial` to `retry_max`, and after `max_attempts` the delivery is `failed`.
//!
//! Semantics: **at least once, with an idempotency key**. Nothing is lost across restarts
//! (the rows are in SQLite), and a request that reached the receiver but whose 2xx was not
//! recorded (timeout, crash, restart) is sent again with the same `Idempotency-Key`, which
//! the receiver uses to drop the duplicate.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::json;

use crate::config::{NotificationsConfig, WebhookConfig, WebhookFormat};
use crate::store::{DueDelivery, Store};

mod storage;

/// Outbox rows handled per pass; a pass repeats while there is more.
const BATCH: i64 = 100;
/// Passes per wake-up before waiting again (bounds one wake-up's work).
const MAX_PASSES: usize = 100;

/// The running notifier; stopping it (or dropping it) ends its task. Anything not yet
/// delivered stays in the outbox for the next start.
pub struct Notifier {
    task: Option<tokio::task::JoinHandle<()>>,
    /// The alerts of a failing database, sent from memory (`storage.rs`).
    alerts: tokio::task::JoinHandle<()>,
}

impl Notifier {
    /// Starts delivering the outbox of `store` to the configured webhooks. With the
    /// daemon's `public_url`, each notification links its rollout's page.
    pub fn spawn(
        store: Store,
        config: NotificationsConfig,
        public_url: Option<String>,
    ) -> Notifier {
        let webhooks = config.webhooks.clone();
        let mut worker = Worker::new(store.clone(), config);
        worker.public_url = public_url;
        let alerts = storage::alert_when_waiting(store, webhooks, worker.client.clone());
        Notifier {
            alerts: tokio::spawn(alerts),
            task: Some(tokio::spawn(worker.run())),
        }
    }

    /// Stops the task at once (an attempt in flight is resent at the next start).
    pub async fn stop(mut self) {
        self.alerts.abort();
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        self.alerts.abort();
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

struct Worker {
    store: Store,
    config: Arc<NotificationsConfig>,
    client: reqwest::Client,
    /// The daemon's `public_url`: notifications link the rollout's page.
    public_url: Option<String>,
}

impl Worker {
    fn new(store: Store, config: NotificationsConfig) -> Self {
        let client = reqwest::Client::builder()
            .timeout(config.delivery.timeout)
            .connect_timeout(config.delivery.timeout)
            .user_agent(concat!("canaryd/", env!("CARGO_PKG_VERSION")))
            .build()
            .unwrap_or_default();
        Self {
            store,
            config: Arc::new(config),
            client,
            public_url: None,
        }
    }

    /// Runs for the daemon's life: a pass over the outbox at start, after each commit that
    /// wrote a notification (`Store::outbox_writes`), at each due retry, and `poll_interval`
    /// after a pass that failed. Nothing else writes the outbox, so there is no polling.
    async fn run(self) {
        let mut writes = self.store.outbox_writes();
        let poll = self.config.delivery.poll_interval;
        // What is known of the pending deliveries: `None` until read, then when the next
        // one is due (`Some(None)`: there is none). Only routing adds one, and only this
        // task delivers them, so it is read again only after either.
        let mut next_due: Option<Option<DateTime<Utc>>> = None;
        loop {
            let mut failed = false;
            for _ in 0..MAX_PASSES {
                match self.pass(&mut next_due).await {
                    Ok(true) => continue,
                    Ok(false) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, "notification outbox pass failed; retrying");
                        failed = true;
                        next_due = None;
                        break;
                    }
                }
            }
            if next_due.is_none() && !failed {
                match self.store.next_delivery_at().await {
                    Ok(next) => next_due = Some(next),
                    Err(e) => {
                        tracing::warn!(error = %e, "could not read the next notification retry");
                        failed = true;
                    }
                }
            }
            let wait = if failed {
                Some(poll)
            } else {
                next_due
                    .flatten()
                    .map(|at| (at - Utc::now()).to_std().unwrap_or(Duration::ZERO))
            };
            wait_for_work(&mut writes, wait, poll).await;
        }
    }

    /// Routes new notifications and sends due deliveries (read only when some may be due:
    /// `next_due` unknown or past, or this pass routed one); true when a batch was full (more
    /// may be waiting). `next_due` is forgotten when a delivery was added or attempted.
    async fn pass(
        &self,
        next_due: &mut Option<Option<DateTime<Utc>>>,
    ) -> Result<bool, crate::store::StoreError> {
        let unrouted = self.store.unrouted_notifications(BATCH).await?;
        let targets: Vec<Vec<&str>> = unrouted
            .iter()
            .map(|n| {
                self.config
                    .webhooks
                    .iter()
                    .filter(|w| w.events.iter().any(|e| e.as_str() == n.event))
                    .map(|w| w.name.as_str())
                    .collect()
            })
            .collect();
        let routes: Vec<(&str, &[&str])> = unrouted
            .iter()
            .zip(&targets)
            .map(|(n, t)| (n.outbox_id.as_str(), t.as_slice()))
            .collect();
        // One transaction for the pass's batch: routing is all-or-nothing, and read again on
        // the next pass if it failed.
        self.store.route_notifications(&routes, Utc::now()).await?;
        if targets.iter().any(|t| !t.is_empty()) {
            *next_due = None;
        }
        let now = Utc::now();
        let may_be_due = match next_due {
            None => true,
            Some(next) => next.is_some_and(|at| at <= now),
        };
        if !may_be_due {
            return Ok(unrouted.len() as i64 == BATCH);
        }
        let due = self.store.due_deliveries(now, BATCH).await?;
        if !due.is_empty() {
            *next_due = None;
        }
        for d in &due {
            self.deliver(d).await?;
        }
        Ok(unrouted.len() as i64 == BATCH || due.len() as i64 == BATCH)
    }

    async fn deliver(&self, d: &DueDelivery) -> Result<(), crate::store::StoreError> {
        let Some(webhook) = self.config.webhooks.iter().find(|w| w.name == d.webhook) else {
            // Removed from the config since it was routed: nothing to send it to.
            let why = format!("webhook {} is no longer configured", d.webhook);
            return self
                .store
                .finish_delivery(&d.outbox_id, &d.webhook, Utc::now(), Err((why, true)))
                .await;
        };
        let tuning = &self.config.delivery;
        let attempt = u32::try_from(d.attempts)
            .unwrap_or(u32::MAX)
            .saturating_add(1);
        let delay = backoff(tuning.retry_initial, tuning.retry_max, attempt);
        let now = Utc::now();
        let retry_at = now + chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::MAX);
        self.store
            .claim_delivery(&d.outbox_id, &d.webhook, now, retry_at)
            .await?;
        let outcome = self.send(webhook, d).await;
        let outcome = match outcome {
            Ok(()) => {
                tracing::info!(
                    webhook = %webhook.name, notification.id = %d.outbox_id, event = %d.event,
                    attempt, "notification {} ({}) delivered to {}", d.outbox_id, d.event, webhook.name
                );
                Ok(())
            }
            Err(error) => {
                let give_up = attempt >= tuning.max_attempts;
                if give_up {
                    tracing::error!(
                        webhook = %webhook.name, notification.id = %d.outbox_id, attempt, error = %error,
                        "notification {} to {} given up after {attempt} attempts", d.outbox_id, webhook.name
                    );
                } else {
                    tracing::warn!(
                        webhook = %webhook.name, notification.id = %d.outbox_id, attempt, error = %error,
                        retry_in_ms = delay.as_millis() as u64,
                        "notification {} to {} failed; retrying", d.outbox_id, webhook.name
                    );
                }
                Err((error, give_up))
            }
        };
        self.store
            .finish_delivery(&d.outbox_id, &d.webhook, Utc::now(), outcome)
            .await
    }

    /// One POST. The error never contains the URL (it may hold a token).
    async fn send(&self, webhook: &WebhookConfig, d: &DueDelivery) -> Result<(), String> {
        let mut payload: serde_json::Value =
            serde_json::from_str(&d.payload).map_err(|e| format!("corrupt payload: {e}"))?;
        if let Some(base) = &self.public_url {
            link_page(&mut payload, base);
        }
        let body = body_for(webhook.format, payload);
        let res = self
            .client
            .post(webhook.url.expose())
            .header("Idempotency-Key", &d.outbox_id)
            .json(&body)
            .send()
            .await
            .map_err(describe)?;
        let status = res.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("answered {status}"))
        }
    }
}

/// Adds the rollout's page (`<public_url>/rollouts/<id>`) to a notification: `rollout.url`,
/// and at the end of its `text`.
/// What a webhook of `format` is sent for `payload`: the payload itself, or Slack's
/// `{"text"}` with the line escaped as Slack requires (safety rule 24).
pub(crate) fn body_for(format: WebhookFormat, payload: serde_json::Value) -> serde_json::Value {
    match format {
        WebhookFormat::Json => payload,
        WebhookFormat::Slack => json!({
            "text": crate::domain::notification::slack_text(payload["text"].as_str().unwrap_or_default())
        }),
    }
}

fn link_page(payload: &mut serde_json::Value, base: &str) {
    let Some(id) = payload["rollout"]["id"].as_str() else {
        return;
    };
    let url = format!("{base}/rollouts/{id}");
    if let Some(text) = payload["text"].as_str() {
        payload["text"] = json!(format!("{text} {url}"));
    }
    payload["rollout"]["url"] = json!(url);
}

/// Waits for the next pass: a commit that wrote a notification (`writes` changed since it
/// was last seen, during the previous pass included), or `wait` (the next due retry; `None`:
/// none is pending). When the store is gone it waits `poll`, so a closed channel is no busy
/// loop.
async fn wait_for_work(
    writes: &mut tokio::sync::watch::Receiver<u64>,
    wait: Option<Duration>,
    poll: Duration,
) {
    let timer = async {
        match wait {
            Some(wait) => tokio::time::sleep(wait).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        changed = writes.changed() => {
            if changed.is_err() {
                tokio::time::sleep(poll).await;
            }
        }
        () = timer => {}
    }
}

/// The delay before retrying after failed attempt number `attempt` (1-based): `initial`,
/// doubling, capped at `max`.
pub fn backoff(initial: Duration, max: Duration, attempt: u32) -> Duration {
    let factor = 2u32.saturating_pow(attempt.saturating_sub(1).min(30));
    initial.saturating_mul(factor).min(max)
}

/// A transport error without its URL.
fn describe(e: reqwest::Error) -> String {
    if e.is_timeout() {
        "timed out".to_owned()
    } else if e.is_connect() {
        "could not connect".to_owned()
    } else {
        e.without_url().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::{backoff, wait_for_work};
    use std::time::Duration;
    use tokio::sync::watch;
    use tokio::time::Instant;

    const SECOND: Duration = Duration::from_secs(1);

    #[tokio::test(start_paused = true)]
    async fn the_notifier_waits_for_the_due_retry_or_wakes_at_an_outbox_write() {
        let (tx, mut rx) = watch::channel(0u64);
        // Nothing happens: it wakes when the retry is due.
        let start = Instant::now();
        wait_for_work(&mut rx, Some(3 * SECOND), 5 * SECOND).await;
        assert_eq!(start.elapsed(), 3 * SECOND);
        // A write a second in: it wakes then, before the retry is due.
        let start = Instant::now();
        let send = tokio::spawn(async move {
            tokio::time::sleep(SECOND).await;
            tx.send_modify(|n| *n += 1);
            tx
        });
        wait_for_work(&mut rx, Some(3 * SECOND), 5 * SECOND).await;
        assert_eq!(start.elapsed(), SECOND);
        // No retry pending: only a write wakes it, however late; one made while it was
        // not waiting (during a pass) wakes it at once.
        let tx = send.await.expect("sender task");
        let start = Instant::now();
        let send = tokio::spawn(async move {
            tokio::time::sleep(60 * SECOND).await;
            tx.send_modify(|n| *n += 1);
            tx.send_modify(|n| *n += 1);
            tx
        });
        wait_for_work(&mut rx, None, 5 * SECOND).await;
        assert_eq!(start.elapsed(), 60 * SECOND);
        let tx = send.await.expect("sender task");
        tx.send_modify(|n| *n += 1);
        let start = Instant::now();
        wait_for_work(&mut rx, None, 5 * SECOND).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        // The store is gone: it waits the poll interval, not at all.
        drop(tx);
        let start = Instant::now();
        wait_for_work(&mut rx, None, 5 * SECOND).await;
        assert_eq!(start.elapsed(), 5 * SECOND);
    }

    #[test]
    fn the_retry_delay_doubles_from_the_initial_delay_up_to_the_cap() {
        let (i, m) = (Duration::from_secs(1), Duration::from_secs(10));
        let delays: Vec<u64> = (1..=6).map(|a| backoff(i, m, a).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 10, 10]);
        assert_eq!(backoff(i, m, u32::MAX), m);
    }
}

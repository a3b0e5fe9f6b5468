//! The alert of a failing database (safety rule 18): sent from memory, since the outbox is
//! what cannot be written. Once per rollout that starts waiting for a write, to every webhook
//! that receives `failed` or `replica_left_down`; one attempt each, best effort.

use chrono::SecondsFormat;
use serde_json::{json, Value};

use crate::config::WebhookConfig;
use crate::domain::notification::NotifyEvent;
use crate::store::{Store, WaitingRollout};

/// Sends an alert for each rollout that starts waiting on the storage, for the store's life.
pub(super) async fn alert_when_waiting(
    store: Store,
    webhooks: Vec<WebhookConfig>,
    client: reqwest::Client,
) {
    let wanted: Vec<WebhookConfig> = webhooks
        .into_iter()
        .filter(|w| {
            w.events.contains(&NotifyEvent::Failed)
                || w.events.contains(&NotifyEvent::ReplicaLeftDown)
        })
        .collect();
    loop {
        store.health().alerts.notified().await;
        for waiting in store.health().take_unannounced() {
            let payload = payload(&waiting);
            let key = format!(
                "storage-{}-{}",
                waiting.rollout_id,
                waiting.since.timestamp_millis()
            );
            for webhook in &wanted {
                let body = super::body_for(webhook.format, payload.clone());
                let sent = client
                    .post(webhook.url.expose())
                    .header("Idempotency-Key", &key)
                    .json(&body)
                    .send()
                    .await;
                match sent.map(|r| r.status()) {
                    Ok(status) if status.is_success() => {
                        tracing::info!(webhook = %webhook.name, rollout.id = %waiting.rollout_id, "storage alert for rollout {} sent to {}", waiting.rollout_id, webhook.name);
                    }
                    Ok(status) => {
                        tracing::error!(webhook = %webhook.name, rollout.id = %waiting.rollout_id, "storage alert for rollout {} to {}: answered {status}", waiting.rollout_id, webhook.name);
                    }
                    Err(e) => {
                        let e = super::describe(e);
                        tracing::error!(webhook = %webhook.name, rollout.id = %waiting.rollout_id, "storage alert for rollout {} to {}: {e}", waiting.rollout_id, webhook.name);
                    }
                }
            }
        }
    }
}

/// The alert's body: the rollout, its last call and whether its replica is down.
fn payload(w: &WaitingRollout) -> Value {
    let down = w.last_call.as_ref().is_some_and(|c| c.took_down(&w.target));
    let call = match &w.last_call {
        Some(c) => format!(
            "its last call, {} of {}, {}",
            c.endpoint,
            c.services.join(","),
            c.outcome
        ),
        None => "it has sent no compose call yet".to_owned(),
    };
    let then = if down {
        format!(
            "; replica {} on {} is DOWN until the database can be written",
            w.service, w.host
        )
    } else {
        String::new()
    };
    let text = format!(
        "canaryd: cannot write its database ({}): rollout {} of {} on {} waits and sends nothing; {call}{then}",
        w.error, w.rollout_id, w.service, w.host
    );
    json!({
        "event": "storage_failing",
        "rollout_id": w.rollout_id,
        "host": w.host,
        "service": w.service,
        "error": w.error,
        "since": w.since.to_rfc3339_opts(SecondsFormat::Millis, true),
        "last_call": w.last_call.as_ref().map(|c| json!({
            "endpoint": c.endpoint,
            "services": c.services,
            "outcome": c.outcome,
            "at": c.at.to_rfc3339_opts(SecondsFormat::Millis, true),
        })),
        "replica_down": down,
        "text": text,
    })
}

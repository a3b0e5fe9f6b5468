//! canaryd: rolls one replica of a GPU inference engine at a time onto a new version, and back.
//!
//! Read ARCHITECTURE.md first. Layers, from the inside out:

/// The API's wire types, shared by the HTTP API and the CLI.
pub mod api;
/// Start-up: database, engine, recovery, listener.
pub mod app;
/// The command line.
pub mod cli;
/// compose-manager HTTP client: typed calls, NDJSON stream reader, capability probe.
pub mod compose;
/// Configuration file: load, validate, resolve secrets from env vars.
pub mod config;
/// The host doctor: read-only checks of what a rollout needs on a host.
pub mod doctor;
/// Pure model: runbooks, plans, the dry-run plan gate, log matching, state machines.
pub mod domain;
/// Drives rollouts: one task per rollout, step executors, abort, restart recovery.
pub mod engine;
/// The HTTP API: routers per resource, errors, auth.
pub mod http;
/// Prometheus metrics, fed by audit events and compose-manager requests.
pub mod metrics;
/// Webhook notifications delivered from the transactional outbox.
pub mod notify;
/// Health poller and log watcher used by the engine's wait steps.
pub mod probe;
/// SQLite persistence: pool, migrations, queries, the append-only audit log.
pub mod store;
/// Logging set-up.
pub mod telemetry;
/// What the tests and benches share (the `testing` feature only).
#[cfg(feature = "testing")]
pub mod testing;

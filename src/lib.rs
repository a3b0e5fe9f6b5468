//! canaryd: rolls one replica of a GPU inference engine at a time onto a new version, and back.
//!
//! Read ARCHITECTURE.md first. Layers, from the inside out:

/// Pure model: runbooks, plans, the dry-run plan gate, log matching, state machines.
pub mod domain;
/// Configuration file: load, validate, resolve secrets from env vars.
pub mod config;
/// compose-manager HTTP client: typed calls, NDJSON stream reader, capability probe.
pub mod compose;
/// Health poller and log watcher used by the engine's wait steps.
pub mod probe;
/// SQLite persistence: pool, migrations, queries, the append-only audit log.
pub mod store;
/// Drives rollouts: one task per rollout, step executors, abort, restart recovery.
pub mod engine;
/// The HTTP API: routers per resource, errors, auth.
pub mod http;
/// The simulated host (compose-manager + engines) used by `dev` and the tests.
pub mod sim;
/// The command line.
pub mod cli;

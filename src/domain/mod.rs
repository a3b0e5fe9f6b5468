//! Pure domain model. No tokio, sqlx, axum or reqwest here, and no clock reads: callers pass `now`.

pub mod audit;
/// Moved to `sim/compose_file.rs`, its only user. This path stays until `sim/engine.rs`
/// (edited by a branch in flight) imports it from there: see ARCHITECTURE.md, "Layers".
pub use crate::sim::compose_file;
pub mod duration;
#[cfg(test)]
pub(crate) mod fuzz;
pub mod log_watch;
pub mod notification;
pub mod pattern;
pub mod plan;
pub mod plan_gate;
pub mod runbook;
pub mod state;
pub mod yaml_line;

//! Pure domain model. No tokio, sqlx, axum or reqwest here, and no clock reads: callers pass `now`.

pub mod analysis;
pub mod audit;
pub mod defaults;
pub mod downtime;
pub mod duration;
pub mod error_code;
pub mod exposition;
#[cfg(test)]
pub(crate) mod fuzz;
pub mod log_watch;
pub mod mask;
pub mod names;
pub mod notification;
pub mod pattern;
pub mod plan;
pub mod plan_gate;
pub mod release;
pub mod rollout;
pub mod runbook;
pub mod staging;
pub mod state;
pub mod unknown_keys;
pub mod uptime;
pub mod window;
pub mod yaml_line;

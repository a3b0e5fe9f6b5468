//! The one integration test binary: everything end to end, against the simulated host.

mod abort;
mod analyze;
mod audit;
mod auth;
mod canary;
mod cli;
mod compose_client;
mod crash_binary;
mod dashboard;
mod doctor;
mod helpers;
mod hostile;
mod logging;
mod metrics;
mod notify;
mod openapi;
mod real_host;
mod recovery;
mod rollback;
mod secrets;
mod sim_host;

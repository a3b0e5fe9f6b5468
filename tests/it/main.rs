//! The one integration test binary: everything end to end, against the simulated host.

mod abort;
mod audit;
mod auth;
mod canary;
mod cli;
mod cli_discovery;
mod compose_client;
mod container;
mod crash_binary;
mod dashboard;
mod docs_links;
mod doctor;
mod helpers;
mod hostile;
mod http_errors;
mod layers;
mod logging;
mod metrics;
mod notify;
mod openapi;
mod real_host;
mod recovery;
mod repo;
mod rollback;
mod secrets;
mod sim_host;

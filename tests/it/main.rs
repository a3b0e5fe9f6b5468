//! The one integration test binary: everything end to end, against the simulated host.

mod audit;
mod canary;
mod compose_client;
mod dashboard;
mod helpers;
mod logging;
mod notify;
mod openapi;
mod recovery;
mod rollback;
mod sim_host;

//! The one integration test binary: everything end to end, against the simulated host.

mod compose_client;
mod sim_host;

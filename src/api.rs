//! The API's wire types: what `/v1/rollouts` and `/v1/releases` answer and take, read by the
//! HTTP API (`http/`) and by the CLI, which never imports `http/`. The release validation
//! lives here too, since `canaryd check release` runs it without a daemon.

pub mod release;
pub mod rollout;

pub use release::{ReleaseEventOut, ReleaseIn, ReleaseOut, ReleaseTargetOut, SelectorIn, TargetIn};
pub use rollout::{CallOut, ErrorOut, RolloutOut, StepOut};

//! Logging: `tracing` to stderr, readable text or JSON (`--log-format json`); `RUST_LOG` filters.
//!
//! In JSON, each line is one object: `timestamp`, `level`, `target`, `fields` (the message and
//! the event's fields), `span` (the innermost span) and `spans` (every open span, outermost
//! first). A rollout's task runs in a `rollout` span with `rollout.id`, `host` and `service`,
//! and each step in a `step` span with `step.name` and `step.kind`, so every line a rollout
//! writes can be found with `jq 'select(.spans[]?."rollout.id" == "ro_...")'`.

use std::io::IsTerminal;

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Installs the global subscriber once, writing to stderr; later calls do nothing. Text is
/// coloured only when stderr is a terminal: a file, a pipe or journald gets plain text.
pub fn init(format: LogFormat, default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let ansi = std::io::stderr().is_terminal();
    let _ =
        tracing::subscriber::set_global_default(subscriber(format, filter, std::io::stderr, ansi));
}

/// The subscriber `init` installs, writing to `writer` (tests capture the lines with it), with
/// ANSI colours when `ansi` is set.
pub fn subscriber<W>(
    format: LogFormat,
    filter: EnvFilter,
    writer: W,
    ansi: bool,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(writer);
    match format {
        LogFormat::Text => Box::new(builder.with_target(false).finish()),
        LogFormat::Json => Box::new(
            builder
                .json()
                .with_current_span(true)
                .with_span_list(true)
                .finish(),
        ),
    }
}

//! Writing to stdout without panicking when the reader has gone: `canaryd history | head -1`
//! closes the pipe after one line, and `println!` would panic (exit 101, a stack trace). Every
//! command prints through [`print`] (or the `out!`/`outln!` macros) and propagates the error;
//! [`super::run`] turns [`StdoutClosed`] into a quiet exit 0, as `rg` and `fd` do.

use std::io::{self, Write};

/// stdout was closed by its reader (`EPIPE`): nothing more can be shown, and that is fine.
#[derive(Debug, thiserror::Error)]
#[error("stdout was closed by its reader")]
pub struct StdoutClosed;

/// Writes `text` to stdout and flushes it.
pub fn print(text: &str) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
        Err(e) => Err(anyhow::Error::new(e).context("writing to stdout")),
    }
}

/// `print!` through [`print`]: evaluates to `anyhow::Result<()>`.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::stdout::print(&format!($($arg)*))
    };
}

/// `println!` through [`print`]: evaluates to `anyhow::Result<()>`.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::stdout::print(&format!("{}\n", format_args!($($arg)*)))
    };
}

//! Output that survives a closed pipe.
//!
//! Rust ignores SIGPIPE, so a write to a pipe whose reader has gone fails
//! with `BrokenPipe` instead of killing the program, and `println!` and
//! `eprintln!` turn that failure into a panic (exit status 101). A worker
//! started as `nq-worker … 2>&1 | head -1`, or logging to a collector that
//! restarts, would die of it in the middle of a run. Here:
//!
//! * [`stdout_line`] writes a result line and treats a closed stdout as
//!   nobody listening: the program goes on, and its exit status still says
//!   how its run went;
//! * [`stderr_line`] and [`StderrWriter`] (the log writer) ignore every
//!   failure: stderr is where failures would be reported, so there is
//!   nowhere left to report one.

use std::fmt::Display;
use std::io::{self, Write};

use tracing_subscriber::fmt::MakeWriter;

/// Whether `error` says that the reader of a pipe went away.
pub fn is_broken_pipe(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::BrokenPipe
}

/// `Ok(())` for a closed pipe, anything else unchanged: for writes whose
/// reader may leave early (`| head`).
///
/// # Errors
///
/// `result`'s error, unless it is a broken pipe.
pub fn ignore_broken_pipe(result: io::Result<()>) -> io::Result<()> {
    match result {
        Err(e) if is_broken_pipe(&e) => Ok(()),
        other => other,
    }
}

/// Writes `line` and a newline to stdout in one piece, and flushes, so a
/// script waiting for the line sees it at once. A closed stdout is not an
/// error (nobody is listening, and the run goes on).
///
/// # Errors
///
/// Any other write failure, such as a full disk under a redirected stdout:
/// then the line is lost, and the caller must say so.
pub fn stdout_line(line: impl Display) -> io::Result<()> {
    let text = format!("{line}\n");
    let mut stdout = io::stdout().lock();
    ignore_broken_pipe(
        stdout
            .write_all(text.as_bytes())
            .and_then(|()| stdout.flush()),
    )
}

/// Writes `line` and a newline to stderr in one piece; never fails and never
/// panics (see the module doc).
pub fn stderr_line(line: impl Display) {
    write_stderr(format!("{line}\n").as_bytes());
}

/// Writes `bytes` to stderr in one piece, ignoring every failure.
pub fn write_stderr(bytes: &[u8]) {
    // Nothing useful can be done when stderr itself fails.
    let _ = io::stderr().lock().write_all(bytes);
}

/// The log writer: each event goes to stderr in one piece (so lines of
/// concurrent events never interleave), and a failed write is dropped
/// silently instead of reaching `tracing-subscriber`, whose report of it
/// would be an `eprintln!`, which panics on a closed stderr.
#[derive(Clone, Copy, Debug, Default)]
pub struct StderrWriter;

impl<'a> MakeWriter<'a> for StderrWriter {
    type Writer = EventBuffer;

    fn make_writer(&'a self) -> EventBuffer {
        EventBuffer::default()
    }
}

/// One log event's text, written to stderr when dropped.
#[derive(Debug, Default)]
pub struct EventBuffer {
    buf: Vec<u8>,
}

impl Write for EventBuffer {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for EventBuffer {
    fn drop(&mut self) {
        if !self.buf.is_empty() {
            write_stderr(&self.buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_broken_pipe_is_ignored() {
        let pipe = io::Error::from(io::ErrorKind::BrokenPipe);
        assert!(ignore_broken_pipe(Err(pipe)).is_ok());
        let full = io::Error::from(io::ErrorKind::StorageFull);
        let err = ignore_broken_pipe(Err(full)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::StorageFull);
        assert!(ignore_broken_pipe(Ok(())).is_ok());
    }

    #[test]
    fn an_event_is_buffered_until_dropped() {
        let mut event = StderrWriter.make_writer();
        write!(event, "part one, ").unwrap();
        write!(event, "part two").unwrap();
        assert_eq!(event.buf, b"part one, part two");
        // Keep the test's stderr clean.
        event.buf.clear();
    }
}

//! Buffered standard output behind `fmt::Write`, the interface of
//! `nq_core`'s writers (the core does no I/O, so it cannot take an
//! `io::Write`).

use std::fmt;
use std::io::{self, BufWriter, StdoutLock, Write};

/// Standard output, locked and buffered, as a `fmt::Write`. Remembers the I/O
/// error behind a `fmt::Error`, which carries none.
pub(crate) struct Output {
    inner: BufWriter<StdoutLock<'static>>,
    /// The first I/O error; later writes are refused without trying.
    error: Option<io::Error>,
}

/// Locks and buffers standard output. The lock is held until the `Output` is
/// dropped: nothing else in `nq` prints to stdout meanwhile.
pub(crate) fn stdout() -> Output {
    Output {
        inner: BufWriter::with_capacity(1 << 16, io::stdout().lock()),
        error: None,
    }
}

impl fmt::Write for Output {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if self.error.is_some() {
            return Err(fmt::Error);
        }
        self.inner.write_all(s.as_bytes()).map_err(|e| {
            self.error = Some(e);
            fmt::Error
        })
    }
}

impl Output {
    /// Flushes, and returns the I/O error that stopped writing, if any. Call it
    /// BEFORE looking at the result of the writer: a `fmt::Error` from a writer
    /// is only the shadow of this error.
    ///
    /// # Errors
    ///
    /// The stored I/O error, else a flush error.
    pub(crate) fn finish(mut self) -> io::Result<()> {
        match self.error.take() {
            Some(e) => Err(e),
            None => self.inner.flush(),
        }
    }
}

/// True when `e` is, or was caused by, a write to a closed pipe.
pub(crate) fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
    })
}

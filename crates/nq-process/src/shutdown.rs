//! Shutdown signals: the first SIGTERM or Ctrl-C drains, a second one exits.
//!
//! Docker, Kubernetes and Slurm stop a program with SIGTERM and, after a
//! grace period, SIGKILL; a person at a terminal presses Ctrl-C (SIGINT),
//! and presses it again when the drain takes too long. Both programs of nq
//! treat the two signals alike.
//!
//! The listeners for both signals exist from the start and are kept for the
//! second signal. A listener created only after the first signal would miss
//! a second signal that arrives in between: tokio delivers a signal only to
//! the listeners that exist when it arrives.

use std::future::Future;

/// The exit status after a second signal: 128 + SIGINT, what a shell reports
/// for a program stopped by Ctrl-C.
pub const SECOND_SIGNAL_EXIT: i32 = 130;

/// SIGTERM and SIGINT (Ctrl-C), listened to together.
///
/// Create it once, before the signals matter, and keep it: every signal
/// that arrives after [`Signals::new`] is seen by a later [`Signals::recv`],
/// even one that arrives while nobody is waiting. (Signals of one kind that
/// arrive together before the program gets to see the first are merged into
/// one, as the operating system merges them.)
#[derive(Debug)]
pub struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Signals {
    /// Starts listening to SIGTERM and SIGINT. From now on they no longer
    /// end the process by themselves.
    ///
    /// # Errors
    ///
    /// When a handler cannot be installed.
    ///
    /// # Panics
    ///
    /// When called outside a tokio runtime with its I/O driver enabled.
    pub fn new() -> std::io::Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Signals {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    /// Waits for the next SIGTERM or SIGINT, or returns at once for one that
    /// arrived since the previous call.
    pub async fn recv(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The shutdown future of a program: resolves on the first SIGTERM or Ctrl-C,
/// and from then on a second one ends the process at once with status
/// [`SECOND_SIGNAL_EXIT`].
///
/// The listeners are installed by this call, not when the future is first
/// polled, so call it early (before the long work starts). Pass the future to
/// the library's `run`.
///
/// # Errors
///
/// When the signal handlers cannot be installed.
///
/// # Panics
///
/// When called outside a tokio runtime with its I/O driver enabled.
pub fn shutdown_signal() -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
    let mut signals = Signals::new()?;
    Ok(async move {
        signals.recv().await;
        tracing::warn!(
            "signal received: shutting down gracefully (signal again to exit at once)"
        );
        // The same listeners wait for the second signal: one that arrived
        // meanwhile is pending in them and ends the process at once.
        tokio::spawn(async move {
            signals.recv().await;
            tracing::warn!("second signal: exiting now");
            std::process::exit(SECOND_SIGNAL_EXIT);
        });
    })
}

#[cfg(all(test, unix))]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Sends `signal` to this process.
    fn raise(signal: i32) {
        // SAFETY: kill(2) on our own pid with a valid signal number; the
        // signal is handled by tokio's handler, installed by `Signals::new`.
        let rc = unsafe { libc::kill(libc::getpid(), signal) };
        assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
    }

    /// A second signal that arrives before anybody waits for it is still
    /// seen: the race that lost the coordinator's second SIGTERM.
    #[tokio::test]
    async fn a_signal_that_arrives_while_nobody_waits_is_kept() {
        let mut signals = Signals::new().unwrap();
        raise(libc::SIGTERM);
        tokio::time::timeout(Duration::from_secs(60), signals.recv())
            .await
            .expect("the first signal is seen");
        // Nobody is in `recv` now; the old code created its second listener
        // only after this point.
        raise(libc::SIGINT);
        tokio::time::timeout(Duration::from_secs(60), signals.recv())
            .await
            .expect("the second signal is seen");
    }
}

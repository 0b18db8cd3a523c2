//! Ctrl-C for `nq count`: the first SIGINT (or SIGTERM) stops the count,
//! which then prints what it counted and exits with [`INTERRUPTED_EXIT`]; a
//! second one exits at once, with the same status.
//!
//! The signals are the other nq programs' (`nq_process::Signals`), heard on a
//! thread of their own with a small tokio runtime: the count's threads never
//! wait for them, they only read the stop flag this sets.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use nq_process::{SECOND_SIGNAL_EXIT, Signals};

/// The exit status of an interrupted count: 128 + SIGINT, what a shell
/// reports for a program stopped by Ctrl-C, as for `nq-coord` and
/// `nq-worker`.
pub(crate) const INTERRUPTED_EXIT: u8 = SECOND_SIGNAL_EXIT as u8;

/// Whether a signal has stopped the count.
#[derive(Debug, Clone)]
pub(crate) struct Interrupt {
    signalled: Arc<AtomicBool>,
}

impl Interrupt {
    /// From now on, SIGINT and SIGTERM set `stop` instead of ending the
    /// process; a second one ends it with [`INTERRUPTED_EXIT`].
    ///
    /// # Errors
    ///
    /// When the runtime, the handlers or their thread cannot be set up.
    pub(crate) fn listen(stop: Arc<AtomicBool>) -> anyhow::Result<Interrupt> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the signal listener")?;
        let mut signals = {
            let _inside = runtime.enter();
            Signals::new().context("cannot listen to Ctrl-C")?
        };
        let signalled = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&signalled);
        std::thread::Builder::new()
            .name("nq-signals".to_owned())
            .spawn(move || {
                runtime.block_on(async move {
                    signals.recv().await;
                    // The flag first: whoever sees the count stopped must also
                    // see why.
                    flag.store(true, Ordering::SeqCst);
                    stop.store(true, Ordering::SeqCst);
                    signals.recv().await;
                    eprintln!("nq: second signal: exiting now");
                    std::process::exit(SECOND_SIGNAL_EXIT);
                });
            })
            .context("cannot start the signal listener")?;
        Ok(Interrupt { signalled })
    }

    /// True once a signal has arrived.
    pub(crate) fn signalled(&self) -> bool {
        self.signalled.load(Ordering::SeqCst)
    }
}

/// The error a count interrupted by a signal ends with, after it printed what
/// it counted: `main` exits with [`INTERRUPTED_EXIT`] and prints nothing
/// more.
#[derive(Debug)]
pub(crate) struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("interrupted")
    }
}

impl std::error::Error for Interrupted {}

//! What a person at a terminal sees of a run: the progress bar on stderr,
//! and log lines that are drawn above it instead of tearing it.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use nq_coord::Progress;
use tokio::sync::watch;
use tracing_subscriber::fmt::MakeWriter;

use crate::args::{Command, ProgressMode};

/// The progress bar of a run, when `mode` asks for one: a run (no
/// subcommand) with `--progress bar`, or `auto` on a terminal.
pub(crate) fn bar_for(
    command: Option<&Command>,
    mode: ProgressMode,
) -> Option<ProgressBar> {
    match (command, mode) {
        (None, ProgressMode::Bar) => Some(new_bar()),
        (None, ProgressMode::Auto) if std::io::stderr().is_terminal() => Some(new_bar()),
        _ => None,
    }
}

/// A progress bar, hidden until [`show_progress`] draws it (after the
/// `listening on` line, which it must not interleave with on a terminal).
fn new_bar() -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(1000), ProgressDrawTarget::hidden());
    let style = ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {wide_bar} {percent:>3}% {msg}",
    )
    .expect("the template is valid");
    bar.set_style(style);
    bar.set_message("preparing jobs");
    bar
}

/// Starts drawing `bar` from the progress snapshots the run sends; returns
/// the sender to put into the run's `Config::progress`, and the task, which
/// ends when the run is complete or drops the sender.
pub(crate) fn start(
    bar: ProgressBar,
) -> (watch::Sender<Progress>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(Progress::default());
    (tx, tokio::spawn(show_progress(bar, rx)))
}

/// Draws progress snapshots until the run is complete or the channel closes.
/// Nothing is drawn before the first snapshot, which the run sends once it
/// serves (after `listening on`); a finished run sends none.
async fn show_progress(bar: ProgressBar, mut rx: watch::Receiver<Progress>) {
    let mut drawing = false;
    while rx.changed().await.is_ok() {
        if !drawing {
            drawing = true;
            bar.set_draw_target(ProgressDrawTarget::stderr());
            bar.enable_steady_tick(Duration::from_millis(200));
        }
        let p = rx.borrow_and_update().clone();
        bar.set_position((p.fraction() * 1000.0) as u64);
        let eta = p
            .eta()
            .map_or("?".to_owned(), |d| format!("{}s", d.as_secs()));
        let awaiting = match p.awaiting_check.0 {
            0 => String::new(),
            jobs => format!(" · {jobs} computed, awaiting a check"),
        };
        bar.set_message(format!(
            "jobs {}/{}{awaiting} · {:.1} jobs/s · ETA {eta} · workers {}",
            p.counters.jobs_done,
            p.counters.jobs,
            p.jobs_per_second(),
            p.workers_text()
        ));
        if p.counters.complete {
            break;
        }
    }
    bar.finish_and_clear();
}

/// A tracing writer that prints each event in one piece, suspending the
/// progress bar (if any) meanwhile.
#[derive(Clone)]
pub(crate) struct BarWriter(pub(crate) Option<ProgressBar>);

impl<'a> MakeWriter<'a> for BarWriter {
    type Writer = BarLine;

    fn make_writer(&'a self) -> BarLine {
        BarLine {
            bar: self.0.clone(),
            buf: Vec::new(),
        }
    }
}

/// One event's text, written out on drop.
pub(crate) struct BarLine {
    bar: Option<ProgressBar>,
    buf: Vec<u8>,
}

impl Write for BarLine {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for BarLine {
    fn drop(&mut self) {
        // Never fails, even when stderr is gone.
        let write = || nq_process::output::write_stderr(&self.buf);
        match &self.bar {
            Some(bar) if !bar.is_hidden() => bar.suspend(write),
            _ => write(),
        }
    }
}

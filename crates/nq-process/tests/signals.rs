//! `shutdown_signal` in a real process: the first SIGTERM starts the drain,
//! the second ends the process at once with status 130, however soon after
//! the first it comes.
//!
//! The process under test is this test binary itself, started again with
//! `NQ_PROCESS_CHILD` set so that only [`child`] runs, in the child role: it
//! installs the signals, says `ready`, and on the first signal says
//! `draining` and then drains forever. Only a second signal can end it.

#![cfg(unix)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const CHILD_ENV: &str = "NQ_PROCESS_CHILD";

/// The child's role; does nothing in a normal test run.
#[test]
fn child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let shutdown = nq_process::shutdown_signal().unwrap();
        nq_process::output::stdout_line("ready").unwrap();
        shutdown.await;
        nq_process::output::stdout_line("draining").unwrap();
        // A drain that never ends, like a worker finishing a long job.
        std::future::pending::<()>().await;
    });
}

/// The child process, killed if the test fails before it exits.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn spawn_child() -> (Guard, mpsc::Receiver<String>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child", "--nocapture", "--test-threads", "1"])
        .env(CHILD_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (Guard(child), rx)
}

/// Waits for the child's line `want` (a deadline only against a hang).
fn expect_line(lines: &mpsc::Receiver<String>, want: &str) {
    loop {
        let line = lines
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("no `{want}` line from the child: {e}"));
        // libtest writes `test child ... ` before the child's first line.
        if line.ends_with(want) {
            return;
        }
    }
}

fn signal(child: &Child, signal: i32) {
    let pid = libc::pid_t::try_from(child.id()).unwrap();
    // SAFETY: kill(2) with a valid signal number has no memory effects.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
}

/// The second signal is sent the moment the drain starts: with a listener
/// created only after the first signal, this one could be lost and the
/// child would drain forever.
#[test]
fn a_second_signal_exits_at_once_with_130() {
    for second in [libc::SIGTERM, libc::SIGINT] {
        let (mut child, lines) = spawn_child();
        expect_line(&lines, "ready");
        signal(&child.0, libc::SIGTERM);
        expect_line(&lines, "draining");
        signal(&child.0, second);
        let status = child.0.wait().unwrap();
        assert_eq!(
            status.code(),
            Some(nq_process::SECOND_SIGNAL_EXIT),
            "{status}"
        );
    }
}

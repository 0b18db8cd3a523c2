//! Runs the built `nq-worker` binary at an address where no coordinator
//! listens, as a user with a wrong port would, and reads what it says.

use std::process::Command;

/// A port on this machine where nothing listens: bound, then closed.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("a bound address").port()
}

#[test]
fn a_refused_connection_says_once_to_check_the_address() {
    let port = closed_port();
    let out = Command::new(env!("CARGO_BIN_EXE_nq-worker"))
        .args([
            "--connect",
            &format!("127.0.0.1:{port}"),
            "--threads",
            "1",
            "--give-up",
            "3s",
        ])
        .env_remove("RUST_LOG")
        .env_remove("NQ_LOG_FORMAT")
        .env("NO_COLOR", "1")
        .output()
        .expect("the binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // It gives up after --give-up, as before.
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("gave up"), "{stderr}");
    // One warning that says what to check, however many times it retried
    // within the three seconds.
    let advice = format!(
        "cannot reach the coordinator at http://127.0.0.1:{port}: connection refused. Is \
         the coordinator running on 127.0.0.1:{port}? Check --connect (host and port); \
         retrying for up to 3s (--give-up), then the worker stops"
    );
    assert_eq!(stderr.matches(&advice).count(), 1, "{stderr}");
    assert!(!stderr.contains("tcp connect error"), "{stderr}");
    assert!(!stderr.contains("coordinator unreachable"), "{stderr}");
}

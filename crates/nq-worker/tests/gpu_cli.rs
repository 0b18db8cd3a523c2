//! `nq-worker --gpu …` on a machine without a usable GPU: the real binary
//! says what is missing and exits 1, before it leases anything (issue 24,
//! item 3). On a GPU host these cases are covered by the startup self-test
//! instead, and the test returns early.

use std::process::Command;

/// Runs the worker against a coordinator address nobody listens on (it must
/// stop before dialling it) and returns (exit code, stderr).
fn worker(gpu: &str) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nq-worker"))
        .args(["--connect", "127.0.0.1:9", "--give-up", "5s", "--gpu", gpu])
        .env_remove("RUST_LOG")
        .output()
        .expect("the nq-worker binary runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn gpu_all_without_a_gpu_names_what_is_missing_and_exits_1() {
    if nq_gpu::libraries().driver {
        return; // a GPU host: the self-test covers it
    }
    for gpu in ["all", "0", "0,2"] {
        let (code, stderr) = worker(gpu);
        assert_eq!(code, Some(1), "--gpu {gpu}: {stderr}");
        assert!(
            stderr.contains("no NVIDIA driver") && stderr.contains("libcuda.so.1"),
            "--gpu {gpu}: {stderr}"
        );
        // It stopped before dialling the coordinator.
        assert!(!stderr.contains("127.0.0.1:9"), "--gpu {gpu}: {stderr}");
    }
}

#[test]
fn a_bad_gpu_list_is_refused_with_the_accepted_forms() {
    let (code, stderr) = worker("0,0");
    assert_ne!(code, Some(0));
    assert!(stderr.contains("all") && stderr.contains("0,2"), "{stderr}");
}

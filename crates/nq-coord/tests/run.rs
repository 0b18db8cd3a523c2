//! In-process tests of `nq_coord::run`: a real coordinator on 127.0.0.1:0,
//! with its local threads or with a minimal gRPC worker written here.

mod common;

use std::future::Future;
use std::time::Duration;

use common::Worker;
use nq_coord::{Config, RunReport};
use nq_proto::pb;
use nq_proto::pb::coordinator_client::CoordinatorClient;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Every test gets this long.
const LIMIT: Duration = Duration::from_secs(60);

async fn within<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(LIMIT, f)
        .await
        .expect("test timed out")
}

fn config(n: u64, dir: &std::path::Path, threads: usize) -> Config {
    let mut c = Config::new(n, dir.join("run.sled")).unwrap();
    c.local_threads = threads;
    c.linger = Duration::from_millis(200);
    c
}

/// Runs a coordinator to completion (or until `stop` is cancelled).
async fn run(config: Config, stop: CancellationToken) -> nq_coord::Result<RunReport> {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    nq_coord::run(config, listener, stop.cancelled_owned()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_small_boards_on_local_threads() {
    within(async {
        for (n, q, u) in [(8u64, 92u128, 12u128), (9, 352, 46), (10, 724, 92)] {
            let dir = tempfile::tempdir().unwrap();
            let report = run(config(n, dir.path(), 2), CancellationToken::new())
                .await
                .unwrap();
            assert!(report.complete, "n={n}");
            assert_eq!((report.total, report.unique), (q, u), "n={n}");
            assert_eq!(report.published_match(), Some(true));
            assert_eq!(report.conflicts, 0);
            assert_eq!(report.jobs_done, report.jobs);
            let json =
                std::fs::read_to_string(dir.path().join("run.sled/report.json")).unwrap();
            let v: serde_json::Value = serde_json::from_str(&json).unwrap();
            assert_eq!(v["total"], serde_json::json!(q as u64));
            assert_eq!(v["published_match"], true);
            // A finished directory answers at once, with the stored result.
            let again = run(config(n, dir.path(), 2), CancellationToken::new())
                .await
                .unwrap();
            assert_eq!((again.total, again.unique, again.jobs), (q, u, report.jobs));
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_of_another_run_is_refused() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        run(config(8, dir.path(), 1), CancellationToken::new())
            .await
            .unwrap();
        let err = run(config(9, dir.path(), 1), CancellationToken::new())
            .await
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("N=8") && msg.contains("N=9"), "{msg}");
        let mut other_split = config(8, dir.path(), 1);
        other_split.split = Some(nq_core::split::SplitSpec::new(2, 0).unwrap());
        assert!(run(other_split, CancellationToken::new()).await.is_err());
        let mut solutions = config(8, dir.path(), 1);
        solutions.solutions = true;
        assert!(run(solutions, CancellationToken::new()).await.is_err());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_run_resumes() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        // No threads and no workers: nothing gets done until shutdown.
        let stop = CancellationToken::new();
        let run1 = tokio::spawn(run(config(11, dir.path(), 0), stop.clone()));
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.cancel();
        let report = run1.await.unwrap().unwrap();
        assert!(!report.complete);
        assert_eq!(report.jobs_done, 0);
        assert!(report.summary_line().contains("status=interrupted"));
        let report = run(config(11, dir.path(), 2), CancellationToken::new())
            .await
            .unwrap();
        assert!(report.complete);
        assert_eq!((report.total, report.unique), (2680, 341));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_workers_count_and_repeats_never_change_the_total() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let coord = tokio::spawn(nq_coord::run(
            config(10, dir.path(), 0),
            listener,
            stop.clone().cancelled_owned(),
        ));

        // A worker of another protocol version is refused, naming both.
        let mut client = CoordinatorClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        let err = client
            .register(pb::RegisterRequest {
                protocol_version: 99,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
        assert!(
            err.message().contains("99")
                && err
                    .message()
                    .contains(&nq_proto::PROTOCOL_VERSION.to_string()),
            "{err}"
        );
        // An unknown worker must register again.
        let err = client
            .lease(pb::LeaseRequest {
                worker_id: "nobody".into(),
                want: 1,
                held: vec![],
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);

        let mut w = Worker::connect(addr).await;
        let mut first = true;
        'run: loop {
            let resp = w
                .client
                .lease(pb::LeaseRequest {
                    worker_id: w.id.clone(),
                    want: 8,
                    held: vec![],
                })
                .await
                .unwrap()
                .into_inner();
            if resp.run_complete {
                break;
            }
            if resp.jobs.is_empty() {
                tokio::time::sleep(Duration::from_millis(resp.retry_after_ms)).await;
                continue;
            }
            for job in resp.jobs {
                let counts = w.solve(&job);
                if first {
                    // A result with a wrong number of entries is refused.
                    let err = w.report(&job, &counts[1..]).await.unwrap_err();
                    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
                }
                let ack = w.report(&job, &counts).await.unwrap();
                assert_eq!(ack.outcome(), pb::report_ack::Outcome::Accepted);
                if first {
                    first = false;
                    // The same result again is a confirmation ...
                    let ack = w.report(&job, &counts).await.unwrap();
                    assert_eq!(ack.outcome(), pb::report_ack::Outcome::Confirmed);
                    // ... and a different (but plausible) one a conflict;
                    // neither counts.
                    let mut wrong = counts.clone();
                    wrong[0].count += 8;
                    let ack = w.report(&job, &wrong).await.unwrap();
                    assert_eq!(ack.outcome(), pb::report_ack::Outcome::Conflict);
                }
                if ack.run_complete {
                    // The last ack says the run is over: a worker exits now.
                    break 'run;
                }
            }
        }
        stop.cancel();
        let report = coord.await.unwrap().unwrap();
        assert!(report.complete);
        assert_eq!((report.total, report.unique), (724, 92));
        assert_eq!((report.confirmations, report.conflicts), (1, 1));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn solutions_are_stored_and_exported() {
    use nq_coord::export::{ExportOptions, export};
    use nq_core::notation::Format;

    within(async {
        let dir = tempfile::tempdir().unwrap();
        let mut c = config(8, dir.path(), 2);
        c.solutions = true;
        let report = run(c, CancellationToken::new()).await.unwrap();
        assert_eq!((report.total, report.unique), (92, 12));
        let data = dir.path().join("run.sled");
        let mut all = vec![];
        let summary = export(&data, &ExportOptions::default(), &mut all).unwrap();
        assert!(summary.complete);
        assert_eq!(summary.written, 92);
        let mut lines: Vec<&str> = std::str::from_utf8(&all).unwrap().lines().collect();
        lines.sort();
        lines.dedup();
        assert_eq!(lines.len(), 92, "every solution exactly once");
        assert!(lines.contains(&"[0 4 7 5 2 6 1 3]"));
        let mut unique = vec![];
        let options = ExportOptions {
            unique: true,
            format: Format::Digits,
        };
        assert_eq!(export(&data, &options, &mut unique).unwrap().written, 12);
        assert!(
            std::str::from_utf8(&unique)
                .unwrap()
                .lines()
                .all(|l| l.len() == 8)
        );
    })
    .await;
}

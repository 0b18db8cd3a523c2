//! `ReportBatch`: the count-only results of many jobs in one call, each item
//! judged alone. See: issue 9 ("Leases and reports batch per worker").

use anyhow::{Context, Result, bail, ensure};
use nq_e2e::client::ProtocolWorker;
use nq_e2e::{Coord, HAND_DRIVEN, within, worker};
use nq_proto::pb::{self, report_ack::Outcome};
use tonic::Code;

use crate::{LIMIT, data_dir};

/// Leases until `w` holds `k` jobs.
async fn lease_jobs(w: &mut ProtocolWorker, k: usize) -> Result<Vec<pb::Job>> {
    let mut jobs = Vec::with_capacity(k);
    while jobs.len() < k {
        let job = w.lease_one().await?.context("the run ended early")?;
        jobs.push(job);
    }
    Ok(jobs)
}

/// A batch whose middle item is bound to another worker's lease: that item
/// alone is refused with PERMISSION_DENIED and stores nothing, the items
/// around it are accepted, a batch over the item limit is refused whole, and
/// the run's totals are exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_item_under_another_workers_lease_is_refused_alone() -> Result<()> {
    within(LIMIT, "batch with a stolen item", async {
        let tmp = tempfile::tempdir()?;
        let mut coord = Coord::ephemeral(&data_dir(&tmp), HAND_DRIVEN).await?;
        let mut honest = ProtocolWorker::register(coord.addr, "honest").await?;
        let mut thief = ProtocolWorker::register(coord.addr, "thief").await?;
        let mine = lease_jobs(&mut thief, 2).await?;
        let theirs = lease_jobs(&mut honest, 1).await?.remove(0);

        // Every item carries the TRUE counts: only the binding can refuse
        // the stolen one.
        let mut items = vec![];
        for job in [&mine[0], &theirs, &mine[1]] {
            let (counts, kernel) = thief.solve(job)?;
            items.push(thief.batch_item(job, &counts, kernel));
        }

        // Over the limit: refused whole, before any item is judged.
        let too_many = vec![items[0].clone(); nq_proto::MAX_REPORT_BATCH + 1];
        match thief.send_batch(too_many).await {
            Err(s) if s.code() == Code::InvalidArgument => {
                ensure!(
                    s.message()
                        .contains(&nq_proto::MAX_REPORT_BATCH.to_string()),
                    "the refusal does not name the limit: {}",
                    s.message()
                );
            }
            other => bail!("an oversized batch was not refused whole: {other:?}"),
        }

        let answer = thief.send_batch(items).await?;
        ensure!(answer.acks.len() == 3, "one ack per item: {answer:?}");
        let ids = |a: &pb::JobReportAck| (a.job_id, a.lease_id);
        for (ack, job) in answer.acks.iter().zip([&mine[0], &theirs, &mine[1]]) {
            ensure!(
                ids(ack) == (job.job_id, job.lease_id),
                "acks out of order: {answer:?}"
            );
        }
        for i in [0, 2] {
            let ack = &answer.acks[i];
            ensure!(
                ack.code == Code::Ok as i32 && ack.outcome() == Outcome::Accepted,
                "the thief's own job {} was not accepted: {ack:?}",
                ack.job_id
            );
        }
        let stolen = &answer.acks[1];
        ensure!(
            stolen.code == Code::PermissionDenied as i32
                && stolen.outcome() == Outcome::Unspecified
                && !stolen.message.is_empty(),
            "the item under another worker's lease was not refused alone: {stolen:?}"
        );

        // The refused item stored nothing: the owner's report of that job is
        // its first result, not a confirmation.
        let (counts, kernel) = honest.solve(&theirs)?;
        let own = honest
            .send_batch(vec![honest.batch_item(&theirs, &counts, kernel)])
            .await?;
        ensure!(
            own.acks.len() == 1
                && own.acks[0].code == Code::Ok as i32
                && own.acks[0].outcome() == Outcome::Accepted,
            "the owner's report of the stolen job was not a first result: {own:?}"
        );

        let mut w = worker("finisher", &coord.addr.to_string(), &["--threads", "1"])?;
        let report = coord.finish().await?;
        report.check_published()?;
        w.success().await?;
        ensure!(
            report.json["confirmations"] == 0,
            "a refused item was counted as a copy: {}",
            report.json
        );
        let log = coord.proc.output();
        ensure!(
            log.lines()
                .any(|l| l.contains("refused a call") && l.contains("127.0.0.1")),
            "the refused item is not logged with the peer address:\n{log}"
        );
        Ok(())
    })
    .await
}

/// Worker processes against this coordinator report through ReportBatch
/// (the coordinator logs each call) and the totals are exact, with the
/// default spot checks on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_report_in_batches_and_count_exactly() -> Result<()> {
    within(LIMIT, "batched workers n=12", async {
        let tmp = tempfile::tempdir()?;
        let args = ["--n", "12", "--local-threads", "0", "--jobs", "300"];
        let mut coord = Coord::ephemeral(&data_dir(&tmp), &args).await?;
        let addr = coord.addr.to_string();
        let mut a = worker("a", &addr, &["--threads", "2"])?;
        let mut b = worker("b", &addr, &["--threads", "1"])?;
        let report = coord.finish().await?;
        report.check_published()?;
        a.success().await?;
        b.success().await?;
        let batches = coord.proc.lines_containing("report batch");
        ensure!(
            !batches.is_empty(),
            "no ReportBatch call reached the coordinator:\n{}",
            coord.proc.output()
        );
        let items: u64 = batches
            .iter()
            .filter_map(|l| nq_e2e::log_field(l, "stored")?.parse::<u64>().ok())
            .sum();
        ensure!(
            items >= report.jobs,
            "batches stored {items} copies for {} jobs",
            report.jobs
        );
        Ok(())
    })
    .await
}

/// The answer to a ReportBatch call is the worker's permission to forget its
/// items, so they must be on disk when it arrives: a coordinator killed
/// (SIGKILL, no shutdown flush) right after answering still has every
/// accepted item when it resumes. Nothing waits for time here: the kill
/// follows the answer at once, well inside sled's own periodic flush.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_durable_when_answered() -> Result<()> {
    within(LIMIT, "batch durable across kill -9", async {
        let tmp = tempfile::tempdir()?;
        let dir = data_dir(&tmp);
        let mut coord = Coord::ephemeral(&dir, HAND_DRIVEN).await?;
        let mut w = ProtocolWorker::register(coord.addr, "batcher").await?;
        let jobs = lease_jobs(&mut w, 4).await?;
        let mut items = vec![];
        for job in &jobs {
            let (counts, kernel) = w.solve(job)?;
            items.push(w.batch_item(job, &counts, kernel));
        }
        let answer = w.send_batch(items).await?;
        ensure!(
            answer.acks.len() == 4
                && answer.acks.iter().all(
                    |a| a.code == Code::Ok as i32 && a.outcome() == Outcome::Accepted
                ),
            "not every item was accepted: {answer:?}"
        );
        coord.proc.kill().await?;

        let mut coord = Coord::ephemeral(&dir, HAND_DRIVEN).await?;
        // Logged once the stored results are checked and counted (before
        // serving, or in the background after it).
        let done: u64 = coord
            .proc
            .line_containing("restored finished jobs")
            .await
            .ok()
            .and_then(|l| nq_e2e::log_field(&l, "done")?.parse().ok())
            .unwrap_or(0);
        ensure!(
            done == 4,
            "the resumed run has {done} of the 4 acked jobs done"
        );
        let mut finisher =
            worker("finisher", &coord.addr.to_string(), &["--threads", "1"])?;
        coord.finish().await?.check_published()?;
        finisher.success().await
    })
    .await
}

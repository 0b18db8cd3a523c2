//! The batcher: every finished job's result goes through it, and it sends
//! what is waiting as one `ReportBatch` call (see [`Batcher`]).

use super::*;

/// How one attempt to send a job's result ended.
#[derive(Debug)]
pub(crate) enum Sent {
    /// The coordinator judged the result and it is durable.
    Acked(pb::ReportAck),
    /// The call failed, or the coordinator refused this result alone.
    Failed(Status),
    /// Nothing was sent: the connection is new and no answer has vouched for
    /// it yet (see [`ReportGate`]).
    Held,
    /// The coordinator has no `ReportBatch` (an older release): send this
    /// result, and every later one, with `Report`.
    Unsupported,
}

/// A job's result waiting for the batcher, with where its answer goes.
#[derive(Debug)]
struct Item {
    worker: WorkerId,
    /// The run the job was leased in.
    run: String,
    report: pb::JobReport,
    /// Answered once the call that carried the item ended. Closed when the
    /// report task stopped waiting (its run is over): the item is then
    /// dropped unsent.
    reply: oneshot::Sender<Sent>,
}

/// The handle of the batcher: the task that sends the count-only results of
/// every job of this worker in `ReportBatch` calls. Each call carries
/// everything that finished while the previous call was out (up to
/// [`nq_proto::MAX_REPORT_BATCH`] items and below
/// [`nq_proto::MAX_MESSAGE_BYTES`]), and a result that finds no call out
/// goes at once, alone: a busy worker makes one round trip for many jobs,
/// and an idle one waits for none.
#[derive(Clone, Debug)]
pub(crate) struct Batcher {
    /// To the batcher task; it ends when every handle is dropped.
    items: mpsc::Sender<Item>,
    /// Cleared for good when the coordinator answered UNIMPLEMENTED.
    supported: Arc<AtomicBool>,
}

/// Room kept in a `ReportBatch` message for its worker and run ids and the
/// framing of its items, below [`nq_proto::MAX_MESSAGE_BYTES`].
const BATCH_SLACK_BYTES: usize = 64 * 1024;

impl Batcher {
    /// Starts the batcher task on `client`; `gate` holds its calls back on
    /// connections no answer has vouched for. The task ends once every
    /// handle is dropped; the caller may also abort it.
    pub(crate) fn start(
        client: Client,
        gate: ReportGate,
    ) -> (Batcher, tokio::task::JoinHandle<()>) {
        let (items, rx) = mpsc::channel(nq_proto::MAX_REPORT_BATCH);
        let supported = Arc::new(AtomicBool::new(true));
        let task = tokio::spawn(batch_loop(client, gate, rx, Arc::clone(&supported)));
        (Batcher { items, supported }, task)
    }

    /// False once the coordinator has shown it lacks `ReportBatch`.
    pub(crate) fn supported(&self) -> bool {
        self.supported.load(Ordering::Relaxed)
    }

    /// Sends `job`'s result, as `worker` in run `run`, with the next
    /// `ReportBatch` call, and waits for its answer.
    pub(super) async fn send(
        &self,
        worker: &WorkerId,
        run: &str,
        job: JobRef,
        result: &pb::JobResult,
    ) -> Sent {
        let (reply, answer) = oneshot::channel();
        let item = Item {
            worker: worker.clone(),
            run: run.to_owned(),
            report: pb::JobReport {
                job_id: job.job.0,
                lease_id: job.lease.0,
                result: Some(result.clone()),
            },
            reply,
        };
        if self.items.send(item).await.is_err() {
            // The batcher is gone, so the worker is stopping.
            return Sent::Failed(Status::cancelled("the worker is stopping"));
        }
        answer
            .await
            .unwrap_or_else(|_| Sent::Failed(Status::cancelled("the worker is stopping")))
    }
}

/// The batcher task: takes what is waiting, sends it in one call, answers
/// each item, and again, until every sender is gone.
async fn batch_loop(
    client: Client,
    gate: ReportGate,
    mut rx: mpsc::Receiver<Item>,
    supported: Arc<AtomicBool>,
) {
    let mut waiting: VecDeque<Item> = VecDeque::new();
    loop {
        if waiting.is_empty() {
            match rx.recv().await {
                Some(item) => waiting.push_back(item),
                None => return,
            }
        }
        while let Ok(item) = rx.try_recv() {
            waiting.push_back(item);
        }
        let batch = take_batch(&mut waiting);
        if batch.is_empty() {
            continue;
        }
        // Items queued before the coordinator said it lacks the rpc.
        if !supported.load(Ordering::Relaxed) {
            for item in batch {
                let _ = item.reply.send(Sent::Unsupported);
            }
            continue;
        }
        let request = pb::ReportBatchRequest {
            worker_id: batch[0].worker.0.clone(),
            run_id: batch[0].run.clone(),
            reports: batch.iter().map(|i| i.report.clone()).collect(),
        };
        let items = batch.len();
        let answer = client.report_batch(request, &gate).await;
        let held = answer.is_err() && gate.was_held();
        match answer {
            Ok(response) => answer_items(batch, response),
            Err(_) if held => {
                for item in batch {
                    let _ = item.reply.send(Sent::Held);
                }
            }
            Err(status) if status.code() == Code::Unimplemented => {
                info!(
                    "the coordinator has no ReportBatch (an older release); reporting one job per call"
                );
                supported.store(false, Ordering::Relaxed);
                for item in batch {
                    let _ = item.reply.send(Sent::Unsupported);
                }
            }
            Err(status) => {
                debug!(items, code = ?status.code(), "report batch failed");
                for item in batch {
                    let _ = item.reply.send(Sent::Failed(status.clone()));
                }
            }
        }
    }
}

/// Takes the next batch from `waiting`: items of the first item's worker and
/// run, in order, up to the count and size limits (one item always goes, so
/// that an oversized one fails alone instead of blocking the rest). Items
/// whose report task stopped waiting are dropped.
fn take_batch(waiting: &mut VecDeque<Item>) -> Vec<Item> {
    waiting.retain(|i| !i.reply.is_closed());
    let Some(first) = waiting.front() else {
        return Vec::new();
    };
    let (worker, run) = (first.worker.clone(), first.run.clone());
    let limit = nq_proto::MAX_MESSAGE_BYTES - BATCH_SLACK_BYTES;
    let mut batch = Vec::new();
    let mut bytes = 0;
    let mut rest = VecDeque::with_capacity(waiting.len());
    for item in waiting.drain(..) {
        // Field tag and length prefix: at most 11 bytes per item.
        let size = prost::Message::encoded_len(&item.report) + 11;
        let fits = batch.len() < nq_proto::MAX_REPORT_BATCH
            && (batch.is_empty() || bytes + size <= limit);
        if fits && item.worker == worker && item.run == run {
            bytes += size;
            batch.push(item);
        } else {
            rest.push_back(item);
        }
    }
    *waiting = rest;
    batch
}

/// Answers each item of a call from its ack. An ack missing or naming
/// another job (a broken coordinator) fails its item as retryable.
fn answer_items(batch: Vec<Item>, response: pb::ReportBatchResponse) {
    let count = response.acks.len();
    let items = batch.len();
    let mut acks = response.acks.into_iter();
    for item in batch {
        let sent = match acks.next() {
            Some(ack)
                if (ack.job_id, ack.lease_id)
                    == (item.report.job_id, item.report.lease_id) =>
            {
                if ack.code == Code::Ok as i32 {
                    Sent::Acked(pb::ReportAck {
                        outcome: ack.outcome,
                        run_complete: response.run_complete,
                    })
                } else {
                    Sent::Failed(Status::new(Code::from_i32(ack.code), ack.message))
                }
            }
            _ => Sent::Failed(Status::internal(format!(
                "the coordinator answered a batch of {items} reports with {count} \
                 acks that do not match them"
            ))),
        };
        let _ = item.reply.send(sent);
    }
}

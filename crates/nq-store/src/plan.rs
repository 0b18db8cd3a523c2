//! Creating a run in bounded, restartable batches, and the stored hand-out
//! order of its jobs.
//!
//! A record run has 10^7 to 10^8 jobs: too many to split, estimate and hold
//! in memory before writing them. The coordinator streams the split instead
//! and appends the jobs in batches:
//!
//! 1. [`Store::begin_creation`] stores a [`Creation`] record (what is being
//!    made, and the plan's parameters) before any job.
//! 2. [`Store::append_jobs`] writes whole job chunks, flushes them, then
//!    advances the [`Checkpoint`] (sub-problems consumed, jobs written, their
//!    work), which the next flush makes durable. A crash before that loses
//!    only the checkpoint's advance: the batch is written again with the
//!    same ids, an idempotent overwrite.
//! 3. [`Store::finish_creation`] re-scans every stored job (count and work
//!    must equal the checkpoint's), builds the hand-out order, and writes the
//!    manifest last: a run exists only once it is complete.
//!
//! A coordinator killed while creating finds the [`Creation`] record, checks
//! that it is making the same run, and resumes at the checkpoint: the split
//! is deterministic, so skipping the consumed sub-problems neither repeats
//! nor skips one.
//!
//! # The hand-out order
//!
//! Jobs are handed out largest estimated work first, by octave (a *band*:
//! jobs within a factor of two count as equal), then by id. The `order` tree
//! lists them so, in chunks of up to [`ORDER_CHUNK`] ids keyed by
//! `(64 − band, first id)`: sled's key order is the hand-out order, and the
//! coordinator keeps a cursor into it instead of a queue of every job.

use std::collections::BTreeMap;

use crate::codec::{open, put_str, put_varint, seal};
use crate::error::{Corruption, Error, Result};
use crate::job::{self, JOBS_PER_CHUNK, JobId, NewJob};
use crate::manifest::{Manifest, RunKey};
use crate::seal::SealedTree;
use crate::{NewRun, Store, write_marker};

/// Most job ids in one value of the `order` tree.
pub const ORDER_CHUNK: usize = 4096;

const CREATION: &[u8] = b"creation";
const CHECKPOINT: &[u8] = b"creation_checkpoint";
/// Present once the `order` tree lists every job (its value: the job count).
const ORDER_BUILT: &[u8] = b"order_built";

const CREATION_VERSION: u8 = 1;
const CHECKPOINT_VERSION: u8 = 1;
const ORDER_VERSION: u8 = 1;

/// The parameters of a plan that decide which jobs it makes. A resumed
/// creation must use the same ones, or its jobs would not fit together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanParams {
    /// Sub-problems of the split.
    pub subproblems: u64,
    /// The estimated work a job is filled up to.
    pub job_work: u64,
    /// Most sub-problems in one job.
    pub max_size: u32,
    /// Version of the grouping and of the order of sub-problems it consumes.
    pub format: u32,
}

/// A creation in progress: the run being made and its plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Creation {
    /// The run.
    pub run: NewRun,
    /// How its jobs are made.
    pub plan: PlanParams,
}

/// How far a creation got: everything before it is durable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Checkpoint {
    /// Sub-problems of the split (in its order) that are in stored jobs.
    pub subproblems: u64,
    /// Jobs stored: ids `0..jobs`.
    pub jobs: u64,
    /// Their estimated work.
    pub work: u128,
}

impl Creation {
    fn encode(&self) -> Vec<u8> {
        let key = &self.run.key;
        let mut out = vec![CREATION_VERSION, key.board.n()];
        out.extend_from_slice(&key.split_version.to_be_bytes());
        out.extend_from_slice(&[key.spec.ring, key.spec.extra, u8::from(key.solutions)]);
        out.extend_from_slice(&self.run.created_unix_ms.to_be_bytes());
        put_str(&mut out, &self.run.program_version);
        put_str(&mut out, &self.run.run_id);
        out.extend_from_slice(&self.plan.subproblems.to_be_bytes());
        out.extend_from_slice(&self.plan.job_work.to_be_bytes());
        out.extend_from_slice(&self.plan.max_size.to_be_bytes());
        out.extend_from_slice(&self.plan.format.to_be_bytes());
        seal(&mut out);
        out
    }

    fn decode(bytes: &[u8]) -> Result<Creation> {
        let (_, mut r) = open("meta", bytes, 1, CREATION_VERSION)?;
        let n = r.u8()?;
        let board =
            nq_core::Board::new(n.into()).map_err(|e| r.corrupt(Corruption::Core(e)))?;
        let split_version = r.u32()?;
        let (ring, extra) = (r.u8()?, r.u8()?);
        let spec = nq_core::split::SplitSpec::new(ring, extra)
            .map_err(|e| r.corrupt(Corruption::Core(e)))?;
        let solutions = r.flag("solutions")?;
        let created_unix_ms = r.u64()?;
        let program_version = r.str()?;
        let run_id = r.str()?;
        let plan = PlanParams {
            subproblems: r.u64()?,
            job_work: r.u64()?,
            max_size: r.u32()?,
            format: r.u32()?,
        };
        r.end()?;
        Ok(Creation {
            run: NewRun {
                key: RunKey {
                    board,
                    split_version,
                    spec,
                    solutions,
                },
                run_id,
                program_version,
                created_unix_ms,
            },
            plan,
        })
    }
}

impl Checkpoint {
    fn encode(&self) -> Vec<u8> {
        let mut out = vec![CHECKPOINT_VERSION];
        out.extend_from_slice(&self.subproblems.to_be_bytes());
        out.extend_from_slice(&self.jobs.to_be_bytes());
        put_varint(&mut out, self.work);
        seal(&mut out);
        out
    }

    fn decode(bytes: &[u8]) -> Result<Checkpoint> {
        let (_, mut r) = open("meta", bytes, 1, CHECKPOINT_VERSION)?;
        let c = Checkpoint {
            subproblems: r.u64()?,
            jobs: r.u64()?,
            work: r.varint()?,
        };
        r.end()?;
        Ok(c)
    }
}

/// The octave of an estimated work: jobs in one band are within a factor of
/// two of each other.
pub fn band(work: u64) -> u32 {
    u64::BITS - work.leading_zeros()
}

/// The `order` key of a chunk of band `band` starting at job `first`.
fn order_key(band: u32, first: JobId) -> [u8; 9] {
    let mut key = [0u8; 9];
    key[0] = (u64::BITS - band) as u8;
    key[1..].copy_from_slice(&first.key());
    key
}

/// Ids (increasing, the first one in the key) as a count and the deltas.
fn encode_order(ids: &[JobId]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + 2 * ids.len());
    out.push(ORDER_VERSION);
    put_varint(&mut out, ids.len() as u128);
    for pair in ids.windows(2) {
        put_varint(&mut out, u128::from(pair[1].0 - pair[0].0));
    }
    seal(&mut out);
    out
}

fn decode_order(key: &[u8], bytes: &[u8]) -> Result<Vec<JobId>> {
    let bad = |field| Error::Corrupt {
        tree: "order",
        what: Corruption::Field { field },
    };
    if key.len() != 9 {
        return Err(bad("key"));
    }
    let first = u64::from_be_bytes(key[1..].try_into().expect("8 bytes"));
    let (_, mut r) = open("order", bytes, 1, ORDER_VERSION)?;
    let count = r.varint_u64()?;
    if count == 0 || count > ORDER_CHUNK as u64 {
        return Err(bad("count"));
    }
    let mut ids = Vec::with_capacity(count as usize);
    let mut id = first;
    ids.push(JobId(id));
    for _ in 1..count {
        let delta = r.varint_u64()?;
        id = id
            .checked_add(delta)
            .filter(|_| delta > 0)
            .ok_or(bad("delta"))?;
        ids.push(JobId(id));
    }
    r.end()?;
    Ok(ids)
}

/// Collects job ids per band and writes each band's chunk once it is full.
#[derive(Default)]
struct OrderWriter {
    bands: BTreeMap<u32, Vec<JobId>>,
}

impl OrderWriter {
    fn push(&mut self, tree: &SealedTree, id: JobId, work: u64) -> Result<()> {
        let b = band(work);
        let ids = self.bands.entry(b).or_default();
        ids.push(id);
        if ids.len() == ORDER_CHUNK {
            tree.insert(order_key(b, ids[0]), encode_order(ids))?;
            ids.clear();
        }
        Ok(())
    }

    fn finish(self, tree: &SealedTree) -> Result<()> {
        for (b, ids) in self.bands {
            if let Some(&first) = ids.first() {
                tree.insert(order_key(b, first), encode_order(&ids))?;
            }
        }
        Ok(())
    }
}

impl Store {
    /// The creation in progress, if any, and how far it got.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] when a record does not decode.
    pub fn creation(&self) -> Result<Option<(Creation, Checkpoint)>> {
        let Some(bytes) = self.meta.get(CREATION)? else {
            return Ok(None);
        };
        let creation = Creation::decode(&bytes)?;
        let checkpoint = match self.meta.get(CHECKPOINT)? {
            Some(b) => Checkpoint::decode(&b)?,
            None => Checkpoint::default(),
        };
        Ok(Some((creation, checkpoint)))
    }

    /// Starts creating a run: clears what an earlier, abandoned creation left,
    /// then stores `creation` durably, before any job.
    ///
    /// # Errors
    ///
    /// [`Error::RunExists`] when a manifest is stored; sled errors.
    pub fn begin_creation(&self, creation: &Creation) -> Result<()> {
        if self.manifest()?.is_some() {
            return Err(Error::RunExists);
        }
        for tree in [
            &self.jobs,
            &self.records,
            &self.duplicates,
            &self.solutions,
            &self.order,
            &self.states,
            &self.voters,
            &self.losses,
        ] {
            tree.raw().clear()?;
        }
        // A new run has no records: its (empty) indexes cover them all, and
        // every conflict it charges is kept.
        self.meta.insert(crate::INDEXED, [1u8])?;
        self.meta
            .insert(crate::LOSSES_KEPT, self.boot()?.to_be_bytes())?;
        self.meta.remove(CHECKPOINT)?;
        self.meta.remove(ORDER_BUILT)?;
        // Durable with the first batch's flush: a crash before it leaves
        // nothing worth resuming.
        self.meta.insert(CREATION, creation.encode())?;
        Ok(())
    }

    /// Appends `jobs` after the checkpoint's and advances it to `next`.
    ///
    /// Jobs are stored in chunks of [`JOBS_PER_CHUNK`]: every call but the
    /// last of a creation must append a multiple of that, so that no chunk is
    /// written twice with different contents.
    ///
    /// # Errors
    ///
    /// [`Error::NoRun`] without a creation in progress; [`Error::Corrupt`]
    /// (field "checkpoint") when `next` does not follow the checkpoint by
    /// exactly `jobs`, or the previous call ended a chunk early.
    pub fn append_jobs(&self, jobs: &[NewJob], next: Checkpoint) -> Result<()> {
        let Some((_, at)) = self.creation()? else {
            return Err(Error::NoRun);
        };
        let work: u128 = jobs.iter().map(|j| u128::from(j.work)).sum();
        let follows = at.jobs.is_multiple_of(JOBS_PER_CHUNK)
            && next.jobs == at.jobs + jobs.len() as u64
            && next.work == at.work + work
            && next.subproblems >= at.subproblems;
        if !follows {
            return Err(Error::Corrupt {
                tree: "meta",
                what: Corruption::Field {
                    field: "checkpoint",
                },
            });
        }
        for (i, chunk) in jobs.chunks(JOBS_PER_CHUNK as usize).enumerate() {
            let first = JobId(at.jobs + (i as u64) * JOBS_PER_CHUNK);
            let (key, _) = job::chunk_of(first);
            self.jobs
                .insert(key.to_be_bytes(), job::encode_chunk(chunk))?;
        }
        // The jobs must be durable before the checkpoint that counts them.
        // The checkpoint itself becomes durable with the next batch's flush
        // (or the creation's last): losing it only means writing this batch
        // again, with the same ids and contents.
        self.db.flush()?;
        self.meta.insert(CHECKPOINT, next.encode())?;
        Ok(())
    }

    /// Completes the creation: checks the stored jobs against the checkpoint
    /// (count and work, by a full re-scan), builds the hand-out order, then
    /// writes the manifest. Returns it.
    ///
    /// # Errors
    ///
    /// [`Error::NoRun`] without a creation in progress; [`Error::Corrupt`]
    /// when the stored jobs do not add up to the checkpoint.
    pub fn finish_creation(&self) -> Result<Manifest> {
        let Some((creation, at)) = self.creation()? else {
            return Err(Error::NoRun);
        };
        let _ = self.board.set(creation.run.key.board);
        let (jobs, work) = self.build_order()?;
        if (jobs, work) != (at.jobs, at.work) {
            return Err(Error::Corrupt {
                tree: "jobs",
                what: Corruption::Field {
                    field: "job count or work against the creation checkpoint",
                },
            });
        }
        let manifest = Manifest {
            key: creation.run.key,
            program_version: creation.run.program_version,
            run_id: creation.run.run_id,
            jobs,
            total_work: work,
            created_unix_ms: creation.run.created_unix_ms,
        };
        // The order must not become durable after the manifest that relies
        // on it: flush it first.
        self.db.flush()?;
        self.meta.insert(crate::MANIFEST, manifest.encode())?;
        self.meta.remove(CREATION)?;
        self.meta.remove(CHECKPOINT)?;
        self.db.flush()?;
        if let Some(dir) = &self.dir {
            write_marker(dir, &manifest.run_id)
                .map_err(|source| Error::open(dir, source.into()))?;
        }
        Ok(manifest)
    }

    /// Builds the `order` tree from the stored jobs unless it is built
    /// already (runs created before it existed), and flushes. Returns true
    /// when it had to build it.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] when a job chunk does not decode; sled errors.
    pub fn ensure_order(&self) -> Result<bool> {
        if self.meta.get(ORDER_BUILT)?.is_some() {
            return Ok(false);
        }
        self.build_order()?;
        self.db.flush()?;
        Ok(true)
    }

    /// Writes the `order` tree from a scan of every stored job, and returns
    /// the number of jobs and their total work.
    fn build_order(&self) -> Result<(u64, u128)> {
        self.order.raw().clear()?;
        self.meta.remove(ORDER_BUILT)?;
        let mut writer = OrderWriter::default();
        let mut work = 0u128;
        let count = self.for_each_job_work(|id, w| {
            work += u128::from(w);
            writer.push(&self.order, id, w)
        })?;
        writer.finish(&self.order)?;
        self.meta.insert(ORDER_BUILT, count.to_be_bytes())?;
        Ok((count, work))
    }

    /// The chunk of the hand-out order after the one keyed `after` (the first
    /// chunk for `None`): its key, for the next call, and its job ids.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] when the chunk does not decode.
    pub fn order_after(
        &self,
        after: Option<&[u8]>,
    ) -> Result<Option<(Vec<u8>, Vec<JobId>)>> {
        match self.order.first_after(after)? {
            None => Ok(None),
            Some((k, v)) => {
                let ids = decode_order(&k, &v)?;
                Ok(Some((k.to_vec(), ids)))
            }
        }
    }
}

/// Encodes `jobs` as the `Reader` of tests would see them (kept for tests).
#[cfg(test)]
pub(crate) fn order_round_trip(ids: &[JobId]) -> Result<Vec<JobId>> {
    let key = order_key(band(1), ids[0]);
    decode_order(&key, &encode_order(ids))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Store;
    use nq_core::Board;
    use nq_core::split::SplitSpec;

    fn creation(subproblems: u64) -> Creation {
        Creation {
            run: NewRun {
                key: RunKey {
                    board: Board::new(8).unwrap(),
                    split_version: 1,
                    spec: SplitSpec::border(1).unwrap(),
                    solutions: false,
                },
                run_id: "8-test".into(),
                program_version: "0.1.0".into(),
                created_unix_ms: 1,
            },
            plan: PlanParams {
                subproblems,
                job_work: 10,
                max_size: 4,
                format: 1,
            },
        }
    }

    fn job(i: u64) -> NewJob {
        NewJob {
            rows: vec![1, 3, 5, 7, 2, 0, 6, 4],
            // Works spread over several bands, in no order.
            work: (i * 7919) % 5000 + 1,
        }
    }

    #[test]
    fn records_round_trip() {
        let c = creation(77);
        assert_eq!(Creation::decode(&c.encode()).unwrap(), c);
        let p = Checkpoint {
            subproblems: 5,
            jobs: 64,
            work: u128::from(u64::MAX) + 3,
        };
        assert_eq!(Checkpoint::decode(&p.encode()).unwrap(), p);
        let ids: Vec<JobId> = [3u64, 4, 90, 1 << 40].map(JobId).to_vec();
        assert_eq!(order_round_trip(&ids).unwrap(), ids);
    }

    #[test]
    fn creation_in_batches_lists_every_job_once_in_band_order() {
        let store = Store::temporary().unwrap();
        assert!(store.creation().unwrap().is_none());
        store.begin_creation(&creation(10_000)).unwrap();
        let all: Vec<NewJob> = (0..10_000).map(job).collect();
        let mut at = Checkpoint::default();
        for batch in all.chunks(640) {
            let work: u128 = batch.iter().map(|j| u128::from(j.work)).sum();
            let next = Checkpoint {
                subproblems: at.subproblems + batch.len() as u64,
                jobs: at.jobs + batch.len() as u64,
                work: at.work + work,
            };
            store.append_jobs(batch, next).unwrap();
            at = next;
            assert_eq!(store.creation().unwrap().unwrap().1, at);
        }
        // A checkpoint that does not follow is refused.
        assert!(store.append_jobs(&all[..1], at).is_err());
        let m = store.finish_creation().unwrap();
        assert_eq!(m.jobs, 10_000);
        assert!(store.creation().unwrap().is_none());
        let mut order = vec![];
        let mut key = None;
        while let Some((k, ids)) = store.order_after(key.as_deref()).unwrap() {
            order.extend(ids);
            key = Some(k);
        }
        let mut want: Vec<JobId> = (0..10_000).map(JobId).collect();
        want.sort_by_key(|j| (std::cmp::Reverse(band(all[j.0 as usize].work)), *j));
        assert_eq!(order, want);
        assert!(!store.ensure_order().unwrap(), "built at creation");
    }

    #[test]
    fn a_partial_chunk_ends_the_creation() {
        let store = Store::temporary().unwrap();
        store.begin_creation(&creation(100)).unwrap();
        let jobs: Vec<NewJob> = (0..10).map(job).collect();
        let work: u128 = jobs.iter().map(|j| u128::from(j.work)).sum();
        let at = Checkpoint {
            subproblems: 10,
            jobs: 10,
            work,
        };
        store.append_jobs(&jobs, at).unwrap();
        let more = Checkpoint {
            subproblems: 11,
            jobs: 11,
            work: work + u128::from(jobs[0].work),
        };
        assert!(store.append_jobs(&jobs[..1], more).is_err());
        assert_eq!(store.finish_creation().unwrap().jobs, 10);
    }
}

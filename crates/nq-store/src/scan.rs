//! One walk over the run's jobs with everything stored about each: its
//! record, its copies (the `Done` record's result first, then the recorded
//! duplicates) and, when asked for, its definition.
//!
//! Resume, the audit and the re-judging of a discredited worker all need a
//! job's copies side by side. They live in three trees keyed by job id in the
//! same order (`jobs` in chunks, `records` in chunks, `duplicates` one entry
//! each), so a scan is a merge-join of their iterators: written once here,
//! with one way of handling a damaged entry, instead of once per caller.

use std::iter::Peekable;

use crate::job::{JobId, JobRecord, JobState, StoredJob};
use crate::losses::StoredLoss;
use crate::result::{Duplicate, StoredResult, judged_copies};
use crate::{Error, Result, Store};

/// Which jobs a [`Store::scan_jobs`] yields, and whether it reads their
/// definitions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scan {
    /// Done jobs only, without their definitions: reads the `records` and
    /// `duplicates` trees, not the (larger) `jobs` tree.
    Done,
    /// Done jobs with their definitions, to check every copy against them.
    DoneWithDefinitions,
    /// Every job of the run, done or not, with its definition.
    Every,
}

/// One job as a scan sees it.
#[derive(Clone, Debug)]
pub struct ScannedJob {
    /// The job.
    pub job: JobId,
    /// Its record (`Pending` with no attempts for a job without one).
    pub record: JobRecord,
    /// The recorded duplicates, in the order they were recorded. Only a
    /// done job has any (others are ignored, as everywhere).
    pub duplicates: Vec<Duplicate>,
    /// The conflicts lost in it, in the order charged (a done job's only;
    /// none in runs that did not keep them, see [`Store::keeps_losses`]).
    pub losses: Vec<StoredLoss>,
    /// Its definition, unless the scan was [`Scan::Done`].
    pub definition: Option<StoredJob>,
}

impl ScannedJob {
    /// The job's copies that were judged ([`judged_copies`]): the `Done`
    /// record's result first, then the duplicates received before the run
    /// completed. Empty for a job that is not done.
    pub fn into_copies(self) -> Vec<StoredResult> {
        let JobState::Done(counted) = self.record.state else {
            return Vec::new();
        };
        judged_copies(*counted, self.duplicates)
    }

    /// The copies kept after the run completed: evidence, never judged
    /// ([`crate::Duplicate::after_completion`]).
    pub fn kept_after_completion(&self) -> impl Iterator<Item = &StoredResult> {
        self.duplicates
            .iter()
            .filter(|d| d.after_completion)
            .map(|d| &d.result)
    }

    /// True when the job has a stored result.
    pub fn is_done(&self) -> bool {
        matches!(self.record.state, JobState::Done(_))
    }
}

type Entries<T> = Peekable<Box<dyn Iterator<Item = Result<(JobId, T)>>>>;

/// The iterator of [`Store::scan_jobs`].
pub struct JobScan {
    scan: Scan,
    /// Definitions, in id order (every scan but [`Scan::Done`]).
    jobs: Option<Entries<StoredJob>>,
    records: Entries<JobRecord>,
    duplicates: Entries<Duplicate>,
    losses: Entries<StoredLoss>,
    /// Set after an error, which ends the scan.
    failed: bool,
}

impl std::fmt::Debug for JobScan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobScan").field("scan", &self.scan).finish()
    }
}

fn entries<T>(it: impl Iterator<Item = Result<(JobId, T)>> + 'static) -> Entries<T> {
    let it: Box<dyn Iterator<Item = Result<(JobId, T)>>> = Box::new(it);
    it.peekable()
}

/// Takes the entry of `job` from `entries`, skipping those before it.
fn take<T>(entries: &mut Entries<T>, job: JobId) -> Result<Option<T>> {
    loop {
        match entries.peek() {
            Some(Ok((j, _))) if *j < job => {
                entries.next();
            }
            Some(Ok((j, _))) if *j == job => {
                return Ok(entries.next().and_then(|e| e.ok()).map(|(_, v)| v));
            }
            Some(Err(_)) => {
                return match entries.next() {
                    Some(Err(e)) => Err(e),
                    _ => Ok(None),
                };
            }
            _ => return Ok(None),
        }
    }
}

impl JobScan {
    fn next_entry(&mut self) -> Result<Option<ScannedJob>> {
        let (job, record, definition) = match self.scan {
            Scan::Every => {
                let jobs = self.jobs.as_mut().expect("Every scans definitions");
                let Some(entry) = jobs.next() else {
                    return Ok(None);
                };
                let (job, definition) = entry?;
                let record = take(&mut self.records, job)?.unwrap_or_default();
                (job, record, Some(definition))
            }
            Scan::Done | Scan::DoneWithDefinitions => {
                let (job, record) = loop {
                    match self.records.next() {
                        None => return Ok(None),
                        Some(entry) => {
                            let (job, record) = entry?;
                            if matches!(record.state, JobState::Done(_)) {
                                break (job, record);
                            }
                        }
                    }
                };
                let definition = match self.jobs.as_mut() {
                    Some(jobs) => Some(take(jobs, job)?.ok_or(Error::NoSuchJob { job })?),
                    None => None,
                };
                (job, record, definition)
            }
        };
        let mut duplicates = Vec::new();
        while let Some(d) = take(&mut self.duplicates, job)? {
            duplicates.push(d);
        }
        let mut losses = Vec::new();
        while let Some(l) = take(&mut self.losses, job)? {
            losses.push(l);
        }
        if !matches!(record.state, JobState::Done(_)) {
            duplicates.clear();
            losses.clear();
        }
        Ok(Some(ScannedJob {
            job,
            record,
            duplicates,
            losses,
            definition,
        }))
    }
}

impl Iterator for JobScan {
    type Item = Result<ScannedJob>;

    fn next(&mut self) -> Option<Result<ScannedJob>> {
        if self.failed {
            return None;
        }
        let entry = self.next_entry().transpose();
        if matches!(entry, Some(Err(_))) {
            self.failed = true;
        }
        entry
    }
}

impl Store {
    /// One job as [`Store::scan_jobs`] with [`Scan::Every`] yields it: its
    /// record, its duplicates and losses (a done job's only) and its
    /// definition.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`], sled errors.
    pub fn scanned_job(&self, job: JobId) -> Result<ScannedJob> {
        let record = self.job_record(job)?;
        let (duplicates, losses) = if matches!(record.state, JobState::Done(_)) {
            (self.job_duplicates(job)?, self.job_losses(job)?)
        } else {
            (Vec::new(), Vec::new())
        };
        Ok(ScannedJob {
            job,
            record,
            duplicates,
            losses,
            definition: Some(self.job(job)?),
        })
    }

    /// Walks the run's jobs in id order with their records, copies and (as
    /// `scan` says) definitions, reading each tree once and holding one job
    /// at a time. The first damaged entry ends the walk with its error.
    pub fn scan_jobs(&self, scan: Scan) -> JobScan {
        let jobs = (scan != Scan::Done).then(|| entries(self.stored_jobs()));
        JobScan {
            scan,
            jobs,
            records: entries(self.job_records()),
            duplicates: entries(self.duplicates()),
            losses: entries(self.losses()),
            failed: false,
        }
    }
}

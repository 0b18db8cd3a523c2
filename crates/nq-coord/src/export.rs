//! `nq-coord export`: streams the solutions stored by a `--solutions` run.
//!
//! The store holds each sub-problem's own completions (those whose ring part
//! is canonical). Every solution of the board is the image of exactly one
//! stored completion under one symmetry of its ring's class
//! (`nq_core::split::images_of_completion`), so the export expands each
//! completion as it reads it and never needs to remember what it wrote:
//! memory stays constant however many solutions there are. With `unique`, each
//! class is written once, as its canonical form
//! (`nq_core::split::unique_of_completion`).
//!
//! Solutions come out in store order (by job, sub-problem, then the search's
//! order), not sorted; pipe through `sort` for a sorted list.
//!
//! On an unfinished run, the solutions of the jobs done so far are exported
//! and [`ExportSummary::complete`] is false; the binary prints a warning.

use std::io::Write;
use std::path::Path;

use nq_core::notation::{Format, write_solution};
use nq_core::split::{images_of_completion, unique_of_completion};
use nq_store::{JobState, Store, StoreKey, StoreOptions};

use crate::error::{Error, Result};

/// What to export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExportOptions {
    /// Only one solution per symmetry class (its canonical form).
    pub unique: bool,
    /// The notation.
    pub format: Format,
}

impl Default for ExportOptions {
    fn default() -> ExportOptions {
        ExportOptions {
            unique: false,
            format: Format::Vector,
        }
    }
}

/// What an export wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExportSummary {
    /// Board size.
    pub n: u8,
    /// Solutions written.
    pub written: u128,
    /// True when the run was finished, so the export is complete.
    pub complete: bool,
    /// Jobs of the run.
    pub jobs: u64,
    /// Jobs whose solutions were exported.
    pub jobs_done: u64,
}

/// Writes the solutions stored in `dir` to `out`, one after another in
/// `options.format` (with the format's separator between them).
///
/// Opens the store itself; a directory in use by a running coordinator is
/// refused ([`nq_store::Error::Locked`]).
///
/// # Errors
///
/// [`Error::NoRun`], [`Error::NoSolutions`], store errors,
/// [`Error::Format`] (e.g. `digits` for N > 9, checked before anything is
/// written) and [`Error::Io`] when `out` fails (a broken pipe included; the
/// caller may treat that as a normal end).
pub fn export(
    dir: &Path,
    options: &ExportOptions,
    out: &mut dyn Write,
) -> Result<ExportSummary> {
    export_with_key(dir, None, options, out)
}

/// [`export`] of a store sealed with `key` (or unkeyed, for `None`).
///
/// # Errors
///
/// As [`export`]; a key that does not fit the store is refused as
/// [`nq_store::Error::KeyNeeded`], [`nq_store::Error::WrongKey`] or
/// [`nq_store::Error::NotKeyed`].
pub fn export_with_key(
    dir: &Path,
    key: Option<&StoreKey>,
    options: &ExportOptions,
    out: &mut dyn Write,
) -> Result<ExportSummary> {
    if !dir.exists() {
        return Err(Error::NoRun {
            dir: dir.to_path_buf(),
        });
    }
    let store = Store::open(
        dir,
        &StoreOptions {
            key: key.cloned(),
            ..StoreOptions::default()
        },
    )?;
    let manifest = store.manifest()?.ok_or_else(|| Error::NoRun {
        dir: dir.to_path_buf(),
    })?;
    if !manifest.key.solutions {
        return Err(Error::NoSolutions {
            dir: dir.to_path_buf(),
        });
    }
    let n = manifest.key.board.n();
    options.format.check_size(n.into())?;
    let spec = manifest.key.spec;
    // One flag per job: which jobs' solutions belong to an accepted result.
    let mut done = vec![false; usize::try_from(manifest.jobs).unwrap_or(usize::MAX)];
    let mut jobs_done = 0;
    for entry in store.job_records() {
        let (job, record) = entry?;
        if let (JobState::Done(_), Some(flag)) =
            (&record.state, done.get_mut(job.0 as usize))
        {
            *flag = true;
            jobs_done += 1;
        }
    }
    let io = |source| Error::Io {
        context: "cannot write the solutions".into(),
        source,
    };
    let mut text = String::new();
    let mut written = 0u128;
    let mut write_one = |rows: &[u8], text: &mut String| -> Result<()> {
        text.clear();
        if written > 0 {
            text.push_str(options.format.separator());
        }
        write_solution(text, options.format, rows)?;
        out.write_all(text.as_bytes()).map_err(io)?;
        written += 1;
        Ok(())
    };
    for batch in store.solutions() {
        let batch = batch?;
        if !done.get(batch.job.0 as usize).copied().unwrap_or(false) {
            continue; // leftovers of a report that never completed
        }
        for completion in batch.rows.chunks_exact(usize::from(n)) {
            let corrupt = |source| Error::StoredJob {
                job: batch.job,
                source,
            };
            if options.unique {
                if let Some(canonical) =
                    unique_of_completion(spec, completion).map_err(corrupt)?
                {
                    write_one(&canonical, &mut text)?;
                }
            } else {
                for image in images_of_completion(spec, completion).map_err(corrupt)? {
                    write_one(&image, &mut text)?;
                }
            }
        }
    }
    out.flush().map_err(io)?;
    Ok(ExportSummary {
        n,
        written,
        complete: store.summary()?.is_some(),
        jobs: manifest.jobs,
        jobs_done,
    })
}

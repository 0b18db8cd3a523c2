//! The outcome of a run: [`RunReport`], its stdout line and `report.json`.

use std::io::Write;
use std::path::{Path, PathBuf};

use nq_core::split::SplitSpec;

use crate::audit::AuditDigest;
use crate::core::Standing;
pub use crate::core::report::FaultyWorker;
use crate::error::{Error, Result};
use nq_core::published::published;
use nq_store::{Manifest, RunSummary, SettingChange};

/// Name of the JSON report in the data directory.
pub const REPORT_FILE: &str = "report.json";

/// What a run produced.
#[derive(Clone, Debug, PartialEq)]
pub struct RunReport {
    /// Board size.
    pub n: u8,
    /// True when every job is done; otherwise the run was interrupted and can
    /// be resumed.
    pub complete: bool,
    /// Q(N), the number of solutions (counted so far, when incomplete).
    pub total: u128,
    /// U(N), solutions up to symmetry (0 when incomplete: it is only defined
    /// over whole symmetry classes).
    pub unique: u128,
    /// Time the coordinator spent on the run, over all its sessions.
    pub seconds: f64,
    /// Jobs in the run.
    pub jobs: u64,
    /// Jobs done.
    pub jobs_done: u64,
    /// The split.
    pub split: SplitSpec,
    /// The split's version.
    pub split_version: u32,
    /// Repeated results that agreed with the stored ones.
    pub confirmations: u64,
    /// Repeated results that disagreed (each logged with `error!`).
    pub conflicts: u64,
    /// Identifies the run.
    pub run_id: String,
    /// The data directory.
    pub data_dir: PathBuf,
    /// Workers that lost verification conflicts.
    pub faulty_workers: Vec<FaultyWorker>,
    /// Jobs whose copies disagree, waiting for a deciding copy (only when the
    /// run stopped before it completed).
    pub disputed: u64,
    /// Jobs that settled on one vote although they needed a check, because
    /// no second machine was at work to give it (a lone worker under
    /// `--local-threads 0`, or workers still on probation when the others
    /// left). A complete run with any is [`RunStatus::Unchecked`].
    pub unchecked: u64,
    /// The digest of the run's audit ([`crate::audit::digest`]), the last
    /// line of what `nq-coord audit` writes: set when the run is complete.
    pub audit_digest: Option<AuditDigest>,
    /// The changes made to the settings that decide what counts
    /// (`--verify`, `--trust`, `--ban-after`, `--gpu-sample`) after the run
    /// was created, with `--change-settings`, oldest first.
    pub setting_changes: Vec<SettingChange>,
}

/// How a run ended, and the exit code `nq-coord` gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunStatus {
    /// Every job settled and the total agrees with the published value where
    /// one is known. Exit code 0.
    Complete,
    /// Stopped before every job settled; running again resumes. Exit code 3.
    Interrupted,
    /// Stopped while copies of some job disagree and no majority decided.
    /// Exit code 4.
    UnresolvedConflicts,
    /// Every job settled, but the total differs from the published value.
    /// Exit code 5.
    PublishedMismatch,
    /// Every job settled, but some counted one copy that needed a check no
    /// second machine gave: the total is as good as the machine that
    /// computed those jobs. Exit code 6.
    Unchecked,
}

impl RunStatus {
    /// The process exit code for this status.
    pub fn exit_code(self) -> u8 {
        match self {
            RunStatus::Complete => 0,
            RunStatus::Interrupted => 3,
            RunStatus::UnresolvedConflicts => 4,
            RunStatus::PublishedMismatch => 5,
            RunStatus::Unchecked => 6,
        }
    }

    /// The status as report.json spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Complete => "complete",
            RunStatus::Interrupted => "interrupted",
            RunStatus::UnresolvedConflicts => "unresolved_conflicts",
            RunStatus::PublishedMismatch => "published_mismatch",
            RunStatus::Unchecked => "unchecked",
        }
    }
}

/// The figures of a run's end, wherever they come from: the scheduler of
/// the session that ends ([`Totals::of_standing`]) or the summary an
/// earlier session stored ([`Totals::of_summary`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Totals {
    pub(crate) complete: bool,
    pub(crate) total: u128,
    pub(crate) unique: u128,
    pub(crate) elapsed_ms: u64,
    pub(crate) jobs_done: u64,
    pub(crate) confirmations: u64,
    pub(crate) conflicts: u64,
    pub(crate) disputed: u64,
    /// Jobs settled without the check they needed (see
    /// [`RunStatus::Unchecked`]).
    pub(crate) unchecked: u64,
}

impl Totals {
    /// The totals as `s` stands after `elapsed_ms` of work on the run.
    ///
    /// # Errors
    ///
    /// [`Error::Inconsistent`] when a complete run's tally does not fold
    /// into whole symmetry classes.
    pub(crate) fn of_standing(s: &Standing, elapsed_ms: u64) -> Result<Totals> {
        let complete = s.complete;
        let tally = s.tally;
        Ok(Totals {
            complete,
            total: tally.total,
            unique: if complete {
                tally.unique().map_err(Error::Inconsistent)?
            } else {
                0
            },
            elapsed_ms,
            jobs_done: s.jobs_done,
            confirmations: s.confirmations,
            conflicts: s.conflicts,
            disputed: s.jobs_disputed,
            unchecked: s.jobs_unchecked,
        })
    }

    /// The totals a finished run stored: its unchecked jobs as it ended
    /// where the summary kept them, else `judged_unchecked`, what judging
    /// its copies again found unchecked.
    pub(crate) fn of_summary(
        s: &RunSummary,
        disputed: u64,
        judged_unchecked: u64,
    ) -> Totals {
        let unchecked = s.unchecked.unwrap_or(judged_unchecked);
        Totals {
            complete: true,
            total: s.total,
            unique: s.unique,
            elapsed_ms: s.elapsed_ms,
            jobs_done: s.jobs,
            confirmations: s.confirmations,
            conflicts: s.conflicts,
            disputed,
            unchecked,
        }
    }

    /// The summary to store once a run is complete.
    pub(crate) fn summary(&self, jobs: u64, finished_unix_ms: u64) -> Option<RunSummary> {
        self.complete.then_some(RunSummary {
            total: self.total,
            unique: self.unique,
            elapsed_ms: self.elapsed_ms,
            jobs,
            confirmations: self.confirmations,
            conflicts: self.conflicts,
            finished_unix_ms,
            unchecked: Some(self.unchecked),
        })
    }
}

impl RunReport {
    /// The report of the run `m` in `data_dir`: the one place a report is
    /// built.
    pub(crate) fn new(
        m: &Manifest,
        data_dir: &Path,
        t: Totals,
        faulty_workers: Vec<FaultyWorker>,
    ) -> RunReport {
        RunReport {
            n: m.key.board.n(),
            complete: t.complete,
            total: t.total,
            unique: t.unique,
            seconds: std::time::Duration::from_millis(t.elapsed_ms).as_secs_f64(),
            jobs: m.jobs,
            jobs_done: t.jobs_done,
            split: m.key.spec,
            split_version: m.key.split_version,
            confirmations: t.confirmations,
            conflicts: t.conflicts,
            run_id: m.run_id.clone(),
            data_dir: data_dir.to_path_buf(),
            faulty_workers,
            disputed: t.disputed,
            unchecked: t.unchecked,
            // Set where the run is complete: it reads the whole store.
            audit_digest: None,
            setting_changes: Vec::new(),
        }
    }
}

impl RunReport {
    /// How the run ended.
    pub fn status(&self) -> RunStatus {
        match (self.complete, self.published_match()) {
            (true, Some(false)) => RunStatus::PublishedMismatch,
            (true, _) if self.unchecked > 0 => RunStatus::Unchecked,
            (true, _) => RunStatus::Complete,
            (false, _) if self.disputed > 0 => RunStatus::UnresolvedConflicts,
            (false, _) => RunStatus::Interrupted,
        }
    }

    /// Why the run ended as it did, in words for people and report.json.
    pub fn why(&self) -> String {
        let faulty = if self.faulty_workers.is_empty() {
            String::new()
        } else {
            let names: Vec<String> = self
                .faulty_workers
                .iter()
                .map(|w| {
                    format!(
                        "{}@{} (lost {}{})",
                        w.name,
                        w.address,
                        w.lost,
                        if w.banned { ", banned" } else { "" }
                    )
                })
                .collect();
            format!(
                "; workers that lost verification conflicts, whose results were \
                 computed again by others: {}",
                names.join(", ")
            )
        };
        let what = match self.status() {
            RunStatus::Complete => {
                match self.published_match() {
                    Some(_) => "every job is settled and the total matches OEIS A000170"
                        .to_owned(),
                    None => "every job is settled; no published value to compare with"
                        .to_owned(),
                }
            }
            RunStatus::Interrupted => format!(
                "stopped with {} of {} jobs settled; run the same command again to resume",
                self.jobs_done, self.jobs
            ),
            RunStatus::UnresolvedConflicts => format!(
                "stopped while {} jobs have disagreeing copies that no majority decided; \
                 run again with more workers attached to decide them",
                self.disputed
            ),
            RunStatus::Unchecked => format!(
                "every job is settled, but {} of {} jobs counted one copy that needed a \
                 check: no second machine was at work to give it (a lone worker under \
                 --local-threads 0, or workers still on probation when the others \
                 left). {}",
                self.unchecked,
                self.jobs,
                self.unchecked_advice()
            ),
            RunStatus::PublishedMismatch => {
                let (q, _) = published(self.n).unwrap_or_default();
                format!(
                    "every job is settled, but the total {} differs from the published \
                     {q}: do not trust this run; run `nq-coord audit` on its data \
                     directory and recount with --verify 1",
                    self.total
                )
            }
        };
        what + &faulty
    }

    /// What checks the jobs of an unchecked run, which is final: running
    /// again on its data directory only prints the stored result, so the
    /// check comes from a recount elsewhere or from the audit.
    fn unchecked_advice(&self) -> String {
        let dir = self.data_dir.display();
        format!(
            "A finished run is final: running again on {dir} only prints this \
             result. To check these jobs, solve every job again on this machine \
             from the audit (`nq-coord audit --data {dir} --output audit.csv`, \
             then `nq recheck audit.csv --sample {jobs} --seed 0 --kernel \
             scalar`), or recount in a new --data directory with a second voice \
             at work until the end: the coordinator's own threads (leave out \
             --local-threads 0) or a second machine with its own identity (its \
             own token in --worker-tokens)",
            jobs = self.jobs
        )
    }

    /// Whether the counts match OEIS A000170 / A002562: `None` when N is not in
    /// the published table (N > 27) or the run is incomplete.
    pub fn published_match(&self) -> Option<bool> {
        if !self.complete {
            return None;
        }
        published(self.n).map(|(q, u)| q == self.total && u == self.unique)
    }

    /// The one line the binary prints on stdout, `key=value` pairs separated
    /// by spaces:
    ///
    /// ```text
    /// n=16 status=complete total=14772512 unique=1846955 seconds=1.234 jobs=256 conflicts=0 audit=sha256:9f86… published=match
    /// n=16 status=unchecked total=14772512 unique=1846955 seconds=1.234 jobs=256 conflicts=0 unchecked=256 audit=sha256:9f86… published=match
    /// n=16 status=interrupted total=1234 jobs_done=12 jobs=256
    /// ```
    ///
    /// `unchecked` appears only when jobs are; `audit` is the digest of the
    /// run's audit (absent when unknown); `published` is `match`, `MISMATCH`
    /// or `unknown` (N > 27).
    pub fn summary_line(&self) -> String {
        if !self.complete {
            return format!(
                "n={} status={} total={} jobs_done={} jobs={}",
                self.n,
                self.status().as_str(),
                self.total,
                self.jobs_done,
                self.jobs
            );
        }
        let published = match self.published_match() {
            Some(true) => "match",
            Some(false) => "MISMATCH",
            None => "unknown",
        };
        // A mismatch keeps `status=complete` (its `published=MISMATCH` says
        // it, as before); unchecked jobs change the status word.
        let (status, unchecked) = match self.status() {
            RunStatus::Unchecked => {
                ("unchecked", format!(" unchecked={}", self.unchecked))
            }
            _ => ("complete", String::new()),
        };
        // Before `published`, which ends the line (scripts anchor on it).
        let audit = self
            .audit_digest
            .map_or_else(String::new, |d| format!(" audit={d}"));
        format!(
            "n={} status={status} total={} unique={} seconds={:.3} jobs={} conflicts={}\
             {unchecked}{audit} published={published}",
            self.n, self.total, self.unique, self.seconds, self.jobs, self.conflicts
        )
    }

    /// The JSON report. u128 counts are written as exact JSON integers (never
    /// through `f64`):
    ///
    /// ```json
    /// {"n":16,"total":14772512,"unique":1846955,"seconds":1.234,"jobs":256,
    ///  "split":{"version":1,"ring":1,"extra":0},"published_match":true,
    ///  "conflicts":0,"confirmations":0,"complete":true,"jobs_done":256,
    ///  "run_id":"16-…", …,
    ///  "setting_changes":[{"setting":"verify","from":"0","to":"auto","unix_ms":1700000000000}]}
    /// ```
    ///
    /// `setting_changes` lists the changes `--change-settings` made to the
    /// settings stored with the run, oldest first (empty when none).
    pub fn to_json(&self) -> String {
        let published_match = match self.published_match() {
            Some(b) => b.to_string(),
            None => "null".to_owned(),
        };
        // serde_json writes f64 and strings correctly; u128 it cannot (without
        // `arbitrary_precision`), so the integers are formatted here.
        let seconds =
            serde_json::to_string(&self.seconds).unwrap_or_else(|_| "null".into());
        let run_id =
            serde_json::to_string(&self.run_id).expect("a string always serializes");
        let status = self.status();
        let why = serde_json::to_string(&self.why()).expect("a string always serializes");
        let faulty: Vec<serde_json::Value> = self
            .faulty_workers
            .iter()
            .map(|w| {
                serde_json::json!({
                    "name": w.name,
                    "address": w.address,
                    "lost": w.lost,
                    "banned": w.banned,
                })
            })
            .collect();
        let faulty = serde_json::Value::Array(faulty).to_string();
        let changes: Vec<serde_json::Value> = self
            .setting_changes
            .iter()
            .map(|c| {
                serde_json::json!({
                    "setting": c.setting,
                    "from": c.from,
                    "to": c.to,
                    "unix_ms": c.unix_ms,
                })
            })
            .collect();
        let changes = serde_json::Value::Array(changes).to_string();
        let audit_digest = self
            .audit_digest
            .map_or_else(|| "null".to_owned(), |d| format!("\"{d}\""));
        format!(
            "{{\"n\":{},\"total\":{},\"unique\":{},\"seconds\":{seconds},\"jobs\":{},\
             \"split\":{{\"version\":{},\"ring\":{},\"extra\":{}}},\
             \"published_match\":{published_match},\"conflicts\":{},\
             \"confirmations\":{},\"complete\":{},\"jobs_done\":{},\"run_id\":{run_id},\
             \"status\":\"{}\",\"exit_code\":{},\"why\":{why},\"faulty_workers\":{faulty},\
             \"disputed\":{},\"unchecked\":{},\"audit_digest\":{audit_digest},\
             \"setting_changes\":{changes}}}\n",
            self.n,
            self.total,
            self.unique,
            self.jobs,
            self.split_version,
            self.split.ring,
            self.split.extra,
            self.conflicts,
            self.confirmations,
            self.complete,
            self.jobs_done,
            status.as_str(),
            status.exit_code(),
            self.disputed,
            self.unchecked,
        )
    }

    /// Writes [`RunReport::to_json`] to `dir/report.json`, atomically (a
    /// temporary file renamed over the old report).
    ///
    /// # Errors
    ///
    /// [`Error::Io`] naming the file.
    pub fn write_json(&self, dir: &Path) -> Result<PathBuf> {
        let path = dir.join(REPORT_FILE);
        let tmp = dir.join(format!("{REPORT_FILE}.tmp"));
        let io = |source| Error::Io {
            context: format!("cannot write {}", path.display()),
            source,
        };
        let mut f = std::fs::File::create(&tmp).map_err(io)?;
        f.write_all(self.to_json().as_bytes()).map_err(io)?;
        f.sync_all().map_err(io)?;
        std::fs::rename(&tmp, &path).map_err(io)?;
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A finished run reprinted from its summary keeps the status it ended
    /// with: a copy kept after it completed (a late lie) leaves its job
    /// waiting for a check when the copies are judged again, which read as
    /// `unchecked` (exit 6) for a run that ended `complete`.
    #[test]
    fn a_summary_keeps_the_unchecked_jobs_the_run_ended_with() {
        let ended = Totals {
            complete: true,
            total: 92,
            unique: 12,
            elapsed_ms: 1,
            jobs_done: 4,
            confirmations: 4,
            conflicts: 1,
            disputed: 0,
            unchecked: 0,
        };
        let summary = ended.summary(4, 2).expect("complete");
        assert_eq!(summary.unchecked, Some(0));
        // Judged again, one job waits for a check: the summary decides.
        assert_eq!(Totals::of_summary(&summary, 0, 1).unchecked, 0);
        let alone = Totals {
            unchecked: 3,
            ..ended
        };
        let summary = alone.summary(4, 2).expect("complete");
        assert_eq!(Totals::of_summary(&summary, 0, 0).unchecked, 3);
        // A summary written before it kept the count: judged again.
        let old = RunSummary {
            unchecked: None,
            ..summary
        };
        assert_eq!(Totals::of_summary(&old, 0, 2).unchecked, 2);
    }

    fn report(n: u8, total: u128, unique: u128) -> RunReport {
        RunReport {
            n,
            complete: true,
            total,
            unique,
            seconds: 1.5,
            jobs: 10,
            jobs_done: 10,
            split: SplitSpec::new(1, 0).unwrap(),
            split_version: 1,
            confirmations: 2,
            conflicts: 0,
            run_id: "r\"1".into(),
            data_dir: PathBuf::from("d"),
            faulty_workers: vec![FaultyWorker::from_identity("liar@127.0.0.1", 2, true)],
            disputed: 0,
            unchecked: 0,
            audit_digest: Some(AuditDigest([0xab; 32])),
            setting_changes: vec![SettingChange {
                setting: "verify".into(),
                from: "0".into(),
                to: "auto".into(),
                unix_ms: 1_700_000_000_000,
            }],
        }
    }

    #[test]
    fn json_has_exact_integers_and_parses() {
        let big = u128::MAX;
        let r = report(30, big, 3);
        let json = r.to_json();
        assert!(json.contains(&format!("\"total\":{big}")), "{json}");
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["n"], 30);
        assert_eq!(v["published_match"], serde_json::Value::Null);
        assert_eq!(v["split"]["ring"], 1);
        assert_eq!(v["run_id"], "r\"1");
        assert_eq!(v["seconds"], 1.5);
        assert_eq!(v["status"], "complete");
        assert_eq!(v["exit_code"], 0);
        assert_eq!(v["faulty_workers"][0]["name"], "liar");
        assert_eq!(v["faulty_workers"][0]["address"], "127.0.0.1");
        assert_eq!(v["faulty_workers"][0]["banned"], true);
        assert_eq!(v["audit_digest"], format!("sha256:{}", "ab".repeat(32)));
        assert_eq!(v["setting_changes"][0]["setting"], "verify");
        assert_eq!(v["setting_changes"][0]["from"], "0");
        assert_eq!(v["setting_changes"][0]["to"], "auto");
        assert_eq!(v["setting_changes"][0]["unix_ms"], 1_700_000_000_000u64);
        let ok = report(8, 92, 12);
        let v: serde_json::Value = serde_json::from_str(&ok.to_json()).unwrap();
        assert_eq!(v["published_match"], true);
        assert_eq!(v["total"], 92);
    }

    #[test]
    fn summary_line_says_whether_it_matches() {
        assert!(
            report(8, 92, 12)
                .summary_line()
                .ends_with("published=match")
        );
        assert!(
            report(8, 93, 12)
                .summary_line()
                .ends_with("published=MISMATCH")
        );
        assert!(
            report(8, 92, 12)
                .summary_line()
                .contains(&format!(" audit=sha256:{} published=", "ab".repeat(32)))
        );
        let mut r = report(8, 40, 0);
        r.complete = false;
        r.jobs_done = 3;
        assert_eq!(
            r.summary_line(),
            "n=8 status=interrupted total=40 jobs_done=3 jobs=10"
        );
        assert_eq!(r.published_match(), None);
    }

    #[test]
    fn unchecked_jobs_are_no_silent_success() {
        let mut r = report(8, 92, 12);
        r.unchecked = 3;
        r.audit_digest = None;
        assert_eq!(r.status(), RunStatus::Unchecked);
        assert_eq!(r.status().exit_code(), 6);
        assert_eq!(
            r.summary_line(),
            "n=8 status=unchecked total=92 unique=12 seconds=1.500 jobs=10 \
             conflicts=0 unchecked=3 published=match"
        );
        let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(v["status"], "unchecked");
        assert_eq!(v["exit_code"], 6);
        assert_eq!(v["unchecked"], 3);
        let why = v["why"].as_str().unwrap();
        assert!(why.contains("3 of 10 jobs"), "{why}");
        // The advice works on a finished run: the same directory only
        // reprints it, so it names a recount elsewhere or a recheck of
        // every job from the audit, never "run again" there.
        assert!(!why.contains("run again"), "{why}");
        assert!(
            why.contains("--sample 10 --seed 0")
                && why.contains("new --data directory")
                && why.contains("only prints this result"),
            "{why}"
        );
        // A wrong total is the stronger news.
        r.total = 93;
        assert_eq!(r.status(), RunStatus::PublishedMismatch);
    }
}

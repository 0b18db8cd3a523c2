//! The outcome of a run: [`RunReport`], its stdout line and `report.json`.

use std::io::Write;
use std::path::{Path, PathBuf};

use nq_core::split::SplitSpec;

use crate::error::{Error, Result};
use nq_core::published::published;

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
}

impl RunReport {
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
    /// n=16 status=complete total=14772512 unique=1846955 seconds=1.234 jobs=256 conflicts=0 published=match
    /// n=16 status=interrupted total=1234 jobs_done=12 jobs=256
    /// ```
    ///
    /// `published` is `match`, `MISMATCH` or `unknown` (N > 27).
    pub fn summary_line(&self) -> String {
        if !self.complete {
            return format!(
                "n={} status=interrupted total={} jobs_done={} jobs={}",
                self.n, self.total, self.jobs_done, self.jobs
            );
        }
        let published = match self.published_match() {
            Some(true) => "match",
            Some(false) => "MISMATCH",
            None => "unknown",
        };
        format!(
            "n={} status=complete total={} unique={} seconds={:.3} jobs={} conflicts={} \
             published={published}",
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
    ///  "run_id":"16-…"}
    /// ```
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
        format!(
            "{{\"n\":{},\"total\":{},\"unique\":{},\"seconds\":{seconds},\"jobs\":{},\
             \"split\":{{\"version\":{},\"ring\":{},\"extra\":{}}},\
             \"published_match\":{published_match},\"conflicts\":{},\
             \"confirmations\":{},\"complete\":{},\"jobs_done\":{},\"run_id\":{run_id}}}\n",
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
        let mut r = report(8, 40, 0);
        r.complete = false;
        r.jobs_done = 3;
        assert_eq!(
            r.summary_line(),
            "n=8 status=interrupted total=40 jobs_done=3 jobs=10"
        );
        assert_eq!(r.published_match(), None);
    }
}

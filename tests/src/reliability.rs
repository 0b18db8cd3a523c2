//! The record behind `RELIABILITY.md`: which faults the e2e suite injects
//! ([`FAULTS`]), what each run of a fault test did and how it ended
//! ([`Trial`], one JSON row per fault under `target/reliability/`), and the
//! Markdown table made from those rows ([`render`]).
//!
//! The flow, so that the table cannot be typed by hand or drift:
//!
//! 1. Every fault test opens a [`Trial`] with its fault's id, counts each
//!    injection as it makes it, and closes it with the run's checked
//!    `report.json` (or its error). [`Trial::finish`] writes the row, pass or
//!    fail.
//! 2. `cargo run -p nq-e2e --bin nq-reliability` renders `RELIABILITY.md`
//!    from the rows, and refuses (non-zero) when a fault has no row or failed.
//! 3. The test `reliability::the_committed_table_lists_every_fault` checks
//!    that the committed file lists exactly [`FAULTS`], that each is opened
//!    by a test, and that every outcome in it is exact.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::json;

use crate::rng::Rng;
use crate::{OutputHandle, Proc, Report};

/// One kind of fault the suite injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// Stable id, the key of its row (`coordinator-sigkill`).
    pub id: &'static str,
    /// The fault, in a few words.
    pub fault: &'static str,
    /// What the test does to inject it, and how it decides the outcome.
    pub done: &'static str,
}

/// Every fault the e2e suite injects. A test that injects a fault names its
/// id in [`Trial::start`]; the drift test keeps this list, the tests and
/// `RELIABILITY.md` equal.
pub const FAULTS: &[Fault] = &[
    Fault {
        id: "coordinator-sigkill",
        fault: "Coordinator SIGKILLed at random moments of one run",
        done: "N=16 in 137 jobs, two workers attached throughout. Five times, \
               after a seeded random 1–8 durable results, `kill -9` the \
               coordinator and restart it on the same data directory and port.",
    },
    Fault {
        id: "worker-sigkill",
        fault: "Workers SIGKILLed and restarted throughout a run",
        done: "N=16 in 137 jobs, 1 s leases, three workers. Six times, after a \
               seeded random 1–6 durable results, `kill -9` a randomly chosen \
               worker and start it again under the same name.",
    },
    Fault {
        id: "worker-sigstop",
        fault: "A worker SIGSTOPped for longer than its lease, then SIGCONTed",
        done: "N=16, 1 s leases. `kill -STOP` a worker while it holds leases, wait \
               until the coordinator expires them and another worker has \
               finished one of those jobs, then `kill -CONT` it; its late results \
               must not change the total.",
    },
    Fault {
        id: "flaky-network",
        fault: "A worker behind a proxy that drops connections and stalls traffic",
        done: "N=16, 1 s leases, the only worker connects through a TCP proxy in \
               the test. At seeded random moments the proxy closes every \
               connection, or holds all bytes until the coordinator has expired \
               one of the worker's leases, then lets them through.",
    },
    Fault {
        id: "garbage-traffic",
        fault: "Garbage bytes and oversized messages on the coordinator's port",
        done: "During a run: connections that send seeded random bytes, \
               connections that send the HTTP/2 preface and then random frames, \
               half-open HTTP/2 connections that send the preface and then \
               nothing, and a gRPC message larger than \
               `nq_proto::MAX_MESSAGE_BYTES`.",
    },
    Fault {
        id: "lying-worker-verify-all",
        fault: "A worker that reports wrong counts, with `--verify 1`",
        done: "N=16, `--verify 1 --ban-after 2`, one local thread (the trusted \
               computation that settles disputes), the `nq-liar` test double \
               (wrong counts on every job) beside two honest workers. The liar \
               must be named in the log and in `faulty_workers`, refused with \
               PERMISSION_DENIED after 2 lost conflicts, and the totals exact.",
    },
    Fault {
        id: "lying-worker-spot-check",
        fault: "A worker that lies on every job, with `--verify 0.05`",
        done: "N=16 in 1367 jobs, `--verify 0.05`; the liar alone reports \
               200 jobs before two honest workers join. It must be caught (lose \
               conflicts; with no trusted computation and no credentials, losses \
               make it suspect, not banned) and the totals exact.",
    },
    Fault {
        id: "forged-reports",
        fault: "Reports not bound to a lease of this worker, job and run",
        done: "Correct counts sent under a made-up lease id, for a job never \
               leased to the sender, with another run's id, and under another \
               worker's valid lease: each must get PERMISSION_DENIED and change \
               nothing.",
    },
    Fault {
        id: "leases-across-a-restart",
        fault: "Coordinator SIGKILLed while workers hold leases",
        done: "Two workers hold three leases when the coordinator is killed and \
               started again on its data directory. The workers must report under \
               their old leases without registering again and be accepted; the \
               same leases under another worker's id, or for another job, must get \
               PERMISSION_DENIED.",
    },
    Fault {
        id: "two-crashes-in-a-lease-lifetime",
        fault: "Coordinator SIGKILLed twice within one lease lifetime",
        done: "A worker leases a job just after the first restart and the \
               coordinator is killed again at once. After the second restart \
               another worker must not be handed that job, and its holder's \
               report must be accepted: the second restart still sets aside \
               the jobs the first one did, and the lease granted between \
               them.",
    },
    Fault {
        id: "worker-moved-between-runs",
        fault: "An honest worker moved from a killed run to a new run on the same address",
        done: "N=16. `kill -9` run A's coordinator while its worker holds a result it \
               could not deliver, then start run B (another data directory) on the \
               same address. The worker must send run B nothing of run A, and run B \
               must count exactly with no confirmation or conflict.",
    },
];

/// The fault with this id.
pub fn fault(id: &str) -> Option<&'static Fault> {
    FAULTS.iter().find(|f| f.id == id)
}

/// One run of a fault test: its seed, what it injected, and (on
/// [`Trial::finish`]) its outcome, written as a row.
#[derive(Debug)]
pub struct Trial {
    fault: &'static Fault,
    test: String,
    seed: Option<u64>,
    /// Injections by kind, in the order of first use.
    injections: Vec<(String, u64)>,
    notes: Vec<String>,
    /// Processes whose output is printed if the trial fails.
    watched: Vec<OutputHandle>,
}

impl Trial {
    /// Opens the trial of fault `id`.
    ///
    /// # Errors
    ///
    /// When `id` is not in [`FAULTS`].
    pub fn start(id: &str) -> Result<Trial> {
        let fault = fault(id).with_context(|| {
            format!("fault `{id}` is not in nq_e2e::reliability::FAULTS; add it there")
        })?;
        // libtest names each test's thread after the test.
        let test = std::thread::current()
            .name()
            .unwrap_or("(unnamed)")
            .to_owned();
        Ok(Trial {
            fault,
            test,
            seed: None,
            injections: Vec::new(),
            notes: Vec::new(),
            watched: Vec::new(),
        })
    }

    /// Prints `p`'s output (its last lines) if the trial fails, even when
    /// the failure is a timeout that dropped `p` (libtest shows what a failed
    /// test printed).
    pub fn watch(&mut self, p: &Proc) {
        self.watched.push(p.output_handle());
    }

    /// The trial's random sequence, from [`Rng::seed_from_env`]. The seed is
    /// printed at once (so a failing or hung run shows it) and recorded.
    pub fn rng(&mut self) -> Rng {
        let seed = *self.seed.get_or_insert_with(Rng::seed_from_env);
        eprintln!(
            "{}: fault seed {seed:#x} (replay with {}={seed:#x})",
            self.fault.id,
            crate::rng::SEED_ENV
        );
        Rng::new(seed)
    }

    /// Counts one injection of kind `what` ("SIGKILL of the coordinator").
    pub fn injected(&mut self, what: &str) {
        match self.injections.iter_mut().find(|(w, _)| w == what) {
            Some((_, n)) => *n += 1,
            None => self.injections.push((what.to_owned(), 1)),
        }
    }

    /// Injections of kind `what` so far.
    pub fn count(&self, what: &str) -> u64 {
        self.injections
            .iter()
            .find(|(w, _)| w == what)
            .map_or(0, |(_, n)| *n)
    }

    /// Adds a remark to the row (what the system did in response).
    pub fn note(&mut self, text: impl Into<String>) {
        self.notes.push(text.into());
    }

    /// Writes the row, `target/reliability/<fault id>.json`, and returns the
    /// test's result unchanged (a failure to write the row fails the test).
    ///
    /// `result` is the final report, already checked by the test; its totals
    /// are recorded as the outcome. An error is recorded as a failure.
    ///
    /// # Errors
    ///
    /// `result`'s error, or a failure to write the row.
    pub fn finish(self, result: Result<Report>) -> Result<()> {
        let (exact, outcome) = match &result {
            Ok(r) => (true, exact_outcome(r)),
            Err(e) => {
                // The error's first two lines name the failure; what follows
                // is usually a process's whole output. They go first, so that
                // a CI excerpt of the test's output, which keeps its start
                // and its end, shows what failed.
                let text = format!("{e:#}");
                let head: Vec<&str> = text
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .take(2)
                    .collect();
                let outcome = format!("FAILED: {}", head.join(" "));
                eprintln!("{}: {outcome}", self.fault.id);
                for w in &self.watched {
                    eprintln!("----- last lines of {} -----\n{}", w.name(), w.tail(300));
                }
                if let Some(seed) = self.seed {
                    eprintln!(
                        "{} failed; replay with {}={seed:#x}",
                        self.fault.id,
                        crate::rng::SEED_ENV
                    );
                }
                (false, outcome)
            }
        };
        let dir = rows_dir()?;
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let path = dir.join(format!("{}.json", self.fault.id));
        // The tallies of earlier runs on this machine (since the target
        // directory was last cleaned): how often the fault was tried.
        let (runs, exact_runs, earlier_failure) = earlier_runs(&path);
        // The newest failure is kept across later passing runs, with its
        // seed, so that it can be replayed after the fact.
        let last_failure = if exact {
            earlier_failure
        } else {
            Some(json!({
                "seed": self.seed.map(|s| format!("{s:#x}")),
                "outcome": outcome,
            }))
        };
        let row = json!({
            "fault": self.fault.id,
            "runs": runs + 1,
            "exact_runs": exact_runs + u64::from(exact),
            "test": self.test,
            "seed": self.seed.map(|s| format!("{s:#x}")),
            "injections": self
                .injections
                .iter()
                .map(|(w, n)| json!({"what": w, "count": n}))
                .collect::<Vec<_>>(),
            "exact": exact,
            "outcome": outcome,
            "notes": self.notes,
            "last_failure": last_failure,
        });
        std::fs::write(&path, format!("{row:#}\n"))
            .with_context(|| format!("cannot write {}", path.display()))?;
        result.map(|_| ())
    }
}

/// `(runs, exact runs, last failure)` recorded in the row at `path` so far;
/// `(0, 0, None)` when there is none (or it cannot be read: the tally
/// restarts).
fn earlier_runs(path: &Path) -> (u64, u64, Option<serde_json::Value>) {
    let Some(v) = std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
    else {
        return (0, 0, None);
    };
    let n = |k: &str| v.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
    let failure = v.get("last_failure").filter(|f| !f.is_null()).cloned();
    (n("runs"), n("exact_runs"), failure)
}

/// The outcome column of a run whose counts the test found exact.
fn exact_outcome(r: &Report) -> String {
    let mut s = format!(
        "exact: Q({n}) = {} and U({n}) = {} as published",
        r.total,
        r.unique,
        n = r.n
    );
    if r.conflicts > 0 {
        s.push_str(&format!(
            "; {} conflicting results recorded, none counted",
            r.conflicts
        ));
    }
    s
}

/// Where the rows go: `target/reliability/`, beside the build output of the
/// running test or tool.
///
/// # Errors
///
/// When the target directory cannot be found.
pub fn rows_dir() -> Result<PathBuf> {
    let (target, _) = crate::target_and_profile()?;
    Ok(target.join("reliability"))
}

/// A row as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The fault's id.
    pub fault: String,
    /// The test that wrote it.
    pub test: String,
    /// The seed, as written (hex).
    pub seed: Option<String>,
    /// `(what, count)` per kind of injection.
    pub injections: Vec<(String, u64)>,
    /// Whether the counts were exact.
    pub exact: bool,
    /// The outcome text.
    pub outcome: String,
    /// Remarks.
    pub notes: Vec<String>,
    /// Runs recorded on this machine, the last one included.
    pub runs: u64,
    /// How many of them were exact.
    pub exact_runs: u64,
    /// The newest run that was not exact: its seed and outcome.
    pub last_failure: Option<(Option<String>, String)>,
}

/// Reads every row in `dir` whose fault is in [`FAULTS`], by fault id.
///
/// # Errors
///
/// When the directory or a row cannot be read or parsed.
pub fn read_rows(dir: &Path) -> Result<BTreeMap<String, Row>> {
    let mut rows = BTreeMap::new();
    let entries = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read {}", dir.display()))?;
    for entry in entries {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not JSON", path.display()))?;
        let s = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_owned);
        let row = Row {
            fault: s("fault").with_context(|| format!("{}: no fault", path.display()))?,
            test: s("test").unwrap_or_default(),
            seed: s("seed"),
            injections: v
                .get("injections")
                .and_then(|i| i.as_array())
                .map(|a| {
                    a.iter()
                        .filter_map(|i| {
                            Some((
                                i.get("what")?.as_str()?.to_owned(),
                                i.get("count")?.as_u64()?,
                            ))
                        })
                        .collect()
                })
                .unwrap_or_default(),
            exact: v.get("exact").and_then(|e| e.as_bool()).unwrap_or(false),
            outcome: s("outcome").unwrap_or_default(),
            notes: v
                .get("notes")
                .and_then(|n| n.as_array())
                .map(|a| {
                    a.iter()
                        .filter_map(|n| n.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default(),
            runs: v.get("runs").and_then(|n| n.as_u64()).unwrap_or(1),
            exact_runs: v.get("exact_runs").and_then(|n| n.as_u64()).unwrap_or(0),
            last_failure: v.get("last_failure").filter(|f| !f.is_null()).map(|f| {
                let s = |k: &str| f.get(k).and_then(|x| x.as_str()).map(str::to_owned);
                (s("seed"), s("outcome").unwrap_or_default())
            }),
        };
        if fault(&row.fault).is_some() {
            rows.insert(row.fault.clone(), row);
        }
    }
    Ok(rows)
}

/// Table cells cannot hold `|` or line breaks.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

/// `RELIABILITY.md` from the rows: one table line per fault of [`FAULTS`], in
/// its order, then the details of the recorded runs. A fault without a row
/// is listed as not run.
pub fn render(rows: &BTreeMap<String, Row>) -> String {
    let mut out = String::from(
        "# Reliability\n\n\
         Every fault that nq's end-to-end suite (`cargo test -p nq-e2e`) injects \
         into real `nq-coord` and `nq-worker` processes on 127.0.0.1, and how the \
         last recorded run of each ended.\n\n\
         This file is generated, not typed: each fault test records what it \
         injected and its checked outcome in `target/reliability/<fault>.json` \
         (`nq_e2e::reliability::Trial`), and \
         `cargo run -p nq-e2e --bin nq-reliability` renders this file from those \
         rows. The test `reliability::the_committed_table_lists_every_fault` fails \
         when this file lists other faults than the suite injects, or any outcome \
         that is not exact. \"Exact\" means the run ended with `status` complete and \
         the total and unique counts in `report.json` equal to the published \
         values (OEIS A000170 and A002562).\n\n\
         Fault moments are random but seeded: a test prints its seed, and \
         `NQ_FAULT_SEED=<seed> cargo test -p nq-e2e <test>` replays it.\n\n\
         The runs column counts the runs recorded in the `target/` directory \
         that this file was rendered from, and how many of them were exact.\n\n\
         | Fault | What the test does | Injected (last run) | Outcome (last run) | Runs (exact) | Test |\n\
         |---|---|---|---|---|---|\n",
    );
    for f in FAULTS {
        let row = rows.get(f.id);
        let injected = row.map_or_else(
            || "not run".to_owned(),
            |r| {
                if r.injections.is_empty() {
                    "none".to_owned()
                } else {
                    r.injections
                        .iter()
                        .map(|(w, n)| format!("{n} × {w}"))
                        .collect::<Vec<_>>()
                        .join("; ")
                }
            },
        );
        let outcome = row.map_or("not run", |r| r.outcome.as_str());
        let test = row.map_or(String::new(), |r| format!("`{}`", r.test));
        let runs =
            row.map_or("0".to_owned(), |r| format!("{} ({})", r.runs, r.exact_runs));
        out.push_str(&format!(
            "| `{}`: {} | {} | {} | {} | {} | {} |\n",
            f.id,
            cell(f.fault),
            cell(f.done),
            cell(&injected),
            cell(outcome),
            runs,
            cell(&test)
        ));
    }
    out.push_str("\n## Details of the recorded runs\n\n");
    for f in FAULTS {
        let Some(r) = rows.get(f.id) else { continue };
        out.push_str(&format!(
            "- `{}` (seed {}):",
            f.id,
            r.seed.as_deref().unwrap_or("none")
        ));
        if r.notes.is_empty() && r.last_failure.is_none() {
            out.push_str(" no remarks.\n");
        } else {
            out.push('\n');
            for n in &r.notes {
                out.push_str(&format!("  - {n}\n"));
            }
            if let Some((seed, outcome)) = &r.last_failure {
                out.push_str(&format!(
                    "  - last run that was not exact (seed {}): {outcome}\n",
                    seed.as_deref().unwrap_or("none")
                ));
            }
        }
    }
    out
}

/// The fault ids and outcome cells of the table in a `RELIABILITY.md` text:
/// each table line that starts with a backquoted id.
pub fn table_rows(markdown: &str) -> Vec<(String, String)> {
    markdown
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("| `")?;
            let id = rest.split('`').next()?.to_owned();
            // Cells: fault, what, injected, outcome, runs, test (split on
            // unescaped bars; cells escape theirs as `\|`).
            let cells: Vec<&str> = split_cells(line);
            let outcome = cells.get(3)?.trim().to_owned();
            Some((id, outcome))
        })
        .collect()
}

fn split_cells(line: &str) -> Vec<&str> {
    let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
    let mut cells = Vec::new();
    let mut start = 0;
    let bytes = inner.as_bytes();
    for i in 0..bytes.len() {
        if bytes[i] == b'|' && (i == 0 || bytes[i - 1] != b'\\') {
            cells.push(&inner[start..i]);
            start = i + 1;
        }
    }
    cells.push(&inner[start..]);
    cells
}

/// The fault ids that test sources open trials for (`Trial::start("id")`).
pub fn ids_in_source(source: &str) -> Vec<String> {
    let needle = "Trial::start(\"";
    source
        .match_indices(needle)
        .filter_map(|(i, _)| {
            let rest = &source[i + needle.len()..];
            rest.split('"').next().map(str::to_owned)
        })
        .collect()
}

/// Fails unless every fault has a row and every row is exact: the condition
/// for committing a rendered `RELIABILITY.md`.
///
/// # Errors
///
/// Naming the faults without a row and those that failed.
pub fn check_complete(rows: &BTreeMap<String, Row>) -> Result<()> {
    let missing: Vec<&str> = FAULTS
        .iter()
        .filter(|f| !rows.contains_key(f.id))
        .map(|f| f.id)
        .collect();
    let failed: Vec<&str> = rows
        .values()
        .filter(|r| !r.exact)
        .map(|r| r.fault.as_str())
        .collect();
    if !missing.is_empty() || !failed.is_empty() {
        bail!(
            "faults without a recorded run: {missing:?}; faults whose last run failed: \
             {failed:?}. Run `cargo test -p nq-e2e` until every fault test passes."
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendered_rows_parse_back_and_bars_are_escaped() {
        let mut rows = BTreeMap::new();
        rows.insert(
            "garbage-traffic".to_owned(),
            Row {
                fault: "garbage-traffic".into(),
                test: "chaos::x".into(),
                seed: Some("0x1".into()),
                injections: vec![("a | b".into(), 3)],
                exact: true,
                outcome: "exact: fine".into(),
                notes: vec!["n".into()],
                runs: 4,
                exact_runs: 3,
                last_failure: Some((Some("0x2".into()), "FAILED: x".into())),
            },
        );
        let md = render(&rows);
        let parsed = table_rows(&md);
        assert_eq!(parsed.len(), FAULTS.len());
        assert_eq!(parsed[0].1, "not run");
        let g = parsed
            .iter()
            .find(|(id, _)| id == "garbage-traffic")
            .unwrap();
        assert_eq!(g.1, "exact: fine");
        assert!(md.contains("3 × a \\| b"));
        assert!(md.contains("| 4 (3) |"));
        assert!(md.contains("not exact (seed 0x2): FAILED: x"));
        assert!(check_complete(&rows).is_err());
    }

    #[test]
    fn ids_are_found_in_source() {
        let src = r#"let t = Trial::start("a-b")?; Trial::start("c")"#;
        assert_eq!(ids_in_source(src), ["a-b", "c"]);
    }
}

//! `nq recheck`: re-computes a sample of a published audit on this machine.
//!
//! A record is believed when strangers can check it cheaply. The coordinator's
//! audit (`nq-coord audit`, format `nq-audit v2`) lists every job of a run
//! with the counts that were accepted for it, the board, the split and each
//! job's sub-problems, and ends with its own SHA-256. This command reads that
//! file and nothing else (no coordinator, no store: the search is nq-core's),
//! and checks, in this order:
//!
//! 1. **The digest.** The SHA-256 of every byte before the `# digest=` line
//!    must be the one that line states, and the one given with `--digest`
//!    (the value the run's final line and `report.json` published). An edited
//!    row, or an edited row with a digest recomputed to match, fails here.
//! 2. **The sums.** The rows are jobs `0, 1, …` whose sub-problems tile the
//!    split in order, every job is settled, and their counts add up to the
//!    `# end` line's `total`, `burnside` and `unique = burnside / 8`.
//! 3. **The plan.** The split, enumerated again here in plan order
//!    (`nq_core::split::split_each`), has as many sub-problems as the rows
//!    say, and the SHA-256 of their prefixes is the audit's `plan`: each
//!    job's sub-problems are exactly what the run computed.
//! 4. **The sample**, only when asked for. `--sample K` jobs, chosen by
//!    `--seed` (see [`sample_key`]), are solved again on this machine's
//!    cores; each sub-problem's counts pass `SubProblem::check`, and the
//!    job's tally must equal its row's `count_total` and `count_burnside`.
//!
//! It prints one summary line (`recheck … status=match`); `--verbose` adds the
//! audit's run, the sample and a line per job solved again. Any failure is
//! named on stderr (the job, the line, the two values) and makes the command
//! exit non-zero after every check has run.

use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, mpsc};
use std::time::Instant;

use anyhow::{Context, bail};
use nq_core::Board;
use nq_core::pool::{Job, JobOutcome, JobSink, Pool};
use nq_core::search::Kernel;
use nq_core::split::{SPLIT_VERSION, SplitSpec, SubProblem, Tally, split_each};
use sha2::{Digest, Sha256};

/// The audit format this command reads (the first line, after `# `).
const FORMAT: &str = "nq-audit v2";

/// Sampled job ids listed on the `sample:` line.
const LISTED: usize = 32;

/// Problems of one kind listed one by one before they are only counted.
const SHOWN: u64 = 10;

/// What `nq recheck` is asked to do.
#[derive(Debug)]
pub(crate) struct Request<'a> {
    /// The audit file.
    pub(crate) file: &'a Path,
    /// Jobs to solve again.
    pub(crate) sample: u64,
    /// The public seed that chooses them.
    pub(crate) seed: &'a str,
    /// The published digest, when given: the file's must equal it.
    pub(crate) digest: Option<[u8; 32]>,
    /// Threads to solve on.
    pub(crate) threads: usize,
    /// The count kernel.
    pub(crate) kernel: Kernel,
    /// Print the audit's run, the sample and each job's verdict before the
    /// summary line.
    pub(crate) verbose: bool,
}

/// The key that orders jobs for the sample: the first 8 bytes, big-endian,
/// of `SHA-256("nq-recheck:" + SEED + ":" + JOB)`, JOB in decimal. The sample
/// is the `K` jobs with the least keys (ties: the lower job id). Anyone can
/// compute it, for instance with
/// `printf 'nq-recheck:%s:%d' "$SEED" "$JOB" | sha256sum`, and nobody can
/// steer it without choosing the seed, which is why the seed should be
/// published after the audit (a lottery draw, a block hash).
pub(crate) fn sample_key(seed: &str, job: u64) -> u64 {
    let hash = Sha256::digest(format!("nq-recheck:{seed}:{job}"));
    u64::from_be_bytes(hash[..8].try_into().expect("a SHA-256 has 32 bytes"))
}

/// Parses a digest written `sha256:HEX` or bare `HEX` (64 hex digits).
pub(crate) fn parse_digest(s: &str) -> Result<[u8; 32], String> {
    let hex = s.trim().strip_prefix("sha256:").unwrap_or(s.trim());
    let form = || {
        format!(
            "`{s}` is not a digest: expected sha256: and 64 hex digits, as the \
             run's final line prints it (audit=sha256:…)"
        )
    };
    if hex.len() != 64 || !hex.is_ascii() {
        return Err(form());
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| form())?;
    }
    Ok(out)
}

/// `sha256:HEX`, as the audit and the coordinator write digests.
fn show(digest: &[u8; 32]) -> String {
    let mut s = String::from("sha256:");
    for b in digest {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// The run an audit describes: its second line.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Header {
    board: Board,
    split_version: u32,
    spec: SplitSpec,
    jobs: u64,
}

/// The `# end` line: what the audit states its rows add up to.
#[derive(Clone, Debug, PartialEq, Eq)]
struct End {
    jobs: u64,
    settled: u64,
    subproblems: u64,
    total: u128,
    burnside: u128,
    /// `None` where the audit writes `-` (an unfinished run).
    unique: Option<u128>,
    plan: [u8; 32],
}

/// One job of the audit, as far as a re-check needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Row {
    job: u64,
    first: u64,
    subproblems: u64,
    tally: Tally,
}

/// A sampled job, ordered by its key so that a max-heap keeps the least.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Sampled {
    key: u64,
    job: u64,
    row: RowKey,
}

/// [`Row`] in a form that orders (the heap needs `Ord`; the key and job id
/// decide first, so the rest never matters).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct RowKey {
    first: u64,
    subproblems: u64,
    total: u128,
    burnside: u128,
}

/// What reading the file found: the parts, both digests, and the problems
/// of its shape and sums.
#[derive(Debug)]
struct Read {
    header: Header,
    end: End,
    /// The digest the file states on its last line.
    stated: [u8; 32],
    /// The digest of the bytes before that line.
    computed: [u8; 32],
    /// The sample, least key first.
    sample: Vec<Row>,
    /// Problems found while reading (the rows' sums, their order).
    problems: Vec<String>,
}

/// Runs `nq recheck`: prints a final `key=value` summary line on stdout
/// (after, when `verbose`, the audit's run, the sample and a line per
/// re-computed job).
///
/// # Errors
///
/// When the file cannot be read or is not an audit, or when any check fails
/// (all of them are named, on stderr, before this returns).
pub(crate) fn run(request: &Request<'_>) -> anyhow::Result<()> {
    let start = Instant::now();
    let file = File::open(request.file)
        .with_context(|| format!("cannot open {}", request.file.display()))?;
    let read = read(BufReader::new(file), request.seed, request.sample)
        .with_context(|| format!("{} is not a usable audit", request.file.display()))?;
    let mut problems = digest_problems(&read, request.digest);
    problems.extend(read.problems.iter().cloned());
    let Header {
        board,
        spec,
        split_version,
        ..
    } = read.header;
    if split_version != SPLIT_VERSION {
        bail!(
            "the audit's split is version {split_version}, this nq builds version \
             {SPLIT_VERSION}: re-check it with an nq of the run's version"
        );
    }
    let mut out = io::stdout().lock();
    if request.verbose {
        writeln!(
            out,
            "audit of N = {}, split {}:{}, {} jobs, {} sub-problems; total {}, unique {}",
            board.n(),
            spec.ring,
            spec.extra,
            read.end.jobs,
            read.end.subproblems,
            read.end.total,
            read.end.unique.map_or("-".to_owned(), |u| u.to_string()),
        )?;
    }
    // The plan, and the sampled jobs' sub-problems, in one pass of the split.
    let (plan, subproblems, subs) = rebuild(board, spec, &read.sample);
    problems.extend(plan_problems(&read, plan, subproblems));
    let mut jobs: Vec<(Row, Vec<SubProblem>)> =
        read.sample.iter().copied().zip(subs).collect();
    jobs.sort_by_key(|(row, _)| row.job);
    if request.verbose && request.sample > 0 {
        writeln!(out, "{}", sample_line(&jobs, read.end.jobs, request.seed))?;
        out.flush()?;
    }
    let matched = solve(&jobs, spec, request, &mut out, &mut problems)?;
    let status = if problems.is_empty() {
        "match"
    } else {
        "MISMATCH"
    };
    writeln!(
        out,
        "recheck n={} digest={} total={} unique={} jobs={} sampled={} matched={} \
         seconds={:.3} status={status}",
        board.n(),
        show(&read.computed),
        read.end.total,
        read.end.unique.map_or("-".to_owned(), |u| u.to_string()),
        read.end.jobs,
        jobs.len(),
        matched,
        start.elapsed().as_secs_f64(),
    )?;
    out.flush()?;
    fail_on(&problems)
}

/// The digest checks: the file's content against its own digest line, and
/// against the published digest when one was given.
fn digest_problems(read: &Read, published: Option<[u8; 32]>) -> Vec<String> {
    let mut problems = Vec::new();
    if read.stated != read.computed {
        problems.push(format!(
            "the audit was edited: its content hashes to {}, but its digest line says {}",
            show(&read.computed),
            show(&read.stated)
        ));
    }
    if let Some(published) = published
        && published != read.computed
    {
        problems.push(format!(
            "the audit is not the published one: its content hashes to {}, but the \
             published digest (--digest) is {}",
            show(&read.computed),
            show(&published)
        ));
    }
    problems
}

/// The plan checks: the split enumerated here has the audit's number of
/// sub-problems, and their prefixes hash to the audit's `plan`.
fn plan_problems(read: &Read, plan: [u8; 32], subproblems: u64) -> Vec<String> {
    let Header { board, spec, .. } = read.header;
    let mut problems = Vec::new();
    if subproblems != read.end.subproblems {
        problems.push(format!(
            "the split {}:{} of N = {} has {subproblems} sub-problems, the audit's \
             jobs {}",
            spec.ring,
            spec.extra,
            board.n(),
            read.end.subproblems
        ));
    }
    if plan != read.end.plan {
        problems.push(format!(
            "the audit's jobs are not the split's sub-problems in plan order: their \
             prefixes hash to {}, the split's to {}",
            show(&read.end.plan),
            show(&plan)
        ));
    }
    problems
}

/// The `sample:` line: how many jobs of how many, the seed, and the first
/// [`LISTED`] ids (with `verbose`, each job also gets its own line later).
fn sample_line(jobs: &[(Row, Vec<SubProblem>)], of: u64, seed: &str) -> String {
    let mut ids: Vec<String> = jobs
        .iter()
        .take(LISTED)
        .map(|(r, _)| r.job.to_string())
        .collect();
    if jobs.len() > LISTED {
        ids.push(format!("… ({} more)", jobs.len() - LISTED));
    }
    format!(
        "sample: {} of {of} jobs by seed {seed:?}: {}",
        jobs.len(),
        ids.join(" ")
    )
}

/// Names every problem on stderr and fails, or succeeds when there is none.
fn fail_on(problems: &[String]) -> anyhow::Result<()> {
    if problems.is_empty() {
        return Ok(());
    }
    for p in problems {
        eprintln!("recheck: {p}");
    }
    bail!(
        "the audit failed {} check{}: do not trust it (each is listed above)",
        problems.len(),
        if problems.len() == 1 { "" } else { "s" }
    )
}

/// The lines of an audit, numbered, with the SHA-256 of every line but the
/// digest line.
struct Lines<R> {
    input: R,
    buf: Vec<u8>,
    number: u64,
    sha: Sha256,
}

impl<R: BufRead> Lines<R> {
    fn new(input: R) -> Lines<R> {
        Lines {
            input,
            buf: Vec::new(),
            number: 0,
            sha: Sha256::new(),
        }
    }

    /// The next line and its number, hashed unless it is the digest line or
    /// `hash` is false; `None` at the end of the file.
    fn next(&mut self, hash: bool) -> anyhow::Result<Option<(u64, String)>> {
        self.buf.clear();
        if self.input.read_until(b'\n', &mut self.buf)? == 0 {
            return Ok(None);
        }
        self.number += 1;
        let number = self.number;
        if self.buf.last() != Some(&b'\n') {
            bail!("line {number} does not end with a line break: the file is cut short");
        }
        if hash && !self.buf.starts_with(b"# digest=") {
            self.sha.update(&self.buf);
        }
        let line = std::str::from_utf8(&self.buf[..self.buf.len() - 1])
            .with_context(|| format!("line {number} is not UTF-8"))?;
        Ok(Some((number, line.to_owned())))
    }

    /// The next line, which must be there: `what` names it otherwise.
    fn expect(&mut self, what: &str) -> anyhow::Result<(u64, String)> {
        self.next(true)?
            .ok_or_else(|| anyhow::anyhow!("the file ends before its {what}"))
    }
}

/// The rows of an audit, as they are read: their order, their sums, the
/// first problems, and the sample with the least keys.
#[derive(Default)]
struct RowScan {
    rows: u64,
    settled: u64,
    /// Where the next job's sub-problems must start.
    next_first: u64,
    /// Jobs whose sub-problems do not start where the previous job's end.
    gaps: u64,
    /// The first job not settled, and its state.
    unsettled: Option<(u64, String)>,
    sums: Tally,
    /// The sampled jobs so far: the `sample` least keys, greatest on top.
    heap: BinaryHeap<Sampled>,
    problems: Vec<String>,
}

impl RowScan {
    /// Takes the row on line `n`.
    fn add(
        &mut self,
        n: u64,
        row: Row,
        state: String,
        seed: &str,
        sample: u64,
    ) -> anyhow::Result<()> {
        if row.job != self.rows {
            bail!(
                "line {n}: job {} where job {} was due: the rows are out of order",
                row.job,
                self.rows
            );
        }
        if row.first != self.next_first {
            self.gaps += 1;
            // A file of a million broken rows gets a readable report: the
            // first few, then their number.
            if self.gaps <= SHOWN {
                self.problems.push(format!(
                    "job {}: its sub-problems start at {}, but the jobs before it end \
                     at {}",
                    row.job, row.first, self.next_first
                ));
            }
        }
        if state == "settled" {
            self.settled += 1;
        } else if self.unsettled.is_none() {
            self.unsettled = Some((row.job, state));
        }
        self.sums
            .merge(&row.tally)
            .with_context(|| format!("line {n}: the counts overflow 128 bits"))?;
        self.next_first = row.first.saturating_add(row.subproblems);
        self.rows += 1;
        if sample > 0 {
            self.offer(row, seed, sample);
        }
        Ok(())
    }

    /// Keeps `row` in the sample if its key is among the `sample` least.
    fn offer(&mut self, row: Row, seed: &str, sample: u64) {
        let candidate = Sampled {
            key: sample_key(seed, row.job),
            job: row.job,
            row: RowKey {
                first: row.first,
                subproblems: row.subproblems,
                total: row.tally.total,
                burnside: row.tally.burnside,
            },
        };
        if (self.heap.len() as u64) < sample {
            self.heap.push(candidate);
        } else if self.heap.peek().is_some_and(|top| candidate < *top) {
            self.heap.pop();
            self.heap.push(candidate);
        }
    }

    /// The problems found, with the comparisons of what the rows add up to
    /// against what the header and the `end` line state.
    fn into_problems(mut self, header: &Header, end: &End) -> Vec<String> {
        if self.gaps > SHOWN {
            self.problems.push(format!(
                "… and {} more jobs whose sub-problems do not follow the previous job's",
                self.gaps - SHOWN
            ));
        }
        if let Some((job, state)) = &self.unsettled {
            self.problems.push(format!(
                "the audit is of an unfinished run: {} of {} jobs are settled \
                 (job {job} is {state}); re-check the audit of a finished run",
                self.settled, self.rows
            ));
        }
        let unique = self.sums.unique().ok();
        let compared = [
            ("jobs", header.jobs.to_string(), self.rows.to_string()),
            (
                "jobs (end line)",
                end.jobs.to_string(),
                self.rows.to_string(),
            ),
            (
                "settled jobs",
                end.settled.to_string(),
                self.settled.to_string(),
            ),
            (
                "sub-problems",
                end.subproblems.to_string(),
                self.next_first.to_string(),
            ),
            ("total", end.total.to_string(), self.sums.total.to_string()),
            (
                "burnside",
                end.burnside.to_string(),
                self.sums.burnside.to_string(),
            ),
            (
                "unique",
                end.unique.map_or("-".into(), |u| u.to_string()),
                unique.map_or("- (burnside is not a multiple of 8)".into(), |u| {
                    u.to_string()
                }),
            ),
        ];
        for (what, stated, rows) in compared {
            if stated != rows {
                self.problems.push(format!(
                    "the rows do not add up: the audit states {what} {stated}, its rows give {rows}"
                ));
            }
        }
        self.problems
    }

    /// The sample, least key first.
    fn sample(&self) -> Vec<Row> {
        let mut sample: Vec<Sampled> = self.heap.clone().into_vec();
        sample.sort();
        sample
            .into_iter()
            .map(|s| Row {
                job: s.job,
                first: s.row.first,
                subproblems: s.row.subproblems,
                tally: Tally {
                    total: s.row.total,
                    burnside: s.row.burnside,
                },
            })
            .collect()
    }
}

/// Reads the audit line by line: its header, rows, `end` line and digest,
/// hashing every byte before the digest line, checking the rows' order and
/// sums, and keeping the `sample` jobs with the least [`sample_key`]s.
///
/// # Errors
///
/// On a file that is not a complete `nq-audit v2`, naming the line.
fn read(input: impl BufRead, seed: &str, sample: u64) -> anyhow::Result<Read> {
    let mut lines = Lines::new(input);
    let (_, first) = lines.expect("first line")?;
    if first != format!("# {FORMAT}") {
        bail!(
            "line 1 is {first:?}, not \"# {FORMAT}\": this nq re-checks audits written \
             by `nq-coord audit` in format {FORMAT}"
        );
    }
    let (n, line) = lines.expect("header")?;
    let header = header(&line).with_context(|| format!("line {n}: {line:?}"))?;
    let (n, line) = lines.expect("column names")?;
    let columns = Columns::find(&line).with_context(|| format!("line {n}"))?;
    let mut scan = RowScan::default();
    let end = loop {
        let (n, line) = lines.expect("`# end` line")?;
        if let Some(rest) = line.strip_prefix("# end ") {
            break end_line(rest).with_context(|| format!("line {n}: {line:?}"))?;
        }
        let (row, state) = columns
            .row(&line)
            .with_context(|| format!("line {n}: {line:?}"))?;
        scan.add(n, row, state, seed, sample)?;
    };
    let (n, line) = lines.expect("`# digest=` line")?;
    let stated = line
        .strip_prefix("# digest=")
        .ok_or_else(|| anyhow::anyhow!("line {n} is {line:?}, not the `# digest=` line"))
        .and_then(|d| parse_digest(d).map_err(|e| anyhow::anyhow!("line {n}: {e}")))?;
    if let Some((n, _)) = lines.next(false)? {
        bail!("line {n} follows the digest line, which must be the last");
    }
    let sample = scan.sample();
    Ok(Read {
        problems: scan.into_problems(&header, &end),
        header,
        end,
        stated,
        computed: lines.sha.finalize().into(),
        sample,
    })
}

/// The `key=value` fields of a comment line, in order.
fn fields(line: &str) -> impl Iterator<Item = (&str, &str)> {
    line.split(' ').filter_map(|f| f.split_once('='))
}

/// The field `key` of a comment line, parsed.
fn field<T: std::str::FromStr>(line: &str, key: &str) -> anyhow::Result<T> {
    let (_, value) = fields(line)
        .find(|(k, _)| *k == key)
        .with_context(|| format!("no `{key}=` field"))?;
    value
        .parse()
        .map_err(|_| anyhow::anyhow!("`{key}={value}` is not a valid {key}"))
}

/// Parses the second line: `# n=.. split_version=.. split=R:E order=plan ..`.
fn header(line: &str) -> anyhow::Result<Header> {
    let line = line
        .strip_prefix("# ")
        .context("the second line must start with `# n=`")?;
    let n: u64 = field(line, "n")?;
    let board = Board::new(n).map_err(|e| anyhow::anyhow!("n={n}: {e}"))?;
    let split: String = field(line, "split")?;
    let (ring, extra) = split
        .split_once(':')
        .and_then(|(r, e)| Some((r.parse().ok()?, e.parse().ok()?)))
        .with_context(|| format!("`split={split}` is not RING:EXTRA"))?;
    let spec =
        SplitSpec::new(ring, extra).map_err(|e| anyhow::anyhow!("split={split}: {e}"))?;
    let order: String = field(line, "order")?;
    if order != "plan" {
        bail!("`order={order}`: this nq knows only `order=plan` (nq-core's split_each)");
    }
    Ok(Header {
        board,
        split_version: field(line, "split_version")?,
        spec,
        jobs: field(line, "jobs")?,
    })
}

/// Parses the fields of the `# end` line.
fn end_line(line: &str) -> anyhow::Result<End> {
    let unique: String = field(line, "unique")?;
    let plan: String = field(line, "plan")?;
    Ok(End {
        jobs: field(line, "jobs")?,
        settled: field(line, "settled")?,
        subproblems: field(line, "subproblems")?,
        total: field(line, "total")?,
        burnside: field(line, "burnside")?,
        unique: match unique.as_str() {
            "-" => None,
            u => Some(
                u.parse()
                    .map_err(|_| anyhow::anyhow!("`unique={u}` is not a count"))?,
            ),
        },
        plan: parse_digest(&plan).map_err(|e| anyhow::anyhow!("plan: {e}"))?,
    })
}

/// Where the columns a re-check reads are, found by name so that added
/// columns do not break it.
#[derive(Debug)]
struct Columns {
    job: usize,
    first: usize,
    subproblems: usize,
    state: usize,
    total: usize,
    burnside: usize,
    len: usize,
}

impl Columns {
    fn find(line: &str) -> anyhow::Result<Columns> {
        let names: Vec<&str> = line.split(',').collect();
        let at = |name: &str| {
            names
                .iter()
                .position(|n| *n == name)
                .with_context(|| format!("the column names lack `{name}`"))
        };
        Ok(Columns {
            job: at("job")?,
            first: at("first_subproblem")?,
            subproblems: at("subproblems")?,
            state: at("state")?,
            total: at("count_total")?,
            burnside: at("count_burnside")?,
            len: names.len(),
        })
    }

    /// One row: the job and its state.
    fn row(&self, line: &str) -> anyhow::Result<(Row, String)> {
        let cells = split_csv(line)?;
        if cells.len() != self.len {
            bail!(
                "{} fields where the column names give {}",
                cells.len(),
                self.len
            );
        }
        let num = |i: usize, what: &str| -> anyhow::Result<u128> {
            cells[i]
                .parse()
                .map_err(|_| anyhow::anyhow!("{what} `{}` is not a number", cells[i]))
        };
        let small = |i: usize, what: &str| -> anyhow::Result<u64> {
            Ok(u64::try_from(num(i, what)?)?)
        };
        let row = Row {
            job: small(self.job, "job")?,
            first: small(self.first, "first_subproblem")?,
            subproblems: small(self.subproblems, "subproblems")?,
            tally: Tally {
                total: num(self.total, "count_total")?,
                burnside: num(self.burnside, "count_burnside")?,
            },
        };
        if row.subproblems == 0 {
            bail!("job {} has no sub-problems", row.job);
        }
        Ok((row, cells[self.state].clone()))
    }
}

/// Splits one CSV line into its fields (RFC 4180 quoting: `"a,b"`, `""`
/// for a quote inside quotes).
fn split_csv(line: &str) -> anyhow::Result<Vec<String>> {
    let mut fields = vec![String::new()];
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        let field = fields.last_mut().expect("never empty");
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (false, '"') if field.is_empty() => quoted = true,
            (false, ',') => fields.push(String::new()),
            (_, c) => field.push(c),
        }
    }
    if quoted {
        bail!("a quoted field is not closed");
    }
    Ok(fields)
}

/// Enumerates the split in plan order: the SHA-256 of every prefix, the
/// number of sub-problems, and the sub-problems of each `sample` row (in the
/// sample's order). Memory: the sample's sub-problems only.
fn rebuild(
    board: Board,
    spec: SplitSpec,
    sample: &[Row],
) -> ([u8; 32], u64, Vec<Vec<SubProblem>>) {
    let mut by_first: Vec<(usize, &Row)> = sample.iter().enumerate().collect();
    by_first.sort_by_key(|(_, r)| r.first);
    let mut subs = vec![Vec::new(); sample.len()];
    let mut sha = Sha256::new();
    let mut index = 0u64;
    // `by_first[at..]` are the sampled jobs not yet passed.
    let mut at = 0;
    let _ = split_each(board, spec, &mut |sub| {
        sha.update(sub.prefix().rows());
        while at < by_first.len()
            && by_first[at].1.first + by_first[at].1.subproblems <= index
        {
            at += 1;
        }
        // Jobs tile the split, so at most one sampled job holds `index`;
        // an audit whose rows overlap is reported by `read` and may put a
        // sub-problem in two jobs here, which only makes them differ.
        for (slot, row) in &by_first[at..] {
            if row.first > index {
                break;
            }
            if index < row.first + row.subproblems {
                subs[*slot].push(sub);
            }
        }
        index += 1;
        ControlFlow::Continue(())
    });
    (sha.finalize().into(), index, subs)
}

/// What the pool's threads send back: the job's place and how it ended.
struct Finished(usize, JobOutcome);

/// A job's sink: forwards its outcome, tagged with its place in the sample.
struct ToChannel {
    slot: usize,
    tx: mpsc::Sender<Finished>,
}

impl JobSink for ToChannel {
    fn done(&self, outcome: JobOutcome) {
        // A send fails only when the reading thread has given up.
        let _ = self.tx.send(Finished(self.slot, outcome));
    }
}

/// Solves the sampled jobs on a pool, checks and folds each one's counts, and
/// compares its tally with its row. Returns how many matched; a mismatch is
/// pushed to `problems`, naming the job.
fn solve(
    jobs: &[(Row, Vec<SubProblem>)],
    spec: SplitSpec,
    request: &Request<'_>,
    out: &mut impl Write,
    problems: &mut Vec<String>,
) -> anyhow::Result<usize> {
    if jobs.is_empty() {
        return Ok(0);
    }
    nq_core::split::check_kernel(request.kernel)
        .context("the count kernel failed its startup check")?;
    let pool =
        Pool::new(request.threads, "nq-recheck").context("cannot start the threads")?;
    let (tx, rx) = mpsc::channel();
    for (slot, (_, subs)) in jobs.iter().enumerate() {
        pool.submit(Job {
            subproblems: subs.clone(),
            list_solutions: false,
            kernel: request.kernel,
            stop: Arc::new(AtomicBool::new(false)),
            sink: Arc::new(ToChannel {
                slot,
                tx: tx.clone(),
            }),
        });
    }
    // The jobs hold the only senders: if every thread died, the channel
    // disconnects instead of hanging.
    drop(tx);
    let mut matched = 0;
    for _ in jobs {
        let Finished(slot, outcome) = rx
            .recv()
            .context("the re-check stopped before it finished: a thread failed")?;
        let (row, subs) = &jobs[slot];
        let JobOutcome::Done { counts, .. } = outcome else {
            bail!("job {} was cancelled before it finished", row.job);
        };
        let mut tally = Tally::default();
        let mut invalid = None;
        for (sub, c) in subs.iter().zip(&counts) {
            if let Err(e) = sub.check(spec, c).and_then(|()| tally.add(sub, c)) {
                invalid = Some(e);
                break;
            }
        }
        let verdict = if let Some(e) = invalid {
            problems.push(format!(
                "job {}: the count computed here is invalid: {e}",
                row.job
            ));
            "INVALID"
        } else if counts.len() != subs.len() || subs.len() as u64 != row.subproblems {
            problems.push(format!(
                "job {}: {} sub-problems rebuilt, {} counted, the audit says {}",
                row.job,
                subs.len(),
                counts.len(),
                row.subproblems
            ));
            "MISMATCH"
        } else if tally != row.tally {
            problems.push(format!(
                "job {} (sub-problems {}..{}): the audit says count_total {} and \
                 count_burnside {}, this machine computed {} and {}",
                row.job,
                row.first,
                row.first + row.subproblems,
                row.tally.total,
                row.tally.burnside,
                tally.total,
                tally.burnside
            ));
            "MISMATCH"
        } else {
            matched += 1;
            "match"
        };
        if request.verbose {
            writeln!(
                out,
                "job {} (sub-problems {}..{}): count_total {} count_burnside {}: {verdict}",
                row.job,
                row.first,
                row.first + row.subproblems,
                tally.total,
                tally.burnside
            )?;
            out.flush()?;
        }
    }
    Ok(matched)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_key_is_the_documented_hash() {
        // printf 'nq-recheck:%s:%d' record-2026 17 | sha256sum | cut -c1-16
        let hash = Sha256::digest(b"nq-recheck:record-2026:17");
        let want = u64::from_str_radix(
            &hash[..8]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>(),
            16,
        )
        .unwrap();
        assert_eq!(sample_key("record-2026", 17), want);
        assert_ne!(sample_key("record-2026", 17), sample_key("record-2027", 17));
    }

    #[test]
    fn digests_parse_with_or_without_their_prefix_and_name_the_form() {
        let hex = "ab".repeat(32);
        assert_eq!(parse_digest(&format!("sha256:{hex}")), Ok([0xab; 32]));
        assert_eq!(parse_digest(&hex), Ok([0xab; 32]));
        assert_eq!(show(&[0xab; 32]), format!("sha256:{hex}"));
        assert!(
            parse_digest("sha256:abc")
                .unwrap_err()
                .contains("64 hex digits")
        );
        assert!(
            parse_digest(&"zz".repeat(32))
                .unwrap_err()
                .contains("64 hex digits")
        );
    }

    #[test]
    fn csv_fields_are_unquoted() {
        assert_eq!(
            split_csv(r#"1,"a,b","say ""hi""",,x"#).unwrap(),
            ["1", "a,b", "say \"hi\"", "", "x"]
        );
        assert!(split_csv(r#"1,"open"#).is_err());
    }

    /// A small audit written by hand: 3 jobs of N = 6's border split.
    fn audit(rows: &[&str], end: &str) -> Vec<u8> {
        let mut body = String::from(
            "# nq-audit v2\n# n=6 split_version=1 split=0:0 order=plan solutions=off jobs=3 run=t\n\
             job,first_subproblem,subproblems,state,count_total,count_burnside\n",
        );
        for r in rows {
            body.push_str(r);
            body.push('\n');
        }
        body.push_str(end);
        body.push('\n');
        let digest = show(&Sha256::digest(body.as_bytes()).into());
        body.push_str(&format!("# digest={digest}\n"));
        body.into_bytes()
    }

    const PLAN: &str =
        "sha256:0000000000000000000000000000000000000000000000000000000000000000";

    #[test]
    fn reading_checks_the_order_and_the_sums() {
        let end = format!(
            "# end jobs=3 settled=3 subproblems=4 total=4 burnside=8 unique=1 plan={PLAN}"
        );
        let good = audit(
            &[
                "0,0,1,settled,1,2",
                "1,1,2,settled,2,4",
                "2,3,1,settled,1,2",
            ],
            &end,
        );
        let read = read(&good[..], "s", 2).unwrap();
        assert_eq!(read.stated, read.computed);
        assert!(read.problems.is_empty(), "{:?}", read.problems);
        assert_eq!(read.sample.len(), 2);
        let mut keys: Vec<u64> = (0..3).map(|j| sample_key("s", j)).collect();
        keys.sort_unstable();
        assert_eq!(sample_key("s", read.sample[0].job), keys[0]);
        assert_eq!(sample_key("s", read.sample[1].job), keys[1]);

        // A count changed and the digest made again: the sums catch it.
        let edited = audit(
            &[
                "0,0,1,settled,1,2",
                "1,1,2,settled,3,4",
                "2,3,1,settled,1,2",
            ],
            &end,
        );
        let read = super::read(&edited[..], "s", 2).unwrap();
        assert!(
            read.problems
                .iter()
                .any(|p| p.contains("total 4, its rows give 5")),
            "{:?}",
            read.problems
        );
        // An unfinished run.
        let pending = audit(
            &[
                "0,0,1,settled,1,2",
                "1,1,2,pending,0,0",
                "2,3,1,settled,1,2",
            ],
            &end,
        );
        let read = super::read(&pending[..], "s", 0).unwrap();
        assert!(
            read.problems.iter().any(|p| p
                .contains("unfinished run: 2 of 3 jobs are settled (job 1 is pending)")),
            "{:?}",
            read.problems
        );
        // A gap in the tiling.
        let gap = audit(
            &[
                "0,0,1,settled,1,2",
                "1,2,2,settled,2,4",
                "2,3,1,settled,1,2",
            ],
            &end,
        );
        let read = super::read(&gap[..], "s", 0).unwrap();
        assert!(
            read.problems
                .iter()
                .any(|p| p.contains("job 1: its sub-problems start at 2"))
        );
    }

    #[test]
    fn a_file_that_is_not_a_whole_audit_is_refused_with_its_line() {
        let end = format!(
            "# end jobs=1 settled=1 subproblems=1 total=4 burnside=8 unique=1 plan={PLAN}"
        );
        let good = audit(&["0,0,1,settled,4,8"], &end);
        let cut = &good[..good.len() - 10];
        assert!(format!("{:#}", read(cut, "s", 1).unwrap_err()).contains("cut short"));
        let mut trailing = good.clone();
        trailing.extend_from_slice(b"0,0,1,settled,4,8\n");
        assert!(
            format!("{:#}", read(&trailing[..], "s", 1).unwrap_err())
                .contains("must be the last")
        );
        let v1 = b"job,subproblems\n0,1\n";
        assert!(
            format!("{:#}", read(&v1[..], "s", 1).unwrap_err()).contains("nq-audit v2")
        );
        let mut bad = String::from_utf8(good).unwrap();
        bad = bad.replace("0,0,1,settled,4,8", "0,0,1,settled,four,8");
        assert!(
            format!("{:#}", read(bad.as_bytes(), "s", 1).unwrap_err()).contains("line 4")
        );
    }
}

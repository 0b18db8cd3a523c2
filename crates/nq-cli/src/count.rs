//! `nq count`: split → pool → tally on this machine, with a progress bar.

use std::cmp::Reverse;
use std::io::{self, IsTerminal, Write};
use std::num::NonZero;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use nq_core::Board;
use nq_core::pool::{Job, JobOutcome, JobSink, Pool};
use nq_core::search::{CountStats, Kernel};
use nq_core::split::{SplitSpec, SubCounts, SubProblem, Tally, split};

use nq_core::published;

/// The default split aims at this many sub-problems per thread, so that the
/// dynamic queue can even out their very different sizes.
const SUBPROBLEMS_PER_THREAD: u64 = 64;

/// A bar appears only for counts that last longer than this.
const BAR_DELAY: Duration = Duration::from_secs(1);

/// Counts the solutions of `board` on `threads` threads (all cores when
/// `None`) and prints them, as text or as one JSON object.
///
/// # Errors
///
/// When the threads cannot start, a thread dies, a count breaks an invariant,
/// or the result differs from the published value (after printing it).
pub(crate) fn run(
    board: Board,
    threads: Option<u32>,
    spec: Option<SplitSpec>,
    kernel: Kernel,
    json: bool,
) -> anyhow::Result<()> {
    let start = Instant::now();
    let threads = match threads {
        Some(t) => t as usize,
        None => std::thread::available_parallelism().map_or(1, NonZero::get),
    };
    let spec = spec.unwrap_or_else(|| {
        SplitSpec::for_count(board, SUBPROBLEMS_PER_THREAD * threads as u64)
    });
    let counted = count(board, threads, spec, kernel, start)?;
    let report = Report {
        n: board.n(),
        counted,
        seconds: start.elapsed().as_secs_f64(),
        threads,
        spec,
        kernel: kernel.resolved_name(),
    };
    let mut out = io::stdout().lock();
    let matches = report.write(&mut out, json)?;
    out.flush()?;
    if matches == Some(false) {
        bail!(
            "the count of N = {} differs from the published value",
            report.n
        );
    }
    Ok(())
}

/// What a count found.
struct Counted {
    total: u128,
    unique: u128,
    subproblems: usize,
    /// Search nodes over every sub-problem (`nq_core::search::CountStats`):
    /// the same number on every kernel, so their rates compare.
    nodes: u128,
}

/// A finished count and how it ran, for printing.
struct Report {
    n: u8,
    counted: Counted,
    seconds: f64,
    threads: usize,
    spec: SplitSpec,
    /// The count kernel that ran the large searches.
    kernel: &'static str,
}

impl Report {
    /// Prints the report as text, or as one JSON object, and returns whether
    /// the counts match the published ones (`None`: nothing published).
    fn write(&self, out: &mut impl Write, json: bool) -> io::Result<Option<bool>> {
        let Report {
            n,
            counted: c,
            seconds,
            threads,
            spec,
            kernel,
        } = self;
        let published = published::published(*n);
        let matches = published.map(|p| p == (c.total, c.unique));
        // All threads together, over the whole run (split and start-up check
        // included), so that it is what a user of the machine gets.
        let rate = if *seconds > 0.0 {
            c.nodes as f64 / seconds
        } else {
            0.0
        };
        if json {
            // Written by hand: the counts are u128, which serde_json's `Value`
            // cannot hold exactly without arbitrary precision; `Display` of a
            // u128 is exact, and a JSON number has no size limit.
            let matched = matches.map_or("null".to_string(), |m| m.to_string());
            writeln!(
                out,
                "{{\"n\":{n},\"total\":{},\"unique\":{},\"seconds\":{seconds:.6},\
                 \"threads\":{threads},\"subproblems\":{},\"kernel\":\"{kernel}\",\
                 \"published_match\":{matched},\"nodes\":{},\"nodes_per_second\":{rate:.0}}}",
                c.total, c.unique, c.subproblems, c.nodes
            )?;
            return Ok(matches);
        }
        writeln!(out, "N = {n}")?;
        writeln!(out, "total:     {}", c.total)?;
        writeln!(out, "unique:    {}", c.unique)?;
        let plural = if *threads == 1 { "" } else { "s" };
        writeln!(
            out,
            "time:      {seconds:.3} s on {threads} thread{plural}, {} sub-problems \
             (split {}:{}, {kernel} kernel)",
            c.subproblems, spec.ring, spec.extra
        )?;
        writeln!(out, "nodes:     {} ({} per second)", c.nodes, compact(rate))?;
        match published {
            None => writeln!(
                out,
                "published: no published value (OEIS A000170 ends at N = {})",
                published::LARGEST
            )?,
            Some(_) if matches == Some(true) => {
                writeln!(out, "published: matches OEIS A000170 and A002562")?
            }
            Some((total, unique)) => writeln!(
                out,
                "published: DIFFERS from OEIS A000170 = {total}, A002562 = {unique}"
            )?,
        }
        Ok(matches)
    }
}

/// What the pool's threads tell the counting thread.
enum Event {
    /// One sub-problem is solved: its index in the job, its counts and its
    /// search nodes.
    Solved {
        sub: usize,
        counts: SubCounts,
        nodes: u64,
    },
    /// The job is over.
    Done(JobOutcome),
}

/// The job's sink: forwards everything to the counting thread.
struct ToChannel(mpsc::Sender<Event>);

impl JobSink for ToChannel {
    fn solved(&self, sub: usize, counts: &SubCounts, stats: &CountStats) {
        // A send fails only when the counting thread has given up (after an
        // error); the result is then unwanted.
        let _ = self.0.send(Event::Solved {
            sub,
            counts: *counts,
            nodes: stats.nodes,
        });
    }

    fn done(&self, outcome: JobOutcome) {
        let _ = self.0.send(Event::Done(outcome));
    }
}

fn count(
    board: Board,
    threads: usize,
    spec: SplitSpec,
    kernel: Kernel,
    start: Instant,
) -> anyhow::Result<Counted> {
    let mut subs: Vec<(u64, SubProblem)> = split(board, spec)
        .into_iter()
        .map(|s| (s.estimate(), s))
        .collect();
    // Biggest first: the longest sub-problems start at once and the small ones
    // fill the gaps at the end, which shortens the tail.
    subs.sort_by_key(|&(estimate, _)| Reverse(estimate));
    let (estimates, subs): (Vec<u64>, Vec<SubProblem>) = subs.into_iter().unzip();
    let work = estimates.iter().fold(0u64, |a, &e| a.saturating_add(e));

    nq_core::split::check_kernel(kernel)
        .context("the count kernel failed its startup check")?;
    let pool = Pool::new(threads, "nq-count").context("cannot start the threads")?;
    let (tx, rx) = mpsc::channel();
    // One job: the pool hands its sub-problems to the threads one at a time, in
    // this order, so a thread that finishes early takes the next at once.
    pool.submit(Job {
        subproblems: subs.clone(),
        list_solutions: false,
        kernel,
        stop: Arc::new(AtomicBool::new(false)),
        sink: Arc::new(ToChannel(tx)),
    });
    // The job holds the only sender: if every thread died, the channel
    // disconnects instead of hanging.

    let mut progress = Progress::new(work, start);
    let mut tally = Tally::default();
    let mut solved = 0usize;
    // u128: a whole count at N = 28 visits more than 2^64 nodes.
    let mut total_nodes = 0u128;
    loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            // Folded as they come, for the running total on the bar; each is
            // checked first, so an impossible count stops the run.
            Ok(Event::Solved { sub, counts, nodes }) => {
                total_nodes += u128::from(nodes);
                let sub_problem = &subs[sub];
                sub_problem.check(spec, &counts)?;
                tally.add(sub_problem, &counts)?;
                solved += 1;
                progress.advance(estimates[sub], tally.total);
            }
            Ok(Event::Done(JobOutcome::Done { .. })) => break,
            Ok(Event::Done(JobOutcome::Cancelled)) => {
                bail!("the count was cancelled before it finished")
            }
            // Long sub-problems send nothing for a while; the bar still
            // appears on time and its clock keeps running.
            Err(mpsc::RecvTimeoutError::Timeout) => progress.tick(),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                bail!("the count stopped before it finished: a counting thread failed")
            }
        }
    }
    progress.finish();
    // The pool sends a sub-problem's `solved` before it counts it as finished,
    // and `done` only after the last is counted, so every `solved` is on the
    // channel before `done`: a shortfall is a pool bug, not a race.
    if solved != subs.len() {
        bail!(
            "the pool reported {solved} of {} sub-problems solved",
            subs.len()
        );
    }
    Ok(Counted {
        total: tally.total,
        unique: tally.unique()?,
        subproblems: subs.len(),
        nodes: total_nodes,
    })
}

/// The progress bar on stderr: only on a terminal, and only once the count has
/// run for [`BAR_DELAY`]. Progress is estimated work, not sub-problems, since
/// sub-problems differ in size by orders of magnitude.
struct Progress {
    bar: ProgressBar,
    start: Instant,
    /// True once the bar draws (or once it is known that it never will).
    decided: bool,
    /// Solutions so far, for the message.
    total: u128,
}

impl Progress {
    fn new(work: u64, start: Instant) -> Progress {
        let bar = ProgressBar::with_draw_target(Some(work), ProgressDrawTarget::hidden());
        let style = ProgressStyle::with_template(
            "{elapsed_precise} [{wide_bar}] {percent:>3}%  {eta_if_known}  {msg}",
        )
        .expect("the template is valid")
        .with_key(
            "eta_if_known",
            |state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                let text = eta_text(state.pos(), state.per_sec(), state.eta());
                let _ = w.write_str(&text);
            },
        )
        .progress_chars("=> ");
        bar.set_style(style);
        Progress {
            bar,
            start,
            decided: false,
            total: 0,
        }
    }

    /// Records `work` units done and the running total.
    fn advance(&mut self, work: u64, total: u128) {
        self.total = total;
        self.bar.inc(work);
        self.tick();
    }

    /// Shows the bar once the delay has passed, and refreshes the message.
    fn tick(&mut self) {
        let elapsed = self.start.elapsed();
        if !self.decided && elapsed >= BAR_DELAY {
            self.decided = true;
            if io::stderr().is_terminal() {
                self.bar.set_draw_target(ProgressDrawTarget::stderr());
            }
        }
        if self.decided {
            let rate = self.total as f64 / elapsed.as_secs_f64();
            self.bar.set_message(format!(
                "{} solutions, {}/s",
                compact(self.total as f64),
                compact(rate)
            ));
        }
    }

    fn finish(self) {
        self.bar.finish_and_clear();
    }
}

/// The bar's ETA: empty until some work is done at a measured rate.
/// indicatif's own `{eta}` says "0s" while it has no rate, which reads as
/// "almost done" at 0 %.
fn eta_text(pos: u64, per_sec: f64, eta: Duration) -> String {
    if pos == 0 || !per_sec.is_finite() || per_sec <= 0.0 {
        return String::new();
    }
    format!("ETA {:#}", indicatif::HumanDuration(eta))
}

/// `1234567` → `1.23M`: short enough for a progress line. Only for display;
/// results are always printed in full.
fn compact(x: f64) -> String {
    const UNITS: [&str; 7] = ["", "k", "M", "G", "T", "P", "E"];
    let mut x = x;
    for unit in UNITS {
        if x < 1000.0 {
            return match unit {
                "" => format!("{x:.0}"),
                _ => format!("{x:.2}{unit}"),
            };
        }
        x /= 1000.0;
    }
    format!("{:.2e}", x * 1e21)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_eta_is_shown_until_there_is_a_rate() {
        assert_eq!(eta_text(0, 0.0, Duration::ZERO), "");
        assert_eq!(eta_text(0, 5.0, Duration::ZERO), "");
        assert_eq!(eta_text(10, 0.0, Duration::ZERO), "");
        assert_eq!(eta_text(10, f64::NAN, Duration::ZERO), "");
        // The same compact form as indicatif's own `{eta}`.
        assert_eq!(eta_text(10, 2.0, Duration::from_secs(120)), "ETA 2m");
    }

    #[test]
    fn compact_numbers() {
        assert_eq!(compact(0.0), "0");
        assert_eq!(compact(999.0), "999");
        assert_eq!(compact(14_200.0), "14.20k");
        assert_eq!(compact(2.349e17), "234.90P");
        assert_eq!(compact(2.0e21), "2.00e21");
    }

    fn report(n: u8, total: u128, unique: u128, json: bool) -> (String, Option<bool>) {
        let report = Report {
            n,
            counted: Counted {
                total,
                unique,
                subproblems: 7,
                nodes: 3_000,
            },
            seconds: 1.5,
            threads: 1,
            spec: SplitSpec::new(1, 0).unwrap(),
            kernel: "scalar",
        };
        let mut out = vec![];
        let matches = report.write(&mut out, json).unwrap();
        (String::from_utf8(out).unwrap(), matches)
    }

    #[test]
    fn reports_say_whether_the_counts_match() {
        let (text, m) = report(8, 92, 12, false);
        assert_eq!(m, Some(true));
        assert!(text.contains("matches OEIS"), "{text}");
        let (text, m) = report(8, 92, 11, false);
        assert_eq!(m, Some(false));
        assert!(
            text.contains("DIFFERS from OEIS A000170 = 92, A002562 = 12"),
            "{text}"
        );
        let (text, m) = report(28, 1, 1, false);
        assert_eq!(m, None);
        assert!(text.contains("no published value"), "{text}");
        assert!(
            text.contains("on 1 thread, 7 sub-problems (split 1:0, scalar kernel)"),
            "{text}"
        );
    }

    #[test]
    fn json_prints_128_bit_counts_exactly() {
        let (json, m) = report(32, u128::MAX, u128::MAX / 8, true);
        assert_eq!(m, None);
        assert_eq!(
            json,
            format!(
                "{{\"n\":32,\"total\":{},\"unique\":{},\"seconds\":1.500000,\
                 \"threads\":1,\"subproblems\":7,\"kernel\":\"scalar\",\"published_match\":null,\
                 \"nodes\":3000,\"nodes_per_second\":2000}}\n",
                u128::MAX,
                u128::MAX / 8
            )
        );
        assert!(json.contains("340282366920938463463374607431768211455"));
        // Valid JSON (serde_json reads the big numbers as floats; the text is
        // what matters above).
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["published_match"], serde_json::Value::Null);
        let (json, _) = report(8, 92, 12, true);
        assert!(json.contains("\"published_match\":true"), "{json}");
    }

    #[test]
    fn counts_match_the_published_values_up_to_12() {
        for n in 1..=12 {
            let board = Board::new(n).unwrap();
            for (threads, kernel) in
                [(1, Kernel::Auto), (3, Kernel::Auto), (2, Kernel::Scalar)]
            {
                let spec = SplitSpec::for_count(board, 64 * threads as u64);
                let c = count(board, threads, spec, kernel, Instant::now()).unwrap();
                let want = published::published(board.n()).unwrap();
                assert_eq!(
                    (c.total, c.unique),
                    want,
                    "n={n} threads={threads} {kernel:?}"
                );
            }
        }
    }
}

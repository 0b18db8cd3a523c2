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

use crate::forecast::{self, Forecast};
use crate::interrupt::{Interrupt, Interrupted};

/// The default split aims at this many sub-problems per thread, so that the
/// dynamic queue can even out their very different sizes.
const SUBPROBLEMS_PER_THREAD: u64 = 64;

/// A bar appears only for counts that last longer than this.
const BAR_DELAY: Duration = Duration::from_secs(1);

/// A count forecast to take at least this long says so before it starts.
const ANNOUNCE_FROM: Duration = Duration::from_secs(60);

/// Counts the solutions of `board` on `threads` threads (all cores when
/// `None`) and prints them, as text or as one JSON object.
///
/// A count forecast to take over [`ANNOUNCE_FROM`] says so on stderr before
/// it starts. Ctrl-C stops it: it then prints on stderr what it counted and
/// how much of the estimated work that was, and ends with
/// [`Interrupted`].
///
/// # Errors
///
/// When the threads cannot start, a thread dies, a count breaks an invariant,
/// the result differs from the published value (after printing it), or a
/// signal stopped the count ([`Interrupted`]).
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
    let stop = Arc::new(AtomicBool::new(false));
    let interrupt = Interrupt::listen(Arc::clone(&stop))?;
    nq_core::split::check_kernel(kernel)
        .context("the count kernel failed its startup check")?;
    let forecast = forecast::forecast(board, threads, kernel, ANNOUNCE_FROM);
    if let Some(f) = forecast
        && f.seconds >= ANNOUNCE_FROM.as_secs_f64()
    {
        eprintln!("{}", announce(board.n(), threads, f));
    }
    let spec = spec.unwrap_or_else(|| {
        SplitSpec::for_count(board, SUBPROBLEMS_PER_THREAD * threads as u64)
    });
    let counted = match count(board, threads, spec, kernel, start, &stop, forecast)? {
        Finished::Counted(counted) => counted,
        Finished::Stopped(partial) if interrupt.signalled() => {
            eprintln!("{}", partial.describe(board.n(), start.elapsed()));
            return Err(Interrupted.into());
        }
        Finished::Stopped(_) => bail!("the count was cancelled before it finished"),
    };
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

/// The line that announces a long count, before it starts.
fn announce(n: u8, threads: usize, f: Forecast) -> String {
    let plural = if threads == 1 { "" } else { "s" };
    format!(
        "nq: N = {n} will take about {} on {threads} thread{plural} ({} of one core, \
         forecast from a count of N = {} on this machine); Ctrl-C stops it and prints \
         what it counted",
        forecast::human(f.seconds),
        forecast::human(f.core_seconds),
        forecast::REFERENCE,
    )
}

/// How a count ended, short of an error.
enum Finished {
    /// Every sub-problem is counted.
    Counted(Counted),
    /// The stop flag ended it first.
    Stopped(Partial),
}

/// What a stopped count had counted.
#[derive(Debug, PartialEq)]
struct Partial {
    /// Solutions of the sub-problems counted (each weighted by its symmetry
    /// class, as in the total).
    total: u128,
    /// Sub-problems counted, of `subproblems`.
    solved: usize,
    subproblems: usize,
    /// Estimated work of the counted sub-problems, of `work`.
    done: u128,
    work: u128,
}

impl Partial {
    /// What the user reads after Ctrl-C.
    fn describe(&self, n: u8, elapsed: Duration) -> String {
        format!(
            "nq: interrupted after {:.1} s, with {} of the estimated work done: {} of {} \
             sub-problems counted, holding {} of the solutions of N = {n} (not the total: \
             the rest were not counted)",
            elapsed.as_secs_f64(),
            percent(self.done, self.work),
            self.solved,
            self.subproblems,
            self.total,
        )
    }
}

/// `part / whole` as a percentage for a person: `12.34 %`, and for the tiny
/// shares of a huge count `3.1e-9 %` rather than `0.00 %`.
fn percent(part: u128, whole: u128) -> String {
    if whole == 0 || part == 0 {
        return "0 %".to_owned();
    }
    let p = part as f64 / whole as f64 * 100.0;
    if p >= 0.01 {
        format!("{p:.2} %")
    } else {
        format!("{p:.1e} %")
    }
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
    stop: &Arc<AtomicBool>,
    forecast: Option<Forecast>,
) -> anyhow::Result<Finished> {
    let mut subs: Vec<(u64, SubProblem)> = split(board, spec)
        .into_iter()
        .map(|s| (s.estimate(), s))
        .collect();
    // Biggest first: the longest sub-problems start at once and the small ones
    // fill the gaps at the end, which shortens the tail.
    subs.sort_by_key(|&(estimate, _)| Reverse(estimate));
    let (estimates, subs): (Vec<u64>, Vec<SubProblem>) = subs.into_iter().unzip();
    // u128: at N = 32 the estimates add up to more than 2^64.
    let work: u128 = estimates.iter().map(|&e| u128::from(e)).sum();

    let pool = Pool::new(threads, "nq-count").context("cannot start the threads")?;
    let (tx, rx) = mpsc::channel();
    // One job: the pool hands its sub-problems to the threads one at a time, in
    // this order, so a thread that finishes early takes the next at once.
    pool.submit(Job {
        subproblems: subs.clone(),
        list_solutions: false,
        kernel,
        stop: Arc::clone(stop),
        sink: Arc::new(ToChannel(tx)),
    });
    // The job holds the only sender: if every thread died, the channel
    // disconnects instead of hanging.

    let mut progress = Progress::new(work, start, forecast);
    let mut tally = Tally::default();
    let mut solved = 0usize;
    let mut done = 0u128;
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
                done += u128::from(estimates[sub]);
                progress.advance(done, tally.total);
            }
            Ok(Event::Done(JobOutcome::Done { .. })) => break,
            Ok(Event::Done(JobOutcome::Cancelled)) => {
                progress.finish();
                return Ok(Finished::Stopped(Partial {
                    total: tally.total,
                    solved,
                    subproblems: subs.len(),
                    done,
                    work,
                }));
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
    Ok(Finished::Counted(Counted {
        total: tally.total,
        unique: tally.unique()?,
        subproblems: subs.len(),
        nodes: total_nodes,
    }))
}

/// The bar's length: progress is shown in millionths of the estimated work,
/// which is a `u128` while indicatif counts in `u64`.
const BAR_UNITS: u64 = 1_000_000;

/// The progress bar on stderr: only on a terminal, and only once the count has
/// run for [`BAR_DELAY`]. Progress is estimated work, not sub-problems, since
/// sub-problems differ in size by orders of magnitude.
struct Progress {
    bar: ProgressBar,
    start: Instant,
    /// The estimated work of the whole count.
    work: u128,
    /// True once the bar draws (or once it is known that it never will).
    decided: bool,
    /// Solutions so far, for the message.
    total: u128,
}

impl Progress {
    fn new(work: u128, start: Instant, forecast: Option<Forecast>) -> Progress {
        let bar =
            ProgressBar::with_draw_target(Some(BAR_UNITS), ProgressDrawTarget::hidden());
        // Until a sub-problem is done there is no rate to measure, and at a
        // large N that lasts: the forecast stands in.
        let forecast_end = forecast.map(|f| start + Duration::from_secs_f64(f.seconds));
        let style = ProgressStyle::with_template(
            "{elapsed_precise} [{wide_bar}] {percent:>3}%  {eta_if_known}  {msg}",
        )
        .expect("the template is valid")
        .with_key(
            "eta_if_known",
            move |state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                let forecast_left =
                    forecast_end.map(|end| end.saturating_duration_since(Instant::now()));
                let text =
                    eta_text(state.pos(), state.per_sec(), state.eta(), forecast_left);
                let _ = w.write_str(&text);
            },
        )
        .progress_chars("=> ");
        bar.set_style(style);
        Progress {
            bar,
            start,
            work,
            decided: false,
            total: 0,
        }
    }

    /// Records the estimated work `done` so far and the running total.
    fn advance(&mut self, done: u128, total: u128) {
        self.total = total;
        let units = done * u128::from(BAR_UNITS) / self.work.max(1);
        self.bar
            .set_position(u64::try_from(units).unwrap_or(BAR_UNITS).min(BAR_UNITS));
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

/// The bar's ETA: from the measured rate once some work is done, else what
/// is left of the forecast (`forecast_left`), else nothing. indicatif's own
/// `{eta}` says "0s" while it has no rate, which reads as "almost done" at
/// 0 %.
fn eta_text(
    pos: u64,
    per_sec: f64,
    eta: Duration,
    forecast_left: Option<Duration>,
) -> String {
    if pos == 0 || !per_sec.is_finite() || per_sec <= 0.0 {
        return match forecast_left {
            Some(left) => {
                format!("ETA ~{} (forecast)", forecast::human(left.as_secs_f64()))
            }
            None => String::new(),
        };
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
        assert_eq!(eta_text(0, 0.0, Duration::ZERO, None), "");
        assert_eq!(eta_text(0, 5.0, Duration::ZERO, None), "");
        assert_eq!(eta_text(10, 0.0, Duration::ZERO, None), "");
        assert_eq!(eta_text(10, f64::NAN, Duration::ZERO, None), "");
        // The same compact form as indicatif's own `{eta}`.
        assert_eq!(eta_text(10, 2.0, Duration::from_secs(120), None), "ETA 2m");
        // Before the first rate, the forecast; after it, the rate.
        let left = Some(Duration::from_secs(3 * 3600));
        assert_eq!(
            eta_text(0, 0.0, Duration::ZERO, left),
            "ETA ~3.0 h (forecast)"
        );
        assert_eq!(eta_text(10, 2.0, Duration::from_secs(120), left), "ETA 2m");
    }

    #[test]
    fn a_stopped_count_says_how_far_it_got() {
        let board = Board::new(12).unwrap();
        let spec = SplitSpec::for_count(board, 64);
        // Stopped before it starts: nothing, or next to nothing, is counted,
        // and what is reported adds up.
        let stop = Arc::new(AtomicBool::new(true));
        let finished =
            count(board, 2, spec, Kernel::Auto, Instant::now(), &stop, None).unwrap();
        let Finished::Stopped(partial) = finished else {
            panic!("a stopped count reports as stopped");
        };
        assert!(partial.solved < partial.subproblems, "{partial:?}");
        assert!(partial.done < partial.work, "{partial:?}");
        assert!(partial.total < 14_200, "{partial:?}");

        let partial = Partial {
            total: 1234,
            solved: 3,
            subproblems: 70,
            done: 25,
            work: 1000,
        };
        let text = partial.describe(20, Duration::from_millis(12_340));
        assert_eq!(
            text,
            "nq: interrupted after 12.3 s, with 2.50 % of the estimated work done: 3 of 70 \
             sub-problems counted, holding 1234 of the solutions of N = 20 (not the total: \
             the rest were not counted)"
        );
    }

    #[test]
    fn percentages_of_huge_counts_stay_readable() {
        assert_eq!(percent(0, 10), "0 %");
        assert_eq!(percent(1, 0), "0 %");
        assert_eq!(percent(1, 4), "25.00 %");
        assert_eq!(percent(1, 1), "100.00 %");
        assert_eq!(percent(3, 100_000_000_000), "3.0e-9 %");
        assert_eq!(percent(u128::MAX / 2, u128::MAX), "50.00 %");
    }

    #[test]
    fn a_long_count_is_announced_with_its_forecast() {
        let year = 365.25 * 86400.0;
        let f = Forecast {
            seconds: 2.4e6 * year,
            core_seconds: 4.8e6 * year,
        };
        assert_eq!(
            announce(32, 2, f),
            "nq: N = 32 will take about 2.4 million years on 2 threads (4.8 million years \
             of one core, forecast from a count of N = 15 on this machine); Ctrl-C stops it \
             and prints what it counted"
        );
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
                let stop = Arc::new(AtomicBool::new(false));
                let finished =
                    count(board, threads, spec, kernel, Instant::now(), &stop, None)
                        .unwrap();
                let Finished::Counted(c) = finished else {
                    panic!("nothing stopped the count of n={n}");
                };
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

//! `nq`: count, list, construct, verify and export N-Queens solutions on one
//! machine.
//!
//! # Layout
//!
//! * `main.rs`: the command line ([`Args`]), dispatch, and error reporting.
//! * [`count`]: `nq count`, the split → pool → tally run with its progress bar.
//! * [`forecast`]: how long a count will take, told before it starts.
//! * [`interrupt`]: Ctrl-C, which stops a count and has it say how far it got.
//! * [`solutions`]: `nq solutions` and `nq one`, which write solutions.
//! * [`check`]: `nq verify`, for notations and SAT models.
//! * [`recheck`]: `nq recheck`, which re-computes a sample of a coordinator's
//!   audit and checks its digest and sums.
//! * [`json`]: the reader of the `json` notation that `nq verify` passes to
//!   `nq_core`, which reads no JSON itself.
//! * [`output`]: buffered stdout that `nq_core`'s `fmt::Write` writers can use.
//!
//! The work itself is all in `nq_core`; this crate parses, prints and times.

use std::num::NonZero;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Parser, Subcommand};
use nq_core::notation::Format;
use nq_core::pool::MAX_THREADS;
use nq_core::search::Kernel;
use nq_core::split::SplitSpec;
use nq_core::{Board, MAX_N};

mod check;
mod count;
mod forecast;
mod interrupt;
mod json;
mod output;
mod recheck;
mod solutions;

/// Count, list, construct and verify N-Queens solutions, exactly.
///
/// Orientation: a square is (col, row), 0-based; column 0 is file `a`, row 0 is
/// rank 1 (the bottom). A solution is the row of the queen in each column.
#[derive(Debug, Parser)]
#[command(name = "nq", version, arg_required_else_help = true)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Count all solutions and the solutions up to symmetry, on all cores.
    ///
    /// A count forecast to take over a minute says how long before it
    /// starts; on a terminal a bar shows progress and an ETA. Ctrl-C stops
    /// it, prints what was counted and how much of the work that was, and
    /// exits with status 130.
    Count(CountArgs),
    /// List solutions in lexicographic order of their vector.
    Solutions {
        /// Board size N, from 1 to 32.
        #[arg(value_parser = parse_board, allow_negative_numbers = true)]
        n: Board,
        /// Only the canonical solution of each symmetry class (the least of its 8
        /// images).
        #[arg(long)]
        unique: bool,
        /// Notation of the output.
        #[arg(long, short, default_value = "vector", value_parser = format_parser())]
        format: Format,
        /// Stop after K solutions.
        #[arg(long, value_name = "K")]
        limit: Option<u64>,
    },
    /// Print one solution of any N (1 or at least 4), built in O(N) without
    /// search.
    One {
        /// Board size N: 1, or any integer from 4 to 2^32; a million is fine.
        #[arg(value_parser = parse_constructible, allow_negative_numbers = true)]
        n: u64,
        /// Notation of the output (board and string are N² characters).
        #[arg(long, short, default_value = "vector", value_parser = format_parser())]
        format: Format,
    },
    /// Check solutions in any notations, or a SAT solver's model with --n.
    ///
    /// Prints a verdict for each solution and exits non-zero if any is invalid
    /// or none is found.
    Verify {
        /// File to read; standard input when absent or `-`.
        file: Option<PathBuf>,
        /// Read a SAT solver's model of `nq cnf N` (DIMACS `s`/`v` lines, or a
        /// bare list of literals) instead of solutions.
        #[arg(long, value_name = "N", value_parser = parse_cnf_size, allow_negative_numbers = true)]
        n: Option<u64>,
    },
    /// Write the problem as DIMACS CNF for a SAT solver.
    ///
    /// Variable col*N + row + 1 is a queen on (col, row). Read the solver's model
    /// back with `nq verify --n N`.
    Cnf {
        /// Board size N, from 1 to 46340.
        #[arg(value_parser = parse_cnf_size, allow_negative_numbers = true)]
        n: u64,
    },
    /// Re-check a published run from its audit alone (`nq-coord audit`).
    ///
    /// Checks the audit's digest (against --digest, the `audit=` of the run's
    /// final line, when given), that its rows tile the split and add up to
    /// its stated totals, and, with --sample K, solves again K jobs chosen by
    /// --seed. Prints one summary line; exits non-zero on any difference,
    /// naming it.
    Recheck(RecheckArgs),
}

/// The arguments of `nq recheck`.
#[derive(Debug, clap::Args)]
struct RecheckArgs {
    /// The audit, as `nq-coord audit --output` wrote it.
    audit: PathBuf,
    /// Jobs to solve again (all of them when K is at least their number).
    /// Without it, or with 0, only the digest, the sums and the plan are
    /// checked.
    #[arg(long, value_name = "K", requires = "seed")]
    sample: Option<u64>,
    /// The public seed that chooses the sampled jobs: the K with the least
    /// SHA-256("nq-recheck:SEED:JOB"). Publish it after the audit.
    #[arg(long, value_name = "S")]
    seed: Option<String>,
    /// The published digest (`sha256:HEX`, as the run's final line and
    /// report.json print it); the audit must hash to it.
    #[arg(long, value_name = "DIGEST", value_parser = recheck::parse_digest)]
    digest: Option<[u8; 32]>,
    /// Threads to solve on [default: all cores].
    #[arg(long, short, value_parser = clap::value_parser!(u32).range(1..=MAX_THREADS as i64))]
    threads: Option<u32>,
    /// The count kernel (`scalar` gives a computation independent of the
    /// vector kernels a run most likely used).
    #[arg(long, default_value = "auto", value_parser = kernel_parser())]
    kernel: Kernel,
    /// Also print the audit's run, the sampled jobs and a line for each job
    /// solved again, before the summary.
    #[arg(long, short)]
    verbose: bool,
}

/// The arguments of `nq count`.
#[derive(Debug, clap::Args)]
struct CountArgs {
    /// Board size N, from 1 to 32.
    #[arg(value_parser = parse_board, allow_negative_numbers = true)]
    n: Board,
    /// Threads to count on [default: all cores].
    #[arg(long, short, value_parser = clap::value_parser!(u32).range(1..=MAX_THREADS as i64))]
    threads: Option<u32>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Split into sub-problems as RING:EXTRA, the fields of nq-core's SplitSpec
    /// (which split, then 0 to 8 extra pre-placed columns) [default: the core's
    /// choice for 64 sub-problems per thread].
    #[arg(long, value_name = "RING:EXTRA", value_parser = parse_split)]
    split: Option<SplitSpec>,
    /// The count kernel: `auto` takes the fastest this CPU has (`avx512`,
    /// then `avx2`; `neon` on aarch64); `scalar` runs the portable one (no vector code), a second
    /// computation to check a result with.
    #[arg(long, default_value = "auto", value_parser = kernel_parser())]
    kernel: Kernel,
}

/// Reads the N of every subcommand: a decimal integer, or a message that
/// names the accepted form (`accepted`, e.g. "an integer from 1 to 32").
/// `nq count`, `nq solutions`, `nq one`, `nq cnf` and `nq verify --n` all
/// read N here, so that they refuse the same input alike, as usage errors
/// (exit status 2).
fn parse_size(s: &str, accepted: &str) -> Result<u64, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a board size: N must be {accepted}"))
}

/// A board size for the search, with the core's message naming the range and
/// why it ends at 32: the counter's limit, not a policy.
fn parse_board(s: &str) -> Result<Board, String> {
    let n = parse_size(s, &format!("an integer from 1 to {MAX_N}"))?;
    Board::new(n).map_err(|e| match n {
        0 => e.to_string(),
        _ => format!(
            "{e}; {MAX_N} is the search's limit: it keeps the rows of a column in a \
             {MAX_N}-bit mask"
        ),
    })
}

/// A board size `nq one` can build a solution of: 1, or 4 to
/// `construct::MAX_N`, with the construction's own messages.
fn parse_constructible(s: &str) -> Result<u64, String> {
    use nq_core::construct::{self, ConstructError};
    let n = parse_size(
        s,
        &format!("1 or an integer from 4 to {}", construct::MAX_N),
    )?;
    match n {
        0 => Err(ConstructError::BoardSize { n }.to_string()),
        2 | 3 => Err(ConstructError::NoSolution { n }.to_string()),
        n if n > construct::MAX_N => Err(ConstructError::BoardSize { n }.to_string()),
        n => Ok(n),
    }
}

/// A board size that has a CNF (`nq cnf`, `nq verify --n`), with the core's
/// message naming the range.
fn parse_cnf_size(s: &str) -> Result<u64, String> {
    use nq_core::cnf::{self, Cnf};
    let n = parse_size(s, &format!("an integer from 1 to {}", cnf::MAX_N))?;
    Cnf::new(n).map(|c| c.n()).map_err(|e| e.to_string())
}

/// `RING:EXTRA`, validated by the core.
fn parse_split(s: &str) -> Result<SplitSpec, String> {
    let form = || format!("`{s}` is not a split: expected RING:EXTRA, like 1:2");
    let (ring, extra) = s.split_once(':').ok_or_else(form)?;
    let ring = ring.trim().parse().map_err(|_| form())?;
    let extra = extra.trim().parse().map_err(|_| form())?;
    SplitSpec::new(ring, extra).map_err(|e| e.to_string())
}

/// Format names, listed in `--help` and in the error for an unknown name.
fn format_parser() -> impl TypedValueParser<Value = Format> {
    PossibleValuesParser::new(Format::ALL.map(Format::name))
        .try_map(|name| name.parse::<Format>())
}

/// Kernel names, refusing at parse time a kernel this CPU cannot run.
fn kernel_parser() -> impl TypedValueParser<Value = Kernel> {
    PossibleValuesParser::new(Kernel::ALL.map(Kernel::name)).try_map(|name| {
        let kernel: Kernel = name.parse()?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(kernel.require()?)
    })
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        // A broken pipe means the reader (`head`, say) has all it wants: stop
        // quietly and successfully, as ripgrep does.
        Err(e) if output::is_broken_pipe(&e) => ExitCode::SUCCESS,
        // Ctrl-C: the count has said what it counted.
        Err(e) if e.is::<interrupt::Interrupted>() => {
            ExitCode::from(interrupt::INTERRUPTED_EXIT)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        Command::Count(a) => count::run(a.n, a.threads, a.split, a.kernel, a.json),
        Command::Solutions {
            n,
            unique,
            format,
            limit,
        } => solutions::list(n, unique, format, limit),
        Command::One { n, format } => solutions::one(n, format),
        Command::Verify { file, n } => check::run(file.as_deref(), n),
        Command::Recheck(a) => recheck::run(&recheck::Request {
            file: &a.audit,
            sample: a.sample.unwrap_or(0),
            // Only read when jobs are sampled, and clap requires it then.
            seed: a.seed.as_deref().unwrap_or(""),
            digest: a.digest,
            threads: match a.threads {
                Some(t) => t as usize,
                None => std::thread::available_parallelism().map_or(1, NonZero::get),
            },
            kernel: a.kernel,
            verbose: a.verbose,
        }),
        Command::Cnf { n } => {
            let cnf = nq_core::cnf::Cnf::new(n)?;
            let mut out = output::stdout();
            let written = cnf.write_dimacs(&mut out);
            out.finish().context("writing the CNF")?;
            Ok(written?)
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        Args::command().debug_assert();
    }

    #[test]
    fn split_and_board_parsers_name_the_form() {
        assert_eq!(parse_split("1:2"), Ok(SplitSpec::new(1, 2).unwrap()));
        assert!(parse_split("12").unwrap_err().contains("RING:EXTRA"));
        assert!(parse_split("4:0").unwrap_err().contains("1, 2 or 3"));
        assert!(parse_board("abc").unwrap_err().contains("from 1 to 32"));
        assert!(parse_board("33").unwrap_err().contains("from 1 to 32"));
        assert_eq!(parse_board("8").unwrap().n(), 8);
    }
}

//! `nq-reliability`: renders `RELIABILITY.md` from the rows that the fault
//! tests of `cargo test -p nq-e2e` wrote to `target/reliability/` (see
//! `nq_e2e::reliability`).
//!
//! ```text
//! cargo test -p nq-e2e && cargo run -p nq-e2e --bin nq-reliability
//! ```
//!
//! It writes the file even when a fault has no row or its last run failed
//! (the table then says so), and exits non-zero in that case, so that such a
//! table is never committed by accident.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;
use nq_e2e::reliability::{check_complete, read_rows, render, rows_dir};

/// Renders RELIABILITY.md from the fault tests' recorded rows.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Where to write [default: RELIABILITY.md at the workspace root].
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Where the rows are [default: target/reliability].
    #[arg(long, value_name = "DIR")]
    rows: Option<PathBuf>,
}

fn main() -> ExitCode {
    match try_main(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nq-reliability: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn try_main(args: Args) -> Result<()> {
    let dir = match args.rows {
        Some(d) => d,
        None => rows_dir()?,
    };
    let rows = read_rows(&dir).with_context(|| {
        format!(
            "no rows in {}: run `cargo test -p nq-e2e` first",
            dir.display()
        )
    })?;
    let output = args.output.unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../RELIABILITY.md")
    });
    std::fs::write(&output, render(&rows))
        .with_context(|| format!("cannot write {}", output.display()))?;
    println!("wrote {}", output.display());
    check_complete(&rows)
}

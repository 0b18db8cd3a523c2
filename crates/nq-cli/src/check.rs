//! `nq verify`: a verdict for every solution in a text, or for a SAT model.

use std::io::{self, Read, Write};
use std::path::Path;

use anyhow::{Context, bail};
use nq_core::notation::{self, Format, ParseErrorKind};
use nq_core::verify;

use crate::json;

/// Reads `file` (stdin when `None` or `-`) and prints a verdict per solution,
/// or, with `model_n`, checks it as a SAT model of `nq cnf N`.
///
/// # Errors
///
/// When the input cannot be read, when any solution is invalid, or when the
/// input holds no solution at all: every way of not being a clean pass exits
/// non-zero.
pub(crate) fn run(file: Option<&Path>, model_n: Option<u64>) -> anyhow::Result<()> {
    let (name, text) = read_input(file)?;
    let mut out = io::stdout().lock();
    match model_n {
        Some(n) => model(&mut out, &name, n, &text),
        None => solutions(&mut out, &name, &text),
    }
}

/// The whole input and a name for messages. Read whole rather than streamed:
/// a diagram spans lines and a million-column vector is one line anyway, and
/// `notation::parse` is linear in the text.
fn read_input(file: Option<&Path>) -> anyhow::Result<(String, String)> {
    match file {
        Some(path) if path != Path::new("-") => {
            let name = path.display().to_string();
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {name}"))?;
            Ok((name, text))
        }
        _ => {
            let mut text = String::new();
            io::stdin()
                .read_to_string(&mut text)
                .context("cannot read standard input")?;
            Ok(("standard input".to_string(), text))
        }
    }
}

fn solutions(out: &mut impl Write, name: &str, text: &str) -> anyhow::Result<()> {
    let (mut valid, mut invalid) = (0u64, 0u64);
    for entry in notation::parse(text, json::read) {
        match entry {
            Ok(e) => match verify::check(e.n, &e.rows) {
                Ok(()) => {
                    valid += 1;
                    writeln!(out, "line {}: valid ({}, N = {})", e.line, e.format, e.n)?;
                }
                Err(fault) => {
                    invalid += 1;
                    writeln!(
                        out,
                        "line {}: INVALID ({}, N = {}): {fault}",
                        e.line, e.format, e.n
                    )?;
                }
            },
            // What cannot be read is as invalid as what attacks, and the
            // reader has already resumed on the next line for the rest.
            Err(e) => {
                invalid += 1;
                let hint = match e.kind() {
                    ParseErrorKind::LooksLikeDimacs => {
                        "; check a SAT model with `nq verify --n N`"
                    }
                    _ => "",
                };
                writeln!(out, "line {}: INVALID: {}{hint}", e.line(), e.problem())?;
            }
        }
    }
    let total = valid + invalid;
    // An empty input must not pass: it is what a failed command upstream of
    // `| nq verify` leaves behind.
    if total == 0 {
        let names: Vec<&str> = Format::ALL.iter().map(|f| f.name()).collect();
        bail!(
            "no solution found in {name}: expected solutions in any of the notations {}",
            names.join(", ")
        );
    }
    if invalid > 0 {
        bail!("{invalid} of {total} solutions in {name} are invalid");
    }
    match total {
        1 => writeln!(out, "1 solution checked: valid")?,
        _ => writeln!(out, "{total} solutions checked: all valid")?,
    }
    Ok(())
}

fn model(out: &mut impl Write, name: &str, n: u64, text: &str) -> anyhow::Result<()> {
    let rows = verify::read_model(n, text)
        .with_context(|| format!("{name} is not a model of `nq cnf {n}`"))?;
    if let Err(fault) = verify::check(n, &rows) {
        bail!("the model in {name} is INVALID: {fault}");
    }
    // Printed so that the solver's answer can be compared or reused.
    let vector = notation::to_string(Format::Vector, &rows)?;
    write!(
        out,
        "valid: the model is a solution of the {n}×{n} board: {vector}"
    )?;
    Ok(())
}

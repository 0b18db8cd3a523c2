//! `RELIABILITY.md` cannot drift from the suite: it must list exactly the
//! faults of `nq_e2e::reliability::FAULTS`, each fault must be injected by
//! exactly one test (a `Trial::start` call with its id in this directory), and every
//! outcome in the committed table must be exact.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result, ensure};
use nq_e2e::reliability::{FAULTS, ids_in_source, table_rows};

#[test]
fn the_committed_table_lists_every_fault() -> Result<()> {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = crate_dir.join("../RELIABILITY.md");
    let md = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "cannot read {}; generate it with `cargo test -p nq-e2e && cargo run -p \
             nq-e2e --bin nq-reliability`",
            path.display()
        )
    })?;
    let defined: BTreeSet<&str> = FAULTS.iter().map(|f| f.id).collect();
    ensure!(defined.len() == FAULTS.len(), "FAULTS repeats an id");

    let rows = table_rows(&md);
    let listed: BTreeSet<&str> = rows.iter().map(|(id, _)| id.as_str()).collect();
    ensure!(
        listed.len() == rows.len(),
        "RELIABILITY.md lists a fault twice"
    );
    ensure!(
        listed == defined,
        "RELIABILITY.md lists {listed:?} but the suite defines {defined:?}; \
         regenerate it with `cargo run -p nq-e2e --bin nq-reliability`"
    );
    for (id, outcome) in &rows {
        ensure!(
            outcome.starts_with("exact"),
            "RELIABILITY.md records a run of `{id}` that was not exact: {outcome}"
        );
    }

    let mut opened = Vec::new();
    for entry in std::fs::read_dir(crate_dir.join("tests"))? {
        let file = entry?.path();
        if file.extension().is_some_and(|e| e == "rs") {
            opened.extend(ids_in_source(&std::fs::read_to_string(&file)?));
        }
    }
    let tested: BTreeSet<&str> = opened.iter().map(String::as_str).collect();
    ensure!(
        tested.len() == opened.len(),
        "a fault is injected by two tests: {opened:?}"
    );
    ensure!(
        tested == defined,
        "the tests inject {tested:?} but FAULTS defines {defined:?}"
    );
    Ok(())
}

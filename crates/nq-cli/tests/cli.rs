//! Runs the built `nq` binary as a user would: arguments in, text and exit
//! status out.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Q(N) and U(N) for N = 1..=12 from OEIS A000170 / A002562, written out here
/// rather than taken from the binary's own table, so that a typo there shows.
const KNOWN: [(u64, u64); 12] = [
    (1, 1),
    (0, 0),
    (0, 0),
    (2, 1),
    (10, 2),
    (4, 1),
    (40, 6),
    (92, 12),
    (352, 46),
    (724, 92),
    (2680, 341),
    (14200, 1787),
];

const FORMATS: [&str; 6] = ["board", "vector", "digits", "algebraic", "string", "json"];

fn nq_command(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nq"));
    cmd.args(args);
    cmd
}

/// Runs `nq args` with `input` on stdin.
fn nq_with(args: &[&str], input: &[u8]) -> Output {
    let mut child = nq_command(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let input = input.to_vec();
    // Written from a thread: a large input would otherwise fill the pipe while
    // the child fills its stdout, and both would wait forever.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().expect("the binary finishes");
    writer.join().expect("the writer thread does not panic");
    out
}

fn nq(args: &[&str]) -> Output {
    nq_with(args, b"")
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("stdout is UTF-8")
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).expect("stderr is UTF-8")
}

/// Runs `nq args`, asserts success, returns stdout.
fn ok(args: &[&str]) -> String {
    let o = nq(args);
    assert!(o.status.success(), "nq {args:?} failed: {}", stderr(&o));
    stdout(&o)
}

/// Runs `nq args`, asserts a clean failure (non-zero, no panic), returns
/// stderr.
fn fails(args: &[&str], input: &[u8]) -> String {
    let o = nq_with(args, input);
    let err = stderr(&o);
    assert!(
        !o.status.success(),
        "nq {args:?} should fail:\n{}",
        stdout(&o)
    );
    assert!(!err.contains("panicked"), "nq {args:?} panicked: {err}");
    err
}

/// Pipes `text` into `nq verify` and returns its report, asserting that every
/// one of `expected` solutions is valid.
fn verify_all(text: &str, expected: usize) -> String {
    let o = nq_with(&["verify"], text.as_bytes());
    let report = stdout(&o);
    assert!(
        o.status.success(),
        "verify failed: {}\n{report}",
        stderr(&o)
    );
    let summary = match expected {
        1 => "1 solution checked: valid\n".to_string(),
        _ => format!("{expected} solutions checked: all valid\n"),
    };
    assert!(report.ends_with(&summary), "{report}");
    report
}

#[test]
fn no_arguments_shows_help_and_fails() {
    let o = nq(&[]);
    assert!(!o.status.success());
    let help = stderr(&o);
    for word in ["Usage", "count", "solutions", "one", "verify", "cnf"] {
        assert!(help.contains(word), "{help}");
    }
}

#[test]
fn lists_the_two_solutions_of_4() {
    assert_eq!(ok(&["solutions", "4"]), "[1 3 0 2]\n[2 0 3 1]\n");
}

#[test]
fn lists_the_known_number_of_solutions() {
    for (n, want) in [("5", 10), ("6", 4), ("8", 92)] {
        let out = ok(&["solutions", n]);
        let mut lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), want, "n={n}");
        let sorted = lines.clone();
        lines.sort();
        lines.dedup();
        assert_eq!(lines, sorted, "n={n}: distinct and in lexicographic order");
        verify_all(&out, want);
    }
    let unique = ok(&["solutions", "8", "--unique"]);
    assert_eq!(unique.lines().count(), 12);
    assert!(unique.starts_with("[0 4 7 5 2 6 1 3]\n"), "{unique}");
    verify_all(&unique, 12);
}

#[test]
fn every_listed_solution_verifies_in_every_format() {
    for n in 1..=8usize {
        let want = KNOWN[n - 1].0 as usize;
        for format in FORMATS {
            let text = ok(&["solutions", &n.to_string(), "--format", format]);
            if want == 0 {
                assert_eq!(text, "", "n={n} {format}");
                continue;
            }
            let report = verify_all(&text, want);
            assert_eq!(
                report
                    .matches(&format!("valid ({format}, N = {n})"))
                    .count(),
                want,
                "{report}"
            );
        }
    }
}

#[test]
fn formats_write_the_documented_forms() {
    let first = |format| ok(&["solutions", "4", "--format", format, "--limit", "1"]);
    assert_eq!(first("vector"), "[1 3 0 2]\n");
    assert_eq!(first("digits"), "2413\n");
    assert_eq!(first("algebraic"), "a2 b4 c1 d3\n");
    assert_eq!(first("string"), "-*-----**-----*-\n");
    assert_eq!(first("json"), "{\"n\":4,\"rows\":[1,3,0,2]}\n");
    assert_eq!(first("board"), ".Q..\n...Q\nQ...\n..Q.\n");
    // Diagrams are separated by one blank line, with none at the end.
    assert_eq!(
        ok(&["solutions", "4", "-f", "board"]),
        ".Q..\n...Q\nQ...\n..Q.\n\n..Q.\nQ...\n...Q\n.Q..\n"
    );
}

#[test]
fn limit_stops_early() {
    assert_eq!(ok(&["solutions", "8", "--limit", "5"]).lines().count(), 5);
    assert_eq!(
        ok(&["solutions", "8", "--unique", "--limit", "3"])
            .lines()
            .count(),
        3
    );
    assert_eq!(ok(&["solutions", "8", "--limit", "0"]), "");
    // A limit lets a listing of a large board return at once.
    assert_eq!(ok(&["solutions", "24", "--limit", "2"]).lines().count(), 2);
}

#[test]
fn count_json_matches_oeis_up_to_12() {
    for (i, &(total, unique)) in KNOWN.iter().enumerate() {
        let n = i as u64 + 1;
        let out = ok(&["count", &n.to_string(), "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).expect("one JSON object");
        assert_eq!(v["n"], n, "{out}");
        assert_eq!(v["total"], total, "{out}");
        assert_eq!(v["unique"], unique, "{out}");
        assert_eq!(v["published_match"], true, "{out}");
        assert!(v["seconds"].as_f64().is_some_and(|s| s >= 0.0), "{out}");
        assert!(v["nodes"].as_u64().is_some(), "{out}");
        assert!(v["nodes_per_second"].as_f64().is_some(), "{out}");
        assert_eq!(out.lines().count(), 1);
    }
}

/// Nodes mean the same on every kernel (issue 10): the default kernel and the
/// scalar one report the same number for the same count.
#[test]
fn count_json_nodes_agree_between_kernels() {
    let nodes = |kernel: &str| {
        let out = ok(&["count", "12", "--json", "--kernel", kernel]);
        let v: serde_json::Value = serde_json::from_str(&out).expect("one JSON object");
        v["nodes"].as_u64().expect("a node count")
    };
    let scalar = nodes("scalar");
    assert!(scalar > 10_000, "{scalar} nodes for N = 12");
    assert_eq!(nodes("auto"), scalar);
}

#[test]
fn count_text_says_whether_it_matches() {
    let out = ok(&["count", "10", "--threads", "1"]);
    assert!(out.contains("total:     724\n"), "{out}");
    assert!(out.contains("unique:    92\n"), "{out}");
    assert!(out.contains("matches OEIS A000170 and A002562"), "{out}");
    assert!(out.contains("s on 1 thread,"), "{out}");
    // Any split gives the same counts.
    for split in ["1:0", "2:1", "3:2"] {
        let out = ok(&["count", "9", "--split", split, "--json", "-t", "3"]);
        assert!(
            out.contains("\"total\":352,\"unique\":46"),
            "{split}: {out}"
        );
    }
}

#[test]
fn one_passes_verify_for_many_n() {
    for n in [
        1u64, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 20, 21, 100, 1001, 100_000,
    ] {
        let text = ok(&["one", &n.to_string()]);
        let report = verify_all(&text, 1);
        assert!(report.contains(&format!("N = {n})")), "{report}");
    }
    for format in ["algebraic", "json", "board", "string"] {
        verify_all(&ok(&["one", "30", "--format", format]), 1);
    }
    assert_eq!(ok(&["one", "8", "--format", "digits"]), "24683175\n");
}

/// The brief's "seconds, not minutes" for a million columns, end to end. In a
/// debug build this is the slowest test of the file; it still takes about a
/// second, because both sides are linear.
#[test]
fn one_million_passes_verify_quickly() {
    let start = Instant::now();
    let text = ok(&["one", "1000000"]);
    assert!(text.starts_with("[1 3 5 "), "{}", &text[..20]);
    let report = verify_all(&text, 1);
    assert!(report.contains("N = 1000000"), "{report}");
    let took = start.elapsed();
    assert!(took.as_secs() < 20, "took {took:?}");
    eprintln!("nq one 1000000 | nq verify: {took:?}");
}

#[test]
fn verify_names_the_attacking_queens() {
    let o = nq_with(&["verify"], b"[0 4 7 5 2 6 1 3]\n[0 4 7 5 2 6 1 4]\n");
    assert!(!o.status.success());
    let report = stdout(&o);
    assert!(report.contains("line 1: valid (vector, N = 8)"), "{report}");
    assert!(
        report.contains(
            "line 2: INVALID (vector, N = 8): the queens on b5 (col 1, row 4) and h5 \
             (col 7, row 4) attack each other along a row"
        ),
        "{report}"
    );
    assert!(
        stderr(&o).contains("error: 1 of 2 solutions"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn verify_reports_every_kind_of_bad_solution() {
    let input =
        "[0 1]\n{\"n\":5,\"rows\":[1,3,0,2]}\n[1 3 0 9]\n[1 3\nxyz\ns SATISFIABLE\n";
    let o = nq_with(&["verify"], input.as_bytes());
    assert!(!o.status.success());
    let report = stdout(&o);
    let lines: Vec<&str> = report.lines().collect();
    assert_eq!(lines.len(), 6, "{report}");
    assert!(lines[0].contains("rising diagonal"), "{report}");
    assert!(lines[1].contains("wrong length"), "{report}");
    assert!(lines[2].contains("off the 4×4 board"), "{report}");
    assert!(lines[3].contains("missing the closing `]`"), "{report}");
    assert!(lines[4].contains("`xyz` is not a square"), "{report}");
    assert!(lines[5].contains("nq verify --n N"), "{report}");
    assert!(stderr(&o).contains("6 of 6 solutions"), "{}", stderr(&o));
}

#[test]
fn verify_fails_when_there_is_nothing_to_check() {
    let err = fails(&["verify"], b"\n# only a comment\n");
    assert!(err.contains("no solution found in standard input"), "{err}");
    assert!(err.contains("vector"), "names the notations: {err}");
}

#[test]
fn verify_reads_a_file() {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(ok(&["solutions", "6", "-f", "board"]).as_bytes())
        .unwrap();
    let path = file.path().to_str().unwrap();
    let out = ok(&["verify", path]);
    assert!(out.ends_with("4 solutions checked: all valid\n"), "{out}");
    let err = fails(&["verify", "/nonexistent/nq-input"], b"");
    assert!(err.contains("cannot read /nonexistent/nq-input"), "{err}");
}

#[test]
fn verify_reads_a_sat_model() {
    let model =
        b"s SATISFIABLE\nv -1 2 -3 -4 -5 -6 -7 8\nv 9 -10 -11 -12 -13 -14 15 -16 0\n";
    let o = nq_with(&["verify", "--n", "4"], model);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("[1 3 0 2]"), "{}", stdout(&o));
    let err = fails(&["verify", "--n", "4"], b"v 1 5 12 14 0\n");
    assert!(err.contains("attack each other along a row"), "{err}");
    let err = fails(&["verify", "--n", "3"], b"s UNSATISFIABLE\n");
    assert!(err.contains("unsatisfiable"), "{err}");
    let err = fails(&["verify", "--n", "4"], b"v 2 8 9 15 17 0\n");
    assert!(err.contains("another N"), "{err}");
}

#[test]
fn cnf_header_has_exact_counts() {
    let cnf = ok(&["cnf", "4"]);
    let body: Vec<&str> = cnf.lines().filter(|l| !l.starts_with('c')).collect();
    assert_eq!(body[0], "p cnf 16 84");
    assert_eq!(body.len(), 85);
    assert!(body[1..].iter().all(|l| l.ends_with(" 0")));
    let err = fails(&["cnf", "0"], b"");
    assert!(err.contains("from 1 to 46340"), "{err}");
}

/// Runs a SAT solver on a CNF text: its model text, or `None` for UNSAT.
type Solve = fn(&str) -> Option<String>;

/// The first SAT solver on PATH, if any, with its name.
fn sat_solver() -> Option<(&'static str, Solve)> {
    let on_path = |name: &str| {
        Command::new(name)
            .arg("--help")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok()
    };
    if on_path("picosat") {
        return Some(("picosat", picosat));
    }
    if on_path("minisat") {
        return Some(("minisat", minisat));
    }
    None
}

/// picosat reads the CNF on stdin and exits 10 (SAT) or 20 (UNSAT), printing
/// `s` and `v` lines.
fn picosat(cnf: &str) -> Option<String> {
    let mut child = Command::new("picosat")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(cnf.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    match out.status.code() {
        Some(10) => Some(String::from_utf8(out.stdout).unwrap()),
        Some(20) => None,
        other => panic!("picosat exited with {other:?}"),
    }
}

/// minisat takes an input and an output file and writes `SAT` and the model
/// (or `UNSAT`) to the output file; it exits 10 or 20 like picosat.
fn minisat(cnf: &str) -> Option<String> {
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in.cnf"), dir.path().join("out.txt"));
    std::fs::write(&input, cnf).unwrap();
    let status = Command::new("minisat")
        .arg("-verb=0")
        .arg(&input)
        .arg(&output)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    match status.code() {
        Some(10) => Some(std::fs::read_to_string(&output).unwrap()),
        Some(20) => None,
        other => panic!("minisat exited with {other:?}"),
    }
}

#[test]
fn cnf_agrees_with_a_real_sat_solver() {
    let Some((name, solve)) = sat_solver() else {
        eprintln!("SKIPPED: no SAT solver (picosat or minisat) on PATH");
        return;
    };
    for n in 1..=8u64 {
        let cnf = ok(&["cnf", &n.to_string()]);
        match solve(&cnf) {
            None => assert!(n == 2 || n == 3, "{name} says N = {n} is UNSAT"),
            Some(model) => {
                assert!(n != 2 && n != 3, "{name} found a model for N = {n}");
                let o = nq_with(&["verify", "--n", &n.to_string()], model.as_bytes());
                assert!(o.status.success(), "{name}, N = {n}: {}", stderr(&o));
                assert!(stdout(&o).starts_with("valid"), "{}", stdout(&o));
            }
        }
    }
    eprintln!("checked N = 1..=8 with {name}");
}

#[test]
fn bad_input_gets_a_clear_message() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["count", "0"],
            "board size 0 is not supported: N must be an integer from 1 to 32",
        ),
        (
            &["count", "33"],
            "board size 33 is not supported: N must be an integer from 1 to 32; 32 is \
             the search's limit: it keeps the rows of a column in a 32-bit mask",
        ),
        (
            &["count", "abc"],
            "`abc` is not a board size: N must be an integer from 1 to 32",
        ),
        (
            &["count", "8", "--split", "9:0"],
            "ring depth 9 is not supported",
        ),
        (&["count", "8", "--split", "x"], "expected RING:EXTRA"),
        (&["count", "8", "--threads", "0"], "--threads"),
        // The cap every nq program shares: nq_core::pool::MAX_THREADS.
        (&["count", "8", "--threads", "100000"], "1..=4096"),
        (&["solutions", "0"], "from 1 to 32"),
        (&["solutions", "40"], "from 1 to 32"),
        (&["one", "2"], "the 2×2 board has no solution"),
        (&["one", "3"], "never for N = 2 or 3"),
        (&["one", "0"], "N must be an integer from 1"),
        (&["one", "-5"], "-5"),
        (&["one", "9", "--format", "digits"], ""),
        (
            &["solutions", "10", "--format", "digits"],
            "only for N ≤ 9, not N = 10",
        ),
        (
            &["one", "12", "--format", "digits"],
            "only for N ≤ 9, not N = 12",
        ),
        (
            &["solutions", "8", "--format", "fen"],
            "possible values: board, vector, digits",
        ),
        (&["frobnicate"], "unrecognized subcommand"),
    ];
    for (args, want) in cases {
        if want.is_empty() {
            ok(args);
            continue;
        }
        let err = fails(args, b"");
        assert!(err.contains(want), "nq {args:?}: {err}");
    }
    assert_eq!(
        ok(&["solutions", "9", "--format", "digits"])
            .lines()
            .count(),
        352
    );
}

/// `nq solutions 12 | head -1`: the reader leaves, and nq stops quietly.
#[test]
fn a_closed_pipe_ends_the_listing_quietly() {
    let mut child = nq_command(&["solutions", "12"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    // The reader is dropped here: the pipe closes with ~400 kB still to come.
    assert_eq!(first, "[0 2 4 7 9 11 5 10 1 6 8 3]\n");
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stderr(&out), "");
}

/// `nq one` (and `nq cnf`, `nq verify --n`) read N as `nq count` does: the
/// same messages for what is not a number, and usage errors (exit status 2)
/// for every N they refuse.
#[test]
fn one_and_count_read_n_alike() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["count", "abc"],
            "`abc` is not a board size: N must be an integer from 1 to 32",
        ),
        (
            &["one", "abc"],
            "`abc` is not a board size: N must be 1 or an integer from 4 to 4294967296",
        ),
        (&["count", "-5"], "`-5` is not a board size"),
        (&["one", "-5"], "`-5` is not a board size"),
        (&["count", "0"], "board size 0 is not supported"),
        (&["one", "0"], "board size 0 is not supported"),
        (&["one", "2"], "the 2×2 board has no solution"),
        (
            &["cnf", "abc"],
            "`abc` is not a board size: N must be an integer from 1 to 46340",
        ),
        (&["cnf", "0"], "board size 0 has no CNF"),
        (&["verify", "--n", "x1"], "`x1` is not a board size"),
        (
            &["one", "4294967297"],
            "board size 4294967297 is not supported: N must be an integer from 1 to \
             4294967296",
        ),
    ];
    for (args, want) in cases {
        let o = nq(args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "nq {args:?}: {err}");
        assert!(err.contains(want), "nq {args:?}: {err}");
        assert!(!err.contains("invalid digit"), "nq {args:?}: {err}");
    }
    assert_eq!(ok(&["one", " 8 "]), ok(&["one", "8"]));
}

/// `nq count 32` says how long it would take before it starts, and Ctrl-C
/// stops it with what it counted and status 130.
#[test]
fn a_huge_count_is_forecast_and_stops_on_ctrl_c() {
    let mut child = nq_command(&["count", "32", "--threads", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    // Only a guard against a hung test: the count is killed if it has not
    // ended long after the few seconds this takes. Nothing below depends on
    // time.
    let pid = child.id().to_string();
    let (finished, guard) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if guard.recv_timeout(Duration::from_secs(600)).is_err() {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
        }
    });
    let mut err = BufReader::new(child.stderr.take().expect("stderr is piped"));
    let mut forecast = String::new();
    err.read_line(&mut forecast).unwrap();
    assert!(
        forecast.starts_with("nq: N = 32 will take about "),
        "{forecast}"
    );
    assert!(forecast.contains(" years on 1 thread "), "{forecast}");
    assert!(forecast.contains("Ctrl-C stops it"), "{forecast}");

    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(sent.success());
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let _ = finished.send(());
    watchdog.join().unwrap();
    assert_eq!(out.status.code(), Some(130), "{rest}");
    assert!(rest.starts_with("nq: interrupted after "), "{rest}");
    assert!(rest.contains("of the estimated work done"), "{rest}");
    assert!(rest.contains("sub-problems counted"), "{rest}");
    assert_eq!(stdout(&out), "", "no result is printed for a stopped count");
}

/// A count under a minute starts without a forecast line.
#[test]
fn a_short_count_prints_no_forecast() {
    let o = nq(&["count", "17", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stderr(&o), "");
}

//! The crate's layout, checked on its source so that it survives the next
//! feature: the core stays pure, no two modules depend on each other in a
//! cycle, and the functions of the core and the engine stay short enough to
//! read in one screen.
//!
//! These read the files as text: a rule that reviewers would otherwise have
//! to remember is cheaper to hold here.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Longest function allowed in the core and the engine, in lines.
const MAX_FN_LINES: usize = 100;

/// What the pure core must never name. Time is passed in, decisions are
/// returned as data, and I/O is the engine's.
const IMPURE: &[&str] = &[
    "tokio",
    "tonic",
    "sled",
    "SystemTime",
    "Instant::now",
    "std::fs",
    "std::net::Tcp",
    "std::thread",
    "crate::engine",
    "crate::adapters",
    "crate::run",
    "crate::setup",
    "crate::restore",
    "crate::audit",
    "crate::export",
    "crate::plan",
    "crate::metrics",
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every library source file (the binary's are not the library's modules),
/// with its module path (`core::ledger`; the crate root is empty).
fn modules() -> Vec<(String, PathBuf)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in fs::read_dir(dir).expect("src is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n == "bin") {
                    continue;
                }
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&src(), &mut files);
    files
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n != "main.rs"))
        .filter(|p| !is_test_module(p))
        .map(|p| {
            let rel = p.strip_prefix(src()).expect("under src");
            let mut parts: Vec<String> = rel
                .with_extension("")
                .iter()
                .map(|c| c.to_string_lossy().into_owned())
                .collect();
            if parts.last().is_some_and(|l| l == "mod" || l == "lib") {
                parts.pop();
            }
            (parts.join("::"), p)
        })
        .collect()
}

/// True when `path` is a test module in a file of its own: its parent
/// declares it `#[cfg(test)] mod name;`.
fn is_test_module(path: &Path) -> bool {
    let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
        return false;
    };
    let dir = path.parent().expect("a file has a folder");
    let parents = [
        dir.join("mod.rs"),
        dir.join("lib.rs"),
        dir.with_extension("rs"),
    ];
    parents
        .iter()
        .filter(|p| p.as_path() != path)
        .any(|parent| {
            fs::read_to_string(parent).is_ok_and(|text| {
                let lines: Vec<&str> = text.lines().map(str::trim).collect();
                lines.windows(2).any(|w| {
                    w[0] == "#[cfg(test)]"
                        && (w[1] == format!("mod {stem};")
                            || w[1] == format!("pub(crate) mod {stem};"))
                })
            })
        })
}

/// The file's code before its tests, without comments.
fn code(path: &Path) -> String {
    let text = fs::read_to_string(path).expect("readable source");
    let body = text.split("#[cfg(test)]").next().unwrap_or_default();
    body.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// True when `a` is `b` or one of its ancestors.
fn is_ancestor(a: &str, b: &str) -> bool {
    a.is_empty() || a == b || b.starts_with(&format!("{a}::"))
}

/// The modules that `module`'s `code` names (`crate::x::y`, `super::x`),
/// each as the longest known module path it refers to.
fn imports(module: &str, code: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let parent = module.rsplit_once("::").map_or("", |(p, _)| p);
    let mut paths: Vec<Vec<String>> = Vec::new();
    // A `use` may group paths in braces; read each path segment by segment.
    let flat = code.replace(
        ['{', '}', ',', ';', '(', ')', '<', '>', '&', '!', '=', ' '],
        " \n",
    );
    for token in flat.split_whitespace() {
        let base = if let Some(rest) = token.strip_prefix("crate::") {
            rest.to_owned()
        } else if let Some(rest) = token.strip_prefix("super::") {
            if parent.is_empty() {
                rest.to_owned()
            } else {
                format!("{parent}::{rest}")
            }
        } else {
            continue;
        };
        paths.push(base.split("::").map(str::to_owned).collect());
    }
    // Grouped imports (`use crate::core::{lease, ledger}`) end in `::`: the
    // next words are members of that prefix.
    let words: Vec<&str> = flat.split_whitespace().collect();
    for (i, w) in words.iter().enumerate() {
        if let Some(prefix) = w.strip_suffix("::").and_then(|w| w.strip_prefix("crate::"))
        {
            for member in words[i + 1..]
                .iter()
                .take_while(|m| !m.contains("::") || m.starts_with(prefix))
            {
                paths.push(
                    format!("{prefix}::{member}")
                        .split("::")
                        .map(str::to_owned)
                        .collect(),
                );
            }
        }
    }
    for p in paths {
        let mut best = None;
        for n in 1..=p.len() {
            let candidate = p[..n].join("::");
            if known.contains(&candidate) {
                best = Some(candidate);
            }
        }
        if let Some(target) = best
            && !is_ancestor(&target, module)
            && !is_ancestor(module, &target)
        {
            out.insert(target);
        }
    }
    out
}

#[test]
fn the_core_names_no_io_no_clock_and_no_outer_layer() {
    let mut found = Vec::new();
    for (module, path) in modules() {
        if !(module == "core" || module.starts_with("core::")) {
            continue;
        }
        let code = code(&path);
        for word in IMPURE {
            if code.contains(word) {
                found.push(format!("{module} names `{word}`"));
            }
        }
        // The sled-backed store itself (its plain data types are fine).
        if code
            .split(|c: char| !c.is_alphanumeric() && c != '_')
            .any(|w| w == "Store")
        {
            found.push(format!("{module} names the `Store`"));
        }
    }
    assert!(
        found.is_empty(),
        "the core must stay pure:\n{}",
        found.join("\n")
    );
}

#[test]
fn no_two_modules_depend_on_each_other() {
    let modules = modules();
    let known: BTreeSet<String> = modules.iter().map(|(m, _)| m.clone()).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, path) in &modules {
        edges.insert(module.clone(), imports(module, &code(path), &known));
    }
    // A cycle of any length, outside a parent and its own children, is a
    // set of modules that cannot be understood one at a time.
    let mut cycles = Vec::new();
    for start in edges.keys() {
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((at, trail)) = stack.pop() {
            for next in &edges[&at] {
                if next == start {
                    cycles.push(trail.join(" -> ") + " -> " + start);
                } else if seen.insert(next.clone()) {
                    let mut t = trail.clone();
                    t.push(next.clone());
                    stack.push((next.clone(), t));
                }
            }
        }
    }
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
    // The check can fail: the engine does import the core.
    assert!(edges["engine"].contains("core"));
}

#[test]
fn core_and_engine_functions_fit_on_a_screen() {
    let mut long = Vec::new();
    for (module, path) in modules() {
        let inner = ["core", "engine"]
            .iter()
            .any(|top| module == *top || module.starts_with(&format!("{top}::")));
        if !inner {
            continue;
        }
        let code = code(&path);
        let lines: Vec<&str> = code.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let trimmed = line.trim_start();
            let is_fn = [
                "fn ",
                "pub fn ",
                "pub(crate) fn ",
                "async fn ",
                "pub(crate) async fn ",
                "pub async fn ",
            ]
            .iter()
            .any(|p| trimmed.starts_with(p));
            if !is_fn || trimmed.ends_with(';') {
                continue;
            }
            let indent = line.len() - trimmed.len();
            let close = format!("{}}}", " ".repeat(indent));
            let end = lines[i..]
                .iter()
                .position(|l| l.starts_with(&close) && l.trim() == "}")
                .map_or(lines.len() - i, |n| n + 1);
            if end > MAX_FN_LINES {
                long.push(format!(
                    "{module}: `{}` is {end} lines",
                    trimmed.trim_end_matches('{').trim()
                ));
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines:\n{}",
        long.join("\n")
    );
}

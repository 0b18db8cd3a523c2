//! The workspace's layout, checked on its source so that it survives the
//! next feature: the core stays pure, no two modules of this crate depend on
//! each other in a cycle (and no two of its top-level modules, through any
//! others), no state-holding type of the core grows past
//! [`MAX_STATE_FIELDS`] fields, and every source file and function of the
//! workspace stays short enough to read ([`MAX_FILE_LINES`],
//! [`MAX_FN_LINES`]).
//!
//! These read the files as text: a rule that reviewers would otherwise have
//! to remember is cheaper to hold here.
//!
//! # What counts as test code
//!
//! Test code is exempt from the length rules. It is, and only is:
//! * every file under a `tests/` folder of a crate, and the tests crate's
//!   `tests/` folder (integration tests);
//! * a module file whose parent declares it `#[cfg(test)] mod name;` (such
//!   as `core/scheduler/tests.rs`, or `sim/`);
//! * in any other file, each top-level item marked `#[cfg(test)]` (as the
//!   `#[cfg(test)] mod tests { … }` block at the bottom of a file), from the
//!   attribute to the item's closing brace in the first column.
//!
//! A file's length is the number of its other lines, comments and blank
//! lines included. A function's length runs from its `fn` line to its
//! closing brace, both included.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Longest non-test function allowed anywhere in the workspace, in lines.
const MAX_FN_LINES: usize = 100;

/// Longest non-test source file allowed anywhere in the workspace, in lines
/// (see the module doc for how they are counted).
const MAX_FILE_LINES: usize = 1200;

/// Most fields a state-holding struct of the core may have. A struct holds
/// state when at least one field is private: its owner keeps it whole. A
/// plain record (every field public, as `Snapshot`) is data handed out, not
/// state kept.
const MAX_STATE_FIELDS: usize = 20;

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

/// The crate's `src` folder.
fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The workspace's root folder.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every `.rs` file under `dir`, recursively (none when it does not exist).
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<PathBuf> = entries
        .map(|e| e.expect("a directory entry").path())
        .collect();
    paths.sort();
    for path in paths {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// True when `path` is test code as a whole: a test module in a file of its
/// own (its parent declares it `#[cfg(test)] mod name;`), or a module inside
/// one.
fn is_test_module(path: &Path) -> bool {
    declared_for_tests(path) || parent_file(path).is_some_and(|p| is_test_module(&p))
}

/// The file of the module that declares the module in `path`, if any: the
/// folder's `mod.rs`, `lib.rs` or `main.rs`, or the file named after the
/// folder.
fn parent_file(path: &Path) -> Option<PathBuf> {
    let own_dir = path.parent()?;
    let is_root = |p: &Path| {
        p.file_name()
            .is_some_and(|n| n == "mod.rs" || n == "lib.rs" || n == "main.rs")
    };
    let dir = if is_root(path) {
        own_dir.parent()?
    } else {
        own_dir
    };
    if path
        .file_name()
        .is_some_and(|n| n == "lib.rs" || n == "main.rs")
    {
        return None;
    }
    [
        dir.join("mod.rs"),
        dir.join("lib.rs"),
        dir.join("main.rs"),
        dir.with_extension("rs"),
    ]
    .into_iter()
    .find(|p| p.as_path() != path && p.is_file())
}

/// True when the parent of the module in `path` declares it
/// `#[cfg(test)] mod name;`.
fn declared_for_tests(path: &Path) -> bool {
    let stem = if path.file_name().is_some_and(|n| n == "mod.rs") {
        path.parent().and_then(Path::file_name)
    } else {
        path.file_stem()
    };
    let Some(stem) = stem.and_then(|s| s.to_str()) else {
        return false;
    };
    let own_dir = path.parent().expect("a file has a folder");
    let dir = if path.file_name().is_some_and(|n| n == "mod.rs") {
        own_dir.parent().expect("a module folder has a parent")
    } else {
        own_dir
    };
    let parents = [
        dir.join("mod.rs"),
        dir.join("lib.rs"),
        dir.join("main.rs"),
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
                        && w[1].ends_with(&format!("mod {stem};"))
                        && !w[1].contains('{')
                })
            })
        })
}

/// Every non-test source file of the workspace (see the module doc): each
/// crate's `src`, `examples`, `benches` and `build.rs`, and the tests
/// crate's `src`.
fn workspace_sources() -> Vec<PathBuf> {
    let root = workspace();
    let mut files = Vec::new();
    let mut crates: Vec<PathBuf> = fs::read_dir(root.join("crates"))
        .expect("crates/ is readable")
        .map(|e| e.expect("a directory entry").path())
        .collect();
    crates.sort();
    for krate in crates {
        for dir in ["src", "examples", "benches"] {
            rust_files(&krate.join(dir), &mut files);
        }
        let build = krate.join("build.rs");
        if build.is_file() {
            files.push(build);
        }
    }
    rust_files(&root.join("tests").join("src"), &mut files);
    files.retain(|p| !is_test_module(p));
    files
}

/// Every library source file of this crate that is not a test module (the
/// binary's are not the library's modules), with its module path
/// (`core::ledger`; the crate root is empty).
fn modules() -> Vec<(String, PathBuf)> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    files
        .into_iter()
        .filter(|p| !p.starts_with(src().join("bin")))
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

/// The lines of `text` that are not test code: every top-level item marked
/// `#[cfg(test)]` is left out, from the attribute to its closing brace in
/// the first column (or to its `;`).
fn non_test_lines(text: &str) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::with_capacity(lines.len());
    let mut i = 0;
    while i < lines.len() {
        if lines[i] != "#[cfg(test)]" {
            out.push(lines[i]);
            i += 1;
            continue;
        }
        // Skip further attributes, then the item.
        i += 1;
        while i < lines.len() && lines[i].starts_with("#[") {
            i += 1;
        }
        if i < lines.len() && lines[i].trim_end().ends_with(';') {
            i += 1;
            continue;
        }
        while i < lines.len() && lines[i] != "}" {
            i += 1;
        }
        i += 1;
    }
    out
}

/// A line without its `//` comment (a `//` inside a string is rare in the
/// lines these rules read: `use` paths, signatures and braces).
fn without_comment(line: &str) -> &str {
    match line.find("//") {
        Some(i) => &line[..i],
        None => line,
    }
}

/// The file's non-test code, without comments.
fn code(path: &Path) -> String {
    let text = fs::read_to_string(path).expect("readable source");
    non_test_lines(&text)
        .into_iter()
        .map(without_comment)
        .collect::<Vec<_>>()
        .join("\n")
}

/// True when `a` is `b` or one of its ancestors.
fn is_ancestor(a: &str, b: &str) -> bool {
    a.is_empty() || a == b || b.starts_with(&format!("{a}::"))
}

/// The paths that the `use` tree `tree` names, each prefixed by `prefix`:
/// `a::{b, c::{d, self}}` is `a::b`, `a::c::d` and `a::c`.
fn expand(prefix: &str, tree: &str, out: &mut Vec<String>) {
    let tree = tree.trim();
    let join = |p: &str, s: &str| {
        if p.is_empty() {
            s.to_owned()
        } else if s == "self" {
            p.to_owned()
        } else {
            format!("{p}::{s}")
        }
    };
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or(tree).trim();
        if !path.is_empty() && path != "*" {
            out.push(join(prefix, path.trim_end_matches("::*")));
        }
        return;
    };
    let head = tree[..open].trim().trim_end_matches("::");
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let base = if head.is_empty() {
        prefix.to_owned()
    } else {
        join(prefix, head)
    };
    // Split the group at its top-level commas.
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                expand(&base, &inner[start..i], out);
                start = i + 1;
            }
            _ => {}
        }
    }
    expand(&base, &inner[start..], out);
}

/// The module path that `path`, written in `module`, starts from:
/// `crate::…`, `super::…` (any number of them) and `self::…` resolved;
/// `None` for a path that names no module of this crate that way.
fn absolute(module: &str, path: &str) -> Option<Vec<String>> {
    let mut segments: Vec<&str> = path.split("::").map(str::trim).collect();
    let mut at: Vec<String> = match *segments.first()? {
        "crate" => {
            segments.remove(0);
            Vec::new()
        }
        "self" => {
            segments.remove(0);
            module
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        }
        "super" => module
            .split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
        _ => return None,
    };
    while segments.first() == Some(&"super") {
        segments.remove(0);
        at.pop();
    }
    at.extend(segments.into_iter().map(str::to_owned));
    Some(at)
}

/// The modules that `module`'s `code` names (`use crate::x::{y, z}`,
/// `use super::{…}`, `self::x`, or a path in the code), each as the longest
/// known module path it refers to; never `module` itself, its ancestors or
/// its descendants.
fn imports(module: &str, code: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let mut paths: Vec<String> = Vec::new();
    // `use` declarations, with their groups expanded.
    for statement in code.split(';') {
        let s = statement.trim_start();
        let s = s
            .strip_prefix("pub(crate) ")
            .or_else(|| s.strip_prefix("pub "))
            .unwrap_or(s);
        if let Some(tree) = s.trim_start().strip_prefix("use ") {
            expand(
                "",
                &tree.split_whitespace().collect::<Vec<_>>().join(" "),
                &mut paths,
            );
        }
    }
    // Paths written in the code itself (`crate::engine::unix_ms(…)`).
    for token in code.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')) {
        if ["crate::", "super::", "self::"]
            .iter()
            .any(|p| token.starts_with(p))
        {
            paths.push(token.trim_end_matches(':').to_owned());
        }
    }
    let mut out = BTreeSet::new();
    for path in paths {
        let Some(p) = absolute(module, &path) else {
            continue;
        };
        let best = (1..=p.len())
            .map(|n| p[..n].join("::"))
            .rfind(|c| known.contains(c));
        if let Some(target) = best
            && !is_ancestor(&target, module)
            && !is_ancestor(module, &target)
        {
            out.insert(target);
        }
    }
    out
}

/// Every cycle in `edges`, each written once per module on it.
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut found = Vec::new();
    for start in edges.keys() {
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((at, trail)) = stack.pop() {
            for next in edges.get(&at).into_iter().flatten() {
                if next == start {
                    found.push(trail.join(" -> ") + " -> " + start);
                } else if seen.insert(next.clone()) {
                    let mut t = trail.clone();
                    t.push(next.clone());
                    stack.push((next.clone(), t));
                }
            }
        }
    }
    found
}

/// The import edges between this crate's modules.
fn module_edges() -> BTreeMap<String, BTreeSet<String>> {
    let modules = modules();
    let known: BTreeSet<String> = modules.iter().map(|(m, _)| m.clone()).collect();
    modules
        .iter()
        .map(|(module, path)| (module.clone(), imports(module, &code(path), &known)))
        .collect()
}

/// A path relative to the workspace root, for messages.
fn shown(path: &Path) -> String {
    let root = workspace().canonicalize().expect("the workspace root");
    let full = path.canonicalize().expect("a source file");
    full.strip_prefix(&root)
        .unwrap_or(&full)
        .display()
        .to_string()
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
    let edges = module_edges();
    // A cycle of any length, outside a parent and its own children, is a
    // set of modules that cannot be understood one at a time.
    let found = cycles(&edges);
    assert!(found.is_empty(), "import cycles:\n{}", found.join("\n"));
    // The check can fail: the engine does import the core, and the grouped
    // `super::{…}` imports are read (the engine's children name it so).
    assert!(edges["engine"].contains("core"));
    assert!(edges["engine::commit"].contains("engine::restoring"));
}

#[test]
fn no_two_top_level_modules_depend_on_each_other_through_any_others() {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let top = |m: &str| m.split("::").next().unwrap_or_default().to_owned();
    for (module, targets) in module_edges() {
        if module.is_empty() {
            continue; // the crate root re-exports; it is everyone's parent
        }
        let from = top(&module);
        let to = edges.entry(from.clone()).or_default();
        to.extend(
            targets
                .iter()
                .map(|t| top(t))
                .filter(|t| *t != from && !t.is_empty()),
        );
    }
    let found = cycles(&edges);
    assert!(
        found.is_empty(),
        "top-level modules that depend on each other:\n{}",
        found.join("\n")
    );
    assert!(edges["run"].contains("engine"), "the check reads the edges");
}

#[test]
fn no_source_file_of_the_workspace_is_over_the_limit() {
    let mut long = Vec::new();
    for path in workspace_sources() {
        let text = fs::read_to_string(&path).expect("readable source");
        let n = non_test_lines(&text).len();
        if n > MAX_FILE_LINES {
            long.push(format!("{}: {n} lines", shown(&path)));
        }
    }
    assert!(
        long.is_empty(),
        "non-test files over {MAX_FILE_LINES} lines:\n{}",
        long.join("\n")
    );
}

/// The name and length of the function that `lines[i]` opens, if it opens
/// one with a body.
fn function_at(lines: &[&str], i: usize) -> Option<(String, usize)> {
    let line = lines[i];
    let mut rest = line.trim_start();
    loop {
        let before = rest;
        for q in ["pub ", "async ", "const ", "unsafe ", "extern \"C\" "] {
            rest = rest.strip_prefix(q).unwrap_or(rest);
        }
        if rest.starts_with("pub(") {
            rest = rest.split_once(") ").map_or(rest, |(_, r)| r);
        }
        if rest == before {
            break;
        }
    }
    let name = rest.strip_prefix("fn ")?;
    let name: String = name
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    // Find where the signature ends: a body's `{`, or a declaration's `;`.
    let mut depth = 0i64;
    for (k, l) in lines[i..].iter().enumerate() {
        depth +=
            l.matches(['(', '[']).count() as i64 - l.matches([')', ']']).count() as i64;
        let t = l.trim_end();
        if depth > 0 {
            continue;
        }
        if t.ends_with(';') || (t.ends_with('}') && t.contains('{')) {
            return None; // a declaration, or a body on one line
        }
        if t.ends_with('{') {
            let indent = line.len() - line.trim_start().len();
            let close = format!("{}}}", " ".repeat(indent));
            let end = lines[i + k..]
                .iter()
                .position(|l| l.trim_end() == close)
                .map_or(lines.len() - i, |n| k + n + 1);
            return Some((name, end));
        }
    }
    None
}

#[test]
fn no_function_of_the_workspace_is_over_the_limit() {
    let mut long = Vec::new();
    for path in workspace_sources() {
        let text = fs::read_to_string(&path).expect("readable source");
        let lines: Vec<&str> = non_test_lines(&text)
            .into_iter()
            .map(without_comment)
            .collect();
        for i in 0..lines.len() {
            if let Some((name, n)) = function_at(&lines, i)
                && n > MAX_FN_LINES
            {
                long.push(format!("{}: `{name}` is {n} lines", shown(&path)));
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn no_state_holding_type_of_the_core_has_too_many_fields() {
    let mut wide = Vec::new();
    let mut seen = 0;
    for (module, path) in modules() {
        if !(module == "core" || module.starts_with("core::")) {
            continue;
        }
        let code = code(&path);
        let lines: Vec<&str> = code.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let t = line.trim_start();
            let t = t.strip_prefix("pub ").unwrap_or(t);
            let t = if t.starts_with("pub(") {
                t.split_once(") ").map_or(t, |(_, r)| r)
            } else {
                t
            };
            let Some(name) = t.strip_prefix("struct ") else {
                continue;
            };
            if !line.trim_end().ends_with('{') {
                continue; // a unit or tuple struct
            }
            let indent = line.len() - line.trim_start().len();
            let field_indent = " ".repeat(indent + 4);
            let (mut fields, mut private) = (0, 0);
            for l in &lines[i + 1..] {
                if l.trim_end() == format!("{}}}", " ".repeat(indent)) {
                    break;
                }
                let Some(f) = l.strip_prefix(&field_indent) else {
                    continue;
                };
                if f.starts_with(' ') || f.starts_with('#') || !f.contains(':') {
                    continue;
                }
                let head = f.split(':').next().unwrap_or_default();
                let ident = head.rsplit(' ').next().unwrap_or_default();
                if ident.chars().all(|c| c.is_alphanumeric() || c == '_')
                    && !ident.is_empty()
                {
                    fields += 1;
                    if !f.starts_with("pub") {
                        private += 1;
                    }
                }
            }
            seen += 1;
            let name: String = name
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if private > 0 && fields > MAX_STATE_FIELDS {
                wide.push(format!("{module}: `{name}` holds {fields} fields"));
            }
        }
    }
    assert!(seen > 10, "the check reads the core's structs");
    assert!(
        wide.is_empty(),
        "state-holding types of the core over {MAX_STATE_FIELDS} fields:\n{}",
        wide.join("\n")
    );
}

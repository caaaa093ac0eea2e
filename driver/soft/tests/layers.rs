//! The soft HCA's folders by role depend on each other one way: no import
//! cycle is wider than one folder.
//!
//! Each folder of `src/` is a layer: `wire/` (the formats, and the
//! transport's packets as fields), `net/` (the link, its batches, the
//! wires), `firmware/` (the command interface and the objects, with the
//! transport's state as plain data), `transport/` (the requester,
//! responder and completer, which run on the objects). A file depends on
//! a folder when it names an item of it by a `crate::` path (in a `use`
//! or inline, a re-export of `lib.rs` resolved to where it leads); test
//! code (`#[cfg(test)]` items, `tests.rs` files and `src/tests/`) is not
//! counted. This
//! test fails when the folders' dependencies form a cycle, and prints it.
//!
//! The files at the root of `src/` (`lib.rs`, `scheduler.rs`,
//! `poller.rs`, `config.rs`) are the HCA the folders make up: they name
//! every folder. A folder names them back only where it must, listed in
//! [`ROOT_EDGES`]; a new such edge fails the test too.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The folders' references to the root's files that are allowed, with why:
/// (folder, root file).
const ROOT_EDGES: &[(&str, &str)] = &[
    // The firmware checks commands against the device's limits
    // (`SoftConfig`) and the ring sizes they imply.
    ("firmware", "config"),
    // The wires that drive an HCA (the in-process fabric, the simulated
    // wire, the UDP socket wire) take a `SoftHca`, and the socket wire
    // fills in a `SoftConfig`.
    ("net", "lib"),
    ("net", "config"),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of `text` without comments (line comments, doc comments) and
/// string literals' contents.
fn code(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                i += 1;
            }
            i += 2;
        } else if b[i] == b'"' {
            out.push('"');
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            out.push('"');
            i += 1;
        } else if b[i] == b'\'' && b.get(i + 2) == Some(&b'\'') {
            // A character literal such as '{' (lifetimes are left alone).
            out.push_str("' '");
            i += 3;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// `code` without its `#[cfg(test)]` items.
fn without_tests(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at..];
        let brace = item.find('{');
        let semi = item.find(';');
        let end = match (brace, semi) {
            (Some(b), Some(s)) if s < b => s + 1,
            (Some(b), _) => {
                let mut depth = 0;
                let mut end = item.len();
                for (k, c) in item[b..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = b + k + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            (None, Some(s)) => s + 1,
            (None, None) => item.len(),
        };
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

fn ident(s: &str) -> Option<&str> {
    let s = s.trim_start();
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    (end > 0).then(|| &s[..end])
}

/// The first segments of every `crate::` path in `code`: `crate::a::b`
/// gives `a`, `crate::{a::b, c}` gives `a` and `c`.
fn crate_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue; // `some_crate::`
        }
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut part = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                if depth == 0 || (depth == 1 && c == ',') {
                    if let Some(i) = ident(&part) {
                        out.push(i.to_string());
                    }
                    part.clear();
                    if depth == 0 {
                        break;
                    }
                } else if depth >= 1 {
                    part.push(c);
                }
            }
        } else if let Some(i) = ident(rest) {
            out.push(i.to_string());
        }
    }
    out
}

/// What `lib.rs` re-exports: the name to the first segment of its path.
fn reexports(lib: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    for stmt in lib.split(';') {
        let Some(at) = stmt.find("pub use ") else {
            continue;
        };
        let path = &stmt[at + "pub use ".len()..];
        let Some(first) = ident(path) else { continue };
        let tail = &path[first.len()..];
        let names: Vec<&str> = match (tail.find('{'), tail.rfind('}')) {
            (Some(a), Some(b)) => tail[a + 1..b]
                .split(',')
                .filter_map(|n| ident(n.rsplit("::").next().unwrap_or(n)))
                .collect(),
            _ => tail
                .rsplit("::")
                .next()
                .and_then(ident)
                .into_iter()
                .collect(),
        };
        for n in names {
            map.insert(n.to_string(), first.to_string());
        }
    }
    map
}

/// The unit a file is: its folder under `src/`, or `root:<file>` for the
/// files at the root.
fn unit_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("under src");
    let mut parts = rel.components();
    let first = parts.next().expect("a file").as_os_str().to_string_lossy();
    if parts.next().is_some() {
        first.into_owned()
    } else {
        format!("root:{}", first.trim_end_matches(".rs"))
    }
}

/// Every edge between units, with the files that make it.
fn edges() -> BTreeMap<(String, String), BTreeSet<String>> {
    let src = src();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let folders: BTreeSet<String> = files
        .iter()
        .map(|f| unit_of(&src, f))
        .filter(|u| !u.starts_with("root:"))
        .collect();
    let roots: BTreeSet<String> = files
        .iter()
        .map(|f| unit_of(&src, f))
        .filter_map(|u| u.strip_prefix("root:").map(str::to_string))
        .collect();
    let lib = code(&std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs"));
    let reexported = reexports(&lib);
    let resolve = |name: &str| -> String {
        let mut name = name.to_string();
        for _ in 0..8 {
            if folders.contains(&name) {
                return name;
            }
            if roots.contains(&name) {
                return format!("root:{name}");
            }
            match reexported.get(&name) {
                Some(next) => name = next.clone(),
                None => break,
            }
        }
        "root:lib".to_string()
    };
    let mut edges: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let from = unit_of(&src, file);
        // `src/tests/` and the `tests.rs` files (`#[cfg(test)] mod tests;`).
        if from == "tests" || file.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("a source file");
        for name in crate_paths(&without_tests(&code(&text))) {
            let to = resolve(&name);
            if to != from && to != "tests" {
                let rel = file.strip_prefix(&src).expect("under src");
                edges
                    .entry((from.clone(), to))
                    .or_default()
                    .insert(rel.display().to_string());
            }
        }
    }
    edges
}

/// A cycle among the folders (their dependencies, not the root's), if
/// there is one.
fn folder_cycle(edges: &BTreeMap<(String, String), BTreeSet<String>>) -> Option<Vec<String>> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges.keys() {
        if !a.starts_with("root:") && !b.starts_with("root:") {
            next.entry(a).or_default().push(b);
        }
    }
    // Depth-first search; a node on the stack reached again closes a cycle.
    fn visit<'a>(
        n: &'a str,
        next: &BTreeMap<&'a str, Vec<&'a str>>,
        stack: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|&s| s == n) {
            let mut cycle: Vec<String> = stack[at..].iter().map(|s| s.to_string()).collect();
            cycle.push(n.to_string());
            return Some(cycle);
        }
        if !done.insert(n) {
            return None;
        }
        stack.push(n);
        for &m in next.get(n).map(Vec::as_slice).unwrap_or(&[]) {
            if let Some(c) = visit(m, next, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        None
    }
    let mut done = BTreeSet::new();
    let nodes: Vec<&str> = next.keys().copied().collect();
    for n in nodes {
        if let Some(c) = visit(n, &next, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

fn describe(edges: &BTreeMap<(String, String), BTreeSet<String>>) -> String {
    edges
        .iter()
        .map(|((a, b), files)| {
            let files: Vec<&str> = files.iter().map(String::as_str).collect();
            format!("  {a} -> {b}: {}\n", files.join(" "))
        })
        .collect()
}

#[test]
fn the_folders_depend_on_each_other_one_way() {
    let edges = edges();
    assert!(
        edges.contains_key(&("transport".to_string(), "firmware".to_string())),
        "the analysis sees the transport's use of the objects:\n{}",
        describe(&edges)
    );
    if let Some(cycle) = folder_cycle(&edges) {
        panic!(
            "an import cycle across folders: {}\nedges:\n{}",
            cycle.join(" -> "),
            describe(&edges)
        );
    }
}

#[test]
fn the_folders_name_the_root_only_where_listed() {
    let edges = edges();
    let unlisted: Vec<String> = edges
        .iter()
        .filter_map(|((a, b), files)| {
            let root = b.strip_prefix("root:")?;
            if a.starts_with("root:") || ROOT_EDGES.contains(&(a.as_str(), root)) {
                return None;
            }
            Some(format!(
                "{a} -> {b} ({})",
                files.iter().cloned().collect::<Vec<_>>().join(" ")
            ))
        })
        .collect();
    assert!(
        unlisted.is_empty(),
        "folders name the root's files beyond ROOT_EDGES: {unlisted:?}"
    );
}

/// The analysis finds a cycle where there is one, in grouped and inline
/// paths, and leaves test code and comments out.
#[test]
fn the_analysis_sees_paths_and_cycles() {
    let text = "use crate::{firmware::qp::Qp, wire};\n// crate::net::x\nfn f() { crate::transport::engine::run(); other_crate::x(); }\n#[cfg(test)]\nmod tests { use crate::net::sim; }\n";
    assert_eq!(
        crate_paths(&without_tests(&code(text))),
        ["firmware", "wire", "transport"]
    );
    let lib = "pub use net::{fabric, link};\npub use fabric::{Fabric, FABRIC_LOCK};\npub use config::SoftConfig;";
    let r = reexports(lib);
    assert_eq!(r.get("Fabric").map(String::as_str), Some("fabric"));
    assert_eq!(r.get("link").map(String::as_str), Some("net"));
    assert_eq!(r.get("SoftConfig").map(String::as_str), Some("config"));
    let mut e = BTreeMap::new();
    for (a, b) in [("a", "b"), ("b", "c"), ("c", "a"), ("a", "root:lib")] {
        e.insert((a.to_string(), b.to_string()), BTreeSet::new());
    }
    assert_eq!(
        folder_cycle(&e).map(|c| c.join(" -> ")),
        Some("a -> b -> c -> a".to_string())
    );
    e.remove(&("c".to_string(), "a".to_string()));
    assert_eq!(folder_cycle(&e), None);
}

//! The server's top-level modules import each other without a cycle: this test reads every
//! source file of `src/` (but the crate root, the tests and the fake driver), collects the
//! top-level modules its non-test code names through `crate::<module>`, and fails naming the
//! first cycle it finds. Break one by moving the shared type or function down (into a leaf such
//! as `util`, `error` or `rows`) or by passing it in; see the layering in `crate::service`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Files that are not part of the module graph: the root (which declares every module and
/// holds `AppState`), the unit tests and the test-only driver.
const OUTSIDE: &[&str] = &["lib", "tests", "testing"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The code of a file without its comments and without its `#[cfg(test)]` module.
fn code_of(src: &str) -> String {
    let src = match src.find("#[cfg(test)]\nmod tests") {
        Some(i) => &src[..i],
        None => src,
    };
    src.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first path segments after each `crate::` in `code` (`crate::a::b` and
/// `crate::{a, b::c}` name `a` and `b`).
fn named_modules(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // The top-level items of the group, split at commas outside nested braces.
            let mut depth = 0;
            let mut start = 0;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        out.insert(ident(group[start..j].trim()));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.insert(ident(group[start..j].trim()));
                        start = j + 1;
                    }
                    _ => {}
                }
            }
        } else {
            out.insert(ident(rest));
        }
    }
    out.remove("");
    out
}

/// The graph: each top-level module and the other top-level modules it names.
fn graph(src_dir: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src_dir, &mut files);
    let top = |p: &Path| -> String {
        let rel = p.strip_prefix(src_dir).expect("under src");
        let first = rel.components().next().expect("a component");
        first
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string()
    };
    let modules: BTreeSet<String> = files
        .iter()
        .map(|p| top(p))
        .filter(|m| !OUTSIDE.contains(&m.as_str()))
        .collect();
    let mut g: BTreeMap<String, BTreeSet<String>> = modules
        .iter()
        .map(|m| (m.clone(), BTreeSet::new()))
        .collect();
    for p in &files {
        let m = top(p);
        if OUTSIDE.contains(&m.as_str()) {
            continue;
        }
        let src = std::fs::read_to_string(p).expect("read a source file");
        for n in named_modules(&code_of(&src)) {
            if n != m && modules.contains(&n) {
                g.get_mut(&m).expect("module").insert(n);
            }
        }
    }
    g
}

/// A cycle of `g` as the path of modules around it, if there is one.
fn find_cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        m: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        done: &mut BTreeSet<String>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == m) {
            let mut cycle = path[i..].to_vec();
            cycle.push(m.to_string());
            return Some(cycle);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for n in g.get(m).into_iter().flatten() {
            if let Some(c) = visit(n, g, done, path) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for m in g.keys() {
        if let Some(c) = visit(m, g, &mut done, &mut Vec::new()) {
            return Some(c);
        }
    }
    None
}

#[test]
fn the_servers_modules_import_each_other_without_a_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let g = graph(&src);
    assert!(
        g.contains_key("service") && g.contains_key("routes"),
        "{g:?}"
    );
    if let Some(cycle) = find_cycle(&g) {
        panic!(
            "the server's modules import each other in a cycle: {}",
            cycle.join(" -> ")
        );
    }
}

#[test]
fn the_check_finds_a_cycle_and_reads_grouped_imports() {
    assert_eq!(
        named_modules("use crate::{a::{B, C}, b, AppState};\nlet x = crate::c::f();"),
        ["AppState", "a", "b", "c"].map(String::from).into()
    );
    let g: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(m, ns)| (m.to_string(), ns.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(
        find_cycle(&g),
        Some(["a", "b", "c", "a"].map(String::from).to_vec())
    );
    let mut acyclic = g.clone();
    acyclic.get_mut("c").expect("c").clear();
    assert_eq!(find_cycle(&acyclic), None);
}

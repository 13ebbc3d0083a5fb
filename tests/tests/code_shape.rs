//! The shape of the product crates' code (`common`, `agent`, `ctl`).
//!
//! They are layered one way: the module graph of each has no cycle, and in
//! `common` no module names one of a higher floor. Their functions fit on a screen:
//! clippy's `too_many_lines` is on, at 80 lines, and the functions still longer
//! carry an `expect` that only goes down in number.
//!
//! The graph is read from the sources: a module depends on another when its code
//! (its tests apart) names it through `crate::`, `$crate::`, `super::`, `self::`, or
//! a child module's name. A path is resolved to the longest module it starts with,
//! so a re-export does not hide where an item lives.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `common`'s floors, bottom first. A module may name modules of its own floor or
/// lower ones; every module must be listed (a new one decides where it belongs).
const COMMON_FLOORS: &[(&str, &[&str])] = &[
    (
        "support",
        &[
            "backoff",
            "clock",
            "duration",
            "encode",
            "exposition",
            "secret",
            "suggest",
            "swift",
            "time",
        ],
    ),
    (
        "vocab",
        &[
            "names",
            "packages",
            "keys",
            "rollout",
            "roles",
            "phase",
            "command_record",
            "hook_record",
            "values",
            "store::api",
        ],
    ),
    (
        "store",
        &[
            "store",
            "store::client",
            "store::url",
            "store::support",
            "store::etcd",
            "store::consul",
            "store::sqlite",
            "store::memory",
            "store::counting",
            "store::open",
        ],
    ),
    ("rules", &["rules", "compose_rules", "window"]),
    ("fleet", &["fleet", "gate"]),
    ("plan", &["plan", "compose", "command"]),
    ("crate", &[""]),
];

type Graph = BTreeMap<String, BTreeSet<String>>;

fn src_dir(krate: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(krate)
        .join("src")
}

/// The module a source file defines (`""` for the crate root; `bin/` excluded).
fn module_of(root: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(root).ok()?.with_extension("");
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if parts.first().is_some_and(|p| p == "bin") {
        return None;
    }
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    Some(parts.join("::"))
}

/// The code of a file without comments, string literals and its test module.
fn code_of(src: &str) -> String {
    without_tests(&stripped(src))
}

/// `code` without its test modules (`#[cfg(test)] mod name { ... }` wherever they
/// stand, or `#[cfg(test)] mod name;`).
fn without_tests(code: &str) -> String {
    let mut code = code.to_string();
    while let Some(at) = code.find("#[cfg(test)]\nmod ") {
        let decl_end = code[at..].find(['{', ';']).map_or(code.len(), |i| at + i);
        let end = if code[decl_end..].starts_with(';') {
            decl_end + 1
        } else {
            block_end(&code, decl_end)
        };
        code.replace_range(at..end, "");
    }
    code
}

/// The index just past the block that opens at `open`.
fn block_end(code: &str, open: usize) -> usize {
    let mut depth = 0;
    for (i, c) in code[open..].char_indices() {
        depth += match c {
            '{' => 1,
            '}' => -1,
            _ => 0,
        };
        if depth == 0 {
            return open + i + 1;
        }
    }
    code.len()
}

/// `src` without comments, and with every string and char literal emptied (raw
/// strings included).
fn stripped(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        let skip = comment_len(&b[i..])
            .or_else(|| string_len(b, i))
            .or_else(|| char_len(&b[i..]));
        match skip {
            Some(n) => {
                i += n;
                out.push_str("\"\"");
            }
            None => {
                out.push(b[i] as char);
                i += 1;
            }
        }
    }
    out
}

fn comment_len(b: &[u8]) -> Option<usize> {
    if b.starts_with(b"//") {
        Some(b.iter().position(|c| *c == b'\n').unwrap_or(b.len()))
    } else if b.starts_with(b"/*") {
        Some(b.windows(2).position(|w| w == b"*/").map_or(b.len(), |p| p + 2))
    } else {
        None
    }
}

/// A string literal at `i`: `"..."` with escapes, or a raw `r#"..."#`.
fn string_len(b: &[u8], i: usize) -> Option<usize> {
    let after_ident = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
    if b[i] == b'"' {
        let mut j = i + 1;
        while j < b.len() && b[j] != b'"' {
            j += if b[j] == b'\\' { 2 } else { 1 };
        }
        return Some(j + 1 - i);
    }
    if b[i] != b'r' || after_ident {
        return None;
    }
    let hashes = b[i + 1..].iter().take_while(|c| **c == b'#').count();
    if b.get(i + 1 + hashes) != Some(&b'"') {
        return None;
    }
    let mut close = vec![b'"'];
    close.extend(std::iter::repeat_n(b'#', hashes));
    let body = i + 2 + hashes;
    let end = b[body..].windows(close.len()).position(|w| w == close.as_slice());
    Some(end.map_or(b.len() - i, |p| body + p + close.len() - i))
}

/// A char literal (`'x'`, `'\"'`, `'\u{..}'`), not a lifetime.
fn char_len(b: &[u8]) -> Option<usize> {
    if b.first() != Some(&b'\'') {
        return None;
    }
    if b.get(1) == Some(&b'\\') {
        return b[2..].iter().position(|c| *c == b'\'').map(|p| p + 3);
    }
    (1..=4)
        .filter(|w| b.len() > 1 + w)
        .find(|w| std::str::from_utf8(&b[1..1 + w]).is_ok_and(|c| c.chars().count() == 1))
        .filter(|w| b[1 + w] == b'\'')
        .map(|w| w + 2)
}

fn ident(s: &str) -> (&str, &str) {
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    (&s[..end], &s[end..])
}

/// The paths of a use tree or an expression path (`a::b::c`, `{a, b::{c, d}}`).
fn paths(s: &str, prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
    let t = s.trim_start();
    let skipped = s.len() - t.len();
    if let Some(inner) = t.strip_prefix('{') {
        let mut used = 1;
        let mut rest = inner;
        loop {
            let n = paths(rest, prefix, out);
            rest = &rest[n..];
            used += n;
            let r = rest.trim_start();
            used += rest.len() - r.len() + 1;
            match r.chars().next() {
                Some(',') => rest = &r[1..],
                _ => return skipped + used,
            }
        }
    }
    let (name, rest) = ident(t);
    if name.is_empty() {
        out.push(prefix.to_vec());
        return skipped + t.len() - t.trim_start_matches('*').len();
    }
    let mut here = prefix.to_vec();
    here.push(name.to_string());
    match rest.strip_prefix("::") {
        Some(more) => skipped + name.len() + 2 + paths(more, &here, out),
        None => {
            out.push(here);
            skipped + name.len() + alias_len(rest)
        }
    }
}

/// The length of an ` as name` after a path, if there is one.
fn alias_len(rest: &str) -> usize {
    let t = rest.trim_start();
    let Some(after) = t.strip_prefix("as ") else {
        return 0;
    };
    let a = after.trim_start();
    rest.len() - a.len() + ident(a).0.len()
}

/// Every module path `code` names, relative to the crate root.
fn named_paths(module: &str, code: &str) -> Vec<Vec<String>> {
    let own: Vec<String> = module
        .split("::")
        .filter(|p| !p.is_empty())
        .map(String::from)
        .collect();
    let mut out = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let before = code[..at].chars().next_back();
        if before.is_none_or(|c| !(c.is_alphanumeric() || c == '_')) || before == Some('$') {
            paths(&code[at + 7..], &[], &mut out);
        }
    }
    for (at, _) in code.match_indices("super::") {
        if code[..at].ends_with("super::") || code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_')
        {
            continue;
        }
        let mut rest = &code[at..];
        let mut base = own.clone();
        while let Some(r) = rest.strip_prefix("super::") {
            base.pop();
            rest = r;
        }
        paths(rest, &base, &mut out);
    }
    for (at, _) in code.match_indices("self::") {
        if !code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':') {
            paths(&code[at + 6..], &own, &mut out);
        }
    }
    out
}

/// The longest module `path` starts with.
fn resolve(modules: &BTreeSet<String>, path: &[String]) -> Option<String> {
    (1..=path.len())
        .rev()
        .map(|k| path[..k].join("::"))
        .find(|m| modules.contains(m))
}

/// A child module named by its own name from its parent (`etcd::EtcdStore`).
fn children_named(modules: &BTreeSet<String>, module: &str, code: &str) -> Vec<String> {
    let prefix = if module.is_empty() {
        String::new()
    } else {
        format!("{module}::")
    };
    let children = modules
        .iter()
        .filter(|m| m.starts_with(&prefix) && !m[prefix.len()..].contains("::") && *m != module);
    children
        .filter(|child| {
            let pattern = format!("{}::", &child[prefix.len()..]);
            code.match_indices(&pattern)
                .any(|(at, _)| !code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':'))
        })
        .cloned()
        .collect()
}

fn graph_of(krate: &str) -> Graph {
    let root = src_dir(krate);
    let files = jio_tests::inspect::files_below(&root, "rs");
    let sources: BTreeMap<String, String> = files
        .iter()
        .filter_map(|f| Some((module_of(&root, f)?, code_of(&std::fs::read_to_string(f).ok()?))))
        .collect();
    let modules: BTreeSet<String> = sources.keys().cloned().collect();
    let mut graph = Graph::new();
    for (module, code) in &sources {
        let mut deps: BTreeSet<String> = named_paths(module, code)
            .iter()
            .filter_map(|p| resolve(&modules, p))
            .chain(children_named(&modules, module, code))
            .collect();
        deps.remove(module);
        graph.insert(module.clone(), deps);
    }
    graph
}

/// A cycle of the graph, as the modules along it, if there is one.
fn a_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(g: &Graph, m: &str, path: &mut Vec<String>, done: &mut BTreeSet<String>) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == m) {
            let mut cycle = path[i..].to_vec();
            cycle.push(m.to_string());
            return Some(cycle);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for d in g.get(m).into_iter().flatten() {
            if let Some(c) = visit(g, d, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|m| visit(graph, m, &mut Vec::new(), &mut done))
}

fn shown(module: &str) -> &str {
    if module.is_empty() { "(crate root)" } else { module }
}

fn assert_no_cycle(krate: &str) -> Graph {
    let graph = graph_of(krate);
    assert!(graph.len() > 5, "{krate}: only {} modules found", graph.len());
    if let Some(cycle) = a_cycle(&graph) {
        let path: Vec<&str> = cycle.iter().map(|m| shown(m)).collect();
        panic!("{krate}/src has an import circle: {}", path.join(" → "));
    }
    graph
}

#[test]
fn common_has_no_import_circle_and_no_module_names_a_higher_floor() {
    let graph = assert_no_cycle("common");
    let floor: BTreeMap<&str, usize> = COMMON_FLOORS
        .iter()
        .enumerate()
        .flat_map(|(i, (_, ms))| ms.iter().map(move |m| (*m, i)))
        .collect();
    let unplaced: Vec<&str> = graph
        .keys()
        .map(String::as_str)
        .filter(|m| !floor.contains_key(m))
        .collect();
    assert!(
        unplaced.is_empty(),
        "modules of common in no floor (add them to COMMON_FLOORS): {unplaced:?}"
    );
    let mut upward = Vec::new();
    for (m, deps) in &graph {
        for d in deps {
            if floor[d.as_str()] > floor[m.as_str()] {
                let name = |x: &str| COMMON_FLOORS[floor[x]].0;
                upward.push(format!("{} ({}) names {} ({})", shown(m), name(m), d, name(d)));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "lower floors name higher ones:\n{}",
        upward.join("\n")
    );
}

#[test]
fn agent_has_no_import_circle() {
    assert_no_cycle("agent");
}

#[test]
fn ctl_has_no_import_circle() {
    assert_no_cycle("ctl");
}

/// The check itself finds a circle and a path through a use group.
#[test]
fn the_reader_finds_paths_in_use_groups_and_circles() {
    let code =
        code_of("use crate::{a::{B, c::D}, e};\n// crate::f\nfn x() { super::g::h(); \"crate::s\"; }\n");
    let got: Vec<String> = named_paths("m::n", &code).iter().map(|p| p.join("::")).collect();
    assert_eq!(got, ["a::B", "a::c::D", "e", "m::g::h"]);
    let tested = code_of(
        "fn a() {}\n#[cfg(test)]\nmod tests {\n    fn t() { crate::x::y(); }\n}\nfn b() { crate::z::w(); }\n",
    );
    let got: Vec<String> = named_paths("m", &tested).iter().map(|p| p.join("::")).collect();
    assert_eq!(got, ["z::w"]);
    let tricky = code_of(concat!(
        "use crate::{names as n, plan::Plan};\n",
        "const Q: char = '\\\"'; const R: &str = r#\"a\"b\"#; fn f<'a>() { crate::fleet::x(); }\n",
        "#[cfg(test)]\nmod tests;\nfn g() { crate::rules::y(); }\n",
        "#[cfg(test)]\nmod more_tests { fn t() { crate::hidden::z(); } }\n",
    ));
    let got: Vec<String> = named_paths("m", &tricky).iter().map(|p| p.join("::")).collect();
    assert_eq!(got, ["names", "plan::Plan", "fleet::x", "rules::y"]);
    let mut g = Graph::new();
    g.insert("a".into(), ["b".to_string()].into());
    g.insert("b".into(), ["c".to_string()].into());
    g.insert("c".into(), ["a".to_string()].into());
    assert_eq!(a_cycle(&g).unwrap(), ["a", "b", "c", "a"]);
    g.insert("c".into(), BTreeSet::new());
    assert!(a_cycle(&g).is_none());
}

/// No function of `common`, `agent` or `ctl` is over 80 lines: clippy's
/// `too_many_lines` is on in each crate at that threshold, the suite runs clippy
/// with `-D warnings`, and no source allows or expects the lint anywhere.
#[test]
fn no_function_is_longer_than_a_screen() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let clippy = std::fs::read_to_string(root.join("clippy.toml")).expect("clippy.toml");
    assert!(
        clippy
            .lines()
            .any(|l| l.trim() == "too-many-lines-threshold = 80"),
        "clippy.toml: the threshold is not 80"
    );
    let suite = std::fs::read_to_string(root.join("scripts/test.sh")).expect("scripts/test.sh");
    assert!(
        suite
            .lines()
            .any(|l| l.starts_with("cargo clippy --workspace --all-targets") && l.ends_with("-- -D warnings")),
        "scripts/test.sh does not run clippy with -D warnings"
    );
    for krate in ["common", "agent", "ctl"] {
        let lib = stripped(&std::fs::read_to_string(src_dir(krate).join("lib.rs")).expect("lib.rs"));
        assert!(
            lib.contains("#![warn(clippy::too_many_lines)]"),
            "{krate}: clippy::too_many_lines is not on"
        );
        for f in jio_tests::inspect::files_below(&src_dir(krate), "rs") {
            let code: String = stripped(&std::fs::read_to_string(&f).expect("source"))
                .chars()
                .filter(|c| !c.is_whitespace())
                .collect();
            let allowed = code.replace("#![warn(clippy::too_many_lines)]", "");
            assert!(
                !allowed.contains("clippy::too_many_lines") && !allowed.contains("allow(clippy::pedantic"),
                "{}: a function is let be longer than 80 lines: cut it into named steps",
                f.display()
            );
        }
    }
}

//! The manual's shape: the README stays short, `docs/README.md` lists every page of
//! the manual, and every relative link of the README and the manual leads to a
//! file that exists.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The targets of `[text](target)` links, outside code blocks and code spans.
fn links(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_block = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if in_block {
            continue;
        }
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        for (at, _) in prose.match_indices("](") {
            let rest = &prose[at + 2..];
            if let Some(end) = rest.find(')') {
                out.push(rest[..end].to_string());
            }
        }
    }
    out
}

#[test]
fn the_readme_stays_short() {
    let size = std::fs::metadata(root().join("README.md"))
        .expect("README.md")
        .len();
    assert!(
        size < 20 * 1024,
        "README.md is {size} bytes: the manual belongs in docs/"
    );
}

#[test]
fn the_manual_lists_every_page_and_every_link_resolves() {
    let mut files = vec![root().join("README.md")];
    files.extend(jio_tests::inspect::files_below(&root().join("docs"), "md"));
    assert!(files.len() > 10, "{} pages", files.len());
    let index = std::fs::read_to_string(root().join("docs/README.md")).expect("docs/README.md");
    let listed = links(&index);
    let mut broken = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("page");
        let dir = file.parent().expect("page directory");
        for target in links(&text) {
            let path = target.split('#').next().unwrap_or_default();
            if path.is_empty() || path.contains("://") {
                continue;
            }
            if !dir.join(path).exists() {
                broken.push(format!("{}: {target}", file.display()));
            }
        }
        let rel = file.strip_prefix(root().join("docs")).ok();
        if let Some(rel) = rel.filter(|r| *r != Path::new("README.md")) {
            let rel = rel.to_string_lossy();
            assert!(
                listed.iter().any(|l| *l == rel),
                "docs/README.md does not list {rel}"
            );
        }
    }
    assert!(broken.is_empty(), "links to nothing:\n{}", broken.join("\n"));
}

/// The link reader finds links in prose and leaves code alone.
#[test]
fn the_link_reader_skips_code() {
    let md = "see [a](a.md) and `[b](b.md)`\n```\n[c](c.md)\n```\n[d](d.md#x)\n";
    assert_eq!(links(md), ["a.md", "d.md#x"]);
}

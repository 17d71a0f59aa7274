//! The console's docs against the tree: every repository file docs/console.md cites in
//! backticks exists, and README's Binaries paragraph names the plugin this crate builds.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap()
}

/// The repository paths (`dir/file.ext`, relative) cited in inline code outside fenced blocks.
fn cited_paths(markdown: &str) -> Vec<String> {
    const EXTENSIONS: [&str; 8] = [
        ".rs", ".md", ".sh", ".json", ".css", ".yaml", ".toml", ".go",
    ];
    let mut fenced = false;
    let mut out = Vec::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        for span in line.split('`').skip(1).step_by(2) {
            let path_like = span.contains('/')
                && !span.starts_with('/')
                && !span.contains("://")
                && !span.chars().any(char::is_whitespace)
                && EXTENSIONS.iter().any(|e| span.ends_with(e));
            if path_like {
                out.push(span.to_string());
            }
        }
    }
    out
}

#[test]
fn every_file_the_console_doc_cites_exists() {
    let doc = read("docs/console.md");
    let cited = cited_paths(&doc);
    assert!(
        cited.iter().any(|p| p == "console/src/edit.rs"),
        "{cited:?}"
    );
    let missing: Vec<&String> = cited.iter().filter(|p| !root().join(p).exists()).collect();
    assert!(
        missing.is_empty(),
        "docs/console.md cites missing files: {missing:?}"
    );
}

#[test]
fn the_readme_binaries_paragraph_names_kubectl_gpuslice() {
    let readme = read("README.md");
    let (_, after) = readme.split_once("## Binaries\n").unwrap();
    let paragraph = after.trim_start().split("\n\n").next().unwrap();
    assert!(
        paragraph.contains("`target/release/kubectl-gpuslice`"),
        "{paragraph}"
    );
}

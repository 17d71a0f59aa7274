//! Shared by the engine registration golden tests (and the `gpuslice` CLI's tests of
//! `configure`): fixture trees staged into temp dirs, whole trees compared with their
//! expected state (`@DIR@` stands for the temp dir), and `GPUSLICE_BLESS=1` to rewrite the
//! expected files after a deliberate change.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // test helpers: a failed step fails the test

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// `configure/tests/fixtures/<engine>/<case>` (the path works from the cli package too).
pub fn fixture(engine: &str, case: &str) -> PathBuf {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../configure/tests/fixtures"
    ))
    .join(engine)
    .join(case)
}

/// Copies the tree `src` into `dst`, replacing `@DIR@` with `dst`.
pub fn stage(src: &Path, dst: &Path) {
    if !src.exists() {
        return;
    }
    for (rel, text) in tree_raw(src) {
        let p = dst.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text.replace("@DIR@", &dst.display().to_string())).unwrap();
    }
}

fn tree_raw(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap().display().to_string();
                out.insert(rel, std::fs::read_to_string(&p).unwrap());
            }
        }
    }
    out
}

/// Every file under `dir` (relative path, text with `dir` written as `@DIR@`).
pub fn tree(dir: &Path) -> BTreeMap<String, String> {
    tree_raw(dir)
        .into_iter()
        .map(|(k, v)| (k, v.replace(&dir.display().to_string(), "@DIR@")))
        .collect()
}

/// The directories under `dir` (to check that removal leaves none behind).
pub fn dirs(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd {
            let p = e.unwrap().path();
            if p.is_dir() {
                out.push(p.strip_prefix(dir).unwrap().display().to_string());
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Compares the tree under `dir` with `expected/` of the fixture (or rewrites it when
/// `GPUSLICE_BLESS=1`).
pub fn golden(engine: &str, case: &str, dir: &Path) {
    let expected_dir = fixture(engine, case).join("expected");
    let got = tree(dir);
    if std::env::var_os("GPUSLICE_BLESS").is_some() {
        let _ = std::fs::remove_dir_all(&expected_dir);
        for (rel, text) in &got {
            let p = expected_dir.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        return;
    }
    let want = tree_raw(&expected_dir);
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "{engine}/{case}: files after configure (GPUSLICE_BLESS=1 rewrites the expected tree)"
    );
    for (rel, text) in &want {
        assert_eq!(
            &got[rel], text,
            "{engine}/{case}: {rel} differs from expected/{rel} (GPUSLICE_BLESS=1 rewrites it)"
        );
    }
}

/// Mode bits of `p`.
pub fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

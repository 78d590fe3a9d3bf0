//! The layering of `src/`, as ARCHITECTURE.md declares it, holds: every
//! `crate::` path from a top-level module reaches only modules of lower
//! layers (test code left out), every module has its layer, and the graph
//! has no cycle. Reads the source as `../shared/tools/modgraph.py` does.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers declared in ARCHITECTURE.md's `layers` block, bottom first:
/// one line per layer, `name: module module ...`.
fn declared_layers() -> Vec<(String, Vec<String>)> {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURE.md"))
            .expect("ARCHITECTURE.md");
    let block = text
        .split("```layers\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a ```layers block in ARCHITECTURE.md");
    block
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let (name, modules) = line.split_once(':').expect("`layer: modules`");
            (
                name.trim().to_owned(),
                modules.split_whitespace().map(str::to_owned).collect(),
            )
        })
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Each edge between two modules, with the files that draw it.
type Edges = BTreeMap<(String, String), BTreeSet<String>>;

/// The top-level modules of `src/` and, for each, the modules its
/// non-test code names through `crate::` paths, with the files that do.
fn module_graph(src: &Path) -> (BTreeSet<String>, Edges) {
    let mut modules = BTreeSet::new();
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            modules.insert(name);
        } else if let Some(stem) = name.strip_suffix(".rs")
            && stem != "lib"
            && stem != "main"
        {
            modules.insert(stem.to_owned());
        }
    }
    let path_ref = regex::Regex::new(r"\bcrate::([a-z_][a-z0-9_]*)").unwrap();
    let group = regex::Regex::new(r"(?s)\buse\s+crate::\{([^;]*)\}").unwrap();
    let test_module = regex::Regex::new(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{").unwrap();
    let comment = regex::Regex::new(r"//[^\n]*").unwrap();
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut edges = Edges::new();
    for file in files {
        let rel = file
            .strip_prefix(src)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let name = file.file_name().unwrap().to_string_lossy();
        if rel == "lib.rs" || rel == "main.rs" || name == "tests.rs" || name.ends_with("_tests.rs")
        {
            continue;
        }
        let owner = rel
            .split('/')
            .next()
            .unwrap()
            .trim_end_matches(".rs")
            .to_owned();
        let mut text = std::fs::read_to_string(&file).unwrap();
        if let Some(m) = test_module.find(&text) {
            text.truncate(m.start());
        }
        let text = comment.replace_all(&text, "");
        let mut named: BTreeSet<String> = path_ref
            .captures_iter(&text)
            .map(|c| c[1].to_owned())
            .collect();
        for g in group.captures_iter(&text) {
            for item in g[1].split(',') {
                let first = item.trim().split("::").next().unwrap_or("");
                let first = first.trim_matches(|c: char| c == '{' || c == '}' || c.is_whitespace());
                if !first.is_empty() {
                    named.insert(first.to_owned());
                }
            }
        }
        for to in named {
            if modules.contains(&to) && to != owner {
                edges
                    .entry((owner.clone(), to))
                    .or_default()
                    .insert(rel.clone());
            }
        }
    }
    (modules, edges)
}

#[test]
fn every_module_depends_only_on_layers_below_it() {
    let layers = declared_layers();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (modules, edges) = module_graph(&src);
    let mut rank = BTreeMap::new();
    for (i, (_, members)) in layers.iter().enumerate() {
        for m in members {
            assert!(
                rank.insert(m.clone(), i).is_none(),
                "{m} is declared in two layers"
            );
        }
    }
    let unplaced: Vec<&String> = modules.iter().filter(|m| !rank.contains_key(*m)).collect();
    assert!(
        unplaced.is_empty(),
        "modules without a layer in ARCHITECTURE.md: {unplaced:?}"
    );
    let gone: Vec<&String> = rank.keys().filter(|m| !modules.contains(*m)).collect();
    assert!(
        gone.is_empty(),
        "ARCHITECTURE.md names modules src/ lacks: {gone:?}"
    );
    let upward: Vec<String> = edges
        .iter()
        .filter(|((from, to), _)| rank[to] >= rank[from])
        .map(|((from, to), files)| {
            format!(
                "{from} ({}) -> {to} ({}): {}",
                layers[rank[from]].0,
                layers[rank[to]].0,
                files.iter().cloned().collect::<Vec<_>>().join(" ")
            )
        })
        .collect();
    eprintln!(
        "{} modules in {} layers, {} module edges, {} upward",
        modules.len(),
        layers.len(),
        edges.len(),
        upward.len()
    );
    assert!(
        upward.is_empty(),
        "edges that do not go down a layer:\n{}",
        upward.join("\n")
    );
}

/// Wall-clock time is read in one place, the clock the daemon is handed
/// (`src/clock.rs`): no other non-test code calls `Utc::now()`, so tests
/// that run the daemon on a paused clock see every part follow it.
#[test]
fn wall_clock_time_is_read_only_through_the_clock() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let test_module = regex::Regex::new(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{").unwrap();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut readers = Vec::new();
    for file in files {
        let rel = file
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let name = file.file_name().unwrap().to_string_lossy();
        if rel == "clock.rs" || name == "tests.rs" || name.ends_with("_tests.rs") {
            continue;
        }
        let mut text = std::fs::read_to_string(&file).unwrap();
        if let Some(m) = test_module.find(&text) {
            text.truncate(m.start());
        }
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if ["Utc::now", "Local::now", "SystemTime::now"]
                .iter()
                .any(|read| code.contains(read))
            {
                readers.push(format!("{rel}:{}: {}", i + 1, line.trim()));
            }
        }
    }
    assert!(
        readers.is_empty(),
        "wall-clock time read outside src/clock.rs:\n{}",
        readers.join("\n")
    );
}

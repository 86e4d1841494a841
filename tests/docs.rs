//! The docs name what the code has: docs/ARCHITECTURE.md's map names every file under
//! `src/`, each with what it holds; every `.rs` file a doc names exists; every test,
//! path and function a doc names in backticks exists where it says.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

#[path = "common/source.rs"]
mod source;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The docs a reader is sent to: docs/*.md, README.md and vendor/README.md.
fn docs() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for e in fs::read_dir(repo().join("docs")).unwrap().flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "md") {
            out.push(p);
        }
    }
    out.sort();
    out.push(repo().join("README.md"));
    out.push(repo().join("vendor/README.md"));
    out.iter()
        .map(|p| {
            let rel = p.strip_prefix(repo()).unwrap().display().to_string();
            (rel, fs::read_to_string(p).unwrap())
        })
        .collect()
}

/// Every file the repository tracks below `dirs`, relative to the repository.
fn tracked(dirs: &[&str]) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            let name = e.file_name();
            if name == "target" || name.to_string_lossy().starts_with('.') {
                continue;
            }
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                out.push(p.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    for d in dirs {
        let p = repo().join(d);
        if p.is_dir() {
            walk(&repo(), &p, &mut out);
        } else {
            out.push(d.to_string());
        }
    }
    out
}

/// The map: the code block of docs/ARCHITECTURE.md that opens with `src/`, as the
/// files and folders it names (relative to `src/`), each with its description.
/// An entry is a line whose indentation is two spaces a level, naming one or more
/// files (`a.rs b.rs`) or a folder (`x/`) before its description; a deeper line
/// continues the description above it.
fn map() -> BTreeMap<String, String> {
    let text = fs::read_to_string(repo().join("docs/ARCHITECTURE.md")).unwrap();
    let block = text
        .split("```")
        .find(|b| b.trim_start().starts_with("src/"))
        .expect("docs/ARCHITECTURE.md has a code block that opens with src/");
    let mut entries: BTreeMap<String, String> = BTreeMap::new();
    // The folders open at each level, and the entries the last line named.
    let mut folders: Vec<String> = Vec::new();
    let mut last: Vec<String> = Vec::new();
    let is_name = |t: &str| {
        let stem = t.trim_end_matches('/').trim_end_matches(".rs");
        (t.ends_with(".rs") || t.ends_with('/'))
            && !stem.is_empty()
            && stem
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    };
    for line in block.lines().skip(1) {
        let indent = line.len() - line.trim_start().len();
        let tokens: Vec<&str> = line.split_whitespace().collect();
        let Some(first) = tokens.first() else {
            continue;
        };
        let level = indent / 2;
        if indent % 2 == 0 && level >= 1 && level <= folders.len() + 1 && is_name(first) {
            folders.truncate(level - 1);
            let names: Vec<&str> = tokens.iter().take_while(|t| is_name(t)).copied().collect();
            let description = tokens[names.len()..].join(" ");
            last.clear();
            for n in &names {
                let path = format!("{}{n}", folders.concat());
                entries.insert(path.clone(), description.clone());
                last.push(path);
            }
            if let [one] = names.as_slice()
                && one.ends_with('/')
            {
                folders.push(one.to_string());
            }
        } else if level == 0 {
            // Beside src/: the repository's other folders.
            folders.clear();
            last.clear();
        } else {
            for path in &last {
                let d = entries.get_mut(path).unwrap();
                d.push(' ');
                d.push_str(line.trim());
            }
        }
    }
    entries
}

#[test]
fn the_architecture_map_names_every_file_under_src() {
    let map = map();
    let files: BTreeSet<String> = source::all().into_iter().map(|s| s.rel).collect();
    let named: BTreeSet<String> = map.keys().filter(|k| k.ends_with(".rs")).cloned().collect();
    let unnamed: Vec<_> = files.difference(&named).collect();
    let gone: Vec<_> = named.difference(&files).collect();
    assert!(
        unnamed.is_empty() && gone.is_empty(),
        "docs/ARCHITECTURE.md's map does not name {unnamed:#?}, and names what is not under src/: {gone:#?}"
    );
    for (path, description) in &map {
        assert!(
            !description.is_empty(),
            "docs/ARCHITECTURE.md's map says nothing of {path}"
        );
    }
}

/// Names in backticks that look like code: a word of letters, digits and `_`.
fn code_words(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(|w| w.trim_end_matches("()").to_string())
        .filter(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .collect()
}

/// Whether `word` stands in `text` as a word of its own.
fn has_word(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        let part = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        !part(before) && !part(after)
    })
}

/// What the map's description of a file names in backticks is in that file (and what
/// it says of a folder is in the folder).
#[test]
fn what_the_map_says_a_file_holds_is_in_it() {
    let mut wrong = Vec::new();
    for (path, description) in map() {
        let code: String = if path.ends_with('/') {
            source::all()
                .into_iter()
                .filter(|s| s.rel.starts_with(&path))
                .map(|s| s.text)
                .collect()
        } else {
            fs::read_to_string(source::src().join(&path)).unwrap_or_default()
        };
        for word in code_words(&description) {
            if !has_word(&code, &word) {
                wrong.push(format!("{path}: `{word}`"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the map names what is not there: {wrong:#?}"
    );
}

/// Every `path.rs` a doc names is a file of the repository (a path's tail is enough:
/// `ops/namespace.rs`), and the backticked names a doc gives after one, in parentheses
/// (`` `volume/serve.rs` (`decide`, `Mechanism`) ``) or alone (`` `run.rs` `serve` ``),
/// are in it.
#[test]
fn the_files_a_doc_names_exist_with_what_it_says_they_hold() {
    let files = tracked(&["src", "tests", "bench", "vendor", "scripts", "build.rs"]);
    let mut wrong = Vec::new();
    for (doc, text) in docs() {
        let mut at = 0;
        while let Some(i) = text[at..].find(".rs") {
            let end = at + i + 3;
            at = end;
            let start = text[..end - 3]
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '/'))
                .map_or(0, |s| s + 1);
            let path = &text[start..end];
            let after = text[end..].chars().next();
            // A placeholder (`tests/TEST.rs`) names no file.
            if path.len() <= 3
                || path.starts_with('/')
                || path.chars().any(|c| c.is_ascii_uppercase())
                || after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
            {
                continue;
            }
            let matching: Vec<&String> = files
                .iter()
                .filter(|f| *f == path || f.ends_with(&format!("/{path}")))
                .collect();
            if matching.is_empty() {
                wrong.push(format!("{doc}: {path} is no file"));
                continue;
            }
            // `path.rs` (`a`, `b`), or `path.rs` `a`: what it holds.
            let rest = text[end..].trim_start_matches('`');
            let held_names = rest
                .strip_prefix(" (")
                .and_then(|r| r.split_once(')'))
                .map(|(inside, _)| inside)
                .or_else(|| {
                    rest.strip_prefix(" `")
                        .and_then(|r| r.split_once('`'))
                        .map(|(name, _)| &rest[1..name.len() + 3])
                });
            if let Some(inside) = held_names {
                let held: String = matching
                    .iter()
                    .map(|f| fs::read_to_string(repo().join(f)).unwrap_or_default())
                    .collect();
                for word in code_words(inside) {
                    if !has_word(&held, &word) {
                        wrong.push(format!("{doc}: {path} holds no `{word}`"));
                    }
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// Names of other projects' code the docs cite in backticks (the kernel's), which the
/// test below cannot find here.
const OUTSIDE: &[&str] = &[
    "nfs_access_get_cached_locked",
    "fuse_dio_wr_exclusive_lock",
    "__x64_sys_statx",
];

/// Every name a doc gives in backticks that reads as one of ours is in the code: a
/// path (`serve::decide`, `Policy::Plain`) whose first part is one of the crate's
/// modules or types, and a name of five words or more (`a_view_outlives_...`), which
/// is a test's or a function's. Metric names are checked against the metrics by
/// tests/deploy.rs.
#[test]
fn every_test_and_function_a_doc_names_exists() {
    let mut words = BTreeSet::new();
    let mut modules = BTreeSet::new();
    for f in tracked(&["src", "tests", "bench", "scripts", "vendor"]) {
        let Ok(text) = fs::read_to_string(repo().join(&f)) else {
            continue;
        };
        if f.starts_with("src/") {
            for part in f.trim_end_matches(".rs").split('/').skip(1) {
                modules.insert(part.to_string());
            }
        }
        let mut word = String::new();
        for c in text.chars().chain(std::iter::once(' ')) {
            if c.is_ascii_alphanumeric() || c == '_' {
                word.push(c);
            } else if !word.is_empty() {
                words.insert(std::mem::take(&mut word));
            }
        }
    }
    let mut wrong = Vec::new();
    for (doc, text) in docs() {
        for span in text.split('`').skip(1).step_by(2) {
            let name = span.split('(').next().unwrap_or_default();
            let path: Vec<&str> = name.split("::").collect();
            let ident = |s: &str| {
                !s.is_empty()
                    && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && !s.starts_with(|c: char| c.is_ascii_digit())
            };
            if !path.iter().all(|p| ident(p)) {
                continue;
            }
            let ours = if path.len() > 1 {
                let first = path[0];
                modules.contains(first)
                    || first == "crate"
                    || (first.starts_with(|c: char| c.is_ascii_uppercase())
                        && words.contains(first))
            } else {
                name.matches('_').count() >= 4
                    && name.chars().all(|c| !c.is_ascii_uppercase())
                    && !name.starts_with("mountgroup_")
                    && !name.starts_with("kubelet_")
                    && !OUTSIDE.contains(&name)
            };
            if ours && !words.contains(*path.last().unwrap()) {
                wrong.push(format!("{doc}: `{span}`"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the docs name what the code does not have: {wrong:#?}"
    );
}

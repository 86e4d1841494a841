//! The layers as the tree shows them (src/lib.rs): `csi` → `driver` (the composition
//! root) → `volume`/`share` → `transport` → `fs` → `sys`, with `config` below all but
//! `sys` and `kube` beside `driver`. Each sees only the ones below it, only `transport`
//! sees fuser, only `csi` sees tonic, and the filesystem's own modules depend on each
//! other one way. Read from the sources, comments left out.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The code of a file: every line but comments.
fn code(path: &Path) -> String {
    fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The files of a room, `src/<name>/` or `src/<name>.rs`, relative to `src/`, with
/// their code (a file's tests, after `#[cfg(test)]`, left out).
fn layer(name: &str) -> Vec<(String, String)> {
    let mut files = Vec::new();
    let file = src().join(format!("{name}.rs"));
    if file.is_file() {
        files.push(file);
    } else {
        sources(&src().join(name), &mut files);
    }
    assert!(!files.is_empty(), "no room {name} under src/");
    files.sort();
    files
        .iter()
        .map(|p| {
            let rel = p.strip_prefix(src()).unwrap().display().to_string();
            let code = code(p);
            let outside_tests = code.split("#[cfg(test)]").next().unwrap().to_string();
            (rel, outside_tests)
        })
        .collect()
}

#[test]
fn each_layer_sees_only_the_ones_below() {
    // Room (a folder or a top-level file) → what it must not name. csi adapts gRPC to
    // the driver that driver.rs assembles; kube answers volume's pod lookup.
    const ABOVE_SHARE: &[&str] = &["crate::csi", "crate::driver", "crate::kube"];
    let rules: &[(&str, &[&str])] = &[
        (
            "sys",
            &[
                "crate::fs",
                "crate::transport",
                "crate::volume",
                "crate::csi",
                "crate::share",
                "crate::config",
                "crate::driver",
                "crate::kube",
            ],
        ),
        (
            "fs",
            &[
                "crate::transport",
                "crate::volume",
                "crate::csi",
                "crate::share",
                "crate::driver",
                "crate::kube",
            ],
        ),
        (
            "transport",
            &[
                "crate::volume",
                "crate::csi",
                "crate::share",
                "crate::driver",
                "crate::kube",
            ],
        ),
        ("volume", ABOVE_SHARE),
        (
            "share",
            &[
                "crate::volume",
                "crate::transport",
                "crate::fs",
                "crate::csi",
                "crate::driver",
                "crate::kube",
            ],
        ),
        (
            "config",
            &[
                "crate::volume",
                "crate::transport",
                "crate::fs",
                "crate::share",
                "crate::csi",
                "crate::driver",
                "crate::kube",
            ],
        ),
        ("kube", &["crate::csi", "crate::driver"]),
        ("driver", &["crate::csi"]),
    ];
    let mut wrong = Vec::new();
    for (name, banned) in rules {
        for (file, code) in layer(name) {
            for b in *banned {
                if code.contains(b) {
                    wrong.push(format!("{file} names {b}"));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// Also: system calls are made in sys/ only. No other module's code (its tests aside,
/// which stand at the end of a file after `#[cfg(test)]`) names rustix or calls libc.
#[test]
fn only_transport_sees_fuser_only_csi_sees_tonic_and_only_sys_sees_io_uring() {
    let mut files = Vec::new();
    sources(&src(), &mut files);
    let mut wrong = Vec::new();
    for p in files {
        let rel = p.strip_prefix(src()).unwrap().display().to_string();
        let code = code(&p);
        if code.contains("fuser::") && !rel.starts_with("transport/") {
            wrong.push(format!("{rel} uses fuser"));
        }
        if code.contains("tonic::") && !rel.starts_with("csi/") {
            wrong.push(format!("{rel} uses tonic"));
        }
        // The ring's submissions carry raw pointers into buffers the kernel writes.
        if code.contains("io_uring::") && !rel.starts_with("sys/") {
            wrong.push(format!("{rel} uses io_uring"));
        }
        let outside_tests = code.split("#[cfg(test)]").next().unwrap();
        if !rel.starts_with("sys/") && outside_tests.contains("rustix::") {
            wrong.push(format!("{rel} uses rustix"));
        }
        if !rel.starts_with("sys/")
            && outside_tests.contains("libc::")
            && outside_tests.contains("unsafe")
        {
            wrong.push(format!("{rel} calls libc"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn the_filesystems_modules_depend_on_each_other_one_way() {
    // Module (fs's top-level file or folder) → the fs modules it names.
    let mut deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (file, code) in layer("fs") {
        let module = file
            .trim_start_matches("fs/")
            .split(['/', '.'])
            .next()
            .unwrap()
            .to_string();
        if module == "mod" {
            continue;
        }
        let entry = deps.entry(module.clone()).or_default();
        for prefix in ["super::super::", "super::", "crate::fs::"] {
            for (i, _) in code.match_indices(prefix) {
                let rest = &code[i + prefix.len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                // `super::x` inside ops/ names ops's own files.
                let inside_ops = file.starts_with("fs/ops/") && prefix == "super::";
                if !name.is_empty() && name != module && !inside_ops && name != "super" {
                    entry.insert(name);
                }
            }
        }
    }
    // No cycle: a depth-first search that meets a module on its own path.
    fn visit(
        m: &str,
        deps: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == m) {
            let mut cycle = path[at..].to_vec();
            cycle.push(m.to_string());
            return Some(cycle);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for d in deps.get(m).into_iter().flatten() {
            if let Some(c) = visit(d, deps, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for m in deps.keys() {
        if let Some(cycle) = visit(m, &deps, &mut Vec::new(), &mut done) {
            panic!("fs/ modules in a circle: {}\n{deps:#?}", cycle.join(" → "));
        }
    }
    // And the graph is what was meant: the tables' plain data at the bottom.
    assert!(deps["snapshot"].is_empty(), "{deps:#?}");
    assert!(deps["inode"].contains("journal"), "{deps:#?}");
}

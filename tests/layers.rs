//! The layers as the tree shows them (src/lib.rs): `csi` → `driver` (the composition
//! root) → `kube` → `volume` → `share`, `transport` → `fs` → `sys`, with `config`,
//! `logfile`, `pathkey` and `wire` on the floors their users stand on. Every top-level
//! module has a rule naming what it may see; what a rule does not name is refused, and
//! an exception is a line of its own with its reason. Only `transport` sees fuser,
//! only `csi` sees tonic, only `sys` makes system calls, and inside each room the
//! files depend on each other one way. Read from the whole of each file's production
//! code (tests/common/source.rs: every item under `#[cfg(test)]` left out, wherever it
//! stands), comments left out.

use std::collections::{BTreeMap, BTreeSet};

#[path = "common/source.rs"]
mod source;

/// Room (a folder or a top-level file under src/, by its module name) → the rooms
/// it may name. `main` is the binary, which names the library as `mountgroup::`.
const RULES: &[(&str, &[&str])] = &[
    ("sys", &[]),
    ("pathkey", &[]),
    ("wire", &[]),
    ("config", &["sys"]),
    ("logfile", &["sys"]),
    ("fs", &["config", "sys"]),
    ("transport", &["fs", "config", "sys", "pathkey", "wire"]),
    ("share", &["config", "sys"]),
    (
        "volume",
        &[
            "share",
            "transport",
            "fs",
            "config",
            "sys",
            "pathkey",
            "logfile",
            "wire",
        ],
    ),
    // kube answers volume's pod lookup (`volume::serve::PodLookup`).
    ("kube", &["volume"]),
    ("driver", &["kube", "volume", "share", "transport", "sys"]),
    ("csi", &["driver", "volume", "share", "config"]),
    (
        "main",
        &[
            "csi",
            "kube",
            "volume",
            "share",
            "transport",
            "config",
            "logfile",
        ],
    ),
    ("lib", &[]),
];

/// A room that names a module of a room its rule does not: (room, the module's path,
/// why).
const EXCEPTIONS: &[(&str, &str, &str)] = &[
    (
        "csi",
        "transport::stats",
        "metrics.rs exports the stats snapshot each view process writes",
    ),
    (
        "csi",
        "transport::probe",
        "metrics.rs exports what the kernel's FUSE offers, asked once at start",
    ),
];

/// The room a file under src/ is in: its first component, `.rs` left off.
fn room(rel: &str) -> &str {
    rel.split('/').next().unwrap().trim_end_matches(".rs")
}

/// The rooms (and the module just below each) a file's code names: `crate::x::y` in the
/// library, `mountgroup::x::y` in the binary.
fn named(code: &str, prefix: &str) -> BTreeSet<(String, String)> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices(prefix) {
        // `mountgroup::` as a word, not the tail of another name.
        if code[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &code[i + prefix.len()..];
        let first = ident(rest);
        let second = rest[first.len()..]
            .strip_prefix("::")
            .map(ident)
            .unwrap_or_default();
        if !first.is_empty() {
            out.insert((first, second));
        }
    }
    out
}

#[test]
fn each_room_names_only_what_its_rule_lets_it() {
    let sources = source::all();
    let mut wrong = Vec::new();
    let mut rooms = BTreeSet::new();
    for s in &sources {
        let r = room(&s.rel);
        rooms.insert(r.to_string());
        let Some((_, may)) = RULES.iter().find(|(name, _)| *name == r) else {
            wrong.push(format!("{}: the room {r} has no rule in RULES", s.rel));
            continue;
        };
        let prefix = if r == "main" {
            "mountgroup::"
        } else {
            "crate::"
        };
        for (first, second) in named(&s.production(), prefix) {
            if first == r || may.contains(&first.as_str()) {
                continue;
            }
            let module = format!("{first}::{second}");
            if EXCEPTIONS
                .iter()
                .any(|(er, em, _)| *er == r && *em == module)
            {
                continue;
            }
            wrong.push(format!("{} names {prefix}{module}", s.rel));
        }
    }
    for (name, _) in RULES {
        assert!(
            rooms.contains(*name),
            "RULES has {name}, which is no room under src/"
        );
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// Also: system calls are made in sys/ only. No other module's production code names
/// rustix or calls libc.
#[test]
fn only_transport_sees_fuser_only_csi_sees_tonic_and_only_sys_sees_io_uring() {
    let mut wrong = Vec::new();
    for s in source::all() {
        let rel = &s.rel;
        let whole: String = s
            .text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        if whole.contains("fuser::") && !rel.starts_with("transport/") {
            wrong.push(format!("{rel} uses fuser"));
        }
        if whole.contains("tonic::") && !rel.starts_with("csi/") {
            wrong.push(format!("{rel} uses tonic"));
        }
        // The ring's submissions carry raw pointers into buffers the kernel writes.
        if whole.contains("io_uring::") && !rel.starts_with("sys/") {
            wrong.push(format!("{rel} uses io_uring"));
        }
        let production = s.production();
        if !rel.starts_with("sys/") && production.contains("rustix::") {
            wrong.push(format!("{rel} uses rustix"));
        }
        if !rel.starts_with("sys/")
            && production.contains("libc::")
            && production.contains("unsafe")
        {
            wrong.push(format!("{rel} calls libc"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// A room's modules (the files and folders just inside it, its mod.rs aside) → the
/// modules of the same room each names.
fn modules_of(room: &str) -> BTreeMap<String, BTreeSet<String>> {
    let sources: Vec<_> = source::all()
        .into_iter()
        .filter(|s| s.rel.starts_with(&format!("{room}/")))
        .collect();
    let module = |rel: &str| -> String {
        rel[room.len() + 1..]
            .split(['/', '.'])
            .next()
            .unwrap()
            .to_string()
    };
    let names: BTreeSet<String> = sources.iter().map(|s| module(&s.rel)).collect();
    let mut deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in &sources {
        let m = module(&s.rel);
        if m == "mod" {
            continue;
        }
        let code = s.production();
        let entry = deps.entry(m.clone()).or_default();
        // A file just inside the room names its siblings as `super::x`; a file one
        // folder deeper as `super::super::x` (its own `super::` is its folder).
        let deeper = s.rel[room.len() + 1..].contains('/');
        let sibling = if deeper { "super::super::" } else { "super::" };
        let whole = format!("crate::{room}::");
        for prefix in [sibling, whole.as_str()] {
            for (i, _) in code.match_indices(prefix) {
                if prefix == "super::" && code[..i].ends_with("super::") {
                    continue;
                }
                let name: String = code[i + prefix.len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if name != m && names.contains(&name) && name != "mod" {
                    entry.insert(name);
                }
            }
        }
    }
    deps
}

/// The first circle a depth-first search meets, if any.
fn circle(deps: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
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
    deps.keys()
        .find_map(|m| visit(m, deps, &mut Vec::new(), &mut done))
}

#[test]
fn inside_each_room_the_files_depend_on_each_other_one_way() {
    let mut circles = Vec::new();
    for room in ["csi", "volume", "share", "transport", "fs", "sys"] {
        let deps = modules_of(room);
        if let Some(c) = circle(&deps) {
            circles.push(format!("{room}/: {}", c.join(" → ")));
        }
    }
    assert!(circles.is_empty(), "files in a circle: {circles:#?}");
    // And fs's graph is what was meant: the tables' plain data at the bottom.
    let fs = modules_of("fs");
    assert!(fs["snapshot"].is_empty(), "{fs:#?}");
    assert!(fs["inode"].contains("journal"), "{fs:#?}");
}

/// The reader itself: a test hook early in a file does not hide the production code
/// after it, and a test module at the end is left out.
#[test]
fn the_reader_sees_production_code_after_a_test_hook() {
    let s = source::read(&source::src().join("fs/ops/records.rs"));
    let production = s.production();
    assert!(s.text.find("mod record_reads") < s.text.find("fn record_for"));
    assert!(
        production.contains("fn record_for"),
        "ViewFs::record_for is production code"
    );
    assert!(!production.contains("mod record_reads"));
    assert!(!production.contains("mod tests {"));
    // A file a `#[cfg(test)] mod x;` declares is all test.
    let all = source::all();
    let fixtures = all.iter().find(|s| s.rel == "fs/ops/fixtures.rs").unwrap();
    assert_eq!(fixtures.production_lines(), 0);
}

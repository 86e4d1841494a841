//! Random operation sequences on the plain view and on a plain directory give the same
//! observable results: every return value, and the final tree (names, kinds, modes,
//! sizes, contents, link counts).

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use common::*;

const NAMES: &[&str] = &["a", "b", "d", "d/a", "d/b", "d/e", "d/e/a", "x"];

#[derive(Clone, Debug)]
enum Op {
    Create(usize, Vec<u8>),
    Write(usize, u64, Vec<u8>),
    Truncate(usize, u64),
    Rename(usize, usize),
    Link(usize, usize),
    Unlink(usize),
    Mkdir(usize),
    Rmdir(usize),
    Chmod(usize, u32),
    Symlink(usize, usize),
}

fn op() -> impl Strategy<Value = Op> {
    let n = 0..NAMES.len();
    let bytes = proptest::collection::vec(any::<u8>(), 0..64);
    prop_oneof![
        (n.clone(), bytes.clone()).prop_map(|(i, b)| Op::Create(i, b)),
        (n.clone(), 0u64..200, bytes).prop_map(|(i, o, b)| Op::Write(i, o, b)),
        (n.clone(), 0u64..200).prop_map(|(i, l)| Op::Truncate(i, l)),
        (n.clone(), n.clone()).prop_map(|(a, b)| Op::Rename(a, b)),
        (n.clone(), n.clone()).prop_map(|(a, b)| Op::Link(a, b)),
        n.clone().prop_map(Op::Unlink),
        n.clone().prop_map(Op::Mkdir),
        n.clone().prop_map(Op::Rmdir),
        (n.clone(), 0u32..0o1000).prop_map(|(i, m)| Op::Chmod(i, m)),
        (n.clone(), n).prop_map(|(a, b)| Op::Symlink(a, b)),
    ]
}

fn code<T>(r: std::io::Result<T>) -> Result<(), i32> {
    r.map(|_| ()).map_err(|e| e.raw_os_error().unwrap_or(-1))
}

fn apply(root: &Path, op: &Op) -> Result<(), i32> {
    let p = |i: usize| root.join(NAMES[i]);
    match op {
        Op::Create(i, data) => code(fs::write(p(*i), data)),
        Op::Write(i, off, data) => code((|| {
            let mut f = fs::OpenOptions::new().write(true).open(p(*i))?;
            f.seek(SeekFrom::Start(*off))?;
            f.write_all(data)
        })()),
        Op::Truncate(i, len) => code(
            fs::OpenOptions::new()
                .write(true)
                .open(p(*i))
                .and_then(|f| f.set_len(*len)),
        ),
        Op::Rename(a, b) => code(fs::rename(p(*a), p(*b))),
        Op::Link(a, b) => code(fs::hard_link(p(*a), p(*b))),
        Op::Unlink(i) => code(fs::remove_file(p(*i))),
        Op::Mkdir(i) => code(fs::create_dir(p(*i))),
        Op::Rmdir(i) => code(fs::remove_dir(p(*i))),
        Op::Chmod(i, m) => code(fs::set_permissions(p(*i), fs::Permissions::from_mode(*m))),
        Op::Symlink(a, b) => code(std::os::unix::fs::symlink(NAMES[*a], p(*b))),
    }
}

/// What a tree looks like from the outside.
fn observe(root: &Path) -> Tree {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            let m = fs::symlink_metadata(&path).unwrap();
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let (kind, content) = if m.is_dir() {
                stack.push(path.clone());
                ('d', Vec::new())
            } else if m.file_type().is_symlink() {
                (
                    'l',
                    fs::read_link(&path)
                        .unwrap()
                        .into_os_string()
                        .into_encoded_bytes(),
                )
            } else {
                ('f', fs::read(&path).unwrap())
            };
            let size = if kind == 'd' { 0 } else { m.len() };
            let mode = if kind == 'l' { 0 } else { m.mode() & 0o7777 };
            out.insert(rel, (kind, mode, size, m.nlink(), content));
        }
    }
    out
}

type Tree = BTreeMap<String, (char, u32, u64, u64, Vec<u8>)>;

/// Runs `cases` random sequences on a view mounted with `options` and on a plain
/// directory; `comparable` picks what of the final trees must agree.
fn compare_with_plain_directory(options: &str, cases: u32, comparable: fn(Tree) -> Tree) {
    let f = Fixture::new();
    let reference = f.subdir("reference");
    let _m = f.mount(options);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let case = std::sync::atomic::AtomicU32::new(0);
    let result = runner.run(&proptest::collection::vec(op(), 1..40), |ops| {
        let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let view = f.mnt.join(format!("case{n}"));
        let plain = reference.join(format!("case{n}"));
        fs::create_dir(&view).unwrap();
        fs::create_dir(&plain).unwrap();
        for (step, op) in ops.iter().enumerate() {
            let (got, want) = (apply(&view, op), apply(&plain, op));
            if got != want {
                return Err(TestCaseError::fail(format!(
                    "step {step} {op:?}: view {got:?}, plain {want:?}"
                )));
            }
        }
        let (v, p) = (comparable(observe(&view)), comparable(observe(&plain)));
        if v != p {
            return Err(TestCaseError::fail(format!(
                "trees differ:\nview  {v:?}\nplain {p:?}"
            )));
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{options}: {e}");
    }
}

#[test]
fn the_plain_view_behaves_like_a_plain_directory() {
    compare_with_plain_directory("attr_timeout=0,entry_timeout=0", 48, |t| t);
}

#[test]
fn the_group_view_keeps_the_plain_directorys_data_and_names() {
    // With a group the modes differ by design; names, kinds, sizes, contents, link
    // counts and the result of every operation do not.
    compare_with_plain_directory("gid=4242,attr_timeout=0,entry_timeout=0", 32, |t| {
        t.into_iter()
            .map(|(k, (kind, _, size, nlink, c))| (k, (kind, 0, size, nlink, c)))
            .collect()
    });
}

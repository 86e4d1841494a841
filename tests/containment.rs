//! The root daemon never reaches outside its backing directory: not through a
//! directory swapped for a symlink, not through `..`, not into a nested mount.

mod common;

use std::fs;
use std::os::unix::fs::symlink;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;

const SECRET: &str = "outside secret";

/// A view mounted one level deeper than the backing tree, so that a relative symlink
/// such as `../outside` names the secret only when resolved from the backing side:
/// reading the secret through the view would mean the daemon followed the link.
fn deep_mount(f: &Fixture) -> (std::path::PathBuf, Mounted) {
    let mnt = f.subdir("deeper/mnt");
    let m = Mounted::start(
        &f.src,
        &mnt,
        &["-o", "gid=4242,attr_timeout=0,entry_timeout=0"],
    )
    .unwrap();
    (mnt, m)
}

#[test]
fn a_directory_swapped_for_a_symlink_never_exposes_the_outside() {
    let f = Fixture::new();
    // The secret sits next to the backing tree; `../outside` from inside `src` is it,
    // while the same relative link seen from `mnt` resolves to nothing.
    let outside = f.subdir("outside");
    fs::write(outside.join("secret"), SECRET).unwrap();
    fs::create_dir(f.src.join("d")).unwrap();
    fs::write(f.src.join("d/secret"), "inside").unwrap();
    let (mnt, _m) = deep_mount(&f);

    // Look the directory up (the view now holds it by descriptor), then swap it.
    assert_eq!(fs::read_to_string(mnt.join("d/secret")).unwrap(), "inside");
    let held = fs::File::open(mnt.join("d")).unwrap();
    fs::rename(f.src.join("d"), f.src.join("d.moved")).unwrap();
    symlink("../outside", f.src.join("d")).unwrap();

    // Through the handle of the looked-up directory: still the original one.
    let via_handle = format!(
        "/proc/self/fd/{}/secret",
        std::os::fd::AsRawFd::as_raw_fd(&held)
    );
    assert_eq!(fs::read_to_string(via_handle).unwrap(), "inside");
    // A fresh lookup shows a symlink, which the daemon never follows: the caller
    // resolves `../outside` in its own view of the world, where it does not exist.
    let meta = fs::symlink_metadata(mnt.join("d")).unwrap();
    assert!(meta.file_type().is_symlink());
    assert_eq!(
        fs::read_link(mnt.join("d")).unwrap().to_str(),
        Some("../outside")
    );
    assert!(fs::read_to_string(mnt.join("d/secret")).is_err());
    for entry in walk(&mnt) {
        if let Ok(text) = fs::read_to_string(&entry) {
            assert_ne!(text, SECRET, "{} exposes the outside", entry.display());
        }
    }
}

#[test]
fn racing_swaps_never_expose_the_outside() {
    let f = Fixture::new();
    let outside = f.subdir("outside");
    fs::write(outside.join("secret"), SECRET).unwrap();
    fs::create_dir(f.src.join("d")).unwrap();
    fs::write(f.src.join("d/secret"), "inside").unwrap();
    let (mnt, _m) = deep_mount(&f);

    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let stop = Arc::clone(&stop);
        let src = f.src.clone();
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // d is a directory, then a symlink to the outside, then a directory again.
                let _ = fs::rename(src.join("d"), src.join("d.real"));
                let _ = symlink("../outside", src.join("d"));
                let _ = fs::remove_file(src.join("d"));
                let _ = fs::rename(src.join("d.real"), src.join("d"));
                n += 1;
            }
            n
        })
    };
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut reads = 0u64;
    while Instant::now() < deadline {
        for path in [mnt.join("d/secret"), mnt.join("d.real/secret")] {
            if let Ok(text) = fs::read_to_string(&path) {
                assert_ne!(text, SECRET, "read the outside through {}", path.display());
                reads += 1;
            }
        }
        if let Ok(entries) = fs::read_dir(mnt.join("d")) {
            for e in entries.flatten() {
                if let Ok(text) = fs::read_to_string(e.path()) {
                    assert_ne!(text, SECRET);
                }
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    assert!(
        swaps > 100 && reads > 10,
        "the race ran: {swaps} swaps, {reads} reads"
    );
}

#[test]
fn dot_dot_and_nested_mounts_are_not_crossed() {
    let f = Fixture::new();
    let outside = f.subdir("outside");
    fs::write(outside.join("secret"), SECRET).unwrap();
    fs::create_dir(f.src.join("nested")).unwrap();
    // A mount inside the backing tree (a second view of the outside).
    let _inner = Mounted::start(&outside, &f.src.join("nested"), &["-o", "gid=1"]).unwrap();
    assert_eq!(
        fs::read_to_string(f.src.join("nested/secret")).unwrap(),
        SECRET
    );
    let _m = f.mount("gid=4242");
    assert!(
        fs::read_to_string(f.mnt.join("nested/secret")).is_err(),
        "the nested mount is not crossed"
    );
    // `..` at the root of the view is the mount's parent in the caller's namespace.
    assert_eq!(
        fs::canonicalize(f.mnt.join("..")).unwrap(),
        fs::canonicalize(f.dir.path()).unwrap()
    );
    let names: Vec<String> = fs::read_dir(&f.mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!names.contains(&"secret".to_string()), "{names:?}");
}

fn walk(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        if let Ok(entries) = fs::read_dir(&p) {
            for e in entries.flatten() {
                let path = e.path();
                if fs::symlink_metadata(&path)
                    .map(|m| m.is_dir())
                    .unwrap_or(false)
                {
                    stack.push(path.clone());
                }
                out.push(path);
            }
        }
    }
    out
}

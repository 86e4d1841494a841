//! Secret-like content for read-only inline views, laid out as kubelet's AtomicWriter
//! lays out Secret volumes, so applications that watch `..data` keep working:
//!
//! ```text
//! ..2026_11_22_03_15_00.123456789/   the payload of one version (never changed)
//! ..data -> ..2026_11_22_03_15_00.123456789
//! key1 -> ..data/key1                 one symlink per top-level name
//! ```
//!
//! A new version is written to a new timestamped directory, then `..data` is swapped
//! to it with one rename, so a reader that resolves `..data` once sees one version
//! whole. The content lives on a private tmpfs (memory) and nowhere else: never on the
//! share, never in the state file, never in a log.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::VolumeError;

const DATA: &str = "..data";
const DATA_TMP: &str = "..data_tmp";

/// The files of one version: relative path → content. Its Debug never shows content.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Payload(pub BTreeMap<PathBuf, Vec<u8>>);

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Payload({:?}, <{} files redacted>)",
            self.0.keys().collect::<Vec<_>>(),
            self.0.len()
        )
    }
}

/// Checks a payload path: relative, made of plain names, no name starting with `..`
/// (those belong to the layout), so it can never point outside the payload.
///
/// # Errors
/// A message saying what is wrong with it.
pub fn check_path(p: &str) -> Result<PathBuf, String> {
    if p.is_empty() || p.len() > 4096 {
        return Err("is empty or too long".into());
    }
    let path = Path::new(p);
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => {
                let n = n.to_string_lossy();
                if n.starts_with("..") || n.len() > 255 {
                    return Err(format!("has a name {n:?} that is reserved or too long"));
                }
                out.push(c);
            }
            _ => {
                return Err(
                    "must be a relative path of plain names (no `/` at the start, no `.` or `..`)"
                        .into(),
                );
            }
        }
    }
    Ok(out)
}

fn io(what: &str, path: &Path) -> impl FnOnce(std::io::Error) -> VolumeError {
    let msg = format!("{what} {}", path.display());
    move |e| VolumeError::Internal(format!("{msg}: {e}"))
}

/// The version `..data` points at now, read back (content and paths).
fn current(dir: &Path) -> Option<Payload> {
    let target = fs::read_link(dir.join(DATA)).ok()?;
    let root = dir.join(target);
    let mut out = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in fs::read_dir(root.join(&rel)).ok()? {
            let e = e.ok()?;
            let r = rel.join(e.file_name());
            if e.file_type().ok()?.is_dir() {
                stack.push(r);
            } else {
                out.insert(r, fs::read(e.path()).ok()?);
            }
        }
    }
    Some(Payload(out))
}

/// The largest payload accepted (a Kubernetes Secret holds at most 1 MiB).
pub const MAX_PAYLOAD: usize = 1 << 20;

/// The files of a secret view: every secret under its key, or the chosen `items`
/// under their paths.
///
/// # Errors
/// `InvalidArgument` for no secrets, an item naming a key the secrets lack, a key
/// that is not a usable file name, or more than [`MAX_PAYLOAD`] bytes.
pub fn payload(secrets: &Payload, spec: &super::SecretSpec) -> Result<Payload, VolumeError> {
    let invalid = VolumeError::InvalidArgument;
    if secrets.0.is_empty() {
        return Err(invalid(
            "secrets: a secret view needs the pod's nodePublishSecretRef and a Secret with at least one key".into(),
        ));
    }
    let mut out = BTreeMap::new();
    match &spec.items {
        None => {
            for (key, value) in &secrets.0 {
                let path = check_path(&key.to_string_lossy())
                    .map_err(|why| invalid(format!("secrets: key {key:?} {why}")))?;
                out.insert(path, value.clone());
            }
        }
        Some(items) => {
            for (key, path) in items {
                let value = secrets.0.get(Path::new(key)).ok_or_else(|| {
                    invalid(format!(
                        "volume_context.items: the secrets have no key {key:?}"
                    ))
                })?;
                out.insert(path.clone(), value.clone());
            }
        }
    }
    if out.values().map(Vec::len).sum::<usize>() > MAX_PAYLOAD {
        return Err(invalid(format!("secrets: more than {MAX_PAYLOAD} bytes")));
    }
    Ok(Payload(out))
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// Makes `payload` the current version in `dir` with file mode `mode`. Returns false
/// (and changes nothing) when it already is.
///
/// # Errors
/// `Internal` naming the step and path that failed.
pub fn write(dir: &Path, payload: &Payload, mode: u32) -> Result<bool, VolumeError> {
    if current(dir).as_ref() == Some(payload) {
        return Ok(false);
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let version = format!(
        "..{}.{:09}.{}",
        now.as_secs(),
        now.subsec_nanos(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    );
    let vdir = dir.join(&version);
    fs::create_dir(&vdir).map_err(io("creating", &vdir))?;
    for (rel, content) in &payload.0 {
        let path = vdir.join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(io("creating", parent))?;
        }
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&path)
            .map_err(io("writing", &path))?;
        f.write_all(content).map_err(io("writing", &path))?;
        // The creation mode went through the umask; set it exactly.
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).map_err(io("chmod", &path))?;
    }
    let old = fs::read_link(dir.join(DATA)).ok();
    // Swap `..data` in one rename: readers see the old version or the new, whole.
    let tmp = dir.join(DATA_TMP);
    let _ = fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&version, &tmp).map_err(io("linking", &tmp))?;
    fs::rename(&tmp, dir.join(DATA)).map_err(io("swapping", &dir.join(DATA)))?;
    // Top-level names point through `..data`; add new ones, drop vanished ones.
    let tops: std::collections::BTreeSet<PathBuf> = payload
        .0
        .keys()
        .filter_map(|p| p.components().next().map(|c| PathBuf::from(c.as_os_str())))
        .collect();
    for top in &tops {
        let link = dir.join(top);
        if fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new(DATA).join(top), &link)
                .map_err(io("linking", &link))?;
        }
    }
    for e in fs::read_dir(dir).map_err(io("listing", dir))? {
        let e = e.map_err(io("listing", dir))?;
        let name = PathBuf::from(e.file_name());
        if !name.to_string_lossy().starts_with("..") && !tops.contains(&name) {
            fs::remove_file(e.path()).map_err(io("removing", &e.path()))?;
        }
    }
    if let Some(old) = old {
        let _ = fs::remove_dir_all(dir.join(old));
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(items: &[(&str, &str)]) -> Payload {
        Payload(
            items
                .iter()
                .map(|(k, v)| (PathBuf::from(k), v.as_bytes().to_vec()))
                .collect(),
        )
    }

    #[test]
    fn versions_swap_whole_and_stale_names_go() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert!(
            write(
                d,
                &payload(&[("a", "1"), ("b", "1"), ("sub/c", "1")]),
                0o440
            )
            .unwrap()
        );
        assert_eq!(fs::read_to_string(d.join("a")).unwrap(), "1");
        assert_eq!(fs::read_to_string(d.join("sub/c")).unwrap(), "1");
        assert_eq!(
            fs::read_link(d.join("a")).unwrap(),
            PathBuf::from("..data/a")
        );
        let first = fs::read_link(d.join(DATA)).unwrap();
        assert_eq!(
            fs::metadata(d.join("a")).unwrap().permissions().mode() & 0o777,
            0o440
        );
        assert!(
            !write(
                d,
                &payload(&[("a", "1"), ("b", "1"), ("sub/c", "1")]),
                0o440
            )
            .unwrap(),
            "unchanged: no new version"
        );
        assert_eq!(fs::read_link(d.join(DATA)).unwrap(), first);
        assert!(write(d, &payload(&[("a", "2"), ("d", "2")]), 0o440).unwrap());
        assert_eq!(fs::read_to_string(d.join("a")).unwrap(), "2");
        assert!(
            !d.join("b").exists() && fs::symlink_metadata(d.join("b")).is_err(),
            "vanished names removed"
        );
        assert!(!d.join(&first).exists(), "the old version is gone");
        let names: Vec<String> = fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 4, "{names:?}: ..version, ..data, a, d");
    }

    #[test]
    fn paths_cannot_escape() {
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "..data",
            "a/..b",
            "./a",
        ] {
            assert!(check_path(bad).is_err(), "{bad:?}");
        }
        assert_eq!(check_path("a/b.txt").unwrap(), PathBuf::from("a/b.txt"));
        assert!(!format!("{:?}", payload(&[("k", "s3cret")])).contains("s3cret"));
    }
}

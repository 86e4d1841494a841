//! The name a path gets in the names of files on a node's disk (a view's control
//! socket, log and metrics files, a secret view's tmpfs): FNV-1a (64 bit) of the
//! path's bytes, as 16 lower-case hex digits. A specified hash, so that a newer binary
//! finds what an older one named (`DefaultHasher` makes no such promise). Not a defence
//! against anyone choosing paths: mountpoints and targets come from root (kubelet), and
//! a collision only makes two paths share a name (a control request names its
//! mountpoint, so the wrong view refuses).

use std::hash::Hasher;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The key of `path`.
pub fn path_key(path: &Path) -> String {
    let mut h = fnv::FnvHasher::default();
    h.write(path.as_os_str().as_bytes());
    format!("{:016x}", h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_fnv1a() {
        // Published FNV-1a test vectors, and a kubelet-like target: these name files
        // on nodes' disks and must stay what they are.
        assert_eq!(path_key(Path::new("")), "cbf29ce484222325");
        assert_eq!(path_key(Path::new("a")), "af63dc4c8601ec8c");
        assert_eq!(path_key(Path::new("foobar")), "85944171f73967e8");
        assert_eq!(
            path_key(Path::new(
                "/var/lib/kubelet/pods/1/volumes/kubernetes.io~csi/v/mount"
            )),
            "b6d77d86dcc6ebce"
        );
    }
}

//! Names the driver gives on-disk things of a publish target (the view's log and
//! metrics files, a secret view's tmpfs directory): one function with a specified
//! hash, so that a newer binary finds what an older one named. (`DefaultHasher` makes
//! no such promise: its algorithm may change between Rust releases.)

use std::path::Path;

/// FNV-1a (64 bit) of the path's bytes, as 16 lower-case hex digits: the hash that also
/// names a view's control socket ([`crate::transport::handover::path_key`]). Not a defence
/// against anyone choosing paths: target paths come from kubelet, and a collision only
/// makes two targets share a log name.
pub fn target_key(target: &Path) -> String {
    crate::transport::handover::path_key(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_never_change() {
        // A kubelet-like target: this value is on nodes' disks and must stay what it
        // is (the FNV-1a vectors are tested with `path_key`).
        let t = Path::new("/var/lib/kubelet/pods/1/volumes/kubernetes.io~csi/v/mount");
        assert_eq!(target_key(t), "b6d77d86dcc6ebce");
    }
}

//! Names the driver gives on-disk things of a publish target (the view's log and
//! metrics files, a secret view's tmpfs directory), by [`crate::pathkey`], as a
//! view's control socket is named by its mountpoint.

use std::path::Path;

/// The key of a publish target in file names.
pub fn target_key(target: &Path) -> String {
    crate::pathkey::path_key(target)
}

//! The share's access key, as an Azure Files account key guards its management calls.
//!
//! The key travels in each request's `secrets` map under [`SECRET_NAME`]. It is kept
//! in a file of mode 0600 (generated on first start if absent), compared in constant
//! time, and never logged: neither the key nor what a caller presented appears in any
//! message.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use subtle::ConstantTimeEq;

/// The entry of a request's `secrets` that carries the key.
pub const SECRET_NAME: &str = "shareKey";

/// The share's key, or none when the share is run without one.
pub struct ShareKey(Option<Vec<u8>>);

impl std::fmt::Debug for ShareKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "ShareKey(<redacted>)"
        } else {
            "ShareKey(none)"
        })
    }
}

/// Why a presented key was refused. The messages never contain a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("secrets: {SECRET_NAME} missing")]
    Missing,
    #[error("secrets: {SECRET_NAME} does not match the share's key")]
    Wrong,
}

impl ShareKey {
    /// No key: every call is allowed (local use only).
    pub fn none() -> ShareKey {
        ShareKey(None)
    }

    /// Reads the key file, or creates it with 32 random bytes (hex) and mode 0600 if
    /// it does not exist.
    ///
    /// # Errors
    /// A message naming the file: unreadable, empty, or readable by group or others.
    pub fn load_or_create(path: &Path) -> Result<ShareKey, String> {
        let name = path.display();
        match std::fs::metadata(path) {
            Ok(m) => {
                if m.permissions().mode() & 0o077 != 0 {
                    return Err(format!(
                        "share key file {name} is readable by others (mode {:o}); chmod 600 it",
                        m.permissions().mode() & 0o777
                    ));
                }
                let key = std::fs::read_to_string(path)
                    .map_err(|e| format!("share key file {name}: {e}"))?;
                let key = key.trim();
                if key.is_empty() {
                    return Err(format!("share key file {name} is empty"));
                }
                Ok(ShareKey(Some(key.as_bytes().to_vec())))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // 256 random bits from the kernel.
                let key: String = [(); 2]
                    .map(|()| crate::sys::process::random_u128())
                    .iter()
                    .flat_map(|r| r.to_ne_bytes())
                    .map(|b| format!("{b:02x}"))
                    .collect();
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir)
                        .map_err(|e| format!("share key file {name}: {e}"))?;
                }
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(path)
                    .map_err(|e| format!("share key file {name}: {e}"))?;
                f.write_all(key.as_bytes())
                    .and_then(|()| f.sync_all())
                    .map_err(|e| format!("share key file {name}: {e}"))?;
                tracing::info!(file = %name, "generated a new share key");
                Ok(ShareKey(Some(key.into_bytes())))
            }
            Err(e) => Err(format!("share key file {name}: {e}")),
        }
    }

    /// Whether the share has a key at all.
    pub fn required(&self) -> bool {
        self.0.is_some()
    }

    /// Checks a presented key in constant time.
    ///
    /// # Errors
    /// [`KeyError::Missing`] or [`KeyError::Wrong`].
    pub fn verify(&self, presented: Option<&str>) -> Result<(), KeyError> {
        let Some(key) = &self.0 else { return Ok(()) };
        let presented = presented.ok_or(KeyError::Missing)?;
        if bool::from(key.as_slice().ct_eq(presented.as_bytes())) {
            Ok(())
        } else {
            Err(KeyError::Wrong)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_once_private_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/share.key");
        let key = ShareKey::load_or_create(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.len(), 64);
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(key.verify(Some(&text)), Ok(()));
        assert_eq!(key.verify(None), Err(KeyError::Missing));
        assert_eq!(key.verify(Some("nope")), Err(KeyError::Wrong));
        assert_eq!(key.verify(Some(&text[..63])), Err(KeyError::Wrong));
        let again = ShareKey::load_or_create(&path).unwrap();
        assert_eq!(
            again.verify(Some(&text)),
            Ok(()),
            "the same key on the next start"
        );
        assert!(!format!("{again:?}").contains(&text[..8]));
        assert!(!KeyError::Wrong.to_string().contains(&text[..8]));
    }

    #[test]
    fn a_world_readable_key_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        std::fs::write(&path, "abc").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = ShareKey::load_or_create(&path).unwrap_err();
        assert!(
            err.contains("readable by others") && !err.contains("abc"),
            "{err}"
        );
        assert_eq!(ShareKey::none().verify(None), Ok(()));
    }
}

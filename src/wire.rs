//! Length-prefixed JSON frames over a unix stream: how mountgroup's own processes talk
//! (a view and its successor, the driver and the keeper). Each frame is its length as 8
//! bytes little-endian, then that many bytes of JSON. Never buffered ahead, so that
//! descriptors sent beside the frames (`SCM_RIGHTS`) are never read past.

use std::io::{self, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// No frame is larger (a snapshot of millions of inodes is a few hundred MiB).
pub const MAX_FRAME: u64 = 1 << 31;

/// Writes one frame.
///
/// # Errors
/// The error of writing, or of encoding `value`.
pub fn write_frame(mut stream: &UnixStream, value: &impl Serialize) -> io::Result<()> {
    let bytes = serde_json::to_vec(value).map_err(io::Error::other)?;
    stream.write_all(&(bytes.len() as u64).to_le_bytes())?;
    stream.write_all(&bytes)
}

/// Reads one frame.
///
/// # Errors
/// The error of reading; `InvalidData` for a frame over [`MAX_FRAME`] or one that is
/// not a `T`.
pub fn read_frame<T: DeserializeOwned>(mut stream: &UnixStream) -> io::Result<T> {
    let mut len = [0u8; 8];
    stream.read_exact(&mut len)?;
    let len = u64::from_le_bytes(len);
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes"),
        ));
    }
    let mut bytes = vec![0u8; len as usize];
    stream.read_exact(&mut bytes)?;
    serde_json::from_slice(&bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// A listening unix socket whose name is taken over atomically: bound under a staged
/// name, then renamed onto `path`, so that a successor takes the name while its
/// predecessor still listens on the old socket (and a client never finds no socket).
pub struct NamedSocket {
    pub listener: UnixListener,
    pub path: PathBuf,
    ino: u64,
}

impl NamedSocket {
    /// Binds `path`, replacing whatever socket has the name now.
    ///
    /// # Errors
    /// The error of binding or renaming (`ENOENT` when the directory is missing).
    pub fn bind(path: &Path) -> io::Result<NamedSocket> {
        let staged = path.with_extension(format!("new{}", std::process::id()));
        let _ = std::fs::remove_file(&staged);
        let listener = UnixListener::bind(&staged)?;
        if let Err(e) = std::fs::rename(&staged, path) {
            let _ = std::fs::remove_file(&staged);
            return Err(e);
        }
        let ino = std::fs::symlink_metadata(path)?.ino();
        Ok(NamedSocket {
            listener,
            path: path.to_path_buf(),
            ino,
        })
    }

    /// Whether the name is still this socket's (no successor has taken it).
    pub fn owns_name(&self) -> bool {
        std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.ino)
    }

    /// Removes the name, unless a successor's socket has it now.
    pub fn remove(&self) {
        if self.owns_name() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_refuse_oversize() {
        let (a, b) = UnixStream::pair().unwrap();
        write_frame(&a, &("x".to_string(), 5u32)).unwrap();
        assert_eq!(read_frame::<(String, u32)>(&b).unwrap(), ("x".into(), 5));
        (&a).write_all(&(MAX_FRAME + 1).to_le_bytes()).unwrap();
        let err = read_frame::<u32>(&b).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }
}

//! Directory streams: batches of `getdents64(2)` entries and positions to resume at.

use std::mem::MaybeUninit;
use std::os::fd::BorrowedFd;

use rustix::fs::{RawDir, SeekFrom};

use super::file::Kind;
use super::{SysResult, failed};

/// One entry of a directory stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: u64,
    pub kind: Option<Kind>,
    /// The position just after this entry, to resume a listing from.
    pub next: u64,
}

/// Reads the next batch of entries of a directory stream (one `getdents64(2)`).
/// An empty batch is the end of the directory.
///
/// # Errors
/// The error of `getdents64`.
pub fn read_batch(fd: BorrowedFd<'_>, buf: &mut [MaybeUninit<u8>]) -> SysResult<Vec<DirEntry>> {
    let mut out = Vec::new();
    let mut dir = RawDir::new(fd, buf);
    while let Some(entry) = dir.next() {
        let entry = entry?;
        out.push(DirEntry {
            name: entry.file_name().to_bytes().to_vec(),
            ino: entry.ino(),
            kind: Kind::from_file_type(entry.file_type()),
            next: entry.next_entry_cookie(),
        });
        if dir.is_buffer_empty() {
            break;
        }
    }
    Ok(out)
}

/// Moves a directory stream to a position a previous entry returned.
///
/// # Errors
/// The error of `lseek(2)`.
pub fn seek(fd: BorrowedFd<'_>, pos: u64) -> SysResult<()> {
    rustix::fs::seek(fd, SeekFrom::Start(pos)).map_err(failed("seek"))?;
    Ok(())
}

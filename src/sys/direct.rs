//! Direct I/O (`O_DIRECT`) on a backing file, for callers that opened a file of the
//! view with `O_DIRECT`.
//!
//! `O_DIRECT` wants the memory it reads into or writes from aligned (the backing file
//! system's `dio_mem_align`, at most a page on the file systems a view sits on). The
//! bytes of a FUSE `WRITE` sit 80 bytes into the request buffer, and a `READ` reply is
//! assembled by the transport, so both go through a page-aligned buffer of the worker
//! thread's own. The buffer is made on a thread's first direct I/O and kept, grown to
//! the largest request seen (at most the connection's `max_write`, 1 MiB).
//!
//! The offset and length are passed on unchanged: a misaligned one gets `EINVAL` from
//! the backing file system, as it would have without the view.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::cell::RefCell;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;

use super::{Errno, SysResult, failed};

/// The buffer's alignment: a page, the largest `dio_mem_align` of ext4, xfs and btrfs.
const ALIGN: usize = 4096;

/// A zeroed, page-aligned heap buffer (also the FUSE ring's payload buffers, `uring.rs`).
pub(super) struct Aligned {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl Aligned {
    pub(super) fn new(len: usize) -> Aligned {
        let size = len.max(1).next_multiple_of(ALIGN);
        let layout = Layout::from_size_align(size, ALIGN).expect("a page-aligned layout");
        // SAFETY: the layout has a non-zero size; a null result is handled below.
        #[allow(unsafe_code)]
        let raw = unsafe { alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        Aligned { ptr, layout }
    }

    pub(super) fn capacity(&self) -> usize {
        self.layout.size()
    }

    /// The start of the buffer, for memory the kernel writes into.
    pub(super) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(super) fn slice(&mut self, len: usize) -> &mut [u8] {
        assert!(len <= self.capacity());
        // SAFETY: `ptr` points to `capacity()` initialised (zeroed) bytes this value
        // owns, and the `&mut self` borrow makes the slice the only reference to them.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts_mut(self.ptr.as_ptr(), len)
        }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: `ptr` was allocated with exactly `layout` and is freed once, here.
        #[allow(unsafe_code)]
        unsafe {
            dealloc(self.ptr.as_ptr(), self.layout);
        }
    }
}

thread_local! {
    static BUFFER: RefCell<Option<Aligned>> = const { RefCell::new(None) };
}

/// Runs `f` on this thread's aligned buffer, cut to `len` bytes.
fn with_buffer<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    BUFFER.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_none_or(|b| b.capacity() < len) {
            *slot = Some(Aligned::new(len));
        }
        let buf = slot.as_mut().expect("made above");
        f(buf.slice(len))
    })
}

/// One `pread(2)` of up to `len` bytes from a descriptor opened with `O_DIRECT`. A
/// short read is returned as it is (at the end of the file, the next offset would be
/// misaligned), as a direct read without the view returns it.
///
/// # Errors
/// The error of the call (`EINVAL` for an offset or length the file system cannot
/// read directly).
pub fn read_at(fd: BorrowedFd<'_>, offset: u64, len: usize) -> SysResult<Vec<u8>> {
    with_buffer(len, |buf| {
        let n = rustix::io::pread(fd, &mut *buf, offset).map_err(failed("pread"))?;
        Ok(buf[..n].to_vec())
    })
}

/// One `pwrite(2)` of `data` to a descriptor opened with `O_DIRECT`; a short write is
/// returned as it is, as a direct write without the view returns it.
///
/// # Errors
/// The error of the call (`EINVAL` for an offset or length the file system cannot
/// write directly).
pub fn write_at(fd: BorrowedFd<'_>, offset: u64, data: &[u8]) -> SysResult<usize> {
    with_buffer(data.len(), |buf| {
        buf.copy_from_slice(data);
        let n = rustix::io::pwrite(fd, &*buf, offset).map_err(failed("pwrite"))?;
        if n == 0 && !data.is_empty() {
            return Err(Errno::EIO);
        }
        Ok(n)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn the_buffer_is_page_aligned_and_grows() {
        let mut a = Aligned::new(10);
        assert_eq!(a.capacity(), ALIGN);
        assert_eq!(a.slice(10).as_ptr() as usize % ALIGN, 0);
        with_buffer(3 * ALIGN + 1, |b| {
            assert_eq!(b.len(), 3 * ALIGN + 1);
            assert_eq!(b.as_ptr() as usize % ALIGN, 0);
        });
    }

    #[test]
    fn direct_writes_and_reads_come_back_and_misalignment_is_the_file_systems_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::File::create(dir.path().join("f")).unwrap();
        let fd = super::super::file::reopen_direct(file.as_fd(), true).unwrap();
        let block: Vec<u8> = (0..ALIGN).map(|i| (i % 251) as u8).collect();
        assert_eq!(write_at(fd.as_fd(), ALIGN as u64, &block).unwrap(), ALIGN);
        assert_eq!(read_at(fd.as_fd(), ALIGN as u64, ALIGN).unwrap(), block);
        // Past the end: nothing, not an error.
        assert!(
            read_at(fd.as_fd(), 4 * ALIGN as u64, ALIGN)
                .unwrap()
                .is_empty()
        );
        // A misaligned offset is refused by the file system, as without a view.
        assert_eq!(write_at(fd.as_fd(), 1, &block), Err(Errno::EINVAL));
    }
}

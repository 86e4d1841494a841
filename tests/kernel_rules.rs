//! What xfstests found a view doing differently from the kernel's own file systems,
//! each checked on a real view against the rule Linux (ext4) follows, or against the
//! difference docs/SEMANTICS.md documents.

mod common;

use std::fs;
use std::os::fd::AsRawFd;

use common::*;

/// `lseek(fd, offset, whence)`: the new offset, or the errno.
fn lseek(f: &fs::File, offset: i64, whence: i32) -> Result<i64, i32> {
    // SAFETY: a plain system call on an open descriptor.
    let r = unsafe { libc::lseek(f.as_raw_fd(), offset, whence) };
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap())
    } else {
        Ok(r)
    }
}

/// generic/448: `SEEK_DATA` and `SEEK_HOLE` before the start of a file are `ENXIO`
/// on Linux, not `EINVAL`; the view answers as the backing file system does.
#[test]
fn seek_data_and_hole_before_the_start_are_enxio() {
    let f = Fixture::new();
    fs::write(f.src.join("file"), vec![7u8; 8192]).unwrap();
    let native = fs::File::open(f.src.join("file")).unwrap();
    let _m = f.mount("gid=4242");
    let viewed = fs::File::open(f.mnt.join("file")).unwrap();
    for whence in [libc::SEEK_DATA, libc::SEEK_HOLE] {
        for offset in [-1, -4096, i64::MIN] {
            assert_eq!(lseek(&native, offset, whence), Err(libc::ENXIO));
            assert_eq!(
                lseek(&viewed, offset, whence),
                lseek(&native, offset, whence),
                "whence {whence}, offset {offset}"
            );
        }
        assert_eq!(lseek(&viewed, 0, whence), lseek(&native, 0, whence));
        assert_eq!(lseek(&viewed, 8192, whence), Err(libc::ENXIO));
    }
}

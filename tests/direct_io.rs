//! Files opened with `O_DIRECT`. With `direct_io=view` the view reads and writes them
//! itself, in direct I/O on the backing file, with writers of one file let in together
//! (`FOPEN_PARALLEL_DIRECT_WRITES`); other opens of the same file keep kernel
//! passthrough. `direct_io=kernel` (the default) leaves them to passthrough; without
//! passthrough the view's I/O for them is direct either way.

mod common;

use std::fs;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;
use std::thread;

use common::*;

const G: u32 = 4242;
const BLOCK: usize = 4096;

/// `len` bytes of `pattern`, at a page-aligned address (what `O_DIRECT` wants of the
/// caller's memory where it goes to the disk without the view).
struct AlignedBytes {
    buf: Vec<u8>,
    at: usize,
    len: usize,
}

impl AlignedBytes {
    fn new(len: usize, seed: u8) -> AlignedBytes {
        let mut buf = vec![0u8; len + BLOCK];
        let at = buf.as_ptr().align_offset(BLOCK);
        for (i, b) in buf[at..at + len].iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(31).wrapping_add(seed);
        }
        AlignedBytes { buf, at, len }
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[self.at..self.at + self.len]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.at..self.at + self.len]
    }
}

fn open_direct(path: &Path) -> fs::File {
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .unwrap()
}

/// Bytes of `path` in the page cache (fincore(1)).
fn cached_bytes(path: &Path) -> u64 {
    let out = sh(&format!(
        "fincore --bytes --noheadings --raw -o RES '{}'",
        path.display()
    ));
    out.trim().parse().unwrap()
}

/// Writes `path`'s dirty pages and drops its cached ones.
fn drop_cache(path: &Path) {
    let f = fs::File::open(path).unwrap();
    f.sync_all().unwrap();
    rustix::fs::fadvise(f.as_fd(), 0, None, rustix::fs::Advice::DontNeed).unwrap();
    assert_eq!(
        cached_bytes(path),
        0,
        "{}: the page cache kept it",
        path.display()
    );
}

#[test]
fn an_o_direct_file_is_read_and_written_by_the_view_in_direct_io() {
    for options in ["passthrough=auto", "passthrough=off"] {
        let f = Fixture::new();
        let (_m, metrics) = mount_counted(&f, &format!("gid={G},direct_io=view,{options}"));
        let path = f.mnt.join("data");
        fs::write(&path, vec![0u8; 16 * BLOCK]).unwrap();
        // Another descriptor of the same file, opened without O_DIRECT and held open:
        // with passthrough it binds the inode to a backing file, and the kernel then
        // refuses any open of it without FOPEN_PASSTHROUGH (fs/fuse/iomode.c).
        let plain = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        drop_cache(&f.src.join("data"));

        let writes = count(&metrics, "write");
        let reads = count(&metrics, "read");
        let direct = open_direct(&path);
        let block = AlignedBytes::new(4 * BLOCK, 7);
        direct.write_at(block.bytes(), 2 * BLOCK as u64).unwrap();
        let mut back = AlignedBytes::new(4 * BLOCK, 0);
        direct
            .read_exact_at(back.bytes_mut(), 2 * BLOCK as u64)
            .unwrap();
        assert_eq!(back.bytes(), block.bytes(), "{options}: read back directly");
        // Served by the view, not by passthrough...
        assert!(
            count(&metrics, "write") > writes,
            "{options}: no write reached the view"
        );
        assert!(
            count(&metrics, "read") > reads,
            "{options}: no read reached the view"
        );
        // ...in direct I/O: nothing of it went through the backing page cache.
        assert_eq!(
            cached_bytes(&f.src.join("data")),
            0,
            "{options}: the view wrote through the page cache"
        );
        // The plain descriptor sees the bytes, and so does the disk.
        let mut seen = vec![0u8; 4 * BLOCK];
        plain.read_exact_at(&mut seen, 2 * BLOCK as u64).unwrap();
        assert_eq!(
            seen,
            block.bytes(),
            "{options}: through the plain descriptor"
        );
        let disk = fs::read(f.src.join("data")).unwrap();
        assert_eq!(
            &disk[2 * BLOCK..6 * BLOCK],
            block.bytes(),
            "{options}: on disk"
        );

        // What the backing file system refuses in direct I/O is refused as it would be
        // without the view: a write that does not start on a block.
        let e = direct.write_at(block.bytes(), 1).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{options}: {e}");

        // A direct file can still be mapped shared, as without the view (the kernel
        // refuses it for FOPEN_DIRECT_IO without FUSE_DIRECT_IO_ALLOW_MMAP).
        let mapped = sh(&format!(
            "python3 -c 'import mmap, os; fd = os.open(\"{}\", os.O_RDWR | os.O_DIRECT); \
             m = mmap.mmap(fd, {}); print(m[{}:{}].hex()); m[0:8] = b\"mapped!!\"; m.flush()'",
            path.display(),
            16 * BLOCK,
            2 * BLOCK,
            2 * BLOCK + 16
        ));
        assert_eq!(
            mapped.trim(),
            block.bytes()[..16]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>(),
            "{options}: mapped"
        );
        // A write through the mapping reaches the disk (without passthrough, as a
        // write-back of cached pages, which the view never does in direct I/O).
        assert_eq!(
            &fs::read(f.src.join("data")).unwrap()[..8],
            b"mapped!!",
            "{options}: written through the mapping"
        );
    }
}

#[test]
fn a_new_o_direct_file_and_two_writers_of_one_file_keep_every_byte() {
    let f = Fixture::new();
    let _m = f.mount(&format!("gid={G},direct_io=view"));
    // Created with O_DIRECT: served in direct I/O from the first write.
    let path = f.mnt.join("shared");
    let created = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .unwrap();
    let blocks = 256usize;
    created
        .write_at(AlignedBytes::new(blocks * BLOCK, 0).bytes(), 0)
        .unwrap();
    drop(created);
    // Two writers, one file, each its own blocks, at once (fio's rand-write-direct).
    let writers: Vec<_> = (0..2u8)
        .map(|w| {
            let file = Arc::new(open_direct(&path));
            thread::spawn(move || {
                for round in 0..4u8 {
                    for b in (usize::from(w)..blocks).step_by(2) {
                        let seed = w
                            .wrapping_mul(100)
                            .wrapping_add(round)
                            .wrapping_add(b as u8);
                        let data = AlignedBytes::new(BLOCK, seed);
                        file.write_at(data.bytes(), (b * BLOCK) as u64).unwrap();
                    }
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let disk = fs::read(f.src.join("shared")).unwrap();
    assert_eq!(disk.len(), blocks * BLOCK);
    for b in 0..blocks {
        let w = (b % 2) as u8;
        let seed = w.wrapping_mul(100).wrapping_add(3).wrapping_add(b as u8);
        assert!(
            disk[b * BLOCK..(b + 1) * BLOCK] == *AlignedBytes::new(BLOCK, seed).bytes(),
            "block {b} is not its writer's last"
        );
    }
}

#[test]
fn by_default_o_direct_files_are_left_to_passthrough() {
    let f = Fixture::new();
    let (m, metrics) = mount_counted(&f, &format!("gid={G}"));
    let path = f.mnt.join("data");
    fs::write(&path, vec![0u8; 4 * BLOCK]).unwrap();
    // Logged at INIT, which the mount table does not wait for; the write did.
    assert!(
        m.log_text().contains("passthrough=true"),
        "{}",
        m.log_text()
    );
    let writes = count(&metrics, "write");
    let direct = open_direct(&path);
    direct
        .write_at(AlignedBytes::new(BLOCK, 3).bytes(), 0)
        .unwrap();
    assert_eq!(count(&metrics, "write"), writes, "a write reached the view");
    assert_eq!(
        &fs::read(f.src.join("data")).unwrap()[..BLOCK],
        AlignedBytes::new(BLOCK, 3).bytes()
    );
}

#[test]
fn without_passthrough_o_direct_io_is_direct_by_default_too() {
    let f = Fixture::new();
    let _m = f.mount(&format!("gid={G},passthrough=off"));
    let path = f.mnt.join("data");
    fs::write(&path, vec![0u8; 4 * BLOCK]).unwrap();
    drop_cache(&f.src.join("data"));
    // The kernel sends the direct write to the view with the file's O_DIRECT flag,
    // and the view writes it directly (it used to write it through its buffered
    // descriptor, into the backing page cache).
    let direct = open_direct(&path);
    direct
        .write_at(AlignedBytes::new(2 * BLOCK, 5).bytes(), BLOCK as u64)
        .unwrap();
    assert_eq!(cached_bytes(&f.src.join("data")), 0);
    assert_eq!(
        &fs::read(f.src.join("data")).unwrap()[BLOCK..3 * BLOCK],
        AlignedBytes::new(2 * BLOCK, 5).bytes()
    );
}

#[test]
fn an_o_direct_handle_keeps_working_across_a_takeover() {
    let f = Fixture::new();
    let ctl = f.dir.path().join("ctl");
    let args = [
        "-o",
        "gid=4242,direct_io=view",
        "--control-dir",
        ctl.to_str().unwrap(),
    ];
    let _first = Mounted::start(&f.src, &f.mnt, &args).unwrap();
    let path = f.mnt.join("held");
    fs::write(&path, vec![0u8; 8 * BLOCK]).unwrap();
    let direct = open_direct(&path);
    direct
        .write_at(AlignedBytes::new(BLOCK, 1).bytes(), 0)
        .unwrap();
    drop_cache(&f.src.join("held"));
    let next = Mounted::take_over(&f.src, &f.mnt, &args).unwrap();
    // The new process has never opened the file with O_DIRECT: it reopens the handed
    // over descriptor so, and the write still bypasses the page cache.
    direct
        .write_at(AlignedBytes::new(BLOCK, 2).bytes(), BLOCK as u64)
        .unwrap();
    assert_eq!(cached_bytes(&f.src.join("held")), 0, "{}", next.log_text());
    let disk = fs::read(f.src.join("held")).unwrap();
    assert_eq!(&disk[..BLOCK], AlignedBytes::new(BLOCK, 1).bytes());
    assert_eq!(&disk[BLOCK..2 * BLOCK], AlignedBytes::new(BLOCK, 2).bytes());
}

/// Where the backing file system has no direct I/O (ramfs), an `O_DIRECT` open fails
/// with `EINVAL` as it does without the view (fs/open.c `do_dentry_open`: `O_DIRECT`
/// without `FMODE_CAN_ODIRECT`), and an `O_DIRECT` create fails so too and leaves the
/// file it made, as `open(2)` leaves it.
#[test]
fn where_the_backing_has_no_direct_io_an_o_direct_open_is_refused_as_without_the_view() {
    let f = Fixture::new();
    sh(&format!("mount -t ramfs none '{}'", f.src.display()));
    let _ramfs = Unmount(f.src.clone());
    fs::write(f.src.join("old"), "x").unwrap();
    let open = |path: &Path, create: bool| {
        fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .map(drop)
            .map_err(|e| e.raw_os_error())
    };
    assert_eq!(open(&f.src.join("old"), false), Err(Some(libc::EINVAL)));
    assert_eq!(
        open(&f.src.join("native-new"), true),
        Err(Some(libc::EINVAL))
    );
    assert!(f.src.join("native-new").exists());

    // ramfs has no extended attributes, so no ownership records.
    let _m = f.mount(&format!("gid={G},ownership=off,direct_io=view"));
    assert_eq!(open(&f.mnt.join("old"), false), Err(Some(libc::EINVAL)));
    assert_eq!(open(&f.mnt.join("new"), true), Err(Some(libc::EINVAL)));
    assert!(f.src.join("new").exists(), "the create made no file");
    // The view is not left holding the file: it opens normally.
    fs::write(f.mnt.join("old"), "y").unwrap();
    assert_eq!(fs::read(f.src.join("old")).unwrap(), b"y");
}

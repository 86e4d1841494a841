//! A worker thread acting as a caller on the backing file system: its file-system uid
//! and gid and its supplementary groups set to the caller's, for the calls that serve
//! one request, and the daemon's own restored afterwards.
//!
//! All three are per thread in the kernel (`struct cred` belongs to a task), but
//! glibc's `setgroups` and `setgid` wrappers change every thread of the process (they
//! signal each one, nptl `__nptl_setxid`): so the raw system calls, as virtiofsd
//! makes them (passthrough_ll.c `lo_change_cred`, `syscall(SYS_setresgid ...)`).
//!
//! A file-system uid other than 0 drops the capabilities that override file
//! permissions from the thread's effective set (`cap_task_fix_setuid` with
//! `LSM_SETID_FS`): the share then checks the caller's permissions, as it would on its
//! own mount. `CAP_DAC_READ_SEARCH` is raised again, since the view reaches its
//! inodes by file handle (`open_by_handle_at`, which needs it); it only lets the
//! daemon open what it reached, and a network share (NFS) checks the caller's
//! permissions itself on each call. Going back to uid 0 raises the rest again.

use super::{Errno, SysResult, failed};

/// A uid to act as some caller who is not root, where the daemon needs one: 65532,
/// distroless images' `nonroot`, a uid a pod might run as.
pub const SOME_CALLER_UID: u32 = 65532;

/// What a thread acting as a caller must undo: the daemon's supplementary groups.
/// Dropping it restores the thread's file-system ids (0) and groups.
#[derive(Debug)]
pub struct Acting {
    groups: Vec<u32>,
}

/// Makes the calling thread act as `uid`, `gid` and `groups` on file systems until
/// the returned [`Acting`] is dropped. The thread must be the daemon's (file-system
/// ids 0, with `CAP_SETUID`, `CAP_SETGID`).
///
/// # Errors
/// `EINVAL` for more groups than the kernel takes (`NGROUPS_MAX`), `EPERM` without the
/// capabilities, or the error of `getgroups`, `setgroups` or `capset`; the thread is
/// left as it was.
pub fn act_as(uid: u32, gid: u32, groups: &[u32]) -> SysResult<Acting> {
    let saved = thread_own(&OWN_GROUPS, own_groups)?;
    set_groups(groups)?;
    let acting = Acting { groups: saved };
    set_fs_ids(uid, gid)?;
    if uid != 0 {
        if let Some(caps) = thread_own(&ACTING_CAPS, acting_caps)? {
            rustix::thread::set_capabilities(None, caps).map_err(failed("capset"))?;
        }
    }
    Ok(acting)
}

thread_local! {
    /// The thread's own groups, and its capabilities while it acts as a caller: the
    /// same at every request (nothing else changes a worker's credentials), so read
    /// at its first rather than at each.
    static OWN_GROUPS: std::cell::OnceCell<Vec<u32>> = const { std::cell::OnceCell::new() };
    static ACTING_CAPS: std::cell::OnceCell<Option<rustix::thread::CapabilitySets>> =
        const { std::cell::OnceCell::new() };
}

/// This thread's value of `cell`, made by `make` the first time.
fn thread_own<T: Clone + 'static>(
    cell: &'static std::thread::LocalKey<std::cell::OnceCell<T>>,
    make: fn() -> SysResult<T>,
) -> SysResult<T> {
    cell.with(|c| match c.get() {
        Some(v) => Ok(v.clone()),
        None => {
            let v = make()?;
            Ok(c.get_or_init(|| v).clone())
        }
    })
}

impl Drop for Acting {
    fn drop(&mut self) {
        // Nothing to report to: each step is tried, and a thread that could not be
        // restored would act as the caller for the next request. So it aborts.
        if set_fs_ids(0, 0).is_err() || set_groups(&self.groups).is_err() {
            std::process::abort();
        }
    }
}

/// What the calling thread acts as on file systems: its file-system uid and gid and
/// its supplementary groups, for another thread to act as the same
/// ([`ThreadIds::act`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadIds {
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
}

/// The calling thread's [`ThreadIds`].
///
/// # Errors
/// The error of `getgroups`.
pub fn thread_ids() -> SysResult<ThreadIds> {
    let (uid, gid) = fs_ids();
    Ok(ThreadIds {
        uid,
        gid,
        groups: own_groups()?,
    })
}

impl ThreadIds {
    /// Makes the calling thread, one of the daemon's, act as these ids until the
    /// returned guard is dropped ([`act_as`]).
    ///
    /// # Errors
    /// As [`act_as`].
    pub fn act(&self) -> SysResult<Acting> {
        act_as(self.uid, self.gid, &self.groups)
    }
}

/// Makes the calling thread act as the process does on file systems again: a thread
/// started while its parent acted as a caller inherits the caller's credentials
/// (`clone` copies the thread's), which one that lives on to serve others must drop.
///
/// # Errors
/// The error of reading the process's groups or of setting them.
pub fn as_the_process() -> SysResult<()> {
    let groups = groups_of(std::process::id())?;
    let (uid, gid) = (
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
    );
    set_groups(&groups)?;
    set_fs_ids(uid, gid)
}

/// The calling thread's file-system uid and gid (`setfsuid(-1)` changes nothing and
/// answers the current one).
pub fn fs_ids() -> (u32, u32) {
    // SAFETY: setfsuid/setfsgid with an invalid id change nothing and return the
    // thread's current ids.
    #[allow(unsafe_code)]
    unsafe {
        (
            libc::syscall(libc::SYS_setfsuid, -1i32) as u32,
            libc::syscall(libc::SYS_setfsgid, -1i32) as u32,
        )
    }
}

fn set_fs_ids(uid: u32, gid: u32) -> SysResult<()> {
    // SAFETY: plain system calls on the calling thread's credentials; no memory is
    // passed.
    #[allow(unsafe_code)]
    unsafe {
        libc::syscall(libc::SYS_setfsgid, gid);
        libc::syscall(libc::SYS_setfsuid, uid);
    }
    // Neither call reports failure: it answers the previous id whatever happened.
    if fs_ids() == (uid, gid) {
        Ok(())
    } else {
        Err(failed("setfsuid")(Errno(libc::EPERM)))
    }
}

fn own_groups() -> SysResult<Vec<u32>> {
    let mut groups = vec![0u32; 64];
    loop {
        // SAFETY: `groups` has room for `len` gids, which the kernel fills.
        #[allow(unsafe_code)]
        let n = unsafe {
            libc::syscall(
                libc::SYS_getgroups,
                groups.len() as libc::c_int,
                groups.as_mut_ptr(),
            )
        };
        if n >= 0 {
            groups.truncate(n as usize);
            return Ok(groups);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EINVAL) && groups.len() < 65536 {
            groups.resize(groups.len() * 4, 0);
            continue;
        }
        return Err(failed("getgroups")(e));
    }
}

fn set_groups(groups: &[u32]) -> SysResult<()> {
    // SAFETY: the kernel reads `len` gids from `groups`, which lives across the call;
    // the raw call changes this thread only (see the module's comment).
    #[allow(unsafe_code)]
    let rc = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(failed("setgroups")(std::io::Error::last_os_error()))
    }
}

/// The capabilities of a thread acting as a caller with a file-system uid other than
/// 0: what the kernel left it, with `CAP_DAC_READ_SEARCH` raised again where it is
/// permitted; `None` where there is nothing to raise.
fn acting_caps() -> SysResult<Option<rustix::thread::CapabilitySets>> {
    use rustix::thread::{CapabilitySet, capabilities};
    let mut caps = capabilities(None).map_err(failed("capget"))?;
    if !caps.permitted.contains(CapabilitySet::DAC_READ_SEARCH) {
        return Ok(None);
    }
    caps.effective |= CapabilitySet::DAC_READ_SEARCH;
    Ok(Some(caps))
}

/// The supplementary groups of the thread `tid` (`/proc/TID/status`, `Groups:`), as
/// this process's user namespace sees them.
///
/// # Errors
/// The error of reading it (`ENOENT`: the thread is gone), `EINVAL` where it has no
/// readable `Groups:` line.
pub fn groups_of(tid: u32) -> SysResult<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status"))
        .map_err(|e| failed::<Errno>("read(/proc/PID/status)")(Errno::from_io(&e)))?;
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .ok_or(Errno(libc::EINVAL))?;
    line.split_whitespace()
        .map(|g| g.parse().map_err(|_| Errno(libc::EINVAL)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As root: a thread acting as a caller makes files the caller's, is refused what
    /// the caller may not do, leaves every other thread as it was, and is the daemon
    /// again afterwards.
    #[test]
    fn a_thread_acts_as_a_caller_and_only_it() {
        if rustix::process::geteuid().as_raw() != 0 {
            eprintln!("skipped: needs root");
            return;
        }
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let private = dir.path().join("private");
        std::fs::create_dir(&private).unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
        let (d, p) = (dir.path().to_path_buf(), private.clone());
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        let before = own_groups().unwrap();
        // Another thread of the process, asked while the first acts: the daemon still.
        let (ask, asked) = std::sync::mpsc::channel::<()>();
        let (tell, told) = std::sync::mpsc::channel();
        let other = std::thread::spawn(move || {
            asked.recv().unwrap();
            tell.send((fs_ids(), own_groups().unwrap())).unwrap();
        });
        let daemons = before.clone();
        let (made, refused, others) = std::thread::spawn(move || {
            let acting = act_as(1000, 4242, &[4242, 5000]).unwrap();
            assert_eq!(fs_ids(), (1000, 4242));
            assert_eq!(own_groups().unwrap(), vec![4242, 5000]);
            std::fs::write(d.join("made"), "").unwrap();
            let refused = std::fs::write(p.join("x"), "").unwrap_err().raw_os_error();
            ask.send(()).unwrap();
            let others = told.recv().unwrap();
            drop(acting);
            assert_eq!(fs_ids(), (0, 0));
            std::fs::write(p.join("x"), "").unwrap();
            // The next request, as another caller (what the thread keeps of the
            // first serves again), and the daemon after it.
            let acting = act_as(1001, 5000, &[]).unwrap();
            assert_eq!((fs_ids(), own_groups().unwrap()), ((1001, 5000), vec![]));
            let again = std::fs::write(p.join("y"), "").unwrap_err().raw_os_error();
            assert_eq!(again, Some(libc::EACCES));
            drop(acting);
            assert_eq!((fs_ids(), own_groups().unwrap()), ((0, 0), daemons));
            (std::fs::metadata(d.join("made")).unwrap(), refused, others)
        })
        .join()
        .unwrap();
        other.join().unwrap();
        assert_eq!((made.uid(), made.gid()), (1000, 4242));
        assert_eq!(refused, Some(libc::EACCES));
        assert_eq!(others, ((0, 0), before.clone()));
        assert_eq!(own_groups().unwrap(), before);
    }

    #[test]
    fn groups_come_from_status() {
        let tid = rustix::thread::gettid().as_raw_nonzero().get() as u32;
        assert_eq!(groups_of(tid).unwrap(), own_groups().unwrap());
        assert!(groups_of(u32::MAX - 1).is_err());
    }
}

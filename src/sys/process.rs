//! Facts about the running process.

/// Whether the process runs with effective uid 0.
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// The effective uid and gid of the process.
pub fn effective_ids() -> (u32, u32) {
    (
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
    )
}

/// Raises the open-file limit as far as it goes: to `fs.nr_open` as root (raising the
/// hard limit), else to the hard limit. A view holds one descriptor per inode the
/// kernel has cached, so a walk of a million files needs a million descriptors.
/// Returns the soft limit now in force.
pub fn raise_nofile_limit() -> u64 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(1 << 20);
    let current = getrlimit(Resource::Nofile);
    let want = Rlimit {
        current: Some(nr_open),
        maximum: Some(nr_open),
    };
    if setrlimit(Resource::Nofile, want).is_err() {
        let hard = Rlimit {
            current: current.maximum,
            maximum: current.maximum,
        };
        let _ = setrlimit(Resource::Nofile, hard);
    }
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// The soft open-file limit in force.
pub fn nofile_limit() -> u64 {
    rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX)
}

/// Returns free heap memory to the operating system (`malloc_trim(3)`), after the
/// inode table shrank from a large walk, so the daemon's RSS follows the kernel's
/// cache down. A no-op where the C library has no `malloc_trim`.
pub fn trim_heap() {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: malloc_trim only releases memory the allocator holds free; it touches
        // no memory the program owns.
        #[allow(unsafe_code)]
        unsafe {
            libc::malloc_trim(0);
        }
    }
}

/// Makes every thread allocate from the one main heap (`mallopt(M_ARENA_MAX, 1)`);
/// call it before the threads that should share it are started. glibc gives threads
/// heaps of their own, and gives back the free memory of those only from their top:
/// after a walk of a million files was forgotten, a view's RSS stayed at 29 to 36 MiB
/// (idle: 6), in pages `malloc_trim` could not return; with the main heap alone it
/// came back to 10 MiB, and the walk took as long. A no-op where the C library is not
/// glibc.
pub fn use_one_heap() {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallopt only changes the allocator's tuning; it reads and writes no
        // memory of the program.
        #[allow(unsafe_code)]
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1);
        }
    }
}

/// 128 random bits from the kernel (`getrandom(2)`), for names nobody can guess.
pub fn random_u128() -> u128 {
    let mut buf = [0u8; 16];
    let mut filled = 0;
    while filled < buf.len() {
        match rustix::rand::getrandom(&mut buf[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            // getrandom does not fail once the pool is initialised (it blocks until
            // then); a failure here is a broken kernel.
            Err(e) => panic!("getrandom failed: {e}"),
        }
    }
    u128::from_ne_bytes(buf)
}

/// The supplementary groups of thread `pid` (in this process's pid namespace), read
/// from `/proc/PID/status`.
///
/// # Errors
/// `ESRCH` for pid 0 (a caller this namespace cannot see), the error of reading the
/// file, or `EIO` when it has no readable `Groups:` line.
pub fn supplementary_groups(pid: u32) -> super::SysResult<Vec<u32>> {
    if pid == 0 {
        return Err(super::Errno(libc::ESRCH));
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| super::Errno::from_io(&e))?;
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .ok_or(super::Errno::EIO)?;
    line.split_whitespace()
        .map(|g| g.parse::<u32>().map_err(|_| super::Errno::EIO))
        .collect()
}

/// What this process costs now: its resident memory in bytes (`VmRSS` of
/// `/proc/self/status`) and the CPU time it used, user and system, in seconds.
pub fn own_usage() -> (u64, f64) {
    let rss = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().strip_suffix("kB"))
                .and_then(|kb| kb.trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024);
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a `struct rusage` to the pointer it is given, which
    // points at one; RUSAGE_SELF cannot fail.
    #[allow(unsafe_code)]
    let ru = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr());
        ru.assume_init()
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (rss, secs(ru.ru_utime) + secs(ru.ru_stime))
}

/// Points standard error (descriptor 2) at `file` (`dup2(2)`), so that what the
/// process or a panic writes there lands in the same, bounded log.
///
/// # Errors
/// The error of `dup2`.
pub fn redirect_stderr(file: &impl std::os::fd::AsFd) -> std::io::Result<()> {
    Ok(rustix::stdio::dup2_stderr(file)?)
}

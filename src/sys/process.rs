//! Processes: the running one's ids, limits, heap and standard error; other processes'
//! credentials, mount namespaces and `SIGKILL`; user namespaces and their id maps (for
//! idmapped mounts); random bits from the kernel.

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

/// Sends `SIGKILL` to `pid` (as this PID namespace numbers it); a pid that is no
/// process, or gone, is no error worth more than the caller's log.
///
/// # Errors
/// The error of `kill(2)`; `ESRCH` for no such process.
pub fn kill(pid: u32) -> super::SysResult<()> {
    let pid = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .ok_or(super::Errno(libc::ESRCH))?;
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).map_err(super::failed("kill"))
}

/// What the threads of a process are waiting on, as `/proc/PID/task/*/stat` and
/// `wchan` tell: what a keeper asks of a view that has not answered for a while, to
/// tell a view that waits on its share (the share stalls or its server is away) from
/// one hung in itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    /// A thread waits in a file system, not stopped by a signal: in the kernel's
    /// uninterruptible or killable sleep (`D`, where the NFS, CIFS and Ceph clients
    /// wait for their servers), or in FUSE's wait for its daemon's answer
    /// (`request_wait_answer`, an interruptible sleep until a signal comes).
    OnFileSystem,
    /// A thread is stopped (`T`, `t`): by `SIGSTOP` or a tracer.
    Stopped,
    /// Neither: its threads run, or sleep in user space's waits (a futex, a poll).
    Elsewhere,
    /// The process is gone, or its threads cannot be read.
    Unknown,
}

/// What the threads of process `pid` are waiting on ([`Waiting`]). A stopped thread
/// outweighs one waiting in a file system: a stopped process answers nothing even once
/// its share does.
pub fn waiting(pid: u32) -> Waiting {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Waiting::Unknown;
    };
    let mut seen = Waiting::Unknown;
    for task in tasks.flatten() {
        let dir = task.path();
        let Ok(stat) = std::fs::read_to_string(dir.join("stat")) else {
            continue;
        };
        let wchan = std::fs::read_to_string(dir.join("wchan")).unwrap_or_default();
        match thread_waiting(&stat, &wchan) {
            Waiting::Stopped => return Waiting::Stopped,
            Waiting::OnFileSystem => seen = Waiting::OnFileSystem,
            Waiting::Elsewhere if seen == Waiting::Unknown => seen = Waiting::Elsewhere,
            _ => {}
        }
    }
    seen
}

/// Where a caller of a FUSE file system sleeps until its daemon answers: Linux
/// fs/fuse/dev.c `request_wait_answer`, or, where the compiler folded it into its
/// callers, those (`__fuse_request_send`, `__fuse_simple_request`, before 5.16
/// `fuse_simple_request`). Not `fuse_dev_do_read`, where a daemon's own worker waits
/// for requests.
const FUSE_WAITS: &[&str] = &[
    "request_wait_answer",
    "__fuse_request_send",
    "__fuse_simple_request",
    "fuse_simple_request",
];

/// What one thread waits on, from its `stat` line (the state is the field after the
/// command name's closing parenthesis, which the name itself may contain) and its
/// `wchan` (the kernel function it sleeps in; `0` where the kernel hides it).
fn thread_waiting(stat: &str, wchan: &str) -> Waiting {
    let state = stat
        .rfind(')')
        .and_then(|end| stat[end + 1..].trim_start().chars().next());
    match state {
        None => Waiting::Unknown,
        Some('T' | 't') => Waiting::Stopped,
        Some('D') => Waiting::OnFileSystem,
        Some(_) if FUSE_WAITS.contains(&wchan.trim()) => Waiting::OnFileSystem,
        Some(_) => Waiting::Elsewhere,
    }
}

/// The mount namespace of process `pid` (`"self"`, or a number), as its
/// `/proc/PID/ns/mnt` link names it (`mnt:[INODE]`): two processes whose answers are
/// equal share their mounts. `None` where it cannot be read.
pub fn mount_namespace(pid: &str) -> Option<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok()
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

/// A capability's bit in `CapEff` (`linux/capability.h`).
pub const CAP_FSETID: u32 = 4;
/// A capability's bit in `CapEff` (`linux/capability.h`).
pub const CAP_SYS_ADMIN: u32 = 21;

/// The inode number of the initial user namespace's nsfs file (`PROC_USER_INIT_INO`,
/// `include/linux/proc_ns.h`): fixed by the kernel, the same on every boot.
const INITIAL_USER_NS_INO: u64 = 0xEFFF_FFFD;

/// One user namespace's ID mapping as `/proc/PID/uid_map` or `gid_map` shows it to
/// this process: ranges of (first ID inside, first ID outside, count), where "outside"
/// is this process's own user namespace (user_namespaces(7)).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdMap(Vec<(u32, u32, u32)>);

impl IdMap {
    /// The identity mapping of every ID: what a task in this process's own user
    /// namespace has.
    pub fn identity() -> IdMap {
        IdMap(vec![(0, 0, u32::MAX)])
    }

    /// Parses a `uid_map`/`gid_map` file.
    ///
    /// # Errors
    /// `EIO` for a line that is not three numbers.
    pub fn parse(text: &str) -> super::SysResult<IdMap> {
        let mut ranges = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let n: Vec<u32> = line
                .split_whitespace()
                .map(|f| f.parse::<u32>().map_err(|_| super::Errno::EIO))
                .collect::<Result<_, _>>()?;
            let [inside, outside, count] = n[..] else {
                return Err(super::Errno::EIO);
            };
            ranges.push((inside, outside, count));
        }
        Ok(IdMap(ranges))
    }

    /// The ID inside the namespace that `outside` (an ID of this process's namespace)
    /// is, if the namespace maps it.
    pub fn inside_of(&self, outside: u32) -> Option<u32> {
        self.0.iter().find_map(|&(i, o, n)| {
            let off = outside.checked_sub(o)?;
            (off < n).then(|| i + off)
        })
    }

    /// Whether the namespace has the ID `inside` at all.
    pub fn maps_inside(&self, inside: u32) -> bool {
        self.0
            .iter()
            .any(|&(i, _, n)| inside.checked_sub(i).is_some_and(|off| off < n))
    }
}

/// What `/proc/PID` says of a calling thread's credentials: what the daemon needs for
/// the few decisions it makes itself, which FUSE does not send the facts for (the
/// caller's capabilities and supplementary groups; with `FUSE_ALLOW_IDMAP`, its uid
/// and gid too, outside of creation requests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskCredentials {
    /// `CapEff`: the effective capabilities, in the task's own user namespace.
    pub effective_caps: u64,
    /// Whether the task is in the initial user namespace, where a capability is what
    /// the kernel's `capable()` asks for.
    pub in_initial_user_ns: bool,
    /// The file-system gid and the supplementary groups, as this process's user
    /// namespace sees them.
    pub fsgid: u32,
    pub groups: Vec<u32>,
    /// The task's user namespace's mappings, as this process sees them.
    pub uid_map: IdMap,
    pub gid_map: IdMap,
}

impl TaskCredentials {
    /// Whether the task has capability `cap` in its own user namespace.
    pub fn has_cap(&self, cap: u32) -> bool {
        self.effective_caps & (1u64 << cap) != 0
    }

    /// Whether the task has `cap` where the kernel's `capable()` looks: in the initial
    /// user namespace.
    pub fn capable(&self, cap: u32) -> bool {
        self.in_initial_user_ns && self.has_cap(cap)
    }

    /// Whether `gid`, a group as the task's own user namespace sees it, is its
    /// file-system group or one of its supplementary groups (the kernel's `in_group_p`
    /// for a mount whose idmapping is the task's namespace, or none).
    pub fn in_group(&self, gid: u32) -> bool {
        std::iter::once(self.fsgid)
            .chain(self.groups.iter().copied())
            .any(|g| self.gid_map.inside_of(g) == Some(gid))
    }

    /// Parses the `status` file of a task and its namespace's maps.
    ///
    /// # Errors
    /// `EIO` when a line the parse needs is missing or malformed.
    pub fn parse(
        status: &str,
        in_initial_user_ns: bool,
        uid_map: IdMap,
        gid_map: IdMap,
    ) -> super::SysResult<TaskCredentials> {
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .ok_or(super::Errno::EIO)
        };
        let numbers = |line: &str| -> super::SysResult<Vec<u32>> {
            line.split_whitespace()
                .map(|g| g.parse::<u32>().map_err(|_| super::Errno::EIO))
                .collect()
        };
        let effective_caps =
            u64::from_str_radix(field("CapEff:")?.trim(), 16).map_err(|_| super::Errno::EIO)?;
        // Real, effective, saved and file-system gid.
        let fsgid = *numbers(field("Gid:")?)?.get(3).ok_or(super::Errno::EIO)?;
        let groups = numbers(field("Groups:")?)?;
        Ok(TaskCredentials {
            effective_caps,
            in_initial_user_ns,
            fsgid,
            groups,
            uid_map,
            gid_map,
        })
    }
}

/// The credentials of thread `pid` (in this process's pid namespace), read from
/// `/proc/PID`. The caller of a FUSE request is blocked in that request while the
/// daemon reads them, so its pid cannot have been reused and its credentials cannot
/// change (a thread changes only its own, and not while it waits in a system call).
///
/// # Errors
/// `ESRCH` for pid 0 (a caller this namespace cannot see), the error of reading the
/// files, or `EIO` when they are malformed.
pub fn task_credentials(pid: u32) -> super::SysResult<TaskCredentials> {
    if pid == 0 {
        return Err(super::Errno(libc::ESRCH));
    }
    let read = |name: &str| {
        std::fs::read_to_string(format!("/proc/{pid}/{name}"))
            .map_err(|e| super::Errno::from_io(&e))
    };
    let status = read("status")?;
    let ns =
        std::fs::metadata(format!("/proc/{pid}/ns/user")).map_err(|e| super::Errno::from_io(&e))?;
    let initial = std::os::unix::fs::MetadataExt::ino(&ns) == INITIAL_USER_NS_INO;
    TaskCredentials::parse(
        &status,
        initial,
        IdMap::parse(&read("uid_map")?)?,
        IdMap::parse(&read("gid_map")?)?,
    )
}

/// A user namespace with the maps `uid_map` and `gid_map` (lines of "inside outside
/// count", as `/proc/PID/uid_map` takes them), as an open `/proc/PID/ns/user`: what
/// `mount_setattr(MOUNT_ATTR_IDMAP)` takes to idmap a mount. A child is forked, makes
/// the namespace (`unshare(CLONE_NEWUSER)`), and waits until this process has written
/// its maps and opened its namespace; then it exits, and the descriptor keeps the
/// namespace (runc does the same with a process spawned for the purpose,
/// libcontainer/internal/userns/usernsfd_linux.go). Needs `CAP_SETUID` and
/// `CAP_SETGID` for maps beyond this process's own IDs.
///
/// # Errors
/// The error of `pipe2`, `fork`, `unshare` (in the child), writing a map (`EINVAL`
/// for overlapping or too many ranges, `EPERM` without the capabilities), or opening
/// the namespace.
pub fn user_namespace(uid_map: &str, gid_map: &str) -> super::SysResult<std::os::fd::OwnedFd> {
    use rustix::pipe::{PipeFlags, pipe_with};
    use std::os::fd::{AsRawFd, OwnedFd};
    let (ready_r, ready_w) = pipe_with(PipeFlags::CLOEXEC).map_err(super::failed("pipe2"))?;
    let (release_r, release_w) = pipe_with(PipeFlags::CLOEXEC).map_err(super::failed("pipe2"))?;
    // SAFETY: fork(2) in a process that may have other threads: the child calls only
    // async-signal-safe system calls (unshare, write, read, _exit) on descriptors it
    // owns, touches no lock and no allocator, and always ends in _exit.
    #[allow(unsafe_code)]
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(super::failed("fork")(std::io::Error::last_os_error()));
    }
    if pid == 0 {
        // SAFETY: the child side of the fork above; see there.
        #[allow(unsafe_code)]
        unsafe {
            let err: i32 = if libc::unshare(libc::CLONE_NEWUSER) == 0 {
                0
            } else {
                *libc::__errno_location()
            };
            let bytes = err.to_ne_bytes();
            libc::write(ready_w.as_raw_fd(), bytes.as_ptr().cast(), bytes.len());
            let mut b = 0u8;
            libc::read(release_r.as_raw_fd(), std::ptr::from_mut(&mut b).cast(), 1);
            libc::_exit(0);
        }
    }
    drop((ready_w, release_r));
    let reap = |release: OwnedFd| {
        // A byte, not the end of the pipe: a child forked meanwhile by another thread
        // holds a copy of this end until it exits.
        let _ = rustix::io::write(&release, &[1]);
        drop(release);
        let mut status = 0;
        // SAFETY: waits for the child forked above, which exits once `release` is
        // closed; `status` is a live i32.
        #[allow(unsafe_code)]
        unsafe {
            libc::waitpid(pid, &raw mut status, 0);
        }
    };
    let mut word = [0u8; 4];
    let got = rustix::io::read(&ready_r, &mut word);
    let child_err = i32::from_ne_bytes(word);
    let result = match got {
        Ok(4) if child_err == 0 => (|| {
            let write = |name: &str, map: &str| {
                std::fs::write(format!("/proc/{pid}/{name}"), map).map_err(|e| {
                    super::failed::<super::Errno>("write(uid_map/gid_map)")(super::Errno::from_io(
                        &e,
                    ))
                })
            };
            write("uid_map", uid_map)?;
            write("gid_map", gid_map)?;
            let ns = std::fs::File::open(format!("/proc/{pid}/ns/user"))
                .map_err(|e| super::Errno::from_io(&e))?;
            Ok(OwnedFd::from(ns))
        })(),
        Ok(4) => Err(super::failed::<super::Errno>("unshare(CLONE_NEWUSER)")(
            super::Errno(child_err),
        )),
        Ok(_) => Err(super::Errno::EIO),
        Err(e) => Err(super::failed("read")(e)),
    };
    reap(release_w);
    result
}

/// The uid or gid map that shows every ID as itself (`/proc/PID/uid_map` format).
pub const IDENTITY_MAP: &str = "0 0 4294967295\n";

/// A gid map that shows the on-disk group `disk` as `shown` (and `shown` as `disk`, a
/// map being one to one) and every other ID as itself; with `disk == shown`, the
/// identity. At most five ranges, far below the kernel's limit of 340.
pub fn swap_map(disk: u32, shown: u32) -> String {
    // IDs 0..=u32::MAX - 1 (u32::MAX is the invalid ID).
    const ALL: u64 = u32::MAX as u64;
    if disk == shown {
        return format!("0 0 {ALL}\n");
    }
    let (a, b) = (u64::from(disk.min(shown)), u64::from(disk.max(shown)));
    let mut out = String::new();
    let mut identity = |from: u64, to: u64| {
        if to > from {
            out.push_str(&format!("{from} {from} {}\n", to - from));
        }
    };
    identity(0, a);
    identity(a + 1, b);
    identity(b + 1, ALL);
    out.push_str(&format!("{a} {b} 1\n{b} {a} 1\n"));
    out
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

/// Moves the calling thread (only it: a network namespace is a thread's) into the
/// network namespace at `path` (`/proc/1/ns/net`, the host's, seen with `hostPID`),
/// so that the sockets a kernel client opens for a mount the thread makes are the
/// host's, not a container's that goes with it.
///
/// # Errors
/// The error of opening `path` or of `setns(2)`.
pub fn enter_net_namespace(path: &std::path::Path) -> super::SysResult<()> {
    let ns = rustix::fs::open(
        path,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(super::failed("open"))?;
    rustix::thread::move_into_link_name_space(
        std::os::fd::AsFd::as_fd(&ns),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )
    .map_err(super::failed("setns"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread enters a network namespace (here the one it is in already, as a node
    /// plugin with hostPID enters the host's) and says which path it could not open.
    #[test]
    fn a_thread_enters_a_network_namespace_by_its_path() {
        std::thread::spawn(|| enter_net_namespace(std::path::Path::new("/proc/self/ns/net")))
            .join()
            .unwrap()
            .unwrap();
        assert_eq!(
            enter_net_namespace(std::path::Path::new("/nonexistent/ns")),
            Err(super::super::Errno::ENOENT)
        );
    }

    #[test]
    fn a_thread_waits_where_its_state_and_wchan_say() {
        let stat = |state: &str| format!("4242 (mount (view)) {state} 1 4242 4242 0 -1");
        for (state, wchan, want) in [
            ("D", "0", Waiting::OnFileSystem),
            ("S", "request_wait_answer\n", Waiting::OnFileSystem),
            ("S", "__fuse_simple_request", Waiting::OnFileSystem),
            ("S", "fuse_dev_do_read", Waiting::Elsewhere),
            ("S", "futex_wait_queue", Waiting::Elsewhere),
            ("R", "0", Waiting::Elsewhere),
            ("T", "do_signal_stop", Waiting::Stopped),
            ("t", "ptrace_stop", Waiting::Stopped),
        ] {
            assert_eq!(thread_waiting(&stat(state), wchan), want, "{state} {wchan}");
        }
        assert_eq!(thread_waiting("garbage", ""), Waiting::Unknown);
    }

    #[test]
    fn this_process_waits_on_no_file_system() {
        assert_eq!(waiting(std::process::id()), Waiting::Elsewhere);
        assert_eq!(waiting(u32::MAX), Waiting::Unknown);
    }

    #[test]
    fn id_maps_translate_between_namespaces() {
        // A pod's namespace as kubelet allocates it: 0-65535 onto 131072-196607.
        let pod = IdMap::parse("         0     131072      65536\n").unwrap();
        assert_eq!(pod.inside_of(131072), Some(0));
        assert_eq!(pod.inside_of(135314), Some(4242));
        assert_eq!(
            pod.inside_of(4242),
            None,
            "a node ID the pod has no name for"
        );
        assert_eq!(pod.inside_of(196608), None);
        assert!(pod.maps_inside(65535) && !pod.maps_inside(65536));
        let host = IdMap::parse("0 0 4294967295\n").unwrap();
        assert_eq!(host, IdMap::identity());
        assert_eq!(host.inside_of(4242), Some(4242));
        let two = IdMap::parse("0 1000 1\n1 100000 65536\n").unwrap();
        assert_eq!(two.inside_of(1000), Some(0));
        assert_eq!(two.inside_of(100001), Some(2));
        assert!(IdMap::parse("0 1000\n").is_err());
    }

    #[test]
    fn credentials_come_from_status() {
        let status = "Name:\tsh\nUid:\t1000\t1000\t1000\t1000\nGid:\t132072\t132072\t132072\t135314\n\
                      Groups:\t135314 131072 \nCapEff:\t0000000000000010\n";
        let pod = IdMap::parse("0 131072 65536").unwrap();
        let c = TaskCredentials::parse(status, false, pod.clone(), pod).unwrap();
        assert_eq!(c.fsgid, 135314, "the file-system gid, fourth");
        assert_eq!(c.groups, [135314, 131072]);
        assert!(
            c.has_cap(CAP_FSETID) && !c.capable(CAP_FSETID),
            "its own namespace only"
        );
        assert!(c.in_group(4242) && c.in_group(0) && !c.in_group(1000));
        assert!(
            TaskCredentials::parse("Gid:\t1\n", true, IdMap::identity(), IdMap::identity())
                .is_err()
        );
    }

    #[test]
    fn swap_maps_are_one_to_one_and_cover_every_id() {
        let parse = |m: &str| IdMap::parse(m).unwrap();
        let m = parse(&swap_map(2_147_490_000, 4242));
        assert_eq!(m.inside_of(4242), Some(2_147_490_000));
        assert_eq!(m.inside_of(2_147_490_000), Some(4242));
        for id in [
            0,
            1,
            4241,
            4243,
            1000,
            2_147_489_999,
            2_147_490_001,
            u32::MAX - 1,
        ] {
            assert_eq!(m.inside_of(id), Some(id), "{id}");
        }
        assert_eq!(m.inside_of(u32::MAX), None);
        assert!(m.maps_inside(2_147_490_000) && m.maps_inside(4242));
        assert_eq!(parse(&swap_map(7, 7)), IdMap::identity());
        // Adjacent and at the ends.
        let m = parse(&swap_map(0, 1));
        assert_eq!(
            (m.inside_of(0), m.inside_of(1), m.inside_of(2)),
            (Some(1), Some(0), Some(2))
        );
    }

    #[test]
    fn a_user_namespace_takes_its_maps() {
        let ns = user_namespace("0 0 4294967295\n", &swap_map(70000, 4242)).unwrap();
        // A namespace of its own, not this process's.
        let mine = std::fs::metadata("/proc/self/ns/user").unwrap();
        let st = rustix::fs::fstat(&ns).unwrap();
        assert_ne!(st.st_ino, std::os::unix::fs::MetadataExt::ino(&mine));
        assert!(
            user_namespace("0 0 1\n0 1 1\n", "0 0 1\n").is_err(),
            "overlapping ranges"
        );
    }

    #[test]
    fn this_process_reads_as_it_is() {
        let me = task_credentials(std::process::id()).unwrap();
        assert_eq!(me.fsgid, rustix::process::getegid().as_raw());
        let mut groups: Vec<u32> = rustix::process::getgroups()
            .unwrap()
            .iter()
            .map(|g| g.as_raw())
            .collect();
        groups.sort_unstable();
        let mut read = me.groups.clone();
        read.sort_unstable();
        assert_eq!(read, groups);
        assert_eq!(me.has_cap(CAP_SYS_ADMIN), is_root());
        // Its own namespace maps every one of its groups to itself.
        assert!(me.in_group(me.fsgid));
        assert!(
            task_credentials(0).is_err(),
            "pid 0: a caller this namespace cannot see"
        );
    }
}

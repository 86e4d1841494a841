//! cgroup v2: a directory per group of processes, in which a process is started, and
//! which can be killed whole, bounded in memory and measured. The keeper runs each view
//! in a cgroup of its own outside its container's (`volume/keeper.rs`), so that a
//! runtime that kills the container's cgroup, or an OOM kill of the container's group,
//! never reaches a view, and one view's OOM kill never reaches another.

use std::fs;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{Errno, SysResult};

/// `CGROUP2_SUPER_MAGIC` (include/uapi/linux/magic.h).
const CGROUP2_MAGIC: i64 = 0x6367_7270;

/// A cgroup v2 directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cgroup {
    path: PathBuf,
}

impl Cgroup {
    /// The cgroup at `path`, which must be a directory of a cgroup v2 hierarchy.
    ///
    /// # Errors
    /// `ENOENT` if it does not exist, `ENOTDIR`-like `EMEDIUMTYPE` if it is not cgroup v2.
    pub fn open(path: &Path) -> SysResult<Cgroup> {
        let st = rustix::fs::statfs(path).map_err(super::failed("statfs"))?;
        if st.f_type as i64 != CGROUP2_MAGIC {
            return Err(Errno(libc::EMEDIUMTYPE));
        }
        Ok(Cgroup {
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The child cgroup `name`, made if it does not exist.
    ///
    /// # Errors
    /// The error of `mkdir`; `EINVAL` for a name that is not one path component.
    pub fn child(&self, name: &str) -> SysResult<Cgroup> {
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Err(Errno::EINVAL);
        }
        let path = self.path.join(name);
        match fs::create_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Errno::from_io(&e)),
        }
        Ok(Cgroup { path })
    }

    /// Its child cgroups.
    pub fn children(&self) -> Vec<Cgroup> {
        let Ok(entries) = fs::read_dir(&self.path) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| Cgroup { path: e.path() })
            .collect()
    }

    fn write(&self, file: &str, value: &str) -> SysResult<()> {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .open(self.path.join(file))
            .map_err(|e| Errno::from_io(&e))?;
        f.write_all(value.as_bytes())
            .map_err(|e| Errno::from_io(&e))
    }

    fn read(&self, file: &str) -> SysResult<String> {
        fs::read_to_string(self.path.join(file)).map_err(|e| Errno::from_io(&e))
    }

    /// The processes in it.
    fn procs(&self) -> Vec<u32> {
        self.read("cgroup.procs")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Whether any process is in it or below it (`cgroup.events`).
    pub fn populated(&self) -> bool {
        self.read("cgroup.events")
            .map(|s| s.lines().any(|l| l.trim() == "populated 1"))
            .unwrap_or(false)
    }

    /// SIGKILLs every process in it and below it at once (`cgroup.kill`, Linux 5.14),
    /// as a runtime kills a container and as the OOM killer kills a group; on an older
    /// kernel, each process listed.
    ///
    /// # Errors
    /// The error of writing `cgroup.kill`.
    pub fn kill(&self) -> SysResult<()> {
        match self.write("cgroup.kill", "1") {
            Err(Errno(libc::ENOENT)) => {
                for pid in self.procs() {
                    if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
                        let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
                    }
                }
                Ok(())
            }
            other => other,
        }
    }

    /// How long ago it was made (its directory's modification time, set when the
    /// kernel makes it); `None` if that cannot be read.
    pub fn age(&self) -> Option<std::time::Duration> {
        fs::metadata(&self.path)
            .ok()?
            .modified()
            .ok()?
            .elapsed()
            .ok()
    }

    /// Removes it (it must be empty of processes and children).
    ///
    /// # Errors
    /// `EBUSY` while it has processes or children.
    pub fn remove(&self) -> SysResult<()> {
        fs::remove_dir(&self.path).map_err(|e| Errno::from_io(&e))
    }

    /// The controllers its children can use (`cgroup.controllers` of the children is
    /// `cgroup.subtree_control` here).
    pub fn controllers(&self) -> Vec<String> {
        self.read("cgroup.controllers")
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string)
            .collect()
    }

    /// Gives its children the `controller` (`+memory` in `cgroup.subtree_control`).
    ///
    /// # Errors
    /// `ENOENT` if it does not have the controller itself; the kernel's error otherwise
    /// (`EBUSY`: it has processes of its own, the "no internal processes" rule).
    pub fn delegate(&self, controller: &str) -> SysResult<()> {
        if !self.controllers().iter().any(|c| c == controller) {
            return Err(Errno::ENOENT);
        }
        self.write("cgroup.subtree_control", &format!("+{controller}"))
    }

    /// Bounds its memory (`memory.max`): beyond it the kernel reclaims, then OOM-kills
    /// in this cgroup only.
    ///
    /// # Errors
    /// `ENOENT` when the memory controller is not enabled for it.
    pub fn set_memory_max(&self, bytes: u64) -> SysResult<()> {
        self.write("memory.max", &bytes.to_string())
    }

    /// Makes `cmd`'s process join this cgroup between fork and exec, so that the
    /// program starts inside it: nothing of it is ever charged to the parent's cgroup,
    /// and no moment exists in which the parent's container's death would kill it.
    ///
    /// # Errors
    /// The error of opening `cgroup.procs`.
    pub fn spawn_into(&self, cmd: &mut Command) -> SysResult<()> {
        let procs: OwnedFd = fs::OpenOptions::new()
            .write(true)
            .open(self.path.join("cgroup.procs"))
            .map_err(|e| Errno::from_io(&e))?
            .into();
        let fd = procs.as_raw_fd();
        // SAFETY: between fork and exec only async-signal-safe calls are allowed:
        // write(2) of a constant to a descriptor opened before the fork. `procs` is
        // moved into the closure, so the descriptor stays open until the `Command` is
        // dropped (it has O_CLOEXEC: the program does not inherit it).
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(move || {
                let _keep = &procs;
                // "0": the writing process itself.
                let n = libc::write(fd, c"0".as_ptr().cast(), 1);
                if n == 1 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
        Ok(())
    }
}

/// Which cgroup v2 `pid` is in, as this process's cgroup namespace sees it (`0::PATH`).
pub fn cgroup_of(pid: u32) -> Option<String> {
    let s = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_string)
}

/// What [`join_init_cgroup_namespace`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum NamespaceJoin {
    /// This process was in pid 1's cgroup namespace already.
    Same,
    /// It joined pid 1's.
    Joined,
    /// Pid 1's namespace cannot be read here (a sandbox that hides it): this process
    /// stays in its own.
    Hidden(Errno),
}

/// Joins the cgroup namespace of the process with pid 1 if it differs from this
/// process's own (a container's private cgroup namespace): only from there can a
/// process be moved to a cgroup outside the container's (on a hierarchy mounted with
/// `nsdelegate`, as systemd mounts it, a namespace is a delegation boundary: Linux
/// kernel/cgroup/cgroup.c `cgroup_procs_write_permission` refuses a move whose source
/// or destination is outside the writer's namespace root). Call it
/// before any thread starts: the children of this thread inherit it.
///
/// # Errors
/// The error of `setns` into a namespace that could be read.
pub fn join_init_cgroup_namespace() -> SysResult<NamespaceJoin> {
    let own = fs::read_link("/proc/self/ns/cgroup").map_err(|e| Errno::from_io(&e))?;
    let init = match fs::read_link("/proc/1/ns/cgroup") {
        Ok(l) => l,
        Err(e) => return Ok(NamespaceJoin::Hidden(Errno::from_io(&e))),
    };
    if own == init {
        return Ok(NamespaceJoin::Same);
    }
    let ns = fs::File::open("/proc/1/ns/cgroup").map_err(|e| Errno::from_io(&e))?;
    rustix::thread::move_into_link_name_space(
        std::os::fd::AsFd::as_fd(&ns),
        Some(rustix::thread::LinkNameSpaceType::ControlGroup),
    )
    .map_err(super::failed("setns"))?;
    Ok(NamespaceJoin::Joined)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_name_is_one_component() {
        let cg = Cgroup {
            path: PathBuf::from("/nonexistent-cgroup"),
        };
        for bad in ["", ".", "..", "a/b", "../x"] {
            assert_eq!(cg.child(bad), Err(Errno::EINVAL), "{bad}");
        }
    }

    #[test]
    fn a_directory_that_is_not_cgroup2_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Cgroup::open(dir.path()), Err(Errno(libc::EMEDIUMTYPE)));
    }
}

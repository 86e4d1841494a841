//! The keeper's other end: a view process's hold on it (`KeeperClient`, its
//! connection and journal kept there), and the questions a driver asks it.

use super::*;

/// A view's line to the keeper that started it (`MOUNTGROUP_KEEPER_SOCKET`).
pub struct KeeperClient {
    pub socket: PathBuf,
    pub recover: bool,
}

/// Sends one request to the keeper at `socket` and returns its answer.
///
/// # Errors
/// The error of connecting or of the exchange.
pub fn ask(socket: &Path, request: &Request) -> io::Result<Response> {
    let stream = UnixStream::connect(socket)?;
    write_frame(&stream, request)?;
    read_frame(&stream)
}

/// Whether the keeper listening at `socket` runs in this container (not another pod's)
/// and is ready: a readiness probe, so that a rolling update deletes the old pod only
/// after the new keeper took its views over. Another container's keeper is one outside
/// this PID namespace (the kernel gives its pid as 0) or, where pods share the host's
/// (`hostPID`), one in another cgroup or mount namespace: kubelet's exec probe runs
/// through the CRI's `ExecSync`, which the runtime carries out like `runc exec`: in the
/// container's namespaces and cgroup (runc libcontainer/process_linux.go,
/// `setnsProcess`).
///
/// # Errors
/// Why it is not ready.
pub fn probe(socket: &Path) -> Result<(), String> {
    let stream = UnixStream::connect(socket).map_err(|e| format!("{}: {e}", socket.display()))?;
    // The kernel gives the peer's pid as this namespace sees it: 0 when it is outside.
    let peer = fdpass::peer(stream.as_fd()).map_err(|e| e.to_string())?;
    if peer.pid == 0 {
        return Err("the keeper at the socket is another container's".into());
    }
    let (ours, theirs) = (
        crate::sys::cgroup::cgroup_of(std::process::id()),
        crate::sys::cgroup::cgroup_of(peer.pid as u32),
    );
    use crate::sys::process::mount_namespace;
    if mount_namespace("self") != mount_namespace(&peer.pid.to_string()) {
        return Err(
            "the keeper at the socket is another container's (another mount namespace)".into(),
        );
    }
    if ours != theirs {
        return Err(format!(
            "the keeper at the socket is another container's (its cgroup is {}, this one's {})",
            theirs.as_deref().unwrap_or("unknown"),
            ours.as_deref().unwrap_or("unknown")
        ));
    }
    write_frame(&stream, &Request::Ready).map_err(|e| e.to_string())?;
    match read_frame(&stream).map_err(|e| e.to_string())? {
        Response::Ready => Ok(()),
        other => Err(format!("{other:?}")),
    }
}

impl handover::Holder for KeeperClient {
    fn recovering(&self) -> bool {
        self.recover
    }

    fn hold(
        &self,
        mountpoint: &Path,
        dev: BorrowedFd<'_>,
        journal: BorrowedFd<'_>,
    ) -> io::Result<()> {
        let stream = UnixStream::connect(&self.socket)?;
        let request = Request::Hold {
            mountpoint: mountpoint.to_path_buf(),
            instance: std::env::var(INSTANCE_ENV).unwrap_or_default(),
        };
        write_frame(&stream, &request)?;
        fdpass::send_fds(stream.as_fd(), b'F', &[dev, journal])?;
        match read_frame(&stream)? {
            Response::Held => Ok(()),
            other => Err(io::Error::other(format!("the keeper answered {other:?}"))),
        }
    }

    fn recover(&self, mountpoint: &Path) -> io::Result<(OwnedFd, OwnedFd)> {
        let stream = UnixStream::connect(&self.socket)?;
        write_frame(
            &stream,
            &Request::Recover {
                mountpoint: mountpoint.to_path_buf(),
            },
        )?;
        match read_frame(&stream)? {
            Response::Recover => {}
            Response::Refused(why) => return Err(io::Error::new(io::ErrorKind::NotFound, why)),
            other => return Err(io::Error::other(format!("the keeper answered {other:?}"))),
        }
        let (_, mut fds) = fdpass::recv_fds(stream.as_fd())?;
        match (fds.len(), fds.pop(), fds.pop()) {
            (2, Some(journal), Some(dev)) => Ok((dev, journal)),
            _ => Err(io::Error::other("the keeper sent no connection")),
        }
    }
}

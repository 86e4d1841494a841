//! Handing a live view to a new process without unmounting it: the process serving a
//! view listens on a control socket; a new `mountgroup mount` of the same source on the
//! same mountpoint connects, and the old process stops its FUSE workers between
//! requests, sends the connection's descriptor, its tables and the descriptors they
//! refer to (`SCM_RIGHTS`), and exits once the new process says it serves. Requests
//! that arrive meanwhile wait in the kernel's queue; nothing fails.
//!
//! The wire: length-prefixed JSON frames (8 bytes little-endian, then the bytes) and
//! one-byte messages carrying descriptors. Only a root peer is answered (`SO_PEERCRED`),
//! and the socket lives in a root-only directory: the descriptors it hands out open
//! every file of the view.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::fs::journal::Negotiated;

use crate::sys::fdpass::{self, FDS_PER_MESSAGE};
use crate::wire::{NamedSocket, read_frame, write_frame};

use super::fuse::FuseView;
use crate::fs::snapshot::ViewSnapshot;

/// Where views listen unless told otherwise (`--control-dir`).
pub const DEFAULT_CONTROL_DIR: &str = "/run/mountgroup/views";

/// How long a view waits for a request once connected, and for the successor's word
/// after it sent everything; past that it serves again.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
const ACK_TIMEOUT: Duration = Duration::from_secs(30);

/// The control socket of the view on `mountpoint` (an absolute, canonical path).
pub fn socket_path(dir: &Path, mountpoint: &Path) -> PathBuf {
    dir.join(format!("{}.sock", crate::pathkey::path_key(mountpoint)))
}

/// Why a handover did not happen.
#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("the serving view refused: {0}")]
    Refused(String),
    #[error("the new process could not take the view: {0}")]
    Failed(String),
}

/// What identifies a view: a successor must serve the same thing the same way.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub source: PathBuf,
    pub mountpoint: PathBuf,
    /// The view's options as `ViewOptions::to_option_string` writes them.
    pub options: String,
}

/// What a view is asked.
#[derive(Serialize, Deserialize)]
enum Request {
    /// Hand the view over to the asking process, which serves `Identity` the same way.
    Handover(Identity),
    /// Say who serves the view and how it was started.
    Describe,
}

/// The environment variable that names the keeper instance that started a view
/// (`volume/keeper.rs`): a keeper takes over the views other keepers started.
pub const INSTANCE_ENV: &str = "MOUNTGROUP_VIEW_INSTANCE";

/// The environment variable that names the socket of the keeper that started a view:
/// a keeper takes over only views started by a keeper at its own socket (its
/// predecessors), never a view mounted by hand or another driver's.
pub const KEEPER_SOCKET_ENV: &str = "MOUNTGROUP_KEEPER_SOCKET";

/// The FUSE protocol minor of this kernel's INIT, as the keeper that starts a view
/// asked it (`transport::probe`): what a view must know before its own INIT comes.
pub const FUSE_MINOR_ENV: &str = "MOUNTGROUP_FUSE_MINOR";

/// The FUSE protocol minor [`FUSE_MINOR_ENV`] gives, if it gives one.
pub fn fuse_minor_from_env() -> Option<u32> {
    std::env::var(FUSE_MINOR_ENV).ok()?.parse().ok()
}

/// Who serves a view, and how to start a process that takes it over.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Description {
    /// The serving process, as its own PID namespace numbers it.
    pub pid: u32,
    /// [`INSTANCE_ENV`] of the serving process (empty if unset).
    pub instance: String,
    /// The binary that serves it (`/proc/self/exe`).
    pub binary: PathBuf,
    /// Its arguments after the program name (`mount SOURCE MOUNTPOINT ...`): the same
    /// arguments make a successor.
    pub args: Vec<std::ffi::OsString>,
    /// [`KEEPER_SOCKET_ENV`] of the serving process: the keeper that started it
    /// (`None`: started by hand, or by a version that did not say).
    #[serde(default)]
    pub keeper: Option<PathBuf>,
}

impl Description {
    fn of_this_process() -> Description {
        Description {
            pid: std::process::id(),
            instance: std::env::var(INSTANCE_ENV).unwrap_or_default(),
            binary: std::env::current_exe().unwrap_or_default(),
            args: std::env::args_os().skip(1).collect(),
            keeper: std::env::var_os(KEEPER_SOCKET_ENV).map(PathBuf::from),
        }
    }
}

#[derive(Serialize, Deserialize)]
enum Reply {
    Refused(String),
    /// Followed by `fds` descriptors: the connection's first, then the snapshot's.
    Handover {
        passthrough: bool,
        /// Absent from what earlier versions sent, which never asked for it.
        #[serde(default)]
        idmap: bool,
        #[serde(default)]
        minor: u32,
        fds: usize,
        snapshot: ViewSnapshot,
    },
}

/// The successor's word. `Serving` is answered with `Bye` by a predecessor that still
/// waits, which then exits: a successor serves only after `Bye`, so that a predecessor
/// that gave up waiting (and serves again) and its successor never both serve.
#[derive(Serialize, Deserialize)]
enum Ack {
    Serving,
    Failed(String),
}

#[derive(Serialize, Deserialize)]
struct Bye;

/// A view's control socket ([`socket_path`] in the control directory); a successor
/// takes its name over atomically.
pub struct ControlSocket(NamedSocket);

impl ControlSocket {
    /// Listens at [`socket_path`] in `dir` (made mode 0700 if missing).
    ///
    /// # Errors
    /// The error of making the directory, binding or renaming.
    pub fn bind(dir: &Path, mountpoint: &Path) -> io::Result<ControlSocket> {
        let make = || -> io::Result<NamedSocket> {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
            NamedSocket::bind(&socket_path(dir, mountpoint))
        };
        // Once more if a view that left removed the (then empty) directory meanwhile.
        match make() {
            Err(e) if e.kind() == io::ErrorKind::NotFound => make().map(ControlSocket),
            r => r.map(ControlSocket),
        }
    }

    /// Removes the socket's name, unless a successor's socket has it now, and the
    /// directory if that leaves it empty (a view leaves nothing behind).
    pub fn remove(&self) {
        self.0.remove();
        if let Some(dir) = self.0.path.parent() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// A request a serving view accepted: the workers are told to stop, and the session's
/// caller hands the view over on this stream ([`hand_over`]).
pub struct Accepted(UnixStream);

/// Answers handover requests for the view `identity` in a thread of its own: a request
/// from a root peer for the same identity is put in `pending`, and `stop` is called
/// (it stops the FUSE workers). Other requests are refused with the reason.
///
/// # Errors
/// The error of spawning the thread.
pub fn listen(
    control: Arc<ControlSocket>,
    identity: Identity,
    pending: Arc<Mutex<Option<Accepted>>>,
    stop: impl Fn() + Send + 'static,
) -> io::Result<()> {
    std::thread::Builder::new()
        .name("mountgroup-control".into())
        .spawn(move || {
            for stream in control.0.listener.incoming() {
                let Ok(stream) = stream else { continue };
                if let Err(e) = answer(&stream, &identity, &pending, &stop) {
                    tracing::debug!(error = %e, "handover request not answered");
                }
            }
        })?;
    Ok(())
}

fn answer(
    stream: &UnixStream,
    identity: &Identity,
    pending: &Mutex<Option<Accepted>>,
    stop: &impl Fn(),
) -> io::Result<()> {
    match fdpass::peer(stream.as_fd()).map(|p| p.uid) {
        Ok(0) => {}
        Ok(uid) => {
            tracing::warn!(uid, "handover request from a non-root process refused");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    }
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    let request = match read_frame(stream)? {
        Request::Handover(identity) => identity,
        Request::Describe => return write_frame(stream, &Description::of_this_process()),
    };
    let refuse = |why: String| write_frame(stream, &Reply::Refused(why));
    if request.mountpoint != identity.mountpoint {
        return refuse(format!(
            "this view serves {}, not {}",
            identity.mountpoint.display(),
            request.mountpoint.display()
        ));
    }
    if request.source != identity.source {
        return refuse(format!(
            "this view shows {}, not {}",
            identity.source.display(),
            request.source.display()
        ));
    }
    if request.options != identity.options {
        return refuse(format!(
            "this view has the options \"{}\", the new one \"{}\": a takeover keeps the view as it is",
            identity.options, request.options
        ));
    }
    let mut slot = pending.lock().unwrap_or_else(|e| e.into_inner());
    if slot.is_some() {
        return refuse("another handover is in progress".into());
    }
    tracing::info!("handing the view over: stopping the FUSE workers");
    *slot = Some(Accepted(stream.try_clone()?));
    drop(slot);
    stop();
    Ok(())
}

/// Hands the stopped view to the process behind `accepted`: its tables, the
/// connection `dev` and every descriptor the tables refer to. Returns once the
/// successor serves; the caller then exits without unmounting and without closing
/// the passthrough registrations, which the successor adopted.
///
/// # Errors
/// Anything that went wrong, the successor's own failure included: the caller then
/// serves again, with tables and registrations as they were.
pub fn hand_over(
    accepted: Accepted,
    view: &FuseView,
    dev: BorrowedFd<'_>,
) -> Result<(), HandoverError> {
    let stream = accepted.0;
    let (snapshot, fds) = view
        .fs()
        .snapshot()
        .map_err(|e| HandoverError::Failed(e.to_string()))?;
    let mut all: Vec<BorrowedFd<'_>> = Vec::with_capacity(fds.len() + 1);
    all.push(dev);
    all.extend(fds.iter().map(|f| f.as_fd()));
    write_frame(
        &stream,
        &Reply::Handover {
            passthrough: view.negotiated().passthrough,
            idmap: view.negotiated().idmap,
            minor: view.negotiated().minor,
            fds: all.len(),
            snapshot,
        },
    )?;
    for batch in all.chunks(FDS_PER_MESSAGE) {
        fdpass::send_fds(stream.as_fd(), b'F', batch).map_err(io::Error::from)?;
    }
    stream.set_read_timeout(Some(ACK_TIMEOUT))?;
    match read_frame(&stream)? {
        Ack::Serving => {
            write_frame(&stream, &Bye)?;
            Ok(())
        }
        Ack::Failed(why) => Err(HandoverError::Failed(why)),
    }
}

/// A view taken from the process that served it: the connection, the tables and their
/// descriptors.
pub struct Incoming {
    pub dev: OwnedFd,
    pub snapshot: ViewSnapshot,
    pub fds: Vec<OwnedFd>,
    pub negotiated: Negotiated,
}

/// The line to the predecessor, which waits (stopped) until [`Confirmation::serving`]
/// or [`Confirmation::failed`], or until this is dropped, when it serves again.
pub struct Confirmation {
    stream: UnixStream,
}

impl Confirmation {
    /// Tells the predecessor that this process serves the view now, and waits for its
    /// goodbye: it exits without unmounting.
    ///
    /// # Errors
    /// When the predecessor does not say goodbye (it gave up waiting and serves again):
    /// this process must then not serve.
    pub fn serving(self) -> io::Result<()> {
        write_frame(&self.stream, &Ack::Serving)?;
        self.stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
        let Bye = read_frame(&self.stream)?;
        Ok(())
    }

    /// Tells the predecessor to serve again, and why.
    pub fn failed(self, why: &str) {
        let _ = write_frame(&self.stream, &Ack::Failed(why.into()));
    }
}

/// Asks the view served on `identity.mountpoint` for a handover. `Ok(None)` when no
/// view listens there (nothing at the socket's name, or a dead one).
///
/// # Errors
/// [`HandoverError::Refused`] with the serving view's reason, or what went wrong on
/// the way.
pub fn take_over(
    dir: &Path,
    identity: &Identity,
) -> Result<Option<(Incoming, Confirmation)>, HandoverError> {
    let path = socket_path(dir, &identity.mountpoint);
    let stream = match UnixStream::connect(&path) {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOENT | libc::ECONNREFUSED | libc::ENOTDIR)
            ) =>
        {
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    write_frame(&stream, &Request::Handover(identity.clone()))?;
    // Stopping the workers waits for the requests in flight; a stuck backend can make
    // that long, but the view's own timeouts bound the rest.
    let (negotiated, count, snapshot) = match read_frame(&stream)? {
        Reply::Refused(why) => return Err(HandoverError::Refused(why)),
        Reply::Handover {
            passthrough,
            idmap,
            minor,
            fds,
            snapshot,
        } => (
            Negotiated {
                passthrough,
                idmap,
                minor,
            },
            fds,
            snapshot,
        ),
    };
    let mut fds = Vec::with_capacity(count);
    while fds.len() < count {
        let (_, got) = fdpass::recv_fds(stream.as_fd()).map_err(io::Error::from)?;
        if got.is_empty() {
            return Err(HandoverError::Failed(
                "a descriptor message without descriptors".into(),
            ));
        }
        fds.extend(got);
    }
    if fds.len() != count {
        return Err(HandoverError::Failed(format!(
            "{} descriptors received, {count} announced",
            fds.len()
        )));
    }
    let mut fds = fds.into_iter();
    let dev = fds
        .next()
        .ok_or(HandoverError::Failed("no connection descriptor".into()))?;
    Ok(Some((
        Incoming {
            dev,
            snapshot,
            fds: fds.collect(),
            negotiated,
        },
        Confirmation { stream },
    )))
}

/// What runs a view and can outlive it (the keeper, `volume/keeper.rs`): it holds the
/// view's connection and journal, so that when the view's process dies the connection
/// lives on (requests wait) and a new process recovers the view from the journal.
pub trait Holder: Send + Sync {
    /// Whether this process was started to recover a view whose process died.
    fn recovering(&self) -> bool;
    /// Hands the holder a duplicate of the connection and the journal (replacing what
    /// it held for `mountpoint`).
    ///
    /// # Errors
    /// The error of the exchange.
    fn hold(
        &self,
        mountpoint: &Path,
        dev: BorrowedFd<'_>,
        journal: BorrowedFd<'_>,
    ) -> io::Result<()>;
    /// The connection and journal held for `mountpoint`, for a recovering process.
    ///
    /// # Errors
    /// The error of the exchange, or `NotFound` when nothing is held.
    fn recover(&self, mountpoint: &Path) -> io::Result<(OwnedFd, OwnedFd)>;
}

/// Asks the view listening at `socket` who serves it.
///
/// # Errors
/// The error of connecting or of the exchange (a dead view's socket refuses).
pub fn describe(socket: &Path) -> io::Result<Description> {
    let stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    write_frame(&stream, &Request::Describe)?;
    read_frame(&stream)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn descriptors_cross_in_batches() {
        let (a, b) = UnixStream::pair().unwrap();
        let files: Vec<OwnedFd> = (0..FDS_PER_MESSAGE + 3)
            .map(|_| OwnedFd::from(std::fs::File::open("/dev/null").unwrap()))
            .collect();
        let borrowed: Vec<BorrowedFd<'_>> = files.iter().map(|f| f.as_fd()).collect();
        for batch in borrowed.chunks(FDS_PER_MESSAGE) {
            fdpass::send_fds(a.as_fd(), b'F', batch).unwrap();
        }
        let (_, first) = fdpass::recv_fds(b.as_fd()).unwrap();
        let (_, second) = fdpass::recv_fds(b.as_fd()).unwrap();
        assert_eq!(first.len(), FDS_PER_MESSAGE);
        assert_eq!(second.len(), 3);
        let null = std::fs::metadata("/dev/null").unwrap().rdev();
        let got = std::fs::File::from(second.into_iter().next().unwrap());
        assert_eq!(got.metadata().unwrap().rdev(), null);
    }

    #[test]
    fn the_socket_name_moves_to_the_newest_view() {
        let dir = tempfile::tempdir().unwrap();
        let ctl = dir.path().join("ctl");
        let old = ControlSocket::bind(&ctl, Path::new("/m")).unwrap();
        let new = ControlSocket::bind(&ctl, Path::new("/m")).unwrap();
        // The old one leaving does not take the successor's name.
        old.remove();
        assert!(socket_path(&ctl, Path::new("/m")).exists());
        assert_eq!(
            std::fs::metadata(&ctl).unwrap().mode() & 0o777,
            0o700,
            "the control directory is root's alone"
        );
        new.remove();
        assert!(!ctl.exists(), "the last view leaves no directory behind");
    }
}

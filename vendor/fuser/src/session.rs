//! Filesystem session
//!
//! A session runs a filesystem implementation while it is being mounted to a specific mount
//! point. A session begins by mounting the filesystem and ends by unmounting it. While the
//! filesystem is mounted, the session loop receives, dispatches and replies to kernel requests
//! for filesystem operations under its mount point.

use std::borrow::Cow;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::fd::BorrowedFd;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::thread::{self};

use log::debug;
use log::error;
use log::info;
use log::warn;
use nix::unistd::Uid;
use nix::unistd::geteuid;
use parking_lot::Mutex;

use crate::Errno;
use crate::Filesystem;
use crate::KernelConfig;
use crate::MountOption;
use crate::ReplyEmpty;
use crate::ReplyTarget;
use crate::Request;
use crate::channel::Channel;
use crate::channel::ChannelSender;
use crate::dev_fuse::DevFuse;
use crate::ll;
use crate::ll::Operation;
use crate::ll::ResponseErrno;
use crate::ll::Version;
use crate::ll::flags::init_flags::InitFlags;
use crate::ll::fuse_abi as abi;
use crate::mnt::Mount;
use crate::mnt::mount_options::Config;
use crate::mnt::mount_options::check_option_conflicts;
use crate::notify::Notifier;
use crate::read_buf::FuseReadBuf;
use crate::reply::Reply;
use crate::reply::ReplyRaw;
use crate::reply::ReplySender;
use crate::request::RequestWithSender;

/// The max size of write requests from the kernel. The absolute minimum is 4k,
/// FUSE recommends at least 128k, max 16M. The FUSE default is 16M on macOS
/// and 128k on other systems.
pub(crate) const MAX_WRITE_SIZE: usize = 16 * 1024 * 1024;

#[derive(Default, Debug, Eq, PartialEq, Clone, Copy)]
/// How requests should be filtered based on the calling UID.
pub enum SessionACL {
    /// Allow requests from any user. Corresponds to the `allow_other` mount option.
    All,
    /// Allow requests from root. Corresponds to the `allow_root` mount option.
    RootAndOwner,
    /// Allow requests from the owning UID. This is FUSE's default mode of operation.
    #[default]
    Owner,
}

impl SessionACL {
    /// Returns the mount option string for kernel/fusermount/libfuse paths.
    /// Both `All` and `RootAndOwner` map to `allow_other` - the kernel only
    /// understands `allow_other`, and fuser enforces the root-only restriction internally.
    #[allow(dead_code)]
    pub(crate) fn to_mount_option(self) -> Option<&'static str> {
        match self {
            SessionACL::All | SessionACL::RootAndOwner => Some("allow_other"),
            SessionACL::Owner => None,
        }
    }
}

/// Calls `destroy` on drop.
#[derive(Debug)]
pub(crate) struct FilesystemHolder<FS: Filesystem> {
    pub(crate) fs: Option<FS>,
}

impl<FS: Filesystem> FilesystemHolder<FS> {
    fn destroy(&mut self) {
        if let Some(mut fs) = self.fs.take() {
            fs.destroy();
        }
    }
}

impl<FS: Filesystem> Drop for FilesystemHolder<FS> {
    fn drop(&mut self) {
        self.destroy();
    }
}

#[derive(Debug)]
struct UmountOnDrop {
    mount: Arc<Mutex<Option<Mount>>>,
}

impl UmountOnDrop {
    fn umount(&self) -> io::Result<()> {
        if let Some(mount) = self.mount.lock().take() {
            mount.umount()?;
        }
        Ok(())
    }
}

impl Drop for UmountOnDrop {
    fn drop(&mut self) {
        if let Err(e) = self.umount() {
            warn!("Failed to umount filesystem: {}", e);
        }
    }
}

/// The session data structure
#[derive(Debug)]
pub struct Session<FS: Filesystem> {
    /// Filesystem operation implementations. None after `destroy` called.
    pub(crate) filesystem: FilesystemHolder<FS>,
    /// Communication channel to the kernel driver
    pub(crate) ch: Channel,
    /// Handle to the mount.  Dropping this unmounts.
    mount: UmountOnDrop,
    /// Whether to restrict access to owner, root + owner, or unrestricted
    /// Used to implement `allow_root` and `auto_unmount`
    pub(crate) allowed: SessionACL,
    /// User that launched the fuser process
    pub(crate) session_owner: Uid,
    /// FUSE protocol version, as reported by the kernel.
    /// The field is set to `Some` when the init message is received.
    pub(crate) proto_version: Option<Version>,
    pub(crate) config: Config,
    /// Set once [`Session::stopper`] was called: the workers can then be stopped.
    stop: Option<StopState>,
}

/// What the workers of a stoppable session watch.
#[derive(Debug, Clone)]
struct StopState {
    /// Checked after every request: a busy worker never waits for the queue to drain.
    stopped: Arc<AtomicBool>,
    /// The read end of a pipe, readable once stopped: wakes workers waiting for requests.
    wake_read: Arc<OwnedFd>,
    wake_write: Arc<OwnedFd>,
}

/// Ends a session's workers between requests, without unmounting and without touching
/// the connection: every request a worker has read is answered first, and requests
/// that arrive later stay queued in the kernel for whoever serves the connection next
/// (a process the `/dev/fuse` descriptor was handed to). [`Session::run`] then returns.
#[derive(Debug, Clone)]
pub struct SessionStopper(StopState);

impl SessionStopper {
    /// Stops the session's workers (see [`SessionStopper`]). Repeating it does nothing.
    pub fn stop(&self) {
        self.0.stopped.store(true, Ordering::Release);
        // The pipe stays readable: nobody reads it. A full pipe is readable already.
        let _ = nix::unistd::write(&*self.0.wake_write, &[1]);
    }
}

impl<FS: Filesystem> AsFd for Session<FS> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.ch.as_fd()
    }
}

impl<FS: Filesystem> Session<FS> {
    /// Create a new session by mounting the given filesystem to the given mountpoint
    /// # Errors
    /// Returns an error if the options are incorrect, or if the fuse device can't be mounted.
    pub fn new<P: AsRef<Path>>(
        filesystem: FS,
        mountpoint: P,
        options: &Config,
    ) -> io::Result<Session<FS>> {
        check_option_conflicts(options)?;

        let mountpoint = mountpoint.as_ref();
        info!("Mounting {}", mountpoint.display());
        // If AutoUnmount is requested, but not AllowRoot or AllowOther, return an error
        // because fusermount needs allow_root or allow_other to handle the auto_unmount option
        if options.mount_options.contains(&MountOption::AutoUnmount)
            && options.acl == SessionACL::Owner
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("auto_unmount requires acl != Owner, got: {:?}", options.acl),
            ));
        }
        let (file, mount) = Mount::new(mountpoint, &options.mount_options, options.acl)?;

        let ch = Channel::new(file);

        let mut session = Session {
            filesystem: FilesystemHolder {
                fs: Some(filesystem),
            },
            ch,
            mount: UmountOnDrop {
                mount: Arc::new(Mutex::new(Some(mount))),
            },
            allowed: options.acl,
            session_owner: geteuid(),
            proto_version: None,
            config: options.clone(),
            stop: None,
        };

        session.handshake()?;

        Ok(session)
    }

    /// Wrap an existing /dev/fuse file descriptor. This doesn't mount the
    /// filesystem anywhere; that must be done separately.
    pub fn from_fd(
        filesystem: FS,
        fd: OwnedFd,
        acl: SessionACL,
        config: Config,
    ) -> io::Result<Self> {
        let ch = Channel::new(Arc::new(DevFuse(File::from(fd))));
        let mut session = Session {
            filesystem: FilesystemHolder {
                fs: Some(filesystem),
            },
            ch,
            mount: UmountOnDrop {
                mount: Arc::new(Mutex::new(None)),
            },
            allowed: acl,
            session_owner: geteuid(),
            proto_version: None,
            config,
            stop: None,
        };

        session.handshake()?;

        Ok(session)
    }

    /// Wrap a /dev/fuse file descriptor whose connection is initialized already: an
    /// earlier process answered INIT and handed the descriptor over (`SCM_RIGHTS`). No
    /// INIT is awaited and [`Filesystem::init`] is not called: the kernel sends INIT
    /// once per connection, so the filesystem must be given what was negotiated by
    /// whoever answered it. Like [`Session::from_fd`], this mounts nothing.
    pub fn from_fd_initialized(
        filesystem: FS,
        fd: OwnedFd,
        acl: SessionACL,
        config: Config,
    ) -> Self {
        Session {
            filesystem: FilesystemHolder {
                fs: Some(filesystem),
            },
            ch: Channel::new(Arc::new(DevFuse(File::from(fd)))),
            mount: UmountOnDrop {
                mount: Arc::new(Mutex::new(None)),
            },
            allowed: acl,
            session_owner: geteuid(),
            proto_version: None,
            config,
            stop: None,
        }
    }

    /// Returns a handle that ends the session's workers between requests (see
    /// [`SessionStopper`]). Call it before [`Session::run`]: the workers of a stoppable
    /// session read the device in non-blocking mode and wait in `poll`.
    /// # Errors
    /// Returns an error if the wake-up pipe cannot be made.
    pub fn stopper(&mut self) -> io::Result<SessionStopper> {
        if self.stop.is_none() {
            let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
            self.stop = Some(StopState {
                stopped: Arc::new(AtomicBool::new(false)),
                wake_read: Arc::new(read),
                wake_write: Arc::new(write),
            });
        }
        Ok(SessionStopper(self.stop.clone().expect("set above")))
    }

    /// Run the session loop in a background thread. If the returned handle is dropped,
    /// the filesystem is unmounted and the given session ends.
    pub fn spawn(self) -> io::Result<BackgroundSession> {
        let sender = self.ch.sender();
        // Take the fuse_session, so that we can unmount it
        let mount = std::mem::take(&mut *self.mount.mount.lock());
        let guard = thread::Builder::new()
            .name("fuser-bg".to_string())
            .spawn(move || self.run())?;
        Ok(BackgroundSession {
            guard,
            sender,
            mount,
        })
    }

    /// Run the session loop that receives kernel requests and dispatches them to method
    /// calls into the filesystem. This read-dispatch-loop is non-concurrent to prevent
    /// having multiple buffers (which take up much memory), but the filesystem methods
    /// may run concurrent by spawning threads.
    /// # Errors
    /// Returns any final error when the session comes to an end.
    pub fn run(self) -> io::Result<()> {
        self.run_with_sources(Vec::new())
    }

    /// Runs the session as [`Session::run`] does, and besides its workers on the
    /// channel, one worker for each of `sources` that serves the requests the source
    /// yields (FUSE over io_uring: the kernel hands requests in ring entries once the
    /// ring is ready, and still sends FORGET and INTERRUPT through `/dev/fuse`). A
    /// source's worker ends when its source does; the session ends when every worker
    /// has. A stopper stops the channel's workers only.
    /// # Errors
    /// Returns any final error when the session comes to an end.
    pub fn run_with_sources(self, sources: Vec<Box<dyn RequestSource>>) -> io::Result<()> {
        let Session {
            filesystem,
            ch,
            mount: _do_not_umount_yet,
            allowed,
            session_owner,
            proto_version: _,
            config,
            stop,
        } = self;
        let read_buf_size = crate::read_buf::size(&config);

        let n_threads = config.n_threads.unwrap_or(1);

        if !cfg!(target_os = "linux") && n_threads != 1 {
            // TODO: check whether it works on macOS/FreeBSD and enable if it works.
            return Err(io::Error::other(
                "n_threads != 1 is only supported on Linux",
            ));
        }

        let Some(n_threads_minus_one) = n_threads.checked_sub(1) else {
            return Err(io::Error::other("n_threads"));
        };

        let mut filesystem = Arc::new(filesystem);

        let mut channels = Vec::with_capacity(n_threads);

        for _ in 0..n_threads_minus_one {
            if config.clone_fd {
                #[cfg(target_os = "linux")]
                {
                    channels.push(ch.clone_fd()?);
                    continue;
                }
                #[cfg(not(target_os = "linux"))]
                {
                    return Err(io::Error::other("clone_fd is only supported on Linux"));
                }
            } else {
                channels.push(ch.clone());
            }
        }
        let source_ch = ch.clone();
        channels.push(ch);
        if stop.is_some() {
            for ch in &channels {
                ch.set_nonblocking()?;
            }
        }

        let mut threads = Vec::with_capacity(n_threads);

        // An extra worker must be able to tell it waited for a request, so that it can
        // end: on a descriptor of its own, made non-blocking, or on the session's, which
        // a session that can be stopped reads non-blocking already.
        let pool = config
            .max_threads
            .filter(|max| *max > n_threads && cfg!(target_os = "linux"))
            .filter(|_| config.clone_fd || stop.is_some())
            .map(|max| {
                Arc::new(Pool {
                    idle: AtomicUsize::new(n_threads),
                    extras: AtomicUsize::new(0),
                    max_extras: max - n_threads,
                    started: AtomicUsize::new(0),
                    idle_timeout: config
                        .idle_thread_timeout
                        .unwrap_or(std::time::Duration::from_secs(10)),
                    ch: source_ch.clone(),
                    clone_fd: config.clone_fd,
                    filesystem: filesystem.clone(),
                    allowed,
                    session_owner,
                    stop: stop.clone(),
                    read_buf_size,
                    handles: Mutex::new(Vec::new()),
                })
            });

        for (i, ch) in channels.into_iter().enumerate() {
            let thread_name = format!("fuser-{i}");
            let event_loop = SessionEventLoop {
                thread_name: thread_name.clone(),
                filesystem: filesystem.clone(),
                ch,
                allowed,
                session_owner,
                stop: stop.clone(),
                read_buf_size,
                pool: pool.clone(),
                retire_after: None,
            };
            threads.push(
                thread::Builder::new()
                    .name(thread_name)
                    .spawn(move || event_loop.event_loop())?,
            );
        }

        for (i, source) in sources.into_iter().enumerate() {
            let thread_name = format!("fuser-src-{i}");
            let event_loop = SessionEventLoop {
                thread_name: thread_name.clone(),
                filesystem: filesystem.clone(),
                ch: source_ch.clone(),
                allowed,
                session_owner,
                stop: None,
                read_buf_size,
                pool: None,
                retire_after: None,
            };
            threads.push(
                thread::Builder::new()
                    .name(thread_name)
                    .spawn(move || event_loop.source_loop(source))?,
            );
        }

        let mut reply: io::Result<()> = Ok(());
        for thread in threads {
            let res = match thread.join() {
                Ok(res) => res,
                Err(_) => {
                    return Err(io::Error::other("event loop thread panicked"));
                }
            };
            if let Err(e) = res {
                if reply.is_ok() {
                    reply = Err(e);
                }
            }
        }

        // The extra workers: each one's handle is kept before the worker that started
        // it can end, so once none is left to take, every one has ended.
        if let Some(pool) = pool {
            loop {
                let Some(extra) = pool.handles.lock().pop() else {
                    break;
                };
                match extra.join() {
                    Ok(Err(e)) if reply.is_ok() => reply = Err(e),
                    Ok(_) => {}
                    Err(_) => return Err(io::Error::other("event loop thread panicked")),
                }
            }
        }

        let Some(filesystem) = Arc::get_mut(&mut filesystem) else {
            return Err(io::Error::other(
                "BUG: must have one refcount for filesystem",
            ));
        };

        filesystem.destroy();

        reply
    }

    fn handshake(&mut self) -> io::Result<()> {
        let mut buf = FuseReadBuf::new(crate::read_buf::size(&self.config));
        let buf = buf.as_mut();

        loop {
            // Read the init request from the kernel
            let size = match self.ch.receive_retrying(buf) {
                Ok(size) => size,
                Err(nix::errno::Errno::ENODEV) => {
                    return Err(io::Error::new(
                        io::ErrorKind::NotConnected,
                        "FUSE device disconnected during handshake",
                    ));
                }
                Err(err) => return Err(err.into()),
            };

            // Parse the request
            let request = match ll::AnyRequest::try_from(&buf[..size]) {
                Ok(request) => request,
                Err(err) => {
                    error!("{err}");
                    return Err(io::Error::new(io::ErrorKind::InvalidData, err.to_string()));
                }
            };

            // Extract the init operation
            let op = match request.operation() {
                Ok(op) => op,
                Err(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "Failed to parse FUSE operation",
                    ));
                }
            };

            let init = match op {
                ll::Operation::Init(init) => init,
                _ => {
                    error!("Received non-init FUSE operation before init: {}", request);
                    // Send error response and return error - non-init during handshake is invalid
                    <ReplyRaw as Reply>::new(
                        request.unique(),
                        ReplySender::Channel(self.ch.sender()),
                    )
                    .send_ll(&ResponseErrno(ll::Errno::EIO));
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "Received non-init FUSE operation during handshake",
                    ));
                }
            };

            let v = init.version();
            if v.0 > abi::FUSE_KERNEL_VERSION {
                // Kernel has a newer major version than we support.
                // Send our version and wait for a second INIT request with a compatible version.
                debug!(
                    "INIT: Kernel version {} > our version {}, sending our version and waiting for next init",
                    v.0,
                    abi::FUSE_KERNEL_VERSION
                );
                let response = init.reply_version_only();
                <ReplyRaw as Reply>::new(request.unique(), ReplySender::Channel(self.ch.sender()))
                    .send_ll(&response);
                continue;
            }

            // We don't support ABI versions before 7.6
            if v < Version(7, 6) {
                error!("Unsupported FUSE ABI version {v}");
                <ReplyRaw as Reply>::new(request.unique(), ReplySender::Channel(self.ch.sender()))
                    .send_ll(&ResponseErrno(ll::Errno::EPROTO));
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("Unsupported FUSE ABI version {v}"),
                ));
            }

            let mut config = KernelConfig::new(init.capabilities(), init.max_readahead(), v);

            // Call filesystem init method and give it a chance to return an error
            let Some(filesystem) = &mut self.filesystem.fs else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "Bug: filesystem must be initialized during handshake",
                ));
            };
            let res = filesystem.init(Request::ref_cast(request.header()), &mut config);
            if let Err(error) = res {
                let errno = Errno::from_i32(error.raw_os_error().unwrap_or(0));
                <ReplyRaw as Reply>::new(request.unique(), ReplySender::Channel(self.ch.sender()))
                    .send_ll(&ResponseErrno(errno));
                return Err(error);
            }

            // Remember the ABI version supported by kernel and mark the session initialized.
            self.proto_version = Some(v);

            // Log capability status for debugging
            for bit in 0..64 {
                let bitflags = InitFlags::from_bits_retain(1 << bit);
                if bitflags == InitFlags::FUSE_INIT_EXT {
                    continue;
                }
                let bitflag_is_known = InitFlags::all().contains(bitflags);
                let kernel_supports = init.capabilities().contains(bitflags);
                let we_requested = config.requested.contains(bitflags);
                // On macOS, there's a clash between linux and macOS constants,
                // so we pick macOS ones (last).
                let name = if let Some((name, _)) = bitflags.iter_names().last() {
                    Cow::Borrowed(name)
                } else {
                    Cow::Owned(format!("(1 << {bit})"))
                };
                if we_requested && kernel_supports {
                    debug!("capability {name} enabled")
                } else if we_requested {
                    debug!("capability {name} not supported by kernel")
                } else if kernel_supports {
                    debug!("capability {name} not requested by client")
                } else if bitflag_is_known {
                    debug!("capability {name} not supported nor requested")
                }
            }

            // Reply with our desired version and settings.
            debug!(
                "INIT response: ABI {}.{}, flags {:#x}, max readahead {}, max write {}",
                abi::FUSE_KERNEL_VERSION,
                abi::FUSE_KERNEL_MINOR_VERSION,
                init.capabilities() & config.requested,
                config.max_readahead,
                config.max_write
            );

            let response = init.reply(&config);
            <ReplyRaw as Reply>::new(request.unique(), ReplySender::Channel(self.ch.sender()))
                .send_ll(&response);

            return Ok(());
        }
    }

    /// Unmount the filesystem
    pub fn unmount(&mut self) -> io::Result<()> {
        self.mount.umount()
    }

    /// Returns a thread-safe object that can be used to unmount the Filesystem
    pub fn unmount_callable(&mut self) -> SessionUnmounter {
        SessionUnmounter {
            mount: self.mount.mount.clone(),
        }
    }

    /// Returns an object that can be used to send notifications to the kernel
    pub fn notifier(&self) -> Notifier {
        Notifier::new(self.ch.sender())
    }
}

#[derive(Debug)]
/// A thread-safe object that can be used to unmount a Filesystem
pub struct SessionUnmounter {
    mount: Arc<Mutex<Option<Mount>>>,
}

impl SessionUnmounter {
    /// Unmount the filesystem
    pub fn unmount(&mut self) -> io::Result<()> {
        if let Some(mount) = std::mem::take(&mut *self.mount.lock()) {
            mount.umount()?;
        }
        Ok(())
    }
}

pub(crate) struct SessionEventLoop<FS: Filesystem> {
    /// Cache thread name for faster `debug!`.
    pub(crate) thread_name: String,
    pub(crate) ch: Channel,
    pub(crate) filesystem: Arc<FilesystemHolder<FS>>,
    pub(crate) allowed: SessionACL,
    pub(crate) session_owner: Uid,
    stop: Option<StopState>,
    read_buf_size: usize,
    /// The session's workers beyond `n_threads` ([`Config::max_threads`]).
    pool: Option<Arc<Pool<FS>>>,
    /// For an extra worker that can tell it waited: how long it waits for a request
    /// before it ends.
    retire_after: Option<std::time::Duration>,
}

/// The workers a session starts beyond `n_threads` while every worker is busy
/// ([`Config::max_threads`]), and what each needs.
struct Pool<FS: Filesystem> {
    /// Workers waiting for a request, of all.
    idle: AtomicUsize,
    /// Extra workers running, and the most.
    extras: AtomicUsize,
    max_extras: usize,
    /// Extra workers ever started, which names them.
    started: AtomicUsize,
    idle_timeout: std::time::Duration,
    ch: Channel,
    clone_fd: bool,
    filesystem: Arc<FilesystemHolder<FS>>,
    allowed: SessionACL,
    session_owner: Uid,
    stop: Option<StopState>,
    read_buf_size: usize,
    handles: Mutex<Vec<JoinHandle<io::Result<()>>>>,
}

impl<FS: Filesystem> Pool<FS> {
    /// A worker took a request: if it was the last one waiting, another is started.
    fn taken(self: &Arc<Self>) {
        if self.idle.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.grow();
        }
    }

    /// A worker answered its request and waits again.
    fn answered(&self) {
        self.idle.fetch_add(1, Ordering::AcqRel);
    }

    fn grow(self: &Arc<Self>) {
        let mut extras = self.extras.load(Ordering::Acquire);
        loop {
            if extras >= self.max_extras {
                return;
            }
            match self.extras.compare_exchange(
                extras,
                extras + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(now) => extras = now,
            }
        }
        // Waiting from now, so that no other worker starts one more for the same lack;
        // counted out by `Leaving` when it ends.
        self.idle.fetch_add(1, Ordering::AcqRel);
        let n = self.started.fetch_add(1, Ordering::Relaxed);
        let thread_name = format!("fuser-x{n}");
        let pool = Arc::clone(self);
        let name = thread_name.clone();
        let mut handles = self.handles.lock();
        // Those that ended are joined now: a session that lives long keeps the
        // handles of running workers only.
        let (ended, running): (Vec<_>, Vec<_>) =
            handles.drain(..).partition(|h| h.is_finished());
        *handles = running;
        for h in ended {
            if let Ok(Err(e)) = h.join() {
                warn!("a worker ended with an error: {e}");
            }
        }
        match thread::Builder::new()
            .name(thread_name)
            .spawn(move || pool.serve_extra(name))
        {
            Ok(handle) => handles.push(handle),
            Err(e) => {
                warn!("cannot start another worker: {e}");
                drop(Leaving(self));
            }
        }
    }

    /// An extra worker's life. Its channel is made here, not by the worker that
    /// started it, whose request would wait meanwhile.
    fn serve_extra(self: Arc<Self>, thread_name: String) -> io::Result<()> {
        let ch = if self.clone_fd {
            match self
                .ch
                .clone_fd()
                .and_then(|ch| ch.set_nonblocking().map(|()| ch))
            {
                Ok(ch) => ch,
                Err(e) => {
                    warn!("cannot start another worker: {e}");
                    drop(Leaving(&self));
                    return Ok(());
                }
            }
        } else {
            self.ch.clone()
        };
        SessionEventLoop {
            thread_name,
            ch,
            filesystem: self.filesystem.clone(),
            allowed: self.allowed,
            session_owner: self.session_owner,
            stop: self.stop.clone(),
            read_buf_size: self.read_buf_size,
            pool: Some(Arc::clone(&self)),
            retire_after: Some(self.idle_timeout),
        }
        .event_loop()
    }
}

/// Counts an extra worker out of its pool when it ends, however it ends.
struct Leaving<'a, FS: Filesystem>(&'a Pool<FS>);

impl<FS: Filesystem> Drop for Leaving<'_, FS> {
    fn drop(&mut self) {
        self.0.idle.fetch_sub(1, Ordering::AcqRel);
        self.0.extras.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Requests that come other than by reading the session's channel (FUSE over
/// io_uring), for [`Session::run_with_sources`].
pub trait RequestSource: Send {
    /// Waits for the next request: its bytes as `/dev/fuse` would give them
    /// (`fuse_in_header`, the operation's arguments, its payload) and where its reply
    /// goes. `None` when the source has ended.
    /// # Errors
    /// When the source failed; the worker ends with the error.
    fn next(&mut self) -> io::Result<Option<(&[u8], Arc<dyn ReplyTarget>)>>;
}

impl<FS: Filesystem> SessionEventLoop<FS> {
    fn source_loop(&self, mut source: Box<dyn RequestSource>) -> io::Result<()> {
        while let Some((data, target)) = source.next()? {
            let Some(req) = RequestWithSender::with_target(self.ch.sender(), target, data) else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "Invalid request",
                ));
            };
            if let Ok(Operation::Destroy(_)) = req.request.operation() {
                req.reply::<ReplyEmpty>().ok();
                return Ok(());
            }
            req.dispatch(self);
        }
        Ok(())
    }

    fn event_loop(&self) -> io::Result<()> {
        // Buffer for receiving requests from the kernel. Only one is allocated and
        // it is reused immediately after dispatching to conserve memory and allocations.
        let mut buf = FuseReadBuf::new(self.read_buf_size);
        let buf = buf.as_mut();
        let _leaving = self
            .retire_after
            .and(self.pool.as_deref())
            .map(|pool| Leaving(pool));
        loop {
            // Read the next request from the given channel to kernel driver
            // The kernel driver makes sure that we get exactly one request per read
            let received = match (&self.stop, self.retire_after) {
                (stop, Some(idle)) => {
                    use crate::channel::Received;
                    let stop = stop.as_ref().map(|s| s.wake_read.as_fd());
                    match self.ch.receive_waiting(buf, stop, idle) {
                        Ok(Received::Request(size)) => Ok(size),
                        Ok(Received::Stopped | Received::Idle) => return Ok(()),
                        Err(err) => Err(err),
                    }
                }
                (Some(stop), None) => match self.ch.receive_or_stop(buf, stop.wake_read.as_fd()) {
                    Ok(Some(size)) => Ok(size),
                    Ok(None) => return Ok(()),
                    Err(err) => Err(err),
                },
                (None, None) => self.ch.receive_retrying(buf),
            };
            match received {
                Ok(size) => match RequestWithSender::new(self.ch.sender(), &buf[..size]) {
                    // Dispatch request
                    Some(req) => {
                        if let Ok(Operation::Destroy(_)) = req.request.operation() {
                            req.reply::<ReplyEmpty>().ok();
                            return Ok(());
                        } else {
                            if let Some(pool) = &self.pool {
                                pool.taken();
                            }
                            req.dispatch(self);
                            if let Some(pool) = &self.pool {
                                pool.answered();
                            }
                            if let Some(stop) = &self.stop {
                                if stop.stopped.load(Ordering::Acquire) {
                                    return Ok(());
                                }
                            }
                        }
                    }
                    // Quit loop on illegal request
                    None => {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "Invalid request",
                        ));
                    }
                },
                Err(nix::errno::Errno::ENODEV) => return Ok(()),
                Err(err) => return Err(err.into()),
            }
        }
    }
}

/// The background session data structure
#[derive(Debug)]
pub struct BackgroundSession {
    /// Thread guard of the background session
    pub guard: JoinHandle<io::Result<()>>,
    /// Object for creating Notifiers for client use
    sender: ChannelSender,
    /// Ensures the filesystem is unmounted when the session ends
    mount: Option<Mount>,
}

impl BackgroundSession {
    /// Unmount the filesystem and join the background thread.
    pub fn umount_and_join(mut self) -> io::Result<()> {
        if let Some(mount) = self.mount.take() {
            mount.umount()?;
        }
        self.join()
    }

    /// Returns an object that can be used to send notifications to the kernel
    pub fn notifier(&self) -> Notifier {
        Notifier::new(self.sender.clone())
    }

    /// Join the filesystem thread.
    pub fn join(self) -> io::Result<()> {
        self.guard
            .join()
            .map_err(|_panic: Box<dyn std::any::Any + Send>| {
                io::Error::new(
                    io::ErrorKind::Other,
                    "filesystem background thread panicked",
                )
            })?
    }
}

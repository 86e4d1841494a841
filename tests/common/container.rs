//! A "container" as a runtime makes one, for tests of what a container's life and death
//! do to views and registrations: a PID namespace made with `unshare --pid --fork`,
//! where the death of the namespace's first process makes the kernel kill everything
//! else in it.
#![allow(dead_code)]

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

/// A container: a PID namespace whose first process is the command after this.
pub const CONTAINER: &[&str] = &["unshare", "--pid", "--fork", "--kill-child", "--"];

/// A container running one command.
pub struct Container {
    wrapper: Option<Child>,
}

impl Container {
    /// Runs `bin args` in a new container, its stderr appended to `log`.
    pub fn start(bin: &Path, args: &[&str], log: &Path) -> Container {
        Container::start_with_env(bin, args, &[("RUST_LOG", "mountgroup=debug,info")], log)
    }

    /// [`Container::start`] with these environment variables.
    pub fn start_with_env(
        bin: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        log: &Path,
    ) -> Container {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let child = Command::new(CONTAINER[0])
            .args(&CONTAINER[1..])
            .arg(bin)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Container {
            wrapper: Some(child),
        }
    }

    /// The namespace's first process (the wrapper's child).
    pub fn init_pid(&self) -> u32 {
        let w = self.wrapper.as_ref().unwrap().id();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let children =
                fs::read_to_string(format!("/proc/{w}/task/{w}/children")).unwrap_or_default();
            if let Some(pid) = children.split_whitespace().next() {
                return pid.parse().unwrap();
            }
            assert!(Instant::now() < deadline, "the container has no process");
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// As a runtime kills a container: its first process is SIGKILLed, the kernel
    /// kills the rest.
    pub fn kill(&mut self) {
        if self.wrapper.is_none() {
            return;
        }
        let init = self.init_pid();
        let _ = kill_process(Pid::from_raw(init as i32).unwrap(), Signal::KILL);
        if let Some(mut w) = self.wrapper.take() {
            let _ = w.wait();
        }
    }

    /// As a runtime stops a container: SIGTERM to its first process, SIGKILL after
    /// the grace period.
    pub fn stop(&mut self, grace: Duration) {
        if self.wrapper.is_none() {
            return;
        }
        let init = self.init_pid();
        let _ = kill_process(Pid::from_raw(init as i32).unwrap(), Signal::TERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Some(Some(_)) = self.wrapper.as_mut().map(|w| w.try_wait().unwrap()) {
                self.wrapper = None;
                return;
            }
            thread::sleep(Duration::from_millis(10));
        }
        self.kill();
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        self.kill();
    }
}

//! Concurrency and restarts: one operation at a time per volume (ABORTED for the
//! others), many volumes in parallel, and views that outlive a SIGKILLed driver.

mod common;
#[path = "common/driver.rs"]
mod driver;

use std::fs;
use std::time::{Duration, Instant};

use common::*;
use driver::*;
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_calls_on_one_volume_are_aborted_and_other_volumes_run() {
    let f = Fixture::new();
    let d = Driver::start(f.dir.path());
    let c = d.clients().await;
    let staging = f.subdir("staging");
    let mut setup = d.clients().await;
    setup
        .controller
        .create_volume(create_req("busy", 1 << 20))
        .await
        .unwrap();
    setup
        .node
        .node_stage_volume(stage_req("busy", &staging))
        .await
        .unwrap();

    // Eight publishes of one volume at once: a view takes milliseconds to mount, so
    // they overlap; the ones that find the volume busy are told ABORTED.
    let mut calls = Vec::new();
    for i in 0..8 {
        let mut node = c.node.clone();
        let req = publish_req("busy", &staging, &f.dir.path().join(format!("t{i}")), "100");
        calls.push(tokio::spawn(
            async move { node.node_publish_volume(req).await },
        ));
    }
    let mut ok = 0;
    let mut aborted = Vec::new();
    for (i, call) in calls.into_iter().enumerate() {
        match call.await.unwrap() {
            Ok(_) => ok += 1,
            Err(e) if e.code() == Code::Aborted => {
                assert!(e.message().contains("busy"), "{}", e.message());
                aborted.push(i);
            }
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    assert!(
        ok >= 1 && !aborted.is_empty(),
        "{ok} ok, {} aborted",
        aborted.len()
    );
    // Retried one at a time, as kubelet does, they all succeed.
    for i in aborted {
        let mut node = c.node.clone();
        node.node_publish_volume(publish_req(
            "busy",
            &staging,
            &f.dir.path().join(format!("t{i}")),
            "100",
        ))
        .await
        .unwrap();
    }
    for i in 0..8 {
        assert_eq!(owner(&f.dir.path().join(format!("t{i}"))).1, 100);
    }

    // Six volumes created, staged and published in parallel: all succeed.
    let mut calls = Vec::new();
    for i in 0..6 {
        let (mut ctl, mut node) = (c.controller.clone(), c.node.clone());
        let root = f.dir.path().to_path_buf();
        calls.push(tokio::spawn(async move {
            let name = format!("par-{i}");
            let staging = root.join(format!("s-{i}"));
            fs::create_dir_all(&staging).unwrap();
            ctl.create_volume(create_req(&name, 1 << 20)).await?;
            node.node_stage_volume(stage_req(&name, &staging)).await?;
            node.node_publish_volume(publish_req(
                &name,
                &staging,
                &root.join(format!("p-{i}")),
                &format!("{}", 200 + i),
            ))
            .await?;
            Ok::<_, tonic::Status>(())
        }));
    }
    for call in calls {
        call.await.unwrap().unwrap();
    }
    for i in 0..6 {
        assert_eq!(
            owner(&f.dir.path().join(format!("p-{i}"))).1,
            200 + i as u32
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn views_survive_a_killed_driver_and_dead_views_come_back() {
    let f = Fixture::new();
    let mut d = Driver::start(f.dir.path());
    let mut c = d.clients().await;
    let staging = f.subdir("staging");
    let (alive, doomed) = (f.dir.path().join("alive"), f.dir.path().join("doomed"));
    c.controller
        .create_volume(create_req("restart", 1 << 20))
        .await
        .unwrap();
    c.node
        .node_stage_volume(stage_req("restart", &staging))
        .await
        .unwrap();
    c.node
        .node_publish_volume(publish_req("restart", &staging, &alive, "501"))
        .await
        .unwrap();
    c.node
        .node_publish_volume(publish_req("restart", &staging, &doomed, "502"))
        .await
        .unwrap();
    fs::write(alive.join("before"), "x").unwrap();
    let alive_pid = view_pid(&d, &alive);
    // The keeper tells each view the FUSE protocol its probe of this kernel's INIT
    // found, which decides whether a dead view's requests can be resent (7.40); the
    // view finds the same in its own INIT.
    let environ = fs::read(format!("/proc/{alive_pid}/environ")).unwrap();
    let minor = kernel_fuse().minor;
    assert!(
        environ
            .split(|b| *b == 0)
            .any(|v| v == format!("MOUNTGROUP_FUSE_MINOR={minor}").as_bytes()),
        "{}",
        String::from_utf8_lossy(&environ)
    );
    let log = fs::read_to_string(d.state.join("views").join(format!(
        "{}.log",
        mountgroup::volume::names::target_key(&alive)
    )))
    .unwrap();
    assert!(log.contains(&format!("fuse_minor={minor}")), "{log}");

    // SIGKILL the driver: the views are processes of their own and keep serving.
    d.kill9();
    assert_eq!(fs::read_to_string(alive.join("before")).unwrap(), "x");
    assert_eq!(owner(&doomed.join("before")).1, 502);
    // While the driver is down one view dies too (its mount goes dead).
    let pid = view_pid(&d, &doomed);
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    wait_until(|| {
        fs::metadata(&doomed).err().and_then(|e| e.raw_os_error()) == Some(libc::ENOTCONN)
    });

    // Start again: without any call from kubelet, the dead target serves again
    // within seconds, and the living view is the same process as before.
    let started = Instant::now();
    d.restart();
    wait_until(|| fs::metadata(doomed.join("before")).is_ok());
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(owner(&doomed.join("before")).1, 502);
    assert_eq!(
        view_pid(&d, &alive),
        alive_pid,
        "a serving view is adopted, not restarted"
    );
    assert!(d.log_text().contains("view restored"), "{}", d.log_text());

    // And kubelet can tear everything down through the new driver.
    let mut c = d.clients().await;
    c.node
        .node_unpublish_volume(unpublish_req("restart", &alive))
        .await
        .unwrap();
    c.unpublish_unstage("restart", &doomed, &staging).await;
    c.controller
        .delete_volume(mountgroup::csi::pb::DeleteVolumeRequest {
            volume_id: "restart".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(d.mounts_below().is_empty(), "{:?}", d.mounts_below());
    assert_eq!(d.terminate(), Some(0), "SIGTERM drains and exits 0");
    assert!(!d.socket.exists(), "the socket is removed on shutdown");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stopping_driver_removes_only_its_own_socket() {
    // Rounds, each a driver started and its socket replaced at once: the old driver
    // (identity read after binding) lost its successor's socket within two rounds on
    // the host.
    for _ in 0..20 {
        let f = Fixture::new();
        let mut d = Driver::launch(f.dir.path());
        // Another driver (a surge pod's, on the same hostPath) binds the path the moment
        // this one's socket appears: the driver must know its own socket from then on (it
        // once read the path's identity only after binding, and CI's VM saw it take the
        // successor's socket for its own).
        let started = Instant::now();
        while fs::symlink_metadata(&d.socket).is_err() {
            assert!(started.elapsed() < Duration::from_secs(60), "no socket");
            std::hint::spin_loop();
        }
        fs::remove_file(&d.socket).unwrap();
        let successor = std::os::unix::net::UnixListener::bind(&d.socket).unwrap();
        assert_eq!(d.terminate(), Some(0), "{}", d.log_text());
        assert!(
            d.socket.exists(),
            "the stopping driver deleted its successor's socket"
        );
        let left: Vec<_> = fs::read_dir(d.socket.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            left,
            ["csi.sock"],
            "nothing but the socket is left beside it"
        );
        drop(successor);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stale_socket_is_replaced_and_a_foreign_file_is_not() {
    let f = Fixture::new();
    let sock_dir = f.subdir("csi");
    // A socket file left by a previous run: made with mknod, so no listener ever
    // existed. A listener bound and closed here could live on for a moment in a child
    // that another test forks meanwhile (until its exec closes it), and a connection
    // made then is reset when it goes.
    rustix::fs::mknodat(
        rustix::fs::CWD,
        sock_dir.join("csi.sock"),
        rustix::fs::FileType::Socket,
        rustix::fs::Mode::from_raw_mode(0o755),
        0,
    )
    .unwrap();
    assert!(std::os::unix::net::UnixStream::connect(sock_dir.join("csi.sock")).is_err());
    let d = Driver::start(f.dir.path());
    let mut c = d.clients().await;
    c.identity
        .probe(mountgroup::csi::pb::ProbeRequest {})
        .await
        .unwrap();
    drop(c);
    drop(d);
    // A regular file where the socket should be is never deleted, and a driver that
    // cannot serve its endpoint (or its metrics) refuses before it starts anything: no
    // keeper that would take the node's views over and leave them with a process
    // about to exit, no keeper socket left behind.
    fs::write(sock_dir.join("csi.sock"), "precious").unwrap();
    let runtime = f.dir.path().join("run-refused");
    let refused = |extra: &[&str]| {
        std::process::Command::new(BIN)
            .args(["serve", "--endpoint"])
            .arg(format!("unix://{}", sock_dir.join("csi.sock").display()))
            .arg("--state-dir")
            .arg(f.dir.path().join("state"))
            .arg("--share-root")
            .arg(f.dir.path().join("share"))
            .arg("--runtime-dir")
            .arg(&runtime)
            .args(extra)
            .output()
            .unwrap()
    };
    let out = refused(&[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a socket"));
    assert_eq!(
        fs::read_to_string(sock_dir.join("csi.sock")).unwrap(),
        "precious"
    );
    assert!(
        !runtime.join("keeper.sock").exists(),
        "a keeper was started"
    );
    fs::remove_file(sock_dir.join("csi.sock")).unwrap();
    // 192.0.2.0/24 is TEST-NET-1 (RFC 5737): never this machine's address.
    let out = refused(&["--metrics-addr", "192.0.2.1:9809"]);
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("--metrics-addr"), "{said}");
    assert!(
        !runtime.join("keeper.sock").exists(),
        "a keeper was started"
    );
    assert!(
        !sock_dir.join("csi.sock").exists(),
        "the endpoint was bound"
    );
    let out = std::process::Command::new(BIN)
        .args(["serve", "--driver-name", "bad_name!"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--driver-name"),
        "{out:?}"
    );
}

fn view_pid(d: &Driver, target: &std::path::Path) -> u32 {
    let state: serde_json::Value =
        serde_json::from_slice(&fs::read(d.state.join("node-state.json")).unwrap()).unwrap();
    state["published"][target.to_str().unwrap()]["pid"]
        .as_u64()
        .expect("a pid") as u32
}

fn wait_until(cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !cond() {
        assert!(Instant::now() < deadline, "condition not reached in 15 s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_driver_on_one_state_directory_waits_for_the_first() {
    // What makes a DaemonSet surge pod safe: it serves only once the old one is gone.
    let f = Fixture::new();
    let mut first = Driver::start(f.dir.path());
    let socket = f.dir.path().join("csi2/csi.sock");
    let log = f.dir.path().join("second.log");
    let mut second = std::process::Command::new(BIN)
        .arg("serve")
        .arg("--endpoint")
        .arg(format!("unix://{}", socket.display()))
        .arg("--state-dir")
        .arg(&first.state)
        .arg("--share-root")
        .arg(&first.share)
        .arg("--runtime-dir")
        .arg(f.dir.path().join("run"))
        .args(["--share-key-file", "none"])
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    wait_until(|| {
        fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("another driver holds the state directory")
    });
    assert!(
        std::os::unix::net::UnixStream::connect(&socket).is_err(),
        "the second driver must not serve yet"
    );
    assert_eq!(first.terminate(), Some(0));
    wait_until(|| std::os::unix::net::UnixStream::connect(&socket).is_ok());
    let _ = second.kill();
    let _ = second.wait();
}

/// A SIGTERM that comes as soon as the socket exists (a pod deleted while it starts)
/// drains and exits 0, and removes the socket. The handlers were once set up only when
/// the server first polled its shutdown: a signal between the bind and that poll
/// killed the driver (about half of such signals, measured), leaving its socket.
#[test]
fn a_sigterm_right_after_the_socket_is_bound_drains() {
    for i in 0..10 {
        let f = Fixture::new();
        let mut d = Driver::launch(f.dir.path());
        // Without a pause: the window is between the bind and the server's start.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !d.socket.exists() {
            assert!(Instant::now() < deadline, "no socket");
        }
        assert_eq!(
            d.terminate(),
            Some(0),
            "start {i}: SIGTERM must drain, not kill"
        );
        assert!(!d.socket.exists(), "start {i}: the socket stays behind");
    }
}

//! The metrics endpoint and JSON logs: CSI calls by method and code (refused ones
//! too), the views and their operations, passthrough per view.

mod common;
#[path = "common/driver.rs"]
mod driver;

use std::time::{Duration, Instant};

use common::*;
use driver::*;

#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_calls_views_and_operations_and_logs_are_json() {
    let f = Fixture::new();
    let d = Driver::start_with_metrics(f.dir.path());
    let addr = d.metrics_addr();
    let mut c = d.clients().await;
    let staging = f.subdir("staging");
    let target = f.dir.path().join("target");
    c.controller
        .create_volume(create_req("m-vol", 1 << 20))
        .await
        .unwrap();
    c.controller
        .create_volume(create_req("", 1))
        .await
        .unwrap_err();
    c.node
        .node_stage_volume(stage_req("m-vol", &staging))
        .await
        .unwrap();
    c.node
        .node_publish_volume(publish_req("m-vol", &staging, &target, "42"))
        .await
        .unwrap();
    for i in 0..20 {
        std::fs::write(target.join(format!("f{i}")), "x").unwrap();
    }
    assert!(std::fs::metadata(target.join("missing")).is_err());

    // The view writes its counters every second; wait for them to show.
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = scrape(&addr);
        if sample(&text, "mountgroup_view_operations_total{op=\"create\"}").unwrap_or(0.0) >= 20.0 {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "view operations never showed:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        sample(
            &text,
            "mountgroup_csi_operation_duration_seconds_count{method=\"NodePublishVolume\",code=\"Ok\"}"
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "mountgroup_csi_operation_duration_seconds_count{method=\"CreateVolume\",code=\"InvalidArgument\"}"
        ),
        Some(1.0),
        "refused calls are counted: {text}"
    );
    assert_eq!(
        sample(&text, "mountgroup_views{state=\"serving\"}"),
        Some(1.0)
    );
    assert_eq!(sample(&text, "mountgroup_views{state=\"dead\"}"), Some(0.0));
    assert_eq!(
        sample(&text, "mountgroup_view_passthrough{"),
        Some(1.0),
        "{text}"
    );
    // Nothing waits on the view now: no request in progress.
    assert_eq!(
        sample(&text, "mountgroup_view_requests_in_progress{"),
        Some(0.0),
        "{text}"
    );
    // What the view costs, per volume: a process of at least a MiB that has run.
    let rss = sample(&text, "mountgroup_view_resident_memory_bytes{").unwrap_or(0.0);
    assert!(rss >= (1 << 20) as f64, "{text}");
    let cpu = sample(&text, "mountgroup_view_cpu_seconds_total{").unwrap_or(0.0);
    assert!(cpu > 0.0, "{text}");
    assert!(
        text.contains("mountgroup_view_resident_memory_bytes{volume_id=\"")
            && text.contains("target=\""),
        "per volume and target: {text}"
    );
    assert!(
        sample(
            &text,
            "mountgroup_view_operation_errors_total{op=\"lookup\"}"
        )
        .unwrap_or(0.0)
            >= 1.0,
        "the missing file"
    );
    assert!(
        text.contains(
            "mountgroup_view_operation_duration_seconds_bucket{le=\"+Inf\",op=\"create\"} 20"
        ) || text.contains(
            "mountgroup_view_operation_duration_seconds_bucket{op=\"create\",le=\"+Inf\"} 20"
        ),
        "{text}"
    );
    assert_eq!(
        sample(&text, "mountgroup_share_capacity_enforced"),
        Some(0.0)
    );

    c.node
        .node_unpublish_volume(unpublish_req("m-vol", &target))
        .await
        .unwrap();
    let text = scrape(&addr);
    assert_eq!(
        sample(&text, "mountgroup_views{state=\"serving\"}"),
        Some(0.0)
    );
    c.node
        .node_unstage_volume(unstage_req("m-vol", &staging))
        .await
        .unwrap();

    // Every log line is one JSON object, spans included.
    let log = d.log_text();
    let mut publish_seen = false;
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        publish_seen |= v["span"]["name"] == "NodePublishVolume";
    }
    assert!(publish_seen, "{log}");
}

/// A view whose share stops answering (a share that is itself a FUSE mount, stopped:
/// as an NFS `hard` mount whose server is away) holds up no scrape: the view is
/// counted `waiting`, its own numbers are there, and it counts as serving again once
/// the share answers.
#[tokio::test(flavor = "multi_thread")]
async fn a_scrape_answers_while_a_views_share_does_not() {
    use rustix::process::{Pid, Signal, kill_process};
    let f = Fixture::new();
    let root = f.dir.path();
    let share = f.subdir("share");
    let share_view = Mounted::start(&f.subdir("disk"), &share, &["-o", "gid=0"]).unwrap();
    let d = Driver::start_with_metrics(root);
    let addr = d.metrics_addr();
    let mut c = d.clients().await;
    let (staging, target) = (f.subdir("staging"), root.join("target"));
    let _unmount = [Unmount(target.clone()), Unmount(staging.clone())];
    c.create_stage_publish("w", &staging, &target, "42").await;
    let state =
        |text: &str, state: &str| sample(text, &format!("mountgroup_views{{state=\"{state}\"}}"));
    assert_eq!(state(&scrape(&addr), "serving"), Some(1.0));

    let share_pid = Pid::from_raw(share_view.pid() as i32).unwrap();
    kill_process(share_pid, Signal::STOP).unwrap();
    struct Thaw(Pid);
    impl Drop for Thaw {
        fn drop(&mut self) {
            let _ = kill_process(self.0, Signal::CONT);
        }
    }
    let thaw = Thaw(share_pid);
    // Past the attribute timeout of the view's root: a stat of it asks the view, which
    // asks the share.
    std::thread::sleep(Duration::from_secs(2));
    let (sent, answer) = std::sync::mpsc::channel();
    let scraper = addr.clone();
    std::thread::spawn(move || sent.send(scrape(&scraper)));
    let text = answer
        .recv_timeout(Duration::from_secs(60))
        .expect("the scrape answers while the share does not");
    assert_eq!(state(&text, "waiting"), Some(1.0), "{text}");
    assert_eq!(state(&text, "serving"), Some(0.0), "{text}");
    assert!(
        sample(&text, "mountgroup_view_requests_in_progress{").is_some(),
        "{text}"
    );

    drop(thaw);
    let deadline = Instant::now() + Duration::from_secs(30);
    while state(&scrape(&addr), "serving") != Some(1.0) {
        assert!(
            Instant::now() < deadline,
            "serving again once the share answers"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    c.node
        .node_unpublish_volume(unpublish_req("w", &target))
        .await
        .unwrap();
}

//! The CSI sanity checks for identity, controller and node, written as our own tests,
//! and every required field missing or invalid: InvalidArgument naming the field.

mod common;
#[path = "common/driver.rs"]
mod driver;
#[path = "common/keeper.rs"]
mod keeper;

use std::path::Path;

use common::*;
use driver::*;
use mountgroup::csi::pb;
use tonic::Code;

#[tokio::test(flavor = "multi_thread")]
async fn identity() {
    let f = Fixture::new();
    let d = Driver::start(f.dir.path());
    let mut c = d.clients().await;
    let info = c
        .identity
        .get_plugin_info(pb::GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "mountgroup.csi.io");
    assert!(!info.vendor_version.is_empty());
    let caps = c
        .identity
        .get_plugin_capabilities(pb::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let controller = pb::PluginCapability {
        r#type: Some(pb::plugin_capability::Type::Service(
            pb::plugin_capability::Service {
                r#type: pb::plugin_capability::service::Type::ControllerService as i32,
            },
        )),
    };
    assert!(caps.capabilities.contains(&controller));
    let probe = c
        .identity
        .probe(pb::ProbeRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(probe.ready, Some(true));
    // Unreachable share: not ready, with the reason.
    std::fs::rename(d.share.join("volumes"), d.share.join("volumes.away")).unwrap();
    expect(
        c.identity.probe(pb::ProbeRequest {}).await,
        Code::FailedPrecondition,
        "share",
    );
    std::fs::rename(d.share.join("volumes.away"), d.share.join("volumes")).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn capabilities_and_node_info() {
    let f = Fixture::new();
    let d = Driver::start(f.dir.path());
    let mut c = d.clients().await;
    use pb::node_service_capability::rpc::Type as N;
    let types = c.node_capabilities().await;
    for want in [
        N::StageUnstageVolume,
        N::VolumeMountGroup,
        N::GetVolumeStats,
        N::VolumeCondition,
        N::SingleNodeMultiWriter,
    ] {
        assert!(types.contains(&(want as i32)), "{want:?} in {types:?}");
    }
    use pb::controller_service_capability::rpc::Type as C;
    let types = c.controller_capabilities().await;
    for want in [C::CreateDeleteVolume, C::ListVolumes, C::GetCapacity] {
        assert!(types.contains(&(want as i32)), "{want:?}");
    }
    assert!(
        !types.contains(&(C::PublishUnpublishVolume as i32)),
        "no attach step"
    );
    let info = c
        .node
        .node_get_info(pb::NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.node_id, "test-node");
    assert_eq!(
        info.accessible_topology
            .unwrap()
            .segments
            .get("topology.mountgroup.csi.io/node")
            .map(String::as_str),
        Some("test-node")
    );
    // RPCs the driver does not offer answer UNIMPLEMENTED (never advertised).
    let cap = c
        .controller
        .get_capacity(pb::GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(cap.available_capacity > 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn controller_sanity() {
    let f = Fixture::new();
    let d = Driver::start(f.dir.path());
    let mut c = d.clients().await;
    // Unknown volumes.
    c.controller
        .delete_volume(pb::DeleteVolumeRequest {
            volume_id: "reallyfakevolumeid".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    expect(
        c.controller
            .validate_volume_capabilities(pb::ValidateVolumeCapabilitiesRequest {
                volume_id: "reallyfakevolumeid".into(),
                volume_capabilities: vec![rw_cap("")],
                ..Default::default()
            })
            .await,
        Code::NotFound,
        "reallyfakevolumeid",
    );
    // Validate: mount confirmed, block answered with a message.
    c.controller
        .create_volume(create_req("v-validate", 1 << 20))
        .await
        .unwrap();
    let ok = c
        .controller
        .validate_volume_capabilities(pb::ValidateVolumeCapabilitiesRequest {
            volume_id: "v-validate".into(),
            volume_capabilities: vec![rw_cap("")],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(ok.confirmed.is_some());
    let mut block = rw_cap("");
    block.access_type = Some(pb::volume_capability::AccessType::Block(Default::default()));
    let no = c
        .controller
        .validate_volume_capabilities(pb::ValidateVolumeCapabilitiesRequest {
            volume_id: "v-validate".into(),
            volume_capabilities: vec![block.clone()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        no.confirmed.is_none() && no.message.contains("block"),
        "{no:?}"
    );
    let mut req = create_req("v-block", 1);
    req.volume_capabilities = vec![block];
    expect(
        c.controller.create_volume(req).await,
        Code::InvalidArgument,
        "block",
    );

    // Pagination: 5 volumes, pages of 2, a volume deleted between pages.
    for i in 0..4 {
        c.controller
            .create_volume(create_req(&format!("v-page-{i}"), 1 << 20))
            .await
            .unwrap();
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let page = c
            .controller
            .list_volumes(pb::ListVolumesRequest {
                max_entries: 2,
                starting_token: token.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        pages += 1;
        assert!(page.entries.len() <= 2);
        for e in &page.entries {
            seen.push(e.volume.as_ref().unwrap().volume_id.clone());
        }
        if pages == 1 {
            // Delete the last volume of this page: the token must still work.
            let last = seen.last().unwrap().clone();
            c.controller
                .delete_volume(pb::DeleteVolumeRequest {
                    volume_id: last,
                    ..Default::default()
                })
                .await
                .unwrap();
        }
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    assert_eq!(
        seen,
        vec!["v-page-0", "v-page-1", "v-page-2", "v-page-3", "v-validate"]
    );
    assert_eq!(pages, 3);
    expect(
        c.controller
            .list_volumes(pb::ListVolumesRequest {
                max_entries: 0,
                starting_token: "invalid-token".into(),
            })
            .await,
        Code::Aborted,
        "starting_token",
    );
    expect(
        c.controller
            .list_volumes(pb::ListVolumesRequest {
                max_entries: -1,
                starting_token: String::new(),
            })
            .await,
        Code::InvalidArgument,
        "max_entries",
    );
    // Capacity ranges: honoured, returned, refused when impossible.
    let mut req = create_req("v-range", 0);
    req.capacity_range = Some(pb::CapacityRange {
        required_bytes: 0,
        limit_bytes: 5 << 20,
    });
    let v = c
        .controller
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(v.capacity_bytes, 5 << 20);
    let mut req = create_req("v-range2", 0);
    req.capacity_range = Some(pb::CapacityRange {
        required_bytes: 10,
        limit_bytes: 5,
    });
    expect(
        c.controller.create_volume(req).await,
        Code::InvalidArgument,
        "capacity_range",
    );
    let mut req = create_req("v-params", 1);
    req.parameters.insert("colour".into(), "red".into());
    expect(
        c.controller.create_volume(req).await,
        Code::InvalidArgument,
        "colour",
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn node_sanity() {
    let f = Fixture::new();
    let d = Driver::start(f.dir.path());
    let mut c = d.clients().await;
    let staging = f.subdir("staging");
    let target = f.dir.path().join("target");
    // Unknown volumes and unpublished targets.
    expect(
        c.node.node_stage_volume(stage_req("nope", &staging)).await,
        Code::NotFound,
        "nope",
    );
    expect(
        c.node
            .node_publish_volume(publish_req("nope", &staging, &target, ""))
            .await,
        Code::NotFound,
        "nope",
    );
    c.node
        .node_unpublish_volume(unpublish_req("nope", &target))
        .await
        .unwrap();
    c.node
        .node_unstage_volume(unstage_req("nope", &staging))
        .await
        .unwrap();
    // Publishing before staging.
    c.controller
        .create_volume(create_req("v-node", 1 << 20))
        .await
        .unwrap();
    expect(
        c.node
            .node_publish_volume(publish_req("v-node", &staging, &target, ""))
            .await,
        Code::FailedPrecondition,
        "not staged",
    );
    c.node
        .node_stage_volume(stage_req("v-node", &staging))
        .await
        .unwrap();
    // Another staging path for a staged volume.
    let other = f.subdir("staging2");
    expect(
        c.node.node_stage_volume(stage_req("v-node", &other)).await,
        Code::AlreadyExists,
        "already staged",
    );
    c.node
        .node_publish_volume(publish_req("v-node", &staging, &target, "77"))
        .await
        .unwrap();
    expect(
        c.node
            .node_get_volume_stats(pb::NodeGetVolumeStatsRequest {
                volume_id: "v-node".into(),
                volume_path: "/somewhere/else".into(),
                staging_target_path: String::new(),
            })
            .await,
        Code::NotFound,
        "/somewhere/else",
    );
    // A dead view is an abnormal condition, not an error; publishing again heals it.
    keeper::kill_view_for_good(&target);
    let stats = c
        .node
        .node_get_volume_stats(stats_req("v-node", &target))
        .await
        .unwrap()
        .into_inner();
    let cond = stats.volume_condition.unwrap();
    assert!(
        cond.abnormal && cond.message.contains("not connected"),
        "{cond:?}"
    );
    c.node
        .node_publish_volume(publish_req("v-node", &staging, &target, "77"))
        .await
        .unwrap();
    assert_eq!(owner(&target).1, 77, "serving again");
    c.node
        .node_unpublish_volume(unpublish_req("v-node", &target))
        .await
        .unwrap();
    c.node
        .node_unstage_volume(unstage_req("v-node", &staging))
        .await
        .unwrap();
    assert!(d.mounts_below().is_empty(), "{:?}", d.mounts_below());
}

#[tokio::test(flavor = "multi_thread")]
async fn every_required_field_is_named() {
    let f = Fixture::new();
    let d = Driver::start(f.dir.path());
    let mut c = d.clients().await;
    let s = Path::new("/tmp/staging");
    let t = Path::new("/tmp/target");

    // CreateVolume.
    expect(
        c.controller.create_volume(create_req("", 1)).await,
        Code::InvalidArgument,
        "name missing",
    );
    expect(
        c.controller.create_volume(create_req("../../etc", 1)).await,
        Code::InvalidArgument,
        "name \"../../etc\"",
    );
    expect(
        c.controller.create_volume(create_req("a/b", 1)).await,
        Code::InvalidArgument,
        "name \"a/b\"",
    );
    let mut r = create_req("ok-name", 1);
    r.volume_capabilities.clear();
    expect(
        c.controller.create_volume(r).await,
        Code::InvalidArgument,
        "volume_capabilities missing",
    );
    let mut r = create_req("ok-name", 1);
    r.volume_capabilities[0].access_mode = None;
    expect(
        c.controller.create_volume(r).await,
        Code::InvalidArgument,
        "volume_capabilities[0].access_mode missing",
    );
    // DeleteVolume, ValidateVolumeCapabilities.
    expect(
        c.controller
            .delete_volume(pb::DeleteVolumeRequest::default())
            .await,
        Code::InvalidArgument,
        "volume_id missing",
    );
    expect(
        c.controller
            .validate_volume_capabilities(pb::ValidateVolumeCapabilitiesRequest {
                volume_id: "x".into(),
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        "volume_capabilities missing",
    );
    // NodeStageVolume.
    expect(
        c.node.node_stage_volume(stage_req("", s)).await,
        Code::InvalidArgument,
        "volume_id missing",
    );
    expect(
        c.node
            .node_stage_volume(stage_req("v", Path::new("")))
            .await,
        Code::InvalidArgument,
        "staging_target_path missing",
    );
    expect(
        c.node
            .node_stage_volume(stage_req("v", Path::new("rel/path")))
            .await,
        Code::InvalidArgument,
        "staging_target_path \"rel/path\" is not an absolute path",
    );
    let mut r = stage_req("v", s);
    r.volume_capability = None;
    expect(
        c.node.node_stage_volume(r).await,
        Code::InvalidArgument,
        "volume_capability missing",
    );
    // NodePublishVolume.
    expect(
        c.node.node_publish_volume(publish_req("", s, t, "")).await,
        Code::InvalidArgument,
        "volume_id missing",
    );
    expect(
        c.node
            .node_publish_volume(publish_req("v", s, Path::new(""), ""))
            .await,
        Code::InvalidArgument,
        "target_path missing",
    );
    expect(
        c.node
            .node_publish_volume(publish_req("v", s, Path::new("/a/../../etc"), ""))
            .await,
        Code::InvalidArgument,
        "target_path",
    );
    expect(
        c.node
            .node_publish_volume(publish_req("v", Path::new(""), t, ""))
            .await,
        Code::InvalidArgument,
        "staging_target_path missing",
    );
    expect(
        c.node
            .node_publish_volume(publish_req("v", s, t, "abc"))
            .await,
        Code::InvalidArgument,
        "volume_capability.mount.volume_mount_group \"abc\" is not a group id",
    );
    expect(
        c.node
            .node_publish_volume(publish_req("v", s, t, "-5"))
            .await,
        Code::InvalidArgument,
        "volume_mount_group",
    );
    let mut r = publish_req("v", s, t, "");
    r.volume_capability = Some(mount_cap(
        &["nosuchflag"],
        "",
        pb::volume_capability::access_mode::Mode::SingleNodeWriter,
    ));
    expect(
        c.node.node_publish_volume(r).await,
        Code::InvalidArgument,
        "volume_capability.mount.mount_flags: unknown option `nosuchflag`",
    );
    let mut r = publish_req("v", s, t, "");
    r.volume_capability = None;
    expect(
        c.node.node_publish_volume(r).await,
        Code::InvalidArgument,
        "volume_capability missing",
    );
    // NodeUnpublishVolume, NodeUnstageVolume, NodeGetVolumeStats.
    expect(
        c.node.node_unpublish_volume(unpublish_req("", t)).await,
        Code::InvalidArgument,
        "volume_id missing",
    );
    expect(
        c.node
            .node_unpublish_volume(unpublish_req("v", Path::new("")))
            .await,
        Code::InvalidArgument,
        "target_path missing",
    );
    expect(
        c.node.node_unstage_volume(unstage_req("", s)).await,
        Code::InvalidArgument,
        "volume_id missing",
    );
    expect(
        c.node
            .node_unstage_volume(unstage_req("v", Path::new("")))
            .await,
        Code::InvalidArgument,
        "staging_target_path missing",
    );
    expect(
        c.node
            .node_get_volume_stats(pb::NodeGetVolumeStatsRequest {
                volume_id: "v".into(),
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        "volume_path missing",
    );
    expect(
        c.node
            .node_get_volume_stats(pb::NodeGetVolumeStatsRequest {
                volume_path: "/x".into(),
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        "volume_id missing",
    );
    assert!(!t.exists(), "no validation failure created anything");
}

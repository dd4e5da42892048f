//! Hostile input for each parser of outside input: CRD specs, cron schedules, annotation values,
//! kubeconfig files, CSI ids and CIDRs in the driver, and the sidecar's gRPC requests (sent to a real sidecar
//! process). Each parser accepts or refuses with an error, never panics, and what it accepts keeps
//! its promise. Cases per parser: proptest's PROPTEST_CASES (256 by default; `make fuzz` runs
//! 100,000), each test printing how many it ran.
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use operator::controllers::pvc::decide::{self as annotations, Desired, Feature, Sources};
use operator::flags::SchedulePrecedence;
use operator::schedule::Schedule;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use serde_json::Value;

/// Field names of the CRDs, so that generated objects reach past the top level.
const FIELDS: [&str; 36] = [
    "target",
    "persistentVolumeClaim",
    "backOffLimit",
    "retryDeadlineSeconds",
    "timeout",
    "schedule",
    "jobTemplate",
    "spec",
    "metadata",
    "labels",
    "annotations",
    "concurrencyPolicy",
    "failedJobsHistoryLimit",
    "successfulJobsHistoryLimit",
    "startingDeadlineSeconds",
    "suspend",
    "cidrs",
    "driver",
    "secret",
    "name",
    "namespace",
    "parameters",
    "networkFenceClassName",
    "fenceState",
    "replicationState",
    "dataSource",
    "kind",
    "apiGroup",
    "autoResync",
    "volumeReplicationClass",
    "replicationHandle",
    "source",
    "selector",
    "matchLabels",
    "volumeGroupReplicationClassName",
    "provisioner",
];

fn key() -> impl Strategy<Value = String> {
    prop_oneof![3 => proptest::sample::select(&FIELDS[..]).prop_map(str::to_owned), 1 => ".{0,12}"]
}

/// Any JSON value, up to four levels deep.
fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        prop_oneof!["\\PC{0,20}", "(Fenced|Unfenced|primary|secondary|resync|Forbid|Replace|@weekly)"]
            .prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 64, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map(key(), inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Runs `check` on `cases` values of `strategy` (PROPTEST_CASES), shrinking a failure, and
/// prints the count.
fn check<S: Strategy>(parser: &str, strategy: S, check: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S::Value: std::fmt::Debug,
{
    let ran = AtomicUsize::new(0);
    let mut runner = TestRunner::new(Config { failure_persistence: None, ..Config::default() });
    let result = runner.run(&strategy, |value| {
        ran.fetch_add(1, Ordering::Relaxed);
        check(value)
    });
    println!("hostile input: {parser}: {} cases", ran.load(Ordering::Relaxed));
    if let Err(e) = result {
        panic!("{parser}: {e}");
    }
}

/// Decodes `value` as `T`; whatever decodes encodes and decodes back to itself.
fn decodes_consistently<T>(value: &Value) -> Result<Option<T>, TestCaseError>
where
    T: serde::de::DeserializeOwned + serde::Serialize + PartialEq + std::fmt::Debug,
{
    let Ok(decoded) = serde_json::from_value::<T>(value.clone()) else { return Ok(None) };
    let again: T = serde_json::from_value(serde_json::to_value(&decoded).unwrap()).unwrap();
    prop_assert_eq!(&again, &decoded);
    Ok(Some(decoded))
}

#[test]
fn hostile_crd_specs_decode_or_are_refused() {
    use api::csiaddons::*;
    use api::replication::*;
    check("CRD spec decoding", json(), |value| {
        decodes_consistently::<ReclaimSpaceJobSpec>(&value)?;
        decodes_consistently::<EncryptionKeyRotationJobSpec>(&value)?;
        decodes_consistently::<ReclaimSpaceCronJobSpec>(&value)?;
        decodes_consistently::<EncryptionKeyRotationCronJobSpec>(&value)?;
        decodes_consistently::<VolumeReplicationSpec>(&value)?;
        decodes_consistently::<VolumeReplicationClassSpec>(&value)?;
        decodes_consistently::<VolumeGroupReplicationSpec>(&value)?;
        decodes_consistently::<VolumeGroupReplicationContentSpec>(&value)?;
        if let Some(fence) = decodes_consistently::<NetworkFenceSpec>(&value)? {
            // Validation and the request built from a fence never panic either.
            let _ = operator::controllers::network_fence::decide::validate(&fence);
            let _ = operator::controllers::network_fence::decide::request(&fence, None);
        }
        Ok(())
    })
}

/// Kubeconfig-like YAML (keys of a kubeconfig at random indents, flow collections, quotes,
/// anchors, block scalars) as well as noise.
fn kubeconfig_text() -> impl Strategy<Value = String> {
    let key = proptest::sample::select(
        &[
            "apiVersion",
            "clusters",
            "cluster",
            "server",
            "certificate-authority-data",
            "insecure-skip-tls-verify",
            "contexts",
            "context",
            "user",
            "users",
            "name",
            "current-context",
            "token",
            "tokenFile",
            "exec",
            "command",
            "args",
            "env",
            "auth-provider",
            "config",
            "id-token",
            "username",
            "password",
            "proxy-url",
        ][..],
    );
    let value = prop_oneof![
        Just(String::new()),
        Just("true".to_owned()),
        Just("[a, {b: c}]".to_owned()),
        Just("{}".to_owned()),
        Just("'quoted: yes'".to_owned()),
        Just("\"esc\\u00e9\"".to_owned()),
        Just("&anchor x".to_owned()),
        Just("*anchor".to_owned()),
        Just("|\n  block".to_owned()),
        "[a-z0-9:/.-]{0,12}",
    ];
    let line = (0usize..4, prop_oneof![Just(""), Just("- ")], key, value)
        .prop_map(|(indent, dash, key, value)| format!("{}{dash}{key}: {value}", "  ".repeat(indent)));
    prop_oneof![
        4 => proptest::collection::vec(line, 0..12).prop_map(|lines| lines.join("\n")),
        1 => "\\PC{0,80}",
    ]
}

#[test]
fn hostile_kubeconfigs_parse_or_are_refused() {
    let origin = std::path::Path::new("/hostile/kubeconfig");
    check("kubeconfig files", kubeconfig_text(), |text| {
        if let Ok(kubeconfig) = cluster_client::kubeconfig::parse(&text, origin) {
            // The credentials of what parses are read (an exec plugin is not run) or refused.
            for user in kubeconfig.auth_infos.iter().filter_map(|named| named.auth_info.as_ref()) {
                let _ = cluster_client::auth::Credentials::of(user);
            }
        }
        Ok(())
    })
}

/// Near-valid cron text as well as noise.
fn cron_text() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        Just("*".to_owned()),
        (0u32..80).prop_map(|n| n.to_string()),
        (0u32..80, 0u32..80).prop_map(|(a, b)| format!("{a}-{b}")),
        (0u32..80, 0u32..80, 0u32..70).prop_map(|(a, b, s)| format!("{a}-{b}/{s}")),
        (0u32..70).prop_map(|s| format!("*/{s}")),
        proptest::sample::select(&["MON", "sun", "Jan", "DEC", "?", "L", "-1", ",", "1,2,3", "99999999999"][..])
            .prop_map(str::to_owned),
    ];
    prop_oneof![
        3 => proptest::collection::vec(token, 0..7).prop_map(|fields| fields.join(" ")),
        1 => proptest::sample::select(&["@weekly", "@every 1h30m", "@every -1s", "@every 0s", "TZ=UTC 0 0 * * *", "@reboot"][..])
            .prop_map(str::to_owned),
        1 => "\\PC{0,40}",
    ]
}

#[test]
fn hostile_cron_schedules_parse_or_are_refused() {
    check("cron schedules", (cron_text(), 0i64..4_102_444_800), |(text, now)| {
        if let Ok(schedule) = Schedule::parse(&text) {
            if let Some(next) = schedule.next_after(now) {
                prop_assert!(next > now, "{text:?}: next run {next} is not after {now}");
            }
            let _ = schedule.interval_after(now);
        }
        Ok(())
    })
}

/// A DNS-1123 subdomain, what a cron job's name must be.
fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            let bytes = label.as_bytes();
            !bytes.is_empty()
                && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
                && bytes[0].is_ascii_alphanumeric()
                && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        })
}

fn annotations() -> impl Strategy<Value = BTreeMap<String, String>> {
    let keys = proptest::sample::select(
        &[
            "reclaimspace.csiaddons.openshift.io/schedule",
            "reclaimspace.csiaddons.openshift.io/enable",
            "keyrotation.csiaddons.openshift.io/schedule",
            "keyrotation.csiaddons.openshift.io/enable",
            "other",
        ][..],
    );
    let values = prop_oneof![cron_text(), Just("false".to_owned()), Just(" false ".to_owned()), "\\PC{0,10}"];
    proptest::collection::btree_map(keys.prop_map(str::to_owned), values, 0..4)
}

#[test]
fn hostile_annotation_values_schedule_something_valid_or_nothing() {
    // PVC names a user can create: DNS subdomains up to 253 characters, dots included.
    let label = "[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?";
    let pvc = proptest::collection::vec(label, 1..8).prop_map(|labels| {
        let mut name = String::new();
        for label in labels {
            if name.len() + label.len() + 1 > 253 {
                break;
            }
            if !name.is_empty() {
                name.push('.');
            }
            name.push_str(&label);
        }
        name
    });
    let inputs = (annotations(), annotations(), annotations(), any::<bool>(), any::<bool>(), pvc);
    check("annotation values", inputs, |(pvc_annotations, namespace, class, offers, by_class, pvc)| {
        let sources = Sources {
            pvc: &pvc_annotations,
            namespace: Some(&namespace),
            storage_class: Some(&class),
            driver_offers: offers,
        };
        let precedence = if by_class { SchedulePrecedence::StorageClass } else { SchedulePrecedence::Pvc };
        for feature in [Feature::ReclaimSpace, Feature::KeyRotation] {
            if let Desired::Present { schedule, .. } = annotations::desired(feature, precedence, &sources) {
                prop_assert!(Schedule::parse(&schedule).is_ok(), "{schedule:?} would be written but does not parse");
            }
            let child = annotations::child_name(&pvc, feature);
            prop_assert!(is_dns_subdomain(&child), "cron job name {child:?} (PVC {pvc:?}) is not a valid name");
        }
        Ok(())
    })
}

#[test]
fn hostile_csi_ids_never_name_a_path_outside_the_drivers_state() {
    let root = std::path::Path::new("/state");
    let layout = reference_driver::volumes::Layout::new(root, false);
    let ids = prop_oneof!["\\PC{0,40}", "[a-zA-Z0-9._/-]{0,40}", Just("..".to_owned()), Just("../x".to_owned())];
    check("CSI volume ids", ids, |id| {
        if reference_driver::volumes::validate_id("volume_id", &id).is_ok() {
            let file = layout.volume_file(&id);
            let volumes = root.join("volumes");
            prop_assert_eq!(file.parent(), Some(volumes.as_path()), "{:?} escapes", id);
            prop_assert!(
                file.components().all(|c| matches!(c, std::path::Component::Normal(_) | std::path::Component::RootDir))
            );
        }
        Ok(())
    })
}

#[test]
fn hostile_cidrs_parse_or_are_refused() {
    let text = prop_oneof![
        "\\PC{0,30}",
        "[0-9a-f:./]{0,30}",
        (any::<[u8; 4]>(), 0u8..40).prop_map(|(a, p)| { format!("{}.{}.{}.{}/{p}", a[0], a[1], a[2], a[3]) })
    ];
    check("CIDRs", text, |text| {
        if let Ok(cidr) = text.parse::<reference_driver::cidr::Cidr>() {
            let _ = cidr.contains(std::net::IpAddr::from([10, 0, 0, 1]));
            let _ = cidr.contains(std::net::IpAddr::from([0xfd00, 0, 0, 0, 0, 0, 0, 1]));
        }
        let fence = api::csiaddons::NetworkFenceSpec {
            network_fence_class_name: Some("c".into()),
            cidrs: vec![text],
            ..Default::default()
        };
        let _ = operator::controllers::network_fence::decide::validate(&fence);
        Ok(())
    })
}

/// Names as a controller (or anything that reaches the port) might send them.
fn hostile_name() -> impl Strategy<Value = String> {
    prop_oneof![
        "\\PC{0,300}",
        "[a-z0-9.-]{1,20}",
        Just(String::new()),
        Just("a/../../namespaces/kube-system/secrets/x".to_owned()),
        Just("a?watch=true".to_owned()),
        "[a-z]{254,260}",
    ]
}

/// The sidecar's gRPC requests, sent to a real sidecar process: a PV or Secret name no object can
/// have is the caller's error (never UNAVAILABLE, which the controller would retry for ever, nor
/// a malformed API request), and the sidecar serves on afterwards.
#[tokio::test]
async fn hostile_sidecar_requests_get_a_clear_error_and_the_sidecar_serves_on() {
    use crate::harness::sidecar::{Serving, SidecarProcess, Workload, plain_channel, sidecar_pod};
    use api::proto::internal as pb;

    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let driver = crate::harness::driver::Harness::start().await;
    let namespace = cp.namespace(&client, "hostile").await.unwrap();
    let pod = sidecar_pod(&client, &namespace, "hostile-node", Workload::StatefulSet, "csi-plugin").await;
    let sidecar = SidecarProcess::start(&pod, "hostile-node", &driver.driver.addons_endpoint, Serving::Plain, &[]);
    sidecar.wait_ready().await;
    sidecar.wait_leader(true).await;
    let channel = plain_channel(sidecar.port).await.unwrap();
    let mut reclaim = pb::reclaim_space_client::ReclaimSpaceClient::new(channel.clone());
    let mut fence = pb::network_fence_client::NetworkFenceClient::new(channel.clone());

    let mut runner = TestRunner::new(Config { failure_persistence: None, ..Config::default() });
    let strategy = (hostile_name(), hostile_name(), hostile_name());
    let cases = runner.config().cases;
    for _ in 0..cases {
        let (pv, secret, secret_namespace) = strategy.new_tree(&mut runner).unwrap().current();
        // No PV exists here: every name is refused as the caller's error.
        let status =
            reclaim.controller_reclaim_space(pb::ReclaimSpaceRequest { pv_name: pv.clone() }).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "pv_name {pv:?}: {status:?}");
        let request = pb::NetworkFenceRequest {
            parameters: Default::default(),
            secret_name: secret.clone(),
            secret_namespace: secret_namespace.clone(),
            cidrs: vec!["10.99.0.1/32".into()],
        };
        if let Err(status) = fence.fence_cluster_network(request).await {
            assert!(
                !matches!(status.code(), tonic::Code::Unavailable | tonic::Code::Unknown),
                "secret {secret:?} in {secret_namespace:?}: {status:?}"
            );
        }
    }
    println!("hostile input: sidecar gRPC requests: {cases} cases (2 calls each)");
    let mut identity = api::proto::identity::identity_client::IdentityClient::new(channel);
    identity.get_identity(api::proto::identity::GetIdentityRequest {}).await.expect("the sidecar serves on");
}

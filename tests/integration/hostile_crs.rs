//! Hostile custom resources on the real API server, with our manager running: names at and past
//! the length limits, unicode, huge specs, wrong types, values no driver could take. Each must be
//! rejected at admission with a message, or be admitted and end Failed with a message a user can
//! act on (a Failed result or state, or a Warning event); the manager must keep running and stay
//! healthy throughout. Prints what happened to each.

use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};

use crate::manager_harness::Stage;
use crate::sidecar_harness::http_get;
use crate::support::{dynamic_api, object};

/// A short deadline, so that a job that cannot run gives up within seconds.
fn job(pvc: &str) -> Value {
    json!({"target": {"persistentVolumeClaim": pvc}, "backOffLimit": 1, "retryDeadlineSeconds": 1})
}

/// (what, kind, name, spec) — `{ns}` in a value is the test's namespace.
fn cases() -> Vec<(&'static str, &'static str, String, Value)> {
    let long = |n: usize| "a".repeat(n);
    vec![
        ("name of 253 characters, PVC missing", "ReclaimSpaceJob", long(253), job("missing")),
        ("name of 254 characters", "ReclaimSpaceJob", long(254), job("missing")),
        ("unicode name", "ReclaimSpaceJob", "jöb-ünïcode".into(), job("missing")),
        ("upper-case name", "ReclaimSpaceJob", "Job-A".into(), job("missing")),
        ("unicode PVC name", "ReclaimSpaceJob", "unicode-pvc".into(), job("数据-volume")),
        ("PVC name of 10,000 characters", "ReclaimSpaceJob", "long-pvc".into(), job(&long(10_000))),
        ("PVC name with a path", "ReclaimSpaceJob", "path-pvc".into(), job("../../etc/passwd")),
        ("2 MiB spec", "ReclaimSpaceJob", "huge".into(), json!({"target": {"persistentVolumeClaim": long(2 << 20)}})),
        (
            "backOffLimit a string",
            "ReclaimSpaceJob",
            "wrong-type".into(),
            json!({"target": {"persistentVolumeClaim": "p"}, "backOffLimit": "six"}),
        ),
        ("target a string", "ReclaimSpaceJob", "target-string".into(), json!({"target": "p"})),
        (
            "backOffLimit 2^40",
            "ReclaimSpaceJob",
            "big-number".into(),
            json!({"target": {"persistentVolumeClaim": "p"}, "backOffLimit": 1_u64 << 40}),
        ),
        (
            "timeout negative",
            "EncryptionKeyRotationJob",
            "negative".into(),
            json!({"target": {"persistentVolumeClaim": "p"}, "timeout": -5}),
        ),
        ("no target", "EncryptionKeyRotationJob", "no-target".into(), json!({})),
        (
            "schedule out of range",
            "ReclaimSpaceCronJob",
            "bad-schedule".into(),
            json!({"schedule": "61 * * * *", "jobTemplate": {"spec": job("p")}}),
        ),
        (
            "schedule a number",
            "ReclaimSpaceCronJob",
            "number-schedule".into(),
            json!({"schedule": 42, "jobTemplate": {"spec": job("p")}}),
        ),
        (
            "schedule of 100,000 characters",
            "ReclaimSpaceCronJob",
            "long-schedule".into(),
            json!({"schedule": "* ".repeat(50_000), "jobTemplate": {"spec": job("p")}}),
        ),
        (
            "fence CIDR that is not one",
            "NetworkFence",
            "bad-cidr".into(),
            json!({"driver": "hostile.csi-addons-rs.io", "cidrs": ["999.1.1.1/33"], "fenceState": "Fenced", "secret": {"name": "s", "namespace": "n"}}),
        ),
        (
            "fence of every address, not marked as meant",
            "NetworkFence",
            "fence-everything".into(),
            json!({"driver": "hostile.csi-addons-rs.io", "cidrs": ["0.0.0.0/0"], "fenceState": "Fenced", "secret": {"name": "s", "namespace": "n"}}),
        ),
        (
            "node endpoint with a path",
            "CSIAddonsNode",
            "node-path".into(),
            json!({"driver": {"name": "d.example.com", "endpoint": "pod://../../etc:1", "nodeID": "n"}}),
        ),
        (
            "node endpoint naming a Pod of another namespace",
            "CSIAddonsNode",
            "node-foreign".into(),
            json!({"driver": {"name": "d.example.com", "endpoint": "pod://coredns-0.kube-system:53", "nodeID": "n"}}),
        ),
        (
            "node endpoint of unicode",
            "CSIAddonsNode",
            "node-unicode".into(),
            json!({"driver": {"name": "d.example.com", "endpoint": "pod://ポッド.名前空間:9070", "nodeID": "n"}}),
        ),
        (
            "replication state unknown",
            "VolumeReplication",
            "sideways".into(),
            json!({"volumeReplicationClass": "c", "replicationState": "sideways", "dataSource": {"kind": "PersistentVolumeClaim", "name": "p"}}),
        ),
    ]
}

/// How an object admitted ended: its Failed message, from status or a Warning event.
async fn failure(stage: &Stage, kind: &str, name: &str) -> Option<String> {
    let object = dynamic_api(&stage.client, kind, &stage.namespace).get_opt(name).await.ok()??;
    let status = object.data.get("status").cloned().unwrap_or_default();
    let failed = ["result", "state"].iter().any(|k| status.get(*k) == Some(&json!("Failed")));
    let message = status.get("message").and_then(Value::as_str).unwrap_or_default();
    if failed && !message.is_empty() {
        return Some(message.to_owned());
    }
    let events = Api::<Event>::namespaced(stage.client.clone(), &stage.namespace);
    let list = events.list(&ListParams::default()).await.ok()?;
    list.items
        .into_iter()
        .find(|e| e.involved_object.name.as_deref() == Some(name) && e.type_.as_deref() == Some("Warning"))
        .and_then(|e| e.message)
        .filter(|m| !m.is_empty())
}

#[tokio::test]
async fn hostile_crs_are_rejected_or_fail_with_a_message_and_the_manager_stays_up() {
    let mut stage = Stage::new("hostile-crs", &["service.CONTROLLER_SERVICE"]).await;
    let mut admitted = Vec::new();
    let mut report = Vec::new();
    for (what, kind, name, spec) in cases() {
        let object = object(kind, &name, spec);
        match dynamic_api(&stage.client, kind, &stage.namespace).create(&PostParams::default(), &object).await {
            Ok(_) => admitted.push((what, kind, name)),
            Err(kube::Error::Api(status)) => {
                assert!(!status.message.trim().is_empty(), "{what}: rejected without a message");
                report.push(format!("{what}: rejected ({}): {}", status.code, cut(&status.message)));
            }
            Err(other) => {
                let message = other.to_string();
                assert!(!message.trim().is_empty(), "{what}: refused without a message");
                report.push(format!("{what}: refused: {}", cut(&message)));
            }
        }
    }
    for (what, kind, name) in admitted {
        let failed = testenv::poll::until(2 * testenv::poll::MINUTE, async || {
            assert!(stage.manager.child.try_wait().unwrap().is_none(), "the manager exited:\n{}", stage.manager.log());
            failure(&stage, kind, &name).await
        })
        .await;
        let Some(message) = failed else {
            let object = dynamic_api(&stage.client, kind, &stage.namespace).get_opt(&name).await.unwrap();
            let status = object.map(|o| o.data["status"].clone()).unwrap_or_default();
            panic!("{what}: admitted, and no Failed status or Warning event after 2 min; status {status}");
        };
        report.push(format!("{what}: admitted, then Failed: {}", cut(&message)));
    }
    for line in &report {
        println!("{line}");
    }
    let (code, _) = http_get(stage.manager.health, "/healthz").await.expect("the manager answers /healthz");
    assert_eq!(code, 200, "{}", stage.manager.log());
    assert!(stage.manager.child.try_wait().unwrap().is_none(), "the manager exited:\n{}", stage.manager.log());
    assert!(!stage.manager.log().contains("panicked"), "{}", stage.manager.log());
}

/// A message cut to one printable line (some quote the 2 MiB value back).
fn cut(message: &str) -> String {
    let line = message.replace('\n', " ");
    if line.chars().count() > 160 { format!("{}…", line.chars().take(160).collect::<String>()) } else { line }
}

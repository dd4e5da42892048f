//! Hostile custom resources: names at and past the length limits, unicode, huge specs, wrong types,
//! values no driver could take, endpoints and fences that reach outside what their creator may touch.
//! The same cases run against a local API server with the manager as a process (`make test`) and in
//! the one-node cluster against the shipped manager (`make test-cluster`). Each must be rejected at
//! admission with a message, or be admitted and end Failed with a message a user can act on (a
//! Failed result or state, or a Warning event).
use k8s_openapi::api::core::v1::Event;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

use crate::kinds::{dynamic_api, object};
use crate::poll;

/// A short deadline, so that a job that cannot run gives up within seconds.
fn job(pvc: &str) -> Value {
    json!({"target": {"persistentVolumeClaim": pvc}, "backOffLimit": 1, "retryDeadlineSeconds": 1})
}

/// Every case: (what it is, kind, name, spec).
pub fn cases() -> Vec<(&'static str, &'static str, String, Value)> {
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

/// What became of every case: one printable line each, and the objects that were admitted (to remove).
pub struct Outcome {
    pub report: Vec<String>,
    pub admitted: Vec<(&'static str, String)>,
}

/// Creates every case in `namespace` (cluster-scoped kinds in the cluster), then waits up to two
/// minutes for each admitted one to end Failed with a message. `alive` is asked at every check
/// whether the manager still runs; its error ends the test. Panics on a rejection without a message
/// or on an admitted object that never fails.
pub async fn create_all(
    client: &Client,
    namespace: &str,
    mut alive: impl AsyncFnMut() -> Result<(), String>,
) -> Outcome {
    let mut admitted = Vec::new();
    let mut report = Vec::new();
    for (what, kind, name, spec) in cases() {
        let object = object(kind, &name, spec);
        match dynamic_api(client, kind, namespace).create(&PostParams::default(), &object).await {
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
    for (what, kind, name) in &admitted {
        let failed = poll::try_until(2 * poll::MINUTE, async || -> Result<Option<String>, String> {
            alive().await?;
            Ok(failure(client, namespace, kind, name).await)
        })
        .await
        .unwrap_or_else(|gone| panic!("{what}: {gone}"));
        let Some(message) = failed else {
            let object = dynamic_api(client, kind, namespace).get_opt(name).await.ok().flatten();
            let status = object.map(|o| o.data["status"].clone()).unwrap_or_default();
            panic!("{what}: admitted, and no Failed status or Warning event after 2 min; status {status}");
        };
        report.push(format!("{what}: admitted, then Failed: {}", cut(&message)));
    }
    Outcome { report, admitted: admitted.into_iter().map(|(_, kind, name)| (kind, name)).collect() }
}

/// Deletes what [`create_all`] admitted; a Failed object holds no finalizer of the manager, so each
/// goes at once.
pub async fn delete_all(client: &Client, namespace: &str, outcome: &Outcome) {
    for (kind, name) in &outcome.admitted {
        let _ = dynamic_api(client, kind, namespace).delete(name, &DeleteParams::default()).await;
    }
}

/// How an object admitted ended: its Failed message, from status or a Warning event.
async fn failure(client: &Client, namespace: &str, kind: &str, name: &str) -> Option<String> {
    let object = dynamic_api(client, kind, namespace).get_opt(name).await.ok()??;
    let status = object.data.get("status").cloned().unwrap_or_default();
    let failed = ["result", "state"].iter().any(|k| status.get(*k) == Some(&json!("Failed")));
    let message = status.get("message").and_then(Value::as_str).unwrap_or_default();
    if failed && !message.is_empty() {
        return Some(message.to_owned());
    }
    let events = Api::<Event>::namespaced(client.clone(), namespace);
    let list = events.list(&ListParams::default()).await.ok()?;
    list.items
        .into_iter()
        .find(|e| e.involved_object.name.as_deref() == Some(name) && e.type_.as_deref() == Some("Warning"))
        .and_then(|e| e.message)
        .filter(|m| !m.is_empty())
}

/// A message cut to one printable line (some quote the 2 MiB value back).
fn cut(message: &str) -> String {
    let line = message.replace('\n', " ");
    if line.chars().count() > 160 { format!("{}…", line.chars().take(160).collect::<String>()) } else { line }
}

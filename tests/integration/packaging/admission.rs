//! Every validation rule of the CRDs, on the real API server: for each, an object that breaks it is
//! rejected with the expected field path and message.
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::harness::support::{dynamic_api, invalid_message, object, unique};

/// A rule check: `create` is the spec to create. Without `update` the create must be rejected;
/// with it, the create must succeed and the merge patch `{"spec": update}` must be rejected.
struct Case {
    kind: &'static str,
    rule: &'static str,
    create: Value,
    update: Option<Value>,
    /// Substrings the server's message must contain (field path and message).
    expect: &'static [&'static str],
}

fn node() -> Value {
    json!({"driver": {"name": "d.example.com", "endpoint": "pod://p.ns:9070", "nodeID": "node-1"}})
}
fn job() -> Value {
    json!({"target": {"persistentVolumeClaim": "pvc-1"}})
}
fn cron() -> Value {
    json!({"schedule": "@weekly", "jobTemplate": {"spec": job()}})
}
fn fence_with_driver() -> Value {
    json!({"driver": "d.example.com", "cidrs": ["10.0.0.1/32"], "secret": {"name": "s", "namespace": "n"}, "parameters": {"k": "v"}})
}
fn fence_with_class() -> Value {
    json!({"networkFenceClassName": "class-1", "cidrs": ["10.0.0.1/32"]})
}
fn class() -> Value {
    json!({"provisioner": "d.example.com"})
}
fn class_with_parameters() -> Value {
    json!({"provisioner": "d.example.com", "parameters": {"k": "v"}})
}
fn vr() -> Value {
    json!({"volumeReplicationClass": "vrc", "replicationState": "primary", "dataSource": {"kind": "PersistentVolumeClaim", "name": "pvc-1"}})
}
fn vgr() -> Value {
    json!({"volumeGroupReplicationClassName": "vgrc", "volumeReplicationClassName": "vrc", "volumeReplicationName": "vr-1",
           "volumeGroupReplicationContentName": "c-1", "replicationState": "primary", "source": {"selector": {"matchLabels": {"a": "b"}}}})
}
fn content() -> Value {
    json!({"provisioner": "d.example.com", "volumeGroupReplicationClassName": "vgrc", "source": {"volumeHandles": ["h-1"]},
           "volumeGroupAttributes": {"k": "v"}})
}

/// `base` with `value` set at `pointer` (whose parent must exist).
fn with(mut base: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let Some(Value::Object(map)) = base.pointer_mut(parent) else { panic!("no object at {parent:?}") };
    map.insert(key.to_owned(), value);
    base
}
fn without(mut base: Value, parent: &str, key: &str) -> Value {
    base.pointer_mut(parent).and_then(Value::as_object_mut).unwrap().remove(key);
    base
}

fn create_rejected(kind: &'static str, rule: &'static str, create: Value, expect: &'static [&'static str]) -> Case {
    Case { kind, rule, create, update: None, expect }
}
fn update_rejected(
    kind: &'static str,
    rule: &'static str,
    create: Value,
    update: Value,
    expect: &'static [&'static str],
) -> Case {
    Case { kind, rule, create, update: Some(update), expect }
}

fn job_cases(kind: &'static str) -> Vec<Case> {
    vec![
        create_rejected(kind, "target required", json!({}), &["spec.target: Required value"]),
        create_rejected(
            kind,
            "PVC name required",
            json!({"target": {}}),
            &["spec.target.persistentVolumeClaim: Required value"],
        ),
        create_rejected(
            kind,
            "PVC name not empty",
            with(job(), "/target/persistentVolumeClaim", json!("")),
            &["spec.target.persistentVolumeClaim", "should be at least 1 chars long"],
        ),
        create_rejected(
            kind,
            "backOffLimit max",
            with(job(), "/backOffLimit", json!(61)),
            &["spec.backOffLimit", "should be less than or equal to 60"],
        ),
        create_rejected(
            kind,
            "backOffLimit min",
            with(job(), "/backOffLimit", json!(-1)),
            &["spec.backOffLimit", "should be greater than or equal to 0"],
        ),
        create_rejected(
            kind,
            "retryDeadlineSeconds max",
            with(job(), "/retryDeadlineSeconds", json!(1801)),
            &["spec.retryDeadlineSeconds", "should be less than or equal to 1800"],
        ),
        create_rejected(
            kind,
            "retryDeadlineSeconds min",
            with(job(), "/retryDeadlineSeconds", json!(-1)),
            &["spec.retryDeadlineSeconds", "should be greater than or equal to 0"],
        ),
        create_rejected(
            kind,
            "timeout min",
            with(job(), "/timeout", json!(59)),
            &["spec.timeout", "should be greater than or equal to 60"],
        ),
        update_rejected(
            kind,
            "PVC immutable",
            job(),
            json!({"target": {"persistentVolumeClaim": "pvc-2"}}),
            &["spec.target.persistentVolumeClaim", "persistentVolumeClaim is immutable"],
        ),
    ]
}

fn cron_cases(kind: &'static str) -> Vec<Case> {
    vec![
        create_rejected(kind, "schedule required", without(cron(), "", "schedule"), &["spec.schedule: Required value"]),
        create_rejected(
            kind,
            "schedule not empty",
            with(cron(), "/schedule", json!("")),
            &["spec.schedule", "should match '.+'"],
        ),
        create_rejected(
            kind,
            "jobTemplate required",
            without(cron(), "", "jobTemplate"),
            &["spec.jobTemplate: Required value"],
        ),
        create_rejected(
            kind,
            "jobTemplate.spec required",
            with(cron(), "/jobTemplate", json!({})),
            &["spec.jobTemplate.spec: Required value"],
        ),
        create_rejected(
            kind,
            "concurrencyPolicy enum",
            with(cron(), "/concurrencyPolicy", json!("Allow")),
            &["spec.concurrencyPolicy: Unsupported value: \"Allow\": supported values: \"Forbid\", \"Replace\""],
        ),
        create_rejected(
            kind,
            "successfulJobsHistoryLimit max",
            with(cron(), "/successfulJobsHistoryLimit", json!(61)),
            &["spec.successfulJobsHistoryLimit", "should be less than or equal to 60"],
        ),
        create_rejected(
            kind,
            "failedJobsHistoryLimit min",
            with(cron(), "/failedJobsHistoryLimit", json!(-1)),
            &["spec.failedJobsHistoryLimit", "should be greater than or equal to 0"],
        ),
        create_rejected(
            kind,
            "template backOffLimit max",
            with(cron(), "/jobTemplate/spec/backOffLimit", json!(61)),
            &["spec.jobTemplate.spec.backOffLimit", "should be less than or equal to 60"],
        ),
        create_rejected(
            kind,
            "template timeout min",
            with(cron(), "/jobTemplate/spec/timeout", json!(1)),
            &["spec.jobTemplate.spec.timeout", "should be greater than or equal to 60"],
        ),
        update_rejected(
            kind,
            "template PVC immutable",
            cron(),
            json!({"jobTemplate": {"spec": {"target": {"persistentVolumeClaim": "pvc-2"}}}}),
            &["spec.jobTemplate.spec.target.persistentVolumeClaim", "persistentVolumeClaim is immutable"],
        ),
    ]
}

fn class_cases(kind: &'static str) -> Vec<Case> {
    vec![
        create_rejected(
            kind,
            "provisioner required",
            json!({"parameters": {"k": "v"}}),
            &["spec.provisioner: Required value"],
        ),
        update_rejected(
            kind,
            "provisioner immutable",
            class(),
            json!({"provisioner": "other"}),
            &["spec.provisioner", "provisioner is immutable"],
        ),
        update_rejected(
            kind,
            "parameters added after creation",
            class(),
            json!({"parameters": {"k": "v"}}),
            &["spec: Invalid value", "parameters are immutable"],
        ),
        update_rejected(
            kind,
            "parameters removed",
            class_with_parameters(),
            json!({"parameters": null}),
            &["spec: Invalid value", "parameters are immutable"],
        ),
        update_rejected(
            kind,
            "parameters changed",
            class_with_parameters(),
            json!({"parameters": {"k": "w"}}),
            &["spec.parameters", "parameters are immutable"],
        ),
    ]
}

fn cases() -> Vec<Case> {
    let mut cases = vec![
        create_rejected("CSIAddonsNode", "driver required", json!({}), &["spec.driver: Required value"]),
        create_rejected(
            "CSIAddonsNode",
            "nodeID required",
            without(node(), "/driver", "nodeID"),
            &["spec.driver.nodeID: Required value"],
        ),
        create_rejected(
            "CSIAddonsNode",
            "endpoint required",
            without(node(), "/driver", "endpoint"),
            &["spec.driver.endpoint: Required value"],
        ),
        update_rejected(
            "CSIAddonsNode",
            "name immutable",
            node(),
            json!({"driver": {"name": "other"}}),
            &["spec.driver.name", "name is immutable"],
        ),
        update_rejected(
            "CSIAddonsNode",
            "nodeID immutable",
            node(),
            json!({"driver": {"nodeID": "node-2"}}),
            &["spec.driver.nodeID", "nodeID is immutable"],
        ),
        create_rejected(
            "NetworkFence",
            "neither driver nor class",
            json!({"cidrs": ["10.0.0.1/32"], "secret": {"name": "s", "namespace": "n"}}),
            &["one of driver or networkFenceClassName must be present"],
        ),
        create_rejected(
            "NetworkFence",
            "no secret and no class",
            without(fence_with_driver(), "", "secret"),
            &["secret must be present when networkFenceClassName is not specified"],
        ),
        create_rejected(
            "NetworkFence",
            "cidrs required",
            without(fence_with_class(), "", "cidrs"),
            &["spec.cidrs: Required value"],
        ),
        create_rejected(
            "NetworkFence",
            "fenceState enum",
            with(fence_with_class(), "/fenceState", json!("Half")),
            &["spec.fenceState: Unsupported value: \"Half\": supported values: \"Fenced\", \"Unfenced\""],
        ),
        create_rejected(
            "NetworkFence",
            "secret name and namespace together",
            with(fence_with_driver(), "/secret", json!({"namespace": "n"})),
            &["spec.secret", "secret needs both name and namespace"],
        ),
        update_rejected(
            "NetworkFence",
            "driver immutable",
            fence_with_driver(),
            json!({"driver": "other"}),
            &["spec.driver", "driver is immutable"],
        ),
        update_rejected(
            "NetworkFence",
            "class immutable",
            fence_with_class(),
            json!({"networkFenceClassName": "class-2"}),
            &["spec.networkFenceClassName", "networkFenceClassName is immutable"],
        ),
        update_rejected(
            "NetworkFence",
            "secret immutable",
            fence_with_driver(),
            json!({"secret": {"name": "s2"}}),
            &["spec.secret", "secret is immutable"],
        ),
        update_rejected(
            "NetworkFence",
            "secret namespace immutable",
            fence_with_driver(),
            json!({"secret": {"namespace": "n2"}}),
            &["spec.secret.namespace", "namespace is immutable"],
        ),
        update_rejected(
            "NetworkFence",
            "parameters immutable",
            fence_with_driver(),
            json!({"parameters": {"k": "w"}}),
            &["spec.parameters", "parameters are immutable"],
        ),
        create_rejected(
            "VolumeReplication",
            "class required",
            without(vr(), "", "volumeReplicationClass"),
            &["spec.volumeReplicationClass: Required value"],
        ),
        create_rejected(
            "VolumeReplication",
            "dataSource required",
            without(vr(), "", "dataSource"),
            &["spec.dataSource: Required value"],
        ),
        create_rejected(
            "VolumeReplication",
            "dataSource name required",
            with(vr(), "/dataSource", json!({"kind": "PersistentVolumeClaim"})),
            &["spec.dataSource.name: Required value"],
        ),
        create_rejected(
            "VolumeReplication",
            "replicationState required",
            without(vr(), "", "replicationState"),
            &["spec.replicationState: Required value"],
        ),
        create_rejected(
            "VolumeReplication",
            "replicationState enum",
            with(vr(), "/replicationState", json!("tertiary")),
            &[
                "spec.replicationState: Unsupported value: \"tertiary\": supported values: \"primary\", \"secondary\", \"resync\"",
            ],
        ),
        update_rejected(
            "VolumeReplication",
            "class immutable",
            vr(),
            json!({"volumeReplicationClass": "vrc-2"}),
            &["spec.volumeReplicationClass", "volumeReplicationClass is immutable"],
        ),
        update_rejected(
            "VolumeReplication",
            "dataSource immutable",
            vr(),
            json!({"dataSource": {"name": "pvc-2"}}),
            &["spec.dataSource", "dataSource is immutable"],
        ),
        create_rejected(
            "VolumeGroupReplication",
            "source required",
            without(vgr(), "", "source"),
            &["spec.source: Required value"],
        ),
        create_rejected(
            "VolumeGroupReplication",
            "selector required",
            with(vgr(), "/source", json!({})),
            &["spec.source.selector: Required value"],
        ),
        create_rejected(
            "VolumeGroupReplication",
            "class required",
            without(vgr(), "", "volumeGroupReplicationClassName"),
            &["spec.volumeGroupReplicationClassName: Required value"],
        ),
        create_rejected(
            "VolumeGroupReplication",
            "replicationState enum",
            with(vgr(), "/replicationState", json!("Primary")),
            &["spec.replicationState: Unsupported value: \"Primary\""],
        ),
        update_rejected(
            "VolumeGroupReplication",
            "class immutable",
            vgr(),
            json!({"volumeGroupReplicationClassName": "x"}),
            &["spec.volumeGroupReplicationClassName", "volumeGroupReplicationClassName is immutable"],
        ),
        update_rejected(
            "VolumeGroupReplication",
            "VR class immutable",
            vgr(),
            json!({"volumeReplicationClassName": "x"}),
            &["spec.volumeReplicationClassName", "volumeReplicationClassName is immutable"],
        ),
        update_rejected(
            "VolumeGroupReplication",
            "VR name immutable",
            vgr(),
            json!({"volumeReplicationName": "x"}),
            &["spec.volumeReplicationName", "volumeReplicationName is immutable"],
        ),
        update_rejected(
            "VolumeGroupReplication",
            "content name immutable",
            vgr(),
            json!({"volumeGroupReplicationContentName": "x"}),
            &["spec.volumeGroupReplicationContentName", "volumeGroupReplicationContentName is immutable"],
        ),
        update_rejected(
            "VolumeGroupReplication",
            "selector immutable",
            vgr(),
            json!({"source": {"selector": {"matchLabels": {"a": "c"}}}}),
            &["spec.source.selector", "selector is immutable"],
        ),
        update_rejected(
            "VolumeGroupReplication",
            "external immutable",
            vgr(),
            json!({"external": true}),
            &["spec.external", "external is immutable"],
        ),
        create_rejected(
            "VolumeGroupReplicationContent",
            "provisioner required",
            without(content(), "", "provisioner"),
            &["spec.provisioner: Required value"],
        ),
        create_rejected(
            "VolumeGroupReplicationContent",
            "class required",
            without(content(), "", "volumeGroupReplicationClassName"),
            &["spec.volumeGroupReplicationClassName: Required value"],
        ),
        create_rejected(
            "VolumeGroupReplicationContent",
            "volumeHandles required",
            with(content(), "/source", json!({})),
            &["spec.source.volumeHandles: Required value"],
        ),
        update_rejected(
            "VolumeGroupReplicationContent",
            "attributes immutable",
            content(),
            json!({"volumeGroupAttributes": {"k": "w"}}),
            &["spec.volumeGroupAttributes", "field is immutable"],
        ),
    ];
    let mut content_ref = content();
    content_ref["volumeGroupReplicationRef"] = json!({"name": "vgr-1", "namespace": "ns-1"});
    cases.push(create_rejected(
        "VolumeGroupReplicationContent",
        "ref needs name, namespace and uid",
        content_ref,
        &["spec.volumeGroupReplicationRef", "volumeGroupReplicationRef.name, volumeGroupReplicationRef.namespace and volumeGroupReplicationRef.uid must be set if volumeGroupReplicationRef is defined"],
    ));
    for kind in ["ReclaimSpaceJob", "EncryptionKeyRotationJob"] {
        cases.extend(job_cases(kind));
    }
    for kind in ["ReclaimSpaceCronJob", "EncryptionKeyRotationCronJob"] {
        cases.extend(cron_cases(kind));
    }
    for kind in ["NetworkFenceClass", "VolumeReplicationClass", "VolumeGroupReplicationClass"] {
        cases.extend(class_cases(kind));
    }
    cases
}

#[tokio::test]
async fn every_validation_rule_rejects_with_its_message() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "admission").await.unwrap();
    let cases = cases();
    let mut kinds: Vec<&str> = cases.iter().map(|c| c.kind).collect();
    kinds.sort();
    kinds.dedup();
    assert_eq!(kinds.len(), 12, "every kind has at least one rule checked: {kinds:?}");

    let mut failures = Vec::new();
    for case in cases {
        let api = dynamic_api(&client, case.kind, &ns);
        let name = unique("admission");
        let created = api.create(&PostParams::default(), &object(case.kind, &name, case.create.clone())).await;
        let message = match &case.update {
            None => invalid_message(created),
            Some(update) => {
                if let Err(e) = created {
                    failures.push(format!("{} / {}: the valid object was rejected: {e}", case.kind, case.rule));
                    continue;
                }
                let patch = Patch::Merge(json!({ "spec": update }));
                invalid_message(api.patch(&name, &PatchParams::default(), &patch).await)
            }
        };
        let message = match message {
            Ok(m) => m,
            Err(e) => {
                failures.push(format!("{} / {}: {e}", case.kind, case.rule));
                continue;
            }
        };
        for expected in case.expect {
            if !message.contains(expected) {
                failures.push(format!("{} / {}: message {message:?} lacks {expected:?}", case.kind, case.rule));
            }
        }
    }
    assert!(failures.is_empty(), "{} rule(s) misbehaved:\n{}", failures.len(), failures.join("\n"));
}

/// Upstream's manager writes a NetworkFence back whole when it adds its finalizer, with `secret: {}`
/// for a fence that names no Secret (a Go struct): the schema must take it, or upstream's manager
/// could not fence with our CRDs installed.
#[tokio::test]
async fn a_fence_with_the_empty_secret_upstreams_manager_writes_is_accepted() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "admission").await.unwrap();
    let api = dynamic_api(&client, "NetworkFence", &ns);
    let name = unique("admission");
    let fence = object("NetworkFence", &name, with(fence_with_class(), "/secret", json!({})));
    api.create(&PostParams::default(), &fence).await.unwrap();
    let finalizer =
        json!({"metadata": {"finalizers": ["csiaddons.openshift.io/network-fence"]}, "spec": {"secret": {}}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(finalizer)).await.unwrap();
    api.patch(&name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await.unwrap();
}

//! The CRDs on a real API server: installed and Established, samples accepted, printer columns
//! served, and cron-job template metadata kept.
use std::path::PathBuf;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{Value, json};

use crate::harness::support::{dynamic_api, is_namespaced, object, unique};

#[tokio::test]
async fn every_crd_is_established_and_served() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let crds = Api::<CustomResourceDefinition>::all(client);
    let ours = api::crds::all();
    assert_eq!(ours.len(), 12);
    for crd in ours {
        let name = crd.metadata.name.clone().unwrap();
        let live = crds.get(&name).await.unwrap();
        let conditions = live.status.and_then(|s| s.conditions).unwrap_or_default();
        assert!(
            conditions.iter().any(|c| c.type_ == "Established" && c.status == "True"),
            "{name} not Established: {conditions:?}"
        );
        assert!(
            live.spec
                .versions
                .iter()
                .all(|v| v.served && v.storage && v.subresources.as_ref().is_some_and(|s| s.status.is_some()))
        );
    }
}

fn samples() -> Vec<(String, DynamicObject)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config/samples");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        if file == "kustomization.yaml" || !file.ends_with(".yaml") {
            continue;
        }
        let obj: DynamicObject = serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        out.push((file, obj));
    }
    out
}

#[tokio::test]
async fn every_sample_applies() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "samples").await.unwrap();
    let samples = samples();
    let mut kinds: Vec<String> = samples.iter().map(|(_, o)| o.types.as_ref().unwrap().kind.clone()).collect();
    kinds.sort();
    let mut expected: Vec<String> = api::crds::all().into_iter().map(|c| c.spec.names.kind).collect();
    expected.sort();
    assert_eq!(kinds, expected, "config/samples must hold one sample per kind");

    for (file, mut obj) in samples {
        let kind = obj.types.as_ref().unwrap().kind.clone();
        if is_namespaced(&kind) {
            obj.metadata.namespace = Some(ns.clone());
        } else {
            obj.metadata.name = Some(unique("sample"));
        }
        let created = dynamic_api(&client, &kind, &ns).create(&PostParams::default(), &obj).await;
        assert!(created.is_ok(), "{file} rejected: {created:?}");
    }
}

/// Server-side Table output (what `kubectl get` prints) for one object.
async fn table(client: &kube::Client, kind: &str, ns: &str, name: &str) -> Value {
    let ar = crate::harness::support::api_resource(kind);
    let path = if is_namespaced(kind) {
        format!("/apis/{}/{}/namespaces/{ns}/{}/{name}", ar.group, ar.version, ar.plural)
    } else {
        format!("/apis/{}/{}/{}/{name}", ar.group, ar.version, ar.plural)
    };
    let request = http::Request::get(path)
        .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .body(Vec::new())
        .unwrap();
    serde_json::from_str(&client.request_text(request).await.unwrap()).unwrap()
}

/// kind, spec, the columns upstream shows (after Name), and (column, cell) pairs to check.
type ColumnCase = (&'static str, Value, Vec<&'static str>, Vec<(&'static str, Value)>);

#[tokio::test]
async fn printer_columns_appear_in_the_servers_table_output() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "columns").await.unwrap();
    let cases: Vec<ColumnCase> = vec![
        (
            "CSIAddonsNode",
            json!({"driver": {"name": "hostpath.csi.k8s.io", "endpoint": "pod://p.ns:9070", "nodeID": "node-1"}}),
            vec!["namespace", "Age", "DriverName", "Endpoint", "NodeID"],
            vec![("DriverName", json!("hostpath.csi.k8s.io")), ("NodeID", json!("node-1")), ("namespace", json!(ns))],
        ),
        (
            "ReclaimSpaceJob",
            json!({"target": {"persistentVolumeClaim": "pvc-1"}}),
            vec!["Namespace", "Age", "Retries", "Result", "ReclaimedSpace"],
            vec![("Namespace", json!(ns))],
        ),
        (
            "ReclaimSpaceCronJob",
            json!({"schedule": "@weekly", "suspend": true, "jobTemplate": {"spec": {"target": {"persistentVolumeClaim": "pvc-1"}}}}),
            vec!["Schedule", "Suspend", "Active", "Lastschedule", "Lastsuccessfultime", "Age"],
            vec![("Schedule", json!("@weekly")), ("Suspend", json!(true))],
        ),
        (
            "EncryptionKeyRotationJob",
            json!({"target": {"persistentVolumeClaim": "pvc-1"}}),
            vec!["Namespace", "Age", "Retries", "Result"],
            vec![("Namespace", json!(ns))],
        ),
        (
            "EncryptionKeyRotationCronJob",
            json!({"schedule": "0 3 * * 0", "jobTemplate": {"spec": {"target": {"persistentVolumeClaim": "pvc-1"}}}}),
            vec!["Schedule", "Suspend", "Active", "Lastschedule", "Lastsuccessfultime", "Age"],
            vec![("Schedule", json!("0 3 * * 0"))],
        ),
        (
            "NetworkFence",
            json!({"driver": "hostpath.csi.k8s.io", "cidrs": ["10.0.0.1/32"], "secret": {"name": "s", "namespace": "n"}}),
            vec!["Driver", "Cidrs", "FenceState", "Age", "Result"],
            vec![("Driver", json!("hostpath.csi.k8s.io")), ("FenceState", json!("Fenced"))],
        ),
        ("NetworkFenceClass", json!({"provisioner": "hostpath.csi.k8s.io"}), vec!["Age"], vec![]),
        (
            "VolumeReplication",
            json!({"volumeReplicationClass": "vrc", "replicationState": "primary", "dataSource": {"kind": "PersistentVolumeClaim", "name": "pvc-1"}}),
            vec!["Age", "volumeReplicationClass", "SourceKind", "SourceName", "desiredState", "currentState"],
            vec![
                ("SourceKind", json!("PersistentVolumeClaim")),
                ("SourceName", json!("pvc-1")),
                ("desiredState", json!("primary")),
            ],
        ),
        (
            "VolumeReplicationClass",
            json!({"provisioner": "hostpath.csi.k8s.io"}),
            vec!["provisioner", "Age"],
            vec![("provisioner", json!("hostpath.csi.k8s.io"))],
        ),
        (
            "VolumeGroupReplication",
            json!({"volumeGroupReplicationClassName": "vgrc", "volumeGroupReplicationContentName": "content-1", "replicationState": "secondary", "source": {"selector": {"matchLabels": {"a": "b"}}}}),
            vec!["VolumeGroupReplicationClass", "VolumeGroupReplicationContent", "desiredState", "currentState", "Age"],
            vec![
                ("VolumeGroupReplicationClass", json!("vgrc")),
                ("VolumeGroupReplicationContent", json!("content-1")),
                ("desiredState", json!("secondary")),
            ],
        ),
        (
            "VolumeGroupReplicationClass",
            json!({"provisioner": "hostpath.csi.k8s.io"}),
            vec!["provisioner", "Age"],
            vec![("provisioner", json!("hostpath.csi.k8s.io"))],
        ),
        (
            "VolumeGroupReplicationContent",
            json!({"provisioner": "p", "volumeGroupReplicationClassName": "vgrc", "source": {"volumeHandles": ["h1"]},
                   "volumeGroupReplicationRef": {"name": "vgr-1", "namespace": "n", "uid": "u"}}),
            vec!["VolumeGroupReplicationClass", "VolumeGroupReplication", "Age"],
            vec![("VolumeGroupReplicationClass", json!("vgrc")), ("VolumeGroupReplication", json!("vgr-1"))],
        ),
    ];
    for (kind, spec, columns, cells) in cases {
        let name = unique("columns");
        dynamic_api(&client, kind, &ns).create(&PostParams::default(), &object(kind, &name, spec)).await.unwrap();
        let table = table(&client, kind, &ns, &name).await;
        let names: Vec<&str> =
            table["columnDefinitions"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
        let mut expected = vec!["Name"];
        expected.extend(&columns);
        assert_eq!(names, expected, "{kind} columns");
        let row = &table["rows"][0]["cells"];
        assert_eq!(row[0], json!(name), "{kind} Name cell");
        for (column, value) in cells {
            let index = names.iter().position(|n| *n == column).unwrap();
            assert_eq!(row[index], value, "{kind} column {column}");
        }
    }
}

#[tokio::test]
async fn cron_job_template_labels_and_annotations_survive_strict_validation() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "template").await.unwrap();
    for kind in ["ReclaimSpaceCronJob", "EncryptionKeyRotationCronJob"] {
        let plural = crate::harness::support::api_resource(kind).plural;
        let post = |name: &str, metadata: Value| {
            let body = json!({
                "apiVersion": "csiaddons.openshift.io/v1alpha1", "kind": kind,
                "metadata": {"name": name},
                "spec": {"schedule": "@daily", "jobTemplate": {"metadata": metadata, "spec": {"target": {"persistentVolumeClaim": "pvc-1"}}}},
            });
            http::Request::post(format!(
                "/apis/csiaddons.openshift.io/v1alpha1/namespaces/{ns}/{plural}?fieldValidation=Strict"
            ))
            .header("Content-Type", "application/json")
            .body(serde_json::to_vec(&body).unwrap())
            .unwrap()
        };
        // Strict validation is really on: an unknown field in the template's metadata fails.
        let rejected = client.request_text(post("unknown-field", json!({"bogus": "x"}))).await;
        match rejected {
            Err(kube::Error::Api(s)) => assert!(
                s.message.contains("strict decoding error")
                    && s.message.contains("unknown field \"spec.jobTemplate.metadata.bogus\""),
                "{kind}: {}",
                s.message
            ),
            other => panic!("{kind}: an unknown field was accepted under Strict: {other:?}"),
        }
        let metadata = json!({"labels": {"team": "storage"}, "annotations": {"example.com/owner": "ops"}});
        let created: Value =
            serde_json::from_str(&client.request_text(post("with-labels", metadata.clone())).await.unwrap()).unwrap();
        assert_eq!(created["spec"]["jobTemplate"]["metadata"], metadata, "{kind}: create response");
        let stored = dynamic_api(&client, kind, &ns).get("with-labels").await.unwrap();
        assert_eq!(stored.data["spec"]["jobTemplate"]["metadata"], metadata, "{kind}: stored object");
    }
}

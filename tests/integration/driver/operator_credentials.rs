//! The driver operator's secret sync, within the one driver-operator test: the credentials Secret
//! named in the spec is copied into the driver's namespace and kept in step with its source; a
//! class made before keeps its immutable parameters (a Warning says how to renew it), and one made
//! now names the copy; a source the operator may not read is reported, the last copy kept.
use api::csiaddons::NetworkFenceClass;
use api::driver::{DRIVER_NAME, ReferenceCSIDriver};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::harness::driver_operator::{Operator, condition, warning};

const COPY: &str = "reference-driver-credentials";

fn data(secret: &Secret, key: &str) -> Option<Vec<u8>> {
    secret.data.as_ref()?.get(key).map(|b| b.0.clone())
}

pub async fn check(client: &Client, operator: &Operator, namespace: &str, driver_namespace: &str) {
    let drivers: Api<ReferenceCSIDriver> = Api::all(client.clone());
    let sources: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let copies: Api<Secret> = Api::namespaced(client.clone(), driver_namespace);
    let source: Secret = serde_json::from_value(json!({
        "metadata": {"name": "backend-credentials"}, "stringData": {"userKey": "first"}
    }))
    .unwrap();
    sources.create(&PostParams::default(), &source).await.unwrap();
    let named = json!({"spec": {"credentialsSecret": {"name": "backend-credentials", "namespace": namespace}}});
    drivers.patch(DRIVER_NAME, &PatchParams::default(), &Patch::Merge(named)).await.unwrap();
    operator
        .eventually("the copy", async || {
            copies.get_opt(COPY).await.ok()?.filter(|c| data(c, "userKey").as_deref() == Some(b"first"))
        })
        .await;
    let (synced, _, message) = operator
        .eventually("CredentialsSynced", async || condition(&drivers, DRIVER_NAME, "CredentialsSynced").await)
        .await;
    assert!(synced, "{message}");

    // Kept in step: a key changed and one added at the source are in the copy.
    let changed = json!({"data": {"userKey": ByteString(b"second".to_vec()), "userID": ByteString(b"admin".to_vec())}});
    sources.patch("backend-credentials", &PatchParams::default(), &Patch::Merge(changed)).await.unwrap();
    operator
        .eventually("the changed copy", async || {
            let copy = copies.get_opt(COPY).await.ok()??;
            (data(&copy, "userKey").as_deref() == Some(b"second") && data(&copy, "userID").is_some()).then_some(())
        })
        .await;

    // The fence class made before keeps its parameters, and a Warning says how to renew it; made
    // again, it names the copy.
    operator.eventually("a Warning ClassKept", async || warning(client, "ClassKept").await).await;
    let fence_classes: Api<NetworkFenceClass> = Api::all(client.clone());
    fence_classes.delete("reference-csi-fence", &DeleteParams::default()).await.unwrap();
    let renewed = operator
        .eventually("the fence class naming the copy", async || {
            let class = fence_classes.get_opt("reference-csi-fence").await.ok()??;
            class
                .spec
                .parameters
                .filter(|p| p.get("csiaddons.openshift.io/networkfence-secret-name").map(String::as_str) == Some(COPY))
        })
        .await;
    assert_eq!(renewed["csiaddons.openshift.io/networkfence-secret-namespace"], driver_namespace);

    // A Secret of another namespace is not read: said so, and the last copy stays.
    let elsewhere = json!({"spec": {"credentialsSecret": {"name": "backend-credentials", "namespace": "kube-system"}}});
    drivers.patch(DRIVER_NAME, &PatchParams::default(), &Patch::Merge(elsewhere)).await.unwrap();
    let (_, reason, message) = operator
        .eventually("CredentialsSynced False", async || {
            condition(&drivers, DRIVER_NAME, "CredentialsSynced").await.filter(|c| !c.0)
        })
        .await;
    assert_eq!(reason, "NotCopied");
    assert!(message.contains("kube-system/backend-credentials") && message.contains(namespace), "{message}");
    assert!(copies.get_opt(COPY).await.unwrap().is_some(), "the last copy is kept");
    let back = json!({"spec": {"credentialsSecret": {"name": "backend-credentials", "namespace": namespace}}});
    drivers.patch(DRIVER_NAME, &PatchParams::default(), &Patch::Merge(back)).await.unwrap();
}

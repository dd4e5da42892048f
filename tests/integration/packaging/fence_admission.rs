//! The shipped admission policy (deploy/controller/admission-policy.yaml) on the real API server: a
//! NetworkFence of every address is refused at once, in the manager's words, unless an annotation
//! says it is meant; unfencing, other fences, and updates that leave a fence as it was are admitted.
//!
//! The binary's control plane is shared, and other suites show the manager's own refusal of such a
//! fence (it ends Failed): the policy is bound here only to fences with this test's label.
use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::harness::support::{dynamic_api, invalid_message, object, unique};
use crate::packaging::config::{kind, objects, root};

const LABEL: &str = "fence-admission-test";
const MEANT: &str = "csi-addons-rs.io/fence-everything";
/// A driver no sidecar serves: the managers of other suites never fence (nor hold) these objects.
const DRIVER: &str = "admission.test.csi-addons-rs.io";

fn fence(name: &str, cidrs: &[&str], state: &str, annotation: Option<&str>) -> DynamicObject {
    let mut fence = object(
        "NetworkFence",
        name,
        json!({"driver": DRIVER, "cidrs": cidrs, "fenceState": state, "secret": {"name": "s", "namespace": "n"}}),
    );
    fence.metadata.labels = Some([(LABEL.to_owned(), "true".to_owned())].into());
    if let Some(value) = annotation {
        fence.metadata.annotations = Some([(MEANT.to_owned(), value.to_owned())].into());
    }
    fence
}

/// Applies the policy as shipped, and its binding as shipped but limited to this test's fences;
/// gives the test binding's name.
async fn install_policy(client: &Client) -> String {
    let text = std::fs::read_to_string(root().join("deploy/controller/admission-policy.yaml")).unwrap();
    let shipped = objects(&text);
    let kinds: Vec<&str> = shipped.iter().map(kind).collect();
    assert_eq!(kinds, ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]);
    let (policy, binding) = (&shipped[0], &shipped[1]);
    let policy_name = policy.metadata.name.clone().unwrap();
    assert_eq!((&policy.metadata.namespace, &binding.metadata.namespace), (&None, &None), "cluster-scoped");
    // Bound to every NetworkFence, denying: nothing in the shipped binding narrows the policy.
    assert_eq!(binding.data["spec"], json!({"policyName": policy_name, "validationActions": ["Deny"]}));

    let apply = PatchParams::apply("fence-admission-test").force();
    let policy: ValidatingAdmissionPolicy = typed(policy);
    Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .patch(&policy_name, &apply, &Patch::Apply(&policy))
        .await
        .unwrap();
    let mut test_binding = binding.clone();
    let binding_name = unique("fence-admission-test");
    test_binding.metadata.name = Some(binding_name.clone());
    test_binding.data["spec"]["matchResources"] = json!({"objectSelector": {"matchLabels": {LABEL: "true"}}});
    let test_binding: ValidatingAdmissionPolicyBinding = typed(&test_binding);
    let bindings = Api::<ValidatingAdmissionPolicyBinding>::all(client.clone());
    bindings.patch(&binding_name, &apply, &Patch::Apply(&test_binding)).await.unwrap();
    binding_name
}

fn typed<K: serde::de::DeserializeOwned>(object: &DynamicObject) -> K {
    serde_json::from_value(serde_json::to_value(object).unwrap()).unwrap()
}

/// A server-side dry-run create: admission runs, nothing is stored.
async fn try_create(fences: &Api<DynamicObject>, fence: &DynamicObject) -> Result<DynamicObject, kube::Error> {
    fences.create(&PostParams { dry_run: true, ..Default::default() }, fence).await
}

async fn try_patch(fences: &Api<DynamicObject>, name: &str, patch: Value) -> Result<DynamicObject, kube::Error> {
    fences.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await
}

fn assert_refused(result: Result<DynamicObject, kube::Error>, cidr: &str, what: &str) {
    let message = invalid_message(result).unwrap_or_else(|other| panic!("{what}: {other}"));
    let said = format!("cidr \"{cidr}\" fences every address, every node of the cluster included");
    assert!(message.contains(&said), "{what}: {message}");
    assert!(message.contains(&format!("{MEANT}: \"true\"")), "{what}: {message}");
}

fn assert_admitted(result: Result<DynamicObject, kube::Error>, what: &str) {
    assert!(result.is_ok(), "{what}: {:?}", result.err());
}

#[tokio::test]
async fn a_fence_of_every_address_is_refused_at_admission_unless_marked_as_meant() {
    let client = testenv::shared().client().await.unwrap();
    let binding = install_policy(&client).await;
    let fences = dynamic_api(&client, "NetworkFence", "");

    // The API server takes a moment to start enforcing a new policy.
    let everything = fence(&unique("fence-all"), &["10.0.0.1/32", "0.0.0.0/0"], "Fenced", None);
    let enforced =
        testenv::poll::until(testenv::poll::MINUTE, async || try_create(&fences, &everything).await.err()).await;
    assert_refused(enforced.map_or(Ok(everything.clone()), Err), "0.0.0.0/0", "0.0.0.0/0");
    let v6 = fence(&unique("fence-all6"), &["::/0"], "Fenced", None);
    assert_refused(try_create(&fences, &v6).await, "::/0", "::/0");
    let not_true = fence(&unique("fence-yes"), &["0.0.0.0/0"], "Fenced", Some("yes"));
    assert_refused(try_create(&fences, &not_true).await, "0.0.0.0/0", "annotation \"yes\"");

    for (what, admitted) in [
        ("marked as meant", fence(&unique("fence-meant"), &["0.0.0.0/0"], "Fenced", Some("true"))),
        ("unfencing every address", fence(&unique("fence-unfence"), &["0.0.0.0/0", "::/0"], "Unfenced", None)),
        ("a /8 and a /64", fence(&unique("fence-some"), &["10.0.0.0/8", "fd00::/64"], "Fenced", None)),
    ] {
        assert_admitted(try_create(&fences, &admitted).await, what);
    }

    // Updates. A fence of every address, marked as meant, keeps its mark.
    let meant = unique("fence-kept");
    fences.create(&PostParams::default(), &fence(&meant, &["0.0.0.0/0"], "Fenced", Some("true"))).await.unwrap();
    let unmark = json!({"metadata": {"annotations": {MEANT: null}}});
    assert_refused(try_patch(&fences, &meant, unmark).await, "0.0.0.0/0", "the mark taken away");
    let relabel = json!({"metadata": {"labels": {"other": "x"}}});
    assert_admitted(try_patch(&fences, &meant, relabel).await, "a marked fence labelled");
    // Unfenced, the mark may go.
    let unfence = json!({"metadata": {"annotations": {MEANT: null}}, "spec": {"fenceState": "Unfenced"}});
    assert_admitted(try_patch(&fences, &meant, unfence).await, "unfenced, unmarked");

    // A fence admitted before the policy applied to it (here: before it had the label) may be
    // labelled, or have its finalizers removed, while its spec stays; widening it is refused.
    let older = unique("fence-older");
    let mut unlabelled = fence(&older, &["0.0.0.0/0"], "Fenced", None);
    unlabelled.metadata.labels = None;
    fences.create(&PostParams::default(), &unlabelled).await.unwrap();
    let label = json!({"metadata": {"labels": {LABEL: "true"}}});
    assert_admitted(try_patch(&fences, &older, label).await, "labelled as it is");
    let widen = json!({"spec": {"cidrs": ["0.0.0.0/0", "::/0"]}});
    assert_refused(try_patch(&fences, &older, widen).await, "0.0.0.0/0", "its CIDRs changed");

    for name in [&meant, &older] {
        fences.delete(name, &DeleteParams::default()).await.unwrap();
    }
    let bindings = Api::<ValidatingAdmissionPolicyBinding>::all(client.clone());
    bindings.delete(&binding, &DeleteParams::default()).await.unwrap();
}

//! Scorecard in the cluster: `operator-sdk scorecard bundle/` runs each test of the shipped config in a
//! Pod of its own, with the scorecard-test image built here (the cluster's containerd takes the
//! config's quay.io name from its registry) and busybox's tar to unpack the bundle. Every basic and
//! OLM test passes; none is skipped.
use serde_json::Value;

use crate::olm::run;

#[tokio::test]
#[ignore = "needs the one-node cluster with OLM: make test-olm"]
async fn scorecard_runs_every_basic_and_olm_test_in_pods_and_each_passes() {
    let bundle = concat!(env!("CARGO_MANIFEST_DIR"), "/../bundle");
    let registry = std::env::var("CLUSTER_REGISTRY").expect("CLUSTER_REGISTRY (hack/cluster.sh exec sets it)");
    run("kubectl create namespace scorecard --dry-run=client -o yaml | kubectl apply -f -");
    let report = run(&format!(
        "operator-sdk scorecard {bundle} --namespace scorecard --untar-image {registry}/scorecard-untar:busybox \
         --wait-time 180s --output json"
    ));
    let json = &report[report.find('{').expect("a JSON report")..];
    // The report is the first JSON value; operator-sdk's log lines may follow it.
    let first = serde_json::Deserializer::from_str(json).into_iter::<Value>().next();
    let report = first.and_then(Result::ok).unwrap_or_else(|| panic!("a JSON report: {report}"));
    let mut seen = Vec::new();
    for item in report["items"].as_array().expect("one item per test") {
        for result in item["status"]["results"].as_array().into_iter().flatten() {
            let name = result["name"].as_str().unwrap_or_default().to_owned();
            let state = result["state"].as_str().unwrap_or_default();
            assert_eq!(state, "pass", "{name}: {result}");
            println!("scorecard {name}: {state}");
            seen.push(name);
        }
    }
    seen.sort();
    let expected = [
        "basic-check-spec",
        "olm-bundle-validation",
        "olm-crds-have-resources",
        "olm-crds-have-validation",
        "olm-spec-descriptors",
        "olm-status-descriptors",
    ];
    assert_eq!(seen, expected, "every basic and OLM test ran (none skipped)");
    run("kubectl delete namespace scorecard --wait=false");
}

//! The packaging under config/ and build/: `kustomize build config/default` renders what the
//! manager needs, locked down, and every object passes a strict server-side dry-run apply; the
//! ServiceMonitor scrapes a port the Service has; the Dockerfiles build static binaries that exist
//! and run them as a non-root user on pinned bases.
use std::path::Path;
use std::process::Command;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject, PostParams};
use serde::Deserialize;

use crate::harness::support::test_peer;
use crate::packaging::deploy_manifests::collection_path;

pub(crate) const NAMESPACE: &str = "csi-addons-system";

pub(crate) use integration_tests::root;

/// `kustomize build config/<dir>`.
pub(crate) fn kustomize(dir: &str) -> String {
    let out = Command::new(test_peer("KUSTOMIZE", "kustomize.sh"))
        .arg("build")
        .arg(root().join("config").join(dir))
        .output()
        .unwrap();
    assert!(out.status.success(), "kustomize build config/{dir}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

pub(crate) fn objects(text: &str) -> Vec<DynamicObject> {
    serde_yaml::Deserializer::from_str(text).map(|d| DynamicObject::deserialize(d).unwrap()).collect()
}

pub(crate) fn rendered() -> Vec<DynamicObject> {
    objects(&kustomize("default"))
}

/// The release YAMLs under deploy/controller/ with the overlay that renders each.
const RELEASE: [(&str, &str); 4] = [
    ("crds", "crds.yaml"),
    ("rbac", "rbac.yaml"),
    ("setup", "setup-controller.yaml"),
    ("admission", "admission-policy.yaml"),
];

#[test]
fn the_release_yamls_are_what_config_renders() {
    let mut kinds = Vec::new();
    for (overlay, file) in RELEASE {
        let committed = std::fs::read_to_string(root().join("deploy/controller").join(file)).unwrap();
        let body = committed.split_once('\n').map(|(_, rest)| rest).unwrap_or_default();
        let fresh = kustomize(&format!("release/{overlay}"));
        assert!(body == fresh, "deploy/controller/{file} is stale: run `make deploy-yamls`");
        kinds.extend(objects(body).iter().map(|o| format!("{} {:?}", kind(o), o.metadata.name)));
    }
    // Together they are config/default, nothing lost or doubled.
    let mut all: Vec<String> = rendered().iter().map(|o| format!("{} {:?}", kind(o), o.metadata.name)).collect();
    all.sort();
    kinds.sort();
    assert_eq!(kinds, all);
}

/// deploy/driver-operator/driver-operator.yaml is what driver-operator/config/ renders.
#[test]
fn the_driver_operators_release_yaml_is_what_its_config_renders() {
    let committed = std::fs::read_to_string(root().join("deploy/driver-operator/driver-operator.yaml")).unwrap();
    let body = committed.split_once('\n').map(|(_, rest)| rest).unwrap_or_default();
    let fresh = kustomize("../driver-operator/config/default");
    assert!(body == fresh, "deploy/driver-operator/driver-operator.yaml is stale: run `make deploy-yamls`");
    let objects = objects(body);
    let deployment = objects.iter().find(|o| kind(o) == "Deployment").unwrap();
    assert_eq!(deployment.data["spec"]["template"]["spec"]["serviceAccountName"], "reference-driver-operator");
    assert_references_resolve("deploy/driver-operator/", &objects);
}

/// Every name one object gives of another among `objects` resolves: a workload's ServiceAccount,
/// Secrets and ConfigMaps (unless optional), a Service's and a NetworkPolicy's Pod selector, a
/// binding's role and ServiceAccounts, an admission policy binding's policy. The panic lists what does not.
pub(crate) fn assert_references_resolve(what: &str, objects: &[DynamicObject]) {
    let has = |k: &str, namespace: Option<&str>, name: &str| {
        objects.iter().any(|o| {
            kind(o) == k
                && o.metadata.name.as_deref() == Some(name)
                && (namespace.is_none() || o.metadata.namespace.as_deref() == namespace)
        })
    };
    let workloads: Vec<&DynamicObject> =
        objects.iter().filter(|o| ["Deployment", "DaemonSet", "StatefulSet"].contains(&kind(o))).collect();
    let selects_a_workload = |namespace: Option<&str>, selector: &serde_json::Value| {
        let Some(wanted) = selector.as_object().filter(|s| !s.is_empty()) else { return false };
        workloads.iter().filter(|w| w.metadata.namespace.as_deref() == namespace).any(|w| {
            let labels = &w.data["spec"]["template"]["metadata"]["labels"];
            wanted.iter().all(|(k, v)| labels.get(k) == Some(v))
        })
    };
    let mut missing = Vec::new();
    for object in objects {
        let namespace = object.metadata.namespace.as_deref();
        let name = format!("{} {}", kind(object), object.metadata.name.as_deref().unwrap_or_default());
        let mut need = |k: &str, ns: Option<&str>, wanted: &str| {
            if !has(k, ns, wanted) {
                missing.push(format!("{name} names {k} {wanted:?}, which is not there"));
            }
        };
        match kind(object) {
            "Deployment" | "DaemonSet" | "StatefulSet" => {
                let pod = &object.data["spec"]["template"]["spec"];
                if let Some(account) = pod["serviceAccountName"].as_str() {
                    need("ServiceAccount", namespace, account);
                }
                for volume in pod["volumes"].as_array().into_iter().flatten() {
                    let secret = &volume["secret"];
                    if let (Some(secret), false) = (secret["secretName"].as_str(), secret["optional"] == true) {
                        need("Secret", namespace, secret);
                    }
                    let map = &volume["configMap"];
                    if let (Some(map), false) = (map["name"].as_str(), map["optional"] == true) {
                        need("ConfigMap", namespace, map);
                    }
                }
            }
            "Service" if !selects_a_workload(namespace, &object.data["spec"]["selector"]) => {
                missing.push(format!("{name}'s selector matches no workload's Pods"));
            }
            "NetworkPolicy" if !selects_a_workload(namespace, &object.data["spec"]["podSelector"]["matchLabels"]) => {
                missing.push(format!("{name}'s podSelector matches no workload's Pods"));
            }
            "PodDisruptionBudget"
                if !selects_a_workload(namespace, &object.data["spec"]["selector"]["matchLabels"]) =>
            {
                missing.push(format!("{name}'s selector matches no workload's Pods"));
            }
            "RoleBinding" | "ClusterRoleBinding" => {
                let role = &object.data["roleRef"];
                let role_namespace = if role["kind"] == "Role" { namespace } else { None };
                need(
                    role["kind"].as_str().unwrap_or_default(),
                    role_namespace,
                    role["name"].as_str().unwrap_or_default(),
                );
                for subject in object.data["subjects"].as_array().into_iter().flatten() {
                    if subject["kind"] == "ServiceAccount" {
                        let account = subject["name"].as_str().unwrap_or_default();
                        need("ServiceAccount", subject["namespace"].as_str().or(namespace), account);
                    }
                }
            }
            "ValidatingAdmissionPolicyBinding" => {
                need("ValidatingAdmissionPolicy", None, object.data["spec"]["policyName"].as_str().unwrap_or_default());
            }
            _ => {}
        }
    }
    assert!(missing.is_empty(), "{what}: references that do not resolve:\n{}", missing.join("\n"));
}

#[test]
fn every_reference_resolves_in_config_default_and_across_the_release_yamls() {
    assert_references_resolve("config/default", &rendered());
    // The release files are applied together: references may cross them, not leave them.
    let release: Vec<DynamicObject> = RELEASE
        .iter()
        .flat_map(|(_, file)| objects(&std::fs::read_to_string(root().join("deploy/controller").join(file)).unwrap()))
        .collect();
    assert_references_resolve("deploy/controller/", &release);
    // The check bites: the Deployment's ServiceAccount under another name does not resolve.
    let mut renamed = release;
    let deployment = renamed.iter_mut().find(|o| kind(o) == "Deployment").unwrap();
    deployment.data["spec"]["template"]["spec"]["serviceAccountName"] = serde_json::json!("controller-manager");
    let caught = std::panic::catch_unwind(|| assert_references_resolve("renamed", &renamed));
    assert!(caught.is_err(), "a ServiceAccount that is not there went unnoticed");
}

pub(crate) fn kind(object: &DynamicObject) -> &str {
    object.types.as_ref().map_or("", |t| t.kind.as_str())
}

#[tokio::test]
async fn config_default_renders_a_locked_down_manager_that_the_api_server_accepts() {
    let objects = rendered();
    let count = |k: &str| objects.iter().filter(|o| kind(o) == k).count();
    assert_eq!(count("CustomResourceDefinition"), 12);
    // The manager's role, the metrics reader, and upstream's two roles for sidecars.
    for (k, n) in [("Namespace", 1), ("ServiceAccount", 1), ("ClusterRole", 4), ("ClusterRoleBinding", 1)] {
        assert_eq!(count(k), n, "{k}");
    }
    for k in [
        "Role",
        "RoleBinding",
        "Service",
        "Deployment",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        assert_eq!(count(k), 1, "{k}");
    }
    for object in objects.iter().filter(|o| kind(o) != "CustomResourceDefinition") {
        let name = object.metadata.name.as_deref().unwrap_or_default();
        assert!(name.starts_with("csi-addons-"), "{} {name} lacks the prefix", kind(object));
    }
    // The Deployment: non-root, read-only root, no privilege escalation, no capabilities, seccomp.
    let deployment = objects.iter().find(|o| kind(o) == "Deployment").unwrap();
    // One leads, one stands by; a drain or an eviction may take one of them at a time.
    assert_eq!(deployment.data["spec"]["replicas"], 2);
    let budget = objects.iter().find(|o| kind(o) == "PodDisruptionBudget").unwrap();
    assert_eq!(budget.data["spec"]["maxUnavailable"], 1);
    let pod = &deployment.data["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(pod["serviceAccountName"], "csi-addons-controller-manager");
    assert_eq!(pod["priorityClassName"], "system-cluster-critical", "as upstream's bundle");
    let container = &pod["containers"][0];
    assert_eq!(container["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(container["securityContext"]["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert!(container["args"].as_array().unwrap().iter().any(|a| a == "--leader-elect"), "two replicas need the Lease");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    // Upstream's roles for drivers' sidecars, under upstream's names.
    for role in ["csi-addons-csiaddons-events-editor-role", "csi-addons-csiaddons-pvc-editor-role"] {
        assert!(
            objects.iter().any(|o| kind(o) == "ClusterRole" && o.metadata.name.as_deref() == Some(role)),
            "no ClusterRole {role}"
        );
    }
    // The bindings name the prefixed roles and the ServiceAccount in the manager's namespace.
    let binding = objects.iter().find(|o| kind(o) == "ClusterRoleBinding").unwrap();
    assert_eq!(binding.data["roleRef"]["name"], "csi-addons-manager-role");
    assert_eq!(binding.data["subjects"][0]["namespace"], NAMESPACE);

    let client = packaging_cluster().await;
    let prometheus = self::objects(&kustomize("prometheus"));
    assert_eq!(prometheus.iter().map(kind).collect::<Vec<_>>(), ["PrometheusRule", "ServiceMonitor"]);
    // The release YAMLs too (they hold the same objects: the test above).
    let release = RELEASE.iter().flat_map(|(_, file)| {
        self::objects(&std::fs::read_to_string(root().join("deploy/controller").join(file)).unwrap())
    });
    dry_apply_all(&client, objects.into_iter().chain(prometheus).chain(release)).await;
}

/// A client of the shared control plane with the manager's Namespace and the Prometheus Operator's
/// CRDs (for the ServiceMonitor and the alerts) in place.
pub(crate) async fn packaging_cluster() -> kube::Client {
    let client = testenv::shared().client().await.unwrap();
    let namespace: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": NAMESPACE}})).unwrap();
    match Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &namespace).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("creating {NAMESPACE}: {e}"),
    }
    install_prometheus_crds(&client).await;
    client
}

/// Every object passes a strict server-side dry-run apply.
pub(crate) async fn dry_apply_all(client: &kube::Client, objects: impl IntoIterator<Item = DynamicObject>) {
    for object in objects {
        let what = format!("{} {:?}", kind(&object), object.metadata.name);
        let applied = strict_dry_apply(client, object).await;
        assert!(applied.is_ok(), "{what} rejected: {applied:?}");
    }
}

/// The ServiceMonitor and PrometheusRule CRDs (hack/prometheus-crds.sh), installed and served.
async fn install_prometheus_crds(client: &kube::Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let dir = test_peer("PROMETHEUS_CRDS", "prometheus-crds.sh");
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    for file in ["monitoring.coreos.com_servicemonitors.yaml", "monitoring.coreos.com_prometheusrules.yaml"] {
        let crd: CustomResourceDefinition =
            serde_yaml::from_str(&std::fs::read_to_string(dir.join(file)).unwrap()).unwrap();
        let name = crd.metadata.name.clone().unwrap();
        match crds.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("installing {file}: {e}"),
        }
        let established = kube::runtime::wait::conditions::is_crd_established();
        let wait = kube::runtime::wait::await_condition(crds.clone(), &name, established);
        tokio::time::timeout(std::time::Duration::from_secs(30), wait).await.unwrap().unwrap();
    }
}

/// The series names an expression uses (ours and controller-runtime's), histogram suffixes off.
fn series(expr: &str) -> Vec<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| {
            ["csi_addons_", "controller_runtime_", "leader_election_", "workqueue_"].iter().any(|p| w.starts_with(p))
        })
        .map(|w| w.trim_end_matches("_bucket").trim_end_matches("_count").trim_end_matches("_sum").to_owned())
        .collect()
}

#[test]
fn the_dashboard_and_the_alerts_use_only_series_the_manager_serves() {
    let registered = std::fs::read_to_string(root().join("operator/src/metrics.rs")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("config/grafana/csi-addons-dashboard.json")).unwrap(),
    )
    .unwrap();
    let rules: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(root().join("config/prometheus/rules.yaml")).unwrap()).unwrap();
    let mut expressions: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter().map(|t| t["expr"].as_str().unwrap().to_owned()))
        .collect();
    let alerts: Vec<&serde_yaml::Value> = rules["spec"]["groups"][0]["rules"].as_sequence().unwrap().iter().collect();
    expressions.extend(alerts.iter().map(|r| r["expr"].as_str().unwrap().to_owned()));
    let mut used = Vec::new();
    for expr in &expressions {
        let names = series(expr);
        assert!(!names.is_empty(), "{expr} uses none of the manager's series");
        for name in names {
            assert!(
                registered.contains(&format!("\"{name}\"")),
                "{expr}: {name} is not a series the manager registers"
            );
            used.push(name);
        }
    }
    for wanted in [
        "csi_addons_operations_total",
        "csi_addons_operation_duration_seconds",
        "csi_addons_reclaimed_bytes_total",
        "csi_addons_sidecar_connections",
        "controller_runtime_reconcile_errors_total",
    ] {
        assert!(used.iter().any(|u| u == wanted), "the dashboard shows no {wanted}");
    }
    let alert_names: Vec<&str> = alerts.iter().filter_map(|r| r["alert"].as_str()).collect();
    for wanted in ["CSIAddonsOperationsFailing", "CSIAddonsSidecarUnreachable", "CSIAddonsManagerWithoutLeader"] {
        assert!(alert_names.contains(&wanted), "no alert {wanted}");
    }
}

/// Server-side apply with `dryRun=All&fieldValidation=Strict` (objects that exist already, such
/// as the CRDs the test control plane installed, are compared, not refused).
async fn strict_dry_apply(client: &kube::Client, object: DynamicObject) -> Result<String, kube::Error> {
    let (collection, _) = collection_path(client, &object, NAMESPACE).await?;
    let name = object.metadata.name.clone().unwrap_or_default();
    let query = "dryRun=All&fieldValidation=Strict&fieldManager=packaging-test&force=true";
    let request = http::Request::patch(format!("{collection}/{name}?{query}"))
        .header("Content-Type", "application/apply-patch+yaml")
        .body(serde_json::to_vec(&object).unwrap())
        .unwrap();
    client.request_text(request).await
}

#[test]
fn the_service_monitor_scrapes_a_port_the_metrics_service_has() {
    let read = |file: &str| -> serde_yaml::Value {
        serde_yaml::from_str(&std::fs::read_to_string(root().join(file)).unwrap()).unwrap()
    };
    let monitor = read("config/prometheus/monitor.yaml");
    let service = read("config/manager/metrics_service.yaml");
    let port = monitor["spec"]["endpoints"][0]["port"].as_str().unwrap();
    let names: Vec<&str> =
        service["spec"]["ports"].as_sequence().unwrap().iter().filter_map(|p| p["name"].as_str()).collect();
    assert!(names.contains(&port), "the ServiceMonitor scrapes {port:?}; the Service has {names:?}");
    assert_eq!(
        monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"],
        "the monitor selects the Service"
    );
}

/// What can be checked of a Dockerfile without an engine: every base pinned to a version, scratch,
/// an earlier stage or a build argument whose default is one; the final stage's base and user as
/// `runtime` and `user` say; every binary the final stage copies is one the `compiled` stage's
/// `cargo build` makes (in a profile the workspace defines, of a bin it declares) and puts in /out,
/// where `--build-arg BINARIES=<image>` must hold it too.
fn check_dockerfile(path: &Path, runtime: &str, user: Option<u32>) {
    let text = std::fs::read_to_string(path).unwrap();
    let what = path.display();
    let args: std::collections::HashMap<&str, &str> =
        text.lines().filter_map(|l| l.strip_prefix("ARG ")).filter_map(|a| a.split_once('=')).collect();
    let mut stages: Vec<&str> = Vec::new();
    let mut last_base = "";
    for line in text.lines().filter_map(|l| l.strip_prefix("FROM ")) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let mut base = words[0];
        if let Some(arg) = base.strip_prefix("${").and_then(|b| b.strip_suffix('}')) {
            base = args.get(arg).unwrap_or_else(|| panic!("{what}: FROM ${{{arg}}} has no default"));
        }
        let tag = base.rsplit_once(':').map(|(_, t)| t);
        let pinned = base == "scratch"
            || stages.contains(&base)
            || base.contains("@sha256:")
            || tag.is_some_and(|t| t.chars().next().is_some_and(|c| c.is_ascii_digit()));
        assert!(pinned, "{what}: base {base} is neither an earlier stage nor pinned to a version");
        if let Some(name) = words.iter().position(|w| w.eq_ignore_ascii_case("as")).map(|i| words[i + 1]) {
            stages.push(name);
        }
        last_base = words[0];
    }
    assert_eq!(last_base, runtime, "{what}: the final stage's base");
    assert_eq!(args.get("BINARIES"), Some(&"compiled"), "{what}: binaries are compiled unless told otherwise");
    assert!(text.contains("FROM ${BINARIES} AS binaries"), "{what}: the final stage takes binaries from one place");
    let final_stage = &text[text.rfind("\nFROM ").unwrap()..];
    match user {
        Some(uid) => {
            let set = final_stage.lines().filter_map(|l| l.strip_prefix("USER ")).next_back();
            let set = set.unwrap_or_else(|| panic!("{what}: no USER"));
            let n: u32 =
                set.split(':').next().unwrap().parse().unwrap_or_else(|_| panic!("{what}: USER {set} is not numeric"));
            assert_eq!(n, uid, "{what}: USER");
        }
        None => assert!(!final_stage.contains("\nUSER "), "{what}: runs as root, as drivers' sockets and mounts need"),
    }
    let build = text.lines().find(|l| l.contains("cargo build")).unwrap_or_else(|| panic!("{what}: no cargo build"));
    let words: Vec<&str> = build.split_whitespace().collect();
    let after = |flag: &str| words.iter().position(|w| *w == flag).map(|i| words[i + 1]).unwrap();
    let (profile, target) = (after("--profile"), after("--target"));
    let built: Vec<&str> = words.windows(2).filter(|w| w[0] == "--bin").map(|w| w[1]).collect();
    let cargo = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    assert!(cargo.contains(&format!("[profile.{profile}]")), "{what}: no profile {profile}");
    let install = text
        .lines()
        .find(|l| l.contains("install -D -t /out"))
        .unwrap_or_else(|| panic!("{what}: nothing put in /out"));
    let installed: Vec<&str> = install.split_whitespace().filter(|w| w.starts_with("target/")).collect();
    for path in &installed {
        let bin = path.rsplit('/').next().unwrap();
        assert_eq!(*path, format!("target/{target}/{profile}/{bin}"), "{what}: {install}");
        assert!(built.contains(&bin), "{what}: {bin} is installed but not built");
    }
    let copies: Vec<&str> = final_stage.lines().filter(|l| l.starts_with("COPY --from=binaries")).collect();
    assert!(!copies.is_empty(), "{what}: the final stage copies no binary");
    for copy in copies {
        let source = copy.split_whitespace().nth(2).unwrap();
        let bin = source.strip_prefix("/out/").unwrap_or_else(|| panic!("{what}: {copy} is not from /out"));
        assert!(installed.iter().any(|p| p.ends_with(&format!("/{bin}"))), "{what}: {bin} is copied but not built");
        let declared = ["operator/Cargo.toml", "sidecar/Cargo.toml", "driver/Cargo.toml", "driver-operator/Cargo.toml"]
            .iter()
            .any(|m| std::fs::read_to_string(root().join(m)).unwrap().contains(&format!("name = \"{bin}\"")));
        assert!(declared, "{what}: no [[bin]] {bin} in the workspace");
    }
}

#[test]
fn the_dockerfiles_run_static_binaries_on_pinned_bases() {
    check_dockerfile(&root().join("build/manager.Dockerfile"), "scratch", Some(65532));
    check_dockerfile(&root().join("build/sidecar.Dockerfile"), "scratch", None);
    check_dockerfile(&root().join("build/driver.Dockerfile"), "${BASE}", None);
    check_dockerfile(&root().join("build/driver-operator.Dockerfile"), "scratch", Some(65532));
    let ignore = std::fs::read_to_string(root().join(".dockerignore")).unwrap();
    assert!(ignore.lines().any(|l| l == "target/"), "the build context leaves target/ out");
}

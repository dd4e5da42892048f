//! Prometheus scrapes the manager the way users set it up. The Prometheus Operator runs a Prometheus
//! (hack/prometheus.sh: both built here); the README's "Prometheus Operator" commands, run word for
//! word, apply config/prometheus (the ServiceMonitor and the PrometheusRule) and bind Prometheus's
//! own ServiceAccount to `csi-addons-metrics-reader`. Before that binding the manager refuses the
//! scrape (403), after it the target is up over HTTPS. Then the story runs, with a step that fails
//! on purpose, and every Grafana panel's query returns series, the alerts load, and
//! controller-runtime's series and ours are there. `make test-olm` runs this last, on the manager
//! and driver installed from the release YAMLs.
use std::cell::Cell;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testenv::poll;

use crate::cluster;
use crate::driver_pods::{WORKLOADS, csiaddons};
use crate::olm::{readme_commands, run};

const PROMETHEUS: &str = "/api/v1/namespaces/monitoring/services/prometheus-operated:web/proxy";
/// The manager's scrape pool, as the Prometheus Operator names it from the ServiceMonitor.
const POOL: &str = "serviceMonitor/csi-addons-system/controller-manager-metrics-monitor/0";
/// Long enough for the operator to write Prometheus's configuration, the kubelet to update the
/// mounted copy (about a minute), and the manager's cached review of the token (a minute) to expire.
const CONFIGURED: Duration = Duration::from_secs(240);

/// A GET of Prometheus's HTTP API, through the API server's Service proxy; its `data`.
async fn prometheus_api(client: &Client, path: &str) -> Option<Value> {
    let request = http::Request::get(format!("{PROMETHEUS}{path}")).body(Vec::new()).ok()?;
    let text = client.request_text(request).await.ok()?;
    let reply: Value = serde_json::from_str(&text).ok()?;
    (reply["status"] == "success").then(|| reply["data"].clone())
}

/// The manager's scrape targets as Prometheus sees them, one per Pod: (health, last error).
async fn manager_targets(client: &Client) -> Vec<(String, String)> {
    let Some(targets) = prometheus_api(client, "/api/v1/targets?state=active").await else { return Vec::new() };
    let active = targets["activeTargets"].as_array().map(Vec::as_slice).unwrap_or_default();
    active
        .iter()
        .filter(|t| t["scrapePool"] == POOL)
        .map(|t| {
            let text = |key: &str| t[key].as_str().unwrap_or_default().to_owned();
            (text("health"), text("lastError"))
        })
        .collect()
}

/// An instant query's result vector.
async fn query(client: &Client, expression: &str) -> Vec<Value> {
    let encoded = cluster_client::proxy::percent_encoded(expression);
    let data = prometheus_api(client, &format!("/api/v1/query?query={encoded}")).await;
    data.and_then(|d| d["result"].as_array().cloned()).unwrap_or_default()
}

/// The metric names matching a name pattern that Prometheus holds for the manager's target.
async fn names(client: &Client, pattern: &str) -> BTreeSet<String> {
    let result = query(client, &format!("count by (__name__) ({{__name__=~\"{pattern}\",job!=\"\"}})")).await;
    result.iter().filter_map(|s| s["metric"]["__name__"].as_str().map(str::to_owned)).collect()
}

#[tokio::test]
#[ignore = "needs the one-node cluster with the Prometheus Operator: make test-olm"]
async fn prometheus_scrapes_the_manager_with_its_token_and_every_panel_has_series() {
    let client = cluster::client().await;
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let commands = readme_commands("Prometheus Operator");
    let [apply, bind] = commands.as_slice() else { panic!("two commands: {commands:?}") };
    assert!(apply.contains("config/prometheus") && bind.contains("csi-addons-metrics-reader"), "{commands:?}");

    println!("$ {apply}\n{}", run(&format!("cd {root} && {apply}")));
    let refused = poll::until(CONFIGURED, async || {
        let targets = manager_targets(&client).await;
        let refused = targets.iter().any(|(health, error)| health == "down" && error.contains("403"));
        (refused && targets.iter().all(|(health, _)| health != "up")).then_some(targets)
    })
    .await;
    let refused = refused.expect("Prometheus scrapes the manager and, not yet bound, is refused");
    println!("before the binding, the targets are down: {refused:?}");

    println!("$ {bind}\n{}", run(&format!("cd {root} && {bind}")));
    // Every manager Pod's target, the standby's too: each Pod keeps its refusal for up to a minute
    // after the binding, and a Pod first scraped after the failing step would show no increase.
    let managers = cluster::running_pods(&client, cluster::MANAGER_NAMESPACE, cluster::MANAGER_SELECTOR).await.len();
    let bound = Instant::now();
    let first_up = Cell::new(None);
    let up = poll::until(CONFIGURED, async || {
        let targets = manager_targets(&client).await;
        if first_up.get().is_none() && targets.iter().any(|(health, _)| health == "up") {
            first_up.set(Some(bound.elapsed()));
        }
        (targets.len() >= managers && targets.iter().all(|(health, _)| health == "up")).then_some(targets.len())
    })
    .await;
    let Some(up) = up else {
        panic!(
            "every one of the {managers} manager Pods' targets is up once Prometheus's ServiceAccount is bound: {:?}",
            manager_targets(&client).await
        );
    };
    println!(
        "{POOL}: {up} targets up, over HTTPS with Prometheus's ServiceAccount token: the first {:.0?} after the \
         binding, all {:.0?} after it",
        first_up.get().unwrap_or_default(),
        bound.elapsed()
    );

    let steps = crate::story::tell(&client).await;
    println!("the story: {} steps", steps.len());
    fail_on_purpose(&client).await;

    // Scraped every 5 s: the failures show as increases within a few scrapes (the counters are
    // served from 0, so the first failure is one). The window spans the whole story.
    let failed = poll::until(2 * poll::MINUTE, async || {
        let failed = query(&client, "increase(csi_addons_operations_total{result=\"Failed\"}[10m]) > 0").await;
        let errors = query(&client, "increase(controller_runtime_reconcile_errors_total[10m]) > 0").await;
        (!failed.is_empty() && !errors.is_empty()).then_some((failed, errors))
    })
    .await;
    let Some((failed, errors)) = failed else {
        // What Prometheus holds, sample by sample, to tell a counter that never rose from one
        // first scraped after it rose or one that restarted.
        let history = async |selector: &str| samples_text(&query(&client, &format!("{selector}[10m]")).await);
        let managers = cluster::running_pods(&client, cluster::MANAGER_NAMESPACE, cluster::MANAGER_SELECTOR).await;
        let leader = cluster::leading_manager(&client, cluster::MANAGER_NAMESPACE).await.map(|p| cluster::name(&p));
        panic!(
            "the failing step's operation and reconcile error are scraped as increases; Prometheus holds, \
             over 10 minutes, the failed ReclaimSpaceJobs: {}; the reclaimspacejob reconcile errors: {}; \
             the manager's Pods (restarts {}, leader {leader:?}): {}",
            history("csi_addons_operations_total{kind=\"ReclaimSpaceJob\",result=\"Failed\"}").await,
            history("controller_runtime_reconcile_errors_total{controller=\"reclaimspacejob\"}").await,
            cluster::container_restarts(&managers),
            managers
                .iter()
                .map(|p| format!(
                    "{} started {:?}",
                    cluster::name(p),
                    p.status.as_ref().and_then(|s| s.start_time.as_ref())
                ))
                .collect::<Vec<_>>()
                .join("; "),
        );
    };
    println!("failed operations, increase over 10m: {}", series_text(&failed));
    println!("reconcile errors, increase over 10m: {}", series_text(&errors));

    let ours = names(&client, "csi_addons_.+").await;
    let runtime = names(&client, "controller_runtime_.+").await;
    println!("series scraped: ours {ours:?}; controller-runtime's {runtime:?}");
    for wanted in ["csi_addons_operations_total", "csi_addons_sidecar_connections", "csi_addons_reclaimed_bytes_total"]
    {
        assert!(ours.contains(wanted), "{wanted} scraped: {ours:?}");
    }
    for wanted in ["controller_runtime_reconcile_total", "controller_runtime_reconcile_errors_total"] {
        assert!(runtime.contains(wanted), "{wanted} scraped: {runtime:?}");
    }

    // Every panel of the dashboard has data after the story.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{root}/config/grafana/csi-addons-dashboard.json")).unwrap(),
    )
    .unwrap();
    let panels = dashboard["panels"].as_array().expect("panels");
    for panel in panels {
        let title = panel["title"].as_str().unwrap_or("?");
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expression = target["expr"].as_str().expect("a panel query");
            let result = query(&client, expression).await;
            assert!(!result.is_empty(), "panel {title:?}: `{expression}` returns no series");
            println!("panel {title:?}: {}", series_text(&result));
        }
    }

    // The alerts load and are evaluated without error; the failed operation makes
    // CSIAddonsOperationsFailing pending (it fires after 15 minutes of failures).
    let rules = poll::until(poll::MINUTE, async || {
        let groups = prometheus_api(&client, "/api/v1/rules").await?;
        let group = groups["groups"].as_array()?.iter().find(|g| g["name"] == "csi-addons")?.clone();
        let rules = group["rules"].as_array()?.clone();
        let evaluated = rules.iter().all(|r| r["health"] == "ok");
        let pending = rules.iter().any(|r| r["name"] == "CSIAddonsOperationsFailing" && r["state"] == "pending");
        (evaluated && pending).then_some(rules)
    })
    .await;
    let rules = rules.expect("the PrometheusRule's 4 alerts evaluate without error and the failure makes one pending");
    assert_eq!(rules.len(), 4, "{rules:?}");
    for rule in &rules {
        println!("alert {}: {}, health {}", rule["name"], rule["state"], rule["health"]);
    }
}

/// A cluster policy that refuses the manager's status write of one ReclaimSpaceJob: a real
/// admission refusal, which the manager counts as a reconcile error.
const REFUSING_POLICY: &str = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: refuses-on-purpose}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: [csiaddons.openshift.io]
      apiVersions: [v1alpha1]
      operations: [UPDATE]
      resources: [reclaimspacejobs/status]
  validations:
  - expression: "!(object.metadata.name in ['refused-on-purpose', 'fails-on-purpose'])"
    message: a cluster policy refuses this job's status
    reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: refuses-on-purpose}
spec: {policyName: refuses-on-purpose, validationActions: [Deny]}
"#;

fn reclaim_job(name: &str, claim: &str, back_off_limit: i32) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "csiaddons.openshift.io/v1alpha1", "kind": "ReclaimSpaceJob",
        "metadata": {"name": name},
        "spec": {"target": {"persistentVolumeClaim": claim}, "backOffLimit": back_off_limit}
    }))
    .unwrap()
}

/// The status of job `name` once it has a result.
async fn job_result(jobs: &Api<DynamicObject>, name: &str, limit: Duration) -> Option<Value> {
    poll::until(limit, async || {
        let status = jobs.get(name).await.ok()?.data.get("status")?.clone();
        status["result"].is_string().then_some(status)
    })
    .await
}

/// A step that fails on purpose, twice. A ReclaimSpaceJob names a PVC that does not exist: retried
/// once (a PVC may yet come), its operation ends Failed. A cluster policy refuses the status write of
/// another: its reconcile fails until the policy goes, and then its result is written.
async fn fail_on_purpose(client: &Client) {
    let jobs = csiaddons(client, "ReclaimSpaceJob", WORKLOADS);
    jobs.create(&PostParams::default(), &reclaim_job("fails-on-purpose", "no-such-claim", 1)).await.unwrap();
    let status = job_result(&jobs, "fails-on-purpose", poll::MINUTE).await.expect("the job ends");
    assert_eq!(status["result"], "Failed", "{status}");
    println!("ReclaimSpaceJob fails-on-purpose: Failed: {}", status["message"]);

    run(&format!("kubectl apply -f - <<'EOF'{REFUSING_POLICY}EOF"));
    // The API server takes the policy in after a while (a job made before would pass): it is in
    // force once it refuses a dry-run status write of the finished job it also names.
    let probe = PatchParams { dry_run: true, ..PatchParams::default() };
    let in_force = poll::until(poll::MINUTE, async || {
        let body = json!({"status": {"message": "probe"}});
        let refused = jobs.patch_status("fails-on-purpose", &probe, &Patch::Merge(&body)).await.err()?;
        refused.to_string().contains("a cluster policy refuses").then_some(())
    })
    .await;
    assert!(in_force.is_some(), "the API server enforces the refusing policy");
    jobs.create(&PostParams::default(), &reclaim_job("refused-on-purpose", "story", 6)).await.unwrap();
    // Prometheus sees the rise once it has scraped the leader twice since the first refusal.
    let refused = poll::until(2 * poll::MINUTE, async || {
        let errors = query(
            client,
            "increase(controller_runtime_reconcile_errors_total{controller=\"reclaimspacejob\"}[5m]) > 0",
        )
        .await;
        (!errors.is_empty()).then_some(errors)
    })
    .await;
    assert!(refused.is_some(), "the refused status write is a reconcile error in Prometheus");
    run("kubectl delete validatingadmissionpolicybinding,validatingadmissionpolicy refuses-on-purpose");
    // Refused (403), as by RBAC: the manager tries again within a minute.
    let status = job_result(&jobs, "refused-on-purpose", 3 * poll::MINUTE)
        .await
        .expect("the refused job's result is written once the policy goes");
    println!("ReclaimSpaceJob refused-on-purpose: its status refused by a policy, then written: {}", status["result"]);
}

/// A range query's series, each as its Pod and the samples where its value changed (Unix seconds).
fn samples_text(result: &[Value]) -> String {
    let series: Vec<String> = result
        .iter()
        .map(|s| {
            let mut changes = Vec::new();
            let mut last = None;
            let samples = s["values"].as_array().map(Vec::as_slice).unwrap_or_default();
            for sample in samples {
                let value = sample[1].as_str().unwrap_or("?");
                if last != Some(value) {
                    changes.push(format!("{}={value}", sample[0]));
                    last = Some(value);
                }
            }
            format!("{} ({} samples): {}", s["metric"]["pod"], samples.len(), changes.join(" "))
        })
        .collect();
    series.join("; ")
}

/// A query's series, each as its labels and value, the largest values first.
fn series_text(result: &[Value]) -> String {
    let value = |s: &Value| s["value"][1].as_str().and_then(|v| v.parse::<f64>().ok()).filter(|v| !v.is_nan());
    let mut sorted: Vec<&Value> = result.iter().collect();
    sorted.sort_by(|a, b| value(b).unwrap_or(f64::MIN).total_cmp(&value(a).unwrap_or(f64::MIN)));
    let shown: Vec<String> = sorted
        .into_iter()
        .take(6)
        .map(|s| {
            let labels: Vec<String> = s["metric"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .filter(|(k, _)| {
                            !["instance", "job", "pod", "service", "endpoint", "container"].contains(&k.as_str())
                        })
                        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                        .collect()
                })
                .unwrap_or_default();
            format!("{{{}}} {}", labels.join(","), s["value"][1].as_str().unwrap_or("?"))
        })
        .collect();
    let more = result.len().saturating_sub(shown.len());
    if more > 0 { format!("{} (+{more} more)", shown.join("; ")) } else { shown.join("; ") }
}

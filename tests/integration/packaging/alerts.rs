//! The PrometheusRule of config/prometheus, unit-tested with promtool (Debian's Prometheus 2.42,
//! hack/prometheus-deb.sh): each alert fires from synthetic series of the kind the manager exports,
//! with the labels it promises, and stays quiet on healthy ones. Also `promtool check metrics`, which
//! the manager's and the sidecar's suites run on their /metrics.
use std::process::Command;

use serde_json::Value;

use crate::harness::support::test_peer;
use crate::packaging::config::root;

/// promtool's unit tests: for each alert, a failing series (it fires) and a healthy one (it does not).
const TESTS: &str = r#"
rule_files: [rules.yaml]
evaluation_interval: 1m
tests:
- interval: 1m
  input_series:
  - series: 'csi_addons_operations_total{namespace="csi-addons-system",kind="ReclaimSpaceJob",result="Failed"}'
    values: '0+1x60'
  - series: 'csi_addons_operations_total{namespace="csi-addons-system",kind="NetworkFence",result="Failed"}'
    values: '3x60'
  - series: 'csi_addons_operations_total{namespace="csi-addons-system",kind="NetworkFence",result="Succeeded"}'
    values: '0+5x60'
  alert_rule_test:
  - eval_time: 10m
    alertname: CSIAddonsOperationsFailing
    exp_alerts: []
  - eval_time: 40m
    alertname: CSIAddonsOperationsFailing
    exp_alerts:
    - exp_labels: {severity: warning, namespace: csi-addons-system, kind: ReclaimSpaceJob}
      exp_annotations:
        summary: "CSI-Addons ReclaimSpaceJob operations are failing"
        description: "30 ReclaimSpaceJob operations failed in the last 30 minutes; the failed objects' status and Warning events say why."
- interval: 1m
  input_series:
  - series: 'csi_addons_sidecar_connections{namespace="csi-addons-system",state="retrying"}'
    values: '2x30'
  - series: 'csi_addons_sidecar_connections{namespace="csi-addons-system",state="connected"}'
    values: '3x30'
  - series: 'csi_addons_sidecar_connections{namespace="healthy",state="connected"}'
    values: '3x30'
  - series: 'csi_addons_sidecar_connections{namespace="healthy",state="retrying"}'
    values: '0x30'
  alert_rule_test:
  - eval_time: 5m
    alertname: CSIAddonsSidecarUnreachable
    exp_alerts: []
  - eval_time: 20m
    alertname: CSIAddonsSidecarUnreachable
    exp_alerts:
    - exp_labels: {severity: warning, namespace: csi-addons-system}
      exp_annotations:
        summary: "The CSI-Addons manager cannot reach some sidecars"
        description: "2 CSIAddonsNodes are retrying or failed for 10 minutes; operations on their nodes wait."
- interval: 1m
  input_series:
  - series: 'leader_election_master_status{namespace="csi-addons-system",name="e8cd140a.openshift.io",pod="a"}'
    values: '0x20'
  - series: 'leader_election_master_status{namespace="csi-addons-system",name="e8cd140a.openshift.io",pod="b"}'
    values: '0x20'
  - series: 'leader_election_master_status{namespace="healthy",name="e8cd140a.openshift.io",pod="c"}'
    values: '1x20'
  alert_rule_test:
  - eval_time: 3m
    alertname: CSIAddonsManagerWithoutLeader
    exp_alerts: []
  - eval_time: 10m
    alertname: CSIAddonsManagerWithoutLeader
    exp_alerts:
    - exp_labels: {severity: critical, namespace: csi-addons-system}
      exp_annotations:
        summary: "No CSI-Addons manager leads"
        description: "No manager has held the leader Lease for 5 minutes: no CSI-Addons operation runs."
  - eval_time: 15m
    alertname: CSIAddonsManagerDown
    exp_alerts: []
- interval: 1m
  input_series:
  - series: 'up{job="something-else"}'
    values: '1x20'
  alert_rule_test:
  - eval_time: 5m
    alertname: CSIAddonsManagerDown
    exp_alerts: []
  - eval_time: 15m
    alertname: CSIAddonsManagerDown
    exp_alerts:
    - exp_labels: {severity: critical, name: e8cd140a.openshift.io}
      exp_annotations:
        summary: "No CSI-Addons manager is scraped"
        description: "No manager has reported metrics for 10 minutes."
"#;

/// What `promtool check metrics` finds wrong with an exposition (naming, help, types); empty if nothing.
pub fn metric_lint(exposition: &str) -> String {
    use std::io::Write;
    let tool = test_peer("PROMETHEUS_DEB_DIR", "prometheus-deb.sh").join("promtool");
    let mut child = Command::new(tool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(exposition.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if out.status.success() { String::new() } else { text }
}

fn promtool(dir: &std::path::Path, args: &[&str]) -> (bool, String) {
    let tool = test_peer("PROMETHEUS_DEB_DIR", "prometheus-deb.sh").join("promtool");
    let out = Command::new(tool).args(args).current_dir(dir).output().unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// The PrometheusRule's `spec` (its rule groups) as a rule file, in `dir`.
fn rule_file(dir: &std::path::Path, edit: impl FnOnce(&mut Value)) {
    let text = std::fs::read_to_string(root().join("config/prometheus/rules.yaml")).unwrap();
    let rule: Value = serde_yaml::from_str(&text).unwrap();
    let mut spec = rule["spec"].clone();
    edit(&mut spec);
    std::fs::write(dir.join("rules.yaml"), serde_yaml::to_string(&spec).unwrap()).unwrap();
    std::fs::write(dir.join("tests.yaml"), TESTS).unwrap();
}

#[test]
fn every_alert_fires_on_failing_series_and_stays_quiet_on_healthy_ones() {
    let dir = tempfile::tempdir().unwrap();
    rule_file(dir.path(), |_| {});
    let (ok, out) = promtool(dir.path(), &["check", "rules", "rules.yaml"]);
    assert!(ok, "{out}");
    let (ok, out) = promtool(dir.path(), &["test", "rules", "tests.yaml"]);
    assert!(ok, "{out}");
}

/// The unit tests bite: an alert that waits longer than its test expects fails them.
#[test]
fn a_slower_alert_fails_the_unit_tests() {
    let dir = tempfile::tempdir().unwrap();
    rule_file(dir.path(), |spec| spec["groups"][0]["rules"][2]["for"] = "30m".into());
    let (ok, out) = promtool(dir.path(), &["test", "rules", "tests.yaml"]);
    assert!(!ok && out.contains("CSIAddonsManagerWithoutLeader"), "{out}");
}

//! The manager process against the real API server: probes, metrics, leader election between two
//! managers, a dead API server on /readyz, an API server that goes away, and a bad ConfigMap value
//! at start.
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};

use crate::harness::manager::Manager;
use crate::harness::sidecar::{free_port, http_get};

#[tokio::test]
async fn probes_and_metrics_follow_the_api_server() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "manager").await.unwrap();
    let manager = Manager::start(&namespace, cp.kubeconfig_path(), &[]);
    manager.eventually("/readyz 200", async |m| matches!(http_get(m.health, "/readyz").await, Some((200, _)))).await;
    assert!(matches!(http_get(manager.health, "/healthz").await, Some((200, _))));
    assert_eq!(manager.leading().await, Some(true), "without --leader-elect the manager leads");
    // Each API request counted as client-go counts it, by code, method and the API server's address.
    let host = cp.server_url().trim_start_matches("https://").trim_end_matches('/').to_owned();
    let (_, metrics) = http_get(manager.metrics, "/metrics").await.unwrap();
    let counted = format!("rest_client_requests_total{{code=\"200\",host=\"{host}\",method=\"GET\"}}");
    assert!(metrics.contains(&counted), "{counted} in:\n{metrics}");

    // A kubeconfig naming an address where no API server listens.
    let dead = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(cp.kubeconfig_path()).unwrap();
    let text = text.replace(cp.server_url(), &format!("https://127.0.0.1:{}", free_port()));
    let dead_config = dead.path().join("kubeconfig");
    std::fs::write(&dead_config, text).unwrap();
    let lost = Manager::start(&namespace, &dead_config, &[]);
    lost.eventually("/healthz 200", async |m| matches!(http_get(m.health, "/healthz").await, Some((200, _)))).await;
    lost.eventually(
        "/readyz 503 naming the API server",
        async |m| matches!(http_get(m.health, "/readyz").await, Some((503, body)) if body.contains("CSIAddonsNodes")),
    )
    .await;
    let (_, metrics) = http_get(lost.metrics, "/metrics").await.unwrap();
    assert!(metrics.contains("rest_client_requests_total{code=\"<error>\""), "requests without an answer:\n{metrics}");
}

/// A TCP relay to the API server that can be cut: then it closes every relayed connection and
/// every new one at once, counting the new ones.
struct Relay {
    port: u16,
    open: Arc<AtomicBool>,
    refused: Arc<AtomicUsize>,
    relayed: Arc<std::sync::Mutex<tokio::task::JoinSet<()>>>,
}

impl Relay {
    async fn to(target: &str) -> Relay {
        let target = target.trim_start_matches("https://").trim_end_matches('/').to_owned();
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (open, refused) = (Arc::new(AtomicBool::new(true)), Arc::new(AtomicUsize::new(0)));
        let relayed = Arc::new(std::sync::Mutex::new(tokio::task::JoinSet::new()));
        let (is_open, count, tasks) = (open.clone(), refused.clone(), relayed.clone());
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !is_open.load(Ordering::SeqCst) {
                    count.fetch_add(1, Ordering::SeqCst);
                    continue;
                }
                let target = target.clone();
                tasks.lock().unwrap().spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Relay { port, open, refused, relayed }
    }

    /// From now on the API server is gone, as far as the relay's clients can tell.
    fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        self.relayed.lock().unwrap().abort_all();
    }
}

#[tokio::test]
async fn an_api_server_that_goes_away_is_not_dialled_back_to_back() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "manager-gone").await.unwrap();
    let relay = Relay::to(cp.server_url()).await;
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(cp.kubeconfig_path()).unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, text.replace(cp.server_url(), &format!("https://127.0.0.1:{}", relay.port))).unwrap();
    let manager = Manager::start(&namespace, &kubeconfig, &[]);
    manager.eventually("/readyz 200", async |m| matches!(http_get(m.health, "/readyz").await, Some((200, _)))).await;
    relay.cut();
    // Every watch and every retry backs off: some tens of connections in these seconds, where a
    // watch retried as soon as it failed makes thousands a second.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let dialled = relay.refused.load(Ordering::SeqCst);
    eprintln!("{dialled} connections to the gone API server in 5 s");
    assert!(dialled <= 300, "{dialled} connections to a gone API server in 5 s; log:\n{}", manager.log());
    assert!(dialled > 0, "nothing dialled the API server again: the relay was not in use");
}

#[tokio::test]
async fn one_manager_leads_and_the_other_takes_over() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "manager-lease").await.unwrap();
    let mut first = Manager::start(&namespace, cp.kubeconfig_path(), &["--leader-elect"]);
    first.eventually("the first manager to lead", async |m| m.leading().await == Some(true)).await;
    let second = Manager::start(&namespace, cp.kubeconfig_path(), &["-leader-elect=true"]);
    second.eventually("the second manager to stand by", async |m| m.leading().await == Some(false)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(second.leading().await, Some(false), "two managers lead at once");
    testenv::process::stop(&mut first.child, Duration::from_secs(10));
    second.eventually("the second manager to take over", async |m| m.leading().await == Some(true)).await;
}

#[tokio::test]
async fn a_bad_config_map_value_stops_the_start_with_the_key_named() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "manager-config").await.unwrap();
    let config = ConfigMap {
        metadata: ObjectMeta { name: Some("csi-addons-config".into()), ..Default::default() },
        data: Some(BTreeMap::from([("max-group-pvcs".to_owned(), "500".to_owned())])),
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(client.clone(), &namespace).create(&PostParams::default(), &config).await.unwrap();
    let mut manager = Manager::start(&namespace, cp.kubeconfig_path(), &[]);
    let status = testenv::poll::until(Duration::from_secs(30), async || manager.child.try_wait().unwrap()).await;
    let status = status.unwrap_or_else(|| panic!("the manager kept running; log:\n{}", manager.log()));
    assert!(!status.success());
    let log = manager.log();
    assert!(log.contains("max-group-pvcs") && log.contains("500"), "{log}");
}

/// `max-concurrent-reconciles` as the metrics report it for one controller.
async fn workers(manager: &Manager) -> Option<i64> {
    let (_, body) = http_get(manager.metrics, "/metrics").await?;
    let line = body
        .lines()
        .find(|l| l.starts_with("controller_runtime_max_concurrent_reconciles{controller=\"reclaimspacejob\"}"))?;
    line.rsplit(' ').next()?.parse().ok()
}

#[tokio::test]
async fn config_map_changes_apply_live_and_bad_values_are_refused_with_an_event() {
    use k8s_openapi::api::core::v1::Event;
    use kube::api::{ListParams, Patch, PatchParams};

    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "manager-live").await.unwrap();
    let manager = Manager::start(&namespace, cp.kubeconfig_path(), &["--max-concurrent-reconciles=7"]);
    manager.eventually("the flag's value", async |m| workers(m).await == Some(7)).await;

    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), &namespace);
    let config = ConfigMap {
        metadata: ObjectMeta { name: Some("csi-addons-config".into()), ..Default::default() },
        data: Some(BTreeMap::from([("max-concurrent-reconciles".to_owned(), "3".to_owned())])),
        ..Default::default()
    };
    config_maps.create(&PostParams::default(), &config).await.unwrap();
    manager.eventually("the ConfigMap's value, live", async |m| workers(m).await == Some(3)).await;

    let bad = serde_json::json!({"data": {"max-concurrent-reconciles": "3", "max-group-pvcs": "0"}});
    config_maps.patch("csi-addons-config", &PatchParams::default(), &Patch::Merge(&bad)).await.unwrap();
    let events = Api::<Event>::namespaced(client.clone(), &namespace);
    manager
        .eventually("a Warning event on the ConfigMap", async |_| {
            let list = events.list(&ListParams::default()).await.unwrap();
            list.items.iter().any(|e| {
                e.reason.as_deref() == Some("InvalidConfiguration")
                    && e.type_.as_deref() == Some("Warning")
                    && e.message.as_deref().unwrap_or("").contains("max-group-pvcs")
            })
        })
        .await;
    assert_eq!(workers(&manager).await, Some(3), "a refused ConfigMap changed the settings");

    config_maps.delete("csi-addons-config", &Default::default()).await.unwrap();
    manager.eventually("the flag's value again", async |m| workers(m).await == Some(7)).await;
}

#[tokio::test]
async fn secure_metrics_need_a_token_allowed_to_get_them() {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};

    use crate::harness::manager::https_get;
    use crate::harness::sidecar::TestPki;

    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "manager-secure").await.unwrap();
    let pki = TestPki::new();
    let cert_dir = format!("--metrics-cert-dir={}", pki.cert.parent().unwrap().display());
    let manager = Manager::start(&namespace, cp.kubeconfig_path(), &["--metrics-secure", &cert_dir]);

    let role_name = crate::harness::support::unique("metrics-reader");
    let role: ClusterRole = serde_json::from_value(serde_json::json!({
        "metadata": {"name": role_name},
        "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}],
    }))
    .unwrap();
    Api::<ClusterRole>::all(client.clone()).create(&PostParams::default(), &role).await.unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": role_name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
        "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": namespace}],
    }))
    .unwrap();
    Api::<ClusterRoleBinding>::all(client.clone()).create(&PostParams::default(), &binding).await.unwrap();
    let scraper = cp.token(&client, &namespace, "prometheus").await.unwrap();
    let stranger = cp.token(&client, &namespace, "stranger").await.unwrap();

    manager
        .eventually("metrics for the allowed ServiceAccount", async |m| {
            matches!(https_get(m.metrics, "/metrics", &pki.ca_pem, Some(&scraper)).await,
                Some((200, body)) if body.contains("leader_election_master_status"))
        })
        .await;
    let (code, body) = https_get(manager.metrics, "/metrics", &pki.ca_pem, Some(&stranger)).await.unwrap();
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("stranger") && body.contains("/metrics"), "{body}");
    let (code, _) = https_get(manager.metrics, "/metrics", &pki.ca_pem, None).await.unwrap();
    assert_eq!(code, 401);
    let (code, _) = https_get(manager.metrics, "/metrics", &pki.ca_pem, Some("not-a-token")).await.unwrap();
    assert_eq!(code, 401);
    assert_eq!(
        http_get(manager.metrics, "/metrics").await.map(|(c, _)| c),
        None,
        "plain HTTP answered on the HTTPS port"
    );
    Api::<ClusterRoleBinding>::all(client.clone()).delete(&role_name, &Default::default()).await.unwrap();
    Api::<ClusterRole>::all(client.clone()).delete(&role_name, &Default::default()).await.unwrap();
}

#[test]
fn the_managers_roles_grant_no_secrets_and_no_wildcards() {
    for file in ["role.yaml", "leader_election_role.yaml"] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/rbac").join(file);
        let role: serde_json::Value = serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let rules = role["rules"].as_array().unwrap();
        assert!(!rules.is_empty(), "{file} has no rules");
        for rule in rules {
            for field in ["apiGroups", "resources", "verbs"] {
                let values: Vec<&str> = rule[field].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
                assert!(!values.contains(&"*"), "{file}: a wildcard in {field}: {rule}");
                assert!(!values.iter().any(|v| v.starts_with("secrets")), "{file} grants Secrets: {rule}");
            }
        }
    }
}

//! The README's Helm command, run as written from the repository root on a cluster where nothing of
//! the product is installed (make test-olm runs it before OLM's tests): the manager is Ready and
//! leads; `helm uninstall` removes the release, and the chart's CRDs (which Helm keeps) and the
//! namespace go too.
use crate::cluster::{self, MANAGER_NAMESPACE};
use crate::olm::{readme_commands, run};

#[tokio::test]
#[ignore = "needs the one-node cluster: make test-olm"]
async fn the_readmes_helm_command_installs_a_ready_leading_manager() {
    let client = cluster::client().await;
    let helm = std::env::var("HELM").expect("HELM names the helm binary (make test-olm sets it)");
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let commands = readme_commands("Helm");
    assert!(commands.iter().any(|c| c.starts_with("helm install")), "{commands:?}");
    for line in commands {
        // `helm` is the one helm/v3 builds here; the words are the README's.
        println!("$ {line}\n{}", run(&format!("cd {root} && PATH=$(dirname {helm}):$PATH {line}")));
    }
    let manager = cluster::ready_leading_manager(&client, MANAGER_NAMESPACE).await;
    println!("Helm: manager {manager} Ready and holding its Lease");
    run(&format!("{helm} uninstall csi-addons --namespace {MANAGER_NAMESPACE} --wait"));
    run(&format!("kubectl delete --wait -f {root}/charts/csi-addons/crds"));
    // The namespace `--create-namespace` made goes too: the README's OLM commands start without it.
    run(&format!("kubectl delete namespace {MANAGER_NAMESPACE} --wait"));
}

//! A CSI-Addons manager started outside a cluster, as the tests and the demo start one: either
//! build, its settings and Lease in one namespace, the API server from a kubeconfig, probes on a
//! loopback port, and plain, uncoloured logs from ours.
use std::path::Path;
use std::process::Command;

/// Where a manager listens: probes always, metrics on a loopback port or not at all.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    pub health: u16,
    pub metrics: Option<u16>,
}

/// Our `csi-addons-manager` at `binary`, at log level `info` (the caller may set `RUST_LOG`
/// again), never taking the test machine for a cluster node.
pub fn ours(binary: &Path) -> Command {
    let mut command = Command::new(binary);
    command.env("RUST_LOG", "info").env("NO_COLOR", "1").env_remove("KUBERNETES_SERVICE_HOST");
    command
}

/// Adds the flags either build takes for `kubeconfig` and `ports` to `command`, and for
/// `namespace`, where the manager's settings (the `csi-addons-config` ConfigMap) live, when given:
/// upstream's manager reads that ConfigMap at start and exits when its role may not.
pub fn configure(command: &mut Command, namespace: Option<&str>, kubeconfig: &Path, ports: Ports) {
    let metrics = ports.metrics.map_or_else(|| "0".to_owned(), |port| format!("127.0.0.1:{port}"));
    if let Some(namespace) = namespace {
        command.arg(format!("--namespace={namespace}"));
    }
    command
        .arg(format!("--health-probe-bind-address=127.0.0.1:{}", ports.health))
        .arg(format!("--metrics-bind-address={metrics}"))
        .env("KUBECONFIG", kubeconfig);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(command: &Command) -> Vec<String> {
        command.get_args().map(|a| a.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn either_build_gets_the_same_flags() {
        let mut command = ours(Path::new("/bin/csi-addons-manager"));
        configure(&mut command, Some("ns"), Path::new("/k"), Ports { health: 1, metrics: Some(2) });
        assert_eq!(
            args(&command),
            ["--namespace=ns", "--health-probe-bind-address=127.0.0.1:1", "--metrics-bind-address=127.0.0.1:2"]
        );
        let mut upstream = Command::new("/bin/manager");
        configure(&mut upstream, None, Path::new("/k"), Ports { health: 1, metrics: None });
        assert_eq!(args(&upstream), ["--health-probe-bind-address=127.0.0.1:1", "--metrics-bind-address=0"]);
        let kubeconfig = upstream.get_envs().find(|(k, _)| *k == "KUBECONFIG").and_then(|(_, v)| v);
        assert_eq!(kubeconfig, Some(std::ffi::OsStr::new("/k")));
    }
}

//! The driver operator as a real process for the suites: started with leader election on a
//! short lease and its metrics on a free port, stopped gracefully on drop; the conditions and
//! Warning events it writes on the driver object.
use std::process::{Child, Stdio};
use std::time::Duration;

use api::driver::{DRIVER_NAME, ReferenceCSIDriver};
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams};
use testenv::poll::MINUTE;

use crate::harness::sidecar::free_port;
use crate::harness::support::workspace_binary;

pub struct Operator {
    child: Child,
    pub metrics: u16,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Operator {
    fn drop(&mut self) {
        testenv::process::stop(&mut self.child, Duration::from_secs(5));
    }
}

impl Operator {
    pub fn start(kubeconfig: &std::path::Path, namespace: &str, driver_namespace: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("operator.log");
        let metrics = free_port();
        let mut command = std::process::Command::new(workspace_binary("reference-driver-operator"));
        command
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("-namespace={namespace}"))
            .arg(format!("--driver-namespace={driver_namespace}"))
            .args(["--leader-elect", "--leader-election-lease-duration=4s", "--leader-election-renew-deadline=3s"])
            .args(["--leader-election-retry-period=1s"])
            .arg(format!("--health-probe-bind-address=127.0.0.1:{}", free_port()))
            .arg(format!("--metrics-bind-address=127.0.0.1:{metrics}"))
            .env("DRIVER_IMAGE", "example.com/reference-driver:v9")
            .env("RUST_LOG", "info,driver_operator=debug")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        let child = testenv::process::spawn(command).unwrap();
        Operator { child, metrics, log, _dir: dir }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Polls `check` for up to a minute; the panic carries the operator's log.
    pub async fn eventually<T>(&self, what: &str, check: impl AsyncFnMut() -> Option<T>) -> T {
        match testenv::poll::until(MINUTE, check).await {
            Some(found) => found,
            None => panic!("timed out waiting for {what}; operator log:\n{}", self.log()),
        }
    }
}

/// A Warning event of `reason` about the driver object.
pub async fn warning(client: &Client, reason: &str) -> Option<Event> {
    let list = Api::<Event>::all(client.clone()).list(&ListParams::default()).await.ok()?;
    list.items.into_iter().find(|e| {
        e.reason.as_deref() == Some(reason)
            && e.type_.as_deref() == Some("Warning")
            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(DRIVER_NAME)
    })
}

/// The condition `type_` of the driver object: (status, reason, message).
pub async fn condition(drivers: &Api<ReferenceCSIDriver>, name: &str, type_: &str) -> Option<(bool, String, String)> {
    let driver = drivers.get_opt(name).await.ok()??;
    let status = driver.status?;
    let c = status.conditions.into_iter().find(|c| c.type_ == type_)?;
    Some((c.status == "True", c.reason, c.message))
}

//! The backend query: which storage profiles the driver's controller plugin can serve on this
//! cluster. The plugin answers CSI Identity's GetPluginInfo on a TCP port of its Pod (its
//! `--identity-address`), with the profiles in the manifest; a Probe first says it is up.
use std::time::Duration;

use api::proto::csi::v1 as csi;
use k8s_openapi::api::core::v1::Pod;

use crate::decide::Backend;

/// The port of the controller plugin's identity endpoint (its container port `identity`).
pub const IDENTITY_PORT: u16 = 9071;
/// The manifest key the driver lists its profiles under.
const PROFILES_KEY: &str = "profiles";
/// The label that tells the controller plugin's Pods from the node plugin's.
const COMPONENT: &str = "app.kubernetes.io/component";
/// A call that takes longer than this counts as unanswered.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// The profiles in a GetPluginInfo manifest; `None` when the plugin reports no such key (an
/// older driver, or a node plugin).
pub fn profiles_of(manifest: &std::collections::HashMap<String, String>) -> Option<Vec<String>> {
    let listed = manifest.get(PROFILES_KEY)?;
    Some(listed.split(',').map(str::trim).filter(|p| !p.is_empty()).map(str::to_owned).collect())
}

/// Asks the running controller plugin among the driver's `pods` (as the rollout read them).
/// `Unknown` while none runs with an address.
pub async fn ask(pods: &[Pod]) -> Backend {
    let controller =
        |p: &&Pod| p.metadata.labels.as_ref().and_then(|l| l.get(COMPONENT)).map(String::as_str) == Some("controller");
    let running = pods.iter().filter(controller).find_map(|p| {
        let status = p.status.as_ref()?;
        (status.phase.as_deref() == Some("Running") && p.metadata.deletion_timestamp.is_none())
            .then(|| status.pod_ip.clone())
            .flatten()
    });
    let Some(ip) = running else { return Backend::Unknown };
    let host = if ip.contains(':') { format!("[{ip}]") } else { ip };
    let address = format!("http://{host}:{IDENTITY_PORT}");
    match tokio::time::timeout(ANSWER_WITHIN, query(&address)).await {
        Ok(Ok(backend)) => backend,
        Ok(Err(why)) => Backend::Unreachable(format!("{address}: {why}")),
        Err(_) => Backend::Unreachable(format!("{address}: no answer within {ANSWER_WITHIN:?}")),
    }
}

async fn query(address: &str) -> Result<Backend, String> {
    let endpoint = tonic::transport::Endpoint::from_shared(address.to_owned()).map_err(|e| e.to_string())?;
    let channel = endpoint.connect_timeout(ANSWER_WITHIN).connect().await.map_err(|e| e.to_string())?;
    let mut identity = csi::identity_client::IdentityClient::new(channel);
    let probe = identity.probe(csi::ProbeRequest {}).await.map_err(|s| format!("Probe: {}", s.message()))?;
    if probe.into_inner().ready == Some(false) {
        return Err("the plugin's Probe says it is not ready".to_owned());
    }
    let info = identity
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .map_err(|s| format!("GetPluginInfo: {}", s.message()))?
        .into_inner();
    profiles_of(&info.manifest)
        .map(Backend::Profiles)
        .ok_or_else(|| format!("the plugin ({} {}) reports no profiles", info.name, info.vendor_version))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_lists_profiles_comma_separated() {
        let manifest = |v: &str| std::collections::HashMap::from([(PROFILES_KEY.to_owned(), v.to_owned())]);
        assert_eq!(profiles_of(&manifest("filesystem,block")), Some(vec!["filesystem".into(), "block".into()]));
        assert_eq!(profiles_of(&manifest("")), Some(vec![]), "a backend that serves nothing");
        assert_eq!(profiles_of(&Default::default()), None);
    }
}

//! Re-applies `csi-addons-config` when it changes, without a restart (upstream reads it once). A
//! ConfigMap with a bad value is refused whole: the settings in force stay, the error is logged and
//! a Warning event is put on the ConfigMap; a deleted ConfigMap brings the flags' values back.
//! [differs: config-live]
use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Resource;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;

use crate::config::{CONFIG_MAP, Settings};
use crate::events::{EventRecorder, Note};

/// Watches the ConfigMap in `namespace` until `stop`; `settings` carries what is in force.
pub async fn follow(
    client: kube::Client,
    namespace: String,
    base: Settings,
    settings: watch::Sender<Settings>,
    mut stop: watch::Receiver<bool>,
) {
    let api = Api::<ConfigMap>::namespaced(client.clone(), &namespace);
    let recorder = EventRecorder::new(client, crate::core::FIELD_MANAGER, None);
    let config = watcher::Config::default().fields(&format!("metadata.name={CONFIG_MAP}"));
    // Backed off after each error: a watcher retries as soon as it is polled again, so without it
    // an unreachable API server is dialled back to back, a CPU's worth.
    let mut events = std::pin::pin!(watcher::watcher(api, config).default_backoff());
    loop {
        let event = tokio::select! {
            event = events.next() => event,
            _ = stop.wait_for(|s| *s) => return,
        };
        let Some(event) = event else { return };
        let config_map = match event {
            Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c)) => Some(c),
            Ok(watcher::Event::Delete(_)) => None,
            Ok(watcher::Event::Init | watcher::Event::InitDone) => continue,
            Err(e) => {
                tracing::debug!(error = %e, "watching {CONFIG_MAP}; retrying");
                continue;
            }
        };
        let data = config_map.as_ref().and_then(|c| c.data.clone()).unwrap_or_default();
        apply(&base, &data, &settings, config_map.as_ref(), &recorder).await;
    }
}

async fn apply(
    base: &Settings,
    data: &BTreeMap<String, String>,
    settings: &watch::Sender<Settings>,
    config_map: Option<&ConfigMap>,
    recorder: &EventRecorder,
) {
    match Settings::with_config_map(base, data) {
        Ok(next) => {
            let changes = settings.borrow().changes(&next);
            if !changes.is_empty() {
                tracing::info!(changes = %changes.join(", "), "{CONFIG_MAP} applied");
                settings.send_replace(next);
            }
        }
        Err(e) => {
            tracing::error!(error = %e, "{CONFIG_MAP} refused; the settings in force stay");
            if let Some(config_map) = config_map {
                let note = Note {
                    warning: true,
                    reason: "InvalidConfiguration",
                    action: "Reload",
                    text: format!("{e}; the settings in force stay"),
                };
                if let Err(e) = recorder.publish(&config_map.object_ref(&()), note).await {
                    tracing::warn!(error = %e, "recording the configuration event failed");
                }
            }
        }
    }
}

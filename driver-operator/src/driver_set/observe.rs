//! Observe: the rollout as the applied workloads and their Pods show it (the judgement itself is
//! pure, in `rollout`).
use api::driver::GenerationStatus;
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Resource, ResourceExt};

use super::context::Context;
use super::errors::{DriverSetError, api_error};
use crate::assets::{self, Assets};
use crate::decide::Rollout;
use crate::names::DRIVER_PODS;
use crate::rollout::rollout;

/// What a pass saw of the applied workloads.
#[derive(Debug)]
pub(super) struct Observed {
    pub rollout: Rollout,
    pub generations: Vec<GenerationStatus>,
    pub driver_image: Option<String>,
    /// The driver's Pods, read once for the rollout and the backend query.
    pub pods: Vec<Pod>,
}

fn generation_of<K: Resource<DynamicType = ()>>(object: &K, group: &str, resource: &str) -> GenerationStatus {
    let meta = object.meta();
    GenerationStatus {
        group: group.to_owned(),
        resource: resource.to_owned(),
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        last_generation: meta.generation.unwrap_or_default(),
    }
}

/// The rollout as the workloads and their Pods show it.
pub(super) async fn observe(ctx: &Context, assets: &Assets) -> Result<Observed, DriverSetError> {
    let namespace = &ctx.placement.namespace;
    let client = &ctx.client;
    let (controller_name, node_name) = (assets.controller.name_any(), assets.node.name_any());
    let controller = Api::<StatefulSet>::namespaced(client.clone(), namespace)
        .get_opt(&controller_name)
        .await
        .map_err(api_error("reading", "StatefulSet", &controller_name))?;
    let node = Api::<DaemonSet>::namespaced(client.clone(), namespace).get_opt(&node_name).await.map_err(api_error(
        "reading",
        "DaemonSet",
        &node_name,
    ))?;
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(DRIVER_PODS))
        .await
        .map_err(api_error("listing", "Pods", DRIVER_PODS))?;
    let mut generations = Vec::new();
    generations.extend(controller.iter().map(|s| generation_of(s, "apps", "statefulsets")));
    generations.extend(node.iter().map(|s| generation_of(s, "apps", "daemonsets")));
    Ok(Observed {
        rollout: rollout(controller.as_ref(), node.as_ref(), &pods.items),
        generations,
        driver_image: assets::driver_image(assets),
        pods: pods.items,
    })
}

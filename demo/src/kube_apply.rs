//! Server-side apply of multi-document YAML (the release RBAC) and of objects given as JSON, with
//! the API resource of each object found by discovery (run once, then reused).
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::{Discovery, Scope};

use crate::{Error, Result};

const FIELD_MANAGER: &str = "csi-addons-demo";

pub struct Applier {
    client: kube::Client,
    discovery: Discovery,
}

impl Applier {
    pub async fn new(client: &kube::Client) -> Result<Self> {
        let discovery = Discovery::new(client.clone()).run().await?;
        Ok(Applier { client: client.clone(), discovery })
    }

    /// Applies every object of `yaml` (documents without a kind are skipped).
    pub async fn apply_yaml(&self, yaml: &str) -> Result<()> {
        for document in serde_yaml::Deserializer::from_str(yaml) {
            let object: DynamicObject = serde::Deserialize::deserialize(document)
                .map_err(|e| Error::Manifest(format!("reading a manifest: {e}")))?;
            if object.types.is_some() {
                self.apply_object(object).await?;
            }
        }
        Ok(())
    }

    /// Applies one object given as JSON and returns it as the API server stored it.
    pub async fn apply(&self, object: serde_json::Value) -> Result<DynamicObject> {
        let object: DynamicObject =
            serde_json::from_value(object).map_err(|e| Error::Manifest(format!("building an object: {e}")))?;
        self.apply_object(object).await
    }

    /// The API of `kind` (`group/version`, `Kind`) in `namespace` (ignored for cluster-scoped kinds).
    pub fn api(&self, api_version: &str, kind: &str, namespace: &str) -> Result<Api<DynamicObject>> {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, capabilities) = self
            .discovery
            .resolve_gvk(&gvk)
            .ok_or_else(|| Error::Manifest(format!("the API server serves no {kind}")))?;
        Ok(match capabilities.scope {
            Scope::Namespaced => Api::namespaced_with(self.client.clone(), namespace, &resource),
            Scope::Cluster => Api::all_with(self.client.clone(), &resource),
        })
    }

    async fn apply_object(&self, object: DynamicObject) -> Result<DynamicObject> {
        let types = object.types.clone().unwrap_or_default();
        let namespace = object.metadata.namespace.clone().unwrap_or_default();
        let api = self.api(&types.api_version, &types.kind, &namespace)?;
        let name = object.metadata.name.clone().unwrap_or_default();
        Ok(api.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&object)).await?)
    }
}

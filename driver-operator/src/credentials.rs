//! Secret sync: the credentials Secret the user names in `spec.credentialsSecret` is copied into
//! the driver's namespace as `reference-driver-credentials`, the name the CSI-Addons classes give
//! in their secret parameters (the manager has the sidecar resolve it and hand it to the driver).
//! Each pass copies it again, and a watch on the Secrets of the operator's namespace wakes a pass
//! when the source changes: keys added, changed or removed there are so in the copy.
//!
//! The operator reads Secrets of its own namespace only (least privilege), so the source must be
//! there. A source that is missing, elsewhere or empty leaves the last copy in place (the
//! classes keep working with it) and is reported in the `CredentialsSynced` condition.
use std::collections::BTreeMap;

use api::driver::SecretReference;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;

use crate::driver_set::errors::{DriverSetError, api_error};
use crate::names::MANAGED_BY;

/// The copy in the driver's namespace.
pub const COPY: &str = "reference-driver-credentials";
/// The annotation on the copy naming its source (`namespace/name`).
const SOURCE: &str = "driver.csi-addons-rs.io/copied-from";

/// What a pass did with the credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// The spec names none: the classes carry no secret parameters.
    NotAsked,
    /// Copied, with this many keys.
    Copied(usize),
    /// Not copied this pass: why, in words a user can act on.
    Failed(String),
}

impl Credentials {
    /// Whether the classes name the copy in their secret parameters.
    pub fn referenced(&self) -> bool {
        !matches!(self, Credentials::NotAsked)
    }
}

/// Whether the operator may read `reference`: only Secrets of its own namespace.
pub fn check_reference(reference: &SecretReference, operator_namespace: &str) -> Result<(), String> {
    if reference.namespace == operator_namespace {
        return Ok(());
    }
    Err(format!(
        "credentialsSecret {}/{}: the operator reads Secrets of its own namespace only; create it in {operator_namespace}",
        reference.namespace, reference.name
    ))
}

/// The copy of `source` in `namespace`: the same type and data, labelled as the operator's, with
/// an annotation naming the source. An empty source is refused: copying it would hand the driver
/// no credentials while saying it had.
pub fn copy_of(source: &Secret, namespace: &str) -> Result<Secret, String> {
    let origin = format!(
        "{}/{}",
        source.metadata.namespace.as_deref().unwrap_or(""),
        source.metadata.name.as_deref().unwrap_or("")
    );
    let data = source.data.clone().unwrap_or_default();
    if data.is_empty() && source.string_data.as_ref().is_none_or(BTreeMap::is_empty) {
        return Err(format!("credentialsSecret {origin} holds no data: add the keys the driver needs"));
    }
    Ok(Secret {
        metadata: ObjectMeta {
            name: Some(COPY.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([(MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned())])),
            annotations: Some(BTreeMap::from([(SOURCE.to_owned(), origin)])),
            ..Default::default()
        },
        type_: source.type_.clone(),
        data: Some(data),
        ..Default::default()
    })
}

/// The secret parameters of a class naming the copy, under `prefix` (for example
/// `replication.storage.openshift.io/replication-secret`), when the credentials are referenced.
pub fn secret_parameters(prefix: &str, driver_namespace: &str, credentials: &Credentials) -> BTreeMap<String, String> {
    if !credentials.referenced() {
        return BTreeMap::new();
    }
    BTreeMap::from([
        (format!("{prefix}-name"), COPY.to_owned()),
        (format!("{prefix}-namespace"), driver_namespace.to_owned()),
    ])
}

/// The copy of the Secret `reference` names, to apply in `driver_namespace`; or, when there is
/// none to make, why (the last copy is then left as it is).
pub async fn copy_for(
    client: &kube::Client,
    reference: &SecretReference,
    operator_namespace: &str,
    driver_namespace: &str,
) -> Result<Result<Secret, String>, DriverSetError> {
    if let Err(why) = check_reference(reference, operator_namespace) {
        return Ok(Err(why));
    }
    let name = &reference.name;
    let source = Api::<Secret>::namespaced(client.clone(), operator_namespace)
        .get_opt(name)
        .await
        .map_err(api_error("reading", "Secret", &format!("{operator_namespace}/{name}")))?;
    let Some(source) = source else {
        return Ok(Err(format!(
            "credentialsSecret {operator_namespace}/{name} does not exist; the driver keeps the last copy, if any"
        )));
    };
    Ok(copy_of(&source, driver_namespace))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn reference(namespace: &str) -> SecretReference {
        SecretReference { name: "backend".into(), namespace: namespace.into() }
    }

    #[test]
    fn only_secrets_of_the_operators_namespace_are_read() {
        assert!(check_reference(&reference("operators"), "operators").is_ok());
        let why = check_reference(&reference("kube-system"), "operators").unwrap_err();
        assert!(why.contains("kube-system/backend") && why.contains("create it in operators"), "{why}");
    }

    #[test]
    fn the_copy_keeps_type_and_data_and_names_its_source() {
        let source = Secret {
            metadata: ObjectMeta {
                name: Some("backend".into()),
                namespace: Some("operators".into()),
                ..Default::default()
            },
            type_: Some("Opaque".into()),
            data: Some(BTreeMap::from([("userKey".into(), ByteString(b"s3cr3t".to_vec()))])),
            ..Default::default()
        };
        let copy = copy_of(&source, "csi-addons-reference").unwrap();
        assert_eq!(copy.metadata.name.as_deref(), Some(COPY));
        assert_eq!(copy.metadata.namespace.as_deref(), Some("csi-addons-reference"));
        assert_eq!(copy.data, source.data);
        assert_eq!(copy.type_.as_deref(), Some("Opaque"));
        assert_eq!(copy.metadata.annotations.unwrap()[SOURCE], "operators/backend");
        let empty = Secret { data: None, ..source };
        let why = copy_of(&empty, "csi-addons-reference").unwrap_err();
        assert!(why.contains("holds no data"), "{why}");
    }

    #[test]
    fn classes_name_the_copy_only_when_credentials_are_asked_for() {
        let prefix = "csiaddons.openshift.io/networkfence-secret";
        assert!(secret_parameters(prefix, "ns", &Credentials::NotAsked).is_empty());
        let named = secret_parameters(prefix, "ns", &Credentials::Copied(1));
        assert_eq!(named[&format!("{prefix}-name")], COPY);
        assert_eq!(named[&format!("{prefix}-namespace")], "ns");
        // A failed sync still names the copy: the last one stays in place, and parameters are immutable.
        assert_eq!(secret_parameters(prefix, "ns", &Credentials::Failed("gone".into())), named);
    }
}

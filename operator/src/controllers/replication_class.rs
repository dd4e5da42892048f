//! Reading a replication class and its parameters, as the three replication controllers do
//! before every call: a VolumeReplicationClass for a VolumeReplication, a
//! VolumeGroupReplicationClass for a group and its content.
use std::collections::BTreeMap;
use std::fmt::Debug;

use api::replication::{VolumeGroupReplicationClass, VolumeReplicationClass};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

use crate::controllers::replication::{ClassParameterError, ClassParameters, class_parameters};

/// Why a class's parameters are not at hand: each message names the kind and the class.
#[derive(Debug, thiserror::Error)]
pub enum ClassError {
    #[error("reading {kind} {class}: {source}")]
    Read {
        kind: &'static str,
        class: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("{kind} {class} not found")]
    Missing { kind: &'static str, class: String },
    #[error("{kind} {class}: {source}")]
    Invalid {
        kind: &'static str,
        class: String,
        #[source]
        source: ClassParameterError,
    },
}

impl ClassError {
    /// Only a change of the class mends its parameters; a class missing or unreadable may come.
    pub fn permanent(&self) -> bool {
        matches!(self, ClassError::Invalid { .. })
    }
}

/// A replication class kind.
pub trait ReplicationClass: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned {
    const KIND: &'static str;
    fn parameters(&self) -> Option<&BTreeMap<String, String>>;
}

impl ReplicationClass for VolumeReplicationClass {
    const KIND: &'static str = "VolumeReplicationClass";
    fn parameters(&self) -> Option<&BTreeMap<String, String>> {
        self.spec.parameters.as_ref()
    }
}

impl ReplicationClass for VolumeGroupReplicationClass {
    const KIND: &'static str = "VolumeGroupReplicationClass";
    fn parameters(&self) -> Option<&BTreeMap<String, String>> {
        self.spec.parameters.as_ref()
    }
}

/// The class `name` and its parameters, split and checked.
pub async fn read<K: ReplicationClass>(client: &kube::Client, name: &str) -> Result<(K, ClassParameters), ClassError> {
    let (kind, class) = (K::KIND, name.to_owned());
    let found = Api::<K>::all(client.clone()).get_opt(name).await;
    let found = found.map_err(|e| ClassError::Read { kind, class: class.clone(), source: Box::new(e) })?;
    let Some(found) = found else {
        return Err(ClassError::Missing { kind, class });
    };
    let parameters =
        class_parameters(found.parameters()).map_err(|source| ClassError::Invalid { kind, class, source })?;
    Ok((found, parameters))
}

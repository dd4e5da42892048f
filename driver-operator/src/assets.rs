//! The driver's objects: the YAMLs of `deploy/reference-driver/` (what a hand install applies),
//! embedded, with the ReferenceCSIDriver's spec laid over them. One source for both installs, so
//! they cannot drift apart. Pure: no API calls.
use std::collections::BTreeMap;

use api::driver::{LogLevel, ReferenceCSIDriverSpec};
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::{Container, EnvVar, Namespace, PodSpec, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::storage::v1::CSIDriver;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::names::{MANAGED_BY, SERVING_SECRET};

/// Where the driver runs unless `--driver-namespace` says otherwise (the hand install's namespace).
pub const DEFAULT_NAMESPACE: &str = "csi-addons-reference";

const NAMESPACE_YAML: (&str, &str) = ("namespace.yaml", include_str!("../../deploy/reference-driver/namespace.yaml"));
const CSIDRIVER_YAML: (&str, &str) = ("csidriver.yaml", include_str!("../../deploy/reference-driver/csidriver.yaml"));
const RBAC_YAML: (&str, &str) = ("rbac.yaml", include_str!("../../deploy/reference-driver/rbac.yaml"));
const CONTROLLER_YAML: (&str, &str) =
    ("controller.yaml", include_str!("../../deploy/reference-driver/controller.yaml"));
const NODE_YAML: (&str, &str) = ("node.yaml", include_str!("../../deploy/reference-driver/node.yaml"));

/// The containers' names in the YAMLs.
pub mod containers {
    pub const DRIVER: &str = "driver";
    pub const CSI_ADDONS: &str = "csi-addons";
    pub const PROVISIONER: &str = "csi-provisioner";
    pub const ATTACHER: &str = "csi-attacher";
    pub const RESIZER: &str = "csi-resizer";
    pub const REGISTRAR: &str = "node-driver-registrar";
}

/// An embedded YAML that does not read as expected: a build of the operator with broken assets
/// (the unit tests render every one).
#[derive(Debug, thiserror::Error)]
pub enum AssetError {
    #[error("the embedded {file}: {source}")]
    Parse {
        file: &'static str,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("the embedded {file}: {source}")]
    Typed {
        file: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("the embedded {file} holds a {kind}, which the operator does not apply")]
    UnexpectedKind { file: &'static str, kind: String },
    #[error("the embedded {file} has no Pod template")]
    NoPodSpec { file: &'static str },
}

/// Images from the operator's environment (the CSV lists them as `relatedImages`). An unset one
/// keeps the YAMLs' image.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DefaultImages {
    pub driver: Option<String>,
    pub csi_addons_sidecar: Option<String>,
    pub provisioner: Option<String>,
    pub attacher: Option<String>,
    pub resizer: Option<String>,
    pub node_registrar: Option<String>,
}

/// What the operator needs to place the driver besides its spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The driver's namespace.
    pub namespace: String,
    /// The operator's own namespace: where it reads the user's credentials Secret.
    pub operator_namespace: String,
    /// The one caller the CSI-Addons sidecars admit: the manager's ServiceAccount.
    pub manager_identity: String,
    pub images: DefaultImages,
}

/// Every object of the driver, in the order they are applied (and the reverse of removal).
#[derive(Debug, Clone, PartialEq)]
pub struct Assets {
    pub namespace: Namespace,
    pub csi_driver: CSIDriver,
    pub service_accounts: Vec<ServiceAccount>,
    pub cluster_roles: Vec<ClusterRole>,
    pub cluster_role_bindings: Vec<ClusterRoleBinding>,
    pub controller: StatefulSet,
    pub node: DaemonSet,
}

/// The driver container's image, as rendered.
pub fn driver_image(assets: &Assets) -> Option<String> {
    let pod = assets.node.spec.as_ref()?.template.spec.as_ref()?;
    pod.containers.iter().find(|c| c.name == containers::DRIVER)?.image.clone()
}

fn parse<T: DeserializeOwned>((file, text): (&'static str, &str)) -> Result<T, AssetError> {
    serde_yaml::from_str(text).map_err(|source| AssetError::Parse { file, source })
}

/// The driver's Namespace (Pod Security `privileged`: the node plugin mounts and attaches loop
/// devices).
pub fn namespace(placement: &Placement) -> Result<Namespace, AssetError> {
    let mut namespace: Namespace = parse(NAMESPACE_YAML)?;
    namespace.metadata.name = Some(placement.namespace.clone());
    namespace
        .metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned());
    Ok(namespace)
}

/// The driver's objects for `spec`, placed as `placement` says. `sidecar_ca` is the CA bundle
/// that signs the sidecars' serving certificate (Secret `names::SERVING_SECRET`): it is
/// published on the CSIDriver and the certificate mounted into the sidecars. `None` leaves the
/// sidecars to make their own, as a hand install does.
pub fn render(
    spec: &ReferenceCSIDriverSpec,
    placement: &Placement,
    sidecar_ca: Option<&str>,
) -> Result<Assets, AssetError> {
    let mut assets = Assets {
        namespace: namespace(placement)?,
        csi_driver: parse(CSIDRIVER_YAML)?,
        service_accounts: Vec::new(),
        cluster_roles: Vec::new(),
        cluster_role_bindings: Vec::new(),
        controller: parse(CONTROLLER_YAML)?,
        node: parse(NODE_YAML)?,
    };
    let (file, text) = RBAC_YAML;
    for document in serde_yaml::Deserializer::from_str(text) {
        let value = serde_json::Value::deserialize(document).map_err(|source| AssetError::Parse { file, source })?;
        let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or_default().to_owned();
        fn typed<T: DeserializeOwned>(file: &'static str, value: serde_json::Value) -> Result<T, AssetError> {
            serde_json::from_value(value).map_err(|source| AssetError::Typed { file, source })
        }
        match kind.as_str() {
            "ServiceAccount" => assets.service_accounts.push(typed(file, value)?),
            "ClusterRole" => assets.cluster_roles.push(typed(file, value)?),
            "ClusterRoleBinding" => assets.cluster_role_bindings.push(typed(file, value)?),
            _ => return Err(AssetError::UnexpectedKind { file, kind }),
        }
    }
    place(&mut assets, &placement.namespace);
    if let Some(bundle) = sidecar_ca {
        assets
            .csi_driver
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(api::driver::SIDECAR_CA_ANNOTATION.to_owned(), bundle.to_owned());
    }
    for (file, pod) in [
        (CONTROLLER_YAML.0, assets.controller.spec.as_mut().and_then(|s| s.template.spec.as_mut())),
        (NODE_YAML.0, assets.node.spec.as_mut().and_then(|s| s.template.spec.as_mut())),
    ] {
        let pod = pod.ok_or(AssetError::NoPodSpec { file })?;
        lay_spec_over(pod, spec, placement);
        if sidecar_ca.is_some() && spec.csi_addons.enabled {
            mount_sidecar_certificate(pod);
        } else {
            unmount_sidecar_certificate(pod);
        }
    }
    Ok(assets)
}

/// Every object in `namespace` and labelled as the operator's.
fn place(assets: &mut Assets, namespace: &str) {
    let label = |meta: &mut ObjectMeta| {
        meta.labels.get_or_insert_with(BTreeMap::new).insert(MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned());
    };
    label(&mut assets.csi_driver.metadata);
    for account in &mut assets.service_accounts {
        account.metadata.namespace = Some(namespace.to_owned());
        label(&mut account.metadata);
    }
    for role in &mut assets.cluster_roles {
        label(&mut role.metadata);
    }
    for binding in &mut assets.cluster_role_bindings {
        label(&mut binding.metadata);
        for subject in binding.subjects.iter_mut().flatten().filter(|s| s.kind == "ServiceAccount") {
            subject.namespace = Some(namespace.to_owned());
        }
    }
    assets.controller.metadata.namespace = Some(namespace.to_owned());
    label(&mut assets.controller.metadata);
    assets.node.metadata.namespace = Some(namespace.to_owned());
    label(&mut assets.node.metadata);
}

/// klog's verbosity for a log level, as OpenShift's operators map them.
fn klog_verbosity(level: LogLevel) -> u8 {
    match level {
        LogLevel::Normal => 2,
        LogLevel::Debug => 4,
        LogLevel::Trace => 6,
        LogLevel::TraceAll => 8,
    }
}

/// The driver's RUST_LOG for a log level.
fn rust_log(level: LogLevel) -> &'static str {
    match level {
        LogLevel::Normal => "info",
        LogLevel::Debug => "debug",
        LogLevel::Trace | LogLevel::TraceAll => "trace",
    }
}

/// `flag=value` in `args`, replacing an earlier `flag=…`.
fn set_arg(args: &mut Vec<String>, flag: &str, value: &str) {
    let prefix = format!("{flag}=");
    args.retain(|a| !a.starts_with(&prefix));
    args.push(format!("{prefix}{value}"));
}

fn set_env(container: &mut Container, name: &str, value: &str) {
    let env = container.env.get_or_insert_with(Vec::new);
    env.retain(|e| e.name != name);
    env.push(EnvVar { name: name.to_owned(), value: Some(value.to_owned()), value_from: None });
}

/// The spec's images, log level, placement, volumes directory and CSI-Addons choice on one Pod.
fn lay_spec_over(pod: &mut PodSpec, spec: &ReferenceCSIDriverSpec, placement: &Placement) {
    use containers::*;
    let pick = |own: &Option<String>, default: &Option<String>| own.clone().or_else(|| default.clone());
    let (images, defaults) = (&spec.images, &placement.images);
    let driver_image = pick(&images.driver, &defaults.driver);
    let registrar_image = pick(&images.node_registrar, &defaults.node_registrar);
    if !spec.csi_addons.enabled {
        pod.containers.retain(|c| c.name != CSI_ADDONS);
    }
    let verbosity = klog_verbosity(spec.log_level).to_string();
    for container in &mut pod.containers {
        let image = match container.name.as_str() {
            DRIVER => driver_image.clone(),
            CSI_ADDONS => pick(&images.csi_addons_sidecar, &defaults.csi_addons_sidecar),
            PROVISIONER => pick(&images.provisioner, &defaults.provisioner),
            ATTACHER => pick(&images.attacher, &defaults.attacher),
            RESIZER => pick(&images.resizer, &defaults.resizer),
            // Without an image of its own, the registrar is the driver image's Rust one.
            REGISTRAR => registrar_image.clone().or_else(|| driver_image.clone()),
            _ => None,
        };
        if let Some(image) = image {
            container.image = Some(image);
        }
        let args = container.args.get_or_insert_with(Vec::new);
        match container.name.as_str() {
            DRIVER => set_env(container, "RUST_LOG", rust_log(spec.log_level)),
            CSI_ADDONS => {
                set_arg(args, "--v", &verbosity);
                set_arg(args, "--allowed-identities", &placement.manager_identity);
            }
            PROVISIONER | ATTACHER | RESIZER => set_arg(args, "--v", &verbosity),
            // node-driver-registrar's own image: its entrypoint and its klog flags.
            REGISTRAR if registrar_image.is_some() => {
                container.command = None;
                set_arg(args, "--v", &verbosity);
            }
            _ => {}
        }
    }
    if !spec.node_placement.node_selector.is_empty() {
        pod.node_selector = Some(spec.node_placement.node_selector.clone());
    }
    if !spec.node_placement.tolerations.is_empty() {
        pod.tolerations = Some(spec.node_placement.tolerations.clone());
    }
    if let Some(directory) = &spec.volumes_directory {
        for volume in pod.volumes.iter_mut().flatten().filter(|v| v.name == "state") {
            if let Some(host_path) = volume.host_path.as_mut() {
                host_path.path.clone_from(directory);
            }
        }
    }
}

/// Where the sidecars find their certificate.
const SIDECAR_TLS_DIR: &str = "/etc/csi-addons/tls";

/// The volume of the sidecars' serving certificate.
const SIDECAR_TLS_VOLUME: &str = "sidecar-tls";
const SIDECAR_TLS_FLAGS: [&str; 2] = ["--tls-cert-file=", "--tls-key-file="];

/// The serving certificate's Secret as a volume of `pod`, mounted into its CSI-Addons sidecar,
/// which serves it (and re-reads it when the kubelet updates the files).
fn mount_sidecar_certificate(pod: &mut PodSpec) {
    use k8s_openapi::api::core::v1::{SecretVolumeSource, Volume, VolumeMount};
    const VOLUME: &str = SIDECAR_TLS_VOLUME;
    let volumes = pod.volumes.get_or_insert_with(Vec::new);
    volumes.retain(|v| v.name != VOLUME);
    volumes.push(Volume {
        name: VOLUME.to_owned(),
        secret: Some(SecretVolumeSource { secret_name: Some(SERVING_SECRET.to_owned()), ..Default::default() }),
        ..Default::default()
    });
    for sidecar in pod.containers.iter_mut().filter(|c| c.name == containers::CSI_ADDONS) {
        let mounts = sidecar.volume_mounts.get_or_insert_with(Vec::new);
        mounts.retain(|m| m.name != VOLUME);
        mounts.push(VolumeMount {
            name: VOLUME.to_owned(),
            mount_path: SIDECAR_TLS_DIR.to_owned(),
            read_only: Some(true),
            ..Default::default()
        });
        let args = sidecar.args.get_or_insert_with(Vec::new);
        set_arg(args, "--tls-cert-file", &format!("{SIDECAR_TLS_DIR}/tls.crt"));
        set_arg(args, "--tls-key-file", &format!("{SIDECAR_TLS_DIR}/tls.key"));
    }
}

/// No serving certificate for `pod`: deploy/reference-driver/ mounts the one its certificates Job
/// issues, a Secret this operator makes only while CSI-Addons is on (the sidecars then make their
/// own certificate, or are not there at all).
fn unmount_sidecar_certificate(pod: &mut PodSpec) {
    if let Some(volumes) = pod.volumes.as_mut() {
        volumes.retain(|v| v.name != SIDECAR_TLS_VOLUME);
    }
    for container in &mut pod.containers {
        if let Some(mounts) = container.volume_mounts.as_mut() {
            mounts.retain(|m| m.name != SIDECAR_TLS_VOLUME);
        }
        if let Some(args) = container.args.as_mut() {
            args.retain(|a| !SIDECAR_TLS_FLAGS.iter().any(|flag| a.starts_with(flag)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::driver::Images;

    fn placement() -> Placement {
        Placement {
            operator_namespace: "operators".into(),
            namespace: "drivers".into(),
            manager_identity: "system:serviceaccount:operators:csi-addons-controller-manager".into(),
            images: DefaultImages { provisioner: Some("mirror/csi-provisioner:v6".into()), ..Default::default() },
        }
    }

    fn pod(assets: &Assets, controller: bool) -> &PodSpec {
        let template = if controller {
            &assets.controller.spec.as_ref().unwrap().template
        } else {
            &assets.node.spec.as_ref().unwrap().template
        };
        template.spec.as_ref().unwrap()
    }

    fn container<'a>(pod: &'a PodSpec, name: &str) -> Option<&'a Container> {
        pod.containers.iter().find(|c| c.name == name)
    }

    fn args(container: &Container) -> &[String] {
        container.args.as_deref().unwrap_or_default()
    }

    #[test]
    fn the_hand_install_yamls_render_placed_and_labelled() {
        let assets = render(&ReferenceCSIDriverSpec::default(), &placement(), None).unwrap();
        assert_eq!(assets.namespace.metadata.name.as_deref(), Some("drivers"));
        assert_eq!(assets.csi_driver.metadata.name.as_deref(), Some(api::driver::DRIVER_NAME));
        assert_eq!((assets.service_accounts.len(), assets.cluster_roles.len()), (2, 2));
        assert_eq!(assets.cluster_role_bindings.len(), 4);
        for binding in &assets.cluster_role_bindings {
            for subject in binding.subjects.iter().flatten() {
                assert_eq!(subject.namespace.as_deref(), Some("drivers"), "{binding:?}");
            }
            assert_eq!(binding.metadata.labels.as_ref().unwrap()[MANAGED_BY.0], MANAGED_BY.1);
        }
        assert_eq!(assets.controller.metadata.namespace.as_deref(), Some("drivers"));
        assert_eq!(assets.node.metadata.namespace.as_deref(), Some("drivers"));
        let controller = pod(&assets, true);
        // The environment's image where the spec names none, else the YAML's.
        assert_eq!(
            container(controller, containers::PROVISIONER).unwrap().image.as_deref(),
            Some("mirror/csi-provisioner:v6")
        );
        assert!(
            container(controller, containers::ATTACHER)
                .unwrap()
                .image
                .as_deref()
                .unwrap()
                .starts_with("registry.k8s.io/")
        );
        let sidecar = container(controller, containers::CSI_ADDONS).unwrap();
        assert!(args(sidecar).contains(
            &"--allowed-identities=system:serviceaccount:operators:csi-addons-controller-manager".to_owned()
        ));
        assert_eq!(args(sidecar).iter().filter(|a| a.starts_with("--allowed-identities=")).count(), 1);
        assert!(args(sidecar).contains(&"--v=2".to_owned()));
        let driver = container(controller, containers::DRIVER).unwrap();
        let rust_log = driver.env.iter().flatten().find(|e| e.name == "RUST_LOG").unwrap();
        assert_eq!(rust_log.value.as_deref(), Some("info"));
    }

    #[test]
    fn the_spec_sets_images_log_level_placement_and_the_volumes_directory() {
        let mut spec = ReferenceCSIDriverSpec {
            images: Images { driver: Some("example.com/driver:v2".into()), ..Default::default() },
            log_level: LogLevel::Debug,
            ..Default::default()
        };
        spec.node_placement.node_selector.insert("storage".into(), "yes".into());
        spec.volumes_directory = Some("/srv/volumes".into());
        let assets = render(&spec, &placement(), None).unwrap();
        let node = pod(&assets, false);
        assert_eq!(container(node, containers::DRIVER).unwrap().image.as_deref(), Some("example.com/driver:v2"));
        // The Rust registrar comes with the driver image and keeps its command.
        let registrar = container(node, containers::REGISTRAR).unwrap();
        assert_eq!(registrar.image.as_deref(), Some("example.com/driver:v2"));
        assert!(registrar.command.is_some());
        assert!(!args(registrar).iter().any(|a| a.starts_with("--v=")), "the Rust registrar has no -v");
        assert_eq!(node.node_selector.as_ref().unwrap()["storage"], "yes");
        assert_eq!(pod(&assets, true).node_selector.as_ref().unwrap()["storage"], "yes");
        let state = node.volumes.iter().flatten().find(|v| v.name == "state").unwrap();
        assert_eq!(state.host_path.as_ref().unwrap().path, "/srv/volumes");
        let sidecar = container(node, containers::CSI_ADDONS).unwrap();
        assert_eq!(args(sidecar).iter().filter(|a| a.starts_with("--v=")).collect::<Vec<_>>(), ["--v=4"]);
    }

    #[test]
    fn with_a_ca_the_sidecars_serve_the_issued_certificate_and_the_csidriver_names_the_ca() {
        let assets =
            render(&ReferenceCSIDriverSpec::default(), &placement(), Some("-----BEGIN CERTIFICATE-----\n")).unwrap();
        let annotations = assets.csi_driver.metadata.annotations.as_ref().unwrap();
        assert!(annotations[api::driver::SIDECAR_CA_ANNOTATION].starts_with("-----BEGIN"));
        for controller in [true, false] {
            let pod = pod(&assets, controller);
            let sidecar = container(pod, containers::CSI_ADDONS).unwrap();
            assert!(args(sidecar).contains(&"--tls-cert-file=/etc/csi-addons/tls/tls.crt".to_owned()));
            let mount = sidecar.volume_mounts.iter().flatten().find(|m| m.name == "sidecar-tls").unwrap();
            assert_eq!(mount.read_only, Some(true));
            let volume = pod.volumes.iter().flatten().find(|v| v.name == "sidecar-tls").unwrap();
            assert_eq!(volume.secret.as_ref().unwrap().secret_name.as_deref(), Some(SERVING_SECRET));
            assert_eq!(pod.volumes.iter().flatten().filter(|v| v.name == "sidecar-tls").count(), 1);
            assert_eq!(args(sidecar).iter().filter(|a| a.starts_with("--tls-cert-file=")).count(), 1);
            assert!(
                container(pod, containers::DRIVER)
                    .unwrap()
                    .volume_mounts
                    .iter()
                    .flatten()
                    .all(|m| m.name != "sidecar-tls")
            );
        }
        // Without a CA the sidecars make their own certificate: the hand install's Secret, which
        // this operator does not issue then, is not mounted (a Pod would wait for it forever).
        let plain = render(&ReferenceCSIDriverSpec::default(), &placement(), None).unwrap();
        assert!(
            plain
                .csi_driver
                .metadata
                .annotations
                .as_ref()
                .is_none_or(|a| !a.contains_key(api::driver::SIDECAR_CA_ANNOTATION))
        );
        for controller in [true, false] {
            let pod = pod(&plain, controller);
            assert!(pod.volumes.iter().flatten().all(|v| v.name != "sidecar-tls"));
            let sidecar = container(pod, containers::CSI_ADDONS).unwrap();
            assert!(sidecar.volume_mounts.iter().flatten().all(|m| m.name != "sidecar-tls"));
            assert!(!args(sidecar).iter().any(|a| a.starts_with("--tls-")), "{:?}", args(sidecar));
        }
    }

    #[test]
    fn an_external_registrar_runs_its_own_entrypoint_and_addons_off_drops_the_sidecars() {
        let mut spec = ReferenceCSIDriverSpec::default();
        spec.images.node_registrar = Some("registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.15.0".into());
        spec.csi_addons.enabled = false;
        let assets = render(&spec, &placement(), None).unwrap();
        let registrar = container(pod(&assets, false), containers::REGISTRAR).unwrap();
        assert!(registrar.command.is_none());
        assert!(args(registrar).contains(&"--v=2".to_owned()));
        for controller in [true, false] {
            assert!(container(pod(&assets, controller), containers::CSI_ADDONS).is_none());
            assert!(container(pod(&assets, controller), containers::DRIVER).is_some());
        }
    }
}

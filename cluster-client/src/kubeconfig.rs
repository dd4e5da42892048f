//! Where the client's configuration comes from, in controller-runtime's order: an explicit
//! kubeconfig (`--kubeconfig`), then `KUBECONFIG` (a list of files, merged), then the Pod's
//! service account (in-cluster), then `~/.kube/config`. The proxy is chosen as client-go
//! chooses it (`proxy.rs`), wherever the configuration came from.
use std::path::{Path, PathBuf};

use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};

use crate::proxy;
use crate::yaml::{self, YamlError};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading the kubeconfig {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the kubeconfig {path}: {source}")]
    Yaml {
        path: PathBuf,
        #[source]
        source: YamlError,
    },
    #[error("the kubeconfig {path}: {source}")]
    Fields {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("the kubeconfig: {0}")]
    Kubeconfig(#[from] KubeconfigError),
    #[error("none of the files in KUBECONFIG ({0}) exists")]
    NoKubeconfigFile(String),
    #[error(transparent)]
    Proxy(#[from] crate::proxy::ProxyError),
    #[error("in-cluster configuration: {0}")]
    InCluster(#[from] kube::config::InClusterError),
    #[error(
        "no Kubernetes configuration: no --kubeconfig, no KUBECONFIG, not in a Pod (KUBERNETES_SERVICE_HOST unset) \
         and no ~/.kube/config"
    )]
    Missing,
}

/// The configuration to use (see the module's order).
pub async fn infer(explicit: Option<&Path>) -> Result<kube::Config, ConfigError> {
    let (mut config, kubeconfig_proxy) = load(explicit).await?;
    with_proxy(&mut config, kubeconfig_proxy.as_deref(), &proxy::Environment::current())?;
    Ok(config)
}

/// Sets `config`'s proxy as client-go would choose it (kube's loader takes `HTTPS_PROXY` for
/// any server and ignores `NO_PROXY`).
pub fn with_proxy(
    config: &mut kube::Config,
    kubeconfig_proxy: Option<&str>,
    environment: &proxy::Environment,
) -> Result<(), ConfigError> {
    config.proxy_url = match proxy::choose(&config.cluster_url, kubeconfig_proxy, environment)? {
        Some(chosen) => Some(chosen.to_uri().map_err(|e| proxy::ProxyError::Invalid {
            source_name: "the proxy URL",
            value: format!("{:?}", chosen.address),
            reason: e.to_string(),
        })?),
        None => None,
    };
    Ok(())
}

/// The configuration and the kubeconfig's `proxy-url` for its current context, if any.
async fn load(explicit: Option<&Path>) -> Result<(kube::Config, Option<String>), ConfigError> {
    if let Some(path) = explicit.filter(|p| !p.as_os_str().is_empty()) {
        return from_kubeconfig(read(path)?).await;
    }
    if let Some(list) = std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty()) {
        let mut merged: Option<Kubeconfig> = None;
        // client-go skips listed files that do not exist.
        for path in std::env::split_paths(&list).filter(|p| !p.as_os_str().is_empty() && p.exists()) {
            let next = read(&path)?;
            merged = Some(match merged {
                Some(merged) => merged.merge(next)?,
                None => next,
            });
        }
        let merged = merged.ok_or_else(|| ConfigError::NoKubeconfigFile(list.to_string_lossy().into_owned()))?;
        return from_kubeconfig(merged).await;
    }
    if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
        return Ok((kube::Config::incluster()?, None));
    }
    let home = std::env::var_os("HOME").map(|home| Path::new(&home).join(".kube").join("config"));
    match home.filter(|p| p.exists()) {
        Some(path) => from_kubeconfig(read(&path)?).await,
        None => Err(ConfigError::Missing),
    }
}

async fn from_kubeconfig(kubeconfig: Kubeconfig) -> Result<(kube::Config, Option<String>), ConfigError> {
    let proxy = current_proxy_url(&kubeconfig);
    Ok((kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?, proxy))
}

/// The `proxy-url` of the current context's cluster.
fn current_proxy_url(kubeconfig: &Kubeconfig) -> Option<String> {
    let current = kubeconfig.current_context.as_deref()?;
    let context = kubeconfig.contexts.iter().find(|c| c.name == current)?.context.as_ref()?;
    let cluster = kubeconfig.clusters.iter().find(|c| c.name == context.cluster)?.cluster.as_ref()?;
    cluster.proxy_url.clone().filter(|url| !url.is_empty())
}

/// One kubeconfig file (its documents merged), its relative paths taken from its directory as
/// client-go does.
pub fn read(path: &Path) -> Result<Kubeconfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
    parse(&text, path)
}

/// A kubeconfig's text, read from `path` (named in errors; relative paths are taken from its
/// directory).
pub fn parse(text: &str, path: &Path) -> Result<Kubeconfig, ConfigError> {
    let mut merged = Kubeconfig::default();
    let documents = yaml::documents(text).map_err(|source| ConfigError::Yaml { path: path.into(), source })?;
    for document in documents.into_iter().filter(|d| !d.is_null()) {
        let next: Kubeconfig =
            serde_json::from_value(document).map_err(|source| ConfigError::Fields { path: path.into(), source })?;
        merged = merged.merge(next)?;
    }
    if let Some(dir) = path.parent() {
        resolve_paths(&mut merged, dir);
    }
    Ok(merged)
}

fn resolve_paths(kubeconfig: &mut Kubeconfig, dir: &Path) {
    let absolute = |path: &mut Option<String>| {
        if let Some(p) = path.as_mut().filter(|p| !p.is_empty() && Path::new(p.as_str()).is_relative()) {
            *p = dir.join(p.as_str()).to_string_lossy().into_owned();
        }
    };
    for cluster in kubeconfig.clusters.iter_mut().filter_map(|named| named.cluster.as_mut()) {
        absolute(&mut cluster.certificate_authority);
    }
    for user in kubeconfig.auth_infos.iter_mut().filter_map(|named| named.auth_info.as_mut()) {
        absolute(&mut user.client_certificate);
        absolute(&mut user.client_key);
        absolute(&mut user.token_file);
        // A command with a path separator is relative to the file; a bare name is looked up in PATH.
        if let Some(exec) = user.exec.as_mut()
            && exec.command.as_deref().is_some_and(|c| c.contains(std::path::MAIN_SEPARATOR))
        {
            absolute(&mut exec.command);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBECONFIG: &str = "apiVersion: v1
kind: Config
current-context: ctx
clusters:
- name: c
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority: ca.crt
contexts:
- name: ctx
  context: {cluster: c, user: u, namespace: team}
users:
- name: u
  user:
    tokenFile: token
    client-certificate: /abs/cert.pem
    exec:
      command: ./bin/helper
      apiVersion: client.authentication.k8s.io/v1
";

    #[test]
    fn relative_paths_are_taken_from_the_files_directory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        std::fs::write(&path, KUBECONFIG).unwrap();
        let kubeconfig = read(&path).unwrap();
        let cluster = kubeconfig.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.certificate_authority.as_deref(), Some(dir.path().join("ca.crt").to_str().unwrap()));
        let user = kubeconfig.auth_infos[0].auth_info.as_ref().unwrap();
        assert_eq!(user.token_file.as_deref(), Some(dir.path().join("token").to_str().unwrap()));
        assert_eq!(user.client_certificate.as_deref(), Some("/abs/cert.pem"));
        let command = user.exec.as_ref().unwrap().command.as_deref().unwrap();
        assert_eq!(command, dir.path().join("./bin/helper").to_str().unwrap());
        assert_eq!(kubeconfig.current_context.as_deref(), Some("ctx"));
    }

    #[test]
    fn a_wrong_type_names_the_file_and_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        std::fs::write(&path, "clusters: {a: b}\n").unwrap();
        let error = read(&path).unwrap_err().to_string();
        assert!(error.contains(path.to_str().unwrap()) && error.contains("invalid type"), "{error}");
        let missing = read(&dir.path().join("absent")).unwrap_err().to_string();
        assert!(missing.starts_with("reading the kubeconfig"), "{missing}");
    }
}

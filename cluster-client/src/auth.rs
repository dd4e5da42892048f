//! The credentials every request carries, from the kubeconfig's user (or the Pod's service
//! account): a fixed token or basic auth, a token file read again every minute (service-account
//! tokens rotate), or a client-go credential plugin (`exec`) run again when what it returned
//! expires. A plugin may return a token, a client certificate, or both; certificates are handed
//! to the TLS side (`tls.rs`), which also presents the kubeconfig's own. kube's own layer brings a JSONPath engine
//! and a regex engine (some 500 KB of code mapped for the process's life) for auth providers
//! client-go itself no longer has.
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use base64::Engine;
use http::header::{AUTHORIZATION, HeaderValue};
use kube::config::{AuthInfo, ExecConfig, ExecInteractiveMode};
use secrecy::ExposeSecret;
use tower::BoxError;

use crate::tls::PluginIdentity;

/// How often a token file is read again (client-go's period).
const TOKEN_FILE_RELOAD: Duration = Duration::from_secs(60);
/// A plugin's token is renewed this long before it expires.
const EXPIRY_MARGIN: jiff::SignedDuration = jiff::SignedDuration::from_secs(10);
/// How much of a failed plugin's stderr goes into the error.
const STDERR_SHOWN: usize = 500;

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("the auth-provider {0:?} is not supported (client-go removed it too): use an exec credential plugin")]
    Provider(String),
    #[error("the oidc auth-provider has no id-token")]
    NoIdToken,
    #[error("reading the token file {path}: {source}")]
    TokenFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the credentials are not valid in an HTTP header")]
    Header(#[from] http::header::InvalidHeaderValue),
    #[error("the exec credential plugin has no command")]
    NoCommand,
    #[error("the exec credential plugin {0:?} needs an interactive terminal (interactiveMode: Always); there is none")]
    Interactive(String),
    #[error("running the exec credential plugin {command:?}: {source}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the exec credential plugin {command:?} failed ({status}): {stderr}")]
    PluginFailed { command: String, status: std::process::ExitStatus, stderr: String },
    #[error(
        "the exec credential plugin {command:?} printed no ExecCredential with a status.token or a client certificate: \
         {detail}"
    )]
    NoCredential { command: String, detail: String },
    #[error("the client certificate of the exec credential plugin {command:?}: {source}")]
    PluginCertificate {
        command: String,
        #[source]
        source: crate::tls::TlsError,
    },
}

/// What the requests carry.
pub enum Credentials {
    None,
    Fixed(HeaderValue),
    TokenFile {
        path: PathBuf,
        current: Mutex<(HeaderValue, Instant)>,
    },
    Exec {
        command: String,
        plugin: Box<ExecConfig>,
        /// The token header (if the plugin gave one) and when what it gave expires.
        current: tokio::sync::Mutex<Option<(Option<HeaderValue>, Option<jiff::Timestamp>)>>,
        /// The client certificate it gave, read by TLS handshakes.
        identity: Arc<PluginIdentity>,
    },
}

impl Credentials {
    /// The credentials of `user`, in kube's order of precedence: auth-provider, basic auth,
    /// token, token file, exec plugin.
    pub fn of(user: &AuthInfo) -> Result<Self, AuthError> {
        if let Some(provider) = &user.auth_provider {
            if provider.name != "oidc" {
                return Err(AuthError::Provider(provider.name.clone()));
            }
            let token = provider.config.get("id-token").ok_or(AuthError::NoIdToken)?;
            return Ok(Credentials::Fixed(bearer(token)?));
        }
        if let (Some(user), Some(password)) = (&user.username, &user.password) {
            let pair = format!("{user}:{}", password.expose_secret());
            let encoded = base64::engine::general_purpose::STANDARD.encode(pair);
            return Ok(Credentials::Fixed(sensitive(&format!("Basic {encoded}"))?));
        }
        if let Some(token) = &user.token {
            return Ok(Credentials::Fixed(bearer(token.expose_secret())?));
        }
        if let Some(path) = &user.token_file {
            let path = PathBuf::from(path);
            let header = read_token_file(&path)?;
            return Ok(Credentials::TokenFile { path, current: Mutex::new((header, Instant::now())) });
        }
        if let Some(plugin) = &user.exec {
            let command = plugin.command.clone().ok_or(AuthError::NoCommand)?;
            if matches!(plugin.interactive_mode, Some(ExecInteractiveMode::Always)) {
                return Err(AuthError::Interactive(command));
            }
            return Ok(Credentials::Exec {
                command,
                plugin: Box::new(plugin.clone()),
                current: tokio::sync::Mutex::new(None),
                identity: Arc::default(),
            });
        }
        Ok(Credentials::None)
    }

    /// Where the client certificates an exec plugin returns are kept, for the TLS configuration.
    pub fn plugin_identity(&self) -> Option<Arc<PluginIdentity>> {
        match self {
            Credentials::Exec { identity, .. } => Some(Arc::clone(identity)),
            _ => None,
        }
    }

    /// The Authorization header for the next request, renewed when due (and, for a plugin, the
    /// client certificate with it, before the request needs a connection).
    pub async fn header(&self) -> Result<Option<HeaderValue>, AuthError> {
        match self {
            Credentials::None => Ok(None),
            Credentials::Fixed(header) => Ok(Some(header.clone())),
            Credentials::TokenFile { path, current } => {
                let mut current = current.lock().unwrap_or_else(|e| e.into_inner());
                if current.1.elapsed() >= TOKEN_FILE_RELOAD {
                    match read_token_file(path) {
                        Ok(header) => current.0 = header,
                        // The token read last is likely still valid: keep it, try again later.
                        Err(error) => tracing::warn!(%error, "the token file could not be read again"),
                    }
                    current.1 = Instant::now();
                }
                Ok(Some(current.0.clone()))
            }
            Credentials::Exec { command, plugin, current, identity } => {
                let mut current = current.lock().await;
                let due = |expiry: &Option<jiff::Timestamp>| {
                    expiry.is_some_and(|at| at.duration_since(jiff::Timestamp::now()) <= EXPIRY_MARGIN)
                };
                match current.as_ref() {
                    Some((header, expiry)) if !due(expiry) => Ok(header.clone()),
                    _ => {
                        let fresh = run_plugin(command, plugin).await?;
                        if let Some((certificate, key)) = &fresh.certificate {
                            identity
                                .set(certificate, key)
                                .map_err(|source| AuthError::PluginCertificate { command: command.clone(), source })?;
                        }
                        *current = Some((fresh.header.clone(), fresh.expiry));
                        Ok(fresh.header)
                    }
                }
            }
        }
    }
}

fn sensitive(value: &str) -> Result<HeaderValue, AuthError> {
    let mut header = HeaderValue::from_str(value)?;
    header.set_sensitive(true);
    Ok(header)
}

fn bearer(token: &str) -> Result<HeaderValue, AuthError> {
    sensitive(&format!("Bearer {}", token.trim()))
}

fn read_token_file(path: &PathBuf) -> Result<HeaderValue, AuthError> {
    let token = std::fs::read_to_string(path).map_err(|source| AuthError::TokenFile { path: path.clone(), source })?;
    bearer(&token)
}

/// What an exec plugin printed.
struct PluginCredential {
    header: Option<HeaderValue>,
    /// PEM certificate chain and key.
    certificate: Option<(String, String)>,
    expiry: Option<jiff::Timestamp>,
}

/// Runs the plugin as client-go does (`KUBERNETES_EXEC_INFO` set, no terminal) and reads the
/// ExecCredential it prints: a token and/or a client certificate, and when they expire.
async fn run_plugin(command: &str, plugin: &ExecConfig) -> Result<PluginCredential, AuthError> {
    let api_version = plugin.api_version.as_deref().unwrap_or("client.authentication.k8s.io/v1");
    let mut spec = serde_json::json!({"interactive": false});
    if plugin.provide_cluster_info
        && let Some(cluster) = &plugin.cluster
        && let Ok(cluster) = serde_json::to_value(cluster)
    {
        spec["cluster"] = cluster;
    }
    let info = serde_json::json!({"apiVersion": api_version, "kind": "ExecCredential", "spec": spec});
    let mut child = tokio::process::Command::new(command);
    child.args(plugin.args.iter().flatten()).env("KUBERNETES_EXEC_INFO", info.to_string());
    for name in plugin.drop_env.iter().flatten() {
        child.env_remove(name);
    }
    for variable in plugin.env.iter().flatten() {
        if let (Some(name), Some(value)) = (variable.get("name"), variable.get("value")) {
            child.env(name, value);
        }
    }
    let output = child
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|source| AuthError::Spawn { command: command.to_owned(), source })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let stderr = stderr.trim().chars().take(STDERR_SHOWN).collect();
        return Err(AuthError::PluginFailed { command: command.to_owned(), status: output.status, stderr });
    }
    let unusable = |detail: &str| AuthError::NoCredential { command: command.to_owned(), detail: detail.to_owned() };
    let credential: serde_json::Value =
        serde_json::from_slice(&output.stdout).map_err(|e| unusable(&format!("not JSON ({e})")))?;
    let field =
        |name: &str| credential.pointer(&format!("/status/{name}")).and_then(|t| t.as_str()).filter(|t| !t.is_empty());
    let header = field("token").map(bearer).transpose()?;
    let certificate = match (field("clientCertificateData"), field("clientKeyData")) {
        (Some(certificate), Some(key)) => Some((certificate.to_owned(), key.to_owned())),
        (None, None) => None,
        _ => return Err(unusable("status.clientCertificateData and status.clientKeyData come together")),
    };
    if header.is_none() && certificate.is_none() {
        return Err(unusable("status.token and status.clientCertificateData are both missing"));
    }
    let expiry = match field("expirationTimestamp") {
        Some(at) => Some(at.parse::<jiff::Timestamp>().map_err(|e| unusable(&format!("expirationTimestamp: {e}")))?),
        None => None,
    };
    Ok(PluginCredential { header, certificate, expiry })
}

/// The layer putting `Credentials` on every request.
#[derive(Clone)]
pub struct AuthLayer(pub Arc<Credentials>);

impl<S> tower::Layer<S> for AuthLayer {
    type Service = Authorized<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Authorized { inner, credentials: Arc::clone(&self.0) }
    }
}

#[derive(Clone)]
pub struct Authorized<S> {
    inner: S,
    credentials: Arc<Credentials>,
}

impl<S, B> tower::Service<http::Request<B>> for Authorized<S>
where
    S: tower::Service<http::Request<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        // The service polled ready is the one called; a clone stays for the next request.
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        let credentials = Arc::clone(&self.credentials);
        Box::pin(async move {
            if let Some(header) = credentials.header().await? {
                request.headers_mut().insert(AUTHORIZATION, header);
            }
            inner.call(request).await.map_err(Into::into)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn user(yaml: &str) -> AuthInfo {
        let documents = crate::yaml::documents(yaml).unwrap();
        serde_json::from_value(documents.into_iter().next().unwrap()).unwrap()
    }

    async fn header_of(credentials: &Credentials) -> String {
        credentials.header().await.unwrap().unwrap().to_str().unwrap().to_owned()
    }

    #[tokio::test]
    async fn fixed_credentials_in_kubes_order() {
        let token = Credentials::of(&user("token: abc\ntokenFile: /nonexistent\n")).unwrap();
        assert_eq!(header_of(&token).await, "Bearer abc");
        let basic = Credentials::of(&user("username: u\npassword: p\ntoken: abc\n")).unwrap();
        assert_eq!(header_of(&basic).await, "Basic dTpw");
        let oidc = Credentials::of(&user("auth-provider: {name: oidc, config: {id-token: idt}}\n")).unwrap();
        assert_eq!(header_of(&oidc).await, "Bearer idt");
        let header = oidc.header().await.unwrap().unwrap();
        assert!(header.is_sensitive(), "a token is marked sensitive so it is never logged");
        assert!(matches!(Credentials::of(&user("{}")).unwrap(), Credentials::None));
        let gcp = Credentials::of(&user("auth-provider: {name: gcp}\n")).err().unwrap().to_string();
        assert!(gcp.contains("\"gcp\" is not supported") && gcp.contains("exec"), "{gcp}");
    }

    #[tokio::test]
    async fn a_token_file_is_read_again_once_a_minute() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "first\n").unwrap();
        let credentials = Credentials::of(&user(&format!("tokenFile: {}\n", path.display()))).unwrap();
        std::fs::write(&path, "second\n").unwrap();
        assert_eq!(header_of(&credentials).await, "Bearer first", "not yet due");
        let Credentials::TokenFile { current, .. } = &credentials else { unreachable!() };
        let minute_ago = Instant::now().checked_sub(TOKEN_FILE_RELOAD).unwrap();
        current.lock().unwrap().1 = minute_ago;
        assert_eq!(header_of(&credentials).await, "Bearer second");
        // A file gone keeps the token read last.
        std::fs::remove_file(&path).unwrap();
        current.lock().unwrap().1 = minute_ago;
        assert_eq!(header_of(&credentials).await, "Bearer second");
        let missing = Credentials::of(&user(&format!("tokenFile: {}\n", path.display()))).err().unwrap();
        assert!(missing.to_string().starts_with("reading the token file"), "{missing}");
    }

    /// A plugin script: counts its runs, checks what client-go sets, prints `credential`.
    fn plugin(dir: &std::path::Path, credential: &str) -> String {
        let script = dir.join("plugin.sh");
        let body = format!(
            "#!/bin/sh\necho run >> {runs}\ncase \"$KUBERNETES_EXEC_INFO\" in *'\"interactive\":false'*) ;; *) echo no exec info >&2; exit 3;; esac\n\
             [ \"$PLUGIN_ENV\" = set ] || {{ echo env not passed >&2; exit 4; }}\necho '{credential}'\n",
            runs = dir.join("runs").display()
        );
        std::fs::write(&script, body).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        format!(
            "exec:\n  apiVersion: client.authentication.k8s.io/v1\n  command: {}\n  env: [{{name: PLUGIN_ENV, value: set}}]\n",
            script.display()
        )
    }

    fn runs(dir: &std::path::Path) -> usize {
        std::fs::read_to_string(dir.join("runs")).map_or(0, |r| r.lines().count())
    }

    #[tokio::test]
    async fn an_exec_plugin_runs_again_only_when_its_token_expires() {
        let dir = tempfile::tempdir().unwrap();
        let lasting =
            r#"{"kind":"ExecCredential","status":{"token":"t1","expirationTimestamp":"2999-01-01T00:00:00Z"}}"#;
        let credentials = Credentials::of(&user(&plugin(dir.path(), lasting))).unwrap();
        assert_eq!(runs(dir.path()), 0, "run when the first request needs it");
        assert_eq!(header_of(&credentials).await, "Bearer t1");
        assert_eq!(header_of(&credentials).await, "Bearer t1");
        assert_eq!(runs(dir.path()), 1);

        let dir = tempfile::tempdir().unwrap();
        let expiring =
            r#"{"kind":"ExecCredential","status":{"token":"t2","expirationTimestamp":"2000-01-01T00:00:00Z"}}"#;
        let credentials = Credentials::of(&user(&plugin(dir.path(), expiring))).unwrap();
        assert_eq!(header_of(&credentials).await, "Bearer t2");
        assert_eq!(header_of(&credentials).await, "Bearer t2");
        assert_eq!(runs(dir.path()), 2, "an expired token is renewed");
    }

    #[tokio::test]
    async fn a_failing_or_silent_plugin_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = user(&plugin(dir.path(), "{}"));
        let silent = Credentials::of(&config).unwrap().header().await.unwrap_err().to_string();
        assert!(silent.contains("status.token and status.clientCertificateData are both missing"), "{silent}");
        config.exec.as_mut().unwrap().env = None;
        let failing = Credentials::of(&config).unwrap().header().await.unwrap_err().to_string();
        assert!(failing.contains("failed") && failing.contains("env not passed"), "{failing}");
        config.exec.as_mut().unwrap().command = Some(dir.path().join("absent").display().to_string());
        let absent = Credentials::of(&config).unwrap().header().await.unwrap_err().to_string();
        assert!(absent.starts_with("running the exec credential plugin"), "{absent}");
        let always = user("exec: {command: x, apiVersion: client.authentication.k8s.io/v1, interactiveMode: Always}\n");
        let always = Credentials::of(&always).err().unwrap().to_string();
        assert!(always.contains("interactive terminal"), "{always}");
    }
}

//! Our configuration loader (`cluster_client::kubeconfig`, `auth`, `tls`, `proxy`) next to kube's
//! own, on a corpus of kubeconfigs: for each, what either would send to the API server — the
//! server, the Authorization header or client certificate, the CA, the TLS server name and the
//! proxy — must be the same, except the proxy, where client-go's choice is the reference (kube's
//! loader takes `HTTPS_PROXY` for any server and ignores `NO_PROXY`).
//!
//! Each case runs in a child process (this test binary, running `probe_child_process` only) so
//! its environment — `KUBECONFIG`, proxies, the in-cluster variables — is its own; the in-cluster
//! case also gets its own mount namespace with the service-account files where client-go and kube
//! look for them.
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use rcgen::{CertificateParams, KeyPair};
use serde_json::{Value, json};

/// What a loader would send, as comparable text.
fn sent(
    config: &kube::Config,
    authorization: Result<Option<String>, String>,
    certificate: Result<Option<Vec<u8>>, String>,
) -> Value {
    let ca = match &config.root_cert_file {
        Some(path) => std::fs::read(path)
            .map(|pem| cluster_client::tls::pem_certificates(&pem).iter().map(|c| c.to_vec()).collect()),
        None => Ok(config.root_cert.clone().unwrap_or_default()),
    };
    let server_name = config.tls_server_name.clone().or_else(|| config.cluster_url.host().map(str::to_owned));
    json!({
        "server": config.cluster_url.to_string(),
        "authorization": authorization,
        "client certificate": certificate.map(|c| c.map(|der| fingerprint(&der))),
        "CA": ca.map(|roots: Vec<Vec<u8>>| roots.iter().map(|der| fingerprint(der)).collect::<Vec<_>>()).map_err(|e| e.to_string()),
        "server name": server_name,
        "proxy": config.proxy_url.as_ref().map(ToString::to_string),
    })
}

fn fingerprint(der: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(der).iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// The first certificate a TLS configuration would present.
fn presented(config: &rustls::ClientConfig) -> Option<Vec<u8>> {
    let schemes = [rustls::SignatureScheme::ECDSA_NISTP256_SHA256, rustls::SignatureScheme::RSA_PSS_SHA256];
    let key = config.client_auth_cert_resolver.resolve(&[], &schemes)?;
    key.cert.first().map(|c| c.to_vec())
}

async fn kubes(config: kube::Config) -> Value {
    use kube::client::ConfigExt;
    use tower::{Layer, ServiceExt};
    let authorization = async {
        let Some(layer) = config.auth_layer().map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        // The "server" answers with the Authorization header it was sent.
        let capture = tower::service_fn(|request: http::Request<kube::client::Body>| async move {
            let header =
                request.headers().get(http::header::AUTHORIZATION).map(|h| h.to_str().unwrap_or("?").to_owned());
            Ok::<_, tower::BoxError>(http::Response::new(header))
        });
        let answer = layer.layer(capture).oneshot(http::Request::new(kube::client::Body::from(Vec::new()))).await;
        answer.map(http::Response::into_body).map_err(|e| e.to_string())
    }
    .await;
    let certificate = config.rustls_client_config().map(|tls| presented(&tls)).map_err(|e| e.to_string());
    sent(&config, authorization, certificate)
}

async fn ours(config: kube::Config) -> Value {
    let credentials = match cluster_client::auth::Credentials::of(&config.auth_info) {
        Ok(credentials) => credentials,
        Err(e) => return sent(&config, Err(e.to_string()), Err(e.to_string())),
    };
    // A plugin runs for the first request's header, before its connection's handshake.
    let authorization = credentials.header().await.map(|h| h.map(|h| h.to_str().unwrap_or("?").to_owned()));
    let certificate =
        cluster_client::tls::client_config(&config, credentials.plugin_identity()).map(|tls| presented(&tls));
    sent(&config, authorization.map_err(|e| e.to_string()), certificate.map_err(|e| e.to_string()))
}

/// Run by `kube_and_ours_send_the_same` in a child process: loads the configuration of this
/// process's environment both ways and writes what each would send to `$LOADER_PROBE_OUT`.
#[tokio::test]
#[ignore = "a child process of kube_and_ours_send_the_same"]
async fn probe_child_process() {
    let Some(out) = std::env::var_os("LOADER_PROBE_OUT") else {
        return;
    };
    let kube = match kube::Config::infer().await {
        Ok(config) => kubes(config).await,
        Err(e) => json!({"error": e.to_string()}),
    };
    let ours = match cluster_client::kubeconfig::infer(None).await {
        Ok(config) => ours(config).await,
        Err(e) => json!({"error": e.to_string()}),
    };
    std::fs::write(out, json!({"kube": kube, "ours": ours}).to_string()).unwrap();
}

/// The files the corpus refers to.
struct Corpus {
    dir: tempfile::TempDir,
    ca_pem: String,
    client_pem: (String, String),
    plugin_pem: (String, String),
}

impl Corpus {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let pair = |name: &str| {
            let key = KeyPair::generate().unwrap();
            let cert = CertificateParams::new(vec![name.to_owned()]).unwrap().self_signed(&key).unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let (ca_pem, _) = pair("ca");
        let client_pem = pair("client");
        let plugin_pem = pair("plugin");
        std::fs::write(dir.path().join("ca.crt"), &ca_pem).unwrap();
        std::fs::write(dir.path().join("client.crt"), &client_pem.0).unwrap();
        std::fs::write(dir.path().join("client.key"), &client_pem.1).unwrap();
        std::fs::write(dir.path().join("token"), "from-a-file").unwrap();
        std::fs::write(dir.path().join("token-line"), "from-a-file\n").unwrap();
        let corpus = Corpus { dir, ca_pem, client_pem, plugin_pem };
        corpus.plugin("token-plugin", &json!({"token": "from-a-plugin"}));
        let (cert, key) = &corpus.plugin_pem;
        corpus.plugin("cert-plugin", &json!({"clientCertificateData": cert, "clientKeyData": key}));
        corpus
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// An exec plugin printing an ExecCredential with `status`.
    fn plugin(&self, name: &str, status: &Value) {
        use std::os::unix::fs::PermissionsExt;
        let credential =
            json!({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential", "status": status});
        let path = self.path(name);
        std::fs::write(&path, format!("#!/bin/sh\ncat <<'EOF'\n{credential}\nEOF\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// A kubeconfig file `name` with one cluster `server` (plus `cluster` fields) and one user.
    fn kubeconfig(&self, name: &str, server: &str, cluster: Value, user: Value) -> PathBuf {
        let mut cluster_fields = json!({"server": server, "certificate-authority": "ca.crt"});
        merge(&mut cluster_fields, cluster);
        let config = json!({
            "apiVersion": "v1", "kind": "Config", "current-context": "main",
            "clusters": [{"name": "c", "cluster": cluster_fields}],
            "users": [{"name": "u", "user": user}],
            "contexts": [{"name": "main", "context": {"cluster": "c", "user": "u"}}],
        });
        let path = self.path(name);
        std::fs::write(&path, serde_yaml::to_string(&config).unwrap()).unwrap();
        path
    }

    fn b64(text: &str) -> String {
        use std::fmt::Write;
        const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let data = text.as_bytes();
        let mut out = String::new();
        for chunk in data.chunks(3) {
            let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for i in 0..4 {
                if i <= chunk.len() {
                    out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
                } else {
                    let _ = write!(out, "=");
                }
            }
        }
        out
    }
}

fn merge(into: &mut Value, from: Value) {
    if let (Some(into), Value::Object(from)) = (into.as_object_mut(), from) {
        into.extend(from);
    }
}

/// client-go's proxy for a case.
fn proxy(url: Option<&str>) -> Vec<(&'static str, Value)> {
    vec![("proxy", json!(url))]
}

/// One case: the environment of the child process and what client-go would send.
struct Case {
    name: &'static str,
    env: Vec<(&'static str, String)>,
    in_cluster: bool,
    /// What client-go sends, where the test says it outright (the proxy always).
    client_go: Vec<(&'static str, Value)>,
}

fn cases(corpus: &Corpus) -> Vec<Case> {
    let server = "https://api.example.com:6443";
    let file =
        |name: &str, cluster: Value, user: Value| corpus.kubeconfig(name, server, cluster, user).display().to_string();
    let kubeconfig = |path: String| vec![("KUBECONFIG", path)];
    let plain = |name: &'static str, user: Value| Case {
        name,
        env: kubeconfig(file(&format!("{name}.yaml"), json!({}), user)),
        in_cluster: false,
        client_go: proxy(None),
    };
    let (client_cert, client_key) = &corpus.client_pem;
    let mut all = vec![
        plain("token", json!({"token": "inline-token"})),
        plain("token-file", json!({"tokenFile": "token"})),
        Case {
            name: "token-file ending in a newline",
            env: kubeconfig(file("token-newline.yaml", json!({}), json!({"tokenFile": "token-line"}))),
            in_cluster: false,
            client_go: vec![("authorization", json!({"Ok": "Bearer from-a-file"})), ("proxy", Value::Null)],
        },
        plain("basic", json!({"username": "admin", "password": "s3cret"})),
        plain(
            "exec with a token",
            json!({"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "./token-plugin"}}),
        ),
        plain(
            "exec with a client certificate",
            json!({"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "./cert-plugin"}}),
        ),
        plain(
            "oidc",
            json!({"auth-provider": {"name": "oidc", "config": {"id-token": "an-id-token", "client-id": "k"}}}),
        ),
        plain(
            "client-certificate data",
            json!({"client-certificate-data": Corpus::b64(client_cert), "client-key-data": Corpus::b64(client_key)}),
        ),
        plain("client-certificate files", json!({"client-certificate": "client.crt", "client-key": "client.key"})),
    ];
    // Several contexts: the current one decides server, user and TLS server name.
    let contexts = json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "second",
        "clusters": [
            {"name": "one", "cluster": {"server": "https://one.example.com", "certificate-authority": "ca.crt"}},
            {"name": "two", "cluster": {"server": "https://10.0.0.2:6443", "certificate-authority-data": Corpus::b64(&corpus.ca_pem),
                                        "tls-server-name": "two.internal"}},
        ],
        "users": [{"name": "a", "user": {"token": "token-a"}}, {"name": "b", "user": {"token": "token-b"}}],
        "contexts": [
            {"name": "first", "context": {"cluster": "one", "user": "a"}},
            {"name": "second", "context": {"cluster": "two", "user": "b", "namespace": "team"}},
        ],
    });
    std::fs::write(corpus.path("contexts.yaml"), serde_yaml::to_string(&contexts).unwrap()).unwrap();
    all.push(Case {
        name: "several contexts",
        env: kubeconfig(corpus.path("contexts.yaml").display().to_string()),
        in_cluster: false,
        client_go: proxy(None),
    });
    // A merged KUBECONFIG: the first file to set a field wins.
    let first = file("merged-1.yaml", json!({}), json!({"token": "first-file"}));
    let second = corpus.path("contexts.yaml").display().to_string();
    all.push(Case {
        name: "merged KUBECONFIG",
        env: kubeconfig(format!("{first}:{second}")),
        in_cluster: false,
        client_go: proxy(None),
    });
    // Proxies.
    let with_proxy_url = file("proxy-url.yaml", json!({"proxy-url": "http://proxy.corp:3128"}), json!({"token": "t"}));
    all.push(Case {
        name: "proxy-url",
        env: kubeconfig(with_proxy_url),
        in_cluster: false,
        client_go: proxy(Some("http://proxy.corp:3128/")),
    });
    let token = file("env-proxy.yaml", json!({}), json!({"token": "t"}));
    all.push(Case {
        name: "HTTPS_PROXY",
        env: vec![("KUBECONFIG", token.clone()), ("HTTPS_PROXY", "http://env-proxy:3128".into())],
        in_cluster: false,
        client_go: proxy(Some("http://env-proxy:3128/")),
    });
    all.push(Case {
        name: "HTTPS_PROXY with the server in NO_PROXY",
        env: vec![
            ("KUBECONFIG", token),
            ("HTTPS_PROXY", "http://env-proxy:3128".into()),
            ("NO_PROXY", "localhost,.example.com".into()),
        ],
        in_cluster: false,
        client_go: proxy(None),
    });
    let loopback = corpus.kubeconfig("loopback.yaml", "https://127.0.0.1:6443", json!({}), json!({"token": "t"}));
    all.push(Case {
        name: "HTTPS_PROXY and a loopback server",
        env: vec![("KUBECONFIG", loopback.display().to_string()), ("https_proxy", "http://env-proxy:3128".into())],
        in_cluster: false,
        client_go: proxy(None),
    });
    all.push(Case {
        name: "in-cluster",
        env: vec![("KUBERNETES_SERVICE_HOST", "10.96.0.1".into()), ("KUBERNETES_SERVICE_PORT", "443".into())],
        in_cluster: true,
        client_go: proxy(None),
    });
    all.push(Case {
        name: "in-cluster with HTTPS_PROXY",
        env: vec![
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1".into()),
            ("KUBERNETES_SERVICE_PORT", "443".into()),
            ("HTTPS_PROXY", "http://env-proxy:3128".into()),
        ],
        in_cluster: true,
        client_go: proxy(Some("http://env-proxy:3128/")),
    });
    all
}

/// Runs `probe_child_process` with `case`'s environment and nothing else of this one's.
fn probe(corpus: &Corpus, case: &Case) -> BTreeMap<String, Value> {
    let out = corpus.path("probe.json");
    let _ = std::fs::remove_file(&out);
    let test_binary = std::env::current_exe().unwrap();
    let filter =
        ["cluster_client::kubeconfig_loaders::probe_child_process", "--exact", "--ignored", "--test-threads=1", "-q"];
    let mut command = if case.in_cluster {
        // client-go and kube read the service account's files from one fixed directory.
        const MOUNTED: &str = "/run/secrets/kubernetes.io/serviceaccount";
        let script = format!(
            "mount -t tmpfs none /run && mkdir -p {MOUNTED} && cp '{dir}/token' {MOUNTED}/token \
             && cp '{dir}/ca.crt' {MOUNTED}/ca.crt && echo team > {MOUNTED}/namespace && exec \"$0\" \"$@\"",
            dir = corpus.dir.path().display()
        );
        let mut command = Command::new("unshare");
        command.args(["--mount", "--propagation", "private", "sh", "-c", &script]).arg(&test_binary);
        command
    } else {
        Command::new(&test_binary)
    };
    command.args(filter).env_clear().env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
    command.env("HOME", corpus.dir.path()).env("LOADER_PROBE_OUT", &out).current_dir(corpus.dir.path());
    command.envs(case.env.iter().map(|(k, v)| (*k, v.as_str())));
    let output = command.output().unwrap();
    assert!(output.status.success(), "{}: the probe failed: {}", case.name, String::from_utf8_lossy(&output.stderr));
    let text = std::fs::read_to_string(&out).unwrap_or_else(|e| {
        panic!("{}: no probe output ({e}): {}", case.name, String::from_utf8_lossy(&output.stdout))
    });
    serde_json::from_str(&text).unwrap()
}

/// Where kube's loader departs from client-go (and so from ours): the cases the corpus holds for
/// that reason, and the field that differs.
const KUBE_DEPARTS: [(&str, &str); 4] = [
    // kube sends the file's trailing newline, which no header may hold; client-go trims it.
    ("token-file ending in a newline", "authorization"),
    // kube takes HTTPS_PROXY for every server; client-go honours NO_PROXY, never proxies
    // loopback, and applies the environment in a Pod too.
    ("HTTPS_PROXY with the server in NO_PROXY", "proxy"),
    ("HTTPS_PROXY and a loopback server", "proxy"),
    ("in-cluster with HTTPS_PROXY", "proxy"),
];

#[test]
fn kube_and_ours_send_the_same() {
    let corpus = Corpus::new();
    let mut departures = Vec::new();
    for case in cases(&corpus) {
        let sides = probe(&corpus, &case);
        let (kube, ours) = (&sides["kube"], &sides["ours"]);
        assert!(ours.get("error").is_none(), "{}: our loader failed: {ours}", case.name);
        assert!(kube.get("error").is_none(), "{}: kube's loader failed: {kube}", case.name);
        for field in ["server", "authorization", "client certificate", "CA", "server name", "proxy"] {
            assert!(ours[field].get("Err").is_none(), "{}: {field}: {ours}", case.name);
            if ours[field] != kube[field] {
                departures.push((case.name, field));
            }
            match case.client_go.iter().find(|(f, _)| *f == field) {
                Some((_, expected)) => {
                    assert_eq!(&ours[field], expected, "{}: {field} is not client-go's\nours: {ours}", case.name);
                }
                None if KUBE_DEPARTS.contains(&(case.name, field)) => {
                    panic!("{}: {field} departs from kube's without client-go's value to compare", case.name)
                }
                None => assert_eq!(ours[field], kube[field], "{}: {field}\nours: {ours}\nkube: {kube}", case.name),
            }
        }
        eprintln!("{:<40} {}", case.name, ours);
    }
    assert_eq!(departures, KUBE_DEPARTS, "the fields where kube's loader and ours differ");
}

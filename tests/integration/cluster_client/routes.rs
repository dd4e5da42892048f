//! The API client reaching the real API server the ways users configure: through an HTTP CONNECT
//! proxy or a SOCKS5 one named by the kubeconfig's `proxy-url`, through `HTTPS_PROXY` (the
//! manager process, which could not start with a proxy set before), and with the client
//! certificate an exec credential plugin returns.
//!
//! The kubeconfigs name the API server `kubernetes` (a name its certificate holds but no resolver
//! here knows), so only a proxy, which connects to 127.0.0.1 whatever the name, can reach it.
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::harness::sidecar::{free_port, http_get};
use crate::harness::support::workspace_binary;

/// What a proxy was asked: the target (`host:port`) and the Proxy-Authorization, if any, of each
/// tunnel.
type Asked = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// A proxy on loopback that connects every tunnel to 127.0.0.1 and remembers what it was asked.
struct TestProxy {
    port: u16,
    asked: Asked,
}

#[derive(Clone, Copy)]
enum Kind {
    Http,
    Socks5,
}

impl TestProxy {
    async fn start(kind: Kind) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let asked = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&asked);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let record = Arc::clone(&record);
                tokio::spawn(async move {
                    let _ = match kind {
                        Kind::Http => connect_tunnel(stream, record).await,
                        Kind::Socks5 => socks5_tunnel(stream, record).await,
                    };
                });
            }
        });
        TestProxy { port, asked }
    }

    fn asked(&self) -> Vec<(String, Option<String>)> {
        self.asked.lock().unwrap().clone()
    }
}

/// The port of `host:port`; the host is ignored (everything is on 127.0.0.1 here).
fn port_of(target: &str) -> std::io::Result<u16> {
    target.rsplit_once(':').and_then(|(_, p)| p.parse().ok()).ok_or_else(|| std::io::Error::other("no port"))
}

async fn connect_tunnel(mut client: TcpStream, record: Asked) -> std::io::Result<()> {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8];
        if client.read(&mut byte).await? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let target = head.strip_prefix("CONNECT ").and_then(|rest| rest.split(' ').next()).unwrap_or_default().to_owned();
    let auth = head
        .lines()
        .find_map(|l| l.strip_prefix("Proxy-Authorization: ").or_else(|| l.strip_prefix("proxy-authorization: ")))
        .map(str::to_owned);
    record.lock().unwrap().push((target.clone(), auth));
    let mut server = TcpStream::connect(("127.0.0.1", port_of(&target)?)).await?;
    client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await?;
    tokio::io::copy_bidirectional(&mut client, &mut server).await?;
    Ok(())
}

async fn socks5_tunnel(mut client: TcpStream, record: Asked) -> std::io::Result<()> {
    let mut greeting = [0u8; 2];
    client.read_exact(&mut greeting).await?;
    let mut methods = vec![0u8; usize::from(greeting[1])];
    client.read_exact(&mut methods).await?;
    client.write_all(&[5, 0]).await?; // no authentication
    let mut request = [0u8; 4];
    client.read_exact(&mut request).await?;
    let host = match request[3] {
        3 => {
            let mut length = [0u8];
            client.read_exact(&mut length).await?;
            let mut name = vec![0u8; usize::from(length[0])];
            client.read_exact(&mut name).await?;
            String::from_utf8_lossy(&name).into_owned()
        }
        1 => {
            let mut address = [0u8; 4];
            client.read_exact(&mut address).await?;
            std::net::Ipv4Addr::from(address).to_string()
        }
        _ => return Err(std::io::Error::other("an address type this proxy does not take")),
    };
    let mut port = [0u8; 2];
    client.read_exact(&mut port).await?;
    let port = u16::from_be_bytes(port);
    record.lock().unwrap().push((format!("{host}:{port}"), None));
    let mut server = TcpStream::connect(("127.0.0.1", port)).await?;
    client.write_all(&[5, 0, 0, 1, 127, 0, 0, 1, 0, 0]).await?;
    tokio::io::copy_bidirectional(&mut client, &mut server).await?;
    Ok(())
}

/// The shared control plane's admin kubeconfig with the server renamed `kubernetes`, `cluster`
/// fields added and, when given, `user` in place of the admin's certificate.
fn kubeconfig(dir: &Path, cluster: Value, user: Option<Value>) -> PathBuf {
    let cp = testenv::shared();
    let text = std::fs::read_to_string(cp.kubeconfig_path()).unwrap();
    let mut config: Value = serde_yaml::from_str(&text).unwrap();
    let port = cp.server_url().rsplit(':').next().unwrap().to_owned();
    let fields = config["clusters"][0]["cluster"].as_object_mut().unwrap();
    fields.insert("server".into(), json!(format!("https://kubernetes:{port}")));
    fields.extend(cluster.as_object().cloned().unwrap_or_default());
    if let Some(user) = user {
        config["users"][0]["user"] = user;
    }
    let path = dir.join("kubeconfig");
    std::fs::write(&path, serde_yaml::to_string(&config).unwrap()).unwrap();
    path
}

/// The admin user's PEM certificate and key, from the control plane's kubeconfig.
fn admin_identity() -> (String, String) {
    use base64::Engine;
    let text = std::fs::read_to_string(testenv::shared().kubeconfig_path()).unwrap();
    let config: Value = serde_yaml::from_str(&text).unwrap();
    let decode = |field: &str| {
        let data = config["users"][0]["user"][field].as_str().unwrap_or_else(|| panic!("no {field}"));
        String::from_utf8(base64::engine::general_purpose::STANDARD.decode(data).unwrap()).unwrap()
    };
    (decode("client-certificate-data"), decode("client-key-data"))
}

async fn namespaces(kubeconfig: &Path) -> Result<usize, String> {
    let client = cluster_client::client("cluster-client-routes", Some(kubeconfig), Default::default())
        .await
        .map_err(|e| e.to_string())?;
    let list = Api::<Namespace>::all(client).list(&ListParams::default().limit(5)).await.map_err(|e| e.to_string())?;
    Ok(list.items.len())
}

#[tokio::test]
async fn a_kubeconfig_proxy_url_carries_every_request() {
    let dir = tempfile::tempdir().unwrap();
    let http = TestProxy::start(Kind::Http).await;
    let url = format!("http://ops%40corp:pa%3Ass@127.0.0.1:{}", http.port);
    let path = kubeconfig(dir.path(), json!({"proxy-url": url}), None);
    let listed = namespaces(&path).await.unwrap();
    assert!(listed > 0);
    let asked = http.asked();
    let port = testenv::shared().server_url().rsplit(':').next().unwrap().to_owned();
    assert!(!asked.is_empty(), "the proxy saw no tunnel");
    for (target, auth) in asked {
        assert_eq!(target, format!("kubernetes:{port}"));
        // base64("ops@corp:pa:ss")
        assert_eq!(auth.as_deref(), Some("Basic b3BzQGNvcnA6cGE6c3M="));
    }

    let socks = TestProxy::start(Kind::Socks5).await;
    let path = kubeconfig(dir.path(), json!({"proxy-url": format!("socks5://127.0.0.1:{}", socks.port)}), None);
    assert!(namespaces(&path).await.unwrap() > 0);
    // The proxy resolves the name, as client-go's SOCKS5 dialer leaves it to do.
    assert_eq!(socks.asked().first().map(|(t, _)| t.clone()), Some(format!("kubernetes:{port}")));

    // Without the proxy the name cannot be reached here: the proxy was not decoration.
    if tokio::net::lookup_host(("kubernetes", 443)).await.is_err() {
        let direct = kubeconfig(dir.path(), json!({}), None);
        assert!(namespaces(&direct).await.is_err());
    }
}

#[tokio::test]
async fn a_client_certificate_from_an_exec_plugin_authenticates() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (certificate, key) = admin_identity();
    let credential = json!({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                            "status": {"clientCertificateData": certificate, "clientKeyData": key}});
    let plugin = dir.path().join("plugin");
    std::fs::write(&plugin, format!("#!/bin/sh\ncat <<'EOF'\n{credential}\nEOF\n")).unwrap();
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let http = TestProxy::start(Kind::Http).await;
    let user = json!({"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": plugin}});
    let path = kubeconfig(dir.path(), json!({"proxy-url": format!("http://127.0.0.1:{}", http.port)}), Some(user));
    // Listing namespaces needs the admin's rights: an anonymous or unauthenticated call is refused.
    assert!(namespaces(&path).await.unwrap() > 0);

    let silent = json!({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential", "status": {}});
    std::fs::write(&plugin, format!("#!/bin/sh\necho '{silent}'\n")).unwrap();
    let refused = namespaces(&path).await.unwrap_err();
    assert!(refused.contains("status.token and status.clientCertificateData are both missing"), "{refused}");
}

#[tokio::test]
async fn the_manager_starts_behind_an_environment_proxy() {
    let cp = testenv::shared();
    let client = cp.client().await.unwrap();
    let namespace = cp.namespace(&client, "proxied").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let proxy = TestProxy::start(Kind::Http).await;
    let path = kubeconfig(dir.path(), json!({}), None);
    let health = free_port();
    let mut command = testenv::manager::ours(&workspace_binary("csi-addons-manager"));
    testenv::manager::configure(
        &mut command,
        Some(&namespace),
        &path,
        testenv::manager::Ports { health, metrics: None },
    );
    command
        .arg(format!("--watch-namespace={namespace}"))
        .arg("--leader-elect=false")
        .env("HTTPS_PROXY", format!("127.0.0.1:{}", proxy.port))
        .env("NO_PROXY", "example.com,10.0.0.0/8")
        .stderr(std::fs::File::create(dir.path().join("manager.log")).unwrap());
    let mut manager = testenv::process::spawn(command).unwrap();
    let ready = testenv::poll::until(testenv::poll::MINUTE, async || {
        http_get(health, "/readyz").await.filter(|(code, _)| *code == 200)
    })
    .await;
    testenv::process::stop(&mut manager, std::time::Duration::from_secs(5));
    let log = std::fs::read_to_string(dir.path().join("manager.log")).unwrap_or_default();
    assert!(ready.is_some(), "the manager never became ready behind the proxy; log:\n{log}");
    assert!(!proxy.asked().is_empty(), "ready without the proxy?\n{log}");
}

//! Whether the API server is reached through a proxy, decided as client-go decides it:
//! - the kubeconfig cluster's `proxy-url`, when set, for every request;
//! - otherwise the environment: `HTTPS_PROXY` for an https server, `HTTP_PROXY` for an http one
//!   (upper case first, then lower case), unless `NO_PROXY` names the server, and never for
//!   `localhost` or a loopback address. This holds in a Pod too.
//!
//! `NO_PROXY` is a comma-separated list of `*` (no proxy at all), IP addresses, CIDR ranges and
//! domain names, each optionally with a port: `example.com` covers it and its subdomains,
//! `.example.com` and `*.example.com` only the subdomains.
//!
//! An http proxy is asked to open a tunnel (CONNECT), a socks5 one to connect; userinfo in the
//! proxy's URL becomes its credentials.
use std::net::IpAddr;
use std::str::FromStr;

/// Why a proxy setting cannot be used. The value is shown without its credentials.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProxyError {
    #[error("{source_name} {value:?} is not a URL: {reason}")]
    Invalid { source_name: &'static str, value: String, reason: String },
    #[error(
        "{source_name} {value:?}: proxies of scheme {scheme:?} are not supported; use an http:// or socks5:// proxy"
    )]
    Scheme { source_name: &'static str, value: String, scheme: String },
}

/// How a proxy is spoken to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP CONNECT.
    Http,
    /// SOCKS5, names resolved by the proxy.
    Socks5,
}

/// A proxy to connect through.
#[derive(Clone, PartialEq, Eq)]
pub struct Proxy {
    pub protocol: Protocol,
    /// `scheme://host:port`, without credentials (what may be logged).
    pub address: http::Uri,
    /// User name and password, from the URL's userinfo.
    pub credentials: Option<(String, String)>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The password stays out of logs.
        let user = self.credentials.as_ref().map(|(user, _)| user.as_str());
        f.debug_struct("Proxy")
            .field("protocol", &self.protocol)
            .field("address", &self.address)
            .field("user", &user)
            .finish()
    }
}

impl Proxy {
    /// A proxy URL as client-go reads one: without a scheme, `http://` is assumed. An `https://`
    /// proxy, which client-go speaks, is refused with a message that says so. [differs: api-proxy]
    pub fn parse(source_name: &'static str, value: &str) -> Result<Self, ProxyError> {
        let invalid = |reason: String| ProxyError::Invalid { source_name, value: redacted(value), reason };
        let text = value.trim();
        let text = if text.contains("://") { text.to_owned() } else { format!("http://{text}") };
        let (scheme, rest) = text.split_once("://").ok_or_else(|| invalid("no scheme".into()))?;
        let scheme = scheme.to_ascii_lowercase();
        let protocol = match scheme.as_str() {
            "http" => Protocol::Http,
            "socks5" | "socks5h" => Protocol::Socks5,
            _ => return Err(ProxyError::Scheme { source_name, value: redacted(value), scheme }),
        };
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        let (userinfo, host_port) = match authority.rsplit_once('@') {
            Some((userinfo, host_port)) => (Some(userinfo), host_port),
            None => (None, authority),
        };
        if host_port.is_empty() {
            return Err(invalid("no host".into()));
        }
        let default_port = if protocol == Protocol::Http { 80 } else { 1080 };
        let with_port = if has_port(host_port) { host_port.to_owned() } else { format!("{host_port}:{default_port}") };
        let address = format!("{scheme}://{with_port}").parse::<http::Uri>().map_err(|e| invalid(e.to_string()))?;
        let credentials = userinfo.map(|userinfo| {
            let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
            (percent_decoded(user), percent_decoded(password))
        });
        Ok(Proxy { protocol, address, credentials })
    }

    /// The proxy's URL as given to kube's `Config::proxy_url`, credentials included.
    pub fn to_uri(&self) -> Result<http::Uri, http::uri::InvalidUri> {
        let scheme = self.address.scheme_str().unwrap_or("http");
        let host_port = self.address.authority().map_or("", |a| a.as_str());
        let userinfo = match &self.credentials {
            Some((user, password)) => format!("{}:{}@", percent_encoded(user), percent_encoded(password)),
            None => String::new(),
        };
        format!("{scheme}://{userinfo}{host_port}").parse()
    }
}

/// The proxy settings of the environment.
#[derive(Clone, Default)]
pub struct Environment {
    https: Option<String>,
    http: Option<String>,
    no_proxy: NoProxy,
}

impl std::fmt::Debug for Environment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Environment")
            .field("https", &self.https.as_deref().map(redacted))
            .field("http", &self.http.as_deref().map(redacted))
            .field("no_proxy", &self.no_proxy)
            .finish()
    }
}

/// A proxy URL without the credentials it may hold (`user:password@`), for messages and logs.
pub fn redacted(value: &str) -> String {
    let (scheme, rest) = match value.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), value),
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = rest.get(..authority_end).unwrap_or(rest);
    match authority.rfind('@') {
        Some(at) => format!("{scheme}<credentials>@{}", rest.get(at + 1..).unwrap_or_default()),
        None => value.to_owned(),
    }
}

impl Environment {
    /// This process's environment.
    pub fn current() -> Self {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// The environment `lookup` gives (for tests and for callers with their own).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let any = |names: [&str; 2]| names.into_iter().find_map(|name| lookup(name).filter(|v| !v.is_empty()));
        Environment {
            https: any(["HTTPS_PROXY", "https_proxy"]),
            http: any(["HTTP_PROXY", "http_proxy"]),
            no_proxy: NoProxy::parse(&any(["NO_PROXY", "no_proxy"]).unwrap_or_default()),
        }
    }
}

/// The proxy to reach `server` through: the kubeconfig's `proxy-url` when given, else the
/// environment's (see the module).
pub fn choose(
    server: &http::Uri,
    kubeconfig_proxy: Option<&str>,
    environment: &Environment,
) -> Result<Option<Proxy>, ProxyError> {
    if let Some(url) = kubeconfig_proxy.map(str::trim).filter(|u| !u.is_empty()) {
        return Proxy::parse("the kubeconfig's proxy-url", url).map(Some);
    }
    let https = server.scheme_str().is_none_or(|s| s.eq_ignore_ascii_case("https"));
    let (source_name, value) =
        if https { ("HTTPS_PROXY", &environment.https) } else { ("HTTP_PROXY", &environment.http) };
    let Some(value) = value else {
        return Ok(None);
    };
    let Some(host) = server.host() else {
        return Ok(None);
    };
    let port = server.port_u16().unwrap_or(if https { 443 } else { 80 });
    if !environment.no_proxy.proxied(host, port) {
        return Ok(None);
    }
    Proxy::parse(source_name, value).map(Some)
}

/// `NO_PROXY`'s entries.
#[derive(Debug, Clone, Default)]
struct NoProxy {
    everything: bool,
    networks: Vec<(IpAddr, u8)>,
    /// Addresses and the port they are limited to, as written (a port that is not a number
    /// matches none, as in client-go).
    addresses: Vec<(IpAddr, Option<String>)>,
    /// `.example.com`, its port, and whether `example.com` itself is covered too.
    domains: Vec<(String, Option<String>, bool)>,
}

impl NoProxy {
    fn parse(list: &str) -> Self {
        let mut parsed = NoProxy::default();
        for entry in list.split(',').map(|e| e.trim().to_ascii_lowercase()).filter(|e| !e.is_empty()) {
            if entry == "*" {
                return NoProxy { everything: true, ..NoProxy::default() };
            }
            if let Some((address, bits)) = entry.split_once('/') {
                if let (Ok(address), Ok(bits)) = (IpAddr::from_str(address), bits.parse::<u8>())
                    && bits <= if address.is_ipv4() { 32 } else { 128 }
                {
                    parsed.networks.push((address, bits));
                }
                continue;
            }
            let (host, port) = split_port(&entry);
            let host = host.trim_start_matches('[').trim_end_matches(']');
            if host.is_empty() {
                continue;
            }
            let port = port.map(str::to_owned);
            if let Ok(address) = IpAddr::from_str(host) {
                parsed.addresses.push((address.to_canonical(), port));
                continue;
            }
            // `*.example.com` is `.example.com`.
            let host = host.strip_prefix('*').filter(|rest| rest.starts_with('.')).unwrap_or(host);
            match host.strip_prefix('.') {
                Some(_) => parsed.domains.push((host.to_owned(), port, false)),
                None => parsed.domains.push((format!(".{host}"), port, true)),
            }
        }
        parsed
    }

    /// Whether requests to `host:port` go through the environment's proxy.
    fn proxied(&self, host: &str, port: u16) -> bool {
        let host = host.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
        // An IPv4 address written as IPv6 (`::ffff:127.0.0.1`) is that IPv4 address.
        let address = IpAddr::from_str(&host).ok().map(|a| a.to_canonical());
        if host == "localhost" || address.is_some_and(|a| a.is_loopback()) || self.everything {
            return false;
        }
        let port = port.to_string();
        let port_matches = |wanted: &Option<String>| wanted.as_ref().is_none_or(|p| *p == port);
        if let Some(address) = address
            && (self.networks.iter().any(|(network, bits)| contains(*network, *bits, address))
                || self.addresses.iter().any(|(a, p)| *a == address && port_matches(p)))
        {
            return false;
        }
        !self.domains.iter().any(|(suffix, p, itself)| {
            let is_itself = *itself && suffix.strip_prefix('.') == Some(host.as_str());
            (host.ends_with(suffix.as_str()) || is_itself) && port_matches(p)
        })
    }
}

/// Whether `network/bits` contains `address` (of the same family).
fn contains(network: IpAddr, bits: u8, address: IpAddr) -> bool {
    match (network, address) {
        (IpAddr::V4(n), IpAddr::V4(a)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            u32::from(n) & mask == u32::from(a) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(a)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            u128::from(n) & mask == u128::from(a) & mask
        }
        _ => false,
    }
}

/// `host:port`, `[v6]:port` or a bare host (an IPv6 address without brackets has no port).
fn split_port(entry: &str) -> (&str, Option<&str>) {
    if entry.starts_with('[') {
        return match entry.rsplit_once("]:") {
            Some((host, port)) => (host, Some(port)),
            None => (entry, None),
        };
    }
    match entry.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => (host, Some(port)),
        _ => (entry, None),
    }
}

fn has_port(host_port: &str) -> bool {
    split_port(host_port).1.is_some()
}

fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| bytes.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(byte) => {
                decoded.push(byte);
                i += 3;
            }
            None => {
                decoded.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

/// `text` with every byte but RFC 3986's unreserved characters percent-encoded (a URL's user
/// information, or a query parameter's value).
pub fn percent_encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => char::from(b).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
#[path = "proxy_tests.rs"]
mod tests;

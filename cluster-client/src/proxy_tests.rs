use super::*;

fn environment(vars: &[(&str, &str)]) -> Environment {
    Environment::from_lookup(|name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| (*v).to_owned()))
}

fn proxy_for(server: &str, kubeconfig: Option<&str>, vars: &[(&str, &str)]) -> Option<String> {
    let server: http::Uri = server.parse().unwrap();
    choose(&server, kubeconfig, &environment(vars)).unwrap().map(|p| p.address.to_string())
}

const PROXY: (&str, &str) = ("HTTPS_PROXY", "http://proxy.corp:3128");

#[test]
fn the_kubeconfigs_proxy_url_wins_and_applies_even_to_loopback() {
    let via = proxy_for("https://127.0.0.1:6443", Some("socks5://jump:1080"), &[PROXY, ("NO_PROXY", "*")]);
    assert_eq!(via.as_deref(), Some("socks5://jump:1080/"));
}

#[test]
fn the_environment_proxy_is_chosen_by_the_servers_scheme() {
    let both = [PROXY, ("HTTP_PROXY", "http://plain:8080")];
    assert_eq!(proxy_for("https://api.example.com:6443", None, &both).as_deref(), Some("http://proxy.corp:3128/"));
    assert_eq!(proxy_for("http://api.example.com:8080", None, &both).as_deref(), Some("http://plain:8080/"));
    // No fallback from one scheme's variable to the other's.
    assert_eq!(proxy_for("http://api.example.com", None, &[PROXY]), None);
    // Upper case first; an empty value counts as unset.
    let cases = [("HTTPS_PROXY", ""), ("https_proxy", "lower:1")];
    assert_eq!(proxy_for("https://api.example.com", None, &cases).as_deref(), Some("http://lower:1/"));
}

#[test]
fn localhost_and_loopback_are_never_sent_to_the_environments_proxy() {
    let loopback = [
        "https://localhost:6443",
        "https://127.0.0.1:6443",
        "https://127.9.9.9",
        "https://[::1]:6443",
        "https://[::ffff:127.0.0.1]",
    ];
    for server in loopback {
        assert_eq!(proxy_for(server, None, &[PROXY]), None, "{server}");
    }
    assert!(proxy_for("https://10.96.0.1:443", None, &[PROXY]).is_some());
}

#[test]
fn no_proxy_entries_as_client_go_reads_them() {
    let no_proxy = |list: &str, server: &str| proxy_for(server, None, &[PROXY, ("NO_PROXY", list)]).is_none();
    // Domains: the name and its subdomains; a leading dot or `*.` only the subdomains.
    assert!(no_proxy("example.com", "https://example.com"));
    assert!(no_proxy("example.com", "https://api.example.com:6443"));
    assert!(!no_proxy("example.com", "https://badexample.com"));
    assert!(!no_proxy(".example.com", "https://example.com"));
    assert!(no_proxy(".example.com", "https://api.example.com"));
    assert!(no_proxy("*.example.com", "https://api.example.com"));
    assert!(no_proxy(" Example.COM ", "https://API.example.com"));
    // Ports: only that port (443 when the URL names none).
    assert!(no_proxy("example.com:6443", "https://api.example.com:6443"));
    assert!(!no_proxy("example.com:6443", "https://api.example.com"));
    assert!(no_proxy("example.com:443", "https://api.example.com"));
    // Addresses and networks.
    assert!(no_proxy("10.96.0.1", "https://10.96.0.1"));
    assert!(no_proxy("10.0.0.0/8", "https://10.96.0.1:443"));
    assert!(!no_proxy("10.0.0.0/16", "https://10.96.0.1"));
    assert!(no_proxy("10.96.0.1:443", "https://10.96.0.1"));
    assert!(!no_proxy("10.96.0.1:6443", "https://10.96.0.1"));
    assert!(no_proxy("fd00::/8", "https://[fd00::1]:6443"));
    assert!(no_proxy("[fd00::1]:6443", "https://[fd00::1]:6443"));
    // `*` only as in `*.`; a port that is not a number matches none.
    assert!(!no_proxy("*example.com", "https://api.example.com"));
    assert!(!no_proxy("example.com:https", "https://api.example.com"));
    assert!(no_proxy("::ffff:10.96.0.1", "https://10.96.0.1"));
    // Everything; lists; junk entries are skipped.
    assert!(no_proxy("*", "https://api.example.com"));
    assert!(no_proxy("foo, ,10.0.0.0/99,example.com", "https://api.example.com"));
    assert!(!no_proxy("foo,bar", "https://api.example.com"));
}

#[test]
fn proxy_urls_as_client_go_parses_them() {
    let proxy = Proxy::parse("HTTPS_PROXY", "proxy.corp:3128").unwrap();
    assert_eq!((proxy.protocol, proxy.address.to_string()), (Protocol::Http, "http://proxy.corp:3128/".into()));
    let proxy = Proxy::parse("HTTPS_PROXY", "http://proxy.corp").unwrap();
    assert_eq!(proxy.address.port_u16(), Some(80));
    let proxy = Proxy::parse("x", "socks5h://us%40r:p%3Ass@jump").unwrap();
    assert_eq!(proxy.protocol, Protocol::Socks5);
    assert_eq!(proxy.address.to_string(), "socks5h://jump:1080/");
    assert_eq!(proxy.credentials, Some(("us@r".to_owned(), "p:ss".to_owned())));
    assert!(!format!("{proxy:?}").contains("p:ss"), "the password stays out of Debug");
    let back = Proxy::parse("x", &proxy.to_uri().unwrap().to_string()).unwrap();
    assert_eq!(back, proxy, "to_uri round-trips through parse");

    let https = Proxy::parse("HTTPS_PROXY", "https://secure:443").unwrap_err().to_string();
    assert!(https.contains("\"https\" are not supported") && https.contains("HTTPS_PROXY"), "{https}");
    let empty = Proxy::parse("HTTPS_PROXY", "http://").unwrap_err().to_string();
    assert!(empty.contains("no host"), "{empty}");
    let bad = Proxy::parse("the kubeconfig's proxy-url", "http://a b:1").unwrap_err().to_string();
    assert!(bad.starts_with("the kubeconfig's proxy-url \"http://a b:1\" is not a URL"), "{bad}");
}

#[test]
fn credentials_never_reach_a_message() {
    for value in
        ["https://ops:s3cret@proxy:443", "http://ops:s3cret@", "ftp://ops:s3cret@proxy/x@y", "ops:s3cret@pro xy:1"]
    {
        let error = Proxy::parse("HTTPS_PROXY", value).unwrap_err().to_string();
        assert!(!error.contains("s3cret") && error.contains("<credentials>@"), "{error}");
    }
    let environment = environment(&[("HTTPS_PROXY", "http://ops:s3cret@proxy:3128")]);
    let shown = format!("{environment:?}");
    assert!(!shown.contains("s3cret") && shown.contains("http://<credentials>@proxy:3128"), "{shown}");
    assert_eq!(redacted("http://proxy:3128/a@b"), "http://proxy:3128/a@b", "an @ past the host is not userinfo");
}

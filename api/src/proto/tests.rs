use super::*;

include!(concat!(env!("OUT_DIR"), "/redacted_debug_samples.rs"));

const SENTINEL: &str = "s3cr3t-VALUE-that-must-not-print";

#[test]
fn debug_output_of_every_secret_carrying_message_hides_the_secret() {
    let samples = redaction_samples(SENTINEL);
    // csi.proto alone has 20 such messages; far fewer means the scanner lost some.
    assert!(samples.len() >= 38, "only {} secret-carrying messages found", samples.len());
    for (name, debug) in samples {
        assert!(!debug.contains(SENTINEL), "{name} printed its secret: {debug}");
        assert!(debug.contains(crate::redact::REDACTED), "{name} shows no redaction marker: {debug}");
    }
}

#[test]
fn redacted_debug_keeps_the_other_fields_and_the_secret_keys() {
    let mut request = fence::FenceClusterNetworkRequest::default();
    request.parameters.insert("clusterID".into(), "cluster-1".into());
    request.secrets.insert("userKey".into(), SENTINEL.into());
    let debug = format!("{request:?}");
    assert!(debug.contains("cluster-1"), "{debug}");
    assert!(debug.contains("userKey"), "{debug}");
    assert!(!debug.contains(SENTINEL), "{debug}");
}

#[test]
fn messages_without_secrets_keep_the_derived_debug() {
    let request = internal::ReclaimSpaceRequest { pv_name: "pv-1".into(), ..Default::default() };
    assert!(format!("{request:?}").contains("pv-1"));
}

#[test]
fn service_names_on_the_wire_are_upstreams() {
    use tonic::server::NamedService;
    type Internal<T> = internal::reclaim_space_server::ReclaimSpaceServer<T>;
    assert_eq!(<Internal<()> as NamedService>::NAME, "proto.ReclaimSpace");
    assert_eq!(<identity::identity_server::IdentityServer<()> as NamedService>::NAME, "identity.Identity");
    assert_eq!(<csi::v1::controller_server::ControllerServer<()> as NamedService>::NAME, "csi.v1.Controller");
}

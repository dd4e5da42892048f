//! The control plane's own PKI: a CA, the API server's serving certificate, an admin client
//! certificate (group system:masters) and the service-account signing key.
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};

use crate::error::Error;

/// Paths of the files written into the control plane's directory.
pub struct Pki {
    pub ca_cert: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub admin_cert: PathBuf,
    pub admin_key: PathBuf,
    pub sa_key: PathBuf,
    pub sa_pub: PathBuf,
    pub ca_pem: String,
    pub admin_cert_pem: String,
    pub admin_key_pem: String,
}

fn pki_err(e: rcgen::Error) -> Error {
    Error::Pki(e.to_string())
}

pub fn write(dir: &Path) -> Result<Pki, Error> {
    let ca_key = KeyPair::generate().map_err(pki_err)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(pki_err)?;
    ca_params.distinguished_name.push(DnType::CommonName, "csi-addons-testenv-ca");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages =
        vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let ca_cert = ca_params.self_signed(&ca_key).map_err(pki_err)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let serving_key = KeyPair::generate().map_err(pki_err)?;
    let mut serving =
        CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned(), "kubernetes".to_owned()])
            .map_err(pki_err)?;
    serving.distinguished_name.push(DnType::CommonName, "kube-apiserver");
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let serving_cert = serving.signed_by(&serving_key, &issuer).map_err(pki_err)?;

    let admin_key = KeyPair::generate().map_err(pki_err)?;
    let mut admin = CertificateParams::new(Vec::<String>::new()).map_err(pki_err)?;
    admin.distinguished_name.push(DnType::CommonName, "testenv-admin");
    admin.distinguished_name.push(DnType::OrganizationName, "system:masters");
    admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let admin_cert = admin.signed_by(&admin_key, &issuer).map_err(pki_err)?;

    let sa_key = KeyPair::generate().map_err(pki_err)?;

    let pki = Pki {
        ca_cert: dir.join("ca.crt"),
        serving_cert: dir.join("apiserver.crt"),
        serving_key: dir.join("apiserver.key"),
        admin_cert: dir.join("admin.crt"),
        admin_key: dir.join("admin.key"),
        sa_key: dir.join("sa.key"),
        sa_pub: dir.join("sa.pub"),
        ca_pem: ca_cert.pem(),
        admin_cert_pem: admin_cert.pem(),
        admin_key_pem: admin_key.serialize_pem(),
    };
    let files = [
        (&pki.ca_cert, pki.ca_pem.clone()),
        (&pki.serving_cert, serving_cert.pem()),
        (&pki.serving_key, serving_key.serialize_pem()),
        (&pki.admin_cert, pki.admin_cert_pem.clone()),
        (&pki.admin_key, pki.admin_key_pem.clone()),
        (&pki.sa_key, sa_key.serialize_pem()),
        (&pki.sa_pub, sa_key.public_key_pem()),
    ];
    for (path, pem) in files {
        std::fs::write(path, pem).map_err(|e| Error::Io(format!("writing {}", path.display()), e))?;
    }
    Ok(pki)
}

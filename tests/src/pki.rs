//! Certificates made for one test (with `rcgen`): a CA, a server certificate for
//! 127.0.0.1 and `etcd.test`, client certificates good and bad, and a CA that signed
//! none of them. Private keys are written readable by their owner only.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, SanType,
};

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Every file of a test PKI.
#[derive(Debug, Clone)]
pub struct Pki {
    /// The CA that signed the server and the good client certificates.
    pub ca: PathBuf,
    /// Valid for 127.0.0.1 and `etcd.test`; for server and client use (etcd's
    /// gateway connects to its own gRPC server with it).
    pub server: CertFiles,
    /// A client certificate without a CommonName (subject O=jiocloud).
    pub client: CertFiles,
    /// A client certificate whose CommonName is `root`.
    pub client_cn: CertFiles,
    /// A client certificate that expired in 2021.
    pub client_expired: CertFiles,
    /// A client certificate signed by `other_ca`.
    pub client_unknown: CertFiles,
    /// A CA that signed neither the server nor the good clients.
    pub other_ca: PathBuf,
}

fn org(name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, name);
    dn
}

fn ca_params(name: &str) -> CertificateParams {
    let mut p = CertificateParams::default();
    p.distinguished_name = org(name);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.not_before = rcgen::date_time_ymd(2020, 1, 1);
    p.not_after = rcgen::date_time_ymd(2099, 1, 1);
    p
}

fn write(dir: &Path, name: &str, pem: &str, private: bool) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let p = dir.join(name);
    std::fs::write(&p, pem).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
    let mode = if private { 0o600 } else { 0o644 };
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("chmod");
    p
}

impl Pki {
    /// Makes every certificate in `dir`.
    pub fn create(dir: &Path) -> Pki {
        std::fs::create_dir_all(dir).expect("pki directory");
        let ca_key = KeyPair::generate().expect("CA key");
        let ca_p = ca_params("jio test CA");
        let ca_cert = ca_p.self_signed(&ca_key).expect("CA certificate");
        let ca = write(dir, "ca.pem", &ca_cert.pem(), false);
        let issuer = Issuer::new(ca_p, ca_key);

        let other_key = KeyPair::generate().expect("other CA key");
        let other_p = ca_params("some other CA");
        let other_cert = other_p.self_signed(&other_key).expect("other CA certificate");
        let other_ca = write(dir, "other-ca.pem", &other_cert.pem(), false);
        let other_issuer = Issuer::new(other_p, other_key);

        let leaf = |name: &str, p: CertificateParams, by: &Issuer<'_, KeyPair>| -> CertFiles {
            let key = KeyPair::generate().expect("key");
            let cert = p.signed_by(&key, by).expect("sign");
            CertFiles {
                cert: write(dir, &format!("{name}.pem"), &cert.pem(), false),
                key: write(dir, &format!("{name}.key"), &key.serialize_pem(), true),
            }
        };
        let client_params = |dn: DistinguishedName| {
            let mut p = CertificateParams::default();
            p.distinguished_name = dn;
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            p.not_before = rcgen::date_time_ymd(2020, 1, 1);
            p.not_after = rcgen::date_time_ymd(2099, 1, 1);
            p
        };

        let mut server_p = CertificateParams::new(vec!["etcd.test".to_string()]).expect("server params");
        server_p
            .subject_alt_names
            .push(SanType::IpAddress(std::net::IpAddr::V4(
                std::net::Ipv4Addr::LOCALHOST,
            )));
        server_p.distinguished_name = org("etcd");
        server_p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        server_p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        server_p.not_after = rcgen::date_time_ymd(2099, 1, 1);
        let server = leaf("server", server_p, &issuer);

        let client = leaf("client", client_params(org("jiocloud")), &issuer);
        let mut cn = org("jiocloud");
        cn.push(DnType::CommonName, "root");
        let client_cn = leaf("client-cn", client_params(cn), &issuer);
        let mut expired_p = client_params(org("jiocloud"));
        expired_p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        expired_p.not_after = rcgen::date_time_ymd(2021, 1, 1);
        let client_expired = leaf("client-expired", expired_p, &issuer);
        let client_unknown = leaf("client-unknown", client_params(org("jiocloud")), &other_issuer);
        Pki {
            ca,
            server,
            client,
            client_cn,
            client_expired,
            client_unknown,
            other_ca,
        }
    }
}

//! The secure port's TLS configuration: the serving certificate (`--tls-cert-file` /
//! `--tls-private-key-file`, or a generated self-signed pair), certificates chosen by SNI
//! (`--tls-sni-cert-key`), the lowest protocol version (`--tls-min-version`), the TLS 1.2 cipher
//! suites (`--tls-cipher-suites`) and the client CA — and its reloading: when a certificate,
//! key or client-CA file changes, the configuration is built again and served to new
//! connections, without a restart (upstream's dynamic serving certificates; it watches the
//! files, this server looks at them every [`RELOAD_INTERVAL`]).
//!
//! Differences from Go's `crypto/tls`, which upstream uses: rustls speaks only TLS 1.2 and 1.3,
//! so `VersionTLS10`/`VersionTLS11` are accepted and mean TLS 1.2; and it implements only the
//! ECDHE suites with AEAD ciphers, so the other names Go knows (CBC, RSA key exchange, 3DES,
//! RC4) are accepted and not offered, with a warning naming them. As in Go, the TLS 1.3 suites
//! are always offered. An SNI pattern that is an IP address never matches (clients send no
//! SNI for addresses).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

use parking_lot::{Mutex, RwLock};
use rustls::{
    DigitallySignedStruct, DistinguishedName, SignatureScheme, SupportedCipherSuite,
    client::danger::HandshakeSignatureValid,
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer, UnixTime, pem::PemObject},
    server::{
        ClientHello, ResolvesServerCert,
        danger::{ClientCertVerified, ClientCertVerifier},
    },
    sign::CertifiedKey,
};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{ServerError, ServingOptions};

/// How often the certificate, key and client-CA files are looked at for changes.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// A certificate and key served for the names of `--tls-sni-cert-key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SniCertKey {
    /// The certificate file.
    pub cert_file: PathBuf,
    /// The private key file.
    pub key_file: PathBuf,
    /// The domain patterns (`foo.com`, `*.foo.com`); empty: the certificate's own names.
    pub names: Vec<String>,
}

impl std::str::FromStr for SniCertKey {
    type Err = String;

    /// Upstream's form: `cert.crt,key.key` or `cert.crt,key.key:*.foo.com,foo.com`.
    fn from_str(value: &str) -> Result<Self, String> {
        let (files, names) = match value.split_once(':') {
            Some((files, names)) => (files, names),
            None => (value, ""),
        };
        let (cert, key) = files
            .split_once(',')
            .ok_or_else(|| format!("{value:?} is not \"<cert file>,<key file>[:<name>,<name>...]\""))?;
        let (cert, key) = (cert.trim(), key.trim());
        if cert.is_empty() || key.is_empty() || key.contains(',') {
            return Err(format!(
                "{value:?} is not \"<cert file>,<key file>[:<name>,<name>...]\""
            ));
        }
        Ok(Self {
            cert_file: cert.into(),
            key_file: key.into(),
            names: names
                .split(',')
                .map(|n| n.trim().to_ascii_lowercase())
                .filter(|n| !n.is_empty())
                .collect(),
        })
    }
}

/// `--tls-min-version` values Go accepts, and what each means here.
const MIN_VERSIONS: [(&str, bool); 4] = [
    // (name, TLS 1.2 allowed)
    ("VersionTLS10", true),
    ("VersionTLS11", true),
    ("VersionTLS12", true),
    ("VersionTLS13", false),
];

/// TLS 1.3 alone.
static TLS13_ONLY: [&rustls::SupportedProtocolVersion; 1] = [&rustls::version::TLS13];

/// The protocol versions a `--tls-min-version` value allows (empty: Go's default, TLS 1.2).
pub fn protocol_versions(
    min_version: &str,
) -> Result<&'static [&'static rustls::SupportedProtocolVersion], ServerError> {
    if min_version.is_empty() {
        return Ok(rustls::DEFAULT_VERSIONS);
    }
    match MIN_VERSIONS.iter().find(|(n, _)| *n == min_version) {
        Some((_, true)) => Ok(rustls::DEFAULT_VERSIONS),
        Some((_, false)) => Ok(&TLS13_ONLY),
        None => Err(ServerError::Tls(format!(
            "--tls-min-version {min_version:?} is not one of {}",
            MIN_VERSIONS.map(|(n, _)| n).join(", ")
        ))),
    }
}

/// Every cipher-suite name Go's `crypto/tls` knows (`tls.CipherSuites()` and
/// `tls.InsecureCipherSuites()`, and the two legacy CHACHA20 aliases Kubernetes accepts), with
/// the IANA name of the suite rustls implements for it, if any.
const GO_CIPHER_SUITES: [(&str, Option<&str>); 27] = [
    ("TLS_AES_128_GCM_SHA256", Some("TLS13_AES_128_GCM_SHA256")),
    ("TLS_AES_256_GCM_SHA384", Some("TLS13_AES_256_GCM_SHA384")),
    (
        "TLS_CHACHA20_POLY1305_SHA256",
        Some("TLS13_CHACHA20_POLY1305_SHA256"),
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        Some("TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"),
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        Some("TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"),
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        Some("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"),
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        Some("TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384"),
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        Some("TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"),
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
        Some("TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"),
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        Some("TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256"),
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
        Some("TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256"),
    ),
    ("TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA", None),
    ("TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA", None),
    ("TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA", None),
    ("TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA", None),
    ("TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256", None),
    ("TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256", None),
    ("TLS_ECDHE_ECDSA_WITH_RC4_128_SHA", None),
    ("TLS_ECDHE_RSA_WITH_RC4_128_SHA", None),
    ("TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA", None),
    ("TLS_RSA_WITH_RC4_128_SHA", None),
    ("TLS_RSA_WITH_3DES_EDE_CBC_SHA", None),
    ("TLS_RSA_WITH_AES_128_CBC_SHA", None),
    ("TLS_RSA_WITH_AES_256_CBC_SHA", None),
    ("TLS_RSA_WITH_AES_128_CBC_SHA256", None),
    ("TLS_RSA_WITH_AES_128_GCM_SHA256", None),
    ("TLS_RSA_WITH_AES_256_GCM_SHA384", None),
];

/// The crypto provider of the server: the process's (aws-lc-rs), its TLS 1.2 suites cut down
/// to `--tls-cipher-suites` when given (every TLS 1.3 suite stays, as in Go). An unknown name
/// is an error naming it; names Go knows that rustls does not implement are warned about; a
/// list that leaves no TLS 1.2 suite is an error.
pub fn crypto_provider(cipher_suites: &[String]) -> Result<Arc<CryptoProvider>, ServerError> {
    let base = CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()));
    if cipher_suites.is_empty() {
        return Ok(base);
    }
    let mut wanted = Vec::new();
    let mut not_offered = Vec::new();
    for name in cipher_suites {
        match GO_CIPHER_SUITES.iter().find(|(go, _)| go == name) {
            None => {
                return Err(ServerError::Tls(format!(
                    "--tls-cipher-suites: cipher suite {name:?} is not supported or doesn't exist"
                )));
            }
            Some((_, Some(iana))) => wanted.push(*iana),
            Some((_, None)) => not_offered.push(name.as_str()),
        }
    }
    if !not_offered.is_empty() {
        warn!(
            suites = %not_offered.join(","),
            "--tls-cipher-suites: these suites are not offered (this server implements only ECDHE suites with AEAD ciphers)"
        );
    }
    let name_of = |s: &SupportedCipherSuite| format!("{:?}", s.suite());
    let suites: Vec<SupportedCipherSuite> = base
        .cipher_suites
        .iter()
        .filter(|s| s.tls13().is_some() || wanted.contains(&name_of(s).as_str()))
        .copied()
        .collect();
    if !suites.iter().any(|s| s.tls13().is_none()) {
        return Err(ServerError::Tls(format!(
            "--tls-cipher-suites {:?}: none of these TLS 1.2 suites can be offered (this server implements ECDHE suites with AES-GCM or CHACHA20-POLY1305)",
            cipher_suites.join(",")
        )));
    }
    Ok(Arc::new(CryptoProvider {
        cipher_suites: suites,
        ..(*base).clone()
    }))
}

/// Go `crypto/tls` CurveIDs (which are the TLS named-group code points) and their names.
const GO_CURVES: &[(u16, &str)] = &[
    (23, "CurveP256"),
    (24, "CurveP384"),
    (25, "CurveP521"),
    (29, "X25519"),
    (4588, "X25519MLKEM768"),
];

/// `provider` with its key-exchange groups cut down to `curves` (`--tls-curve-preferences`,
/// Go CurveIDs), in that order of preference; empty: unchanged. An ID this server does not
/// offer is an error naming it and the IDs it offers.
pub fn with_curves(
    provider: Arc<CryptoProvider>,
    curves: &[u16],
) -> Result<Arc<CryptoProvider>, ServerError> {
    if curves.is_empty() {
        return Ok(provider);
    }
    let named = |id: u16| match GO_CURVES.iter().find(|(i, _)| *i == id) {
        Some((_, name)) => format!("{id} ({name})"),
        None => id.to_string(),
    };
    let mut groups: Vec<&'static dyn rustls::crypto::SupportedKxGroup> = Vec::new();
    for &id in curves {
        let Some(group) = provider.kx_groups.iter().find(|g| u16::from(g.name()) == id) else {
            let offered: Vec<String> = provider
                .kx_groups
                .iter()
                .map(|g| named(u16::from(g.name())))
                .collect();
            return Err(ServerError::Tls(format!(
                "--tls-curve-preferences: curve {} is not offered by this server; it offers {}",
                named(id),
                offered.join(", ")
            )));
        };
        if !groups.iter().any(|g| g.name() == group.name()) {
            groups.push(*group);
        }
    }
    Ok(Arc::new(CryptoProvider {
        kx_groups: groups,
        ..(*provider).clone()
    }))
}

/// A certificate chain and key loaded from files, checked to belong together.
fn load_pair(
    provider: &CryptoProvider,
    cert_flag: &'static str,
    cert: &Path,
    key_flag: &'static str,
    key: &Path,
) -> Result<CertifiedKey, ServerError> {
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| ServerError::Certificate {
            flag: cert_flag,
            path: cert.display().to_string(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(ServerError::Certificate {
            flag: cert_flag,
            path: cert.display().to_string(),
            reason: "no certificate in the file".into(),
        });
    }
    let der = PrivateKeyDer::from_pem_file(key).map_err(|e| ServerError::Certificate {
        flag: key_flag,
        path: key.display().to_string(),
        reason: e.to_string(),
    })?;
    let signing = provider
        .key_provider
        .load_private_key(der)
        .map_err(|e| ServerError::Certificate {
            flag: key_flag,
            path: key.display().to_string(),
            reason: e.to_string(),
        })?;
    let pair = CertifiedKey::new(certs, signing);
    pair.keys_match().map_err(|e| ServerError::Certificate {
        flag: key_flag,
        path: key.display().to_string(),
        reason: format!("does not match the certificate of {}: {e}", cert.display()),
    })?;
    Ok(pair)
}

/// The DNS names (and addresses) of a certificate: its subject alternative names, else its
/// Common Name.
fn certificate_names(cert: &CertificateDer<'_>) -> Vec<String> {
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return Vec::new();
    };
    let mut names: Vec<String> = parsed
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_ascii_lowercase()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    if names.is_empty() {
        names.extend(
            parsed
                .subject()
                .iter_common_name()
                .filter_map(|cn| cn.as_str().ok().map(str::to_ascii_lowercase)),
        );
    }
    names
}

/// Chooses the certificate by the client's SNI name: an exact name first, then a wildcard
/// (`*.foo.com` matches one label), else the default certificate. Names given on the flag win
/// over names read from a certificate.
#[derive(Debug)]
struct SniResolver {
    default: Arc<CertifiedKey>,
    /// name → (explicit, certificate)
    by_name: BTreeMap<String, (bool, Arc<CertifiedKey>)>,
}

impl SniResolver {
    fn add(&mut self, name: String, explicit: bool, pair: &Arc<CertifiedKey>) {
        match self.by_name.get(&name) {
            Some((true, _)) if !explicit => {}
            _ => {
                self.by_name.insert(name, (explicit, pair.clone()));
            }
        }
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let Some(name) = hello.server_name().map(str::to_ascii_lowercase) else {
            return Some(self.default.clone());
        };
        if let Some((_, pair)) = self.by_name.get(&name) {
            return Some(pair.clone());
        }
        if let Some((_, parent)) = name.split_once('.')
            && let Some((_, pair)) = self.by_name.get(&format!("*.{parent}"))
        {
            return Some(pair.clone());
        }
        Some(self.default.clone())
    }
}

/// Builds the rustls configuration from the options (reading every file named there).
pub fn server_config(opts: &ServingOptions) -> Result<rustls::ServerConfig, ServerError> {
    Ok(serving_config(opts)?.0)
}

/// The client CA's verifier of a configuration, checking a client certificate's chain per
/// request (see [`RequestClientCert`]).
pub(crate) type ClientCaVerifier = Arc<dyn ClientCertVerifier>;

/// [`server_config`] and the verifier of its client CA, when one is configured.
fn serving_config(
    opts: &ServingOptions,
) -> Result<(rustls::ServerConfig, Option<ClientCaVerifier>), ServerError> {
    let provider = with_curves(
        crypto_provider(&opts.tls_cipher_suites)?,
        &opts.tls_curve_preferences,
    )?;
    let default = match (&opts.tls_cert_file, &opts.tls_private_key_file) {
        (Some(cert), Some(key)) => {
            load_pair(&provider, "--tls-cert-file", cert, "--tls-private-key-file", key)?
        }
        (Some(_), None) | (None, Some(_)) => {
            return Err(ServerError::Tls(
                "--tls-cert-file and --tls-private-key-file must be given together".into(),
            ));
        }
        (None, None) => generated_pair(opts, &provider)?,
    };
    let mut resolver = SniResolver {
        default: Arc::new(default),
        by_name: BTreeMap::new(),
    };
    for sni in &opts.sni_cert_keys {
        let pair = Arc::new(load_pair(
            &provider,
            "--tls-sni-cert-key",
            &sni.cert_file,
            "--tls-sni-cert-key",
            &sni.key_file,
        )?);
        if sni.names.is_empty() {
            for name in certificate_names(&pair.cert[0]) {
                resolver.add(name, false, &pair);
            }
        } else {
            for name in &sni.names {
                resolver.add(name.clone(), true, &pair);
            }
        }
    }
    let builder = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(protocol_versions(&opts.tls_min_version)?)
        .map_err(|e| ServerError::Tls(e.to_string()))?;
    let mut client_ca = None;
    let builder = match &opts.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let pem = match &ca.file {
                Some(path) => std::fs::read_to_string(path).map_err(|e| ServerError::Certificate {
                    flag: "--client-ca-file",
                    path: path.display().to_string(),
                    reason: e.to_string(),
                })?,
                None => ca.pem.clone(),
            };
            let bad = |reason: String| ServerError::Certificate {
                flag: "client CA",
                path: ca.source.clone(),
                reason,
            };
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                roots
                    .add(cert.map_err(|e| bad(e.to_string()))?)
                    .map_err(|e| bad(e.to_string()))?;
            }
            if roots.is_empty() {
                return Err(bad("no certificate in the bundle".into()));
            }
            // Asked for, never required: requests without one go on to token authentication.
            let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
                .allow_unauthenticated()
                .build()
                .map_err(|e| bad(e.to_string()))?;
            client_ca = Some(verifier.clone());
            builder.with_client_cert_verifier(Arc::new(RequestClientCert { ca: verifier }))
        }
    };
    let mut config = builder.with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = if opts.disable_http2 {
        vec![b"http/1.1".to_vec()]
    } else {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    };
    Ok((config, client_ca))
}

/// Asks for a client certificate (never requires one) and takes any at the handshake, as Go's
/// `tls.RequestClientCert` that upstream serves with: the handshake proves that the client
/// holds the certificate's key, and the chain is verified against the client CA for each
/// request ([`ReloadingConfig::verify_client`]). A certificate of another (or a rotated) CA
/// does not end the connection: its requests authenticate with a bearer token, or answer 401.
#[derive(Debug)]
struct RequestClientCert {
    ca: ClientCaVerifier,
}

impl ClientCertVerifier for RequestClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.ca.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.ca.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.ca.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.ca.supported_verify_schemes()
    }
}

/// A self-signed pair for `localhost`/`127.0.0.1`, written to `--cert-dir` when one is given.
fn generated_pair(opts: &ServingOptions, provider: &CryptoProvider) -> Result<CertifiedKey, ServerError> {
    let generated =
        rcgen::generate_simple_self_signed(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .map_err(|e| ServerError::Tls(format!("generating a self-signed certificate: {e}")))?;
    let cert_pem = generated.cert.pem();
    let key_pem = generated.signing_key.serialize_pem();
    if let Some(dir) = &opts.cert_dir {
        // The key is a secret: a private directory (0700, ours), files 0600.
        let write = |ext: &str, data: &str| {
            let path = dir.join(format!("{}.{ext}", opts.pair_name));
            crate::private_files::ensure_private_dir(dir)
                .and_then(|()| crate::private_files::write_private(&path, data.as_bytes()))
                .map_err(|e| ServerError::Certificate {
                    flag: "--cert-dir",
                    path: e.path,
                    reason: e.reason,
                })
        };
        write("crt", &cert_pem)?;
        write("key", &key_pem)?;
    }
    let key =
        PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| ServerError::Tls(e.to_string()))?;
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| ServerError::Tls(e.to_string()))?;
    Ok(CertifiedKey::new(vec![generated.cert.der().clone()], signing))
}

/// The files the configuration is read from, to be watched.
fn watched_files(opts: &ServingOptions) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = [&opts.tls_cert_file, &opts.tls_private_key_file]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
    for sni in &opts.sni_cert_keys {
        files.push(sni.cert_file.clone());
        files.push(sni.key_file.clone());
    }
    if let Some(file) = opts.client_ca.as_ref().and_then(|ca| ca.file.clone()) {
        files.push(file);
    }
    files
}

/// What the watched files look like now: (modified, length) of each (`None`: unreadable).
fn fingerprint(files: &[PathBuf]) -> Vec<Option<(SystemTime, u64)>> {
    files
        .iter()
        .map(|f| {
            std::fs::metadata(f)
                .ok()
                .and_then(|m| Some((m.modified().ok()?, m.len())))
        })
        .collect()
}

/// The TLS configuration new connections get; replaced when the files it was read from, or the
/// client CA sent through [`super::ClientCa::updates`], change.
#[derive(Clone)]
pub struct ReloadingConfig {
    current: Arc<RwLock<Serving>>,
}

/// A configuration and the verifier of its client CA.
#[derive(Clone)]
struct Serving {
    config: Arc<rustls::ServerConfig>,
    client_ca: Option<ClientCaVerifier>,
}

impl std::fmt::Debug for ReloadingConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingConfig").finish_non_exhaustive()
    }
}

/// Reads the configuration of `opts` again and, when it is complete and valid, serves it from
/// then on; a bad one is warned about and the last good configuration stays.
fn reload(current: &RwLock<Serving>, opts: &ServingOptions, what: &str) {
    match serving_config(opts) {
        Ok((config, client_ca)) => {
            *current.write() = Serving {
                config: Arc::new(config),
                client_ca,
            };
            info!(
                what,
                "secure port: {what} changed; new connections get the new ones"
            );
        }
        Err(e) => {
            warn!(error = %e, what, "secure port: a changed {what} cannot be used (yet); the previous ones stay");
        }
    }
}

impl ReloadingConfig {
    /// Reads the configuration now (errors are the server's start-up errors) and, when it comes
    /// from files, looks at them every [`RELOAD_INTERVAL`] until `shutdown`: a change is read
    /// again and, when it is complete and valid, served from then on; a bad one is warned
    /// about once and the last good configuration stays. A client CA sent through
    /// [`super::ClientCa::updates`] is taken the same way.
    pub fn start(opts: &ServingOptions, shutdown: CancellationToken) -> Result<Self, ServerError> {
        let files = watched_files(opts);
        let mut seen = fingerprint(&files);
        let (config, client_ca) = serving_config(opts)?;
        let config = Self {
            current: Arc::new(RwLock::new(Serving {
                config: Arc::new(config),
                client_ca,
            })),
        };
        // The options both watchers rebuild from (a client CA update changes them).
        let shared = Arc::new(Mutex::new(opts.clone()));
        if !files.is_empty() {
            let (current, shared, shutdown) = (config.current.clone(), shared.clone(), shutdown.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(RELOAD_INTERVAL);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                loop {
                    tokio::select! {
                        _ = tick.tick() => {}
                        _ = shutdown.cancelled() => return,
                    }
                    let now = fingerprint(&files);
                    if now == seen {
                        continue;
                    }
                    seen = now;
                    let opts = shared.lock().clone();
                    reload(&current, &opts, "certificate, key or client CA file");
                }
            });
        }
        if let Some(mut updates) = opts.client_ca.as_ref().and_then(|ca| ca.updates.clone()) {
            let current = config.current.clone();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        changed = updates.changed() => if changed.is_err() { return },
                        _ = shutdown.cancelled() => return,
                    }
                    let pem = updates.borrow_and_update().clone();
                    let opts = {
                        let mut shared = shared.lock();
                        if let Some(ca) = shared.client_ca.as_mut() {
                            ca.pem = pem;
                        }
                        shared.clone()
                    };
                    reload(&current, &opts, "client CA");
                }
            });
        }
        Ok(config)
    }

    /// A fixed configuration (never reloaded). A client certificate it asks for is verified by
    /// nothing here: its requests are treated as those of a certificate of another CA.
    pub fn fixed(config: rustls::ServerConfig) -> Self {
        Self {
            current: Arc::new(RwLock::new(Serving {
                config: Arc::new(config),
                client_ca: None,
            })),
        }
    }

    /// The configuration for a new connection.
    pub fn config(&self) -> Arc<rustls::ServerConfig> {
        self.current.read().config.clone()
    }

    /// An acceptor with the configuration for a new connection.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config())
    }

    /// Whether the client certificate chain `certs` (end entity first) is signed by the
    /// current client CA and valid now.
    pub fn verify_client(&self, certs: &[CertificateDer<'_>]) -> bool {
        let Some(ca) = self.current.read().client_ca.clone() else {
            return false;
        };
        let Some((end_entity, intermediates)) = certs.split_first() else {
            return false;
        };
        ca.verify_client_cert(end_entity, intermediates, UnixTime::now())
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sni_cert_keys_are_read_as_upstream() {
        let s: SniCertKey = "foo.crt,foo.key:*.foo.com,Foo.com".parse().unwrap();
        assert_eq!(s.cert_file, PathBuf::from("foo.crt"));
        assert_eq!(s.key_file, PathBuf::from("foo.key"));
        assert_eq!(s.names, ["*.foo.com", "foo.com"]);
        let s: SniCertKey = "a.crt,a.key".parse().unwrap();
        assert!(s.names.is_empty());
        for bad in ["a.crt", "a.crt,", ",a.key", "a.crt,a.key,b"] {
            let e = bad.parse::<SniCertKey>().unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
    }

    #[test]
    fn curve_preferences_keep_the_named_groups_in_order_and_refuse_others() {
        let base = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let ids = |p: &CryptoProvider| {
            p.kx_groups
                .iter()
                .map(|g| u16::from(g.name()))
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(&with_curves(base.clone(), &[]).unwrap()), ids(&base));
        assert_eq!(
            ids(&with_curves(base.clone(), &[24, 29, 24]).unwrap()),
            vec![24, 29]
        );
        let refused = with_curves(base, &[29, 25]).unwrap_err().to_string();
        assert!(
            refused.contains(
                "--tls-curve-preferences: curve 25 (CurveP521) is not offered by this server; it offers"
            ) && refused.contains("29 (X25519)"),
            "{refused}"
        );
    }

    #[test]
    fn min_versions_are_gos_names() {
        assert_eq!(protocol_versions("").unwrap().len(), 2);
        assert_eq!(protocol_versions("VersionTLS10").unwrap().len(), 2);
        assert_eq!(protocol_versions("VersionTLS12").unwrap().len(), 2);
        assert_eq!(
            protocol_versions("VersionTLS13").unwrap()[0].version,
            rustls::ProtocolVersion::TLSv1_3
        );
        let e = protocol_versions("TLS1.3").unwrap_err().to_string();
        assert!(e.contains("\"TLS1.3\"") && e.contains("VersionTLS13"), "{e}");
    }

    #[test]
    fn cipher_suites_are_gos_names_and_tls13_always_stays() {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let p = crypto_provider(&["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".into()]).unwrap();
        let names: Vec<String> = p
            .cipher_suites
            .iter()
            .map(|s| format!("{:?}", s.suite()))
            .collect();
        assert!(
            names.contains(&"TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".to_string()),
            "{names:?}"
        );
        assert!(
            !names.contains(&"TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384".to_string()),
            "{names:?}"
        );
        assert!(names.iter().any(|n| n.starts_with("TLS13_")), "{names:?}");
        // A CIS-style list with suites rustls lacks: accepted, the others offered.
        let p = crypto_provider(&[
            "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305".into(),
            "TLS_RSA_WITH_AES_256_GCM_SHA384".into(),
        ])
        .unwrap();
        assert!(
            p.cipher_suites
                .iter()
                .any(|s| format!("{:?}", s.suite()) == "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256")
        );
        let e = crypto_provider(&["TLS_FANCY".into()]).unwrap_err().to_string();
        assert!(e.contains("\"TLS_FANCY\""), "{e}");
        let e = crypto_provider(&["TLS_RSA_WITH_AES_128_CBC_SHA".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("none of these TLS 1.2 suites"), "{e}");
    }
}

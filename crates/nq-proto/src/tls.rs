//! TLS material for both ends, read from PEM files and checked when loaded.
//!
//! The coordinator serves TLS with a certificate and key ([`ServerTls`]), and
//! may require client certificates signed by a CA it trusts (mutual TLS).
//! Workers trust a CA of their own choosing and may present a certificate
//! ([`ClientTls`]). Everything goes through rustls (tonic's `tls-ring`).
//!
//! Every file is read and checked here, at start, so that a wrong path, a DER
//! file, a key that does not belong to its certificate or a CA file that
//! holds no certificate is reported with the file's name and the expected
//! format, not as a failed handshake at the first connection.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// What a certificate file must hold.
const CERT_FORMAT: &str = "PEM `-----BEGIN CERTIFICATE-----` blocks";

/// What a key file must hold.
const KEY_FORMAT: &str = "one PEM private key: `-----BEGIN PRIVATE KEY-----` (PKCS#8), \
     `BEGIN RSA PRIVATE KEY` or `BEGIN EC PRIVATE KEY`";

/// A TLS file that cannot be used, named by the flag that gave it.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The file cannot be read.
    #[error("cannot read {flag} {}", path.display())]
    Read {
        /// The flag (`--tls-cert`, `--ca`, ...).
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file does not hold what it should.
    #[error("{flag} {} is not usable: {problem}; expected {expected}", path.display())]
    Format {
        /// The flag.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// What was found wrong.
        problem: String,
        /// The accepted format.
        expected: &'static str,
    },
    /// The files are well-formed but rustls refuses them together (e.g. a
    /// key that does not belong to the certificate).
    #[error("rustls refuses {what}: {reason}")]
    Rejected {
        /// The files, by flag and name.
        what: String,
        /// rustls's reason, with its causes.
        reason: String,
    },
    /// Half a client identity.
    #[error("{given} needs {missing} too: a client certificate comes with its key")]
    Incomplete {
        /// The flag given.
        given: &'static str,
        /// The flag missing.
        missing: &'static str,
    },
}

/// The coordinator's TLS: its identity and, for mutual TLS, the CA whose
/// client certificates it requires.
#[derive(Clone, Debug)]
pub struct ServerTls {
    config: ServerTlsConfig,
    mutual: bool,
}

impl ServerTls {
    /// Reads and checks the certificate chain `cert`, its private key `key`,
    /// and the optional `client_ca` (mutual TLS: every client must present a
    /// certificate that this CA signed).
    ///
    /// # Errors
    ///
    /// [`TlsError`] naming the file, the flag and the expected format.
    pub fn load(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<ServerTls> {
        let (cert_pem, key_pem) = identity("--tls-cert", cert, "--tls-key", key)?;
        let mut config =
            ServerTlsConfig::new().identity(Identity::from_pem(cert_pem, key_pem));
        let mut what = format!(
            "--tls-cert {} with --tls-key {}",
            cert.display(),
            key.display()
        );
        if let Some(ca) = client_ca {
            config = config.client_ca_root(ca_certificate("--tls-client-ca", ca)?.0);
            what = format!("{what} and --tls-client-ca {}", ca.display());
        }
        // Building a server is how tonic hands the files to rustls; doing it
        // now turns a mismatched key into an error at start.
        tonic::transport::Server::builder()
            .tls_config(config.clone())
            .map_err(|e| TlsError::Rejected {
                what,
                reason: chain(&e),
            })?;
        Ok(ServerTls {
            config,
            mutual: client_ca.is_some(),
        })
    }

    /// The configuration for `tonic::transport::Server::tls_config`.
    pub fn config(&self) -> ServerTlsConfig {
        self.config.clone()
    }

    /// Whether clients must present a certificate.
    pub fn mutual(&self) -> bool {
        self.mutual
    }
}

/// A client's TLS: the CA it trusts (or the system's roots) and an optional
/// certificate for mutual TLS.
#[derive(Clone, Debug)]
pub struct ClientTls {
    config: ClientTlsConfig,
    /// The same settings as a rustls configuration (only with a CA file), for
    /// a client that diagnoses a refused handshake itself: see
    /// [`ClientTls::rustls_config`].
    rustls: Option<Arc<rustls::ClientConfig>>,
}

impl ClientTls {
    /// Reads and checks `ca` (the CA that signed the coordinator's
    /// certificate; `None` trusts the system's roots) and the optional client
    /// certificate `cert` with its `key`.
    ///
    /// # Errors
    ///
    /// [`TlsError`] naming the file, the flag and the expected format, or
    /// [`TlsError::Incomplete`] for a certificate without key or the reverse.
    pub fn load(
        ca: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
    ) -> Result<ClientTls> {
        let mut config = ClientTlsConfig::new();
        let mut what = vec![];
        let mut roots = None;
        match ca {
            Some(ca) => {
                let (certificate, store) = ca_certificate("--ca", ca)?;
                config = config.ca_certificate(certificate);
                roots = Some(store);
                what.push(format!("--ca {}", ca.display()));
            }
            None => {
                config = config.with_native_roots();
                what.push("the system's CA certificates".to_owned());
            }
        }
        let mut client_identity = None;
        match (cert, key) {
            (Some(cert), Some(key)) => {
                let (cert_pem, key_pem) = identity("--tls-cert", cert, "--tls-key", key)?;
                config = config.identity(Identity::from_pem(&cert_pem, &key_pem));
                client_identity = Some((cert_pem, key_pem));
                what.push(format!(
                    "--tls-cert {} with --tls-key {}",
                    cert.display(),
                    key.display()
                ));
            }
            (Some(_), None) => {
                return Err(TlsError::Incomplete {
                    given: "--tls-cert",
                    missing: "--tls-key",
                });
            }
            (None, Some(_)) => {
                return Err(TlsError::Incomplete {
                    given: "--tls-key",
                    missing: "--tls-cert",
                });
            }
            (None, None) => {}
        }
        let rejected = |reason: String| TlsError::Rejected {
            what: what.join(" and "),
            reason,
        };
        // As for the server: building an endpoint hands the files to rustls.
        tonic::transport::Endpoint::from_static("https://localhost")
            .tls_config(config.clone())
            .map_err(|e| rejected(chain(&e)))?;
        let rustls = match roots {
            Some(roots) => Some(Arc::new(
                rustls_client(roots, client_identity.as_ref())
                    .map_err(|e| rejected(e.to_string()))?,
            )),
            None => None,
        };
        Ok(ClientTls { config, rustls })
    }

    /// The configuration for `tonic::transport::Endpoint::tls_config`.
    pub fn config(&self) -> ClientTlsConfig {
        self.config.clone()
    }

    /// The same trust and identity as a rustls client configuration (ring,
    /// ALPN `h2`), when a CA file was given.
    ///
    /// tonic reports a TLS 1.3 handshake that the server refused after the
    /// fact (a missing or unknown client certificate) only as a closed
    /// connection; a client that wants to say why can repeat the handshake
    /// with this configuration and read the server's alert.
    pub fn rustls_config(&self) -> Option<Arc<rustls::ClientConfig>> {
        self.rustls.clone()
    }
}

/// A rustls client configuration equivalent to what tonic builds.
fn rustls_client(
    roots: rustls::RootCertStore,
    identity: Option<&(Vec<u8>, Vec<u8>)>,
) -> std::result::Result<rustls::ClientConfig, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let mut config = match identity {
        Some((cert, key)) => {
            let certs = CertificateDer::pem_slice_iter(cert)
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| rustls::Error::General(e.to_string()))?;
            let key = PrivateKeyDer::from_pem_slice(key)
                .map_err(|e| rustls::Error::General(e.to_string()))?;
            builder.with_client_auth_cert(certs, key)?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// `Result` with [`TlsError`].
pub type Result<T> = std::result::Result<T, TlsError>;

/// Describes the TLS failure behind a failed call, if it is one that
/// retrying cannot fix: a certificate the other side refused or that this
/// side could not verify, or TLS settings the two sides do not share.
///
/// Returns `None` for everything else: refused connections, timeouts, and
/// TLS records damaged in transit (a flaky proxy), which a retry may get past.
pub fn tls_failure(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut next = Some(error);
    while let Some(e) = next {
        // `io::Error::source` skips the error it wraps: look at it here.
        let wrapped = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>());
        if let Some(tls) = wrapped.or_else(|| e.downcast_ref::<rustls::Error>()) {
            return lasting(tls).then(|| tls.to_string());
        }
        next = e.source();
    }
    None
}

/// Whether a rustls error is about certificates or settings (lasting) rather
/// than about damaged traffic.
fn lasting(error: &rustls::Error) -> bool {
    use rustls::AlertDescription as A;
    match error {
        rustls::Error::InvalidCertificate(_)
        | rustls::Error::NoCertificatesPresented
        | rustls::Error::PeerIncompatible(_)
        | rustls::Error::NoApplicationProtocol => true,
        rustls::Error::AlertReceived(alert) => matches!(
            alert,
            A::BadCertificate
                | A::UnsupportedCertificate
                | A::CertificateRevoked
                | A::CertificateExpired
                | A::CertificateUnknown
                | A::UnknownCA
                | A::CertificateRequired
                | A::AccessDenied
                | A::HandshakeFailure
                | A::ProtocolVersion
                | A::NoApplicationProtocol
        ),
        _ => false,
    }
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        flag,
        path: path.to_owned(),
        source,
    })
}

/// The certificates of a PEM file: at least one, each valid PEM.
fn certificates(flag: &'static str, path: &Path) -> Result<Vec<u8>> {
    let pem = read(flag, path)?;
    let format = |problem: String| TlsError::Format {
        flag,
        path: path.to_owned(),
        problem,
        expected: CERT_FORMAT,
    };
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| format(format!("bad PEM ({e})")))?;
    if certs.is_empty() {
        return Err(format("it holds no certificate".to_owned()));
    }
    Ok(pem)
}

/// A CA file: certificates that rustls accepts as trust anchors.
fn ca_certificate(
    flag: &'static str,
    path: &Path,
) -> Result<(Certificate, rustls::RootCertStore)> {
    let pem = certificates(flag, path)?;
    let mut roots = rustls::RootCertStore::empty();
    for der in CertificateDer::pem_slice_iter(&pem).flatten() {
        roots.add(der).map_err(|e| TlsError::Format {
            flag,
            path: path.to_owned(),
            problem: format!("a certificate is not valid X.509 ({e})"),
            expected: CERT_FORMAT,
        })?;
    }
    Ok((Certificate::from_pem(pem), roots))
}

/// A certificate chain and its key, as checked PEM.
fn identity(
    cert_flag: &'static str,
    cert: &Path,
    key_flag: &'static str,
    key: &Path,
) -> Result<(Vec<u8>, Vec<u8>)> {
    let cert_pem = certificates(cert_flag, cert)?;
    let key_pem = read(key_flag, key)?;
    PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsError::Format {
        flag: key_flag,
        path: key.to_owned(),
        problem: match e {
            rustls_pki_types::pem::Error::NoItemsFound => {
                "it holds no private key".to_owned()
            }
            e => format!("bad PEM ({e})"),
        },
        expected: KEY_FORMAT,
    })?;
    Ok((cert_pem, key_pem))
}

/// An error and its causes, on one line.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        next = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate for `localhost` and its key, as files.
    struct Files {
        dir: tempfile::TempDir,
        cert: PathBuf,
        key: PathBuf,
    }

    fn files() -> Files {
        let dir = tempfile::tempdir().unwrap();
        let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let cert = dir.path().join("cert.pem");
        let key = dir.path().join("key.pem");
        std::fs::write(&cert, made.cert.pem()).unwrap();
        std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
        Files { dir, cert, key }
    }

    fn write(f: &Files, name: &str, text: &str) -> PathBuf {
        let path = f.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn good_files_load_on_both_sides() {
        let f = files();
        assert!(!ServerTls::load(&f.cert, &f.key, None).unwrap().mutual());
        assert!(
            ServerTls::load(&f.cert, &f.key, Some(&f.cert))
                .unwrap()
                .mutual()
        );
        let client = ClientTls::load(Some(&f.cert), Some(&f.cert), Some(&f.key)).unwrap();
        assert!(client.rustls_config().is_some());
    }

    #[test]
    fn unusable_files_are_named_with_the_expected_format() {
        let f = files();
        let garbage = write(&f, "garbage.pem", "hello\n");
        let err = ServerTls::load(&garbage, &f.key, None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--tls-cert") && err.contains("garbage.pem"),
            "{err}"
        );
        assert!(err.contains("BEGIN CERTIFICATE"), "{err}");
        // A certificate where the key should be.
        let err = ServerTls::load(&f.cert, &f.cert, None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--tls-key") && err.contains("no private key"),
            "{err}"
        );
        assert!(err.contains("BEGIN PRIVATE KEY"), "{err}");
        // Valid PEM around bytes that are no certificate.
        let fake = write(
            &f,
            "fake-ca.pem",
            "-----BEGIN CERTIFICATE-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE-----\n",
        );
        let err = ClientTls::load(Some(&fake), None, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--ca") && err.contains("X.509"), "{err}");
        let missing = f.dir.path().join("missing.pem");
        let err = ServerTls::load(&f.cert, &f.key, Some(&missing)).unwrap_err();
        assert!(
            matches!(
                err,
                TlsError::Read {
                    flag: "--tls-client-ca",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn a_key_of_another_certificate_is_refused_at_load() {
        let (a, b) = (files(), files());
        let err = ServerTls::load(&a.cert, &b.key, None).unwrap_err();
        assert!(matches!(err, TlsError::Rejected { .. }), "{err}");
        assert!(err.to_string().contains("--tls-key"), "{err}");
    }

    #[test]
    fn half_a_client_identity_is_refused() {
        let f = files();
        let err = ClientTls::load(Some(&f.cert), Some(&f.cert), None).unwrap_err();
        assert!(err.to_string().contains("needs --tls-key"), "{err}");
        let err = ClientTls::load(Some(&f.cert), None, Some(&f.key)).unwrap_err();
        assert!(err.to_string().contains("needs --tls-cert"), "{err}");
    }

    #[test]
    fn rustls_errors_are_found_behind_io_errors() {
        let inner =
            rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, inner);
        let found = tls_failure(&io).unwrap();
        assert!(found.contains("CertificateRequired"), "{found}");
        let plain = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(tls_failure(&plain), None);
        // Damaged records are worth a retry.
        let damaged = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::DecryptError,
        );
        assert_eq!(tls_failure(&damaged), None);
    }
}

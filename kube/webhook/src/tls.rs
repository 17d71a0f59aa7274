//! The webhook's serving certificate, read from PEM files and read again when they change
//! (cert-manager and Secret volumes replace them in place), so that a renewed certificate is
//! served without a restart. A change that does not load keeps the last good pair.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// How often a handshake looks at the files' modification times.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The certificate or key cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("--tls-cert {path}: {detail}; accepted: a PEM file with the serving certificate (then its chain)")]
    Cert { path: String, detail: String },
    #[error("--tls-key {path}: {detail}; accepted: a PEM file with the certificate's private key (PKCS#8, SEC1 or PKCS#1)")]
    Key { path: String, detail: String },
    #[error("--tls-cert {cert} and --tls-key {key} do not make a pair: {detail}")]
    Pair {
        cert: String,
        key: String,
        detail: String,
    },
    #[error("cannot set up TLS: {0}")]
    Config(String),
}

/// The two files of the serving pair.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

type Stamp = Option<(SystemTime, u64, SystemTime, u64)>;

fn stamp(files: &CertFiles) -> Stamp {
    let m = |p: &Path| {
        fs::metadata(p)
            .ok()
            .and_then(|m| Some((m.modified().ok()?, m.len())))
    };
    let (a, b) = (m(&files.cert)?, m(&files.key)?);
    Some((a.0, a.1, b.0, b.1))
}

/// Reads and checks the pair.
pub fn load(files: &CertFiles, provider: &CryptoProvider) -> Result<CertifiedKey, TlsError> {
    let cert_err = |detail: String| TlsError::Cert {
        path: files.cert.display().to_string(),
        detail,
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .map_err(|e| cert_err(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| cert_err(e.to_string()))?;
    if chain.is_empty() {
        return Err(cert_err("no CERTIFICATE in it".into()));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| TlsError::Key {
        path: files.key.display().to_string(),
        detail: e.to_string(),
    })?;
    CertifiedKey::from_der(chain, key, provider).map_err(|e| TlsError::Pair {
        cert: files.cert.display().to_string(),
        key: files.key.display().to_string(),
        detail: e.to_string(),
    })
}

struct State {
    stamp: Stamp,
    checked: Instant,
    current: Arc<CertifiedKey>,
}

/// Serves the last good pair, reading the files again when their times or sizes change.
pub struct Reloading {
    files: CertFiles,
    provider: Arc<CryptoProvider>,
    state: Mutex<State>,
}

impl std::fmt::Debug for Reloading {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloading")
            .field("files", &self.files)
            .finish()
    }
}

impl Reloading {
    /// Loads the pair now: a server never starts without one.
    pub fn new(files: CertFiles, provider: Arc<CryptoProvider>) -> Result<Reloading, TlsError> {
        let current = Arc::new(load(&files, &provider)?);
        Ok(Reloading {
            state: Mutex::new(State {
                stamp: stamp(&files),
                checked: Instant::now(),
                current,
            }),
            files,
            provider,
        })
    }

    /// The pair to serve now (reloaded first if the files changed).
    pub fn current(&self) -> Arc<CertifiedKey> {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if s.checked.elapsed() >= CHECK_EVERY {
            s.checked = Instant::now();
            let now = stamp(&self.files);
            if now != s.stamp {
                match load(&self.files, &self.provider) {
                    Ok(k) => {
                        s.current = Arc::new(k);
                        s.stamp = now;
                        eprintln!(
                            "gpuslice webhook: serving the certificate reloaded from {}",
                            self.files.cert.display()
                        );
                    }
                    // A half-written pair: keep the last good one, try again on the next check.
                    Err(e) => eprintln!("gpuslice webhook: keeping the last certificate: {e}"),
                }
            }
        }
        Arc::clone(&s.current)
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// The server's TLS setup: the pair of `files` (loaded now, reloaded as they change), HTTP/1.1
/// only (the API server speaks it to webhooks).
pub fn server_config(files: CertFiles) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    // Checked before anything else starts: a bad pair is an error at start, not at a handshake.
    let resolver = Arc::new(Reloading::new(files, Arc::clone(&provider))?);
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

//! The API server clients: from a kubeconfig file, or the pod's in-cluster credentials. A
//! request waits a bounded time for its answer; a watch, which the API server leaves silent
//! until something changes, gets a client of its own whose read timeout outlasts it.

use std::path::Path;
use std::time::Duration;

/// No client could be made.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("cannot read kubeconfig {path}: {detail}")]
    Kubeconfig { path: String, detail: String },
    #[error("no in-cluster credentials ({detail}); run it in a pod with a service account, or pass --kubeconfig PATH")]
    InCluster { detail: String },
    #[error("cannot make an API server client: {0}")]
    Client(String),
}

/// How long the clients wait on the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// The longest a request waits for the next bytes of its answer (a prepare waits on the
    /// API server: an unreachable one must fail the call, not hang it).
    pub read: Duration,
    /// How long one watch request asks the API server to last (`timeoutSeconds`; kube-client
    /// refuses 295 and above). The watch client's read timeout is this plus [`WATCH_SLACK`].
    pub watch_seconds: u32,
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts {
            read: Duration::from_secs(20),
            watch_seconds: 290,
        }
    }
}

/// How long past a watch's `timeoutSeconds` its client waits before it calls the connection
/// dead: the API server closes the watch at that time, however quiet it was.
pub const WATCH_SLACK: Duration = Duration::from_secs(30);

/// A client for watches, and the length of watch its read timeout allows.
#[derive(Clone)]
pub struct WatchClient {
    pub client: kube::Client,
    /// The `timeoutSeconds` each watch of this client must ask for.
    pub seconds: u32,
}

/// The clients of one program: bounded requests, and watches.
#[derive(Clone)]
pub struct Clients {
    pub requests: kube::Client,
    pub watches: WatchClient,
}

/// The config of `kubeconfig`, or the in-cluster one when `None`.
async fn config(kubeconfig: Option<&Path>) -> Result<kube::Config, ApiError> {
    match kubeconfig {
        Some(path) => {
            let kc =
                kube::config::Kubeconfig::read_from(path).map_err(|e| ApiError::Kubeconfig {
                    path: path.display().to_string(),
                    detail: e.to_string(),
                })?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| ApiError::Kubeconfig {
                    path: path.display().to_string(),
                    detail: e.to_string(),
                })
        }
        None => kube::Config::incluster().map_err(|e| ApiError::InCluster {
            detail: e.to_string(),
        }),
    }
}

/// `config` for request/response calls: the read timeout counts from when the request was
/// sent (not from when its pooled connection went idle).
fn for_requests(mut config: kube::Config, t: &Timeouts) -> kube::Config {
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(t.read);
    config.write_timeout = Some(Duration::from_secs(20));
    config.reset_reader_on_write = true;
    config
}

/// `config` for watches of `t.watch_seconds`: silent until a change, they may wait that long.
fn for_watches(config: kube::Config, t: &Timeouts) -> kube::Config {
    let mut config = for_requests(config, t);
    config.read_timeout = Some(Duration::from_secs(u64::from(t.watch_seconds)) + WATCH_SLACK);
    config
}

fn build(config: kube::Config) -> Result<kube::Client, ApiError> {
    kube::Client::try_from(config).map_err(|e| ApiError::Client(e.to_string()))
}

/// A request client for the cluster `kubeconfig` names, or the in-cluster one when `None`.
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, ApiError> {
    build(for_requests(
        config(kubeconfig).await?,
        &Timeouts::default(),
    ))
}

/// The request and watch clients for the cluster `kubeconfig` names (the in-cluster one when
/// `None`), waiting as `timeouts` says.
pub async fn clients(kubeconfig: Option<&Path>, timeouts: Timeouts) -> Result<Clients, ApiError> {
    let config = config(kubeconfig).await?;
    Ok(Clients {
        requests: build(for_requests(config.clone(), &timeouts))?,
        watches: WatchClient {
            client: build(for_watches(config, &timeouts))?,
            seconds: timeouts.watch_seconds,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> kube::Config {
        kube::Config::new("http://127.0.0.1:1".parse().unwrap())
    }

    #[test]
    fn a_quiet_watch_outlasts_the_request_read_timeout_and_requests_stay_bounded() {
        for t in [
            Timeouts::default(),
            Timeouts {
                read: Duration::from_millis(300),
                watch_seconds: 1,
            },
        ] {
            let requests = for_requests(config(), &t);
            assert_eq!(requests.read_timeout, Some(t.read));
            assert!(requests.reset_reader_on_write);
            let watches = for_watches(config(), &t);
            let watch = Duration::from_secs(u64::from(t.watch_seconds));
            assert!(
                watches.read_timeout.is_some_and(|r| r > watch),
                "{t:?}: {:?}",
                watches.read_timeout
            );
        }
        // The default watch is longer than the request timeout: one client cannot serve both.
        let t = Timeouts::default();
        assert!(Duration::from_secs(u64::from(t.watch_seconds)) > t.read);
    }
}

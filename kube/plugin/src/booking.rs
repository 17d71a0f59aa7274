//! Prepare and unprepare: read the claim from the API server, book exactly what the scheduler
//! chose in the node registry (owner: the claim), have the slice files and the claim's CDI spec
//! written, and answer with the CDI ids. One reservation per claim UID, so a repeated call
//! finds it again and a restart loses nothing: the registry is the state. A claim allocated a
//! GPU the driver has since reported unhealthy (before the taint or withdrawal reached the
//! scheduler) is refused, as the node paths refuse it.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use gpuslice_driver::health::{read_health, HealthError, Unhealthy};
use gpuslice_registry::{
    claim_uid, ClaimShare, Owner, RefusalReason, Registry, RegistryError, Reservation,
};
use k8s_openapi::api::resource::v1::ResourceClaim;
use tokio::sync::Notify;

use crate::claim::{
    check_ref, node_allocation, ClaimError, ClaimRef, NodeAllocation, SlotGeometry,
};
use crate::offer::Held;
use crate::proto::dra;
use crate::writer::{SliceWriter, WriteError};

/// Why a claim was not prepared or unprepared; the kubelet shows the message in the pod's
/// events.
#[derive(Debug, thiserror::Error)]
pub enum BookingError {
    #[error("{0}")]
    Claim(#[from] ClaimError),
    #[error("{claim} does not exist in the API server")]
    NotFound { claim: String },
    #[error("cannot read {claim} from the API server: {detail}")]
    Api { claim: String, detail: String },
    #[error("{claim}: device {device} is not in this node's GPU inventory; run `gpuslice cdi generate` and let the plugin republish")]
    NoGpu { claim: String, device: String },
    #[error("{claim} was not prepared on this node: its UID is booked for {booked}; nothing was released (accepted: the namespace, name and UID that prepare was called with)")]
    OtherClaim { claim: String, booked: String },
    /// The registry refused the booking; its message names the claim.
    #[error("{0}")]
    Refused(Box<RegistryError>),
    #[error("{claim}: {source}")]
    Registry {
        claim: String,
        source: Box<RegistryError>,
    },
    #[error("{claim}: {source}")]
    Write { claim: String, source: WriteError },
    #[error("{claim}: {detail}")]
    Task { claim: String, detail: String },
    #[error("{claim}: {gpu}; gpuslice hands it to no new claim until the driver reports it healthy again (see `gpuslice status`); nothing was booked")]
    Unhealthy { claim: String, gpu: Box<Unhealthy> },
    #[error("{claim}: {source}; nothing was booked")]
    Health { claim: String, source: HealthError },
}

/// What the node's prepared claims hold, by claim UID, as their allocations name it: filled
/// by prepare and by the cleanup pass (which reads every booked claim at start), emptied by
/// unprepare and release. A booked claim missing here is offered as taken by the publisher.
pub type Holdings = Arc<Mutex<BTreeMap<String, Held>>>;

/// The plugin's prepare and unprepare, over the node registry and the API server.
pub struct Plugin {
    node: String,
    registry: Arc<Registry>,
    writer: Arc<dyn SliceWriter>,
    client: kube::Client,
    slots_per_gpu: u32,
    /// The node's record of unhealthy GPUs (`None`: every GPU is healthy).
    health_file: Option<PathBuf>,
    holdings: Holdings,
    claim_locks: ClaimLocks,
    /// Wakes the cleanup loop: a prepare was refused for capacity someone holds, which may be
    /// a booking whose claim went away.
    cleanup_wanted: Arc<Notify>,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin").field("node", &self.node).finish()
    }
}

/// Records in `holdings` what claim `uid` holds (`None`: nothing any more).
fn set_held(holdings: &Holdings, uid: &str, held: Option<Held>) {
    if let Ok(mut h) = holdings.lock() {
        match held {
            Some(held) => h.insert(uid.to_string(), held),
            None => h.remove(uid),
        };
    }
}

/// One lock per claim UID, held by a prepare's or unprepare's blocking work from its booking
/// to its last file. The kubelet retries a call it gave up waiting for while the first one's
/// work goes on (dropping the call does not stop it), and one request may list a claim twice:
/// without the lock, a failed first prepare's release could undo a booking the second had
/// already reported prepared, or a late prepare book after its unprepare.
#[derive(Default)]
struct ClaimLocks(Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>);

impl ClaimLocks {
    /// Waits for claim `uid`'s lock; the guard may move into blocking work.
    async fn lock(&self, uid: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = {
            let mut locks = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            // Only claims some call holds or waits for stay listed.
            locks.retain(|_, l| l.strong_count() > 0);
            match locks.get(uid).and_then(Weak::upgrade) {
                Some(l) => l,
                None => {
                    let l = Arc::new(tokio::sync::Mutex::new(()));
                    locks.insert(uid.to_string(), Arc::downgrade(&l));
                    l
                }
            }
        };
        lock.lock_owned().await
    }
}

/// Runs blocking registry or file work off the async threads.
async fn blocking<T: Send + 'static>(
    claim: &ClaimRef,
    f: impl FnOnce() -> Result<T, BookingError> + Send + 'static,
) -> Result<T, BookingError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| BookingError::Task {
            claim: claim.to_string(),
            detail: e.to_string(),
        })?
}

impl Plugin {
    pub fn new(
        node: String,
        registry: Arc<Registry>,
        writer: Arc<dyn SliceWriter>,
        client: kube::Client,
    ) -> Plugin {
        Plugin {
            node,
            registry,
            writer,
            client,
            slots_per_gpu: gpuslice_config::DEFAULT_SLOTS_PER_GPU,
            health_file: None,
            holdings: Holdings::default(),
            claim_locks: ClaimLocks::default(),
            cleanup_wanted: Arc::new(Notify::new()),
        }
    }

    /// With `n` slots per GPU (`dra.slots_per_gpu`): the size of the slots claims name.
    pub fn with_slots_per_gpu(mut self, n: u32) -> Plugin {
        self.slots_per_gpu = n;
        self
    }

    /// With the node's record of unhealthy GPUs, `health.json`: a new booking on one of them
    /// is refused.
    pub fn with_health_file(mut self, path: Option<PathBuf>) -> Plugin {
        self.health_file = path;
        self
    }

    pub fn slots_per_gpu(&self) -> u32 {
        self.slots_per_gpu
    }

    /// What the node's prepared claims hold.
    pub fn holdings(&self) -> &Holdings {
        &self.holdings
    }

    /// Notified when a cleanup pass should run now rather than at its next tick.
    pub fn cleanup_wanted(&self) -> &Arc<Notify> {
        &self.cleanup_wanted
    }

    /// Records what claim `uid` holds (`None`: nothing any more).
    pub fn set_held(&self, uid: &str, held: Option<Held>) {
        set_held(&self.holdings, uid, held);
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    pub fn writer(&self) -> &Arc<dyn SliceWriter> {
        &self.writer
    }

    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// The claim `namespace/name` from the API server, `None` when it does not exist.
    pub async fn read_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ResourceClaim>, kube::Error> {
        kube::Api::<ResourceClaim>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
    }

    /// Prepares claim `c`: the devices to report, each with the claim's CDI device.
    pub async fn prepare(&self, c: &ClaimRef) -> Result<Vec<dra::Device>, BookingError> {
        check_ref(c)?;
        let who = c.to_string();
        let claim = match self.read_claim(&c.namespace, &c.name).await {
            Ok(Some(claim)) => claim,
            Ok(None) => return Err(BookingError::NotFound { claim: who }),
            Err(e) => {
                return Err(BookingError::Api {
                    claim: who,
                    detail: e.to_string(),
                })
            }
        };
        let registry = self.registry.clone();
        let writer = self.writer.clone();
        let claim_ref = c.clone();
        let node = self.node.clone();
        let per_gpu = self.slots_per_gpu;
        let health = self.health_file.clone();
        let holdings = self.holdings.clone();
        let lock = self.claim_locks.lock(&c.uid).await;
        let booked = blocking(c, move || {
            let _lock = lock;
            let booked = book_and_write(
                &registry,
                &*writer,
                &claim_ref,
                &claim,
                &node,
                per_gpu,
                health.as_deref(),
            )?;
            set_held(&holdings, &claim_ref.uid, Some(booked.0.held.clone()));
            Ok(booked)
        })
        .await;
        if let Err(BookingError::Refused(e)) = &booked {
            if e.refusal()
                .is_some_and(|r| r.reason == RefusalReason::NoFit)
            {
                self.cleanup_wanted.notify_one();
            }
        }
        let (allocation, ids) = booked?;
        Ok(allocation
            .results
            .iter()
            .map(|r| dra::Device {
                request_names: vec![r.request.clone()],
                pool_name: self.node.clone(),
                device_name: r.device.clone(),
                cdi_device_ids: ids.clone(),
                share_id: r.share_id.clone(),
            })
            .collect())
    }

    /// Unprepares claim `c`: releases its reservation and removes its CDI spec. A claim this
    /// node never prepared succeeds; a UID booked for another namespace or name is refused and
    /// nothing is released.
    pub async fn unprepare(&self, c: &ClaimRef) -> Result<(), BookingError> {
        check_ref(c)?;
        let registry = self.registry.clone();
        let writer = self.writer.clone();
        let claim = c.clone();
        let holdings = self.holdings.clone();
        let lock = self.claim_locks.lock(&c.uid).await;
        blocking(c, move || {
            let _lock = lock;
            release(&registry, &*writer, &claim)?;
            set_held(&holdings, &claim.uid, None);
            Ok(())
        })
        .await
    }
}

/// The test-only environment variable naming a point of prepare where the plugin stops for
/// good: a fault test kills it there (docs/troubleshooting.md, "Restarts and upgrades").
/// Unset, as always outside tests, nothing pauses.
pub const PAUSE_ENV: &str = "GPUSLICE_TEST_PAUSE_AT";
/// After the claim was read, before anything is booked.
pub const PAUSE_BEFORE_BOOKING: &str = "prepare-before-booking";
/// After the booking, before the claim's slice files and CDI spec are written.
pub const PAUSE_AFTER_BOOKING: &str = "prepare-after-booking";

/// Stops this (blocking) thread for good when [`PAUSE_ENV`] names `point`, saying so on
/// stderr first; returns at once otherwise.
fn pause_point(point: &str, c: &ClaimRef) {
    if std::env::var_os(PAUSE_ENV).is_some_and(|v| v == point) {
        eprintln!("gpuslice kubelet-plugin: {PAUSE_ENV}: paused at {point} preparing {c}");
        loop {
            std::thread::park();
        }
    }
}

/// The unhealthy GPU of `health` (the node's `health.json`) among `wanted`, if any.
fn unhealthy_among(health: &Path, wanted: &[ClaimShare]) -> Result<Option<Unhealthy>, HealthError> {
    Ok(read_health(health)?
        .into_iter()
        .find(|u| wanted.iter().any(|w| w.uuid.eq_ignore_ascii_case(&u.uuid))))
}

/// Reads `claim`'s allocation on `node`, books it for the claim and writes the claim's files; a
/// booking this call made is released again when writing fails. A claim not yet booked is
/// refused a GPU `health` records as unhealthy (a repeated prepare of a booked one is not).
fn book_and_write(
    registry: &Registry,
    writer: &dyn SliceWriter,
    c: &ClaimRef,
    claim: &ResourceClaim,
    node: &str,
    slots_per_gpu: u32,
    health: Option<&Path>,
) -> Result<(NodeAllocation, Vec<String>), BookingError> {
    let who = c.to_string();
    let snapshot = registry.snapshot().map_err(|e| BookingError::Registry {
        claim: who.clone(),
        source: Box::new(e),
    })?;
    let booked_before = snapshot
        .reservations
        .iter()
        .any(|r| claim_uid(r) == Some(c.uid.as_str()));
    let inventory = snapshot.inventory;
    let allocation = node_allocation(
        claim,
        c,
        node,
        &SlotGeometry::new(slots_per_gpu, &inventory),
    )?;
    let shares = &allocation.shares;
    pause_point(PAUSE_BEFORE_BOOKING, c);
    let mut wanted = Vec::with_capacity(shares.len());
    for s in shares {
        let gpu = inventory
            .gpus
            .iter()
            .find(|g| g.index == s.index)
            .ok_or_else(|| BookingError::NoGpu {
                claim: who.clone(),
                device: gpuslice_dra::slices::device_name(s.index),
            })?;
        wanted.push(ClaimShare {
            uuid: gpu.uuid.clone(),
            memory: s.memory,
            cores: s.cores,
        });
    }
    if let Some(path) = health.filter(|_| !booked_before) {
        match unhealthy_among(path, &wanted) {
            Ok(None) => {}
            Ok(Some(u)) => {
                return Err(BookingError::Unhealthy {
                    claim: who,
                    gpu: Box::new(u),
                })
            }
            Err(source) => return Err(BookingError::Health { claim: who, source }),
        }
    }
    let owner = Owner::DraClaim {
        claim_uid: c.uid.clone(),
        namespace: c.namespace.clone(),
        members: Vec::new(),
        name: c.name.clone(),
        gone: None,
    };
    let booked = registry
        .reserve_claim(&owner, &wanted)
        .map_err(|e| match e.refusal() {
            Some(_) => BookingError::Refused(Box::new(e)),
            None => BookingError::Registry {
                claim: who.clone(),
                source: Box::new(e),
            },
        })?;
    pause_point(PAUSE_AFTER_BOOKING, c);
    match writer.write(&c.uid, &booked.reservation) {
        Ok(ids) => Ok((allocation, ids)),
        Err(source) => {
            if booked.created {
                let _ = release(registry, writer, c);
            }
            Err(BookingError::Write { claim: who, source })
        }
    }
}

/// Releases claim `c`'s reservation and removes its spec. The reservation is found by UID and
/// released only when it was booked for `c`'s namespace and name too: a call that names the
/// UID under another claim releases nothing and removes nothing.
pub(crate) fn release(
    registry: &Registry,
    writer: &dyn SliceWriter,
    c: &ClaimRef,
) -> Result<(), BookingError> {
    let who = c.to_string();
    let registry_error = |e| BookingError::Registry {
        claim: who.clone(),
        source: Box::new(e),
    };
    let held: Vec<Reservation> = registry
        .snapshot()
        .map_err(registry_error)?
        .reservations
        .into_iter()
        .filter(|r| claim_uid(r) == Some(c.uid.as_str()))
        .collect();
    if let Some(booked) = held.iter().filter_map(held_by).find(|b| b != c) {
        return Err(BookingError::OtherClaim {
            claim: who,
            booked: booked.to_string(),
        });
    }
    // By reservation id, not by UID: a booking made for another claim after the check above
    // is not this one and stays.
    for r in &held {
        registry.release(&r.id).map_err(registry_error)?;
    }
    writer
        .remove(&c.uid)
        .map_err(|source| BookingError::Write { claim: who, source })
}

/// The claim a reservation is held by, when it is one.
pub fn held_by(r: &Reservation) -> Option<ClaimRef> {
    match &r.owner {
        Owner::DraClaim {
            claim_uid,
            namespace,
            name,
            ..
        } => Some(ClaimRef {
            namespace: namespace.clone(),
            name: name.clone(),
            uid: claim_uid.clone(),
        }),
        Owner::Container { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A claim's calls take turns, even when the caller of the first gave up on it while its
    /// blocking work goes on; other claims' calls do not wait.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_claims_calls_take_turns_even_after_a_caller_gave_up() {
        let locks = Arc::new(ClaimLocks::default());
        let (started, ran) = (Arc::new(Notify::new()), Arc::new(Mutex::new(Vec::new())));
        // The first call's work holds the lock for 300 ms; its caller stops waiting at once.
        let first = {
            let (locks, started, ran) = (locks.clone(), started.clone(), ran.clone());
            tokio::spawn(async move {
                let lock = locks.lock("u").await;
                let work = tokio::task::spawn_blocking(move || {
                    let _lock = lock;
                    started.notify_one();
                    std::thread::sleep(Duration::from_millis(300));
                    ran.lock().unwrap().push("first");
                });
                work.await.unwrap();
            })
        };
        started.notified().await;
        first.abort();
        // Another claim is not held up.
        let other = tokio::time::timeout(Duration::from_millis(100), locks.lock("v")).await;
        assert!(other.is_ok(), "claim v waited for claim u");
        // The retry of claim u waits for the first call's work to end.
        let _again = locks.lock("u").await;
        ran.lock().unwrap().push("retry");
        assert_eq!(*ran.lock().unwrap(), ["first", "retry"]);
        // Only claims some call holds stay listed.
        drop(other);
        let _w = locks.lock("w").await;
        let listed: Vec<String> = locks.0.lock().unwrap().keys().cloned().collect();
        assert!(!listed.contains(&"v".to_string()), "{listed:?}");
    }
}

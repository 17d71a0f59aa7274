//! The node config as typed values, with the defaults docs/configuration.md lists for every key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Default location of the config file.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/gpuslice/config.toml";
/// Default node state directory (a tmpfs on real nodes).
pub const DEFAULT_STATE_DIR: &str = "/run/gpuslice";
/// Default directory for CDI specs.
pub const DEFAULT_CDI_SPEC_DIR: &str = "/var/run/cdi";
/// Default installed location of the enforcement shim.
pub const DEFAULT_SHIM_LIBRARY: &str = "/usr/lib/gpuslice/libgpuslice_shim.so";
/// Default low-level runtime that `gpuslice-runtime` executes.
pub const DEFAULT_RUNTIME: &str = "runc";
/// Default pending-reservation deadline.
pub const DEFAULT_PENDING_TIMEOUT: Duration = Duration::from_secs(120);
/// Default metrics listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9400";
/// Default grace before the enforcer acts on a slice over its memory limit.
pub const DEFAULT_ENFORCE_GRACE: Duration = Duration::from_secs(2);
/// Default period of the enforcer's readings.
pub const DEFAULT_ENFORCE_INTERVAL: Duration = Duration::from_millis(500);
/// Default window over which the enforcer judges a slice's compute share.
pub const DEFAULT_ENFORCE_WINDOW: Duration = Duration::from_secs(5);
/// Default model name of a simulated GPU.
pub const DEFAULT_SIM_MODEL: &str = "NVIDIA H200";
/// Default memory of a simulated GPU (141 GiB, like an H200).
pub const DEFAULT_SIM_MEMORY: u64 = 141 << 30;
/// Default device memory each CUDA context of a simulated GPU costs its process (512 MiB):
/// between a bare driver context on a current data-centre GPU and the 781 MB `nvidia-smi`
/// shows for a small PyTorch program (pytorch/pytorch#34323); see docs/configuration.md.
pub const DEFAULT_SIM_CONTEXT_MEMORY: u64 = 512 << 20;

/// The whole node configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Node state: registry, slices, simulated node.
    pub state_dir: PathBuf,
    pub inventory: InventoryConfig,
    pub cdi: CdiConfig,
    pub placement: PlacementConfig,
    pub shim: ShimConfig,
    pub runtime: RuntimeConfig,
    pub registry: RegistryConfig,
    pub driver: DriverConfig,
    pub hook: HookConfig,
    pub serve: ServeConfig,
    pub enforce: EnforceConfig,
    pub dra: DraConfig,
    pub health: HealthConfig,
}

/// What the enforcer does with a slice whose processes hold more than its memory limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryAction {
    /// Kill the process that crossed the limit (after `grace`).
    Kill,
    /// Log and count it only.
    Report,
}

impl MemoryAction {
    pub const ACCEPTED: &'static str = "`kill` or `report`";

    pub fn parse(s: &str) -> Option<MemoryAction> {
        match s {
            "kill" => Some(MemoryAction::Kill),
            "report" => Some(MemoryAction::Report),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            MemoryAction::Kill => "kill",
            MemoryAction::Report => "report",
        }
    }
}

/// What the enforcer does with a slice running above its compute share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComputeAction {
    /// Log and count it only.
    Report,
    /// Freeze the container's cgroup in a duty cycle that brings it back to its share.
    Throttle,
}

impl ComputeAction {
    pub const ACCEPTED: &'static str = "`report` or `throttle`";

    pub fn parse(s: &str) -> Option<ComputeAction> {
        match s {
            "report" => Some(ComputeAction::Report),
            "throttle" => Some(ComputeAction::Throttle),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ComputeAction::Report => "report",
            ComputeAction::Throttle => "throttle",
        }
    }
}

/// The host-side enforcer of `gpuslice serve` (docs/security.md, "What only the enforcer guarantees").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnforceConfig {
    pub memory: MemoryAction,
    pub compute: ComputeAction,
    /// How long a slice may stay over its memory limit before the action.
    pub grace: Duration,
    /// How often the driver's per-process figures are read.
    pub interval: Duration,
    /// The window a slice's compute share is judged over.
    pub window: Duration,
}

impl Default for EnforceConfig {
    fn default() -> Self {
        EnforceConfig {
            memory: MemoryAction::Kill,
            compute: ComputeAction::Report,
            grace: DEFAULT_ENFORCE_GRACE,
            interval: DEFAULT_ENFORCE_INTERVAL,
            window: DEFAULT_ENFORCE_WINDOW,
        }
    }
}

/// The file under the state directory where the kubelet plugin records its DRA mode.
pub const KUBELET_PLUGIN_FILE: &str = "kubelet-plugin.json";
/// File name, in the state dir, of the GPUs the driver reported unhealthy.
pub const HEALTH_FILE: &str = "health.json";

/// The slots each GPU is published as in slot mode when `dra.slots_per_gpu` is not set: a slot
/// is 23.5 GiB of a 141 GiB GPU, 13.3 GiB of an 80 GiB one, and the stock scheduler of
/// 1.34/1.35 (whose allocator tries the free slots of a GPU in every order before it gives up
/// on a node) decides a claim that fits nowhere on a fragmented 100-node cluster within its
/// filter timeout; at 8 it timed out (docs/kubernetes-dra.md and docs/benchmarks.md say why).
pub const DEFAULT_SLOTS_PER_GPU: u32 = 6;
/// The most slots a GPU may be published as (one ResourceSlice's device limit).
pub const MAX_SLOTS_PER_GPU: u32 = 128;
/// The most slots per GPU at which the scheduler of Kubernetes 1.34/1.35 was measured to decide
/// a claim that fits nowhere within its 10 s filter timeout (6: 7 s on a fragmented 100-node
/// cluster; 8 timed out). Above it slot mode works, with that risk, and says so.
pub const TIMELY_SLOTS_PER_GPU: u32 = 6;

/// What an operator is told (the kubelet plugin's start log, `gpuslice status`) when slot mode
/// runs with `slots_per_gpu` above [`TIMELY_SLOTS_PER_GPU`]; `None` at or below it.
pub fn slots_per_gpu_warning(slots_per_gpu: u32) -> Option<String> {
    (slots_per_gpu > TIMELY_SLOTS_PER_GPU).then(|| {
        format!(
            "dra.slots_per_gpu = {slots_per_gpu} is above {TIMELY_SLOTS_PER_GPU} (the default is \
             {DEFAULT_SLOTS_PER_GPU}): the scheduler of Kubernetes 1.34/1.35 tries the free slots \
             of a GPU in every order before it gives up on a claim that fits nowhere, which above \
             {TIMELY_SLOTS_PER_GPU} slots can pass its 10 s filter timeout (the pod then gets \
             SchedulerError on every node, not Unschedulable, and is retried at the same cost); \
             keep {TIMELY_SLOTS_PER_GPU} or fewer unless no claim can meet a fragmented cluster \
             (docs/kubernetes-dra.md, \"The devices\")"
        )
    })
}

/// How the DRA kubelet plugin publishes GPUs: one shared device per GPU, or N slot devices
/// (docs/kubernetes-dra.md, "Slot mode: every DRA cluster").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DraMode {
    /// Capacity where the API server keeps consumable capacity, slots where it does not.
    Auto,
    /// One shared device per GPU with consumable `memory` and `cores`.
    Capacity,
    /// `slots_per_gpu` equal devices per GPU, claimed `count: k` on one GPU.
    Slots,
}

impl DraMode {
    pub const ACCEPTED: &'static str = "`auto`, `capacity` or `slots`";

    pub fn parse(s: &str) -> Option<DraMode> {
        match s {
            "auto" => Some(DraMode::Auto),
            "capacity" => Some(DraMode::Capacity),
            "slots" => Some(DraMode::Slots),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DraMode::Auto => "auto",
            DraMode::Capacity => "capacity",
            DraMode::Slots => "slots",
        }
    }
}

/// The `[dra]` table: how the kubelet plugin publishes the node's GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraConfig {
    pub mode: DraMode,
    /// Slot devices per GPU in slot mode, 1 to [`MAX_SLOTS_PER_GPU`].
    pub slots_per_gpu: u32,
}

impl Default for DraConfig {
    fn default() -> Self {
        DraConfig {
            mode: DraMode::Auto,
            slots_per_gpu: DEFAULT_SLOTS_PER_GPU,
        }
    }
}

/// NVIDIA's k8s-device-plugin's application-error XIDs, which leave the GPU healthy: graphics
/// engine exception (13), GPU memory page fault (31), GPU stopped processing (43),
/// preemptive cleanup (45), video processor exception (68), context-switch timeout (109).
pub const DEFAULT_IGNORED_XIDS: [u32; 6] = [13, 31, 43, 45, 68, 109];

/// The effect of the device taint an unhealthy GPU carries in the DRA slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaintEffect {
    /// New claims are not allocated the GPU; pods already on it keep running.
    NoSchedule,
    /// As `NoSchedule`, and Kubernetes evicts the pods whose claims use it.
    NoExecute,
}

impl TaintEffect {
    pub const ACCEPTED: &'static str = "`NoSchedule` or `NoExecute`";

    pub fn parse(s: &str) -> Option<TaintEffect> {
        match s {
            "NoSchedule" => Some(TaintEffect::NoSchedule),
            "NoExecute" => Some(TaintEffect::NoExecute),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::NoExecute => "NoExecute",
        }
    }
}

/// The `[health]` table: which XIDs the driver reports make a GPU unhealthy, and what the
/// DRA slice says of an unhealthy GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthConfig {
    /// XIDs that leave the GPU healthy (application errors); every other XID is fatal.
    pub ignored_xids: Vec<u32>,
    pub taint_effect: TaintEffect,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            ignored_xids: DEFAULT_IGNORED_XIDS.to_vec(),
            taint_effect: TaintEffect::NoSchedule,
        }
    }
}

impl HealthConfig {
    /// Whether XID `xid` makes a GPU unhealthy.
    pub fn is_fatal(&self, xid: u32) -> bool {
        !self.ignored_xids.contains(&xid)
    }
}

/// Where the GPU inventory comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InventorySource {
    /// The NVIDIA driver, through NVML.
    Nvml,
    /// The `[[inventory.simulated]]` list: a simulated node for tests and demos.
    Simulated,
}

impl InventorySource {
    pub fn as_str(self) -> &'static str {
        match self {
            InventorySource::Nvml => "nvml",
            InventorySource::Simulated => "simulated",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct InventoryConfig {
    pub source: InventorySource,
    pub simulated: Vec<SimulatedGpu>,
}

/// One simulated GPU, in index order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimulatedGpu {
    pub model: String,
    /// Total memory in bytes.
    pub memory: u64,
    /// `GPU-<uuid>`; derived stably from index and model when not configured.
    pub uuid: String,
    /// Device memory each CUDA context costs its process (NVML's per-process figures
    /// include it; no allocation returns it).
    pub context_memory: u64,
    /// Device memory the driver and firmware set aside (NVML's `reserved`): counted in
    /// `memory`, never allocatable, never booked. Less than `memory`; 0 by default.
    pub reserved_memory: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CdiConfig {
    pub spec_dir: PathBuf,
}

/// How slices are placed on GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Policy {
    /// The fullest GPU that fits: keeps whole GPUs free.
    Binpack,
    /// The emptiest GPU: spreads load.
    Spread,
}

impl Policy {
    pub const ACCEPTED: &'static str = "`binpack` or `spread`";

    pub fn parse(s: &str) -> Option<Policy> {
        match s {
            "binpack" => Some(Policy::Binpack),
            "spread" => Some(Policy::Spread),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Binpack => "binpack",
            Policy::Spread => "spread",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct PlacementConfig {
    pub policy: Policy,
    /// Factor by which booked memory may exceed a GPU's memory (1.0 = never).
    pub memory_overcommit: f64,
    /// At most this many slices on one GPU, when set.
    pub max_slices_per_gpu: Option<u32>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ShimConfig {
    /// Host path of the enforcement shim mounted into slice containers.
    pub library: PathBuf,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeConfig {
    /// The low-level runtime `gpuslice-runtime` executes: a path, or a name looked up in PATH.
    pub path: PathBuf,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RegistryConfig {
    /// A reservation not bound to a container by then is reaped.
    pub pending_timeout: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DriverConfig {
    /// Root of the NVIDIA driver installation (device nodes and libraries). For a simulated
    /// inventory the driver root is always `state_dir/sim`.
    pub root: PathBuf,
}

#[derive(Debug, Clone, PartialEq)]
pub struct HookConfig {
    /// Absolute path of the `gpuslice` binary written into OCI hooks. `None`: the `gpuslice`
    /// binary next to the running executable.
    pub path: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ServeConfig {
    /// Address of the Prometheus endpoint.
    pub listen: SocketAddr,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
            inventory: InventoryConfig {
                source: InventorySource::Nvml,
                simulated: Vec::new(),
            },
            cdi: CdiConfig {
                spec_dir: PathBuf::from(DEFAULT_CDI_SPEC_DIR),
            },
            placement: PlacementConfig {
                policy: Policy::Binpack,
                memory_overcommit: 1.0,
                max_slices_per_gpu: None,
            },
            shim: ShimConfig {
                library: PathBuf::from(DEFAULT_SHIM_LIBRARY),
            },
            runtime: RuntimeConfig {
                path: PathBuf::from(DEFAULT_RUNTIME),
            },
            registry: RegistryConfig {
                pending_timeout: DEFAULT_PENDING_TIMEOUT,
            },
            driver: DriverConfig {
                root: PathBuf::from("/"),
            },
            hook: HookConfig { path: None },
            serve: ServeConfig {
                listen: DEFAULT_LISTEN
                    .parse()
                    .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 9400))),
            },
            enforce: EnforceConfig::default(),
            dra: DraConfig::default(),
            health: HealthConfig::default(),
        }
    }
}

impl Config {
    /// Where `gpuslice kubelet-plugin` records the mode it publishes in (for `status`).
    pub fn kubelet_plugin_path(&self) -> PathBuf {
        self.state_dir.join(KUBELET_PLUGIN_FILE)
    }

    /// The GPUs the driver reported unhealthy, as the agent records them
    /// (`gpuslice_driver::health`).
    pub fn health_path(&self) -> PathBuf {
        self.state_dir.join(HEALTH_FILE)
    }

    /// The registry file.
    pub fn registry_path(&self) -> PathBuf {
        self.state_dir.join("registry.json")
    }

    /// Directory of the per-reservation slice directories.
    pub fn slices_dir(&self) -> PathBuf {
        self.state_dir.join("slices")
    }

    /// Root of the simulated node (device nodes, driver libraries, driver state).
    pub fn sim_root(&self) -> PathBuf {
        self.state_dir.join("sim")
    }

    /// The driver root discovery reads: `state_dir/sim` for a simulated node.
    pub fn effective_driver_root(&self) -> PathBuf {
        match self.inventory.source {
            InventorySource::Simulated => self.sim_root(),
            InventorySource::Nvml => self.driver.root.clone(),
        }
    }

    /// True when the inventory is simulated.
    pub fn is_simulated(&self) -> bool {
        self.inventory.source == InventorySource::Simulated
    }
}

/// The stable UUID of simulated GPU `index` of `model`: `GPU-` and a name-based (v5) UUID,
/// so the simulated driver and the inventory agree without sharing state.
pub fn simulated_uuid(index: usize, model: &str) -> String {
    const NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x6770_7573_6c69_6365_8000_0000_0000_0001);
    let id = uuid::Uuid::new_v5(
        &NAMESPACE,
        format!("gpuslice-sim:{index}:{model}").as_bytes(),
    );
    format!("GPU-{}", id.hyphenated())
}

/// The PCI bus id of simulated GPU `index`, as NVML prints bus ids (`00000000:18:00.0`).
pub fn simulated_pci_bus_id(index: usize) -> String {
    format!("00000000:{:02X}:00.0", 0x18 + index)
}

/// Checks the `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` form NVIDIA uses.
pub fn is_gpu_uuid(s: &str) -> bool {
    match s.strip_prefix("GPU-") {
        Some(rest) => uuid::Uuid::try_parse(rest).is_ok() && rest.len() == 36,
        None => false,
    }
}

/// The longest GPU model name, or part of one, that the config (`inventory.simulated[].model`)
/// and the annotation `gpuslice.io/gpu-type` accept, in characters.
pub const MAX_MODEL_CHARS: usize = 96;

/// Whether `s` is acceptable as a GPU model name or part of one: not blank, at most
/// [`MAX_MODEL_CHARS`] characters (counted as characters, not bytes: `é` is one), none of
/// them a control character.
pub fn is_model_text(s: &str) -> bool {
    !s.trim().is_empty() && s.chars().count() <= MAX_MODEL_CHARS && !s.chars().any(char::is_control)
}

/// True for an absolute path without `..` components and without NUL (no system call takes
/// a path with one: it would fail far from the config key that named it).
pub(crate) fn is_clean_absolute(p: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    p.is_absolute()
        && !p.as_os_str().as_bytes().contains(&0)
        && !p
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
}

/// Whether `s` is a `runtime.path` the config accepts: a program name (looked up in PATH) or
/// a clean absolute path, without NUL either way.
pub(crate) fn valid_runtime_path(s: &str) -> bool {
    let bare_name = !s.is_empty() && !s.contains(['/', '\0']);
    bare_name || is_clean_absolute(std::path::Path::new(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_text_counts_characters_not_bytes() {
        assert!(is_model_text("NVIDIA H200"));
        assert!(is_model_text(&"é".repeat(MAX_MODEL_CHARS)));
        assert!(is_model_text(&"x".repeat(MAX_MODEL_CHARS)));
        assert!(!is_model_text(&"é".repeat(MAX_MODEL_CHARS + 1)));
        assert!(!is_model_text(&"x".repeat(MAX_MODEL_CHARS + 1)));
        assert!(!is_model_text("  "));
        assert!(!is_model_text(""));
        assert!(!is_model_text("H\u{7}200"));
    }

    #[test]
    fn simulated_uuid_is_stable_and_well_formed() {
        let a = simulated_uuid(0, "NVIDIA H200");
        assert_eq!(a, simulated_uuid(0, "NVIDIA H200"));
        assert_ne!(a, simulated_uuid(1, "NVIDIA H200"));
        assert_ne!(a, simulated_uuid(0, "NVIDIA A100"));
        assert!(is_gpu_uuid(&a), "{a}");
        assert!(!is_gpu_uuid("GPU-xyz"));
        assert!(!is_gpu_uuid("7a0b5c8e-0000-0000-0000-000000000000"));
    }

    #[test]
    fn slot_counts_above_what_the_scheduler_decides_in_time_are_warned_of() {
        for n in 1..=TIMELY_SLOTS_PER_GPU {
            assert_eq!(slots_per_gpu_warning(n), None, "{n}");
        }
        let w = slots_per_gpu_warning(8).unwrap();
        assert!(
            w.starts_with("dra.slots_per_gpu = 8 is above 6 (the default is 6):"),
            "{w}"
        );
        assert!(w.contains("10 s filter timeout"), "{w}");
        assert!(slots_per_gpu_warning(MAX_SLOTS_PER_GPU).is_some());
    }
}

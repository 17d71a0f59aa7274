//! Command line of `gpuslice-probe`.

use clap::{Parser, Subcommand, ValueEnum};

use crate::cuda::Resolve;

/// Drive a CUDA driver (simulated or real) the way the CUDA runtime does.
#[derive(Debug, Parser)]
#[command(name = "gpuslice-probe", version)]
pub struct Cli {
    /// The driver library to dlopen.
    #[arg(long, global = true, default_value = "libcuda.so.1")]
    pub lib: String,
    /// The NVML library to dlopen for NVML figures (optional).
    #[arg(long, global = true, default_value = "libnvidia-ml.so.1")]
    pub nvml_lib: String,
    /// How entry points are resolved [default: proc2 for --cuda-version 12000 and later, else proc].
    #[arg(long, global = true, value_enum)]
    pub resolve: Option<Resolve>,
    /// The CUDA version the probe claims to be built against (11030 or later).
    #[arg(long, global = true, default_value_t = 12040, value_parser = clap::value_parser!(i32).range(11030..))]
    pub cuda_version: i32,
    /// Device ordinal.
    #[arg(long, global = true, default_value_t = 0)]
    pub device: i32,
    /// One JSON object per line instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    pub fn resolve(&self) -> Resolve {
        self.resolve.unwrap_or(if self.cuda_version >= 12000 {
            Resolve::Proc2
        } else {
            Resolve::Proc
        })
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Name, UUID, cuMemGetInfo, cuDeviceTotalMem and NVML memory of a device.
    Info,
    /// Allocate until refused; print the total allocated and the error.
    Alloc(AllocArgs),
    /// `alloc` on several devices of one process: each filled until refused, all held.
    Multi(MultiArgs),
    /// `alloc` in a context made with cuCtxCreate, that context destroyed with everything
    /// still allocated, then cuMemAlloc in the primary context until refused; report,
    /// hold, exit without freeing.
    CtxDestroy(AllocArgs),
    /// Launch spin kernels back to back; print the achieved share of device time.
    Burn(BurnArgs),
    /// Median cost of one call.
    Bench(BenchArgs),
    /// Make contexts, allocate the free memory cuMemGetInfo reports (or a fraction), report
    /// CUDA's and NVML's figures (memory v1/v2, every process list), hold.
    Fill(FillArgs),
    /// NVML only, as nvidia-smi reads it: every GPU's memory and process lists. The probe
    /// run under the name `nvidia-smi` does this.
    Smi,
    /// A captured graph allocating and freeing `--chunk` is instantiated, launched and its
    /// executable destroyed (the driver's graph pool keeps the memory); then `--then` runs.
    /// Reports cuMemGetInfo before, after the destroy and after the step, the step's error
    /// and the driver's graph pool figures; holds; frees.
    GraphCache(GraphCacheArgs),
    /// Threads allocating and freeing concurrently (cuMemAlloc and cuMemAllocAsync at
    /// random) for some rounds; print cuMemGetInfo's used memory before and after.
    Churn(ChurnArgs),
}

/// The allocation path exercised by `alloc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Api {
    /// cuMemAlloc.
    Alloc,
    /// cuMemAllocPitch.
    Pitch,
    /// cuMemAllocManaged.
    Managed,
    /// cuMemAllocAsync on a stream.
    Async,
    /// cuMemAllocFromPoolAsync from a created pool.
    Pool,
    /// cuMemAllocFromPoolAsync from the default pool (cuDeviceGetDefaultMemPool) of the
    /// stream's device (`--stream-device`, else the allocating device).
    DefaultPool,
    /// cuMemCreate + cuMemAddressReserve + cuMemMap + cuMemSetAccess.
    Vmm,
    /// As `vmm`, the handle released at once after mapping (the CUDA samples' idiom): the
    /// memory stays allocated until it is unmapped.
    VmmReleaseMapped,
    /// cuArrayCreate (float4 2D arrays).
    Array,
    /// A graph with a memory-allocation node, instantiated and launched.
    Graph,
    /// cuArray3DCreate (float4 3D arrays of 1024 × 1024 × depth).
    Array3d,
    /// cuMipmappedArrayCreate (float4 2D arrays, two levels).
    Mipmap,
    /// A graph with a memory-allocation node added by cuGraphAddNode (CUDA 12.2+).
    GraphNode,
    /// A graph built by stream capture (cuStreamBeginCapture/EndCapture) of scratch memory:
    /// cuMemAllocAsync then cuMemFreeAsync.
    Capture,
    /// A clone (cuGraphClone) of a graph with a memory-allocation node.
    Clone,
    /// A graph whose child-graph node (cuGraphAddChildGraphNode) allocates.
    Child,
    /// The device malloc heap grown by cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE).
    Heap,
    /// A graph whose allocation node has no free node: launched, then the executable graph
    /// and the graph destroyed at once; the memory stays live until cuMemFreeAsync.
    GraphEscape,
    /// A fresh pool per chunk with release threshold UINT64_MAX: allocate and free, so the
    /// pool keeps the memory reserved (reports the pools' peak reserved bytes).
    PoolKeep,
}

/// How graphs of the graph APIs are instantiated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Instantiate {
    /// The exported cuGraphInstantiate (pre-12.0 signature), looked up with dlsym.
    Legacy,
    /// The exported cuGraphInstantiate_v2, looked up with dlsym.
    V2,
    /// cuGraphInstantiateWithFlags.
    Flags,
    /// cuGraphInstantiateWithParams (CUDA 12.0+).
    Params,
}

impl Api {
    pub fn as_str(self) -> &'static str {
        match self {
            Api::Alloc => "alloc",
            Api::Pitch => "pitch",
            Api::Managed => "managed",
            Api::Async => "async",
            Api::Pool => "pool",
            Api::DefaultPool => "default-pool",
            Api::Vmm => "vmm",
            Api::VmmReleaseMapped => "vmm-release-mapped",
            Api::Array => "array",
            Api::Graph => "graph",
            Api::Array3d => "array3d",
            Api::Mipmap => "mipmap",
            Api::GraphNode => "graph-node",
            Api::Capture => "capture",
            Api::Clone => "clone",
            Api::Child => "child",
            Api::Heap => "heap",
            Api::GraphEscape => "graph-escape",
            Api::PoolKeep => "pool-keep",
        }
    }

    /// Whether this path builds and instantiates a graph.
    pub fn is_graph(self) -> bool {
        matches!(
            self,
            Api::Graph | Api::GraphNode | Api::Capture | Api::Clone | Api::Child | Api::GraphEscape
        )
    }
}

fn bytes(s: &str) -> Result<u64, String> {
    gpuslice_config::parse_bytes(s)
        .map_err(|e| e.to_string())
        .and_then(|b| {
            if b == 0 {
                Err(format!("{s:?} is 0 bytes; give a size above 0, e.g. 1Gi"))
            } else {
                Ok(b)
            }
        })
}

#[derive(Debug, Clone, clap::Args)]
pub struct AllocArgs {
    /// Size of each allocation: bytes or 512Mi, 1Gi, 20G.
    #[arg(long, value_parser = bytes)]
    pub chunk: u64,
    #[arg(long, value_enum, default_value_t = Api::Alloc)]
    pub api: Api,
    /// Stop before exceeding this much [default: twice the device's memory].
    #[arg(long, value_parser = bytes)]
    pub max: Option<u64>,
    /// Keep the memory this many seconds after printing, then free it.
    #[arg(long, default_value_t = 0.0)]
    pub hold: f64,
    /// How the graph APIs instantiate their graphs.
    #[arg(long, value_enum, default_value_t = Instantiate::Flags)]
    pub instantiate: Instantiate,
    /// Make the stream of the stream-ordered APIs on this device ordinal's primary context,
    /// while the allocating device's context stays current.
    #[arg(long)]
    pub stream_device: Option<i32>,
    /// Fill and free this many times in the process; the last round is reported (what a
    /// free gives back is allocatable again).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub rounds: u32,
}

/// What `graph-cache` does once the first executable graph is destroyed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GraphCacheStep {
    /// cuMemAlloc of `--chunk`.
    Alloc,
    /// The same graph instantiated and launched again.
    Graph,
    /// cuDeviceGraphMemTrim.
    Trim,
}

impl GraphCacheStep {
    pub fn as_str(self) -> &'static str {
        match self {
            GraphCacheStep::Alloc => "alloc",
            GraphCacheStep::Graph => "graph",
            GraphCacheStep::Trim => "trim",
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct GraphCacheArgs {
    /// Bytes the graph allocates (and the step's cuMemAlloc): bytes or 512Mi, 3Gi.
    #[arg(long, value_parser = bytes)]
    pub chunk: u64,
    #[arg(long, value_enum)]
    pub then: GraphCacheStep,
    /// Keep everything this many seconds after printing, then free it.
    #[arg(long, default_value_t = 0.0)]
    pub hold: f64,
}

#[derive(Debug, clap::Args)]
pub struct ChurnArgs {
    /// Threads allocating and freeing at once.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub threads: u32,
    /// Rounds per thread: allocate 1 to --held times, then free everything.
    #[arg(long, default_value_t = 100)]
    pub rounds: u32,
    /// Most allocations a thread holds at once.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
    pub held: u64,
    /// Largest allocation; each is this or a half, quarter or eighth of it.
    #[arg(long, value_parser = bytes, default_value = "64Mi")]
    pub chunk: u64,
}

#[derive(Debug, clap::Args)]
pub struct FillArgs {
    /// Contexts made with cuCtxCreate besides the primary one (allocations go to the
    /// primary context).
    #[arg(long, default_value_t = 0)]
    pub contexts: u32,
    /// Fraction of the reported free memory to allocate.
    #[arg(long, default_value_t = 1.0)]
    pub fraction: f64,
    /// Largest single allocation.
    #[arg(long, value_parser = bytes, default_value = "256Mi")]
    pub chunk: u64,
    /// Keep everything this many seconds after printing.
    #[arg(long, default_value_t = 0.0)]
    pub hold: f64,
}

#[derive(Debug, clap::Args)]
pub struct MultiArgs {
    /// Device ordinals to fill one after the other, all held together: 0,1.
    #[arg(long, value_delimiter = ',', required = true)]
    pub devices: Vec<i32>,
    #[command(flatten)]
    pub alloc: AllocArgs,
}

#[derive(Debug, clap::Args)]
pub struct BurnArgs {
    /// Wall time to burn.
    #[arg(long)]
    pub seconds: f64,
    /// Duration of each kernel in microseconds (cycles = us × clock rate).
    #[arg(long, default_value_t = 1000)]
    pub kernel_us: u64,
    /// Launches per batch; the probe waits for the previous batch after queueing each one.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub sync_every: u64,
    /// Time every n-th kernel with an event pair.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    pub sample_every: u64,
    /// The launch entry point.
    #[arg(long, value_enum, default_value_t = LaunchApi::Kernel)]
    pub launch: LaunchApi,
    /// Which context is current while a kernel is launched on the probe's stream (made in
    /// the device's primary context).
    #[arg(long, value_enum, default_value_t = LaunchCurrent::Stream)]
    pub current: LaunchCurrent,
}

/// The context current at each `burn` launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LaunchCurrent {
    /// The stream's own context.
    Stream,
    /// None (`cuCtxSetCurrent(NULL)` before each launch): the launch runs in the stream's
    /// context.
    None,
    /// Another context on the same device (made with `cuCtxCreate`).
    Other,
}

/// How `burn` launches its kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LaunchApi {
    /// cuLaunchKernel on a stream of the probe's.
    Kernel,
    /// The deprecated cuLaunchGridAsync on a stream of the probe's (block shape and the
    /// parameter set beforehand with cuFuncSetBlockShape and cuParamSetv).
    GridAsync,
    /// The deprecated cuLaunchGrid, on the legacy default stream.
    Grid,
    /// The deprecated cuLaunch (a 1×1 grid), on the legacy default stream.
    Legacy,
    /// The deprecated cuLaunchCooperativeKernelMultiDevice, one launch parameter on a stream
    /// of the probe's.
    MultiDevice,
}

impl LaunchApi {
    /// The entry point's name.
    pub fn as_str(self) -> &'static str {
        match self {
            LaunchApi::Kernel => "cuLaunchKernel",
            LaunchApi::GridAsync => "cuLaunchGridAsync",
            LaunchApi::Grid => "cuLaunchGrid",
            LaunchApi::Legacy => "cuLaunch",
            LaunchApi::MultiDevice => "cuLaunchCooperativeKernelMultiDevice",
        }
    }
}

/// What `bench` times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BenchWhat {
    /// One cuLaunchKernel of a zero-cycle kernel.
    Launch,
    /// One cuMemAlloc + cuMemFree pair of 1 MiB.
    Alloc,
}

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[arg(value_enum)]
    pub what: BenchWhat,
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub iters: u64,
}

//! The simulated driver's process state: the opened node and this process's slot (set up by
//! `cuInit`), and the objects the API hands out as opaque handles (contexts, streams, events,
//! allocations, …) behind one mutex. Handles are ids dressed as pointers, so a stale or
//! foreign handle is an unknown id, never a dangling pointer. As on the real driver, a freed
//! handle's id and a freed device address range are handed out again (most recently freed
//! first), so a stale handle or address may name a newer object.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, OnceLock};

use gpuslice_cuda_ffi::*;
use gpuslice_sim_core::{Effect, NodeError, SimDevice, SimNode, Slot};

use crate::guard::CuResult;

/// Version `cuDriverGetVersion` reports (CUDA 12.4).
pub const DRIVER_VERSION: i32 = 12040;
/// Granularity of `cuMemCreate` / `cuMemAddressReserve` (2 MiB, as on real GPUs).
pub const VMM_GRANULARITY: u64 = 2 << 20;
/// Launches a stream may have queued before `cuLaunchKernel` blocks, like the real driver's
/// bounded push buffer.
pub const MAX_PENDING_LAUNCHES: usize = 1024;

const HANDLE_BASE: u64 = 0x5100_0000_0000;
const VA_BASE: u64 = 0x7f80_0000_0000;

/// The one driver of this process.
pub struct Driver {
    pub node: SimNode,
    pub slot: Slot,
    /// Host device index of each visible ordinal.
    pub ordinals: Vec<usize>,
    objects: Mutex<Objects>,
}

static DRIVER: OnceLock<Result<Driver, CUresult>> = OnceLock::new();

/// `cuInit`: opens the node once per process.
pub fn init() -> CuResult<&'static Driver> {
    DRIVER.get_or_init(open).as_ref().map_err(|e| *e)
}

/// The driver, or `CUDA_ERROR_NOT_INITIALIZED` before a successful `cuInit`.
pub fn driver() -> CuResult<&'static Driver> {
    match DRIVER.get() {
        Some(Ok(d)) => Ok(d),
        Some(Err(_)) | None => Err(CUDA_ERROR_NOT_INITIALIZED),
    }
}

fn open() -> Result<Driver, CUresult> {
    let fail = |e: &dyn std::fmt::Display, code: CUresult| {
        eprintln!("gpuslice simulated libcuda: {e}");
        code
    };
    let node = SimNode::open_from_env().map_err(|e| match &e {
        NodeError::State(_) => fail(&e, CUDA_ERROR_OPERATING_SYSTEM),
        _ => fail(&e, CUDA_ERROR_NO_DEVICE),
    })?;
    let ordinals: Vec<usize> = node.visible().iter().map(|d| d.index as usize).collect();
    if ordinals.is_empty() {
        return Err(CUDA_ERROR_NO_DEVICE);
    }
    let (pid, ns) = gpuslice_sim_core::procs::current_process();
    let slot = node
        .state()
        .claim_slot(pid, ns)
        .map_err(|e| fail(&e, CUDA_ERROR_OPERATING_SYSTEM))?;
    let objects = Objects::new(ordinals.len());
    Ok(Driver {
        node,
        slot,
        ordinals,
        objects: Mutex::new(objects),
    })
}

impl Driver {
    /// The object tables (poison is ignored: a panicking export left them consistent enough,
    /// and refusing every later call would be worse).
    pub fn objects(&self) -> MutexGuard<'_, Objects> {
        self.objects.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Checks a device ordinal.
    pub fn ordinal(&self, dev: CUdevice) -> CuResult<usize> {
        usize::try_from(dev)
            .ok()
            .filter(|d| *d < self.ordinals.len())
            .ok_or(CUDA_ERROR_INVALID_DEVICE)
    }

    /// The simulated device behind ordinal `ord` (checked by [`Driver::ordinal`]).
    pub fn device(&self, ord: usize) -> &SimDevice {
        &self.node.devices()[self.ordinals[ord]]
    }

    /// The error new contexts and memory on ordinal `ord` fail with while an XID is in effect
    /// on its GPU (`gpuslice_sim_core::faults`): off the bus (XID 79), `CUDA_ERROR_UNKNOWN`;
    /// uncorrectable ECC (XIDs 48, 94, 95), `CUDA_ERROR_ECC_UNCORRECTABLE`. Contexts that
    /// were already on the GPU are poisoned instead ([`Objects::check_context`]).
    pub fn check_fault(&self, ord: usize) -> CuResult {
        match self.node.effect(self.ordinals[ord]) {
            Some(Effect::Lost) => Err(CUDA_ERROR_UNKNOWN),
            Some(Effect::Ecc) => Err(CUDA_ERROR_ECC_UNCORRECTABLE),
            _ => Ok(()),
        }
    }

    /// Charges `bytes` on ordinal `ord` node-wide: `CUDA_ERROR_OUT_OF_MEMORY` past capacity
    /// (the memory the driver reserves is never allocated), the fault's error on a faulted
    /// GPU.
    pub fn charge(&self, ord: usize, bytes: u64) -> CuResult {
        self.check_fault(ord)?;
        let host = self.ordinals[ord];
        let capacity = self.device(ord).allocatable();
        match self.node.state().charge(&self.slot, host, bytes, capacity) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(CUDA_ERROR_OUT_OF_MEMORY),
            Err(e) => {
                eprintln!("gpuslice simulated libcuda: {e}");
                Err(CUDA_ERROR_UNKNOWN)
            }
        }
    }

    /// Gives back `bytes` on ordinal `ord`.
    pub fn uncharge(&self, ord: usize, bytes: u64) {
        self.node
            .state()
            .uncharge(&self.slot, self.ordinals[ord], bytes);
    }
}

/// Makes a handle of type `T` from an object id.
pub fn handle<T>(id: u64) -> *mut T {
    (HANDLE_BASE + id * 16) as usize as *mut T
}

/// The object id of a handle; 0 (no object) for anything not made by [`handle`].
pub fn id_of<T>(h: *mut T) -> u64 {
    let v = h as usize as u64;
    if v < HANDLE_BASE || !(v - HANDLE_BASE).is_multiple_of(16) {
        0
    } else {
        (v - HANDLE_BASE) / 16
    }
}

/// A context on a thread's stack: its id and its [`Context::serial`], so that an entry left
/// behind by a destroyed context never names a later context that got the same id.
pub type StackEntry = (u64, u64);

thread_local! {
    /// This thread's context stack; the top is the current context.
    static CTX_STACK: RefCell<Vec<StackEntry>> = const { RefCell::new(Vec::new()) };
}

/// The calling thread's current context id, if any (possibly of a destroyed context).
pub fn current_ctx_id() -> Option<u64> {
    current_entry().map(|(id, _)| id)
}

/// The calling thread's current context entry, if any.
pub fn current_entry() -> Option<StackEntry> {
    CTX_STACK.with(|s| s.borrow().last().copied())
}

/// Replaces the current context (`None` pops it), as `cuCtxSetCurrent`.
pub fn set_current(ctx: Option<StackEntry>) {
    CTX_STACK.with(|s| {
        let mut s = s.borrow_mut();
        s.pop();
        if let Some(c) = ctx {
            s.push(c);
        }
    });
}

/// Pushes a context, as `cuCtxPushCurrent`.
pub fn push_current(ctx: StackEntry) {
    CTX_STACK.with(|s| s.borrow_mut().push(ctx));
}

/// Pops the current context, as `cuCtxPopCurrent`.
pub fn pop_current() -> Option<StackEntry> {
    CTX_STACK.with(|s| s.borrow_mut().pop())
}

/// Default device malloc heap of a context (8 MiB, as on real GPUs); part of a context's
/// footprint, so only what `cuCtxSetLimit` adds above it is charged.
pub const DEFAULT_MALLOC_HEAP: u64 = 8 << 20;

/// A context.
#[derive(Debug)]
pub struct Context {
    pub ordinal: usize,
    pub default_stream: u64,
    /// `cuCtxSetLimit` values by `CUlimit` (0 to 6).
    pub limits: [u64; 7],
    /// Bytes of the malloc heap charged above [`DEFAULT_MALLOC_HEAP`].
    pub heap_charge: u64,
    /// The context's own device memory, charged at creation.
    pub overhead: u64,
    /// Never the same for two contexts of the process, unlike the id, which is reused.
    pub serial: u64,
}

/// What a context saw of its GPU's XIDs: the GPU's XID count when it was created, and once an
/// XID that kills contexts came after that, the sticky error every later call on it returns
/// (never reset: a real driver's context stays unusable after such an error until the
/// process ends, and a GPU reset does not revive it).
#[derive(Debug)]
pub struct Sticky {
    pub seen: usize,
    pub error: OnceLock<CUresult>,
}

/// A device's primary context bookkeeping.
#[derive(Debug, Default, Clone)]
pub struct Primary {
    pub ctx: Option<u64>,
    pub refs: u32,
    pub flags: u32,
}

/// A kernel function of a loaded module.
#[derive(Debug)]
pub struct Function {
    pub module: u64,
    /// The block shape set by `cuFuncSetBlockShape`, for the legacy launches (`cuLaunch`,
    /// `cuLaunchGrid`, `cuLaunchGridAsync`); `None` until set, and again after a
    /// `cuLaunchKernel` of the function, which the driver documents as invalidating it.
    pub block: Option<[u32; 3]>,
    /// The parameter buffer built by `cuParamSetSize`/`cuParamSeti`/`cuParamSetv`.
    pub params: Vec<u8>,
}

impl Function {
    pub fn new(module: u64) -> Function {
        Function {
            module,
            block: None,
            params: Vec::new(),
        }
    }
}

/// A stream: when its last queued kernel ends, and the ends of queued kernels.
#[derive(Debug)]
pub struct Stream {
    pub ctx: u64,
    pub tail: u64,
    pub pending: VecDeque<u64>,
    /// The graph work is captured into while `cuStreamBeginCapture` is in effect.
    pub capture: Option<u64>,
}

/// An event and, once recorded, the time the device reaches it.
#[derive(Debug)]
pub struct Event {
    pub ctx: u64,
    pub flags: u32,
    pub stamp: Option<u64>,
}

/// What a device allocation came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocKind {
    Linear,
    Managed,
    /// Stream-ordered, from pool id.
    Pool(u64),
}

/// Memory charged to this process and made in a context (freed with it, except
/// stream-ordered memory, see [`Objects::destroy_context`]).
#[derive(Debug, Clone, Copy)]
pub struct Charge {
    pub ctx: u64,
    pub ordinal: usize,
    pub bytes: u64,
}

/// A linear allocation.
#[derive(Debug, Clone, Copy)]
pub struct Allocation {
    pub charge: Charge,
    pub kind: AllocKind,
}

/// A memory pool: freed memory stays reserved (charged) up to the release threshold and is
/// reused by the pool's next allocations, as the real driver keeps it across
/// synchronisations (here the excess is released when the free is issued).
#[derive(Debug)]
pub struct Pool {
    pub ordinal: usize,
    /// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD` (0 by default).
    pub threshold: u64,
    /// Bytes of live allocations from the pool.
    pub used: u64,
    /// Bytes freed into the pool and kept reserved (still charged).
    pub cached: u64,
}

impl Pool {
    pub fn new(ordinal: usize) -> Pool {
        Pool {
            ordinal,
            threshold: 0,
            used: 0,
            cached: 0,
        }
    }
}

/// A physical allocation of `cuMemCreate`.
#[derive(Debug)]
pub struct Physical {
    pub ordinal: usize,
    pub bytes: u64,
    pub released: bool,
    pub maps: u32,
}

/// A mapping of a physical allocation into a reserved range.
#[derive(Debug, Clone, Copy)]
pub struct Mapping {
    pub handle: u64,
    pub size: u64,
}

/// A graph node.
#[derive(Debug, Clone)]
pub enum GraphNode {
    /// Memory allocation of `bytes` on `ordinal` at `dptr`.
    Alloc {
        ordinal: usize,
        bytes: u64,
        dptr: u64,
    },
    /// Frees the graph memory at `dptr` (checked when added).
    Free(u64),
    /// A child graph: a copy of its nodes, made when the node is added.
    Child(Vec<GraphNode>),
    /// A node that holds no memory (empty, kernel, captured launches).
    Other,
}

impl GraphNode {
    /// The `(ordinal, bytes, dptr)` of every allocation node here, child graphs included.
    pub fn allocations(&self, out: &mut Vec<(usize, u64, u64)>) {
        match self {
            GraphNode::Alloc {
                ordinal,
                bytes,
                dptr,
            } => out.push((*ordinal, *bytes, *dptr)),
            GraphNode::Child(nodes) => nodes.iter().for_each(|n| n.allocations(out)),
            GraphNode::Free(_) | GraphNode::Other => {}
        }
    }

    /// The addresses every free node here frees, child graphs included.
    pub fn frees(&self, out: &mut Vec<u64>) {
        match self {
            GraphNode::Free(dptr) => out.push(*dptr),
            GraphNode::Child(nodes) => nodes.iter().for_each(|n| n.frees(out)),
            GraphNode::Alloc { .. } | GraphNode::Other => {}
        }
    }

    /// Whether this node (or a child graph in it) allocates `dptr`.
    pub fn allocates(&self, dptr: u64) -> bool {
        match self {
            GraphNode::Alloc { dptr: a, .. } => *a == dptr,
            GraphNode::Child(nodes) => nodes.iter().any(|n| n.allocates(dptr)),
            GraphNode::Free(_) | GraphNode::Other => false,
        }
    }
}

/// A graph.
#[derive(Debug, Default)]
pub struct Graph {
    pub nodes: Vec<(u64, GraphNode)>,
}

/// A device's graph memory pool of this process: the graph memory it backs and what it keeps
/// cached. As on a real driver (CUDA Programming Guide, graph memory nodes, "physical memory
/// footprint"), destroying an executable graph, or freeing an allocation that outlived its
/// executable, returns the memory to this pool, not to the device: it stays charged to the
/// process and is reused by later instantiations until `cuDeviceGraphMemTrim`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct GraphPool {
    /// Bytes held by executable graphs and by allocations that outlived theirs
    /// (`CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT`).
    pub used: u64,
    /// Bytes charged to the process for graph memory: `used` and the cache
    /// (`CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`).
    pub reserved: u64,
    /// High-water marks of `used` and `reserved` since their last reset.
    pub used_high: u64,
    pub reserved_high: u64,
}

impl GraphPool {
    /// Bytes kept for reuse and held by nothing.
    pub fn cached(&self) -> u64 {
        self.reserved.saturating_sub(self.used)
    }

    /// Bytes the pool must grow by (be charged) to back `bytes` more: what its cache does not
    /// cover.
    pub fn growth_for(&self, bytes: u64) -> u64 {
        bytes.saturating_sub(self.cached())
    }

    /// Backs `bytes` more, the cache first; `grown` ([`GraphPool::growth_for`]) was charged.
    pub fn take(&mut self, bytes: u64, grown: u64) {
        self.reserved = self.reserved.saturating_add(grown);
        self.used = self.used.saturating_add(bytes).min(self.reserved);
        self.used_high = self.used_high.max(self.used);
        self.reserved_high = self.reserved_high.max(self.reserved);
    }

    /// Undoes a [`GraphPool::take`] of `bytes` that grew the pool by `grown` (a refused
    /// instantiation): returns the bytes the caller uncharges.
    pub fn untake(&mut self, bytes: u64, grown: u64) -> u64 {
        self.used = self.used.saturating_sub(bytes);
        let grown = grown.min(self.reserved - self.used);
        self.reserved -= grown;
        grown
    }

    /// `bytes` of graph memory are held by nothing any more: they stay reserved, cached.
    pub fn give(&mut self, bytes: u64) {
        self.used = self.used.saturating_sub(bytes);
    }

    /// `cuDeviceGraphMemTrim`: releases the cache; returns the bytes the caller uncharges.
    pub fn trim(&mut self) -> u64 {
        let released = self.cached();
        self.reserved = self.used;
        released
    }
}

/// An instantiated graph and the memory it holds.
#[derive(Debug)]
pub struct Exec {
    pub charges: Vec<(usize, u64)>,
    /// Allocations with no free node in the graph: `(ordinal, bytes, dptr)`.
    pub escapes: Vec<(usize, u64, u64)>,
    /// Those of `escapes` a launch allocated and nothing freed yet.
    pub live: Vec<(usize, u64, u64)>,
}

/// Every object the process holds.
#[derive(Debug)]
pub struct Objects {
    next_id: u64,
    next_va: u64,
    next_serial: u64,
    /// Ids of destroyed objects, handed out again last freed first ([`Objects::new_id`]).
    recycled_ids: Vec<u64>,
    /// Freed device address ranges `(start, length)`, reused last freed first
    /// ([`Objects::new_va`]).
    recycled_vas: Vec<(u64, u64)>,
    pub contexts: HashMap<u64, Context>,
    pub primary: Vec<Primary>,
    pub streams: HashMap<u64, Stream>,
    pub events: HashMap<u64, Event>,
    /// Module id → context id.
    pub modules: HashMap<u64, u64>,
    /// Function id → its module and legacy launch state.
    pub functions: HashMap<u64, Function>,
    pub allocations: HashMap<u64, Allocation>,
    pub pools: HashMap<u64, Pool>,
    pub default_pools: Vec<Option<u64>>,
    pub physical: HashMap<u64, Physical>,
    /// Reserved VA ranges: start → size.
    pub reservations: BTreeMap<u64, u64>,
    /// Mapped ranges: start → mapping.
    pub mappings: BTreeMap<u64, Mapping>,
    pub arrays: HashMap<u64, Charge>,
    pub mipmaps: HashMap<u64, Charge>,
    pub graphs: HashMap<u64, Graph>,
    pub execs: HashMap<u64, Exec>,
    /// Graph memory that outlived its executable graph (allocated by a launch, no free node
    /// ran, the executable destroyed): dptr → (ordinal, bytes), until freed.
    pub graph_live: HashMap<u64, (usize, u64)>,
    /// Each ordinal's graph memory pool.
    pub graph_pools: Vec<GraphPool>,
    /// Context id → what it saw of its GPU's XIDs ([`Objects::check_context`]).
    pub sticky: HashMap<u64, Sticky>,
}

impl Objects {
    /// Frees graph memory at `dptr` outside a graph (`cuMemFree`, `cuMemFreeAsync`): the
    /// allocation of a live executable's launch, or one that outlived its executable (its
    /// bytes go back to the device's graph pool, cached and still charged, see [`GraphPool`]).
    /// False when `dptr` is no live graph memory.
    pub fn free_graph_memory(&mut self, dptr: u64) -> bool {
        if let Some((ord, bytes)) = self.graph_live.remove(&dptr) {
            if let Some(p) = self.graph_pools.get_mut(ord) {
                p.give(bytes);
            }
            return true;
        }
        for e in self.execs.values_mut() {
            if let Some(i) = e.live.iter().position(|(_, _, p)| *p == dptr) {
                // The executable keeps its charge: its next launch allocates again.
                e.live.remove(i);
                return true;
            }
        }
        false
    }

    fn new(devices: usize) -> Objects {
        Objects {
            next_id: 1,
            next_va: VA_BASE,
            next_serial: 1,
            recycled_ids: Vec::new(),
            recycled_vas: Vec::new(),
            contexts: HashMap::new(),
            primary: vec![Primary::default(); devices],
            streams: HashMap::new(),
            events: HashMap::new(),
            modules: HashMap::new(),
            functions: HashMap::new(),
            allocations: HashMap::new(),
            pools: HashMap::new(),
            default_pools: vec![None; devices],
            physical: HashMap::new(),
            reservations: BTreeMap::new(),
            mappings: BTreeMap::new(),
            arrays: HashMap::new(),
            mipmaps: HashMap::new(),
            graphs: HashMap::new(),
            execs: HashMap::new(),
            graph_live: HashMap::new(),
            graph_pools: vec![GraphPool::default(); devices],
            sticky: HashMap::new(),
        }
    }

    /// An object id: the one freed last if any is free ([`Objects::free_id`]), as the real
    /// driver hands a destroyed object's handle out again at once; else a new one.
    pub fn new_id(&mut self) -> u64 {
        if let Some(id) = self.recycled_ids.pop() {
            return id;
        }
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Gives back the id of a destroyed object, for [`Objects::new_id`] to hand out again.
    /// Called once per destroyed object, when nothing of the simulation refers to it any
    /// more.
    pub fn free_id(&mut self, id: u64) {
        debug_assert!(!self.recycled_ids.contains(&id), "id {id} freed twice");
        self.recycled_ids.push(id);
    }

    /// Gives back the ids of destroyed objects ([`Objects::free_id`]).
    pub fn free_ids(&mut self, ids: impl IntoIterator<Item = u64>) {
        for id in ids {
            self.free_id(id);
        }
    }

    /// A device address range of `bytes`: 512-byte aligned, 2 MiB aligned from 2 MiB on (like
    /// the real allocator), at least `alignment` aligned. Like the real driver, a freed range
    /// ([`Objects::free_va`]) is handed out again: the last freed one that fits, the rest of
    /// it staying free; new addresses only when none fits.
    pub fn new_va(&mut self, bytes: u64, alignment: u64) -> CuResult<u64> {
        let align = alignment.max(if bytes >= VMM_GRANULARITY {
            VMM_GRANULARITY
        } else {
            512
        });
        if !align.is_power_of_two() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let len = bytes.max(1);
        let fit = |&(start, size): &(u64, u64)| {
            let at = start.checked_add(align - 1)? & !(align - 1);
            let end = at.checked_add(len)?;
            (end <= start + size).then_some((at, end))
        };
        if let Some((i, (at, end))) = self
            .recycled_vas
            .iter()
            .enumerate()
            .rev()
            .find_map(|(i, r)| fit(r).map(|f| (i, f)))
        {
            let (start, size) = self.recycled_vas[i];
            let rest = [(start, at - start), (end, start + size - end)];
            // The range taken is replaced by what is left of it before and after.
            self.recycled_vas
                .splice(i..=i, rest.into_iter().filter(|(_, l)| *l > 0))
                .for_each(drop);
            return Ok(at);
        }
        let start = self
            .next_va
            .checked_add(align - 1)
            .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?
            & !(align - 1);
        let end = start.checked_add(len).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        self.next_va = end;
        Ok(start)
    }

    /// Gives back the range [`Objects::new_va`] handed out at `start` for `bytes`.
    pub fn free_va(&mut self, start: u64, bytes: u64) {
        self.recycled_vas.push((start, bytes.max(1)));
    }

    /// The calling thread's current context: `CUDA_ERROR_INVALID_CONTEXT` when there is none
    /// or it was destroyed, its sticky error when it is poisoned ([`Objects::check_context`]).
    pub fn current(&self) -> CuResult<u64> {
        let c = self.live_current().ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        self.check_context(c)?;
        Ok(c)
    }

    /// The calling thread's current context if it is live: not destroyed, nor destroyed and
    /// its id given to a later context.
    fn live_current(&self) -> Option<u64> {
        current_entry()
            .filter(|(c, serial)| self.contexts.get(c).is_some_and(|x| x.serial == *serial))
            .map(|(c, _)| c)
    }

    /// The stack entry of live context `ctx`: `CUDA_ERROR_INVALID_CONTEXT` when there is none.
    pub fn entry(&self, ctx: u64) -> CuResult<StackEntry> {
        self.contexts
            .get(&ctx)
            .map(|c| (ctx, c.serial))
            .ok_or(CUDA_ERROR_INVALID_CONTEXT)
    }

    /// The sticky error of context `ctx`, as a real driver keeps one after an XID 79 or an
    /// uncorrectable ECC error on its GPU: once such an XID was injected after the context
    /// was created (in effect or already cleared), every call on the context fails with it,
    /// for good. The error is fixed when first found: `CUDA_ERROR_ECC_UNCORRECTABLE` for
    /// ECC; off the bus, `CUDA_ERROR_LAUNCH_FAILED` when the context had put work on the
    /// device (its kernels failed), `CUDA_ERROR_UNKNOWN` when not.
    pub fn check_context(&self, ctx: u64) -> CuResult {
        let (Some(s), Some(c)) = (self.sticky.get(&ctx), self.contexts.get(&ctx)) else {
            return Ok(());
        };
        if let Some(e) = s.error.get() {
            return Err(*e);
        }
        let d = driver()?;
        let error = match d.node.worst_since(d.ordinals[c.ordinal], s.seen) {
            Some(Effect::Ecc) => CUDA_ERROR_ECC_UNCORRECTABLE,
            Some(Effect::Lost) => {
                let worked = self.streams.values().any(|st| st.ctx == ctx && st.tail > 0);
                if worked {
                    CUDA_ERROR_LAUNCH_FAILED
                } else {
                    CUDA_ERROR_UNKNOWN
                }
            }
            Some(Effect::NeedsReset | Effect::EventOnly) | None => return Ok(()),
        };
        Err(*s.error.get_or_init(|| error))
    }

    /// The sticky error of the context owning the allocation at `dptr`, or where no
    /// allocation of this process starts there, of the current context if any.
    pub fn check_pointer(&self, dptr: u64) -> CuResult {
        match self.allocations.get(&dptr) {
            Some(a) => self.check_context(a.charge.ctx),
            None => self.check_current(),
        }
    }

    /// The sticky error of the current context, if there is one and it is poisoned.
    pub fn check_current(&self) -> CuResult {
        self.live_current()
            .map_or(Ok(()), |c| self.check_context(c))
    }

    /// Ordinal of the current context's device.
    pub fn current_ordinal(&self) -> CuResult<usize> {
        let c = self.current()?;
        Ok(self.contexts[&c].ordinal)
    }

    /// Creates a context on `ordinal` with its default stream (context flags only tune host
    /// scheduling, which this simulation does not model). The context's own device memory
    /// (the device's `context_memory`) is charged to this process first, as the real driver
    /// does: `CUDA_ERROR_OUT_OF_MEMORY` when the device cannot hold it. It is counted in the
    /// process's NVML figure and the device's free memory, and no allocation returns it.
    pub fn create_context(&mut self, drv: &Driver, ordinal: usize) -> CuResult<u64> {
        // Counted before the check: an XID the check does not see yet is after the context.
        let seen = drv.node.xid_count(drv.ordinals[ordinal]);
        drv.check_fault(ordinal)?;
        let overhead = drv.device(ordinal).context_memory;
        if overhead > 0 {
            drv.charge(ordinal, overhead)?;
        }
        drv.node
            .state()
            .count_context(&drv.slot, drv.ordinals[ordinal], true);
        let ctx = self.new_id();
        let default_stream = self.new_id();
        let serial = self.next_serial;
        self.next_serial += 1;
        self.streams.insert(
            default_stream,
            Stream {
                ctx,
                tail: 0,
                pending: VecDeque::new(),
                capture: None,
            },
        );
        let mut limits = [0; 7];
        limits[CU_LIMIT_STACK_SIZE as usize] = 1024;
        limits[CU_LIMIT_PRINTF_FIFO_SIZE as usize] = 1 << 20;
        limits[CU_LIMIT_MALLOC_HEAP_SIZE as usize] = DEFAULT_MALLOC_HEAP;
        self.contexts.insert(
            ctx,
            Context {
                ordinal,
                default_stream,
                limits,
                heap_charge: 0,
                overhead,
                serial,
            },
        );
        // Only live contexts are looked up: the entries of destroyed ones go here.
        let live = &self.contexts;
        self.sticky.retain(|c, _| live.contains_key(c));
        self.sticky.insert(
            ctx,
            Sticky {
                seen,
                error: OnceLock::new(),
            },
        );
        Ok(ctx)
    }

    /// The stream a handle names (its context's sticky error when that is poisoned): a
    /// created stream, or for `0`, `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD` the current
    /// context's default stream (this simulation gives legacy and per-thread default streams
    /// the same queue; ordering on the device is FIFO either way).
    pub fn stream(&self, h: CUstream) -> CuResult<u64> {
        if h.is_null() || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD {
            let c = self.current()?;
            return Ok(self.contexts[&c].default_stream);
        }
        let id = id_of(h);
        let s = self.streams.get(&id).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        self.check_context(s.ctx)?;
        Ok(id)
    }

    /// Ordinal of the device a stream's context runs on.
    pub fn stream_ordinal(&self, stream: u64) -> CuResult<usize> {
        let ctx = self
            .streams
            .get(&stream)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?
            .ctx;
        self.contexts
            .get(&ctx)
            .map(|c| c.ordinal)
            .ok_or(CUDA_ERROR_INVALID_CONTEXT)
    }

    /// Destroys context `ctx` and everything it owns, giving its memory back. As the real
    /// driver documents for `cuCtxDestroy`, memory of `cuMemCreate`, `cuMemAllocAsync` and
    /// `cuMemAllocFromPoolAsync` is associated with no context and stays allocated (so do
    /// pools, executable graphs and graph memory, which no context owns here either).
    pub fn destroy_context(&mut self, drv: &Driver, ctx: u64) {
        let Some(c) = self.contexts.remove(&ctx) else {
            return;
        };
        if c.heap_charge + c.overhead > 0 {
            drv.uncharge(c.ordinal, c.heap_charge + c.overhead);
        }
        let owned = |charge: &Charge| charge.ctx == ctx;
        let dies = |a: &Allocation| owned(&a.charge) && !matches!(a.kind, AllocKind::Pool(_));
        let freed: Vec<(u64, u64)> = self
            .allocations
            .iter()
            .filter(|(_, a)| dies(a))
            .map(|(va, a)| (*va, a.charge.bytes))
            .collect();
        for (va, _) in &freed {
            if let Some(a) = self.allocations.remove(va) {
                drv.uncharge(a.charge.ordinal, a.charge.bytes);
            }
        }
        for (va, bytes) in freed {
            self.free_va(va, bytes);
        }
        // The context's id goes last, to be handed out first: a context made next gets it back.
        let mut ids = Vec::new();
        for map in [&mut self.arrays, &mut self.mipmaps] {
            for (id, ch) in map.iter().filter(|(_, ch)| owned(ch)) {
                drv.uncharge(ch.ordinal, ch.bytes);
                ids.push(*id);
            }
            map.retain(|_, ch| !owned(ch));
        }
        ids.extend(
            self.streams
                .iter()
                .filter(|(_, s)| s.ctx == ctx)
                .map(|(id, _)| *id),
        );
        self.streams.retain(|_, s| s.ctx != ctx);
        ids.extend(
            self.events
                .iter()
                .filter(|(_, e)| e.ctx == ctx)
                .map(|(id, _)| *id),
        );
        self.events.retain(|_, e| e.ctx != ctx);
        let modules: Vec<u64> = self
            .modules
            .iter()
            .filter(|(_, c)| **c == ctx)
            .map(|(m, _)| *m)
            .collect();
        self.modules.retain(|_, c| *c != ctx);
        ids.extend(
            self.functions
                .iter()
                .filter(|(_, f)| modules.contains(&f.module))
                .map(|(id, _)| *id),
        );
        self.functions.retain(|_, f| !modules.contains(&f.module));
        ids.extend(modules);
        ids.push(ctx);
        self.free_ids(ids);
        drv.node
            .state()
            .count_context(&drv.slot, drv.ordinals[c.ordinal], false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Addresses `new_va` may hand out for `bytes`: 512-byte aligned, 2 MiB from 2 MiB on.
    fn aligned(va: u64, bytes: u64) -> bool {
        let align = if bytes >= VMM_GRANULARITY {
            VMM_GRANULARITY
        } else {
            512
        };
        va.is_multiple_of(align)
    }

    #[test]
    fn graph_memory_is_cached_by_its_pool_until_trimmed() {
        let mut p = GraphPool::default();
        assert_eq!(p.growth_for(300), 300, "an empty pool grows by all of it");
        p.take(300, 300);
        // The executable graph is destroyed: its bytes stay reserved, cached.
        p.give(300);
        assert_eq!((p.used, p.reserved, p.cached()), (0, 300, 300));
        // A later graph reuses the cache before the pool grows.
        assert_eq!(p.growth_for(200), 0);
        p.take(200, 0);
        assert_eq!((p.used, p.reserved, p.cached()), (200, 300, 100));
        assert_eq!(p.growth_for(250), 150);
        p.take(250, 150);
        assert_eq!((p.used, p.reserved, p.cached()), (450, 450, 0));
        assert_eq!((p.used_high, p.reserved_high), (450, 450));
        // A refused instantiation gives back only what it grew the pool by.
        assert_eq!(p.untake(250, 150), 150);
        assert_eq!((p.used, p.reserved), (200, 300));
        // A trim releases the cache, never what graphs hold.
        assert_eq!(p.trim(), 100);
        assert_eq!((p.used, p.reserved, p.cached()), (200, 200, 0));
        assert_eq!(p.trim(), 0);
        p.give(200);
        assert_eq!(p.trim(), 200);
        assert_eq!((p.used, p.reserved), (0, 0));
        assert_eq!((p.used_high, p.reserved_high), (450, 450), "marks stay");
    }

    #[test]
    fn freed_ids_are_handed_out_again_last_freed_first() {
        let mut o = Objects::new(1);
        let (a, b, c) = (o.new_id(), o.new_id(), o.new_id());
        o.free_id(a);
        o.free_id(c);
        assert_eq!(o.new_id(), c);
        assert_eq!(o.new_id(), a);
        let d = o.new_id();
        assert!(![a, b, c].contains(&d), "a live id handed out twice: {d}");
    }

    #[test]
    fn a_freed_range_is_handed_out_again() {
        let mut o = Objects::new(1);
        let a = o.new_va(1 << 20, 0).unwrap();
        let b = o.new_va(1 << 20, 0).unwrap();
        o.free_va(a, 1 << 20);
        assert_eq!(o.new_va(1 << 20, 0).unwrap(), a, "same size, same address");
        o.free_va(b, 1 << 20);
        o.free_va(a, 1 << 20);
        assert_eq!(o.new_va(1000, 0).unwrap(), a, "last freed first");
        // The rest of a's range stays free: the next small allocation lands in it, aligned.
        assert_eq!(o.new_va(100, 0).unwrap(), a + 1024);
        assert_eq!(
            o.new_va(1 << 20, 0).unwrap(),
            b,
            "a's rest is too small now"
        );
    }

    #[test]
    fn reuse_keeps_the_alignment() {
        let mut o = Objects::new(1);
        let small = o.new_va(4096, 0).unwrap();
        let big = o.new_va(6 << 20, 0).unwrap();
        o.free_va(big, 6 << 20);
        o.free_va(small, 4096);
        // 2 MiB does not fit the small range; it fits the big one at its 2 MiB aligned start.
        let two = o.new_va(2 << 20, 0).unwrap();
        assert_eq!(two, big);
        // A 4 MiB-aligned request takes the first 4 MiB boundary left in the big range.
        let four = o.new_va(2 << 20, 4 << 20).unwrap();
        assert!(
            four.is_multiple_of(4 << 20) && four >= big + (2 << 20),
            "{four:#x}"
        );
        assert!(four + (2 << 20) <= big + (6 << 20));
    }

    #[test]
    fn live_ranges_never_overlap_under_churn() {
        let mut o = Objects::new(1);
        let mut live: Vec<(u64, u64)> = Vec::new();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let sizes = [1, 512, 1000, 4096, 1 << 20, 2 << 20, 3 << 20, 8 << 20];
        let mut reused = 0;
        let mut seen = std::collections::HashSet::new();
        for _ in 0..5000 {
            if live.is_empty() || next(3) > 0 {
                let bytes = sizes[next(sizes.len() as u64) as usize];
                let va = o.new_va(bytes, 0).unwrap();
                assert!(aligned(va, bytes), "{va:#x} for {bytes}");
                for (s, l) in &live {
                    assert!(
                        va + bytes <= *s || s + l <= va,
                        "{va:#x}+{bytes} overlaps {s:#x}+{l}"
                    );
                }
                if !seen.insert(va) {
                    reused += 1;
                }
                live.push((va, bytes));
            } else {
                let (va, bytes) = live.swap_remove(next(live.len() as u64) as usize);
                o.free_va(va, bytes);
            }
            if live.len() > 64 {
                let (va, bytes) = live.swap_remove(0);
                o.free_va(va, bytes);
            }
        }
        assert!(reused > 100, "addresses were reused only {reused} times");
    }
}

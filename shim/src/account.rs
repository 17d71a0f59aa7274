//! Memory accounting of this process: every successful allocation is charged to the
//! slice's shared usage file before the driver is asked (reserve, then call, then record),
//! and remembered by its handle so the matching free, or the destruction of the context it
//! dies with, gives exactly that much back.

use std::collections::HashMap;

use gpuslice_cuda_ffi::*;
use gpuslice_slice::usage::UsageError;

use crate::forksafe::ForkSafe;
use crate::log::{info, warning};
use crate::state::{self, Devices, Slice};

/// What a handle names; keys of different kinds never collide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A device address (linear, pitched, managed, async and pool allocations).
    Ptr,
    /// A `cuMemCreate` handle.
    Vmm,
    Array,
    Mipmap,
    /// An instantiated graph holding graph-memory nodes.
    GraphExec,
    /// A context's device malloc heap grown by `cuCtxSetLimit` (keyed by the context).
    Heap,
    /// A context's own device memory, measured at its creation (keyed by the context).
    Context,
}

impl Kind {
    /// How long the driver keeps an allocation of this kind when nothing says otherwise.
    /// `cuCtxDestroy` "will not destroy memory allocations by cuMemCreate(),
    /// cuMemAllocAsync() and cuMemAllocFromPoolAsync(). These memory allocations are not
    /// associated with any CUDA context" (CUDA driver API); an executable graph, and the
    /// graph memory it holds, is not a context's either.
    fn lifetime(self) -> Lifetime {
        match self {
            Kind::Vmm | Kind::GraphExec => Lifetime::UntilFreed,
            Kind::Ptr | Kind::Array | Kind::Mipmap | Kind::Heap | Kind::Context => {
                Lifetime::Context
            }
        }
    }
}

/// Whether the driver frees an allocation when the context it was made in is destroyed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    /// Freed with its context (linear, pitched and managed memory, arrays, a context's
    /// malloc heap and own memory).
    Context,
    /// Associated with no context: lives until it is freed (VMM handles, stream-ordered
    /// and pool memory, graph memory and executable graphs).
    UntilFreed,
}

/// One charged allocation.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    /// Limits index of its device.
    pub dev: usize,
    pub bytes: u64,
    ctx: usize,
    /// The memory pool it came from (0: none); its memory goes back to that pool.
    pub pool: usize,
    lifetime: Lifetime,
}

impl Entry {
    /// Where it is charged.
    pub fn target(&self) -> Target {
        Target {
            idx: self.dev,
            ctx: self.ctx,
        }
    }
}

#[derive(Default)]
struct Tables {
    allocs: HashMap<(Kind, u64), Entry>,
    /// Primary context handle per CUDA device, learnt at retain.
    primary: HashMap<CUdevice, usize>,
}

static TABLES: ForkSafe<Tables> = ForkSafe::new(Tables::default);

/// Where an allocation is charged: the limits index and the context that owns it.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    pub idx: usize,
    pub ctx: usize,
}

/// The target for an allocation on CUDA device `dev`; refuses devices without limits.
pub fn target_on(devices: &Devices, dev: CUdevice) -> Result<Target, CUresult> {
    match devices.index(dev) {
        Some(idx) => Ok(Target {
            idx,
            ctx: state::current_context() as usize,
        }),
        None => {
            warning!("device {dev} has no limits entry; allocation refused");
            Err(CUDA_ERROR_OUT_OF_MEMORY)
        }
    }
}

/// The target for an allocation in the current context.
pub fn target_current(devices: &Devices) -> Result<Target, CUresult> {
    let dev = state::current_device()?;
    target_on(devices, dev)
}

/// Charges `bytes` to the slice, or refuses with `CUDA_ERROR_OUT_OF_MEMORY`. Before
/// refusing, what this process's memory pools and its graph memory pool keep reserved on the
/// device is trimmed (the driver gives it back) and the reservation is tried once more.
pub fn reserve(slice: &Slice, t: Target, bytes: u64) -> Result<(), CUresult> {
    let Some(limit) = slice.device(t.idx).map(|d| d.memory_limit) else {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    };
    let mut result = slice.usage.reserve(t.idx, bytes, limit);
    if matches!(result, Err(UsageError::OutOfMemory { .. })) && trim_caches(slice, t.idx) {
        result = slice.usage.reserve(t.idx, bytes, limit);
    }
    match result {
        Ok(()) => Ok(()),
        Err(e @ UsageError::OutOfMemory { .. }) => {
            info!("{e}");
            Err(CUDA_ERROR_OUT_OF_MEMORY)
        }
        Err(e) => {
            warning!("{e}; allocation refused");
            Err(CUDA_ERROR_OUT_OF_MEMORY)
        }
    }
}

/// Trims every cache of this process on limits device `idx` (pools, graph memory); true when
/// some charge was given back.
fn trim_caches(slice: &Slice, idx: usize) -> bool {
    let pools = crate::hooks::pools::trim_caches(slice, idx);
    let graphs = state::devices()
        .is_some_and(|devices| crate::hooks::graph::trim_cache(slice, devices, idx));
    pools || graphs
}

/// Reserves, runs the real allocation (which returns the new handle), and records it; on
/// any failure nothing stays charged.
pub fn allocate(
    slice: &Slice,
    t: Target,
    kind: Kind,
    bytes: u64,
    call: impl FnOnce() -> Result<u64, CUresult>,
) -> CUresult {
    if let Err(r) = reserve(slice, t, bytes) {
        return r;
    }
    match call() {
        Ok(key) => {
            record(kind, key, t, bytes);
            CUDA_SUCCESS
        }
        Err(r) => {
            slice.usage.release(t.idx, bytes);
            r
        }
    }
}

/// Remembers a charged allocation.
pub fn record(kind: Kind, key: u64, t: Target, bytes: u64) {
    insert(kind, key, t, bytes, 0, kind.lifetime());
}

/// Remembers a charged stream-ordered allocation at address `dptr` from memory pool `pool`
/// (0: not known), or graph memory that outlived its executable graph: memory of a pool,
/// which no context owns, so it stays charged until it is freed, whatever happens to the
/// context it was made in.
pub fn record_stream_ordered(dptr: u64, t: Target, bytes: u64, pool: usize) {
    insert(Kind::Ptr, dptr, t, bytes, pool, Lifetime::UntilFreed);
}

fn insert(kind: Kind, key: u64, t: Target, bytes: u64, pool: usize, lifetime: Lifetime) {
    let old = TABLES.lock().allocs.insert(
        (kind, key),
        Entry {
            dev: t.idx,
            bytes,
            ctx: t.ctx,
            pool,
            lifetime,
        },
    );
    if let (Some(old), Some(s)) = (old, state::slice()) {
        // The driver reused a handle we never saw freed: the old charge is stale.
        s.usage.release(old.dev, old.bytes);
    }
}

/// Removes the allocation named by `key` from the tables without giving its charge back
/// (the caller decides where the charge goes).
pub fn take(kind: Kind, key: u64) -> Option<Entry> {
    TABLES.lock().allocs.remove(&(kind, key))
}

/// The charge of the allocation named by `key`, if any.
pub fn charged(kind: Kind, key: u64) -> Option<Entry> {
    TABLES.lock().allocs.get(&(kind, key)).copied()
}

/// Frees the allocations named by `keys` through `call`. Their entries leave the table
/// before the driver is asked: once the driver has freed a handle, another thread's
/// allocation may get the same handle and record it, and that new entry must never be the
/// one taken away here (it would stay live and uncharged). While the driver is asked, the
/// charge stays in the usage file. If the driver refuses, the entries are put back (no
/// other allocation can hold a handle that is not freed). Returns the driver's result and,
/// on success, the entries whose charge the caller gives back.
pub fn free_with(
    kind: Kind,
    keys: &[u64],
    call: impl FnOnce() -> CUresult,
) -> (CUresult, Vec<Entry>) {
    let taken: Vec<(u64, Entry)> = {
        let mut t = TABLES.lock();
        keys.iter()
            .filter_map(|k| t.allocs.remove(&(kind, *k)).map(|e| (*k, e)))
            .collect()
    };
    let r = call();
    if r == CUDA_SUCCESS {
        return (r, taken.into_iter().map(|(_, e)| e).collect());
    }
    for (k, e) in taken {
        restore(kind, k, e);
    }
    (r, Vec::new())
}

/// Frees the allocation named by `key` through `call` (see [`free_with`]) and gives its
/// charge back.
pub fn free(kind: Kind, key: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    let (r, gone) = free_with(kind, &[key], call);
    release_all(&gone);
    r
}

/// Puts back an entry taken before a free the driver refused.
pub fn restore(kind: Kind, key: u64, e: Entry) {
    TABLES.lock().allocs.entry((kind, key)).or_insert(e);
}

/// Gives back the charge of entries already out of the table.
pub fn release_all(entries: &[Entry]) {
    if let Some(s) = state::slice() {
        for e in entries {
            s.usage.release(e.dev, e.bytes);
        }
    }
}

/// What dies with a context, taken out of the tables (see [`take_context`]).
#[derive(Debug, Default)]
pub struct ContextCharges(Vec<((Kind, u64), Entry)>);

impl ContextCharges {
    /// The driver destroyed the context: gives the charges back.
    pub fn release(self) {
        let gone: Vec<Entry> = self.0.into_iter().map(|(_, e)| e).collect();
        release_all(&gone);
    }

    /// The driver refused: puts the entries back (a handle of a context that still exists
    /// cannot have been handed out again).
    pub fn restore(self) {
        let mut t = TABLES.lock();
        for (k, e) in self.0 {
            t.allocs.entry(k).or_insert(e);
        }
    }
}

/// Takes out of the tables what dies with context `ctx`, before the driver is asked to
/// destroy (or reset) it: once it is destroyed, another thread's context creation may get
/// the same handle and record its memory and allocations under it, and those must never be
/// the ones given back here. While the driver is asked, the charges stay in the usage file.
/// What is associated with no context (VMM handles, pool and graph memory, executable
/// graphs: [`Lifetime::UntilFreed`]) stays, charged until freed.
pub fn take_context(ctx: usize) -> ContextCharges {
    let mut t = TABLES.lock();
    let keys: Vec<_> = t
        .allocs
        .iter()
        .filter(|(_, e)| e.ctx == ctx && e.lifetime == Lifetime::Context)
        .map(|(k, _)| *k)
        .collect();
    ContextCharges(
        keys.into_iter()
            .filter_map(|k| t.allocs.remove(&k).map(|e| (k, e)))
            .collect(),
    )
}

/// Remembers the primary context of `dev`.
pub fn set_primary(dev: CUdevice, ctx: CUcontext) {
    TABLES.lock().primary.insert(dev, ctx as usize);
}

/// The primary context of `dev`, if it was retained through the shim.
pub fn primary(dev: CUdevice) -> Option<usize> {
    TABLES.lock().primary.get(&dev).copied()
}

/// For the child after `fork`: its parent's allocations are not its own.
pub fn reset_in_child() {
    TABLES.reset_in_child();
}

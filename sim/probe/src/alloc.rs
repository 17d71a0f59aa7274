//! `alloc`: allocate fixed-size chunks through one allocation path until the driver refuses
//! (or `--max` is reached), report the total and the refusal, optionally hold the memory,
//! then free it. Each path is driven as applications drive it.

use std::cell::Cell;
use std::ffi::c_void;
use std::time::Duration;

use serde_json::json;

use gpuslice_cuda_ffi::*;

use crate::cli::{AllocArgs, Api, GraphCacheArgs, GraphCacheStep, Instantiate, MultiArgs};
use crate::cuda::{call, Cuda, Device};
use crate::error::{name, ProbeError};
use crate::report::{human_bytes, Out};

/// float4 elements per row of the 2D arrays `--api array` creates.
const ARRAY_WIDTH: usize = 8192;
const FLOAT4: u64 = 16;
const ARRAY_MAX_HEIGHT: usize = 65536;
/// float4 elements per row and rows per layer of the 3D arrays `--api array3d` creates.
const ARRAY3D_SIDE: usize = 1024;
/// Bytes of one 1024 × 1024 float4 layer.
const ARRAY3D_LAYER: u64 = (ARRAY3D_SIDE * ARRAY3D_SIDE) as u64 * FLOAT4;

/// One successful allocation, as needed to free it.
enum Held {
    Ptr(CUdeviceptr),
    Async(CUdeviceptr),
    Vmm {
        va: CUdeviceptr,
        size: usize,
        /// `None` once released (the mapping keeps the memory).
        handle: Option<CUmemGenericAllocationHandle>,
    },
    Array(CUarray),
    Mipmap(CUmipmappedArray),
    Graph {
        /// Every graph made for it (the built one, its clone or parent), destroyed at free.
        graphs: Vec<CUgraph>,
        exec: CUgraphExec,
        dptr: CUdeviceptr,
    },
    /// One step of malloc heap growth (given back together at the end).
    Heap,
    /// A pool that keeps the chunk it allocated and freed.
    Pool(CUmemoryPool),
}

struct Allocator<'a> {
    cuda: &'a Cuda,
    dev: Device,
    api: Api,
    stream: CUstream,
    pool: CUmemoryPool,
    granularity: usize,
    instantiate: Instantiate,
    /// The malloc heap size before `--api heap` grew it, and its current size.
    heap: (usize, Cell<usize>),
}

impl<'a> Allocator<'a> {
    fn new(
        cuda: &'a Cuda,
        dev: Device,
        api: Api,
        instantiate: Instantiate,
        stream_device: Option<i32>,
    ) -> Result<Self, ProbeError> {
        let mut a = Allocator {
            cuda,
            dev,
            api,
            stream: std::ptr::null_mut(),
            pool: std::ptr::null_mut(),
            granularity: 1,
            instantiate,
            heap: (0, Cell::new(0)),
        };
        if matches!(
            api,
            Api::Async | Api::Pool | Api::DefaultPool | Api::PoolKeep
        ) || api.is_graph()
        {
            match stream_device {
                Some(other) => {
                    cuda.open_device(other)?;
                    a.stream = cuda.stream_create()?;
                    cuda.open_device(a.dev.ordinal)?;
                }
                None => a.stream = cuda.stream_create()?,
            }
        }
        if api == Api::Heap {
            let mut base = 0usize;
            call!(cuda, cuCtxGetLimit: PFN_cuCtxGetLimit, &mut base, CU_LIMIT_MALLOC_HEAP_SIZE)?;
            a.heap = (base, Cell::new(base));
        }
        if api == Api::Pool {
            let props = CUmemPoolProps::pinned_on(a.dev.ordinal);
            call!(cuda, cuMemPoolCreate: PFN_cuMemPoolCreate, &mut a.pool, &props)?;
        }
        if api == Api::DefaultPool {
            let on = stream_device.unwrap_or(a.dev.ordinal);
            call!(cuda, cuDeviceGetDefaultMemPool: PFN_cuDeviceGetDefaultMemPool, &mut a.pool, on)?;
        }
        if matches!(api, Api::Vmm | Api::VmmReleaseMapped) {
            let prop = CUmemAllocationProp::pinned_on(a.dev.ordinal);
            call!(cuda, cuMemGetAllocationGranularity: PFN_cuMemGetAllocationGranularity,
                &mut a.granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)?;
        }
        Ok(a)
    }

    /// The bytes one allocation of `chunk` really takes on this path.
    fn effective_chunk(&self, chunk: u64) -> Result<u64, ProbeError> {
        Ok(match self.api {
            Api::Pitch => pitch_shape(chunk).0 * pitch_shape(chunk).1,
            Api::Vmm | Api::VmmReleaseMapped => {
                chunk.div_ceil(self.granularity as u64) * self.granularity as u64
            }
            Api::Array => {
                let (w, h) = array_shape(chunk)?;
                w as u64 * h.max(1) as u64 * FLOAT4
            }
            Api::Array3d => chunk.div_ceil(ARRAY3D_LAYER) * ARRAY3D_LAYER,
            Api::Mipmap => {
                let (w, h) = array_shape(chunk)?;
                let (w, h) = (w as u64, h.max(1) as u64);
                (w * h + (w / 2).max(1) * (h / 2).max(1)) * FLOAT4
            }
            _ => chunk,
        })
    }

    fn alloc(&self, chunk: u64) -> Result<Held, ProbeError> {
        let cuda = self.cuda;
        let size = chunk as usize;
        let mut p: CUdeviceptr = 0;
        match self.api {
            Api::Alloc => {
                call!(cuda, cuMemAlloc: PFN_cuMemAlloc_v2, &mut p, size)?;
                Ok(Held::Ptr(p))
            }
            Api::Pitch => {
                let (width, height) = pitch_shape(chunk);
                let mut pitch = 0usize;
                call!(cuda, cuMemAllocPitch: PFN_cuMemAllocPitch_v2, &mut p, &mut pitch, width as usize, height as usize, 16)?;
                Ok(Held::Ptr(p))
            }
            Api::Managed => {
                call!(cuda, cuMemAllocManaged: PFN_cuMemAllocManaged, &mut p, size, CU_MEM_ATTACH_GLOBAL)?;
                Ok(Held::Ptr(p))
            }
            Api::Async => {
                call!(cuda, cuMemAllocAsync: PFN_cuMemAllocAsync, &mut p, size, self.stream)?;
                cuda.stream_sync(self.stream)?;
                Ok(Held::Async(p))
            }
            Api::Pool | Api::DefaultPool => {
                call!(cuda, cuMemAllocFromPoolAsync: PFN_cuMemAllocFromPoolAsync, &mut p, size, self.pool, self.stream)?;
                cuda.stream_sync(self.stream)?;
                Ok(Held::Async(p))
            }
            Api::Vmm | Api::VmmReleaseMapped => self.alloc_vmm(size),
            Api::Array => {
                let (w, h) = array_shape(chunk)?;
                let desc = CUDA_ARRAY_DESCRIPTOR {
                    Width: w,
                    Height: h,
                    Format: CU_AD_FORMAT_FLOAT,
                    NumChannels: 4,
                };
                let mut a: CUarray = std::ptr::null_mut();
                call!(cuda, cuArrayCreate: PFN_cuArrayCreate_v2, &mut a, &desc)?;
                Ok(Held::Array(a))
            }
            Api::Array3d => {
                let desc = CUDA_ARRAY3D_DESCRIPTOR {
                    Width: ARRAY3D_SIDE,
                    Height: ARRAY3D_SIDE,
                    Depth: chunk.div_ceil(ARRAY3D_LAYER) as usize,
                    Format: CU_AD_FORMAT_FLOAT,
                    NumChannels: 4,
                    Flags: 0,
                };
                let mut a: CUarray = std::ptr::null_mut();
                call!(cuda, cuArray3DCreate: PFN_cuArray3DCreate_v2, &mut a, &desc)?;
                Ok(Held::Array(a))
            }
            Api::Mipmap => {
                let (w, h) = array_shape(chunk)?;
                let desc = CUDA_ARRAY3D_DESCRIPTOR {
                    Width: w,
                    Height: h,
                    Depth: 0,
                    Format: CU_AD_FORMAT_FLOAT,
                    NumChannels: 4,
                    Flags: 0,
                };
                let mut m: CUmipmappedArray = std::ptr::null_mut();
                call!(cuda, cuMipmappedArrayCreate: PFN_cuMipmappedArrayCreate, &mut m, &desc, 2)?;
                Ok(Held::Mipmap(m))
            }
            Api::Graph | Api::GraphNode | Api::Capture | Api::Clone | Api::Child => {
                self.alloc_graph(size)
            }
            Api::GraphEscape => self.alloc_graph_escape(size),
            Api::Heap => {
                let next = self.heap.1.get() + size;
                call!(cuda, cuCtxSetLimit: PFN_cuCtxSetLimit, CU_LIMIT_MALLOC_HEAP_SIZE, next)?;
                self.heap.1.set(next);
                Ok(Held::Heap)
            }
            Api::PoolKeep => self.alloc_pool_keep(size),
        }
    }

    /// A new pool that keeps everything freed into it; `size` allocated and freed in it.
    fn alloc_pool_keep(&self, size: usize) -> Result<Held, ProbeError> {
        let cuda = self.cuda;
        let props = CUmemPoolProps::pinned_on(self.dev.ordinal);
        let mut pool: CUmemoryPool = std::ptr::null_mut();
        call!(cuda, cuMemPoolCreate: PFN_cuMemPoolCreate, &mut pool, &props)?;
        let used = (|| {
            let mut keep = u64::MAX;
            call!(cuda, cuMemPoolSetAttribute: PFN_cuMemPoolSetAttribute, pool,
                CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, (&mut keep as *mut u64).cast::<c_void>())?;
            let mut p: CUdeviceptr = 0;
            call!(cuda, cuMemAllocFromPoolAsync: PFN_cuMemAllocFromPoolAsync, &mut p, size, pool, self.stream)?;
            call!(cuda, cuMemFreeAsync: PFN_cuMemFreeAsync, p, self.stream)?;
            cuda.stream_sync(self.stream)
        })();
        match used {
            Ok(()) => Ok(Held::Pool(pool)),
            Err(e) => {
                self.free(Held::Pool(pool));
                Err(e)
            }
        }
    }

    /// Bytes the driver says pool `pool` holds (live and kept).
    fn pool_reserved(&self, pool: CUmemoryPool) -> Result<u64, ProbeError> {
        let mut v = 0u64;
        call!(self.cuda, cuMemPoolGetAttribute: PFN_cuMemPoolGetAttribute, pool,
            CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, (&mut v as *mut u64).cast::<c_void>())?;
        Ok(v)
    }

    fn alloc_vmm(&self, size: usize) -> Result<Held, ProbeError> {
        let cuda = self.cuda;
        let prop = CUmemAllocationProp::pinned_on(self.dev.ordinal);
        let mut handle: CUmemGenericAllocationHandle = 0;
        call!(cuda, cuMemCreate: PFN_cuMemCreate, &mut handle, size, &prop, 0)?;
        let mut va: CUdeviceptr = 0;
        let mapped = (|| {
            call!(cuda, cuMemAddressReserve: PFN_cuMemAddressReserve, &mut va, size, 0, 0, 0)?;
            call!(cuda, cuMemMap: PFN_cuMemMap, va, size, 0, handle, 0)?;
            let access = CUmemAccessDesc {
                location: prop.location,
                flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            call!(cuda, cuMemSetAccess: PFN_cuMemSetAccess, va, size, &access, 1)
        })();
        let mut held = Held::Vmm {
            va,
            size,
            handle: Some(handle),
        };
        if mapped.is_ok() && self.api == Api::VmmReleaseMapped {
            if let Err(e) = call!(cuda, cuMemRelease: PFN_cuMemRelease, handle) {
                self.free(held);
                return Err(e);
            }
            held = Held::Vmm {
                va,
                size,
                handle: None,
            };
        }
        match mapped {
            Ok(()) => Ok(held),
            Err(e) => {
                self.free(held);
                Err(e)
            }
        }
    }

    /// Builds a graph that allocates `size` (an allocation node added directly, through
    /// cuGraphAddNode, or by capturing cuMemAllocAsync), takes its clone or wraps it as a
    /// child graph when asked, instantiates that as `--instantiate` says and launches it.
    fn alloc_graph(&self, size: usize) -> Result<Held, ProbeError> {
        let cuda = self.cuda;
        let mut graphs: Vec<CUgraph> = Vec::new();
        let mut exec: CUgraphExec = std::ptr::null_mut();
        let mut dptr: CUdeviceptr = 0;
        let built = (|| {
            let built = self.build_graph(size, &mut dptr)?;
            graphs.push(built);
            let target = match self.api {
                Api::Clone => {
                    let mut clone: CUgraph = std::ptr::null_mut();
                    call!(cuda, cuGraphClone: PFN_cuGraphClone, &mut clone, built)?;
                    graphs.push(clone);
                    clone
                }
                Api::Child => {
                    let mut parent: CUgraph = std::ptr::null_mut();
                    call!(cuda, cuGraphCreate: PFN_cuGraphCreate, &mut parent, 0)?;
                    graphs.push(parent);
                    let mut node: CUgraphNode = std::ptr::null_mut();
                    call!(cuda, cuGraphAddChildGraphNode: PFN_cuGraphAddChildGraphNode,
                        &mut node, parent, std::ptr::null(), 0, built)?;
                    parent
                }
                _ => built,
            };
            self.instantiate(&mut exec, target)?;
            // Real drivers back graph memory at launch; the simulated one at instantiation.
            call!(cuda, cuGraphLaunch: PFN_cuGraphLaunch, exec, self.stream)?;
            cuda.stream_sync(self.stream)
        })();
        let held = Held::Graph { graphs, exec, dptr };
        match built {
            Ok(()) => Ok(held),
            Err(e) => {
                self.free(held);
                Err(e)
            }
        }
    }

    /// One launch of a new graph allocating `size` with no free node; the executable graph
    /// and the graph are destroyed at once, the allocation is held by its address.
    fn alloc_graph_escape(&self, size: usize) -> Result<Held, ProbeError> {
        let cuda = self.cuda;
        let mut dptr: CUdeviceptr = 0;
        let graph = self.build_graph(size, &mut dptr)?;
        let mut exec: CUgraphExec = std::ptr::null_mut();
        let launched = self.instantiate(&mut exec, graph).and_then(|()| {
            call!(cuda, cuGraphLaunch: PFN_cuGraphLaunch, exec, self.stream)?;
            cuda.stream_sync(self.stream)
        });
        if !exec.is_null() {
            let _ = call!(cuda, cuGraphExecDestroy: PFN_cuGraphExecDestroy, exec);
        }
        let _ = call!(cuda, cuGraphDestroy: PFN_cuGraphDestroy, graph);
        launched.map(|()| Held::Async(dptr))
    }

    /// A new graph holding one allocation of `size`; its address goes to `dptr`.
    fn build_graph(&self, size: usize, dptr: &mut CUdeviceptr) -> Result<CUgraph, ProbeError> {
        let cuda = self.cuda;
        let mut graph: CUgraph = std::ptr::null_mut();
        if self.api == Api::Capture {
            call!(cuda, cuStreamBeginCapture: PFN_cuStreamBeginCapture_v2, self.stream, CU_STREAM_CAPTURE_MODE_GLOBAL)?;
            // Scratch memory allocated and freed inside the graph, as captured code does.
            let allocated =
                call!(cuda, cuMemAllocAsync: PFN_cuMemAllocAsync, dptr, size, self.stream)
                    .and_then(
                        |()| call!(cuda, cuMemFreeAsync: PFN_cuMemFreeAsync, *dptr, self.stream),
                    );
            let ended =
                call!(cuda, cuStreamEndCapture: PFN_cuStreamEndCapture, self.stream, &mut graph);
            allocated.and(ended)?;
            return Ok(graph);
        }
        call!(cuda, cuGraphCreate: PFN_cuGraphCreate, &mut graph, 0)?;
        let access = CUmemAccessDesc {
            location: CUmemLocation {
                type_: CU_MEM_LOCATION_TYPE_DEVICE,
                id: self.dev.ordinal,
            },
            flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        let alloc = CUDA_MEM_ALLOC_NODE_PARAMS {
            poolProps: CUmemPoolProps::pinned_on(self.dev.ordinal),
            accessDescs: &access,
            accessDescCount: 1,
            bytesize: size,
            dptr: 0,
        };
        let mut node: CUgraphNode = std::ptr::null_mut();
        let added = if self.api == Api::GraphNode {
            let mut params = CUgraphNodeParams::zeroed(CU_GRAPH_NODE_TYPE_MEM_ALLOC);
            params.u.alloc = alloc;
            let r = if cuda.version >= 12030 {
                call!(cuda, cuGraphAddNode: PFN_cuGraphAddNode_v2, &mut node, graph,
                    std::ptr::null(), std::ptr::null(), 0, &mut params)
            } else {
                call!(cuda, cuGraphAddNode: PFN_cuGraphAddNode, &mut node, graph,
                    std::ptr::null(), 0, &mut params)
            };
            // SAFETY: the union holds the allocation parameters written above.
            *dptr = unsafe { params.u.alloc.dptr };
            r
        } else {
            let mut params = alloc;
            let r = call!(cuda, cuGraphAddMemAllocNode: PFN_cuGraphAddMemAllocNode,
                &mut node, graph, std::ptr::null(), 0, &mut params);
            *dptr = params.dptr;
            r
        };
        match added {
            Ok(()) => Ok(graph),
            Err(e) => {
                let _ = call!(cuda, cuGraphDestroy: PFN_cuGraphDestroy, graph);
                Err(e)
            }
        }
    }

    /// Instantiates `graph` through the entry point `--instantiate` names.
    fn instantiate(&self, exec: &mut CUgraphExec, graph: CUgraph) -> Result<(), ProbeError> {
        let cuda = self.cuda;
        match self.instantiate {
            Instantiate::Flags => {
                call!(cuda, cuGraphInstantiateWithFlags: PFN_cuGraphInstantiateWithFlags, exec, graph, 0)
            }
            Instantiate::Params => {
                // CUDA_GRAPH_INSTANTIATE_PARAMS: flags, upload stream, error node, result.
                let mut params = [0u64; 4];
                call!(cuda, cuGraphInstantiateWithParams: PFN_cuGraphInstantiateWithParams,
                    exec, graph, params.as_mut_ptr().cast::<c_void>())
            }
            Instantiate::Legacy | Instantiate::V2 => {
                let symbol = if self.instantiate == Instantiate::Legacy {
                    "cuGraphInstantiate"
                } else {
                    "cuGraphInstantiate_v2"
                };
                // SAFETY: both exports have the pre-12.0 signature.
                let f: PFN_cuGraphInstantiate = unsafe { cuda.exact(symbol)? };
                let mut log = [0 as std::ffi::c_char; 64];
                // SAFETY: valid out pointers and a log buffer of its stated size.
                let r = unsafe {
                    f(
                        exec,
                        graph,
                        std::ptr::null_mut(),
                        log.as_mut_ptr(),
                        log.len(),
                    )
                };
                crate::error::check(symbol, r)
            }
        }
    }

    /// Frees one allocation, best effort (cleanup errors do not change the result).
    fn free(&self, held: Held) {
        let cuda = self.cuda;
        let _ = match held {
            Held::Ptr(p) => call!(cuda, cuMemFree: PFN_cuMemFree_v2, p),
            Held::Async(p) => call!(cuda, cuMemFreeAsync: PFN_cuMemFreeAsync, p, self.stream)
                .and_then(|_| cuda.stream_sync(self.stream)),
            Held::Vmm { va, size, handle } => {
                if va != 0 {
                    let _ = call!(cuda, cuMemUnmap: PFN_cuMemUnmap, va, size);
                    let _ = call!(cuda, cuMemAddressFree: PFN_cuMemAddressFree, va, size);
                }
                match handle {
                    Some(h) => call!(cuda, cuMemRelease: PFN_cuMemRelease, h),
                    None => Ok(()),
                }
            }
            Held::Array(a) => call!(cuda, cuArrayDestroy: PFN_cuArrayDestroy, a),
            Held::Mipmap(m) => call!(cuda, cuMipmappedArrayDestroy: PFN_cuMipmappedArrayDestroy, m),
            Held::Heap => Ok(()),
            Held::Pool(pool) => call!(cuda, cuMemPoolDestroy: PFN_cuMemPoolDestroy, pool),
            Held::Graph { graphs, exec, dptr } => {
                // Real drivers keep launched graph memory until it is freed like async memory.
                if dptr != 0 && !exec.is_null() {
                    let _ = call!(cuda, cuMemFreeAsync: PFN_cuMemFreeAsync, dptr, self.stream);
                    let _ = cuda.stream_sync(self.stream);
                }
                if !exec.is_null() {
                    let _ = call!(cuda, cuGraphExecDestroy: PFN_cuGraphExecDestroy, exec);
                }
                for graph in graphs {
                    let _ = call!(cuda, cuGraphDestroy: PFN_cuGraphDestroy, graph);
                }
                call!(cuda, cuDeviceGraphMemTrim: PFN_cuDeviceGraphMemTrim, self.dev.ordinal)
            }
        };
    }

    fn finish(&self) {
        let cuda = self.cuda;
        if self.api == Api::Heap && self.heap.1.get() != self.heap.0 {
            let _ = call!(cuda, cuCtxSetLimit: PFN_cuCtxSetLimit, CU_LIMIT_MALLOC_HEAP_SIZE, self.heap.0);
        }
        if self.api == Api::Pool && !self.pool.is_null() {
            let _ = call!(cuda, cuMemPoolDestroy: PFN_cuMemPoolDestroy, self.pool);
        }
        if !self.stream.is_null() {
            let _ = cuda.stream_destroy(self.stream);
        }
    }
}

/// (row bytes, rows) of a pitched allocation of about `chunk` bytes: 64 KiB rows.
fn pitch_shape(chunk: u64) -> (u64, u64) {
    const ROW: u64 = 64 << 10;
    if chunk <= ROW {
        (chunk.div_ceil(512) * 512, 1)
    } else {
        (ROW, chunk.div_ceil(ROW))
    }
}

/// (width, height) in float4 elements of an array of about `chunk` bytes.
fn array_shape(chunk: u64) -> Result<(usize, usize), ProbeError> {
    let row = ARRAY_WIDTH as u64 * FLOAT4;
    if chunk < row {
        return Ok((chunk.div_ceil(FLOAT4) as usize, 0));
    }
    let height = chunk.div_ceil(row) as usize;
    if height > ARRAY_MAX_HEIGHT {
        return Err(ProbeError::Usage(format!(
            "--chunk {} is too large for --api array; at most {} per array",
            human_bytes(chunk),
            human_bytes(row * ARRAY_MAX_HEIGHT as u64)
        )));
    }
    Ok((ARRAY_WIDTH, height))
}

/// One device filled by `alloc`: what was allocated and why it stopped.
struct Filled<'a> {
    a: Allocator<'a>,
    held: Vec<Held>,
    chunk: u64,
    total: u64,
    max: u64,
    refusal: Option<(&'static str, CUresult)>,
    /// `--api pool-keep`: the most the driver said the pools held together at once.
    reserved_peak: u64,
}

/// Opens device `ordinal` and allocates through `args.api` until refused or `--max`.
fn fill<'a>(cuda: &'a Cuda, ordinal: i32, args: &AllocArgs) -> Result<Filled<'a>, ProbeError> {
    let dev = cuda.open_device(ordinal)?;
    fill_current(cuda, dev, args)
}

/// Allocates on `dev`, whose context is current, through `args.api` until refused or `--max`.
fn fill_current<'a>(
    cuda: &'a Cuda,
    dev: Device,
    args: &AllocArgs,
) -> Result<Filled<'a>, ProbeError> {
    let a = Allocator::new(cuda, dev, args.api, args.instantiate, args.stream_device)?;
    let chunk = a.effective_chunk(args.chunk)?;
    // Without --max, stop at twice the device's memory: managed memory may oversubscribe a
    // real GPU instead of being refused.
    let max = match args.max {
        Some(m) => m,
        None => cuda.total_mem(&a.dev)?.saturating_mul(2),
    };
    let mut held = Vec::new();
    let mut total = 0u64;
    let mut reserved_peak = 0u64;
    let refusal = loop {
        if total + chunk > max {
            break None;
        }
        match a.alloc(args.chunk) {
            Ok(h) => {
                held.push(h);
                total += chunk;
            }
            Err(ProbeError::Cuda { call, code }) => break Some((call, code)),
            Err(e) => return Err(e),
        }
        if args.api == Api::PoolKeep {
            let mut reserved = 0u64;
            for h in &held {
                if let Held::Pool(p) = h {
                    reserved += a.pool_reserved(*p)?;
                }
            }
            reserved_peak = reserved_peak.max(reserved);
        }
    };
    Ok(Filled {
        a,
        held,
        chunk,
        total,
        max,
        refusal,
        reserved_peak,
    })
}

impl Filled<'_> {
    /// The JSON report, with `cuMemGetInfo` of the current (this device's) context.
    fn report(&self, api: Api) -> Result<serde_json::Value, ProbeError> {
        let (free, mem_total) = self.a.cuda.mem_info()?;
        let (error, call) = match self.refusal {
            Some((call, code)) => (Some(name(code)), Some(call)),
            None => (None, None),
        };
        let mut v = json!({
            "cmd": "alloc",
            "api": api.as_str(),
            "device": self.a.dev.ordinal,
            "chunk": self.chunk,
            "count": self.held.len(),
            "total": self.total,
            "error": error,
            "call": call,
            "mem_free": free,
            "mem_total": mem_total,
            "max": self.max,
        });
        if api == Api::PoolKeep {
            v["reserved_peak"] = json!(self.reserved_peak);
        }
        Ok(v)
    }

    /// A refusal other than out-of-memory is the probe's error.
    fn outcome(&self) -> Result<(), ProbeError> {
        match self.refusal {
            Some((call, code)) if code != CUDA_ERROR_OUT_OF_MEMORY => {
                Err(ProbeError::Cuda { call, code })
            }
            _ => Ok(()),
        }
    }
}

pub fn run(cuda: &Cuda, out: Out, ordinal: i32, args: &AllocArgs) -> Result<(), ProbeError> {
    // Earlier rounds fill and free everything; only the last one is reported.
    for _ in 1..args.rounds {
        let f = fill(cuda, ordinal, args)?;
        f.outcome()?;
        for h in f.held {
            f.a.free(h);
        }
        f.a.finish();
    }
    let f = fill(cuda, ordinal, args)?;
    let v = f.report(args.api)?;
    out.emit(v.clone(), || {
        let end = match (&v["error"].as_str(), v["call"].as_str()) {
            (Some(e), Some(c)) => format!("refused by {c}: {e}"),
            _ => format!("stopped at {}", human_bytes(f.max)),
        };
        format!(
            "alloc ({}): {} × {} = {} allocated; {end}; cuMemGetInfo free {} of {}",
            args.api.as_str(),
            f.held.len(),
            human_bytes(f.chunk),
            human_bytes(f.total),
            human_bytes(v["mem_free"].as_u64().unwrap_or(0)),
            human_bytes(v["mem_total"].as_u64().unwrap_or(0))
        )
    });
    if args.hold > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(args.hold));
    }
    let outcome = f.outcome();
    for h in f.held {
        f.a.free(h);
    }
    f.a.finish();
    outcome
}

/// `ctx-destroy`: fills device `ordinal` through `args.api` in a context made for it
/// (`cuCtxCreate`), destroys that context without freeing anything, then fills the device
/// with `cuMemAlloc` in its primary context. Reports both fills (`kept`: what the first
/// made, which the driver keeps past the context unless it dies with it; `after`: what the
/// second could take), holds `--hold` seconds, and exits without freeing: the process's
/// exit gives everything back.
pub fn run_ctx_destroy(
    cuda: &Cuda,
    out: Out,
    ordinal: i32,
    args: &AllocArgs,
) -> Result<(), ProbeError> {
    let dev = cuda.open_device(ordinal)?;
    let ctx = cuda.context_create(&dev)?;
    let first = fill_current(cuda, dev, args)?;
    first.outcome()?;
    call!(cuda, cuCtxDestroy: PFN_cuCtxDestroy_v2, ctx)?;
    let plain = AllocArgs {
        api: Api::Alloc,
        stream_device: None,
        hold: 0.0,
        rounds: 1,
        ..args.clone()
    };
    let second = fill(cuda, ordinal, &plain)?;
    let mut v = second.report(Api::Alloc)?;
    v["cmd"] = json!("ctx-destroy");
    v["api"] = json!(args.api.as_str());
    v["kept"] = json!(first.total);
    v["after"] = json!(second.total);
    out.emit(v.clone(), || {
        format!(
            "ctx-destroy ({}): {} made in a context then destroyed; then cuMemAlloc took {} ({}); cuMemGetInfo free {} of {}",
            args.api.as_str(),
            human_bytes(first.total),
            human_bytes(second.total),
            v["error"].as_str().unwrap_or("not refused"),
            human_bytes(v["mem_free"].as_u64().unwrap_or(0)),
            human_bytes(v["mem_total"].as_u64().unwrap_or(0))
        )
    });
    if args.hold > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(args.hold));
    }
    second.outcome()
}

/// `graph-cache`: a captured graph that allocates and frees `--chunk` is instantiated,
/// launched and its executable destroyed, which leaves the memory in the device's graph pool
/// (CUDA Programming Guide, graph memory nodes); then `--then`: a cuMemAlloc of `--chunk`,
/// the graph instantiated and launched again, or cuDeviceGraphMemTrim. Reports cuMemGetInfo's
/// free memory before, after the destroy and after the step, the step's refusal, and the
/// driver's graph pool figures (`cuDeviceGetGraphMemAttribute`); holds `--hold` seconds; frees.
pub fn run_graph_cache(
    cuda: &Cuda,
    out: Out,
    ordinal: i32,
    args: &GraphCacheArgs,
) -> Result<(), ProbeError> {
    let dev = cuda.open_device(ordinal)?;
    let a = Allocator::new(cuda, dev, Api::Capture, Instantiate::Flags, None)?;
    let size = args.chunk as usize;
    let (free_before, mem_total) = cuda.mem_info()?;
    let mut dptr: CUdeviceptr = 0;
    let graph = a.build_graph(size, &mut dptr)?;
    let launch = |exec: CUgraphExec| {
        call!(cuda, cuGraphLaunch: PFN_cuGraphLaunch, exec, a.stream)?;
        cuda.stream_sync(a.stream)
    };
    let mut exec: CUgraphExec = std::ptr::null_mut();
    a.instantiate(&mut exec, graph)?;
    launch(exec)?;
    call!(cuda, cuGraphExecDestroy: PFN_cuGraphExecDestroy, exec)?;
    let (free_destroyed, _) = cuda.mem_info()?;
    let mut held: CUdeviceptr = 0;
    let mut second: CUgraphExec = std::ptr::null_mut();
    let step = match args.then {
        GraphCacheStep::Alloc => call!(cuda, cuMemAlloc: PFN_cuMemAlloc_v2, &mut held, size),
        GraphCacheStep::Graph => a
            .instantiate(&mut second, graph)
            .and_then(|()| launch(second)),
        GraphCacheStep::Trim => {
            call!(cuda, cuDeviceGraphMemTrim: PFN_cuDeviceGraphMemTrim, ordinal)
        }
    };
    let refusal = match step {
        Ok(()) => None,
        Err(ProbeError::Cuda { call, code }) => Some((call, code)),
        Err(e) => return Err(e),
    };
    let (free_after, _) = cuda.mem_info()?;
    let graph_mem = |attr| {
        let mut v = 0u64;
        call!(cuda, cuDeviceGetGraphMemAttribute: PFN_cuDeviceGetGraphMemAttribute, ordinal,
            attr, (&mut v as *mut u64).cast::<c_void>())
        .map(|()| v)
    };
    let graph_used = graph_mem(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT)?;
    let graph_reserved = graph_mem(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)?;
    let v = json!({
        "cmd": "graph-cache",
        "then": args.then.as_str(),
        "device": ordinal,
        "chunk": args.chunk,
        "free_before": free_before,
        "free_destroyed": free_destroyed,
        "free_after": free_after,
        "mem_total": mem_total,
        "error": refusal.map(|(_, code)| name(code)),
        "call": refusal.map(|(call, _)| call),
        "graph_used": graph_used,
        "graph_reserved": graph_reserved,
    });
    out.emit(v.clone(), || {
        format!(
            "graph-cache (then {}): cuMemGetInfo free {} before, {} after the executable graph's \
             destroy, {} after the step ({}); graph pool used {}, reserved {}",
            args.then.as_str(),
            human_bytes(free_before),
            human_bytes(free_destroyed),
            human_bytes(free_after),
            v["error"].as_str().unwrap_or("not refused"),
            human_bytes(graph_used),
            human_bytes(graph_reserved)
        )
    });
    if args.hold > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(args.hold));
    }
    if held != 0 {
        let _ = call!(cuda, cuMemFree: PFN_cuMemFree_v2, held);
    }
    if !second.is_null() {
        let _ = call!(cuda, cuGraphExecDestroy: PFN_cuGraphExecDestroy, second);
    }
    let _ = call!(cuda, cuGraphDestroy: PFN_cuGraphDestroy, graph);
    let _ = call!(cuda, cuDeviceGraphMemTrim: PFN_cuDeviceGraphMemTrim, ordinal);
    a.finish();
    match refusal {
        Some((call, code)) if code != CUDA_ERROR_OUT_OF_MEMORY => {
            Err(ProbeError::Cuda { call, code })
        }
        _ => Ok(()),
    }
}

/// `multi`: fills each device in turn, holding everything, and reports them together.
/// Memory is given back when the process exits.
pub fn run_multi(cuda: &Cuda, out: Out, args: &MultiArgs) -> Result<(), ProbeError> {
    let mut filled = Vec::new();
    let mut reports = Vec::new();
    for ordinal in &args.devices {
        let f = fill(cuda, *ordinal, &args.alloc)?;
        reports.push(f.report(args.alloc.api)?);
        filled.push(f);
    }
    let v = json!({"cmd": "multi", "devices": reports});
    out.emit(v.clone(), || {
        reports
            .iter()
            .map(|r| {
                format!(
                    "device {}: {} allocated, {}",
                    r["device"],
                    human_bytes(r["total"].as_u64().unwrap_or(0)),
                    r["error"].as_str().unwrap_or("not refused")
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    });
    if args.alloc.hold > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(args.alloc.hold));
    }
    filled.iter().try_for_each(Filled::outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_cover_the_chunk() {
        assert_eq!(pitch_shape(1000), (1024, 1));
        assert_eq!(pitch_shape(1 << 30), (64 << 10, 16384));
        assert_eq!(array_shape(1 << 30).unwrap(), (8192, 8192));
        assert_eq!(array_shape(4096).unwrap(), (256, 0));
        assert!(array_shape(16 << 30).is_err());
    }
}

//! `alloc`: allocate fixed-size chunks through one allocation path until the driver refuses
//! (or `--max` is reached), report the total and the refusal, optionally hold the memory,
//! then free it. Each path is driven as applications drive it.

use std::time::Duration;

use serde_json::json;

use gpuslice_cuda_ffi::*;

use crate::cli::{AllocArgs, Api};
use crate::cuda::{call, Cuda, Device};
use crate::error::{name, ProbeError};
use crate::report::{human_bytes, Out};

/// float4 elements per row of the 2D arrays `--api array` creates.
const ARRAY_WIDTH: usize = 8192;
const FLOAT4: u64 = 16;
const ARRAY_MAX_HEIGHT: usize = 65536;

/// One successful allocation, as needed to free it.
enum Held {
    Ptr(CUdeviceptr),
    Async(CUdeviceptr),
    Vmm {
        va: CUdeviceptr,
        size: usize,
        handle: CUmemGenericAllocationHandle,
    },
    Array(CUarray),
    Graph {
        graph: CUgraph,
        exec: CUgraphExec,
        dptr: CUdeviceptr,
    },
}

struct Allocator<'a> {
    cuda: &'a Cuda,
    dev: Device,
    api: Api,
    stream: CUstream,
    pool: CUmemoryPool,
    granularity: usize,
}

impl<'a> Allocator<'a> {
    fn new(cuda: &'a Cuda, dev: Device, api: Api) -> Result<Self, ProbeError> {
        let mut a = Allocator {
            cuda,
            dev,
            api,
            stream: std::ptr::null_mut(),
            pool: std::ptr::null_mut(),
            granularity: 1,
        };
        if matches!(api, Api::Async | Api::Pool | Api::Graph) {
            a.stream = cuda.stream_create()?;
        }
        if api == Api::Pool {
            let props = CUmemPoolProps::pinned_on(a.dev.ordinal);
            call!(cuda, cuMemPoolCreate: PFN_cuMemPoolCreate, &mut a.pool, &props)?;
        }
        if api == Api::Vmm {
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
            Api::Vmm => chunk.div_ceil(self.granularity as u64) * self.granularity as u64,
            Api::Array => {
                let (w, h) = array_shape(chunk)?;
                w as u64 * h.max(1) as u64 * FLOAT4
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
            Api::Pool => {
                call!(cuda, cuMemAllocFromPoolAsync: PFN_cuMemAllocFromPoolAsync, &mut p, size, self.pool, self.stream)?;
                cuda.stream_sync(self.stream)?;
                Ok(Held::Async(p))
            }
            Api::Vmm => self.alloc_vmm(size),
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
            Api::Graph => self.alloc_graph(size),
        }
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
        let held = Held::Vmm { va, size, handle };
        match mapped {
            Ok(()) => Ok(held),
            Err(e) => {
                self.free(held);
                Err(e)
            }
        }
    }

    fn alloc_graph(&self, size: usize) -> Result<Held, ProbeError> {
        let cuda = self.cuda;
        let mut graph: CUgraph = std::ptr::null_mut();
        call!(cuda, cuGraphCreate: PFN_cuGraphCreate, &mut graph, 0)?;
        let access = CUmemAccessDesc {
            location: CUmemLocation {
                type_: CU_MEM_LOCATION_TYPE_DEVICE,
                id: self.dev.ordinal,
            },
            flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        let mut params = CUDA_MEM_ALLOC_NODE_PARAMS {
            poolProps: CUmemPoolProps::pinned_on(self.dev.ordinal),
            accessDescs: &access,
            accessDescCount: 1,
            bytesize: size,
            dptr: 0,
        };
        let mut exec: CUgraphExec = std::ptr::null_mut();
        let built = (|| {
            let mut node: CUgraphNode = std::ptr::null_mut();
            call!(cuda, cuGraphAddMemAllocNode: PFN_cuGraphAddMemAllocNode, &mut node, graph, std::ptr::null(), 0, &mut params)?;
            call!(cuda, cuGraphInstantiateWithFlags: PFN_cuGraphInstantiateWithFlags, &mut exec, graph, 0)?;
            // Real drivers back graph memory at launch; the simulated one at instantiation.
            call!(cuda, cuGraphLaunch: PFN_cuGraphLaunch, exec, self.stream)?;
            cuda.stream_sync(self.stream)
        })();
        let held = Held::Graph {
            graph,
            exec,
            dptr: params.dptr,
        };
        match built {
            Ok(()) => Ok(held),
            Err(e) => {
                self.free(held);
                Err(e)
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
                call!(cuda, cuMemRelease: PFN_cuMemRelease, handle)
            }
            Held::Array(a) => call!(cuda, cuArrayDestroy: PFN_cuArrayDestroy, a),
            Held::Graph { graph, exec, dptr } => {
                // Real drivers keep launched graph memory until it is freed like async memory.
                if dptr != 0 && !exec.is_null() {
                    let _ = call!(cuda, cuMemFreeAsync: PFN_cuMemFreeAsync, dptr, self.stream);
                    let _ = cuda.stream_sync(self.stream);
                }
                if !exec.is_null() {
                    let _ = call!(cuda, cuGraphExecDestroy: PFN_cuGraphExecDestroy, exec);
                }
                let _ = call!(cuda, cuGraphDestroy: PFN_cuGraphDestroy, graph);
                call!(cuda, cuDeviceGraphMemTrim: PFN_cuDeviceGraphMemTrim, self.dev.ordinal)
            }
        };
    }

    fn finish(&self) {
        let cuda = self.cuda;
        if !self.pool.is_null() {
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

pub fn run(cuda: &Cuda, out: Out, ordinal: i32, args: &AllocArgs) -> Result<(), ProbeError> {
    let dev = cuda.open_device(ordinal)?;
    let a = Allocator::new(cuda, dev, args.api)?;
    let chunk = a.effective_chunk(args.chunk)?;
    // Without --max, stop at twice the device's memory: managed memory may oversubscribe a
    // real GPU instead of being refused.
    let max = match args.max {
        Some(m) => m,
        None => cuda.total_mem(&a.dev)?.saturating_mul(2),
    };
    let mut held = Vec::new();
    let mut total = 0u64;
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
    };
    let (free, mem_total) = cuda.mem_info()?;
    let (error, call) = match refusal {
        Some((call, code)) => (Some(name(code)), Some(call)),
        None => (None, None),
    };
    out.emit(
        json!({
            "cmd": "alloc",
            "api": args.api.as_str(),
            "chunk": chunk,
            "count": held.len(),
            "total": total,
            "error": error,
            "call": call,
            "mem_free": free,
            "mem_total": mem_total,
            "max": max,
        }),
        || {
            let end = match (&error, call) {
                (Some(e), Some(c)) => format!("refused by {c}: {e}"),
                _ => format!("stopped at {}", human_bytes(max)),
            };
            format!(
                "alloc ({}): {} × {} = {} allocated; {end}; cuMemGetInfo free {} of {}",
                args.api.as_str(),
                held.len(),
                human_bytes(chunk),
                human_bytes(total),
                human_bytes(free),
                human_bytes(mem_total)
            )
        },
    );
    if args.hold > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(args.hold));
    }
    for h in held {
        a.free(h);
    }
    a.finish();
    match refusal {
        Some((_, code)) if code != CUDA_ERROR_OUT_OF_MEMORY => Err(ProbeError::Cuda {
            call: refusal.map(|r| r.0).unwrap_or("alloc"),
            code,
        }),
        _ => Ok(()),
    }
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

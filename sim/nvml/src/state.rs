//! NVML's process state: `nvmlInit*` opens the simulated node (reference counted, like real
//! NVML), `nvmlShutdown` closes it at the last call; device handles are the visible GPUs'
//! host indexes dressed as pointers. A GPU fallen off the bus (an injected XID 79) answers
//! every handle lookup and device call with `NVML_ERROR_GPU_IS_LOST`, as the real driver
//! does.

use std::sync::{Arc, Mutex};

use gpuslice_cuda_ffi::nvml::*;
use gpuslice_sim_core::{Effect, SimDevice, SimNode};

use crate::ffi::NvResult;

/// An initialised NVML.
pub struct Nvml {
    pub node: SimNode,
    /// Host indexes of the visible GPUs: NVML index `i` is element `i`.
    pub visible: Vec<usize>,
    /// The wall clock minus CLOCK_MONOTONIC at init: the stamps of utilisation samples
    /// (`samples::wall_offset_ns`).
    pub wall_offset_ns: i64,
}

struct Registry {
    refs: u32,
    nvml: Option<Arc<Nvml>>,
}

static STATE: Mutex<Registry> = Mutex::new(Registry {
    refs: 0,
    nvml: None,
});

const HANDLE_BASE: usize = 0x6e76_0000_0000;

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

/// `nvmlInit*`: the first call opens the node; `allow_no_gpus` is `NVML_INIT_FLAG_NO_GPUS`.
pub fn init(allow_no_gpus: bool) -> NvResult {
    let mut r = registry();
    if r.nvml.is_none() {
        let node = SimNode::open_from_env().map_err(|e| {
            eprintln!("gpuslice simulated NVML: {e}");
            NVML_ERROR_DRIVER_NOT_LOADED
        })?;
        let visible: Vec<usize> = node.visible().iter().map(|d| d.index as usize).collect();
        if visible.is_empty() && !allow_no_gpus {
            return Err(NVML_ERROR_NOT_FOUND);
        }
        r.nvml = Some(Arc::new(Nvml {
            node,
            visible,
            wall_offset_ns: crate::samples::wall_offset_ns(),
        }));
    }
    r.refs += 1;
    Ok(())
}

/// `nvmlShutdown`: the last call closes the node.
pub fn shutdown() -> NvResult {
    let mut r = registry();
    if r.refs == 0 {
        return Err(NVML_ERROR_UNINITIALIZED);
    }
    r.refs -= 1;
    if r.refs == 0 {
        r.nvml = None;
    }
    Ok(())
}

/// The initialised NVML, or `NVML_ERROR_UNINITIALIZED`.
pub fn nvml() -> NvResult<Arc<Nvml>> {
    registry().nvml.clone().ok_or(NVML_ERROR_UNINITIALIZED)
}

impl Nvml {
    /// The handle of NVML index `i`.
    pub fn handle(&self, i: usize) -> NvResult<nvmlDevice_t> {
        let host = *self.visible.get(i).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        self.check_reachable(host)?;
        Ok(raw_handle(host))
    }

    /// `NVML_ERROR_GPU_IS_LOST` when host GPU `host` has fallen off the bus.
    fn check_reachable(&self, host: usize) -> NvResult {
        match self.node.effect(host) {
            Some(Effect::Lost) => Err(NVML_ERROR_GPU_IS_LOST),
            _ => Ok(()),
        }
    }

    /// The host index behind a handle, lost or not.
    pub fn host_of(&self, h: nvmlDevice_t) -> NvResult<usize> {
        let v = h as usize;
        if v < HANDLE_BASE || !(v - HANDLE_BASE).is_multiple_of(16) {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let host = (v - HANDLE_BASE) / 16;
        if !self.visible.contains(&host) {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        Ok(host)
    }

    /// The (NVML index, device) behind a handle.
    pub fn device(&self, h: nvmlDevice_t) -> NvResult<(usize, &SimDevice)> {
        let host = self.host_of(h)?;
        let i = self
            .visible
            .iter()
            .position(|x| *x == host)
            .ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        self.check_reachable(host)?;
        Ok((i, &self.node.devices()[host]))
    }
}

/// The handle of host GPU `host`.
pub fn raw_handle(host: usize) -> nvmlDevice_t {
    (HANDLE_BASE + host * 16) as nvmlDevice_t
}

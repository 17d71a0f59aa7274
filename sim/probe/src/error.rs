//! The probe's errors: each prints as one line naming the library, entry point or call and
//! the driver's status name.

use gpuslice_cuda_ffi::CUresult;

/// Why the probe stopped.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("cannot load {lib}: {detail}")]
    Load { lib: String, detail: String },
    #[error("{lib} does not export {symbol}; a CUDA driver of 11.3 or later is needed for --resolve {mode}")]
    NoEntry {
        lib: String,
        symbol: String,
        mode: &'static str,
    },
    #[error("cannot resolve {name} for CUDA version {version} through {how}: {detail}")]
    Resolve {
        name: String,
        version: i32,
        how: String,
        detail: String,
    },
    #[error("{call} failed: {}", name(*code))]
    Cuda { call: &'static str, code: CUresult },
    #[error("{0}")]
    Usage(String),
    #[error("NVML: {0}")]
    Nvml(String),
}

/// The C name of a status, or its number.
pub fn name(code: CUresult) -> String {
    code.name()
        .map(str::to_string)
        .unwrap_or_else(|| format!("CUresult({})", code.0))
}

impl ProbeError {
    /// Process exit status: 2 when the driver cannot be loaded, 3 when it cannot be
    /// initialised, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            ProbeError::Load { .. } | ProbeError::NoEntry { .. } => 2,
            ProbeError::Cuda { call: "cuInit", .. } => 3,
            _ => 1,
        }
    }
}

/// Turns a status into a result, naming the call.
pub fn check(call: &'static str, code: CUresult) -> Result<(), ProbeError> {
    if code.is_success() {
        Ok(())
    } else {
        Err(ProbeError::Cuda { call, code })
    }
}

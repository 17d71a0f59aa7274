//! `CUresult`, the status every driver entry point returns, with the names and descriptions
//! the real `cuGetErrorName` / `cuGetErrorString` give, so logs and probe output read the same
//! on the simulated and the real driver.

use std::ffi::CStr;
use std::fmt;

/// A CUDA driver status code (`enum cudaError_enum`, an `int`-sized C enum).
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CUresult(pub u32);

macro_rules! results {
    ($($name:ident = $value:expr, $desc:expr;)*) => {
        $(
            #[doc = $desc]
            pub const $name: CUresult = CUresult($value);
        )*
        /// Every code this crate knows: (code, name, description), NUL-terminated strings.
        const TABLE: &[(CUresult, &CStr, &CStr)] = &[
            $((
                $name,
                match CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                    Ok(s) => s,
                    Err(_) => panic!("name is NUL-terminated"),
                },
                match CStr::from_bytes_with_nul(concat!($desc, "\0").as_bytes()) {
                    Ok(s) => s,
                    Err(_) => panic!("description is NUL-terminated"),
                },
            ),)*
        ];
    };
}

results! {
    CUDA_SUCCESS = 0, "no error";
    CUDA_ERROR_INVALID_VALUE = 1, "invalid argument";
    CUDA_ERROR_OUT_OF_MEMORY = 2, "out of memory";
    CUDA_ERROR_NOT_INITIALIZED = 3, "initialization error";
    CUDA_ERROR_DEINITIALIZED = 4, "driver shutting down";
    CUDA_ERROR_PROFILER_DISABLED = 5, "profiler disabled while using external profiling tool";
    CUDA_ERROR_STUB_LIBRARY = 34, "CUDA driver is a stub library";
    CUDA_ERROR_DEVICE_UNAVAILABLE = 46, "CUDA-capable device(s) is/are busy or unavailable";
    CUDA_ERROR_NO_DEVICE = 100, "no CUDA-capable device is detected";
    CUDA_ERROR_INVALID_DEVICE = 101, "invalid device ordinal";
    CUDA_ERROR_DEVICE_NOT_LICENSED = 102, "device doesn't have valid Grid license";
    CUDA_ERROR_INVALID_IMAGE = 200, "device kernel image is invalid";
    CUDA_ERROR_INVALID_CONTEXT = 201, "invalid device context";
    CUDA_ERROR_CONTEXT_ALREADY_CURRENT = 202, "context already current";
    CUDA_ERROR_MAP_FAILED = 205, "mapping of buffer object failed";
    CUDA_ERROR_UNMAP_FAILED = 206, "unmapping of buffer object failed";
    CUDA_ERROR_ARRAY_IS_MAPPED = 207, "array is mapped";
    CUDA_ERROR_ALREADY_MAPPED = 208, "resource already mapped";
    CUDA_ERROR_NO_BINARY_FOR_GPU = 209, "no kernel image is available for execution on the device";
    CUDA_ERROR_ALREADY_ACQUIRED = 210, "resource already acquired";
    CUDA_ERROR_NOT_MAPPED = 211, "resource not mapped";
    CUDA_ERROR_NOT_MAPPED_AS_ARRAY = 212, "resource not mapped as array";
    CUDA_ERROR_NOT_MAPPED_AS_POINTER = 213, "resource not mapped as pointer";
    CUDA_ERROR_ECC_UNCORRECTABLE = 214, "uncorrectable ECC error encountered";
    CUDA_ERROR_UNSUPPORTED_LIMIT = 215, "limit is not supported on this architecture";
    CUDA_ERROR_CONTEXT_ALREADY_IN_USE = 216, "exclusive-thread device already in use by a different thread";
    CUDA_ERROR_PEER_ACCESS_UNSUPPORTED = 217, "peer access is not supported between these two devices";
    CUDA_ERROR_INVALID_PTX = 218, "a PTX JIT compilation failed";
    CUDA_ERROR_INVALID_GRAPHICS_CONTEXT = 219, "invalid OpenGL or DirectX context";
    CUDA_ERROR_NVLINK_UNCORRECTABLE = 220, "uncorrectable NVLink error detected during the execution";
    CUDA_ERROR_JIT_COMPILER_NOT_FOUND = 221, "PTX JIT compiler library not found";
    CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222, "the provided PTX was compiled with an unsupported toolchain.";
    CUDA_ERROR_JIT_COMPILATION_DISABLED = 223, "PTX JIT compilation was disabled";
    CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY = 224, "the provided execution affinity is not supported by the device";
    CUDA_ERROR_INVALID_SOURCE = 300, "device kernel image is invalid";
    CUDA_ERROR_FILE_NOT_FOUND = 301, "file not found";
    CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND = 302, "shared object symbol not found";
    CUDA_ERROR_SHARED_OBJECT_INIT_FAILED = 303, "shared object initialization failed";
    CUDA_ERROR_OPERATING_SYSTEM = 304, "OS call failed or operation not supported on this OS";
    CUDA_ERROR_INVALID_HANDLE = 400, "invalid resource handle";
    CUDA_ERROR_ILLEGAL_STATE = 401, "the operation cannot be performed in the present state";
    CUDA_ERROR_LOSSY_QUERY = 402, "attempted introspection would be semantically lossy";
    CUDA_ERROR_NOT_FOUND = 500, "named symbol not found";
    CUDA_ERROR_NOT_READY = 600, "device not ready";
    CUDA_ERROR_ILLEGAL_ADDRESS = 700, "an illegal memory access was encountered";
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701, "too many resources requested for launch";
    CUDA_ERROR_LAUNCH_TIMEOUT = 702, "the launch timed out and was terminated";
    CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING = 703, "launch uses incompatible texturing mode";
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704, "peer access is already enabled";
    CUDA_ERROR_PEER_ACCESS_NOT_ENABLED = 705, "peer access has not been enabled";
    CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE = 708, "cannot set while device is active in this process";
    CUDA_ERROR_CONTEXT_IS_DESTROYED = 709, "context is destroyed";
    CUDA_ERROR_ASSERT = 710, "device-side assert triggered";
    CUDA_ERROR_TOO_MANY_PEERS = 711, "peer mapping resources exhausted";
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712, "part or all of the requested memory range is already mapped";
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713, "pointer does not correspond to a registered memory region";
    CUDA_ERROR_HARDWARE_STACK_ERROR = 714, "hardware stack error";
    CUDA_ERROR_ILLEGAL_INSTRUCTION = 715, "an illegal instruction was encountered";
    CUDA_ERROR_MISALIGNED_ADDRESS = 716, "misaligned address";
    CUDA_ERROR_INVALID_ADDRESS_SPACE = 717, "operation not supported on global/shared address space";
    CUDA_ERROR_INVALID_PC = 718, "invalid program counter";
    CUDA_ERROR_LAUNCH_FAILED = 719, "unspecified launch failure";
    CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE = 720, "too many blocks in cooperative launch";
    CUDA_ERROR_NOT_PERMITTED = 800, "operation not permitted";
    CUDA_ERROR_NOT_SUPPORTED = 801, "operation not supported";
    CUDA_ERROR_SYSTEM_NOT_READY = 802, "system not yet initialized";
    CUDA_ERROR_SYSTEM_DRIVER_MISMATCH = 803, "system has unsupported display driver / cuda driver combination";
    CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE = 804, "forward compatibility was attempted on non supported HW";
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900, "operation not permitted when stream is capturing";
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901, "operation failed due to a previous error during capture";
    CUDA_ERROR_STREAM_CAPTURE_MERGE = 902, "operation would result in a merge of separate capture sequences";
    CUDA_ERROR_STREAM_CAPTURE_UNMATCHED = 903, "capture was not ended in the same stream as it began";
    CUDA_ERROR_STREAM_CAPTURE_UNJOINED = 904, "capturing stream has unjoined work";
    CUDA_ERROR_STREAM_CAPTURE_ISOLATION = 905, "dependency created on uncaptured work in another stream";
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906, "operation would make the legacy stream depend on a capturing blocking stream";
    CUDA_ERROR_CAPTURED_EVENT = 907, "operation not permitted on an event last recorded in a capturing stream";
    CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908, "attempt to terminate a thread-local capture sequence from another thread";
    CUDA_ERROR_TIMEOUT = 909, "wait operation timed out";
    CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE = 910, "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update";
    CUDA_ERROR_UNKNOWN = 999, "unknown error";
}

impl CUresult {
    /// True for `CUDA_SUCCESS`.
    pub fn is_success(self) -> bool {
        self == CUDA_SUCCESS
    }

    /// `Ok(())` for `CUDA_SUCCESS`, else `Err(self)`: lets callers use `?`.
    pub fn ok(self) -> Result<(), CUresult> {
        if self.is_success() {
            Ok(())
        } else {
            Err(self)
        }
    }

    /// The C name (`"CUDA_ERROR_OUT_OF_MEMORY"`), or `None` for a code this crate does not know.
    pub fn name(self) -> Option<&'static str> {
        self.name_cstr().and_then(|s| s.to_str().ok())
    }

    /// The name as a NUL-terminated string, what `cuGetErrorName` hands out.
    pub fn name_cstr(self) -> Option<&'static CStr> {
        TABLE
            .iter()
            .find(|(c, _, _)| *c == self)
            .map(|(_, n, _)| *n)
    }

    /// The description (`"out of memory"`), what `cuGetErrorString` hands out.
    pub fn description_cstr(self) -> Option<&'static CStr> {
        TABLE
            .iter()
            .find(|(c, _, _)| *c == self)
            .map(|(_, _, d)| *d)
    }

    /// The description as `&str`, or `None` for an unknown code.
    pub fn description(self) -> Option<&'static str> {
        self.description_cstr().and_then(|s| s.to_str().ok())
    }

    /// Looks a code up by its C name.
    pub fn from_name(name: &str) -> Option<CUresult> {
        TABLE
            .iter()
            .find(|(_, n, _)| n.to_bytes() == name.as_bytes())
            .map(|(c, _, _)| *c)
    }
}

impl fmt::Debug for CUresult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "CUresult({})", self.0),
        }
    }
}

impl fmt::Display for CUresult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.name(), self.description()) {
            (Some(n), Some(d)) => write!(f, "{n} ({d})"),
            _ => write!(f, "unrecognized CUresult {}", self.0),
        }
    }
}

impl std::error::Error for CUresult {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_codes_round_trip() {
        assert_eq!(
            CUDA_ERROR_OUT_OF_MEMORY.name(),
            Some("CUDA_ERROR_OUT_OF_MEMORY")
        );
        assert_eq!(
            CUresult::from_name("CUDA_ERROR_NOT_FOUND"),
            Some(CUDA_ERROR_NOT_FOUND)
        );
        assert_eq!(CUDA_ERROR_NOT_FOUND.0, 500);
        assert_eq!(CUresult(12345).name(), None);
        assert_eq!(format!("{:?}", CUresult(12345)), "CUresult(12345)");
        assert_eq!(
            CUDA_ERROR_INVALID_VALUE.description(),
            Some("invalid argument")
        );
        for (code, name, _) in TABLE {
            assert_eq!(
                CUresult::from_name(name.to_str().unwrap()),
                Some(*code),
                "duplicate {name:?}"
            );
        }
    }

    #[test]
    fn ok_maps_success_only() {
        assert_eq!(CUDA_SUCCESS.ok(), Ok(()));
        assert_eq!(CUDA_ERROR_NOT_READY.ok(), Err(CUDA_ERROR_NOT_READY));
    }
}

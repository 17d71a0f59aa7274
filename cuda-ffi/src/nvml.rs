//! NVML declarations for the subset gpuslice implements (simulated `libnvidia-ml.so.1`) and
//! intercepts (the shim's memory figures): return codes with `nvmlErrorString` texts, the
//! structs with their real layouts, and function-pointer types named `PFN_<symbol>`.

use std::ffi::{c_char, c_uint, c_ulonglong, CStr};

/// NVML status (`nvmlReturn_t`, an `int`-sized C enum).
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct nvmlReturn_t(pub u32);

macro_rules! nvml_returns {
    ($($name:ident = $value:expr, $desc:expr;)*) => {
        $(
            #[doc = $desc]
            pub const $name: nvmlReturn_t = nvmlReturn_t($value);
        )*
        const NVML_TABLE: &[(nvmlReturn_t, &str, &CStr)] = &[
            $((
                $name,
                stringify!($name),
                match CStr::from_bytes_with_nul(concat!($desc, "\0").as_bytes()) {
                    Ok(s) => s,
                    Err(_) => panic!("description is NUL-terminated"),
                },
            ),)*
        ];
    };
}

nvml_returns! {
    NVML_SUCCESS = 0, "Success";
    NVML_ERROR_UNINITIALIZED = 1, "Uninitialized";
    NVML_ERROR_INVALID_ARGUMENT = 2, "Invalid Argument";
    NVML_ERROR_NOT_SUPPORTED = 3, "Not Supported";
    NVML_ERROR_NO_PERMISSION = 4, "Insufficient Permissions";
    NVML_ERROR_ALREADY_INITIALIZED = 5, "Already Initialized";
    NVML_ERROR_NOT_FOUND = 6, "Not Found";
    NVML_ERROR_INSUFFICIENT_SIZE = 7, "Insufficient Size";
    NVML_ERROR_INSUFFICIENT_POWER = 8, "Insufficient External Power";
    NVML_ERROR_DRIVER_NOT_LOADED = 9, "Driver Not Loaded";
    NVML_ERROR_TIMEOUT = 10, "Timeout";
    NVML_ERROR_IRQ_ISSUE = 11, "Interrupt Request Issue";
    NVML_ERROR_LIBRARY_NOT_FOUND = 12, "NVML Shared Library Not Found";
    NVML_ERROR_FUNCTION_NOT_FOUND = 13, "Function Not Found";
    NVML_ERROR_CORRUPTED_INFOROM = 14, "Corrupted infoROM";
    NVML_ERROR_GPU_IS_LOST = 15, "GPU is lost";
    NVML_ERROR_RESET_REQUIRED = 16, "GPU requires restart";
    NVML_ERROR_OPERATING_SYSTEM = 17, "The operating system has blocked the request";
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18, "RM has detected an NVML/RM version mismatch";
    NVML_ERROR_IN_USE = 19, "In use by another client";
    NVML_ERROR_MEMORY = 20, "Insufficient Memory";
    NVML_ERROR_NO_DATA = 21, "No data";
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23, "Insufficient resources";
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25, "Structure version mismatch";
    NVML_ERROR_DEPRECATED = 26, "Deprecated";
    NVML_ERROR_NOT_READY = 27, "Not ready";
    NVML_ERROR_GPU_NOT_FOUND = 28, "GPU not found";
    NVML_ERROR_INVALID_STATE = 29, "Invalid state";
    NVML_ERROR_UNKNOWN = 999, "Unknown Error";
}

impl nvmlReturn_t {
    /// The C name, or `None` for an unknown code.
    pub fn name(self) -> Option<&'static str> {
        NVML_TABLE
            .iter()
            .find(|(c, _, _)| *c == self)
            .map(|(_, n, _)| *n)
    }

    /// What `nvmlErrorString` returns for this code.
    pub fn description_cstr(self) -> &'static CStr {
        NVML_TABLE
            .iter()
            .find(|(c, _, _)| *c == self)
            .map(|(_, _, d)| *d)
            .unwrap_or(c"Unknown Error")
    }
}

/// Opaque NVML device.
#[repr(C)]
pub struct nvmlDevice_st {
    _private: [u8; 0],
}
/// A device handle.
pub type nvmlDevice_t = *mut nvmlDevice_st;

/// `nvmlInitWithFlags` flags.
pub const NVML_INIT_FLAG_NO_GPUS: c_uint = 1;
pub const NVML_INIT_FLAG_NO_ATTACH: c_uint = 2;

pub const NVML_DEVICE_NAME_BUFFER_SIZE: usize = 64;
pub const NVML_DEVICE_NAME_V2_BUFFER_SIZE: usize = 96;
pub const NVML_DEVICE_UUID_BUFFER_SIZE: usize = 80;
pub const NVML_DEVICE_UUID_V2_BUFFER_SIZE: usize = 96;
pub const NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE: usize = 80;
pub const NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE: usize = 32;
pub const NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE: usize = 16;

/// `nvmlMemory_t` (v1): bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct nvmlMemory_t {
    pub total: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2_t`: bytes; `reserved` is memory the driver and firmware keep.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct nvmlMemory_v2_t {
    pub version: c_uint,
    pub total: c_ulonglong,
    pub reserved: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2`: the version a caller must put in `nvmlMemory_v2_t::version`
/// (`NVML_STRUCT_VERSION(Memory, 2)`).
pub const nvmlMemory_v2: c_uint = std::mem::size_of::<nvmlMemory_v2_t>() as c_uint | (2 << 24);

/// `nvmlProcessInfo_t` as taken by `nvmlDeviceGetComputeRunningProcesses_v3` (the v2 struct
/// layout: pid, used memory, GPU and compute instance ids).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct nvmlProcessInfo_t {
    pub pid: c_uint,
    pub usedGpuMemory: c_ulonglong,
    pub gpuInstanceId: c_uint,
    pub computeInstanceId: c_uint,
}

/// `nvmlProcessInfo_v1_t`, taken by the unversioned `nvmlDeviceGetComputeRunningProcesses`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct nvmlProcessInfo_v1_t {
    pub pid: c_uint,
    pub usedGpuMemory: c_ulonglong,
}

/// `nvmlProcessUtilizationSample_t`: one process's utilisation (percent) over the sample
/// period ending at `timeStamp` (µs).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct nvmlProcessUtilizationSample_t {
    pub pid: c_uint,
    pub timeStamp: c_ulonglong,
    pub smUtil: c_uint,
    pub memUtil: c_uint,
    pub encUtil: c_uint,
    pub decUtil: c_uint,
}

/// `nvmlTemperatureSensors_t`: the GPU die.
pub const NVML_TEMPERATURE_GPU: c_uint = 0;
/// `nvmlClockType_t` values.
pub const NVML_CLOCK_GRAPHICS: c_uint = 0;
pub const NVML_CLOCK_SM: c_uint = 1;
pub const NVML_CLOCK_MEM: c_uint = 2;
pub const NVML_CLOCK_VIDEO: c_uint = 3;
/// `nvmlEnableState_t`.
pub const NVML_FEATURE_DISABLED: c_uint = 0;
pub const NVML_FEATURE_ENABLED: c_uint = 1;
/// `nvmlComputeMode_t`: `NVML_COMPUTEMODE_DEFAULT`.
pub const NVML_COMPUTEMODE_DEFAULT: c_uint = 0;
/// `NVML_DEVICE_SERIAL_BUFFER_SIZE`.
pub const NVML_DEVICE_SERIAL_BUFFER_SIZE: usize = 30;

/// `NVML_VALUE_NOT_AVAILABLE` for `usedGpuMemory` (and `0xFFFFFFFF` for instance ids).
pub const NVML_VALUE_NOT_AVAILABLE: c_ulonglong = c_ulonglong::MAX;

/// `nvmlUtilization_t`: percent of the last sample period.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct nvmlUtilization_t {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// `nvmlPciInfo_t` (the layout `nvmlDeviceGetPciInfo_v3` fills).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct nvmlPciInfo_t {
    pub busIdLegacy: [c_char; NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pciDeviceId: c_uint,
    pub pciSubSystemId: c_uint,
    pub busId: [c_char; NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE],
}

impl Default for nvmlPciInfo_t {
    fn default() -> Self {
        nvmlPciInfo_t {
            busIdLegacy: [0; NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE],
            domain: 0,
            bus: 0,
            device: 0,
            pciDeviceId: 0,
            pciSubSystemId: 0,
            busId: [0; NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE],
        }
    }
}

macro_rules! nvml_pfns {
    ($($name:ident ( $($arg:ty),* $(,)? );)*) => {$(
        #[doc = concat!("Signature of the exported symbol named after `PFN_`: `", stringify!($name), "`.")]
        pub type $name = unsafe extern "C" fn($($arg),*) -> nvmlReturn_t;
    )*};
}

nvml_pfns! {
    PFN_nvmlInit_v2();
    PFN_nvmlInitWithFlags(c_uint);
    PFN_nvmlShutdown();
    PFN_nvmlSystemGetDriverVersion(*mut c_char, c_uint);
    PFN_nvmlSystemGetCudaDriverVersion(*mut i32);
    PFN_nvmlSystemGetCudaDriverVersion_v2(*mut i32);
    PFN_nvmlDeviceGetCount_v2(*mut c_uint);
    PFN_nvmlDeviceGetHandleByIndex_v2(c_uint, *mut nvmlDevice_t);
    PFN_nvmlDeviceGetHandleByUUID(*const c_char, *mut nvmlDevice_t);
    PFN_nvmlDeviceGetHandleByPciBusId_v2(*const c_char, *mut nvmlDevice_t);
    PFN_nvmlDeviceGetIndex(nvmlDevice_t, *mut c_uint);
    PFN_nvmlDeviceGetName(nvmlDevice_t, *mut c_char, c_uint);
    PFN_nvmlDeviceGetUUID(nvmlDevice_t, *mut c_char, c_uint);
    PFN_nvmlDeviceGetMinorNumber(nvmlDevice_t, *mut c_uint);
    PFN_nvmlDeviceGetPciInfo_v3(nvmlDevice_t, *mut nvmlPciInfo_t);
    PFN_nvmlDeviceGetMemoryInfo(nvmlDevice_t, *mut nvmlMemory_t);
    PFN_nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t, *mut nvmlMemory_v2_t);
    PFN_nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t, *mut c_uint, *mut nvmlProcessInfo_t);
    PFN_nvmlDeviceGetUtilizationRates(nvmlDevice_t, *mut nvmlUtilization_t);
    PFN_nvmlDeviceGetNumaNodeId(nvmlDevice_t, *mut c_uint);
}

/// `nvmlErrorString` returns a string, not a status.
pub type PFN_nvmlErrorString = unsafe extern "C" fn(nvmlReturn_t) -> *const c_char;

/// Opaque event set.
#[repr(C)]
pub struct nvmlEventSet_st {
    _private: [u8; 0],
}
pub type nvmlEventSet_t = *mut nvmlEventSet_st;

/// `nvmlEventTypeXidCriticalError`: an XID; `eventData` is the XID.
pub const nvmlEventTypeXidCriticalError: c_ulonglong = 0x8;

/// An event, as `nvmlEventSetWait_v2` fills it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct nvmlEventData_t {
    pub device: nvmlDevice_t,
    pub eventType: c_ulonglong,
    pub eventData: c_ulonglong,
    pub gpuInstanceId: c_uint,
    pub computeInstanceId: c_uint,
}

/// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`: what the GPU needs after an error
/// (`NVML_GPU_RECOVERY_ACTION_*`).
pub const NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: c_uint = 230;
pub const NVML_GPU_RECOVERY_ACTION_NONE: c_uint = 0;
pub const NVML_GPU_RECOVERY_ACTION_GPU_RESET: c_uint = 1;
/// `NVML_VALUE_TYPE_UNSIGNED_INT`.
pub const NVML_VALUE_TYPE_UNSIGNED_INT: c_uint = 1;

/// One field of `nvmlDeviceGetFieldValues`; the value is a union of 8 bytes, read per
/// `valueType`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct nvmlFieldValue_t {
    pub fieldId: c_uint,
    pub scopeId: c_uint,
    pub timestamp: i64,
    pub latencyUsec: i64,
    pub valueType: c_uint,
    pub nvmlReturn: nvmlReturn_t,
    pub value: u64,
}

/// NVML's process lists: `nvmlDevice*RunningProcesses` with the v1 entry layout (the
/// unversioned names) and with the v2 layout (`_v2` and `_v3`; cuda-ffi's
/// `nvmlProcessInfo_t`).
pub type PFN_nvmlProcesses_v1 =
    unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut nvmlProcessInfo_v1_t) -> nvmlReturn_t;
pub type PFN_nvmlProcesses_v2 =
    unsafe extern "C" fn(nvmlDevice_t, *mut c_uint, *mut nvmlProcessInfo_t) -> nvmlReturn_t;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layouts_match_nvml_h() {
        assert_eq!(size_of::<nvmlMemory_t>(), 24);
        assert_eq!(size_of::<nvmlMemory_v2_t>(), 40);
        assert_eq!(nvmlMemory_v2, 40 | (2 << 24));
        assert_eq!(size_of::<nvmlProcessInfo_t>(), 24);
        assert_eq!(size_of::<nvmlUtilization_t>(), 8);
        assert_eq!(size_of::<nvmlProcessInfo_v1_t>(), 16);
        assert_eq!(size_of::<nvmlProcessUtilizationSample_t>(), 32);
        assert_eq!(size_of::<nvmlPciInfo_t>(), 68);
        assert_eq!(offset_of!(nvmlPciInfo_t, busId), 36);
        assert_eq!(size_of::<nvmlEventData_t>(), 32);
        assert_eq!(size_of::<nvmlFieldValue_t>(), 40);
        assert_eq!(offset_of!(nvmlFieldValue_t, value), 32);
    }

    #[test]
    fn error_strings() {
        assert_eq!(
            NVML_ERROR_INSUFFICIENT_SIZE.description_cstr(),
            c"Insufficient Size"
        );
        assert_eq!(nvmlReturn_t(4242).description_cstr(), c"Unknown Error");
        assert_eq!(NVML_ERROR_NOT_FOUND.name(), Some("NVML_ERROR_NOT_FOUND"));
    }
}

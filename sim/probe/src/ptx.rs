//! The probe's kernel, `gpuslice_spin(u64 cycles)`: spins on `%clock64` until `cycles` SM
//! clocks have passed. PTX for `sm_52`, so any driver JIT-compiles it for its GPU; the
//! simulated driver recognises it by name and models its duration as cycles / clock rate.

/// NUL-terminated PTX text, as `cuModuleLoadData` takes it.
pub const SPIN_PTX: &[u8] = b"\
.version 6.0
.target sm_52
.address_size 64

.visible .entry gpuslice_spin(
    .param .u64 gpuslice_spin_param_0
)
{
    .reg .pred %p<2>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [gpuslice_spin_param_0];
    mov.u64 %rd2, %clock64;
$L_spin:
    mov.u64 %rd3, %clock64;
    sub.s64 %rd4, %rd3, %rd2;
    setp.lt.u64 %p1, %rd4, %rd1;
    @%p1 bra $L_spin;
    ret;
}
\0";

/// The kernel's name.
pub const SPIN_NAME: &std::ffi::CStr = c"gpuslice_spin";

#[cfg(test)]
mod tests {
    #[test]
    fn ptx_is_one_c_string_with_the_entry() {
        let text = std::ffi::CStr::from_bytes_with_nul(super::SPIN_PTX)
            .unwrap()
            .to_str()
            .unwrap();
        assert!(text.contains(".entry gpuslice_spin("));
        assert!(text.contains("%clock64"));
    }
}

//! CUDA arrays and mipmapped arrays: charged at width × height × depth × channels × element
//! size (each mip level halving the extents), owned by the current context.

use std::ffi::c_uint;

use gpuslice_cuda_ffi::*;

use crate::driver::{driver, handle, id_of, Charge, Driver};
use crate::guard::{get, guard, put, CuResult};

/// Bytes of an array of the given extents (0 height or depth means 1), or
/// `CUDA_ERROR_INVALID_VALUE` for an unknown format, channel count or overflow.
pub fn array_bytes(
    width: usize,
    height: usize,
    depth: usize,
    format: CUarray_format,
    channels: c_uint,
) -> CuResult<u64> {
    let elem = array_format_bytes(format).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if width == 0 || !matches!(channels, 1 | 2 | 4) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    [width.max(1), height.max(1), depth.max(1)]
        .iter()
        .try_fold(elem * u64::from(channels), |acc, n| {
            acc.checked_mul(*n as u64)
        })
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

fn create(d: &Driver, bytes: u64, mipmap: bool) -> CuResult<u64> {
    let mut o = d.objects();
    let ctx = o.current()?;
    let ord = o.contexts[&ctx].ordinal;
    d.charge(ord, bytes)?;
    let id = o.new_id();
    let charge = Charge {
        ctx,
        ordinal: ord,
        bytes,
    };
    if mipmap {
        o.mipmaps.insert(id, charge);
    } else {
        o.arrays.insert(id, charge);
    }
    Ok(id)
}

#[no_mangle]
pub unsafe extern "C" fn cuArrayCreate_v2(
    out: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR,
) -> CUresult {
    guard(|| {
        let d = driver()?;
        let a = get(desc)?;
        let bytes = array_bytes(a.Width, a.Height, 1, a.Format, a.NumChannels)?;
        if out.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        put(out, handle(create(d, bytes, false)?))
    })
}

fn bytes_3d(a: &CUDA_ARRAY3D_DESCRIPTOR) -> CuResult<u64> {
    if a.Flags & CUDA_ARRAY3D_CUBEMAP != 0 && a.Flags & CUDA_ARRAY3D_LAYERED == 0 && a.Depth != 6 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    array_bytes(a.Width, a.Height, a.Depth, a.Format, a.NumChannels)
}

#[no_mangle]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    out: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
) -> CUresult {
    guard(|| {
        let d = driver()?;
        let bytes = bytes_3d(&get(desc)?)?;
        if out.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        put(out, handle(create(d, bytes, false)?))
    })
}

fn destroy(arrays: bool, id: u64) -> CuResult {
    let d = driver()?;
    let mut o = d.objects();
    let map = if arrays {
        &mut o.arrays
    } else {
        &mut o.mipmaps
    };
    let c = map.remove(&id).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    d.uncharge(c.ordinal, c.bytes);
    o.free_id(id);
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuArrayDestroy(array: CUarray) -> CUresult {
    guard(|| destroy(true, id_of(array)))
}

/// Bytes of all `levels` levels of a mipmapped array.
pub fn mipmap_bytes(a: &CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint) -> CuResult<u64> {
    if levels == 0 || levels > 32 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let layered = a.Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP) != 0;
    let mut total = 0u64;
    for l in 0..levels {
        let shrink = |n: usize| if n == 0 { 0 } else { (n >> l).max(1) };
        let depth = if layered { a.Depth } else { shrink(a.Depth) };
        let level = CUDA_ARRAY3D_DESCRIPTOR {
            Width: shrink(a.Width),
            Height: shrink(a.Height),
            Depth: depth,
            ..*a
        };
        total = total
            .checked_add(bytes_3d(&level)?)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    }
    Ok(total)
}

#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    out: *mut CUmipmappedArray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    levels: c_uint,
) -> CUresult {
    guard(|| {
        let d = driver()?;
        let bytes = mipmap_bytes(&get(desc)?, levels)?;
        if out.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        put(out, handle(create(d, bytes, true)?))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(array: CUmipmappedArray) -> CUresult {
    guard(|| destroy(false, id_of(array)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(array_bytes(1024, 0, 0, CU_AD_FORMAT_FLOAT, 4), Ok(16384));
        assert_eq!(
            array_bytes(16, 16, 2, CU_AD_FORMAT_UNSIGNED_INT8, 1),
            Ok(512)
        );
        assert_eq!(
            array_bytes(16, 16, 2, CU_AD_FORMAT_UNSIGNED_INT8, 3),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(
            array_bytes(usize::MAX, 2, 0, CU_AD_FORMAT_FLOAT, 1),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        let desc = CUDA_ARRAY3D_DESCRIPTOR {
            Width: 8,
            Height: 8,
            Depth: 0,
            Format: CU_AD_FORMAT_FLOAT,
            NumChannels: 1,
            Flags: 0,
        };
        // 8x8 + 4x4 + 2x2 + 1x1 floats.
        assert_eq!(mipmap_bytes(&desc, 4), Ok((64 + 16 + 4 + 1) * 4));
    }
}

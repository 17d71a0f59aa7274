//! Bytes a CUDA array, mipmapped array or pitched allocation takes, computed from its
//! descriptor before the driver is asked, so it can be charged (and refused) up front.

use gpuslice_cuda_ffi::*;

/// Channel size for formats cuda-ffi does not know: 4 bytes, the widest standard channel,
/// so an unknown format is never undercounted below what a 32-bit channel would take.
const UNKNOWN_CHANNEL_BYTES: u64 = 4;

/// Row alignment the driver rounds pitched allocations to (an upper bound on current GPUs).
pub const PITCH_ALIGN: u64 = 512;

fn element_bytes(format: CUarray_format, channels: u32) -> u64 {
    array_format_bytes(format).unwrap_or(UNKNOWN_CHANNEL_BYTES) * u64::from(channels.max(1))
}

/// A 1D/2D array (`cuArrayCreate_v2`).
pub fn array_bytes(d: &CUDA_ARRAY_DESCRIPTOR) -> u64 {
    (d.Width as u64)
        .saturating_mul((d.Height as u64).max(1))
        .saturating_mul(element_bytes(d.Format, d.NumChannels))
}

/// A 1D/2D/3D, layered or cubemap array (`cuArray3DCreate_v2`): layers and the six faces
/// are counted by `Depth`, as the driver requires.
pub fn array3d_bytes(d: &CUDA_ARRAY3D_DESCRIPTOR) -> u64 {
    (d.Width as u64)
        .saturating_mul((d.Height as u64).max(1))
        .saturating_mul((d.Depth as u64).max(1))
        .saturating_mul(element_bytes(d.Format, d.NumChannels))
}

/// A mipmapped array of `levels` levels: each level halves width, height and (unless the
/// array is layered or a cubemap, whose depth counts layers) depth, never below 1.
pub fn mipmapped_bytes(d: &CUDA_ARRAY3D_DESCRIPTOR, levels: u32) -> u64 {
    let layered = d.Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP) != 0;
    let mut total = 0u64;
    for l in 0..levels.clamp(1, 64) {
        let shrink = |v: usize| if v == 0 { 0 } else { (v >> l).max(1) };
        let level = CUDA_ARRAY3D_DESCRIPTOR {
            Width: shrink(d.Width),
            Height: shrink(d.Height),
            Depth: if layered { d.Depth } else { shrink(d.Depth) },
            ..*d
        };
        total = total.saturating_add(array3d_bytes(&level));
    }
    total
}

/// Upper-bound estimate of a pitched allocation before the driver chose the pitch.
pub fn pitch_estimate(width_bytes: u64, height: u64) -> u64 {
    width_bytes
        .div_ceil(PITCH_ALIGN)
        .saturating_mul(PITCH_ALIGN)
        .saturating_mul(height.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d3(w: usize, h: usize, d: usize, flags: u32) -> CUDA_ARRAY3D_DESCRIPTOR {
        CUDA_ARRAY3D_DESCRIPTOR {
            Width: w,
            Height: h,
            Depth: d,
            Format: CU_AD_FORMAT_FLOAT,
            NumChannels: 4,
            Flags: flags,
        }
    }

    #[test]
    fn arrays_count_every_element() {
        let a = CUDA_ARRAY_DESCRIPTOR {
            Width: 1024,
            Height: 0,
            Format: CU_AD_FORMAT_HALF,
            NumChannels: 2,
        };
        assert_eq!(array_bytes(&a), 1024 * 2 * 2, "a 1D array has height 0");
        let b = CUDA_ARRAY_DESCRIPTOR { Height: 10, ..a };
        assert_eq!(array_bytes(&b), 1024 * 10 * 4);
        assert_eq!(array3d_bytes(&d3(64, 64, 8, 0)), 64 * 64 * 8 * 16);
        assert_eq!(
            array3d_bytes(&d3(64, 64, 6, CUDA_ARRAY3D_CUBEMAP)),
            64 * 64 * 6 * 16
        );
        let odd = CUDA_ARRAY_DESCRIPTOR {
            Width: 3,
            Height: 1,
            Format: 0x77,
            NumChannels: 1,
        };
        assert_eq!(
            array_bytes(&odd),
            12,
            "unknown formats count 4 bytes a channel"
        );
    }

    #[test]
    fn mip_levels_halve_but_layers_stay() {
        // 8x8x8, 4 levels: 512 + 64 + 8 + 1 texels.
        assert_eq!(mipmapped_bytes(&d3(8, 8, 8, 0), 4), (512 + 64 + 8 + 1) * 16);
        // Layered 8x8 with 3 layers, 2 levels: (64 + 16) * 3 texels.
        assert_eq!(
            mipmapped_bytes(&d3(8, 8, 3, CUDA_ARRAY3D_LAYERED), 2),
            80 * 3 * 16
        );
        assert_eq!(
            mipmapped_bytes(&d3(usize::MAX, usize::MAX, 1, 0), 2),
            u64::MAX,
            "saturates"
        );
    }

    #[test]
    fn pitch_rounds_rows_up() {
        assert_eq!(pitch_estimate(1, 10), 5120);
        assert_eq!(pitch_estimate(512, 2), 1024);
        assert_eq!(pitch_estimate(513, 1), 1024);
    }
}

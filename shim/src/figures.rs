//! The memory figures a slice reports (CUDA and NVML alike): total is the limit clamped to
//! the physical size, used is the slice's use, free is what is left of the limit clamped
//! to what is physically free. Never negative, always `free + used <= total`.

/// What to report for one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Figures {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// Figures for a slice with `limit` and `used` bytes on a device the driver says has
/// `phys_total` bytes, `phys_free` of them free.
pub fn figures(limit: u64, used: u64, phys_total: u64, phys_free: u64) -> Figures {
    let total = limit.min(phys_total);
    let used = used.min(total);
    let free = (total - used).min(phys_free);
    Figures { total, free, used }
}

/// The figures of the slice's device `idx` (reclaiming dead processes' memory first), or
/// all zero for a device the slice does not include. A damaged usage file reports the
/// whole limit as used (nothing free), as allocations are refused then.
pub fn for_slice(
    slice: &crate::state::Slice,
    idx: Option<usize>,
    phys_total: u64,
    phys_free: u64,
) -> Figures {
    match idx.and_then(|i| slice.device(i).map(|d| (i, d.memory_limit))) {
        Some((i, limit)) => {
            if slice.usage.intact().is_err() {
                return figures(limit, u64::MAX, phys_total, phys_free);
            }
            slice.usage.reclaim_dead();
            let used = slice.usage.used(i).max(slice.usage.reserved_here(i));
            figures(limit, used, phys_total, phys_free)
        }
        None => Figures {
            total: 0,
            free: 0,
            used: 0,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn limit_below_physical() {
        assert_eq!(
            figures(4 * GIB, GIB, 80 * GIB, 70 * GIB),
            Figures {
                total: 4 * GIB,
                free: 3 * GIB,
                used: GIB
            }
        );
    }

    #[test]
    fn clamped_to_physical_and_never_negative() {
        // Limit above the device: total is the device; others' use shrinks free further.
        assert_eq!(
            figures(100 * GIB, 10 * GIB, 80 * GIB, 5 * GIB),
            Figures {
                total: 80 * GIB,
                free: 5 * GIB,
                used: 10 * GIB
            }
        );
        // Used above total (limit larger than the device): free is zero, not negative.
        let f = figures(100 * GIB, 90 * GIB, 80 * GIB, 0);
        assert_eq!((f.free, f.used), (0, 80 * GIB));
        assert!(f.free + f.used <= f.total);
    }
}

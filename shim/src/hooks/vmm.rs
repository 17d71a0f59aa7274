//! Virtual memory management: physical memory is charged when `cuMemCreate` makes it and
//! given back only when the driver frees it, which is when its handle is released and every
//! mapping of it is unmapped (a program may release the handle right after mapping it; the
//! memory lives on until the last unmap). The shim keeps the driver's reference count of
//! each handle it charged: creation and every `cuMemRetainAllocationHandle` count one,
//! every mapping one (of an address range, `cuMemMap`, or of a sparse array's tile,
//! `cuMemMapArrayAsync`); `cuMemRelease`, `cuMemUnmap`, the array unmaps that cover a mapped
//! box whole and the destruction of a mapped array take them away.
//! A reference is counted before the driver takes it and taken back if the driver refuses,
//! so a release on another thread meanwhile never finds the count at its last reference
//! while the driver holds another. Reserving address space allocates nothing.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_uint, c_ulonglong, c_void};

use gpuslice_cuda_ffi::*;

use crate::account::{self, Entry, Kind};
use crate::forksafe::ForkSafe;
use crate::guard::guard;
use crate::state;

#[derive(Default)]
struct Refs {
    /// References the driver holds on each charged handle (handle, mapping or retain).
    count: HashMap<CUmemGenericAllocationHandle, u64>,
    /// Mappings made through the shim: start address → (size, handle).
    maps: BTreeMap<CUdeviceptr, (u64, CUmemGenericAllocationHandle)>,
    /// Sparse array tiles mapped through the shim: array → (tile, handle).
    tiles: HashMap<usize, Vec<(Tile, CUmemGenericAllocationHandle)>>,
}

/// The part of a sparse array a `cuMemMapArrayAsync` entry maps or unmaps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tile {
    /// A box of one level and layer: offset and extent in x, y, z.
    Level {
        level: u32,
        layer: u32,
        at: [u32; 3],
        extent: [u32; 3],
    },
    /// A range of a layer's mip tail.
    MipTail { layer: u32, offset: u64, size: u64 },
}

impl Tile {
    fn of(info: &CUarrayMapInfo) -> Option<Tile> {
        let w = info.subresource;
        let word = |i: usize| -> u32 {
            let b = w[i / 2].to_ne_bytes();
            let at = (i % 2) * 4;
            u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
        };
        match info.subresourceType {
            CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL => Some(Tile::Level {
                level: word(0),
                layer: word(1),
                at: [word(2), word(3), word(4)],
                extent: [word(5), word(6), word(7)],
            }),
            CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_MIPTAIL => Some(Tile::MipTail {
                layer: word(0),
                offset: w[1],
                size: w[2],
            }),
            _ => None,
        }
    }

    /// Whether unmapping `self` takes away all of mapping `other` (the same level and
    /// layer, or mip tail layer, and every tile of `other` inside `self`).
    fn covers(&self, other: &Tile) -> bool {
        let within = |a: u64, alen: u64, b: u64, blen: u64| {
            a <= b && b.saturating_add(blen) <= a.saturating_add(alen)
        };
        match (self, other) {
            (
                Tile::Level {
                    level,
                    layer,
                    at,
                    extent,
                },
                Tile::Level {
                    level: l2,
                    layer: y2,
                    at: at2,
                    extent: e2,
                },
            ) => {
                level == l2
                    && layer == y2
                    && (0..3).all(|i| {
                        within(at[i].into(), extent[i].into(), at2[i].into(), e2[i].into())
                    })
            }
            (
                Tile::MipTail {
                    layer,
                    offset,
                    size,
                },
                Tile::MipTail {
                    layer: y2,
                    offset: o2,
                    size: s2,
                },
            ) => layer == y2 && within(*offset, *size, *o2, *s2),
            _ => false,
        }
    }
}

static REFS: ForkSafe<Refs> = ForkSafe::new(Refs::default);

/// One more reference on `handle`, if it is charged (then `true`).
fn add_ref(refs: &mut Refs, handle: CUmemGenericAllocationHandle) -> bool {
    match refs.count.get_mut(&handle) {
        Some(n) => {
            *n = n.saturating_add(1);
            true
        }
        None => false,
    }
}

/// Takes back references counted for the driver before it refused to take them: a handle
/// whose last reference that was (released on another thread meanwhile, so the driver has
/// freed it) is given back.
fn unref(handles: &[CUmemGenericAllocationHandle]) {
    let last: Vec<CUmemGenericAllocationHandle> = {
        let mut refs = REFS.lock();
        handles
            .iter()
            .copied()
            .filter(|h| drop_ref(&mut refs, *h) == Some(true))
            .collect()
    };
    settle(CUDA_SUCCESS, take_charges(&last));
}

/// One reference less on `handle`: `Some(true)` when it was the last (the driver frees the
/// memory), `None` when the handle is not charged.
fn drop_ref(refs: &mut Refs, handle: CUmemGenericAllocationHandle) -> Option<bool> {
    let n = refs.count.get_mut(&handle)?;
    if *n > 1 {
        *n -= 1;
        return Some(false);
    }
    refs.count.remove(&handle);
    Some(true)
}

/// Takes the charges of `handles`, whose last reference is going, out of the table before
/// the driver frees them (see [`account::free_with`]: a `cuMemCreate` that gets the same
/// handle right after keeps its own charge).
fn take_charges(handles: &[CUmemGenericAllocationHandle]) -> Vec<(u64, Entry)> {
    handles
        .iter()
        .filter_map(|h| account::take(Kind::Vmm, *h).map(|e| (*h, e)))
        .collect()
}

/// Gives the taken charges back (the driver freed) or restores them (it refused).
fn settle(r: CUresult, taken: Vec<(u64, Entry)>) {
    if r == CUDA_SUCCESS {
        let gone: Vec<Entry> = taken.into_iter().map(|(_, e)| e).collect();
        account::release_all(&gone);
    } else {
        for (h, e) in taken {
            account::restore(Kind::Vmm, h, e);
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: c_ulonglong,
) -> CUresult {
    guard("cuMemCreate", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMemCreate);
        if prop.is_null() || handle.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let (slice, devices) = tri!(state::ready());
        // SAFETY: checked non-null; the caller owns a valid CUmemAllocationProp.
        let location = unsafe { (*prop).location };
        let t = if location.type_ == CU_MEM_LOCATION_TYPE_DEVICE {
            tri!(account::target_on(devices, location.id))
        } else {
            tri!(account::target_current(devices))
        };
        account::allocate(slice, t, Kind::Vmm, size as u64, || {
            // SAFETY: the caller's arguments; handle read only after success.
            let r = unsafe { f(handle, size, prop, flags) };
            if r == CUDA_SUCCESS {
                // SAFETY: the call succeeded, so the driver wrote the output.
                let h = unsafe { *handle };
                REFS.lock().count.insert(h, 1);
                Ok(h)
            } else {
                Err(r)
            }
        })
    })
}

/// `cuMemRelease(handle)`: the handle's own reference goes; with the last one its charge
/// leaves the table before the driver frees it.
fn release_with(handle: CUmemGenericAllocationHandle, call: impl FnOnce() -> CUresult) -> CUresult {
    let dropped = drop_ref(&mut REFS.lock(), handle);
    let one = [handle];
    let last = if dropped == Some(true) { &one[..] } else { &[] };
    let taken = take_charges(last);
    let r = call();
    if r != CUDA_SUCCESS && dropped.is_some() {
        // Refused: the reference is still held.
        *REFS.lock().count.entry(handle).or_insert(0) += 1;
    }
    settle(r, taken);
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    guard("cuMemRelease", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMemRelease);
        // SAFETY: the caller's argument.
        release_with(handle, || unsafe { f(handle) })
    })
}

/// `cuMemRetainAllocationHandle(addr)`: one more reference on the handle mapped at `addr`,
/// counted before the driver retains it; `call` returns the driver's status and the handle
/// it wrote.
fn retain_with(
    addr: CUdeviceptr,
    call: impl FnOnce() -> (CUresult, Option<CUmemGenericAllocationHandle>),
) -> CUresult {
    let counted = {
        let mut refs = REFS.lock();
        let mapped = refs
            .maps
            .range(..=addr)
            .next_back()
            .filter(|(start, (len, _))| addr < start.saturating_add(*len))
            .map(|(_, (_, h))| *h);
        mapped.filter(|h| add_ref(&mut refs, *h))
    };
    let (r, handle) = call();
    match (r == CUDA_SUCCESS, handle, counted) {
        (true, Some(h), Some(c)) if h == c => {}
        (true, Some(h), _) => {
            // A mapping the shim did not see made: counted now.
            add_ref(&mut REFS.lock(), h);
            unref(counted.as_slice());
        }
        _ => unref(counted.as_slice()),
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut CUmemGenericAllocationHandle,
    addr: *mut c_void,
) -> CUresult {
    guard("cuMemRetainAllocationHandle", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMemRetainAllocationHandle);
        retain_with(addr as CUdeviceptr, || {
            // SAFETY: the caller's arguments.
            let r = unsafe { f(handle, addr) };
            // SAFETY: read only after success, when the driver wrote it (checked non-null).
            let h = (r == CUDA_SUCCESS && !handle.is_null()).then(|| unsafe { *handle });
            (r, h)
        })
    })
}

/// `cuMemMap(ptr, size, handle)`: the mapping holds one more reference on `handle`, counted
/// before the driver maps.
fn map_with(
    ptr: CUdeviceptr,
    size: u64,
    handle: CUmemGenericAllocationHandle,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    if !add_ref(&mut REFS.lock(), handle) {
        return call();
    }
    let r = call();
    if r == CUDA_SUCCESS {
        REFS.lock().maps.insert(ptr, (size, handle));
    } else {
        unref(&[handle]);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: c_ulonglong,
) -> CUresult {
    guard("cuMemMap", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMemMap);
        // SAFETY: the caller's arguments.
        map_with(ptr, size as u64, handle, || unsafe {
            f(ptr, size, offset, handle, flags)
        })
    })
}

/// `cuMemUnmap(ptr, size)`: every mapping that starts inside the range goes, and with it its
/// reference; they leave the table before the driver is asked.
fn unmap_with(ptr: CUdeviceptr, size: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    let end = ptr.saturating_add(size);
    let (removed, last) = {
        let mut refs = REFS.lock();
        let starts: Vec<CUdeviceptr> = refs.maps.range(ptr..end).map(|(s, _)| *s).collect();
        let (mut removed, mut last) = (Vec::new(), Vec::new());
        for s in starts {
            if let Some((len, h)) = refs.maps.remove(&s) {
                removed.push((s, len, h));
                if drop_ref(&mut refs, h) == Some(true) {
                    last.push(h);
                }
            }
        }
        (removed, last)
    };
    let taken = take_charges(&last);
    let r = call();
    if r != CUDA_SUCCESS {
        let mut refs = REFS.lock();
        for (s, len, h) in removed {
            refs.maps.insert(s, (len, h));
            *refs.count.entry(h).or_insert(0) += 1;
        }
    }
    settle(r, taken);
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    guard("cuMemUnmap", CUDA_ERROR_UNKNOWN, || {
        let f = real!(cuMemUnmap);
        // SAFETY: the caller's arguments.
        unmap_with(ptr, size as u64, || unsafe { f(ptr, size) })
    })
}

/// `cuMemMapArrayAsync`: each map entry of a generic handle holds one more reference on it
/// (counted before the driver is asked), each unmap entry takes away those of the mapped
/// boxes it covers whole (taken out first); the entries apply in order. Refused, everything
/// is put back. An unmap of part of a mapped box leaves the mapping and its reference: the
/// rest of the box still holds the memory, and boxes unmapped piece by piece stay charged
/// until the array is destroyed (an overcharge, never a bypass). The references follow the
/// call, not the stream: an unmap still queued behind other work gives its handle's charge
/// back when enqueued.
fn map_array_with(infos: &[CUarrayMapInfo], call: impl FnOnce() -> CUresult) -> CUresult {
    type Mapped = (usize, Tile, CUmemGenericAllocationHandle);
    let (added, removed, last) = {
        let mut refs = REFS.lock();
        let (mut added, mut removed, mut last): (Vec<Mapped>, Vec<Mapped>, Vec<_>) =
            Default::default();
        for info in infos {
            let (array, Some(tile)) = (info.resource as usize, Tile::of(info)) else {
                continue;
            };
            match info.memOperationType {
                CU_MEM_OPERATION_TYPE_MAP
                    if info.memHandleType == CU_MEM_HANDLE_TYPE_GENERIC
                        && add_ref(&mut refs, info.memHandle) =>
                {
                    refs.tiles
                        .entry(array)
                        .or_default()
                        .push((tile, info.memHandle));
                    added.push((array, tile, info.memHandle));
                }
                CU_MEM_OPERATION_TYPE_UNMAP => {
                    let gone: Vec<(Tile, CUmemGenericAllocationHandle)> =
                        match refs.tiles.get_mut(&array) {
                            Some(mapped) => {
                                let (gone, kept): (Vec<_>, Vec<_>) =
                                    mapped.drain(..).partition(|(t, _)| tile.covers(t));
                                if kept.is_empty() {
                                    refs.tiles.remove(&array);
                                } else {
                                    *mapped = kept;
                                }
                                gone
                            }
                            None => Vec::new(),
                        };
                    for (t, h) in gone {
                        if drop_ref(&mut refs, h) == Some(true) {
                            last.push(h);
                        }
                        removed.push((array, t, h));
                    }
                }
                _ => {}
            }
        }
        (added, removed, last)
    };
    let taken = take_charges(&last);
    let r = call();
    if r != CUDA_SUCCESS {
        {
            let mut refs = REFS.lock();
            // Undone in reverse: a tile the batch mapped and then unmapped is put back
            // before it is taken out, so it ends neither recorded nor counted.
            for (array, tile, h) in removed {
                refs.tiles.entry(array).or_default().push((tile, h));
                *refs.count.entry(h).or_insert(0) += 1;
            }
            for (array, tile, h) in &added {
                if let Some(mapped) = refs.tiles.get_mut(array) {
                    if let Some(i) = mapped.iter().position(|m| *m == (*tile, *h)) {
                        mapped.remove(i);
                    }
                    if mapped.is_empty() {
                        refs.tiles.remove(array);
                    }
                }
            }
        }
        settle(r, taken);
        let handles: Vec<CUmemGenericAllocationHandle> = added.iter().map(|m| m.2).collect();
        unref(&handles);
    } else {
        settle(r, taken);
    }
    r
}

/// `cuArrayDestroy` / `cuMipmappedArrayDestroy` of `array`: its tile mappings die with it,
/// and with them their references (taken out before the driver is asked, put back if it
/// refuses); `call` is the driver's destroy.
pub fn array_destroy_with(array: usize, call: impl FnOnce() -> CUresult) -> CUresult {
    let (gone, last) = {
        let mut refs = REFS.lock();
        let gone = refs.tiles.remove(&array).unwrap_or_default();
        let last: Vec<CUmemGenericAllocationHandle> = gone
            .iter()
            .filter(|(_, h)| drop_ref(&mut refs, *h) == Some(true))
            .map(|(_, h)| *h)
            .collect();
        (gone, last)
    };
    if gone.is_empty() {
        return call();
    }
    let taken = take_charges(&last);
    let r = call();
    if r != CUDA_SUCCESS {
        let mut refs = REFS.lock();
        for (_, h) in &gone {
            *refs.count.entry(*h).or_insert(0) += 1;
        }
        refs.tiles.entry(array).or_default().extend(gone);
    }
    settle(r, taken);
    r
}

macro_rules! map_array {
    ($name:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            list: *mut CUarrayMapInfo,
            count: c_uint,
            stream: CUstream,
        ) -> CUresult {
            guard(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let f = real!($name);
                // SAFETY: the caller's arguments.
                let call = || unsafe { f(list, count, stream) };
                if list.is_null() || count == 0 {
                    return call();
                }
                // SAFETY: the caller passes `count` entries at `list` (checked non-null), as
                // the driver reads them; only read here.
                let infos = unsafe { std::slice::from_raw_parts(list, count as usize) };
                map_array_with(infos, call)
            })
        }
    };
}
map_array!(cuMemMapArrayAsync);
map_array!(cuMemMapArrayAsync_ptsz);

/// For the child after `fork`.
pub fn reset_in_child() {
    REFS.reset_in_child();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::account::Target;

    #[test]
    fn a_handle_the_driver_reuses_during_a_release_stays_charged() {
        let h: CUmemGenericAllocationHandle = 0x5150;
        let t = Target { idx: 0, ctx: 1 };
        account::record(Kind::Vmm, h, t, 100);
        REFS.lock().count.insert(h, 1);
        let dropped = drop_ref(&mut REFS.lock(), h);
        assert_eq!(dropped, Some(true));
        let taken = take_charges(&[h]);
        // The driver freed the handle; another thread's cuMemCreate gets it back at once.
        account::record(Kind::Vmm, h, t, 200);
        settle(CUDA_SUCCESS, taken);
        assert_eq!(account::charged(Kind::Vmm, h).map(|e| e.bytes), Some(200));
    }

    /// A handle made by `cuMemCreate` (one reference) and charged `bytes`.
    fn created(h: CUmemGenericAllocationHandle, bytes: u64) {
        account::record(Kind::Vmm, h, Target { idx: 0, ctx: 1 }, bytes);
        REFS.lock().count.insert(h, 1);
    }

    #[test]
    fn a_release_while_the_driver_maps_leaves_the_mapping_charged() {
        let h: CUmemGenericAllocationHandle = 0x6150;
        created(h, 100);
        // The driver has mapped (its count is 2) when another thread releases the handle,
        // before this cuMemMap returns: the mapping keeps the memory, so it stays charged.
        let r = map_with(0x9000_0000, 100, h, || {
            assert_eq!(release_with(h, || CUDA_SUCCESS), CUDA_SUCCESS);
            CUDA_SUCCESS
        });
        assert_eq!(r, CUDA_SUCCESS);
        assert_eq!(account::charged(Kind::Vmm, h).map(|e| e.bytes), Some(100));
        assert_eq!(unmap_with(0x9000_0000, 100, || CUDA_SUCCESS), CUDA_SUCCESS);
        assert!(
            account::charged(Kind::Vmm, h).is_none(),
            "the last unmap frees it"
        );
    }

    #[test]
    fn a_refused_map_takes_its_reference_back() {
        let h: CUmemGenericAllocationHandle = 0x6250;
        created(h, 100);
        let r = map_with(0x9100_0000, 100, h, || CUDA_ERROR_INVALID_VALUE);
        assert_eq!(r, CUDA_ERROR_INVALID_VALUE);
        assert_eq!(release_with(h, || CUDA_SUCCESS), CUDA_SUCCESS);
        assert!(account::charged(Kind::Vmm, h).is_none());
        assert!(!REFS.lock().maps.contains_key(&0x9100_0000));
    }

    #[test]
    fn a_release_and_unmap_while_the_driver_retains_leave_the_retained_handle_charged() {
        let h: CUmemGenericAllocationHandle = 0x6350;
        created(h, 100);
        assert_eq!(map_with(0x9200_0000, 100, h, || CUDA_SUCCESS), CUDA_SUCCESS);
        // The driver has retained (its count is 3) when other threads release the handle and
        // unmap it: the retained reference keeps the memory, so it stays charged.
        let r = retain_with(0x9200_0010, || {
            assert_eq!(release_with(h, || CUDA_SUCCESS), CUDA_SUCCESS);
            assert_eq!(unmap_with(0x9200_0000, 100, || CUDA_SUCCESS), CUDA_SUCCESS);
            (CUDA_SUCCESS, Some(h))
        });
        assert_eq!(r, CUDA_SUCCESS);
        assert_eq!(account::charged(Kind::Vmm, h).map(|e| e.bytes), Some(100));
        assert_eq!(release_with(h, || CUDA_SUCCESS), CUDA_SUCCESS);
        assert!(account::charged(Kind::Vmm, h).is_none());
    }

    /// A `cuMemMapArrayAsync` entry for `op` of a `width`×64 box at (`x`, 0, 0) of level 0.
    fn tile_op(
        array: usize,
        op: c_uint,
        x: u32,
        width: u32,
        h: CUmemGenericAllocationHandle,
    ) -> CUarrayMapInfo {
        let words = |lo: u32, hi: u32| {
            u64::from_ne_bytes({
                let mut b = [0u8; 8];
                b[..4].copy_from_slice(&lo.to_ne_bytes());
                b[4..].copy_from_slice(&hi.to_ne_bytes());
                b
            })
        };
        CUarrayMapInfo {
            resourceType: 0,
            resource: array as *mut c_void,
            subresourceType: CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL,
            subresource: [words(0, 0), words(x, 0), words(0, width), words(64, 1)],
            memOperationType: op,
            memHandleType: CU_MEM_HANDLE_TYPE_GENERIC,
            memHandle: if op == CU_MEM_OPERATION_TYPE_MAP {
                h
            } else {
                0
            },
            offset: 0,
            deviceBitMask: 1,
            flags: 0,
            reserved: [0; 2],
        }
    }

    #[test]
    fn a_sparse_array_tile_mapping_keeps_its_handle_charged_until_unmapped() {
        let (array, h): (usize, CUmemGenericAllocationHandle) = (0xa400, 0x6450);
        created(h, 100);
        let map = [tile_op(array, CU_MEM_OPERATION_TYPE_MAP, 0, 64, h)];
        // A release on another thread while the driver maps the tile: the tile keeps it.
        let r = map_array_with(&map, || {
            assert_eq!(release_with(h, || CUDA_SUCCESS), CUDA_SUCCESS);
            CUDA_SUCCESS
        });
        assert_eq!(r, CUDA_SUCCESS);
        assert_eq!(account::charged(Kind::Vmm, h).map(|e| e.bytes), Some(100));
        // An unmap of a box elsewhere leaves it, and so does one of part of it.
        let away = [tile_op(array, CU_MEM_OPERATION_TYPE_UNMAP, 64, 64, 0)];
        assert_eq!(map_array_with(&away, || CUDA_SUCCESS), CUDA_SUCCESS);
        assert!(account::charged(Kind::Vmm, h).is_some());
        let part = [tile_op(array, CU_MEM_OPERATION_TYPE_UNMAP, 32, 64, 0)];
        assert_eq!(map_array_with(&part, || CUDA_SUCCESS), CUDA_SUCCESS);
        assert_eq!(account::charged(Kind::Vmm, h).map(|e| e.bytes), Some(100));
        // A refused unmap of a box covering it leaves it too; an accepted one frees it.
        let over = [tile_op(array, CU_MEM_OPERATION_TYPE_UNMAP, 0, 128, 0)];
        let refused = map_array_with(&over, || CUDA_ERROR_INVALID_VALUE);
        assert_eq!(refused, CUDA_ERROR_INVALID_VALUE);
        assert_eq!(account::charged(Kind::Vmm, h).map(|e| e.bytes), Some(100));
        assert_eq!(map_array_with(&over, || CUDA_SUCCESS), CUDA_SUCCESS);
        assert!(
            account::charged(Kind::Vmm, h).is_none(),
            "the last reference went"
        );
        assert!(
            !REFS.lock().tiles.contains_key(&array),
            "an array with no tiles left is forgotten"
        );
    }

    #[test]
    fn unmapping_part_of_a_mapped_box_keeps_its_handle_charged() {
        let (array, h): (usize, CUmemGenericAllocationHandle) = (0xa500, 0x6550);
        created(h, 100);
        let map = [tile_op(array, CU_MEM_OPERATION_TYPE_MAP, 0, 128, h)];
        assert_eq!(map_array_with(&map, || CUDA_SUCCESS), CUDA_SUCCESS);
        assert_eq!(release_with(h, || CUDA_SUCCESS), CUDA_SUCCESS);
        // The other half of the box still holds the memory.
        let half = [tile_op(array, CU_MEM_OPERATION_TYPE_UNMAP, 0, 64, 0)];
        assert_eq!(map_array_with(&half, || CUDA_SUCCESS), CUDA_SUCCESS);
        assert_eq!(account::charged(Kind::Vmm, h).map(|e| e.bytes), Some(100));
    }

    /// A refused batch that maps a tile and then unmaps a box covering it leaves nothing of
    /// that tile: neither recorded nor counted, so the handle's own reference still decides.
    #[test]
    fn a_refused_batch_that_maps_and_unmaps_a_tile_leaves_nothing_of_it() {
        let (array, h): (usize, CUmemGenericAllocationHandle) = (0xa700, 0x6750);
        created(h, 100);
        let batch = [
            tile_op(array, CU_MEM_OPERATION_TYPE_MAP, 0, 64, h),
            tile_op(array, CU_MEM_OPERATION_TYPE_UNMAP, 0, 128, 0),
        ];
        let r = map_array_with(&batch, || CUDA_ERROR_INVALID_VALUE);
        assert_eq!(r, CUDA_ERROR_INVALID_VALUE);
        assert!(!REFS.lock().tiles.contains_key(&array), "no tile recorded");
        // The creation's reference is the only one: its release frees the charge.
        assert_eq!(release_with(h, || CUDA_SUCCESS), CUDA_SUCCESS);
        assert!(account::charged(Kind::Vmm, h).is_none());
    }

    #[test]
    fn destroying_a_sparse_array_drops_its_tile_mappings() {
        let (array, h): (usize, CUmemGenericAllocationHandle) = (0xa600, 0x6650);
        created(h, 100);
        let map = [tile_op(array, CU_MEM_OPERATION_TYPE_MAP, 0, 128, h)];
        assert_eq!(map_array_with(&map, || CUDA_SUCCESS), CUDA_SUCCESS);
        assert_eq!(release_with(h, || CUDA_SUCCESS), CUDA_SUCCESS);
        // Refused: the array and its mapping live on.
        let r = array_destroy_with(array, || CUDA_ERROR_INVALID_VALUE);
        assert_eq!(r, CUDA_ERROR_INVALID_VALUE);
        assert_eq!(account::charged(Kind::Vmm, h).map(|e| e.bytes), Some(100));
        assert_eq!(array_destroy_with(array, || CUDA_SUCCESS), CUDA_SUCCESS);
        assert!(
            account::charged(Kind::Vmm, h).is_none(),
            "its last mapping went"
        );
        assert!(!REFS.lock().tiles.contains_key(&array));
    }
}

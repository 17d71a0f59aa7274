//! A bump allocator for the short-lived processes of a container's create path
//! (`gpuslice-runtime`, the OCI hooks): each allocates about half a megabyte in a few thousand
//! blocks and exits, so the system allocator's bookkeeping is wasted work on every container.
//!
//! `Arena<true>` serves from the first allocation of the process (so even the runtime's
//! start-up allocations never touch the system allocator, whose first use maps and touches
//! several pages), until [`disable`] is called; `Arena<false>` waits for [`enable`].
//! Long-running commands (`gpuslice serve`) disable it and use the system allocator; the few
//! blocks handed out before stay valid. While on, blocks come from a fixed
//! region in `.bss` (untouched pages cost nothing); freeing the most recent block gives its
//! space back (so a growing `Vec` or `String` extends in place), any other free is a no-op,
//! and once the region is used up every allocation falls back to the system allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

/// Size of the region; a create path of 100 reservations uses about 0.5 MB of it.
pub const ARENA_SIZE: usize = 16 << 20;

#[repr(C, align(4096))]
struct Region(UnsafeCell<[u8; ARENA_SIZE]>);

// SAFETY: the bytes of the region are handed out in disjoint blocks by an atomic bump of
// `NEXT`; a block is accessed only through the pointer returned for it, so no two threads
// touch the same bytes without the program's own synchronisation.
unsafe impl Sync for Region {}

static REGION: Region = Region(UnsafeCell::new([0; ARENA_SIZE]));
/// Offset of the first free byte of the region.
static NEXT: AtomicUsize = AtomicUsize::new(0);
/// Offset up to which the region's pages have been populated (see [`populate_to`]).
static POPULATED: AtomicUsize = AtomicUsize::new(0);
/// Pages are populated this many bytes at a time.
const POPULATE_CHUNK: usize = 16 << 10;
/// 0: the type's default; 1: on; 2: off.
static STATE: AtomicU8 = AtomicU8::new(0);

/// The global allocator type; see the module comment. `ON_AT_START`: whether it serves from
/// the region before [`enable`] or [`disable`] is called.
#[derive(Debug, Clone, Copy, Default)]
pub struct Arena<const ON_AT_START: bool>;

/// Serves later allocations from the region (until it is full).
pub fn enable() {
    STATE.store(1, Ordering::Relaxed);
}

/// Serves later allocations from the system allocator.
pub fn disable() {
    STATE.store(2, Ordering::Relaxed);
}

fn on(at_start: bool) -> bool {
    match STATE.load(Ordering::Relaxed) {
        0 => at_start,
        s => s == 1,
    }
}

/// Bytes of the region handed out so far (tests, diagnostics).
pub fn used() -> usize {
    NEXT.load(Ordering::Relaxed)
}

fn base() -> usize {
    REGION.0.get() as usize
}

fn owns(ptr: *mut u8) -> bool {
    let a = ptr as usize;
    a >= base() && a < base() + ARENA_SIZE
}

/// Carves `layout` out of the region, or `None` when it does not fit.
fn bump(layout: Layout) -> Option<*mut u8> {
    let base = base();
    let mut cur = NEXT.load(Ordering::Relaxed);
    loop {
        let start = (base + cur).checked_next_multiple_of(layout.align())? - base;
        let end = start.checked_add(layout.size())?;
        if end > ARENA_SIZE {
            return None;
        }
        match NEXT.compare_exchange_weak(cur, end, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => {
                if end > POPULATED.load(Ordering::Relaxed) {
                    populate_to(end);
                }
                return Some((base + start) as *mut u8);
            }
            Err(now) => cur = now,
        }
    }
}

/// Maps the region's pages up to `end` (rounded up to a chunk) in one call instead of one
/// page fault (a trap into the kernel) per page; measured about 0.1 ms less per container on
/// the benchmark's guests (docs/benchmarks.md). Best effort: without `MADV_POPULATE_WRITE`
/// (Linux < 5.14) the pages fault in as usual.
#[cold]
fn populate_to(end: usize) {
    let from = POPULATED.load(Ordering::Relaxed);
    let to = end
        .checked_next_multiple_of(POPULATE_CHUNK)
        .map_or(ARENA_SIZE, |t| t.min(ARENA_SIZE));
    if to <= from
        || POPULATED
            .compare_exchange(from, to, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    // SAFETY: the range lies inside the region, which is mapped for the whole process;
    // populating only maps its pages, it changes no byte.
    let _ = unsafe {
        rustix::mm::madvise(
            (base() + from) as *mut std::ffi::c_void,
            to - from,
            rustix::mm::Advice::LinuxPopulateWrite,
        )
    };
}

// SAFETY: blocks are disjoint and aligned as `layout` asks (see `bump`); a block is given
// back (by moving `NEXT` down) only when it is the last one handed out, and pointers not in
// the region go to `System`, which allocated them.
unsafe impl<const ON_AT_START: bool> GlobalAlloc for Arena<ON_AT_START> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if on(ON_AT_START) {
            if let Some(p) = bump(layout) {
                return p;
            }
        }
        // SAFETY: `layout` is the caller's valid, non-zero-sized layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if owns(ptr) {
            let start = ptr as usize - base();
            // Give the space back only if this is the most recent block; otherwise leak it.
            let _ = NEXT.compare_exchange(
                start + layout.size(),
                start,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            return;
        }
        // SAFETY: not in the region, so `System` allocated it with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !owns(ptr) {
            // SAFETY: not in the region, so `System` allocated it with this layout.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        let start = ptr as usize - base();
        let end = start + layout.size();
        if new_size <= layout.size() {
            // Shrinking: give the tail back when this is the last block.
            let _ =
                NEXT.compare_exchange(end, start + new_size, Ordering::Relaxed, Ordering::Relaxed);
            return ptr;
        }
        if let Some(new_end) = start.checked_add(new_size) {
            if new_end <= ARENA_SIZE
                && NEXT
                    .compare_exchange(end, new_end, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            {
                if new_end > POPULATED.load(Ordering::Relaxed) {
                    populate_to(new_end);
                }
                return ptr; // the last block grows in place
            }
        }
        let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        // SAFETY: `new_layout` is valid and non-zero-sized (it is larger than `layout`).
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            // SAFETY: both blocks are live, distinct and at least `layout.size()` long.
            unsafe { std::ptr::copy_nonoverlapping(ptr, new, layout.size()) };
            // SAFETY: `ptr` is a live block of this allocator with `layout`.
            unsafe { self.dealloc(ptr, layout) };
        }
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The unit tests run under the system allocator; they drive an `Arena` value directly.
    // The region is process-global, so all checks live in one test.
    #[test]
    fn bump_reuse_growth_and_fallback() {
        let a = Arena::<false>;
        let l8 = Layout::from_size_align(24, 8).unwrap_or(Layout::new::<u64>());
        // Off: the system allocator serves, the region is untouched.
        // SAFETY: valid layout; the block is freed with the same layout.
        unsafe {
            let p = a.alloc(l8);
            assert!(!owns(p));
            a.dealloc(p, l8);
        }
        assert_eq!(used(), 0);
        enable();
        // SAFETY: every block below is used within its size and freed with its layout.
        unsafe {
            let p = a.alloc(l8);
            assert!(owns(p));
            assert_eq!(p as usize % 8, 0);
            p.write_bytes(7, 24);
            let q = a.alloc(Layout::from_size_align(1, 64).unwrap_or(l8));
            assert_eq!(q as usize % 64, 0);
            assert!(q as usize >= p as usize + 24, "blocks are disjoint");
            // `q` is the last block: growing it keeps its address.
            let q2 = a.realloc(q, Layout::from_size_align(1, 64).unwrap_or(l8), 4096);
            assert_eq!(q2, q);
            // Pages are populated a chunk ahead of what is handed out, in place growth too.
            let grown = a.realloc(q2, Layout::from_size_align(4096, 64).unwrap_or(l8), 100_000);
            assert_eq!(grown, q);
            let populated = POPULATED.load(Ordering::Relaxed);
            assert!(
                populated >= used() && populated.is_multiple_of(POPULATE_CHUNK),
                "{populated}"
            );
            assert!(populated < used() + POPULATE_CHUNK, "{populated}");
            grown.add(99_999).write(1);
            // `p` is not the last block: growing it moves it and keeps its bytes.
            let p2 = a.realloc(p, l8, 48);
            assert_ne!(p2, p);
            assert_eq!(std::slice::from_raw_parts(p2, 24), &[7u8; 24]);
            // Freeing the last block gives its space back.
            let before = used();
            let r = a.alloc(l8);
            assert!(used() > before);
            a.dealloc(r, l8);
            assert_eq!(used(), before, "the last block's space is given back");
            assert_eq!(a.alloc(l8), r, "and handed out again");
            a.dealloc(r, l8);
            // A block larger than what is left comes from the system allocator.
            let big = Layout::from_size_align(ARENA_SIZE, 8).unwrap_or(l8);
            let s = a.alloc(big);
            assert!(!s.is_null() && !owns(s));
            a.dealloc(s, big);
            // Off again: the system allocator serves, and blocks of the region are still
            // freed as region blocks (a no-op), not handed to the system allocator.
            let last = a.alloc(l8);
            disable();
            let t = a.alloc(l8);
            assert!(!owns(t));
            a.dealloc(t, l8);
            a.dealloc(last, l8);
            // An allocator that starts on follows the same switch once it is set.
            let u = Arena::<true>.alloc(l8);
            assert!(!owns(u));
            Arena::<true>.dealloc(u, l8);
        }
    }
}

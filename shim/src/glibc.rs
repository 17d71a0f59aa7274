//! glibc's own `dlsym` and `dlvsym`, read from the dynamic symbol table of the loaded
//! `libc.so.6` (glibc ≥ 2.34) or `libdl.so.2` (older). The shim exports both names, so asking
//! the dynamic linker for them by name (`dlsym` or `dlvsym` through the global scope, or a
//! call through the shim's own PLT) would find the shim's own exports. docs/shim.md
//! ("Entry points").

use std::ffi::{c_int, c_void, CStr};
use std::ptr::null_mut;

/// The sonames of the objects that define glibc's `dl*` functions, the glibc ≥ 2.34 layout
/// first.
const OBJECTS: [&[u8]; 2] = [b"libc.so.6", b"libdl.so.2"];

const DT_NULL: isize = 0;
const DT_HASH: isize = 4;
const DT_STRTAB: isize = 5;
const DT_SYMTAB: isize = 6;
const DT_SONAME: isize = 14;
const DT_GNU_HASH: isize = 0x6fff_fef5;
const DT_VERSYM: isize = 0x6fff_fff0;
const STT_FUNC: u8 = 2;
const SHN_UNDEF: u16 = 0;
/// `.gnu.version` flag of a non-default (`name@VERSION`, not `name@@VERSION`) definition.
const VERSYM_HIDDEN: u16 = 0x8000;

/// `ElfW(Dyn)`.
#[repr(C)]
struct Dyn {
    tag: isize,
    val: usize,
}

#[cfg(target_pointer_width = "64")]
type Sym = libc::Elf64_Sym;
#[cfg(target_pointer_width = "32")]
type Sym = libc::Elf32_Sym;

/// The address of glibc's default (`name@@VERSION`) definition of function `name`, or null
/// if no loaded `libc.so.6` or `libdl.so.2` defines it.
pub fn function(name: &CStr) -> *mut c_void {
    for object in OBJECTS {
        let mut search = Search {
            object,
            name: name.to_bytes(),
            found: null_mut(),
        };
        // SAFETY: `visit` matches dl_iterate_phdr's callback type and reads `data` only as
        // the `Search` passed here, which outlives the call.
        unsafe { libc::dl_iterate_phdr(Some(visit), (&raw mut search).cast()) };
        if !search.found.is_null() {
            return search.found;
        }
    }
    null_mut()
}

struct Search<'a> {
    /// The soname of the object to search.
    object: &'a [u8],
    name: &'a [u8],
    found: *mut c_void,
}

/// dl_iterate_phdr's callback: looks `name` up in the first loaded object whose soname is
/// `object`, then stops the iteration.
unsafe extern "C" fn visit(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: `data` is the `Search` that `function` passed, alive and not otherwise
    // borrowed during the iteration; `info` is valid for the duration of the callback and
    // describes a loaded object, whose headers and dynamic section are mapped.
    let (search, t) = unsafe { (&mut *data.cast::<Search<'_>>(), tables(&*info)) };
    let Some(t) = t else {
        return 0;
    };
    if t.soname.is_null() {
        return 0;
    }
    // SAFETY: a non-null soname points into the object's string table: NUL-terminated.
    if unsafe { CStr::from_ptr(t.soname.cast()) }.to_bytes() != search.object {
        return 0;
    }
    // SAFETY: the tables of a loaded object, as the dynamic linker uses them.
    search.found = unsafe { lookup(&t, search.name) };
    1
}

/// The tables of one loaded object's dynamic section that a symbol lookup needs.
struct Tables {
    base: usize,
    strtab: *const u8,
    soname: *const u8,
    symtab: *const Sym,
    gnu_hash: *const u32,
    hash: *const u32,
    versym: *const u16,
}

/// Looks `name` up in the dynamic symbol table of a loaded object.
///
/// # Safety
/// `t` must be the tables of a loaded object (from [`tables`]), mapped and well-formed, as
/// the dynamic linker requires.
unsafe fn lookup(t: &Tables, name: &[u8]) -> *mut c_void {
    if t.symtab.is_null() {
        return null_mut();
    }
    let mut found: *mut c_void = null_mut();
    let mut check = |index: u32| {
        // SAFETY: the hash table only holds indices of the symbol table.
        let sym = unsafe { &*t.symtab.add(index as usize) };
        if !found.is_null()
            || sym.st_shndx == SHN_UNDEF
            || sym.st_value == 0
            || sym.st_info & 0xf != STT_FUNC
        {
            return;
        }
        // SAFETY: st_name is an offset of a NUL-terminated string in the string table.
        let sym_name = unsafe { CStr::from_ptr(t.strtab.add(sym.st_name as usize).cast()) };
        if sym_name.to_bytes() != name {
            return;
        }
        if !t.versym.is_null() {
            // SAFETY: .gnu.version has one entry per symbol-table entry.
            let v = unsafe { *t.versym.add(index as usize) };
            // Index 0 is a local symbol; a hidden one is an old version kept for binaries
            // linked against it.
            if v == 0 || v & VERSYM_HIDDEN != 0 {
                return;
            }
        }
        found = (t.base + sym.st_value as usize) as *mut c_void;
    };
    if !t.gnu_hash.is_null() {
        // SAFETY: forwarded to the caller (a well-formed DT_GNU_HASH table).
        unsafe { gnu_candidates(t.gnu_hash, name, &mut check) };
    } else if !t.hash.is_null() {
        // SAFETY: forwarded to the caller (a well-formed DT_HASH table).
        unsafe { sysv_candidates(t.hash, name, &mut check) };
    }
    found
}

/// The tables of `info`'s dynamic section; `None` without one or without a string table.
///
/// # Safety
/// `info` must describe a loaded object (from dl_iterate_phdr) whose dynamic section is
/// mapped and well-formed, as the dynamic linker requires.
unsafe fn tables(info: &libc::dl_phdr_info) -> Option<Tables> {
    let base = info.dlpi_addr as usize;
    // SAFETY: dlpi_phdr points to dlpi_phnum program headers of the loaded object.
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum.into()) };
    let dynamic = phdrs.iter().find(|p| p.p_type == libc::PT_DYNAMIC)?;
    // The dynamic linker rewrites the table addresses of a writable dynamic section to run
    // time addresses and leaves a read-only one as offsets from the base: an address below
    // the base is an offset.
    let at = |v: usize| if v < base { base + v } else { v };
    let mut soname = None;
    let mut t = Tables {
        base,
        strtab: std::ptr::null(),
        soname: std::ptr::null(),
        symtab: std::ptr::null(),
        gnu_hash: std::ptr::null(),
        hash: std::ptr::null(),
        versym: std::ptr::null(),
    };
    let mut d = (base + dynamic.p_vaddr as usize) as *const Dyn;
    loop {
        // SAFETY: the dynamic section is an array of entries ending with DT_NULL.
        let entry = unsafe { &*d };
        match entry.tag {
            DT_NULL => break,
            DT_STRTAB => t.strtab = at(entry.val) as *const u8,
            DT_SONAME => soname = Some(entry.val),
            DT_SYMTAB => t.symtab = at(entry.val) as *const Sym,
            DT_GNU_HASH => t.gnu_hash = at(entry.val) as *const u32,
            DT_HASH => t.hash = at(entry.val) as *const u32,
            DT_VERSYM => t.versym = at(entry.val) as *const u16,
            _ => {}
        }
        // SAFETY: not past the DT_NULL entry, which ends the array.
        d = unsafe { d.add(1) };
    }
    if t.strtab.is_null() {
        return None;
    }
    if let Some(offset) = soname {
        // SAFETY: DT_SONAME is an offset in the string table.
        t.soname = unsafe { t.strtab.add(offset) };
    }
    Some(t)
}

/// Calls `check` with the index of every symbol in `name`'s DT_GNU_HASH chain.
///
/// # Safety
/// `table` must be a well-formed DT_GNU_HASH table of the symbol table being searched.
unsafe fn gnu_candidates(table: *const u32, name: &[u8], check: &mut impl FnMut(u32)) {
    // SAFETY: the header (nbuckets, symoffset, bloom_size, bloom_shift), the bloom filter
    // of bloom_size machine words, the buckets and the chains follow each other.
    unsafe {
        let (nbuckets, symoffset, bloom_size) = (*table, *table.add(1), *table.add(2));
        if nbuckets == 0 {
            return;
        }
        let buckets = table
            .add(4)
            .cast::<usize>()
            .add(bloom_size as usize)
            .cast::<u32>();
        let chains = buckets.add(nbuckets as usize);
        let hash = name.iter().fold(5381u32, |h, b| {
            h.wrapping_mul(33).wrapping_add(u32::from(*b))
        });
        let mut index = *buckets.add((hash % nbuckets) as usize);
        if index < symoffset {
            return;
        }
        loop {
            let entry = *chains.add((index - symoffset) as usize);
            if entry | 1 == hash | 1 {
                check(index);
            }
            if entry & 1 != 0 {
                return;
            }
            index += 1;
        }
    }
}

/// Calls `check` with the index of every symbol in `name`'s DT_HASH chain.
///
/// # Safety
/// `table` must be a well-formed DT_HASH table of the symbol table being searched.
unsafe fn sysv_candidates(table: *const u32, name: &[u8], check: &mut impl FnMut(u32)) {
    // SAFETY: the header (nbucket, nchain), then nbucket buckets and nchain chain entries.
    unsafe {
        let (nbucket, nchain) = (*table, *table.add(1));
        if nbucket == 0 {
            return;
        }
        let buckets = table.add(2);
        let chains = buckets.add(nbucket as usize);
        let hash = name.iter().fold(0u32, |h, b| {
            let h = (h << 4).wrapping_add(u32::from(*b));
            (h ^ ((h & 0xf000_0000) >> 24)) & 0x0fff_ffff
        });
        let mut index = *buckets.add((hash % nbucket) as usize);
        // A chain is at most nchain long; the bound keeps a corrupt table from looping.
        for _ in 0..nchain {
            if index == 0 || index >= nchain {
                return;
            }
            check(index);
            index = *chains.add(index as usize);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The symbol name and object file name the dynamic linker gives for address `p`
    /// (`dladdr`, which the shim does not export).
    fn describe(p: *mut c_void) -> (String, String) {
        // SAFETY: Dl_info is plain data; dladdr fills it for an address in a loaded object.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: a valid out-pointer; dladdr only reads the address.
        let known = unsafe { libc::dladdr(p, &mut info) };
        assert_ne!(known, 0, "{p:?} not in an object");
        // SAFETY: dladdr's names are NUL-terminated strings of the loaded object.
        let s = |c: *const std::ffi::c_char| unsafe { CStr::from_ptr(c) }.to_string_lossy();
        let file = s(info.dli_fname);
        let file = file.rsplit('/').next().unwrap_or_default().to_string();
        (s(info.dli_sname).into_owned(), file)
    }

    /// malloc's oldest glibc version on this architecture.
    #[cfg(target_arch = "x86_64")]
    const MALLOC_VERSION: &CStr = c"GLIBC_2.2.5";
    #[cfg(not(target_arch = "x86_64"))]
    const MALLOC_VERSION: &CStr = c"GLIBC_2.17";

    #[test]
    fn finds_the_dl_functions_in_glibc() {
        for name in [c"dlsym", c"dlvsym"] {
            let found = function(name);
            assert!(!found.is_null(), "{name:?}");
            let (sym, file) = describe(found);
            assert_eq!(sym, name.to_str().unwrap(), "{name:?}");
            assert!(
                ["libc.so.6", "libdl.so.2"].contains(&file.as_str()),
                "{file}"
            );
        }
        let malloc = libc::malloc as *mut c_void;
        assert_eq!(function(c"malloc"), malloc);
        // The dlvsym found is glibc's: it answers a versioned lookup.
        let dlvsym = function(c"dlvsym");
        // SAFETY: glibc's dlvsym (checked above), called with constant C strings.
        let found = unsafe {
            std::mem::transmute::<*mut c_void, crate::real::DlvsymFn>(dlvsym)(
                libc::RTLD_DEFAULT,
                c"malloc".as_ptr(),
                MALLOC_VERSION.as_ptr(),
            )
        };
        assert_eq!(found, malloc);
    }

    #[test]
    fn absent_names_are_null() {
        assert!(function(c"gpuslice_no_such_function").is_null());
        // A variable, not a function.
        assert!(function(c"environ").is_null());
    }
}

//! Reader for glibc's `/etc/ld.so.cache`, so driver libraries are found under a driver root
//! exactly where the dynamic loader of that root would find them.
//!
//! Format (glibc `dl-cache.h`): an optional old `ld.so-1.7.0` section, then the new
//! `glibc-ld.so.cache1.1` header, `nlibs` 24-byte entries (flags, key, value, osversion,
//! hwcap) and a string table; string offsets are relative to the new header.

use std::path::{Path, PathBuf};

const OLD_MAGIC: &[u8] = b"ld.so-1.7.0";
const NEW_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
const FLAG_TYPE_MASK: i32 = 0x00ff;
const FLAG_ELF_LIBC6: i32 = 0x0003;
const FLAG_REQUIRED_MASK: i32 = 0xff00;
const FLAG_X8664_LIB64: i32 = 0x0300;

/// One cache entry: a soname and the path the loader opens for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheEntry {
    /// e.g. `libcuda.so.1`.
    pub soname: String,
    /// Absolute path inside the root, e.g. `/usr/lib/x86_64-linux-gnu/libcuda.so.1`.
    pub path: PathBuf,
}

/// A cache file that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum LdCacheError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a glibc ld.so.cache (no `glibc-ld.so.cache1.1` header)")]
    Format { path: PathBuf },
    #[error("{path} is truncated or corrupt at byte {offset}")]
    Corrupt { path: PathBuf, offset: usize },
}

fn u32_at(data: &[u8], off: usize) -> Option<u32> {
    data.get(off..off + 4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn cstr_at(data: &[u8], off: usize) -> Option<&str> {
    let rest = data.get(off..)?;
    let end = rest.iter().position(|&b| b == 0)?;
    std::str::from_utf8(&rest[..end]).ok()
}

/// Reads the x86-64 libc6 entries of a cache file.
pub fn read_ld_cache(path: &Path) -> Result<Vec<CacheEntry>, LdCacheError> {
    let data = std::fs::read(path).map_err(|source| LdCacheError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_ld_cache(&data, path)
}

/// Parses cache bytes; `path` names the file in errors.
pub fn parse_ld_cache(data: &[u8], path: &Path) -> Result<Vec<CacheEntry>, LdCacheError> {
    let corrupt = |offset| LdCacheError::Corrupt {
        path: path.to_path_buf(),
        offset,
    };
    let mut start = 0usize;
    if data.starts_with(OLD_MAGIC) {
        // Old header: magic (11 bytes, padded to 12), nlibs u32, then 12-byte entries.
        let nlibs = u32_at(data, 12).ok_or_else(|| corrupt(12))? as usize;
        start = 16usize
            .checked_add(nlibs.checked_mul(12).ok_or_else(|| corrupt(12))?)
            .ok_or_else(|| corrupt(12))?;
        // The new header is aligned like `struct cache_file_new` (8 bytes).
        start = start.div_ceil(8) * 8;
    }
    let new = data.get(start..).ok_or_else(|| corrupt(start))?;
    if !new.starts_with(NEW_MAGIC) {
        return Err(LdCacheError::Format {
            path: path.to_path_buf(),
        });
    }
    // Header: magic 20 bytes, nlibs u32, len_strings u32, flags u8 + 3 pad, extension
    // offset u32, 3 unused u32 = 48 bytes.
    let nlibs = u32_at(new, 20).ok_or_else(|| corrupt(start + 20))? as usize;
    let header = 48usize;
    let mut out = Vec::new();
    for i in 0..nlibs {
        let e = header + i * 24;
        let flags = u32_at(new, e).ok_or_else(|| corrupt(start + e))? as i32;
        let key = u32_at(new, e + 4).ok_or_else(|| corrupt(start + e + 4))? as usize;
        let value = u32_at(new, e + 8).ok_or_else(|| corrupt(start + e + 8))? as usize;
        if flags & FLAG_TYPE_MASK != FLAG_ELF_LIBC6
            || flags & FLAG_REQUIRED_MASK != FLAG_X8664_LIB64
        {
            continue;
        }
        let soname = cstr_at(new, key).ok_or_else(|| corrupt(start + key))?;
        let lib_path = cstr_at(new, value).ok_or_else(|| corrupt(start + value))?;
        out.push(CacheEntry {
            soname: soname.to_string(),
            path: PathBuf::from(lib_path),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_hosts_cache_like_ldconfig() {
        let cache = Path::new("/etc/ld.so.cache");
        if !cache.exists() {
            // Every glibc system has one; a host without it has nothing to compare.
            panic!("/etc/ld.so.cache is missing on this host");
        }
        let entries = read_ld_cache(cache).expect("parse host cache");
        let libc = entries
            .iter()
            .find(|e| e.soname == "libc.so.6")
            .expect("libc.so.6 in cache");
        assert!(libc.path.ends_with("libc.so.6"), "{:?}", libc.path);
        // Cross-check with `ldconfig -p`, the loader's own view of the same file.
        let out = std::process::Command::new("ldconfig").arg("-p").output();
        if let Ok(out) = out {
            let text = String::from_utf8_lossy(&out.stdout);
            let x86 = text
                .lines()
                .filter(|l| l.contains("x86-64") && l.contains("libc6"))
                .count();
            assert_eq!(entries.len(), x86, "entry count differs from ldconfig -p");
        }
    }

    #[test]
    fn refuses_garbage_and_truncation() {
        let p = Path::new("/root/etc/ld.so.cache");
        assert!(matches!(
            parse_ld_cache(b"nonsense", p),
            Err(LdCacheError::Format { .. })
        ));
        let mut data = NEW_MAGIC.to_vec();
        data.extend_from_slice(&5u32.to_le_bytes());
        let e = parse_ld_cache(&data, p).expect_err("truncated");
        assert!(e.to_string().contains("/root/etc/ld.so.cache"), "{e}");
    }
}

//! Shared setup of the shim's integration tests: the built artifacts (the shim, the
//! simulated driver libraries, the probe), a simulated node with a slice directory, and the
//! probe run with the shim preloaded (as `/etc/ld.so.preload` does in a container).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gpuslice_sim_core::testing::{target_profile_dir, SimFixture};
use gpuslice_slice::usage::create_usage_file;
use gpuslice_slice::{DeviceLimit, Limits};

pub const GIB: u64 = 1 << 30;

/// The build outputs the tests run.
pub struct Artifacts {
    pub shim: PathBuf,
    pub sim_cuda: PathBuf,
    pub sim_nvml: PathBuf,
    pub probe: PathBuf,
}

const BUILD: &str =
    "cargo build -p gpuslice-shim -p gpuslice-sim-cuda -p gpuslice-sim-nvml -p gpuslice-probe";

/// Locates the artifacts in `GPUSLICE_TEST_BIN_DIR` when set (scripts/test.sh: the release
/// build, `target/release`), else in this test's target profile dir; fails naming what is
/// missing.
pub fn artifacts() -> Artifacts {
    let dir = match std::env::var_os("GPUSLICE_TEST_BIN_DIR") {
        Some(d) => PathBuf::from(d),
        None => target_profile_dir().expect("target dir of the test binary"),
    };
    let need = |name: &str| {
        let p = dir.join(name);
        assert!(
            p.exists(),
            "missing {}: build it first with `{BUILD}` (same target dir and profile)",
            p.display()
        );
        p
    };
    Artifacts {
        shim: need("libgpuslice_shim.so"),
        sim_cuda: need("libgpuslice_sim_cuda.so"),
        sim_nvml: need("libgpuslice_sim_nvml.so"),
        probe: need("gpuslice-probe"),
    }
}

/// A simulated node with one slice directory.
pub struct SliceNode {
    pub art: Artifacts,
    pub sim: SimFixture,
    pub slice_dir: PathBuf,
}

impl SliceNode {
    /// A node with GPUs of `gpu_mem` bytes each and a slice with `(memory_limit, cores)`
    /// on the first `limits.len()` of them.
    pub fn new(gpus: &[u64], limits: &[(u64, u8)]) -> SliceNode {
        SliceNode::with_context_memory(gpus, limits, 0)
    }

    /// Like [`SliceNode::new`], each CUDA context costing `context_memory` bytes of device
    /// memory, as on a real GPU.
    pub fn with_context_memory(
        gpus: &[u64],
        limits: &[(u64, u8)],
        context_memory: u64,
    ) -> SliceNode {
        SliceNode::with_device_memory(gpus, limits, context_memory, 0)
    }

    /// Like [`SliceNode::new`], the driver reserving `reserved_memory` bytes of each GPU, as
    /// on a real GPU.
    pub fn with_reserved_memory(
        gpus: &[u64],
        limits: &[(u64, u8)],
        reserved_memory: u64,
    ) -> SliceNode {
        SliceNode::with_device_memory(gpus, limits, 0, reserved_memory)
    }

    fn with_device_memory(
        gpus: &[u64],
        limits: &[(u64, u8)],
        context_memory: u64,
        reserved_memory: u64,
    ) -> SliceNode {
        let art = artifacts();
        let devices = gpus
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let mut d = gpuslice_sim_core::testing::device(i as u32, "NVIDIA H200", *m);
                d.context_memory = context_memory;
                d.reserved_memory = reserved_memory;
                d
            })
            .collect();
        let sim = SimFixture::with_devices(devices);
        std::fs::copy(&art.sim_cuda, sim.lib_dir().join("libcuda.so.1")).expect("copy libcuda");
        std::fs::copy(&art.sim_nvml, sim.lib_dir().join("libnvidia-ml.so.1")).expect("copy nvml");
        let node = SliceNode {
            slice_dir: sim.dir.path().join("slice"),
            art,
            sim,
        };
        node.add_slice("slice", limits);
        node
    }

    /// Writes another slice directory `name` with limits on the first GPUs; returns it.
    pub fn add_slice(&self, name: &str, limits: &[(u64, u8)]) -> PathBuf {
        let dir = self.sim.dir.path().join(name);
        std::fs::create_dir_all(&dir).expect("slice dir");
        let devices = limits
            .iter()
            .zip(&self.sim.devices)
            .map(|((mem, cores), d)| DeviceLimit {
                uuid: d.uuid.clone(),
                memory_limit: *mem,
                cores: *cores,
            })
            .collect();
        Limits {
            version: 1,
            reservation: name.into(),
            devices,
        }
        .write(&dir.join("limits.json"))
        .expect("limits.json");
        create_usage_file(&dir.join("usage")).expect("usage");
        dir
    }

    /// The probe with the shim preloaded and `GPUSLICE_DIR` at the slice.
    pub fn probe(&self, args: &[&str]) -> Command {
        self.probe_in(&self.slice_dir, args)
    }

    pub fn probe_in(&self, slice: &Path, args: &[&str]) -> Command {
        let mut cmd = self.bare_probe(args);
        cmd.env("LD_PRELOAD", &self.art.shim)
            .env("GPUSLICE_DIR", slice);
        cmd
    }

    /// The probe without the shim.
    pub fn bare_probe(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.art.probe);
        cmd.arg("--json").args(args);
        self.sim.apply(&mut cmd);
        cmd.env_remove("GPUSLICE_DIR").env_remove("GPUSLICE_LOG");
        cmd
    }
}

/// Runs `cmd` and returns its JSON lines; panics with stderr when it fails to run.
pub fn json_lines(out: &Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON {l}: {e}")))
        .collect()
}

/// Runs the command to completion and returns its single JSON object.
pub fn run_json(mut cmd: Command) -> serde_json::Value {
    let out = cmd.output().expect("run probe");
    let lines = json_lines(&out);
    assert!(
        !lines.is_empty(),
        "no JSON from {:?}: status {}, stderr:\n{}",
        cmd,
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    lines.into_iter().next_back().unwrap()
}

pub fn u(v: &serde_json::Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} missing in {v}"))
}

/// Rewrites the 64-bit little-endian ELF shared object at `path` into one without symbol
/// versions, as a library built without version tables: its `DT_VERSYM`, `DT_VERNEED(NUM)`
/// and `DT_VERDEF(NUM)` dynamic entries become `DT_DEBUG`, which the dynamic linker ignores
/// in a library. glibc's `dlvsym` then accepts any version string for its symbols.
pub fn strip_symbol_versions(path: &Path) {
    const PT_DYNAMIC: u32 = 2;
    const DT_DEBUG: i64 = 21;
    const VERSION_TAGS: [i64; 5] = [
        0x6fff_fff0,
        0x6fff_fffc,
        0x6fff_fffd,
        0x6fff_fffe,
        0x6fff_ffff,
    ];
    let mut elf = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(
        &elf[..6],
        b"\x7fELF\x02\x01",
        "{}: not ELF64 LE",
        path.display()
    );
    let word = |elf: &[u8], at: usize, len: usize| {
        let mut b = [0u8; 8];
        b[..len].copy_from_slice(&elf[at..at + len]);
        u64::from_le_bytes(b) as usize
    };
    let (phoff, phentsize, phnum) = (
        word(&elf, 0x20, 8),
        word(&elf, 0x36, 2),
        word(&elf, 0x38, 2),
    );
    let dynamic = (0..phnum)
        .map(|i| phoff + i * phentsize)
        .find(|&ph| word(&elf, ph, 4) as u32 == PT_DYNAMIC)
        .unwrap_or_else(|| panic!("{}: no PT_DYNAMIC", path.display()));
    let (offset, size) = (word(&elf, dynamic + 8, 8), word(&elf, dynamic + 32, 8));
    let mut replaced = 0;
    for entry in (offset..offset + size).step_by(16) {
        let tag = word(&elf, entry, 8) as i64;
        if tag == 0 {
            break;
        }
        if VERSION_TAGS.contains(&tag) {
            elf[entry..entry + 8].copy_from_slice(&DT_DEBUG.to_le_bytes());
            replaced += 1;
        }
    }
    assert!(replaced > 0, "{}: no symbol versions", path.display());
    std::fs::write(path, elf).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

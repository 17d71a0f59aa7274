//! Test helpers (feature `testing`): a simulated node in a temporary directory, and the
//! simulated driver libraries built and installed under their sonames, so tests of the sim,
//! the shim and the end-to-end tier set up the same node the same way.
//!
//! Typical use:
//! ```no_run
//! # use gpuslice_sim_core::testing::*;
//! let node = SimFixture::new(&[("NVIDIA H200", 8 << 30), ("NVIDIA H200", 8 << 30)]);
//! let libs = install_sim_libs(&node.lib_dir()).unwrap(); // libcuda.so.1, libnvidia-ml.so.1
//! let mut cmd = std::process::Command::new("my-cuda-program");
//! node.apply(&mut cmd); // GPUSLICE_SIM_STATE, GPUSLICE_SIM_DEV, LD_LIBRARY_PATH
//! ```

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::devices::{simulated_pci_bus_id, write_devices, SimDevice};
use crate::paths::{SimPaths, DEV_ENV, STATE_ENV};

/// A simulated node in a temporary directory: `state/` (devices.json, shared state),
/// `dev/` (a regular file `nvidia<minor>` per visible GPU) and `lib/` for the libraries.
#[derive(Debug)]
pub struct SimFixture {
    pub dir: tempfile::TempDir,
    pub paths: SimPaths,
    pub devices: Vec<SimDevice>,
}

/// A simulated device like the ones `devices_from_config` makes.
pub fn device(index: u32, model: &str, memory: u64) -> SimDevice {
    SimDevice {
        index,
        uuid: gpuslice_config::simulated_uuid(index as usize, model),
        model: model.to_string(),
        memory,
        minor: index,
        pci_bus_id: simulated_pci_bus_id(index as usize),
        numa_node: 0,
        sm_count: 132,
        clock_khz: 1_980_000,
        context_memory: 0,
        reserved_memory: 0,
    }
}

impl SimFixture {
    /// A node with GPUs of the given (model, memory), all visible.
    pub fn new(gpus: &[(&str, u64)]) -> SimFixture {
        let devices = gpus
            .iter()
            .enumerate()
            .map(|(i, (m, mem))| device(i as u32, m, *mem))
            .collect();
        SimFixture::with_devices(devices)
    }

    /// A node with exactly these devices, all visible.
    ///
    /// # Panics
    /// When the temporary directory cannot be set up (a test environment failure).
    #[allow(clippy::expect_used)]
    pub fn with_devices(devices: Vec<SimDevice>) -> SimFixture {
        let dir = tempfile::tempdir().expect("create a temporary sim node dir");
        let paths = SimPaths {
            state_dir: dir.path().join("state"),
            dev_dir: dir.path().join("dev"),
        };
        for d in [&paths.state_dir, &paths.dev_dir, &dir.path().join("lib")] {
            std::fs::create_dir_all(d).expect("create sim node subdir");
        }
        write_devices(&paths.state_dir, &devices).expect("write devices.json");
        let node = SimFixture {
            dir,
            paths,
            devices,
        };
        for d in &node.devices {
            node.show(d.minor);
        }
        node
    }

    /// Makes GPU `minor` visible (creates `dev/nvidia<minor>`).
    #[allow(clippy::expect_used)]
    pub fn show(&self, minor: u32) {
        std::fs::write(self.paths.dev_dir.join(format!("nvidia{minor}")), b"")
            .expect("create device node file");
    }

    /// Hides GPU `minor` (removes `dev/nvidia<minor>`).
    pub fn hide(&self, minor: u32) {
        let _ = std::fs::remove_file(self.paths.dev_dir.join(format!("nvidia{minor}")));
    }

    /// Directory for the simulated libraries (`lib/`).
    pub fn lib_dir(&self) -> PathBuf {
        self.dir.path().join("lib")
    }

    /// The variables a process needs to use this node (not `LD_LIBRARY_PATH`).
    pub fn env(&self) -> Vec<(&'static str, OsString)> {
        vec![
            (STATE_ENV, self.paths.state_dir.clone().into_os_string()),
            (DEV_ENV, self.paths.dev_dir.clone().into_os_string()),
        ]
    }

    /// Sets [`SimFixture::env`] and `LD_LIBRARY_PATH=lib/` on `cmd`.
    pub fn apply(&self, cmd: &mut Command) {
        cmd.envs(self.env());
        cmd.env("LD_LIBRARY_PATH", self.lib_dir());
    }
}

/// Where the simulated libraries were installed.
#[derive(Debug, Clone)]
pub struct SimLibs {
    /// `<dir>/libcuda.so.1`.
    pub cuda: PathBuf,
    /// `<dir>/libnvidia-ml.so.1`.
    pub nvml: PathBuf,
}

/// The cargo target profile directory of the running test binary (`target/debug` when the
/// binary is `target/debug/deps/x-hash`).
pub fn target_profile_dir() -> std::io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    Ok(dir)
}

/// Builds the simulated libraries into the running test's target dir and profile (one
/// `cargo build`; nearly free when up to date) and copies them into `dir` under their
/// sonames. Set `GPUSLICE_SIM_LIB_DIR` to a directory already holding
/// `libgpuslice_sim_cuda.so` and `libgpuslice_sim_nvml.so` to skip the build.
pub fn install_sim_libs(dir: &Path) -> std::io::Result<SimLibs> {
    copy_sim_libs(&sim_lib_dir()?, dir)
}

/// The directory holding `libgpuslice_sim_cuda.so` and `libgpuslice_sim_nvml.so`:
/// `GPUSLICE_SIM_LIB_DIR` when set, else [`build_sim_libs`]'s.
pub fn sim_lib_dir() -> std::io::Result<PathBuf> {
    match std::env::var_os("GPUSLICE_SIM_LIB_DIR") {
        Some(d) => Ok(PathBuf::from(d)),
        None => build_sim_libs(),
    }
}

/// Copies `libgpuslice_sim_cuda.so` and `libgpuslice_sim_nvml.so` from `built` into `dir`
/// as `libcuda.so.1` and `libnvidia-ml.so.1`.
pub fn copy_sim_libs(built: &Path, dir: &Path) -> std::io::Result<SimLibs> {
    let libs = SimLibs {
        cuda: dir.join("libcuda.so.1"),
        nvml: dir.join("libnvidia-ml.so.1"),
    };
    std::fs::copy(built.join("libgpuslice_sim_cuda.so"), &libs.cuda)?;
    std::fs::copy(built.join("libgpuslice_sim_nvml.so"), &libs.nvml)?;
    Ok(libs)
}

/// Runs `cargo build -p gpuslice-sim-cuda -p gpuslice-sim-nvml` for the running test's target
/// dir and profile; returns the directory holding the two `.so` files.
pub fn build_sim_libs() -> std::io::Result<PathBuf> {
    let profile_dir = target_profile_dir()?;
    let profile = profile_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let target_dir = profile_dir
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args([
        "build",
        "--quiet",
        "-p",
        "gpuslice-sim-cuda",
        "-p",
        "gpuslice-sim-nvml",
        "--target-dir",
    ]);
    cmd.arg(&target_dir);
    match profile.as_str() {
        "debug" => {}
        "release" => {
            cmd.arg("--release");
        }
        other => {
            cmd.args(["--profile", other]);
        }
    }
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"));
    let status = cmd.status()?;
    if !status.success() {
        return Err(std::io::Error::other(format!(
            "building the simulated driver libraries failed: {status}"
        )));
    }
    Ok(profile_dir)
}

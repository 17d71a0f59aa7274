//! The simulated GPU node: device nodes with NVIDIA's real major numbers under
//! `state_dir/sim/dev`, the simulated driver libraries under `state_dir/sim/usr/lib/...`,
//! its `nvidia-smi` stand-in under `state_dir/sim/usr/bin`, and the simulated driver's state
//! directory — a driver root like a real one, so every
//! later path (discovery, CDI, containers) runs unchanged without a GPU.

use std::io;
use std::path::{Path, PathBuf};

use gpuslice_config::Config;

use crate::devices::{MODESET_MINOR, NVIDIACTL_MINOR, NVIDIA_MAJOR};

/// Major number the simulated node gives `nvidia-uvm` (dynamic on real nodes).
pub const SIM_UVM_MAJOR: u32 = 510;
/// Directory of the simulated driver libraries inside the sim root and in containers.
pub const SIM_LIB_DIR: &str = "usr/lib/x86_64-linux-gnu";

/// The simulated libraries: installed soname and the file names a build produces.
const SIM_LIBRARIES: &[(&str, &[&str])] = &[
    ("libcuda.so.1", &["libcuda.so.1", "libgpuslice_sim_cuda.so"]),
    (
        "libnvidia-ml.so.1",
        &["libnvidia-ml.so.1", "libgpuslice_sim_nvml.so"],
    ),
];

/// The program installed as the simulated driver's `nvidia-smi` (from the driver dirs).
const SIM_SMI_SOURCE: &str = "gpuslice-probe";

/// A simulated node that could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("cannot create {path}: {source}")]
    Create { path: PathBuf, source: io::Error },
    #[error("cannot create device node {path} ({major}:{minor}): {source}; creating device nodes needs root (CAP_MKNOD)")]
    Mknod {
        path: PathBuf,
        major: u32,
        minor: u32,
        source: io::Error,
    },
    #[error("simulated driver library {soname} not found in {searched}; build it with `cargo build --release --workspace` (or ./scripts/build.sh) or pass --sim-driver DIR")]
    MissingLibrary {
        soname: &'static str,
        searched: String,
    },
    #[error("cannot install {path}: {source}")]
    Install {
        path: PathBuf,
        source: gpuslice_fsutil::AtomicWriteError,
    },
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("cannot write the simulated devices into {path}: {detail}")]
    Devices { path: PathBuf, detail: String },
}

/// The seam for creating character device nodes (tests record calls instead).
pub trait Mknod {
    /// Creates (or replaces) a character device node with mode 0666.
    fn char_device(&self, path: &Path, major: u32, minor: u32) -> io::Result<()>;
}

/// Creates real device nodes with mknod(2).
#[derive(Debug, Default, Clone, Copy)]
pub struct RealMknod;

impl Mknod for RealMknod {
    fn char_device(&self, path: &Path, major: u32, minor: u32) -> io::Result<()> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let dev = rustix::fs::makedev(major, minor);
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if meta.file_type().is_char_device() && meta.rdev() == dev {
                return Ok(());
            }
            std::fs::remove_file(path)?;
        }
        rustix::fs::mknodat(
            rustix::fs::CWD,
            path,
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::from_raw_mode(0o666),
            dev,
        )?;
        // The umask may have narrowed the mode.
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o666))
    }
}

/// Paths of a simulated node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimLayout {
    /// The driver root: `state_dir/sim`.
    pub root: PathBuf,
    pub dev: PathBuf,
    pub lib_dir: PathBuf,
    /// The simulated driver's state (devices.json, shared device state).
    pub state: PathBuf,
}

impl SimLayout {
    pub fn of(config: &Config) -> SimLayout {
        let root = config.sim_root();
        SimLayout {
            dev: root.join("dev"),
            lib_dir: root.join(SIM_LIB_DIR),
            state: root.join("state"),
            root,
        }
    }
}

fn mkdir(path: &Path, mode: u32) -> Result<(), SimError> {
    std::fs::create_dir_all(path).map_err(|source| SimError::Create {
        path: path.to_path_buf(),
        source,
    })?;
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode)).map_err(
        |source| SimError::Create {
            path: path.to_path_buf(),
            source,
        },
    )
}

/// Directories searched for the simulated driver libraries when none is given: the
/// portable build next to the binaries (`target/portable`, which also loads in old-glibc
/// images), the binaries' own directory, then the packaged location.
pub fn default_driver_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(exe_dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.canonicalize().ok())
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        // target/release/ → target/portable; target/release/static/ (the static build) →
        // target/portable too.
        for up in exe_dir.ancestors().skip(1).take(2) {
            dirs.push(up.join("portable"));
        }
        dirs.push(exe_dir);
    }
    dirs.push(PathBuf::from("/usr/lib/gpuslice/sim"));
    dirs
}

/// Creates or refreshes the simulated node of `config`: device nodes, driver libraries
/// (from `driver_dirs`, first match wins) and the state directory. Idempotent.
pub fn setup_sim_node(
    config: &Config,
    driver_dirs: &[PathBuf],
    mknod: &dyn Mknod,
) -> Result<SimLayout, SimError> {
    let layout = SimLayout::of(config);
    mkdir(&layout.dev, 0o755)?;
    let gpus = config.inventory.simulated.len() as u32;
    let mut nodes: Vec<(String, u32, u32)> = (0..gpus)
        .map(|i| (format!("nvidia{i}"), NVIDIA_MAJOR, i))
        .collect();
    nodes.push(("nvidiactl".into(), NVIDIA_MAJOR, NVIDIACTL_MINOR));
    nodes.push(("nvidia-modeset".into(), NVIDIA_MAJOR, MODESET_MINOR));
    nodes.push(("nvidia-uvm".into(), SIM_UVM_MAJOR, 0));
    nodes.push(("nvidia-uvm-tools".into(), SIM_UVM_MAJOR, 1));
    for (name, major, minor) in &nodes {
        let path = layout.dev.join(name);
        mknod
            .char_device(&path, *major, *minor)
            .map_err(|source| SimError::Mknod {
                path: path.clone(),
                major: *major,
                minor: *minor,
                source,
            })?;
    }
    // GPUs removed from the config disappear from the node.
    if let Ok(entries) = std::fs::read_dir(&layout.dev) {
        for e in entries.filter_map(|e| e.ok()) {
            let name = e.file_name().to_string_lossy().into_owned();
            let stale = name
                .strip_prefix("nvidia")
                .and_then(|n| n.parse::<u32>().ok())
                .is_some_and(|n| n >= gpus);
            if stale {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    mkdir(&layout.lib_dir, 0o755)?;
    for (soname, candidates) in SIM_LIBRARIES {
        let source = driver_dirs
            .iter()
            .flat_map(|d| candidates.iter().map(move |c| d.join(c)))
            .find(|p| p.is_file())
            .ok_or_else(|| SimError::MissingLibrary {
                soname,
                searched: driver_dirs
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        let bytes = std::fs::read(&source).map_err(|e| SimError::Read {
            path: source.clone(),
            source: e,
        })?;
        let dest = layout.lib_dir.join(soname);
        if std::fs::read(&dest).ok().as_deref() != Some(&bytes[..]) {
            gpuslice_fsutil::atomic_write(&dest, &bytes, 0o755).map_err(|e| SimError::Install {
                path: dest.clone(),
                source: e,
            })?;
        }
    }

    // The simulated driver's `nvidia-smi`: the probe, which run under that name reads what
    // nvidia-smi reads through NVML (memory, process lists). Installed where a real driver
    // keeps it, so the create path mounts it into containers as it mounts the real one.
    // Optional: a driver directory without the probe gives a node without it.
    if let Some(source) = driver_dirs
        .iter()
        .map(|d| d.join(SIM_SMI_SOURCE))
        .find(|p| p.is_file())
    {
        let bin = layout.root.join("usr/bin");
        mkdir(&bin, 0o755)?;
        let bytes = std::fs::read(&source).map_err(|e| SimError::Read {
            path: source.clone(),
            source: e,
        })?;
        let dest = bin.join("nvidia-smi");
        if std::fs::read(&dest).ok().as_deref() != Some(&bytes[..]) {
            gpuslice_fsutil::atomic_write(&dest, &bytes, 0o755).map_err(|e| SimError::Install {
                path: dest.clone(),
                source: e,
            })?;
        }
    }

    // Container processes of any user create and share the simulated driver's state here.
    mkdir(&layout.state, 0o1777)?;
    let devices = crate::simulated::devices_from_config(&config.inventory.simulated);
    crate::simulated::write_devices(&layout.state, &devices).map_err(|e| SimError::Devices {
        path: layout.state.clone(),
        detail: e.to_string(),
    })?;
    Ok(layout)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[derive(Default)]
    struct Recorder(RefCell<Vec<(PathBuf, u32, u32)>>);

    impl Mknod for Recorder {
        fn char_device(&self, path: &Path, major: u32, minor: u32) -> io::Result<()> {
            std::fs::write(path, b"")?;
            self.0.borrow_mut().push((path.to_path_buf(), major, minor));
            Ok(())
        }
    }

    fn config(dir: &Path, gpus: usize) -> Config {
        let mut text = format!(
            "state_dir = \"{}\"\n[inventory]\nsource = \"simulated\"\n",
            dir.display()
        );
        for _ in 0..gpus {
            text.push_str("[[inventory.simulated]]\nmemory = \"10Gi\"\n");
        }
        gpuslice_config::parse_config(&text, Path::new("/t.toml")).expect("config")
    }

    fn fake_driver_dir() -> tempfile::TempDir {
        let d = tempfile::tempdir().expect("tempdir");
        std::fs::write(d.path().join("libgpuslice_sim_cuda.so"), b"cuda").expect("write");
        std::fs::write(d.path().join("libgpuslice_sim_nvml.so"), b"nvml").expect("write");
        d
    }

    #[test]
    fn creates_nodes_with_nvidia_numbers_and_installs_libraries() {
        let state = tempfile::tempdir().expect("tempdir");
        let drv = fake_driver_dir();
        let rec = Recorder::default();
        let layout = setup_sim_node(&config(state.path(), 2), &[drv.path().to_path_buf()], &rec)
            .expect("setup");
        let calls: Vec<(String, u32, u32)> = rec
            .0
            .borrow()
            .iter()
            .map(|(p, a, b)| {
                (
                    p.file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                    *a,
                    *b,
                )
            })
            .collect();
        assert_eq!(
            calls,
            vec![
                ("nvidia0".into(), 195, 0),
                ("nvidia1".into(), 195, 1),
                ("nvidiactl".into(), 195, 255),
                ("nvidia-modeset".into(), 195, 254),
                ("nvidia-uvm".into(), SIM_UVM_MAJOR, 0),
                ("nvidia-uvm-tools".into(), SIM_UVM_MAJOR, 1),
            ]
        );
        assert_eq!(
            std::fs::read(layout.lib_dir.join("libcuda.so.1")).expect("cuda"),
            b"cuda"
        );
        assert_eq!(
            std::fs::read(layout.lib_dir.join("libnvidia-ml.so.1")).expect("nvml"),
            b"nvml"
        );
        assert!(layout.state.join("devices.json").exists());
        // No probe in the driver dir: no nvidia-smi stand-in.
        assert!(!layout.root.join("usr/bin/nvidia-smi").exists());
    }

    #[test]
    fn installs_the_probe_as_the_simulated_drivers_nvidia_smi() {
        let state = tempfile::tempdir().expect("tempdir");
        let drv = fake_driver_dir();
        std::fs::write(drv.path().join("gpuslice-probe"), b"probe").expect("write");
        let layout = setup_sim_node(
            &config(state.path(), 1),
            &[drv.path().to_path_buf()],
            &Recorder::default(),
        )
        .expect("setup");
        let smi = layout.root.join("usr/bin/nvidia-smi");
        assert_eq!(std::fs::read(&smi).expect("nvidia-smi"), b"probe");
        // The create path finds it where it finds a real driver's.
        let found =
            crate::discover_binaries(&layout.root, crate::UTILITY_BINARIES).expect("discover");
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].container_path, Path::new("/usr/bin/nvidia-smi"));
    }

    #[test]
    fn fewer_gpus_removes_stale_nodes() {
        let state = tempfile::tempdir().expect("tempdir");
        let drv = fake_driver_dir();
        let dirs = [drv.path().to_path_buf()];
        setup_sim_node(&config(state.path(), 3), &dirs, &Recorder::default()).expect("setup 3");
        let layout =
            setup_sim_node(&config(state.path(), 1), &dirs, &Recorder::default()).expect("setup 1");
        assert!(layout.dev.join("nvidia0").exists());
        assert!(!layout.dev.join("nvidia1").exists());
        assert!(!layout.dev.join("nvidia2").exists());
    }

    #[test]
    fn missing_libraries_name_the_searched_dirs() {
        let state = tempfile::tempdir().expect("tempdir");
        let empty = tempfile::tempdir().expect("tempdir");
        let e = setup_sim_node(
            &config(state.path(), 1),
            &[empty.path().to_path_buf()],
            &Recorder::default(),
        )
        .expect_err("no libraries");
        let line = e.to_string();
        assert!(
            line.contains("libcuda.so.1") && line.contains(&empty.path().display().to_string()),
            "{line}"
        );
    }
}

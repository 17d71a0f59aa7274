//! A simulated GPU node for one test: its own config and state dir, the shim and the
//! simulated driver from the build, and the node CDI spec in `/var/run/cdi` (the only place
//! podman 4.3 reads). Dropping it removes what it published.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use crate::env::{bin, bin_dir};

/// Where podman and every CDI engine of this host read specs.
pub const CDI_DIR: &str = "/var/run/cdi";

/// A simulated node.
#[derive(Debug)]
pub struct TestNode {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub state: PathBuf,
    /// Where its CDI specs go (`cdi.spec_dir`): [`CDI_DIR`] unless made with
    /// [`TestNode::with_models`].
    pub cdi_dir: PathBuf,
}

/// The directory holding the portable build (old-glibc shim, simulated driver, probe), else
/// the plain build directory.
pub fn artifacts_dir() -> PathBuf {
    let portable = std::env::var_os("GPUSLICE_TEST_PORTABLE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::env::workspace().join("target/portable"));
    if portable.join("libgpuslice_shim.so").exists() && portable.join("libcuda.so.1").exists() {
        portable
    } else {
        bin_dir()
    }
}

/// The probe binary to mount into containers.
pub fn probe() -> PathBuf {
    let p = artifacts_dir().join("gpuslice-probe");
    assert!(
        p.exists(),
        "{} is missing: build the workspace first (./scripts/build.sh)",
        p.display()
    );
    p
}

impl TestNode {
    /// A node with one simulated GPU per memory size, e.g. `&["10Gi", "10Gi"]`, whose CDI
    /// specs go to [`CDI_DIR`]: the test holds [`crate::Resource::Cdi`].
    pub fn new(gpus: &[&str]) -> TestNode {
        TestNode::with(gpus, "")
    }

    /// Like [`TestNode::new`] with extra TOML appended to the config (top-level tables).
    pub fn with(gpus: &[&str], extra: &str) -> TestNode {
        let gpus: Vec<(Option<&str>, &str)> = gpus.iter().map(|m| (None, *m)).collect();
        TestNode::build(&gpus, extra, None, None)
    }

    /// Like [`TestNode::with`], each CUDA context costing `context_memory` (a byte quantity)
    /// of device memory instead of the config's default.
    pub fn with_context(gpus: &[&str], context_memory: &str, extra: &str) -> TestNode {
        let gpus: Vec<(Option<&str>, &str)> = gpus.iter().map(|m| (None, *m)).collect();
        TestNode::build(&gpus, extra, None, Some(context_memory))
    }

    /// Like [`TestNode::new`] with contexts that cost no device memory: for tests that assert
    /// exact figures (a slice filled to its limit by allocations alone).
    pub fn exact(gpus: &[&str]) -> TestNode {
        TestNode::with_context(gpus, "0", "")
    }

    /// A node with one simulated GPU per `(model, memory)`, e.g. `&[("NVIDIA L4", "24Gi")]`,
    /// whose CDI specs go to a directory of its own (under its temp dir) instead of
    /// [`CDI_DIR`], so that several nodes can live on one host.
    pub fn with_models(gpus: &[(&str, &str)]) -> TestNode {
        TestNode::models(gpus, None)
    }

    /// [`TestNode::with_models`] with contexts that cost no device memory (exact figures).
    pub fn with_models_exact(gpus: &[(&str, &str)]) -> TestNode {
        TestNode::models(gpus, Some("0"))
    }

    fn models(gpus: &[(&str, &str)], context_memory: Option<&str>) -> TestNode {
        let gpus: Vec<(Option<&str>, &str)> = gpus.iter().map(|(m, s)| (Some(*m), *s)).collect();
        let dir = tempfile::Builder::new()
            .prefix("gpuslice-e2e-")
            .tempdir()
            .expect("tempdir");
        let cdi = dir.path().join("cdi");
        TestNode::build_in(dir, &gpus, "", Some(cdi), context_memory)
    }

    fn build(
        gpus: &[(Option<&str>, &str)],
        extra: &str,
        cdi_dir: Option<PathBuf>,
        context_memory: Option<&str>,
    ) -> TestNode {
        let dir = tempfile::Builder::new()
            .prefix("gpuslice-e2e-")
            .tempdir()
            .expect("tempdir");
        TestNode::build_in(dir, gpus, extra, cdi_dir, context_memory)
    }

    /// `context_memory`: each simulated GPU's `context_memory` key (the config's default when
    /// `None`).
    fn build_in(
        dir: tempfile::TempDir,
        gpus: &[(Option<&str>, &str)],
        extra: &str,
        cdi_dir: Option<PathBuf>,
        context_memory: Option<&str>,
    ) -> TestNode {
        let cdi_dir = cdi_dir.unwrap_or_else(|| PathBuf::from(CDI_DIR));
        let state = dir.path().join("state");
        let shim = artifacts_dir().join("libgpuslice_shim.so");
        assert!(
            shim.exists(),
            "{} is missing: build the workspace first",
            shim.display()
        );
        let mut text = format!(
            "state_dir = \"{}\"\n[shim]\nlibrary = \"{}\"\n[cdi]\nspec_dir = \"{}\"\n[inventory]\nsource = \"simulated\"\n",
            state.display(),
            shim.display(),
            cdi_dir.display()
        );
        for (model, m) in gpus {
            text.push_str(&format!("[[inventory.simulated]]\nmemory = \"{m}\"\n"));
            if let Some(model) = model {
                text.push_str(&format!("model = \"{model}\"\n"));
            }
            if let Some(c) = context_memory {
                text.push_str(&format!("context_memory = \"{c}\"\n"));
            }
        }
        text.push_str(extra);
        let config = dir.path().join("config.toml");
        std::fs::write(&config, text).expect("write config");
        let node = TestNode {
            dir,
            config,
            state,
            cdi_dir,
        };
        let out = node.gpuslice(&[
            "cdi",
            "generate",
            "--sim-driver",
            &artifacts_dir().display().to_string(),
        ]);
        assert!(
            out.status.success(),
            "cdi generate failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        node
    }

    /// `gpuslice --config <this node> args…`.
    pub fn gpuslice(&self, args: &[&str]) -> Output {
        Command::new(bin("gpuslice"))
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .output()
            .expect("run gpuslice")
    }

    /// `gpuslice status --json`.
    pub fn status(&self) -> Value {
        let out = self.gpuslice(&["status", "--json"]);
        assert!(
            out.status.success(),
            "status failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("status JSON")
    }

    /// The reservations of `status --json`.
    pub fn reservations(&self) -> Vec<Value> {
        self.status()["reservations"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// GPU `index`'s UUID.
    pub fn uuid(&self, index: usize) -> String {
        self.status()["gpus"][index]["uuid"]
            .as_str()
            .expect("uuid")
            .to_string()
    }

    /// Files under the slices directory and slice CDI specs: what a released slice must not
    /// leave behind.
    pub fn leftovers(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        if let Ok(rd) = std::fs::read_dir(self.state.join("slices")) {
            out.extend(rd.filter_map(|e| e.ok()).map(|e| e.path()));
        }
        if let Ok(rd) = std::fs::read_dir(&self.cdi_dir) {
            out.extend(rd.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("gpuslice.io-slice"))
            }));
        }
        out
    }

    /// podman with gpuslice's precreate hook installed by `gpuslice configure podman` into a
    /// hooks directory of this node's own (kept until the node is dropped).
    pub fn podman_with_hook(&self) -> crate::podman::Podman {
        let hooks = self.dir.path().join("hooks.d");
        let out = self.gpuslice(&[
            "configure",
            "podman",
            "--hooks-dir",
            &hooks.display().to_string(),
        ]);
        assert!(
            out.status.success(),
            "configure podman: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        crate::podman::Podman::new().with_hooks_dir(&hooks)
    }

    /// The config path as a string (for `GPUSLICE_CONFIG`).
    pub fn config_str(&self) -> String {
        self.config.display().to_string()
    }

    /// The state dir.
    pub fn state_dir(&self) -> &Path {
        &self.state
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        let _ = self.gpuslice(&["gc"]);
        let _ = std::fs::remove_file(self.cdi_dir.join("gpuslice.io-gpu.json"));
        for p in self.leftovers() {
            if p.starts_with(&self.cdi_dir) {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

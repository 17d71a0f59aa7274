//! podman as the tests drive it: a test-only containers.conf with what this host needs
//! (runc, cgroupfs, explicit ulimits, file events), never the product's configuration.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::env::workspace;

/// podman with the test containers.conf and, optionally, a hooks directory.
#[derive(Debug, Clone)]
pub struct Podman {
    conf: PathBuf,
    hooks_dir: Option<PathBuf>,
}

fn containers_conf() -> PathBuf {
    let path = workspace().join("target/e2e/containers.conf");
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir target/e2e");
    // This host's cgroup layout is hybrid and its hard limits are low: crun and the systemd
    // cgroup manager fail, and podman's default ulimits exceed the hard nofile limit.
    let hard_nofile = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .maximum
        .unwrap_or(1024)
        .min(1 << 20);
    let text = format!(
        "[containers]\ndefault_ulimits = [\"nofile={n}:{n}\", \"nproc=4096:4096\"]\nnetns = \"none\"\n\n[engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n",
        n = hard_nofile.min(4096)
    );
    std::fs::write(&path, text).expect("write containers.conf");
    path
}

impl Default for Podman {
    fn default() -> Self {
        Self::new()
    }
}

impl Podman {
    pub fn new() -> Podman {
        Podman {
            conf: containers_conf(),
            hooks_dir: None,
        }
    }

    /// Uses `dir` as podman's OCI hooks directory (hooks.d).
    pub fn with_hooks_dir(mut self, dir: &Path) -> Podman {
        self.hooks_dir = Some(dir.to_path_buf());
        self
    }

    /// A `podman` command with the test configuration.
    pub fn cmd(&self) -> Command {
        let mut c = Command::new("podman");
        c.env("CONTAINERS_CONF", &self.conf);
        if let Some(h) = &self.hooks_dir {
            c.arg("--hooks-dir").arg(h);
        }
        c
    }

    /// Runs podman with `args` and returns its output.
    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().expect("run podman")
    }
}

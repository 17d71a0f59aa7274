//! `gpuslice kubelet-plugin`: this DRA kubelet plugin, run on this node's
//! registry, with the create path's own slice code writing what a claim's containers get: the
//! slice directory and a CDI spec made by the same `slice_spec` as an annotation slice (device
//! nodes of its GPUs and the control nodes, driver libraries, the shim and `/etc/ld.so.preload`,
//! the read-only limits file, the usage file), as kind `gpuslice.io/claim` with one device
//! named by the claim's UID, and without the bind/release hooks: a claim is held from prepare
//! to unprepare, not by a container. Its one hook, `createRuntime … --claim`, records each
//! container the claim is given to, from the host.

use std::path::PathBuf;
use std::sync::Arc;

use crate::{claim_device_id, PluginOptions, ServeError, SliceWriter, WriteError, CLAIM_KIND};
use clap::Args;
use gpuslice_cdi::{transient_spec_file_name, SpecFileError};
use gpuslice_registry::{claim_uid, Registry, RegistryError, Reservation};

use gpuslice_hook::create::slicespec::{slice_spec, slice_spec_path};
use gpuslice_hook::create::specedit::{ensure_preload, write_slice_files, EditError};
use gpuslice_hook::node::NodeContext;
use gpuslice_hook::specfiles::{cached_node_spec_lazy, NODE_SPEC_CACHE};

/// `gpuslice kubelet-plugin` flags (DESIGN.md §7).
#[derive(Debug, Args)]
pub struct KubeletPluginArgs {
    /// The Node object's name: the pool and the ResourceSlice are named after it.
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    pub node_name: String,
    /// Kubeconfig of the cluster [default: the pod's in-cluster credentials].
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Directory of the DRA socket `dra.sock`.
    #[arg(long, value_name = "DIR", default_value = crate::serve::DEFAULT_PLUGIN_DIR)]
    pub plugin_dir: PathBuf,
    /// The kubelet's plugin registration directory (holds `gpuslice.io-reg.sock`).
    #[arg(long, value_name = "DIR", default_value = crate::serve::DEFAULT_REGISTRATION_DIR)]
    pub registration_dir: PathBuf,
}

/// The plugin did not start, or stopped on an error.
#[derive(Debug, thiserror::Error)]
pub enum KubeletPluginError {
    #[error("cannot open the node registry: {0}")]
    Registry(#[from] RegistryError),
    #[error("{0}")]
    Node(#[from] gpuslice_hook::node::NodeError),
    #[error("gpuslice kubelet-plugin: {0}")]
    Serve(#[from] ServeError),
}

/// Path of the CDI spec of the claim with UID `uid` in `dir`; `None` when `uid` cannot name
/// a spec file.
pub fn claim_spec_path(dir: &std::path::Path, uid: &str) -> Option<PathBuf> {
    transient_spec_file_name(CLAIM_KIND, uid)
        .ok()
        .map(|n| dir.join(n))
}

/// Opens the node's registry with the cleanup every release needs: a slice's spec goes, and
/// a claim's own spec with it.
pub fn open_registry(node: &NodeContext) -> Result<Registry, RegistryError> {
    let spec_dir = node.config().cdi.spec_dir.clone();
    let cleanup = Box::new(move |r: &Reservation| {
        let paths = [
            slice_spec_path(&spec_dir, &r.id),
            claim_uid(r).and_then(|uid| claim_spec_path(&spec_dir, uid)),
        ];
        for path in paths.into_iter().flatten() {
            let _ = gpuslice_cdi::remove_spec(&path);
        }
    });
    Registry::open_config(node.config(), cleanup)
}

/// The [`SliceWriter`] of this node.
#[derive(Debug)]
pub struct ClaimSlices {
    node: NodeContext,
    /// The `gpuslice` binary (the node spec's edits name it; the claim spec drops its hooks).
    binary: PathBuf,
}

impl ClaimSlices {
    pub fn new(node: NodeContext) -> Result<ClaimSlices, gpuslice_hook::node::NodeError> {
        let binary = node.hook_binary()?;
        Ok(ClaimSlices { node, binary })
    }

    fn write_files(&self, uid: &str, r: &Reservation) -> Result<Vec<String>, EditError> {
        let config = self.node.config();
        let node_spec =
            cached_node_spec_lazy(&self.node.config().state_dir).map_err(EditError::NodeSpec)?;
        if !config.shim.library.is_file() {
            return Err(EditError::NoShim {
                path: config.shim.library.clone(),
            });
        }
        ensure_preload(&self.node)?;
        let slice_dir = config
            .state_dir
            .join(gpuslice_registry::SLICES_DIR)
            .join(&r.id);
        write_slice_files(&slice_dir, r, true)?;
        let booked: Vec<&str> = r.gpus.iter().map(|b| b.uuid.as_str()).collect();
        let node_spec = node_spec.with_devices(&booked).map_err(|source| {
            EditError::NodeSpec(SpecFileError::Decode {
                path: config.state_dir.join(NODE_SPEC_CACHE),
                source,
            })
        })?;
        let mut spec = slice_spec(&self.node, &self.binary, &node_spec, r, &slice_dir)?;
        spec.kind = CLAIM_KIND.to_string();
        for d in &mut spec.devices {
            d.name = uid.to_string();
            // The claim holds its reservation from prepare to unprepare: no container binds
            // or releases it. Each container it is given to is recorded host-side, so the
            // node agent attributes the claim's processes by their cgroups and namespaces,
            // never by what the containers write.
            d.container_edits.hooks = vec![self.node.hook(
                &self.binary,
                "createRuntime",
                &["hook", "create-runtime", "--claim", &r.id],
            )];
        }
        gpuslice_cdi::write_transient_spec(&config.cdi.spec_dir, &spec, uid)
            .map_err(EditError::SpecFile)?;
        Ok(vec![claim_device_id(uid)])
    }
}

impl SliceWriter for ClaimSlices {
    fn write(&self, uid: &str, r: &Reservation) -> Result<Vec<String>, WriteError> {
        self.write_files(uid, r)
            .map_err(|e| WriteError::Failed(e.to_string()))
    }

    fn remove(&self, uid: &str) -> Result<(), WriteError> {
        let dir = &self.node.config().cdi.spec_dir;
        let path = claim_spec_path(dir, uid).ok_or_else(|| {
            WriteError::Failed(format!("claim uid `{uid}` cannot name a CDI spec file"))
        })?;
        gpuslice_cdi::remove_spec(&path).map_err(|e| WriteError::Failed(e.to_string()))
    }
}

/// Runs the plugin in the foreground until SIGTERM.
pub fn run(node: &NodeContext, args: KubeletPluginArgs) -> Result<(), KubeletPluginError> {
    let registry = Arc::new(open_registry(node)?);
    let writer = Arc::new(ClaimSlices::new(node.clone())?);
    let mut options = PluginOptions::new(args.node_name);
    options.kubeconfig = args.kubeconfig;
    options.plugin_dir = args.plugin_dir;
    options.registration_dir = args.registration_dir;
    options.dra = node.config().dra;
    options.mode_file = Some(node.config().kubelet_plugin_path());
    crate::run_until_signal(options, registry, writer)?;
    Ok(())
}

//! `gpuslice configure <engine>`: registering gpuslice with container engines.

pub mod containerd;
pub mod crio;
pub mod docker;
pub mod files;
pub mod podman;
pub mod registration;
pub mod tomldoc;

use crate::cli::ConfigureCommand;
use crate::commands::out;
use crate::error::Error;
use crate::node::Node;

/// Runs `configure <engine>` and prints what changed (or would change).
pub fn run(node: &Node, command: ConfigureCommand) -> Result<(), Error> {
    let text = match command {
        ConfigureCommand::Podman(a) => podman::configure(node, &a.hooks_dir, a.dry_run, a.remove)?,
        ConfigureCommand::Containerd(a) => {
            let target = containerd::Target::new(a.config_path.as_deref());
            containerd::configure(&target, node, a.dry_run, a.remove)?
        }
        ConfigureCommand::Crio(a) => {
            let target = crio::Target::new(a.config_path.as_deref());
            crio::configure(&target, node, a.dry_run, a.remove)?
        }
        ConfigureCommand::Docker(a) => {
            let target = docker::Target::new(a.config_path.as_deref());
            docker::configure(&target, node, a.dry_run, a.remove)?
        }
    };
    out(&text)
}

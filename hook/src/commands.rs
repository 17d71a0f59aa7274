//! Runs one parsed `gpuslice` command line.

use std::io::Write;

use gpuslice_registry::{
    render_reaped, render_rebuild, render_table_measured, status_json_measured, Inventory,
};

use crate::cdigen;
use crate::cli::{CdiCommand, Cli, Command, ConfigureCommand, HookCommand};
use crate::configure;
use crate::error::Error;
use crate::hooks;
use crate::node::Node;

fn out(text: &str) -> Result<(), Error> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|_| stdout.flush())
        .map_err(Error::Stdout)
}

/// Runs the command; the caller prints the error and exits with its code.
pub fn run(cli: Cli) -> Result<(), Error> {
    let node = Node::load(cli.config.as_deref())?;
    match cli.command {
        Command::Cdi(CdiCommand::Generate(args)) => {
            let g = cdigen::generate(&node, args.output.as_deref(), args.sim_driver.as_deref())?;
            let names = g.spec.qualified_device_names();
            out(&format!(
                "wrote {} ({} GPUs, {} devices: {})\n",
                g.path.display(),
                g.gpus.len(),
                names.len(),
                names.join(" ")
            ))
        }
        Command::Cdi(CdiCommand::List) => {
            let spec = cdigen::cached_node_spec(&node)?;
            out(&spec
                .qualified_device_names()
                .iter()
                .map(|n| format!("{n}\n"))
                .collect::<String>())
        }
        Command::Status(args) => {
            let registry = crate::cleanup::open_registry(&node)?;
            let file = registry.snapshot()?;
            let measured = crate::serve::measured::measure(&node, &file);
            if args.json {
                let v = status_json_measured(&file, &measured);
                out(&format!(
                    "{}\n",
                    serde_json::to_string_pretty(&v).unwrap_or_default()
                ))
            } else {
                out(&render_table_measured(&file, &measured))
            }
        }
        Command::Gc(args) => {
            let registry = crate::cleanup::open_registry(&node)?;
            if args.rebuild {
                let gpus = gpuslice_driver::inventory(node.config(), &node.loaded.path)?;
                let report = registry.rebuild(Inventory { gpus })?;
                out(&render_rebuild(&report))
            } else {
                let reaped = registry.gc()?;
                out(&render_reaped(&reaped))
            }
        }
        Command::Hook(HookCommand::Precreate) => hooks::precreate(&node),
        Command::Hook(HookCommand::CreateRuntime(a)) => {
            hooks::create_runtime(&node, a.reservation.as_deref(), &a.whole_gpu)
        }
        Command::Hook(HookCommand::Poststop(a)) => hooks::poststop(&node, a.reservation.as_deref()),
        Command::Hook(HookCommand::Fail { message }) => hooks::fail(&message),
        Command::Configure(ConfigureCommand::Podman(a)) => out(&configure::podman::configure(
            &node,
            &a.hooks_dir,
            a.dry_run,
            a.remove,
        )?),
        Command::Configure(ConfigureCommand::Containerd(a)) => {
            let target = configure::containerd::Target::new(a.config_path.as_deref());
            out(&configure::containerd::configure(
                &target, &node, a.dry_run, a.remove,
            )?)
        }
        Command::Configure(ConfigureCommand::Crio(a)) => {
            let target = configure::crio::Target::new(a.config_path.as_deref());
            out(&configure::crio::configure(
                &target, &node, a.dry_run, a.remove,
            )?)
        }
        Command::Configure(ConfigureCommand::Docker(a)) => {
            let target = configure::docker::Target::new(a.config_path.as_deref());
            out(&configure::docker::configure(
                &target, &node, a.dry_run, a.remove,
            )?)
        }
        Command::Serve(args) => Ok(crate::serve::run(
            &node,
            args.listen.unwrap_or(node.config().serve.listen),
        )?),
    }
}

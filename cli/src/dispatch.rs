//! The one place a parsed command line is dispatched to its role: the hooks to the
//! create path, `cdi`, `status`, `gc` and `serve` to the node agent, `configure` to engine
//! registration, `kubelet-plugin` to the DRA plugin, `console` to the web console,
//! `webhook` to the admission webhook, `sim` to the simulated node's driver files.

use gpuslice_hook::node::NodeContext;

use crate::cli::{Cli, Command, SimCommand, SimFaultArgs};

/// Why a command failed: the role's own error, one line each.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Node(#[from] gpuslice_hook::error::Error),
    #[error(transparent)]
    Cdi(#[from] gpuslice_agent::nodespec::GenerateError),
    #[error(transparent)]
    Status(#[from] gpuslice_agent::status::StatusError),
    #[error(transparent)]
    Serve(#[from] gpuslice_agent::ServeError),
    #[error(transparent)]
    Configure(#[from] gpuslice_configure::ConfigureError),
    #[error(transparent)]
    KubeletPlugin(Box<gpuslice_kube::node_slices::KubeletPluginError>),
    #[error(transparent)]
    Console(#[from] gpuslice_console::web::WebError),
    #[error(transparent)]
    Webhook(#[from] gpuslice_webhook::WebhookError),
    #[error(transparent)]
    SimFault(#[from] gpuslice_driver::simfault::FaultError),
    #[error("gpuslice sim needs a simulated node: the config's inventory.source is `{0}`; set it to `simulated` with [[inventory.simulated]] GPUs")]
    NotSimulated(&'static str),
}

impl From<gpuslice_kube::node_slices::KubeletPluginError> for Error {
    fn from(e: gpuslice_kube::node_slices::KubeletPluginError) -> Self {
        Error::KubeletPlugin(Box::new(e))
    }
}

impl Error {
    /// The process exit status: 2 for bad configuration or usage, 1 for everything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Node(e) => e.exit_code(),
            _ => 1,
        }
    }
}

/// Runs the command; the caller prints the error and exits with its code.
pub fn run(cli: Cli) -> Result<(), Error> {
    // The console and the webhook are cluster services: they never read the node config, so
    // a node's broken or unreadable config must not stop them.
    let command = match cli.command {
        Command::Console(args) => return Ok(gpuslice_console::web::run_until_signal(args)?),
        Command::Webhook(args) => return Ok(gpuslice_webhook::run_until_signal(args)?),
        node_command => node_command,
    };
    let node =
        NodeContext::load(cli.config.as_deref()).map_err(gpuslice_hook::error::Error::from)?;
    match command {
        Command::Cdi(command) => Ok(gpuslice_agent::nodespec::run(&node, command)?),
        Command::Hook(command) => Ok(gpuslice_hook::create::hooks::run(&node, command)
            .map_err(gpuslice_hook::error::Error::from)?),
        Command::Status(args) => Ok(gpuslice_agent::status::status(&node, &args)?),
        Command::Gc(args) => Ok(gpuslice_agent::status::gc(&node, &args)?),
        Command::Serve(args) => Ok(gpuslice_agent::run(
            &node,
            args.listen.unwrap_or(node.config().serve.listen),
        )?),
        Command::Configure(command) => Ok(gpuslice_configure::run(&node, command)?),
        Command::KubeletPlugin(args) => Ok(gpuslice_kube::node_slices::run(&node, args)?),
        // Answered above, without the node config.
        Command::Console(_) | Command::Webhook(_) => Ok(()),
        Command::Sim(SimCommand::Fault(args)) => sim_fault(&node, &args),
    }
}

/// `gpuslice sim fault`: appends the XID to the simulated driver's `faults.json`, or clears the
/// GPU's XIDs.
fn sim_fault(node: &NodeContext, args: &SimFaultArgs) -> Result<(), Error> {
    let config = node.config();
    if !config.is_simulated() {
        return Err(Error::NotSimulated(config.inventory.source.as_str()));
    }
    let state = gpuslice_driver::simnode::SimLayout::of(config).state;
    let xid = if args.clear { None } else { args.xid };
    let now = gpuslice_driver::health::now_ms();
    let in_effect = gpuslice_driver::simfault::set_fault(&state, &args.gpu, xid, now)?;
    match (xid, in_effect.first()) {
        (Some(x), Some(f)) => println!(
            "simulated GPU {}: the driver reports XID {x}; XIDs in effect until --clear: {}",
            f.uuid,
            in_effect
                .iter()
                .map(|f| f.xid.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        _ => println!("simulated GPU {}: no fault (reset)", args.gpu),
    }
    Ok(())
}

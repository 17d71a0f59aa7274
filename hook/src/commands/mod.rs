//! The node commands and the one place a parsed command line is dispatched to its job: the
//! hooks to the create path, `configure` to engine registration, `serve` to the exporter,
//! `cdi`, `status` and `gc` to the modules below.

pub mod cdi;
#[cfg(feature = "kubernetes")]
pub mod console;
pub mod status;

use std::io::Write;

use crate::cli::{Cli, Command};
use crate::error::Error;
use crate::node::Node;

/// Writes a command's output to stdout.
pub fn out(text: &str) -> Result<(), Error> {
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
        Command::Cdi(command) => cdi::run(&node, command),
        Command::Status(args) => status::status(&node, &args),
        Command::Gc(args) => status::gc(&node, &args),
        Command::Hook(command) => crate::create::hooks::run(&node, command),
        Command::Configure(command) => crate::configure::run(&node, command),
        Command::Serve(args) => Ok(crate::serve::run(
            &node,
            args.listen.unwrap_or(node.config().serve.listen),
        )?),
        #[cfg(feature = "kubernetes")]
        Command::KubeletPlugin(args) => Ok(crate::kubelet_plugin::run(&node, args)?),
        #[cfg(feature = "kubernetes")]
        Command::Console(args) => Ok(console::run(args)?),
    }
}

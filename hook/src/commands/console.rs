//! `gpuslice console`: the web console of the cluster's GPU slices (the console crate's
//! `web` module), started from the full `gpuslice` binary.

/// `gpuslice console` flags (defined next to the server they configure).
pub type ConsoleArgs = gpuslice_console::web::Options;

/// Serves the console until SIGTERM or SIGINT.
pub fn run(args: ConsoleArgs) -> Result<(), gpuslice_console::web::WebError> {
    gpuslice_console::web::run_until_signal(args)
}

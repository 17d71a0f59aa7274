//! The `gpuslice` command line: the command tree (clap), composed of the flags each role
//! crate defines next to the code it drives. A new subcommand is a variant of [`Command`]
//! and an arm of `dispatch::run`; the hook lines gpuslice writes are read by the create
//! path's `hookargv` before clap is built.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use gpuslice_agent::args::CdiCommand;
use gpuslice_hook::args::HookCommand;

/// Share NVIDIA GPUs between containers with per-container memory and compute limits.
///
/// gpuslice reserves GPU slices when containers are created (from `gpuslice.io/*`
/// annotations), injects the devices, driver libraries and enforcement shim into the OCI
/// spec, and keeps a node registry of who holds which part of which GPU.
#[derive(Debug, Parser)]
#[command(name = "gpuslice", version, propagate_version = true)]
pub struct Cli {
    /// Node config file [default: $GPUSLICE_CONFIG, else /etc/gpuslice/config.toml]; read by
    /// the node's commands, not by `console` and `webhook` (cluster services).
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Publish CDI specs for engines that pick devices themselves.
    #[command(subcommand)]
    Cdi(CdiCommand),
    /// Show per-GPU capacity and allocation, and the reservations.
    Status(gpuslice_agent::args::StatusArgs),
    /// Reap reservations of containers that are gone; `--rebuild` repairs a corrupt registry.
    Gc(gpuslice_agent::args::GcArgs),
    /// OCI hooks called by container engines and runtimes (not for interactive use).
    #[command(subcommand)]
    Hook(HookCommand),
    /// Register gpuslice with a container engine.
    #[command(subcommand)]
    Configure(gpuslice_configure::args::ConfigureCommand),
    /// Serve Prometheus metrics.
    Serve(gpuslice_agent::args::ServeArgs),
    /// Run the DRA kubelet plugin of this node (Kubernetes 1.34+: capacity mode on 1.36+ or
    /// 1.35 with DRAConsumableCapacity, slot mode otherwise; docs/kubernetes-dra.md).
    KubeletPlugin(gpuslice_kube::node_slices::KubeletPluginArgs),
    /// Serve the web console of the cluster's GPU slices (docs/console.md): nodes, GPUs,
    /// pods and workloads, and with --allow-edit allocating slices. It acts with the
    /// kubeconfig's rights for anyone who can reach --listen (default 127.0.0.1:8080).
    Console(gpuslice_console::web::Options),
    /// Serve the mutating admission webhook that turns container limits gpuslice.io/* (and,
    /// with --hami-compat, HAMi's nvidia.com/*) into DRA claims (docs/webhook.md).
    Webhook(gpuslice_webhook::WebhookArgs),
    /// Drive the simulated GPU node (inventory.source = "simulated"), for tests and demos.
    #[command(subcommand)]
    Sim(SimCommand),
}

/// `gpuslice sim …`.
#[derive(Debug, Subcommand)]
pub enum SimCommand {
    /// Make the simulated driver report an XID for a GPU, as a real driver does (NVML events,
    /// failing calls; docs/troubleshooting.md), or end its XIDs with --clear. XIDs add up: a
    /// later one never ends an earlier one.
    Fault(SimFaultArgs),
}

/// `gpuslice sim fault` flags.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["xid", "clear"])))]
pub struct SimFaultArgs {
    /// The GPU, by UUID (GPU-…), as `gpuslice status` lists it.
    #[arg(long, value_name = "UUID")]
    pub gpu: String,
    /// The XID the driver reports, e.g. 79 (fallen off the bus), 48/94/95 (ECC), 119 (GSP).
    #[arg(long, value_name = "CODE", value_parser = clap::value_parser!(u32).range(1..=65535))]
    pub xid: Option<u32>,
    /// End every XID of the GPU (as a GPU reset does); CUDA contexts an XID 79 or an ECC XID
    /// failed stay failed until they are destroyed.
    #[arg(long)]
    pub clear: bool,
}

/// The create path's reader of the hook lines gpuslice writes (`hookargv`) against this
/// command tree: it accepts nothing clap refuses and yields what clap yields.
#[cfg(test)]
mod hook_lines {
    use super::*;
    use clap::Parser;
    use std::ffi::OsString;

    /// The fast reader's result, as the command line clap would have made of it.
    fn parse(args: &[OsString]) -> Option<Cli> {
        gpuslice_hook::create::hookargv::parse(args).map(|h| Cli {
            config: h.config,
            command: Command::Hook(h.command),
        })
    }

    fn os(line: &[&str]) -> Vec<OsString> {
        line.iter().map(OsString::from).collect()
    }

    /// What clap makes of the line (with the program name), as the hook parser's result.
    fn clap(line: &[&str]) -> Result<String, String> {
        let mut full = vec!["gpuslice"];
        full.extend_from_slice(line);
        Cli::try_parse_from(&full)
            .map(|c| format!("{c:?}"))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn every_line_gpuslice_writes_reads_as_clap_reads_it() {
        let flags: &[&[&str]] = &[
            &[],
            &["--reservation", "5f3c9a0e12ab34cd"],
            &["--claim", "5f3c9a0e12ab34cd"],
            &["--whole-gpu", "GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"],
            &["--whole-gpu", "GPU-a", "--whole-gpu", "GPU-b"],
            &["--reservation", "r1", "--whole-gpu", "GPU-a"],
            &[
                "--whole-gpu",
                "GPU-a",
                "--reservation",
                "r1",
                "--whole-gpu",
                "GPU-b",
            ],
            &["--config", "/etc/gpuslice/other.toml"],
            &["--reservation", "r1", "--config", "/c.toml"],
        ];
        let mut checked = 0;
        for before in [&[][..], &["--config", "/tmp/x y/config.toml"][..]] {
            for sub in ["create-runtime", "prestart", "poststop", "precreate"] {
                for tail in flags {
                    let mut line: Vec<&str> = before.to_vec();
                    line.extend(["hook", sub]);
                    line.extend_from_slice(tail);
                    let fast = parse(&os(&line)).map(|c| format!("{c:?}"));
                    match (fast, clap(&line)) {
                        (Some(a), Ok(b)) => {
                            assert_eq!(a, b, "{line:?}");
                            checked += 1;
                        }
                        // Declined: clap decides (precreate takes no hook flags; --config
                        // given twice).
                        (None, _) => {
                            let twice = before.len() == 2 && tail.contains(&"--config");
                            let precreate_flags = sub == "precreate"
                                && tail.iter().any(|f| {
                                    matches!(*f, "--reservation" | "--whole-gpu" | "--claim")
                                });
                            assert!(twice || precreate_flags, "declined {line:?}");
                        }
                        (Some(a), Err(e)) => panic!("{line:?}: read as {a}, clap refuses: {e}"),
                    }
                }
            }
        }
        assert!(checked >= 40, "{checked}");
        // The refusal hook precreate writes into a spec (`hooks::failing_spec`).
        for line in [
            &["hook", "fail", "no room"][..],
            &["--config", "/c.toml", "hook", "fail", "no room"],
            &["hook", "fail", "--config", "/c.toml", "annotation x: bad"],
            &["hook", "fail", "no room", "--config", "/c.toml"],
        ] {
            let fast = parse(&os(line)).map(|c| format!("{c:?}"));
            assert_eq!(fast, clap(line).ok(), "{line:?}");
            assert!(fast.is_some(), "{line:?}");
        }
    }

    /// Lines that look like hook lines but that clap refuses too, with its own message.
    const CLAP_REFUSES: &[&[&str]] = &[
        &[
            "hook",
            "poststop",
            "--reservation",
            "r1",
            "--reservation",
            "r2",
        ],
        &["hook", "poststop", "--bogus", "x"],
        &["hook", "precreate", "--reservation", "r1"],
        &[
            "hook",
            "create-runtime",
            "--claim",
            "r1",
            "--reservation",
            "r2",
        ],
        &[
            "hook",
            "create-runtime",
            "--whole-gpu",
            "GPU-a",
            "--claim",
            "r1",
        ],
    ];

    #[test]
    fn anything_else_is_left_to_clap() {
        let lines: &[&[&str]] = &[
            &[],
            &["hook"],
            &["status"],
            &["--help"],
            &["hook", "--help"],
            &["hook", "poststop", "--help"],
            &["hook", "create-runtime", "-h"],
            &["--config=/c.toml", "hook", "poststop"],
            &["hook", "poststop", "--reservation=r1"],
            &["hook", "poststop", "--reservation"],
            &["hook", "poststop", "--reservation", ""],
            &["hook", "poststop", "--reservation", "-r1"],
            &["hook", "poststop", "extra"],
            &["hook", "fail"],
            &["hook", "fail", "a", "b"],
            &["hook", "fail", "-x"],
            &["hook", "bogus"],
            &[
                "--config", "/c.toml", "--config", "/d.toml", "hook", "poststop",
            ],
            &["--config", "hook", "poststop"],
            &["-V"],
        ];
        for line in lines.iter().chain(CLAP_REFUSES) {
            assert!(parse(&os(line)).is_none(), "{line:?}");
        }
        for line in CLAP_REFUSES {
            assert!(clap(line).is_err(), "{line:?}");
        }
        // A non-UTF-8 argument.
        use std::os::unix::ffi::OsStringExt;
        let mut line = os(&["hook", "poststop", "--reservation"]);
        line.push(OsString::from_vec(vec![0xff, 0x41]));
        assert!(parse(&line).is_none());
    }
}

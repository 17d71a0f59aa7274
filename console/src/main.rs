//! `kubectl-gpuslice`, the kubectl plugin of gpuslice (`kubectl gpuslice …`): GPU capacity,
//! bookings and use per node, GPU and pod, and allocating slices to workloads.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use gpuslice_console::budgets::{self, Budgets, Scope};
use gpuslice_console::fetch::{self, PodScope};
use gpuslice_console::model::{self, Model};
use gpuslice_console::render::{self, Output};
use gpuslice_console::{client, idle, workload};
use serde_json::json;

#[derive(Debug, Parser)]
#[command(
    name = "kubectl-gpuslice",
    bin_name = "kubectl gpuslice",
    version,
    about = "GPU slices of the cluster: capacity and bookings from ResourceSlices and ResourceClaims, use from Prometheus"
)]
struct Cli {
    /// The namespace (default: the context's).
    #[arg(short = 'n', long, global = true)]
    namespace: Option<String>,
    /// Every namespace.
    #[arg(short = 'A', long, global = true)]
    all_namespaces: bool,
    /// The kubeconfig context.
    #[arg(long, global = true)]
    context: Option<String>,
    /// The kubeconfig (default: $KUBECONFIG, else ~/.kube/config, else in-cluster).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// Output format: wide, json or yaml (default: a table).
    #[arg(short = 'o', long, global = true, value_enum)]
    output: Option<Output>,
    /// Prometheus scraping the nodes' `gpuslice serve`, e.g. http://prometheus:9090.
    #[arg(long, global = true, env = "GPUSLICE_PROMETHEUS")]
    prometheus: Option<String>,
    /// Whether the webhook runs with --hami-compat: `quota` and `allocate` count HAMi's quota
    /// names (limits.nvidia.com/*) in namespaces labelled gpuslice.io/hami-compat=true, as it
    /// does (the default). `--hami-compat=false` where the webhook runs without it (the
    /// chart's default webhook.hamiCompat=false): they count nowhere, and `quota` says so.
    #[arg(long, global = true, env = "GPUSLICE_HAMI_COMPAT", value_name = "BOOL",
          default_value_t = true, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          action = clap::ArgAction::Set)]
    hami_compat: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Per node: GPUs, memory and cores capacity, allocated, free, used.
    Nodes {
        /// Only nodes with a GPU that has free memory.
        #[arg(long)]
        available: bool,
    },
    /// Per GPU: the same plus model, the claims on it and idle slices.
    Gpus {
        /// Only GPUs with free memory.
        #[arg(long)]
        available: bool,
    },
    /// Per pod and container: its slices, memory used vs limit, compute used vs share.
    Pods {
        /// Only idle slices: measured use under --threshold of the limit (memory and compute)
        /// for the whole --window, largest holding first (needs --prometheus).
        #[arg(long)]
        idle: bool,
        /// With --idle: the threshold, percent of the slice's limit.
        #[arg(long, default_value = "5", value_parser = parse_threshold, requires = "idle")]
        threshold: f64,
        /// With --idle: the window (30m, 1h, 6h, 1d).
        #[arg(long, default_value = "1h", value_parser = parse_window, requires = "idle")]
        window: u64,
    },
    /// Gives a workload's pods a GPU slice each: gpuslice.io/* limits in the containers, which
    /// the webhook turns into a claim of each pod, or a ResourceClaimTemplate and a claim.
    ///
    /// The form written: --form; else the form the workload has; for a new slice the limits
    /// form when the webhook (pods.gpuslice.io) is installed, else the claim form.
    Allocate(workload::AllocateArgs),
    /// Undoes `allocate`: the pod template as before (the gpuslice.io/* limits or the claim
    /// removed), the workload's ResourceClaimTemplates of the console deleted.
    Release(workload::ReleaseArgs),
    /// Budgets: per namespace (-n NS, default the context's; -A every one) the hard and used
    /// GPU memory, cores and GPUs of its ResourceQuotas (limits.gpuslice.io/memory, …/cores,
    /// …/gpus; HAMi's limits.nvidia.com/gpumem, …/gpucores, …/gpu in namespaces labelled
    /// gpuslice.io/hami-compat=true), used as the admission ledger (the quota's status)
    /// holds it; and where Kueue is installed, per ClusterQueue (-n: those the namespace's
    /// LocalQueues name) its gpuslice.io/memory quota, borrowing limit and use.
    Quota,
}

fn parse_threshold(v: &str) -> Result<f64, String> {
    idle::parse_threshold(v).map_err(|e| e.to_string())
}

fn parse_window(v: &str) -> Result<u64, String> {
    gpuslice_console::usage::parse_window(v).map_err(|e| e.to_string())
}

fn print_model(cli: &Cli, command: &Command, m: &Model) -> anyhow::Result<()> {
    if let Some(w) = render::usage_warning(m) {
        eprintln!("{w}");
    }
    for w in &m.warnings {
        eprintln!("warning: {w}");
    }
    let wide = cli.output == Some(Output::Wide);
    let structured = matches!(cli.output, Some(Output::Json | Output::Yaml));
    let text = match command {
        Command::Nodes { available } => {
            let nodes: Vec<&model::NodeView> = m
                .nodes
                .iter()
                .filter(|n| !available || n.largest_free_memory > 0)
                .collect();
            if structured {
                let v = json!({"total": m.total, "nodes": nodes, "usageUnavailable": m.usage_unavailable});
                render::encode(&v, cli.output.unwrap_or(Output::Json))?
            } else {
                render::nodes_table(&m.total, &nodes, wide)
            }
        }
        Command::Gpus { available } => {
            let gpus: Vec<&model::GpuView> = m
                .gpus
                .iter()
                .filter(|g| !available || g.memory.free > 0)
                .collect();
            if structured {
                let v = json!({"total": m.total, "gpus": gpus, "usageUnavailable": m.usage_unavailable});
                render::encode(&v, cli.output.unwrap_or(Output::Json))?
            } else {
                render::gpus_table(&m.total, &gpus, wide)
            }
        }
        Command::Pods { .. } => {
            let pods: Vec<&model::ContainerSlice> = m.pods.iter().collect();
            if structured {
                let v = json!({"pods": pods, "usageUnavailable": m.usage_unavailable});
                render::encode(&v, cli.output.unwrap_or(Output::Json))?
            } else {
                render::pods_table(&pods, cli.all_namespaces, wide)
            }
        }
        Command::Allocate(_) | Command::Release(_) | Command::Quota => String::new(),
    };
    print!("{text}");
    Ok(())
}

/// Why `quota`'s flags cannot be read, before anything is asked of the cluster.
#[derive(Debug, thiserror::Error)]
enum QuotaFlagError {
    #[error("quota: -n {namespace} and -A both given; pass one (-n NAMESPACE for one namespace, -A for every namespace)")]
    Both { namespace: String },
    #[error("quota: namespace `{0}` is not valid; accepted: a DNS-1123 label (a-z, 0-9, '-', at most 63)")]
    Namespace(String),
}

fn quota_flags(cli: &Cli) -> Result<(), QuotaFlagError> {
    match (&cli.namespace, cli.all_namespaces) {
        (Some(ns), true) => Err(QuotaFlagError::Both {
            namespace: ns.escape_default().to_string(),
        }),
        (Some(ns), false) if !gpuslice_dra::slices::is_dns_label(ns) => {
            Err(QuotaFlagError::Namespace(ns.escape_default().to_string()))
        }
        _ => Ok(()),
    }
}

/// Why `allocate`'s or `release`'s flags cannot be read, before anything is asked of the
/// cluster: they change one workload, in one namespace.
#[derive(Debug, thiserror::Error)]
enum WorkloadFlagError {
    #[error("{command}: -A (every namespace) does not apply: {command} changes one workload in one namespace; pass -n NAMESPACE, or neither for the context's namespace")]
    AllNamespaces { command: &'static str },
}

fn workload_flags(cli: &Cli, command: &'static str) -> Result<(), WorkloadFlagError> {
    if cli.all_namespaces {
        return Err(WorkloadFlagError::AllNamespaces { command });
    }
    Ok(())
}

fn print_budgets(cli: &Cli, scope: &Scope, b: &Budgets) -> anyhow::Result<()> {
    for w in &b.warnings {
        eprintln!("warning: {w}");
    }
    if let Some(why) = &b.queues_unavailable {
        eprintln!("warning: Kueue's ClusterQueues are not shown: {why}");
    }
    if let Some(o @ (Output::Json | Output::Yaml)) = cli.output {
        print!("{}", render::encode(b, o)?);
        return Ok(());
    }
    let mut text = String::new();
    if b.namespaces.is_empty() {
        let scope = match scope {
            Scope::All => "any namespace".to_string(),
            Scope::Namespace(ns) => format!("namespace {ns}"),
        };
        eprintln!("No ResourceQuota in {scope} names gpuslice's resources (docs/quotas.md).");
    } else {
        text.push_str(&render::budgets_table(&b.namespaces, cli.all_namespaces));
    }
    if let Some(queues) = b.queues.as_ref().filter(|q| !q.is_empty()) {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&render::queues_table(queues));
    }
    print!("{text}");
    Ok(())
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match &cli.command {
        Command::Quota => quota_flags(&cli)?,
        Command::Allocate(_) => workload_flags(&cli, "allocate")?,
        Command::Release(_) => workload_flags(&cli, "release")?,
        _ => {}
    }
    let cluster = client::connect(cli.kubeconfig.as_deref(), cli.context.as_deref()).await?;
    let namespace = cli
        .namespace
        .clone()
        .unwrap_or_else(|| cluster.default_namespace.clone());
    match &cli.command {
        Command::Pods {
            idle: true,
            threshold,
            window,
        } => {
            let opts = idle::IdleOptions {
                threshold_percent: *threshold,
                window: *window,
            };
            let only: Option<BTreeSet<String>> =
                (!cli.all_namespaces).then(|| BTreeSet::from([namespace.clone()]));
            let rows = idle::fetch_rows(
                &cluster.client,
                cli.prometheus.as_deref(),
                only.as_ref(),
                &opts,
            )
            .await?;
            let text = match cli.output {
                Some(o @ (Output::Json | Output::Yaml)) => render::encode(
                    &json!({"idle": rows, "thresholdPercent": opts.threshold_percent, "windowSeconds": opts.window}),
                    o,
                )?,
                _ => {
                    render::idle_table(&rows, cli.all_namespaces, cli.output == Some(Output::Wide))
                }
            };
            print!("{text}");
        }
        Command::Nodes { .. } | Command::Gpus { .. } | Command::Pods { .. } => {
            let scope = match (&cli.command, cli.all_namespaces) {
                (Command::Pods { .. }, true) => PodScope::All,
                (Command::Pods { .. }, false) => PodScope::Namespace(namespace.clone()),
                _ => PodScope::None,
            };
            let src = fetch::sources(&cluster.client, &scope, cli.prometheus.as_deref()).await?;
            let only: Option<BTreeSet<String>> =
                (!cli.all_namespaces).then(|| BTreeSet::from([namespace.clone()]));
            let m = model::build(&src, only.as_ref());
            print_model(&cli, &cli.command, &m)?;
        }
        Command::Allocate(args) => {
            let out =
                workload::allocate(&cluster.client, &namespace, args, cli.hami_compat).await?;
            print!("{out}");
        }
        Command::Release(args) => {
            let out = workload::release(&cluster.client, &namespace, args).await?;
            print!("{out}");
        }
        Command::Quota => {
            let scope = if cli.all_namespaces {
                Scope::All
            } else {
                Scope::Namespace(namespace.clone())
            };
            let b = budgets::fetch(&cluster.client, &scope, cli.hami_compat).await?;
            print_budgets(&cli, &scope, &b)?;
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `kubectl gpuslice --version` names the build, as `gpuslice --version` does.
    #[test]
    fn version_is_the_packages() {
        let e = Cli::try_parse_from(["kubectl-gpuslice", "--version"])
            .err()
            .map(|e| (e.kind(), e.to_string()));
        assert_eq!(
            e,
            Some((
                clap::error::ErrorKind::DisplayVersion,
                format!("kubectl-gpuslice {}\n", env!("CARGO_PKG_VERSION"))
            ))
        );
    }
}

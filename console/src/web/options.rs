//! The flags of `gpuslice console` and whose rights it acts with (the line every page
//! shows): the kubeconfig context and user kubectl would use, or the in-cluster account.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// `gpuslice console` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Address to listen on (`127.0.0.1:0`: a free port). The console acts with the
    /// kubeconfig's rights for anyone who reaches it: keep it on loopback, behind an
    /// authenticating proxy whose URL --public-url names, or put one in front of a
    /// non-loopback address.
    #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR:PORT")]
    pub listen: SocketAddr,
    /// The kubeconfig (default: $KUBECONFIG, else ~/.kube/config, else in-cluster).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context (default: its current context).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// Prometheus scraping the nodes' `gpuslice serve`, e.g. http://prometheus:9090
    /// (without it, used figures and charts are not shown).
    #[arg(long, env = "GPUSLICE_PROMETHEUS", value_name = "URL")]
    pub prometheus: Option<String>,
    /// Let the page allocate, edit and release workloads' slices (default: read-only).
    #[arg(long)]
    pub allow_edit: bool,
    /// Whether the webhook runs with --hami-compat: count HAMi's quota names
    /// (limits.nvidia.com/*) in namespaces labelled gpuslice.io/hami-compat=true, as it does
    /// (the default). `--hami-compat=false` where the webhook runs without it (the chart's
    /// default webhook.hamiCompat=false): they count nowhere, and the Budgets page says so.
    #[arg(long, env = "GPUSLICE_HAMI_COMPAT", value_name = "BOOL", default_value_t = true,
          num_args = 0..=1, require_equals = true, default_missing_value = "true",
          action = clap::ArgAction::Set)]
    pub hami_compat: bool,
    /// A URL people open the console by through an authenticating proxy or ingress, e.g.
    /// https://gpu.example.com (repeatable; http or https, a host and an optional port, no
    /// path but /). A request whose Host names it passes the Host check, and a POST whose
    /// Origin is it the Origin check, which otherwise accept only the listen address (and,
    /// listening on loopback or 0.0.0.0, localhost or a loopback IP with any port, as
    /// `kubectl port-forward` sends).
    #[arg(long = "public-url", value_name = "URL")]
    pub public_url: Vec<String>,
    /// Connections served at once. At the cap a new connection takes the slot of the one
    /// that has waited longest on its client (idle, a slow request, an answer not read);
    /// while every one is being served, new ones wait in the kernel's accept queue.
    #[arg(long, default_value_t = 256, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub max_connections: u32,
}

/// Whose rights the console acts with, from the kubeconfig kubectl would read.
pub fn rights(kubeconfig: Option<&Path>, context: Option<&str>) -> String {
    let kc = match kubeconfig {
        Some(p) => kube::config::Kubeconfig::read_from(p).ok(),
        None => kube::config::Kubeconfig::read().ok(),
    };
    let Some(kc) = kc else {
        return "Acts with the rights of its in-cluster service account: whoever opens this page reads (and with --allow-edit changes) the cluster as that account.".to_string();
    };
    let ctx = context.map(str::to_string).or(kc.current_context.clone());
    let user = ctx
        .as_ref()
        .and_then(|c| kc.contexts.iter().find(|n| &n.name == c))
        .and_then(|n| n.context.as_ref())
        .and_then(|c| c.user.clone());
    format!(
        "Acts with the rights of kubeconfig context `{}` (user `{}`): whoever opens this page reads (and with --allow-edit changes) the cluster as that user.",
        ctx.as_deref().unwrap_or("(none)"),
        user.as_deref().unwrap_or("(none)")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        opts: Options,
    }

    #[test]
    fn hami_compat_is_on_unless_told_the_webhook_runs_without_it() {
        use clap::Parser;
        let parse = |args: &[&str]| Cli::try_parse_from(args).unwrap().opts.hami_compat;
        // The flag, else its variable (read by clap from this process's environment, which
        // this test does not set: on, HAMi's names counting where labelled, docs/quotas.md).
        if std::env::var_os("GPUSLICE_HAMI_COMPAT").is_none() {
            assert!(parse(&["console"]));
        }
        assert!(parse(&["console", "--hami-compat"]));
        assert!(parse(&["console", "--hami-compat=true"]));
        assert!(!parse(&["console", "--hami-compat=false"]));
        assert!(Cli::try_parse_from(["console", "--hami-compat=maybe"]).is_err());
        // A value only after `=`: the next word is never taken for it.
        assert!(Cli::try_parse_from(["console", "--hami-compat", "false"]).is_err());
    }

    #[test]
    fn rights_name_the_context_and_user() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("kubeconfig");
        std::fs::write(&p, "apiVersion: v1\nkind: Config\ncurrent-context: kind\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\nusers: [{name: admin, user: {token: x}}, {name: viewer, user: {token: y}}]\ncontexts: [{name: kind, context: {cluster: c, user: admin}}, {name: ro, context: {cluster: c, user: viewer}}]\n").unwrap();
        let r = rights(Some(&p), None);
        assert!(r.contains("context `kind` (user `admin`)"), "{r}");
        let r = rights(Some(&p), Some("ro"));
        assert!(r.contains("context `ro` (user `viewer`)"), "{r}");
    }
}

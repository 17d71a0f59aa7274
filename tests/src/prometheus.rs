//! A real Prometheus server (Debian's `prometheus`) for the console tests: it scrapes the
//! given `gpuslice serve` exporters every second (`honor_labels: true`, as
//! docs/observability.md configures it) and optionally a real kubelet's cAdvisor (with the
//! cluster's client certificate, the target labelled with its node name) on a free port of
//! 127.0.0.1, with its data and log in a temporary directory; optionally with history
//! written before it starts (`promtool tsdb create-blocks-from openmetrics`, Debian's
//! promtool from the same package); killed when dropped.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A running Prometheus.
#[derive(Debug)]
pub struct Prometheus {
    child: Child,
    /// `http://127.0.0.1:PORT`, what `--prometheus` takes.
    pub url: String,
    dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts Prometheus scraping `targets`; panics naming the install step when the
    /// `prometheus` binary is missing.
    pub fn start(targets: &[SocketAddr]) -> Prometheus {
        Prometheus::start_with(targets, "", None)
    }

    /// Starts Prometheus scraping `targets` and the scrape configs `more` (YAML list items,
    /// e.g. [`kubelet_cadvisor`]), holding `history` (OpenMetrics text, `# EOF` included)
    /// written into its storage by promtool before it starts.
    pub fn start_with(targets: &[SocketAddr], more: &str, history: Option<&str>) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        std::fs::write(
            &config,
            format!(
                "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nscrape_configs:\n- job_name: gpuslice\n  honor_labels: true\n  static_configs: [{{targets: [{}]}}]\n{more}",
                targets.join(", ")
            ),
        )
        .unwrap();
        if let Some(history) = history {
            let file = dir.path().join("history.om");
            std::fs::write(&file, history).unwrap();
            let out = Command::new("promtool")
                .args(["tsdb", "create-blocks-from", "openmetrics"])
                .arg(&file)
                .arg(dir.path().join("data"))
                .output()
                .expect(
                    "run promtool (Debian package prometheus; scripts/install-deps.sh installs it)",
                );
            assert!(
                out.status.success(),
                "promtool tsdb create-blocks-from openmetrics failed: {}{}",
                String::from_utf8_lossy(&out.stderr),
                String::from_utf8_lossy(&out.stdout)
            );
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect(
                "start prometheus (Debian package prometheus; scripts/install-deps.sh installs it)",
            );
        Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            dir,
        }
    }

    /// `curl URL/path`.
    pub fn get(&self, path: &str) -> String {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "10"])
            .arg(format!("{}{path}", self.url))
            .output()
            .expect("curl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// What it logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }
}

/// The scrape config of a real kubelet's cAdvisor (`https://ADDRESS/metrics/cadvisor`) with
/// a client certificate the kubelet accepts (the cluster's admin one), its target labelled
/// `node: NAME`, which the console groups nodes' CPU and memory by.
pub fn kubelet_cadvisor(node: &str, address: &str, cert: &Path, key: &Path) -> String {
    format!(
        "- job_name: kubelet-cadvisor\n  scheme: https\n  metrics_path: /metrics/cadvisor\n  tls_config: {{insecure_skip_verify: true, cert_file: '{}', key_file: '{}'}}\n  static_configs: [{{targets: ['{address}'], labels: {{node: '{node}'}}}}]\n",
        cert.display(),
        key.display()
    )
}

/// One series of history: its name, labels and `(unix seconds, value)` samples.
pub type HistorySeries = (String, BTreeMap<String, String>, Vec<(u64, f64)>);

/// OpenMetrics text of gauges: per series (name, labels) its `(unix seconds, value)`
/// samples; labels with empty values are left out, as Prometheus leaves them out of a
/// scrape.
pub fn openmetrics(series: &[HistorySeries]) -> String {
    let mut by_name: BTreeMap<&str, Vec<&HistorySeries>> = BTreeMap::new();
    for s in series {
        by_name.entry(s.0.as_str()).or_default().push(s);
    }
    let mut out = String::new();
    for (name, all) in by_name {
        out.push_str(&format!("# TYPE {name} gauge\n"));
        for (_, labels, samples) in all {
            let labels: Vec<String> = labels
                .iter()
                .filter(|(_, v)| !v.is_empty())
                .map(|(k, v)| format!("{k}=\"{v}\""))
                .collect();
            for (t, v) in samples {
                out.push_str(&format!("{name}{{{}}} {v} {t}\n", labels.join(",")));
            }
        }
    }
    out.push_str("# EOF\n");
    out
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

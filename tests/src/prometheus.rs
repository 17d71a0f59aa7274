//! A real Prometheus server (Debian's `prometheus`) for the console tests: it scrapes the
//! given `gpuslice serve` exporters every second (`honor_labels: true`, as
//! docs/observability.md configures it) on a free port of 127.0.0.1, with its data and log in
//! a temporary directory; killed when dropped.

use std::net::SocketAddr;
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
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        std::fs::write(
            &config,
            format!(
                "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nscrape_configs:\n- job_name: gpuslice\n  honor_labels: true\n  static_configs: [{{targets: [{}]}}]\n",
                targets.join(", ")
            ),
        )
        .unwrap();
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

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

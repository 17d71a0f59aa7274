//! A `gpuslice serve` started for one test: its address (from its first log line), its
//! `/metrics` parsed into series, and its log kept for failure messages. Killed when dropped.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use crate::env::bin;
use crate::node::TestNode;

/// A running exporter.
#[derive(Debug)]
pub struct Exporter {
    child: Child,
    pub addr: SocketAddr,
    log: Arc<Mutex<String>>,
}

/// One series of a scrape.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Exporter {
    /// `gpuslice --config <node> serve --listen 127.0.0.1:0`.
    pub fn start(node: &TestNode) -> Exporter {
        let mut child = Command::new(bin("gpuslice"))
            .arg("--config")
            .arg(&node.config)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start gpuslice serve");
        let mut lines = BufReader::new(child.stderr.take().expect("stderr"));
        let mut first = String::new();
        lines.read_line(&mut first).expect("first line");
        let addr = first
            .trim()
            .strip_prefix("gpuslice serve: listening on http://")
            .and_then(|a| a.strip_suffix("/metrics"))
            .unwrap_or_else(|| panic!("unexpected first line of gpuslice serve: {first:?}"))
            .parse()
            .expect("address");
        let log = Arc::new(Mutex::new(String::new()));
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in lines.lines().map_while(Result::ok) {
                let mut l = sink.lock().unwrap_or_else(|p| p.into_inner());
                l.push_str(&line);
                l.push('\n');
            }
        });
        Exporter { child, addr, log }
    }

    /// Everything it logged after its first line.
    pub fn log(&self) -> String {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// `GET /metrics` in the Prometheus text format.
    pub fn text(&self) -> String {
        let mut s = TcpStream::connect(self.addr).expect("connect");
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: e2e\r\n\r\n")
            .expect("request");
        let mut resp = String::new();
        s.read_to_string(&mut resp).expect("response");
        let (head, body) = resp.split_once("\r\n\r\n").expect("HTTP response");
        assert!(head.split(' ').nth(1) == Some("200"), "{head}");
        body.to_string()
    }

    pub fn scrape(&self) -> Vec<Series> {
        parse(&self.text())
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Parses the Prometheus text format (the subset the exporter writes).
pub fn parse(text: &str) -> Vec<Series> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (head, value) = l.rsplit_once(' ')?;
            let (name, labels) = head.split_once('{').unwrap_or((head, "}"));
            let labels = labels
                .trim_end_matches('}')
                .split("\",")
                .filter(|p| !p.is_empty())
                .filter_map(|p| {
                    let (k, v) = p.split_once("=\"")?;
                    Some((k.to_string(), v.trim_end_matches('"').to_string()))
                })
                .collect();
            Some(Series {
                name: name.into(),
                labels,
                value: value.parse().ok()?,
            })
        })
        .collect()
}

/// The value of `name` whose labels include all of `want`.
pub fn value(series: &[Series], name: &str, want: &[(&str, &str)]) -> Option<f64> {
    series
        .iter()
        .find(|s| {
            s.name == name
                && want
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
}

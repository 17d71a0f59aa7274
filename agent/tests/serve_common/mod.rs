//! Helpers for the exporter's tests: a node state directory made with the registry API (a
//! fake process table), slice files written as the spec edit writes them, a fixture `/proc`,
//! a scripted GPU meter, and a parser for the exposition text.

#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpuslice_agent::collect::{Collector, Sources};
use gpuslice_agent::errors::ErrorLog;
use gpuslice_agent::gpu::{GpuMeter, Reading};
use gpuslice_config::{PlacementConfig, Policy, Quantity};
use gpuslice_hook::create::slicewriter::write_slice_files;
use gpuslice_registry::{
    no_cleanup, FakeSystem, Gpu, Inventory, KubernetesRef, Options, Owner, Registry, Request,
    Selector,
};
use gpuslice_slice::usage::{ProcessIdentity, UsageFile};
use gpuslice_slice::USAGE_FILE;

pub const GI: u64 = 1 << 30;

pub fn uuid(i: u32) -> String {
    format!("GPU-{i:08x}-1111-2222-3333-444444444444")
}

/// A meter whose next readings the test scripts; shared so the test can change them.
#[derive(Clone, Default)]
pub struct FakeMeter(pub Arc<Mutex<Reading>>);

impl GpuMeter for FakeMeter {
    fn read(&mut self) -> Reading {
        self.0.lock().unwrap().clone()
    }
}

/// A node: state dir with a registry of `gpus` GPUs of 10 GiB, a fixture `/proc`.
pub struct Node {
    pub state: tempfile::TempDir,
    pub proc: tempfile::TempDir,
    pub sys: Arc<FakeSystem>,
    pub reg: Registry,
}

impl Node {
    pub fn new(gpus: u32) -> Node {
        let state = tempfile::tempdir().unwrap();
        let proc = tempfile::tempdir().unwrap();
        let sys = Arc::new(FakeSystem::new(1_000_000));
        let options = Options {
            placement: PlacementConfig {
                policy: Policy::Binpack,
                memory_overcommit: 1.0,
                max_slices_per_gpu: None,
            },
            pending_timeout: Duration::from_secs(60),
            recheck_interval: Options::DEFAULT_RECHECK,
        };
        let reg = Registry::open(state.path(), options, sys.clone(), no_cleanup()).unwrap();
        reg.set_inventory(Inventory {
            gpus: (0..gpus)
                .map(|i| Gpu {
                    index: i,
                    uuid: uuid(i),
                    model: "NVIDIA H200".into(),
                    memory_total: 10 * GI,
                    minor: i,
                    pci_bus_id: None,
                    numa_node: None,
                    pcie_root: None,
                })
                .collect(),
        })
        .unwrap();
        // The exporter's own pid namespace.
        fake_process(proc.path(), "self", 4026531836, 1, "0::/\n");
        Node {
            state,
            proc,
            sys,
            reg,
        }
    }

    /// A slice of `memory` bytes and `cores` % on GPU `gpu`, with its limits and usage files
    /// written as the spec edit writes them; bound to container `cid` with init pid `pid`
    /// when given (Kubernetes names when `k8s`).
    pub fn slice(
        &self,
        memory: u64,
        cores: u8,
        gpu: u32,
        bound: Option<(&str, u32)>,
        k8s: Option<(&str, &str, &str)>,
    ) -> String {
        let owner = Owner::Container {
            container_id: None,
            process: None,
            kubernetes: k8s.map(|(ns, pod, c)| KubernetesRef {
                namespace: ns.into(),
                pod: pod.into(),
                pod_uid: None,
                container: c.into(),
                unknown: Default::default(),
            }),
        };
        let req = Request {
            memory: Some(Quantity::Bytes(memory)),
            cores,
            selectors: vec![Selector::Index(gpu)],
            ..Request::new(owner)
        };
        let r = self.reg.reserve(&req).unwrap();
        let dir = self.reg.slice_dir(&r.id).unwrap();
        // The files the create path writes, by the create path's own function.
        write_slice_files(&dir, &r, false).unwrap();
        if let Some((cid, pid)) = bound {
            self.sys.spawn(pid, u64::from(pid) * 10);
            self.reg.bind(&r.id, cid, pid).unwrap();
        }
        r.id
    }

    pub fn usage_path(&self, id: &str) -> PathBuf {
        self.reg.slice_dir(id).unwrap().join(USAGE_FILE)
    }

    /// Attaches to a slice's usage file as a container process (`ns_pid` in namespace
    /// `pid_ns`) and holds `bytes` on its device 0; the slot lives while the handle does.
    pub fn hold(&self, id: &str, pid_ns: u64, ns_pid: u32, bytes: u64) -> UsageFile {
        let u = UsageFile::open(
            &self.usage_path(id),
            ProcessIdentity {
                pid: ns_pid,
                pid_ns,
            },
        )
        .unwrap();
        u.reserve(0, bytes, u64::MAX).unwrap();
        u
    }

    pub fn collector(&self, meter: Option<FakeMeter>) -> Collector {
        Collector::new(
            Sources {
                state_dir: self.state.path().to_path_buf(),
                proc_root: self.proc.path().to_path_buf(),
                node: "node-a".into(),
            },
            self.sys.clone(),
            meter.map(|m| Box::new(m) as Box<dyn GpuMeter>),
            ErrorLog::with_sink(Box::new(|_| {})),
        )
    }
}

/// A fake `<root>/<who>` with a pid namespace link, an `NSpid` line and a cgroup file.
pub fn fake_process(root: &Path, who: &str, ns: u64, ns_pid: u32, cgroup: &str) {
    let dir = root.join(who);
    std::fs::create_dir_all(dir.join("ns")).unwrap();
    let link = dir.join("ns/pid");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(format!("pid:[{ns}]"), link).unwrap();
    std::fs::write(
        dir.join("status"),
        format!("Name:\tprobe\nNSpid:\t{who}\t{ns_pid}\n"),
    )
    .unwrap();
    std::fs::write(dir.join("cgroup"), cgroup).unwrap();
}

/// One series of the exposition text.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// The series of Prometheus text (labels without escapes, as ours are).
pub fn parse(text: &str) -> Vec<Series> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (head, value) = l.rsplit_once(' ').expect("value");
            let (name, labels) = match head.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (head, ""),
            };
            let labels = labels
                .split("\",")
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (k, v) = p.split_once("=\"").expect("label");
                    (k.to_string(), v.trim_end_matches('"').to_string())
                })
                .collect();
            Series {
                name: name.to_string(),
                labels,
                value: value.parse().expect("number"),
            }
        })
        .collect()
}

/// The series named `name` whose labels include every `(key, value)` of `with`.
pub fn find<'a>(all: &'a [Series], name: &str, with: &[(&str, &str)]) -> Vec<&'a Series> {
    all.iter()
        .filter(|s| {
            s.name == name
                && with
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .collect()
}

/// The single value of `name` with labels `with`; panics when absent or ambiguous.
pub fn value(all: &[Series], name: &str, with: &[(&str, &str)]) -> f64 {
    let found = find(all, name, with);
    assert_eq!(found.len(), 1, "{name} {with:?}: {found:?}");
    found[0].value
}

/// Collects and encodes one scrape as Prometheus text, parsed.
pub fn scrape(c: &mut Collector, now: Instant) -> (String, Vec<Series>) {
    let s = c.collect(now);
    let text = gpuslice_agent::encode::encode(&s, c.errors(), gpuslice_agent::encode::Format::Text);
    let series = parse(&text);
    (text, series)
}

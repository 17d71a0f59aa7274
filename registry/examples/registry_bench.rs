//! Benchmark driver for the registry (run through `scripts/bench-registry.sh`).
//!
//! ```text
//! registry_bench setup DIR [--gpus N] [--reservations N]   node of N × 141Gi, N live reservations
//! registry_bench once DIR                                  one reserve + release, as a whole process
//! registry_bench noop DIR                                  same process start, no registry work
//! registry_bench loop DIR [--count N]                      N reserve + release in one process
//! registry_bench throughput DIR [--procs N] [--seconds S] [--request fit|contended]
//!                                                          N processes reserve + release in a loop
//! registry_bench teardown DIR                              stop the owner processes of setup
//! ```
//!
//! The reservations of `setup` are bound to real `sleep` processes (one each), so every
//! operation checks 100 live owners as on a busy node.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuslice_config::{PlacementConfig, Policy, Quantity};
use gpuslice_registry::{
    no_cleanup, read_registry, violations, Gpu, Inventory, Options, Owner, RealSystem, Registry,
    Request,
};

const GI: u64 = 1 << 30;
const PIDS_FILE: &str = "bench-owner-pids";

type Error = Box<dyn std::error::Error>;

fn options() -> Options {
    Options {
        placement: PlacementConfig {
            policy: Policy::Binpack,
            memory_overcommit: 1.0,
            max_slices_per_gpu: None,
        },
        pending_timeout: Duration::from_secs(120),
        recheck_interval: Options::DEFAULT_RECHECK,
    }
}

fn open(dir: &Path) -> Result<Registry, Error> {
    Ok(Registry::open(
        dir,
        options(),
        Arc::new(RealSystem::new("/proc")),
        no_cleanup(),
    )?)
}

/// The value after `--name`, parsed, or `default`.
fn flag<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> Result<T, Error> {
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(i) => {
            let v = args
                .get(i + 1)
                .ok_or_else(|| format!("{name} needs a value"))?;
            v.parse()
                .map_err(|_| format!("{name} {v}: not a number").into())
        }
    }
}

fn setup(dir: &Path, gpus: u32, reservations: u32) -> Result<(), Error> {
    std::fs::create_dir_all(dir)?;
    let reg = open(dir)?;
    let inventory = Inventory {
        gpus: (0..gpus)
            .map(|i| Gpu {
                index: i,
                uuid: format!("GPU-{i:08x}-bench-0000-0000-000000000000"),
                model: "NVIDIA H200".into(),
                memory_total: 141 * GI,
                minor: i,
                pci_bus_id: None,
                numa_node: None,
                pcie_root: None,
            })
            .collect(),
    };
    reg.set_inventory(inventory)?;
    let mut pids = String::new();
    for n in 0..reservations {
        // A long-lived owner per reservation; it outlives this process (teardown stops it).
        let owner = Command::new("sleep")
            .arg("86400")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let request = Request {
            memory: Some(Quantity::Bytes(4 * GI)),
            cores: 5,
            ..Request::new(Owner::container())
        };
        let r = reg.reserve(&request)?;
        reg.bind(&r.id, &format!("bench-{n}"), owner.id())?;
        pids.push_str(&format!("{}\n", owner.id()));
    }
    std::fs::write(dir.join(PIDS_FILE), pids)?;
    let file = read_registry(dir)?;
    println!(
        "{} GPUs, {} live reservations",
        file.inventory.gpus.len(),
        file.reservations.len()
    );
    Ok(())
}

fn teardown(dir: &Path) -> Result<(), Error> {
    let text = std::fs::read_to_string(dir.join(PIDS_FILE)).unwrap_or_default();
    for pid in text.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
        if let Some(pid) = rustix::process::Pid::from_raw(pid) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::Term);
        }
    }
    Ok(())
}

/// The request of `once` and of `--request contended` workers: 40Gi and 10% cores, which
/// only the GPUs that setup left without slices can take (three on each, nine in all), so
/// 16 workers contend for capacity: many reserves are refused, and any oversubscription
/// would show.
fn contended() -> Request {
    Request {
        memory: Some(Quantity::Bytes(40 * GI)),
        cores: 10,
        ..Request::new(Owner::container())
    }
}

/// The request of `--request fit` workers: 10Gi and 10% cores, of which the free GPUs hold
/// 30, so 16 workers are never refused and every operation is a reserve or a release.
fn fitting() -> Request {
    Request {
        memory: Some(Quantity::Bytes(10 * GI)),
        ..contended()
    }
}

/// The request a `--request` value names.
fn request(kind: &str) -> Result<Request, Error> {
    match kind {
        "contended" => Ok(contended()),
        "fit" => Ok(fitting()),
        other => Err(format!("--request {other}: accepted: fit, contended").into()),
    }
}

fn once(dir: &Path) -> Result<(), Error> {
    let reg = open(dir)?;
    let r = reg.reserve(&contended())?;
    reg.release(&r.id)?;
    Ok(())
}

/// In-process cost: `count` reserve + release pairs, timed as a whole.
fn repeat(dir: &Path, count: u32) -> Result<(), Error> {
    let reg = open(dir)?;
    let t0 = Instant::now();
    for _ in 0..count {
        let r = reg.reserve(&contended())?;
        reg.release(&r.id)?;
    }
    let per = t0.elapsed() / count.max(1);
    println!(
        "{count} reserve+release pairs in one process: {} µs per pair",
        per.as_micros()
    );
    Ok(())
}

/// Loops reserve + release until `until` (unix ms); prints `pairs refused`.
fn worker(dir: &Path, until_ms: u64, request: &Request) -> Result<(), Error> {
    let reg = open(dir)?;
    let (mut pairs, mut refused) = (0u64, 0u64);
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    };
    while now() < until_ms {
        match reg.reserve(request) {
            Ok(r) => {
                reg.release(&r.id)?;
                pairs += 1;
            }
            Err(e) if e.refusal().is_some() => refused += 1,
            Err(e) => return Err(e.into()),
        }
    }
    println!("{pairs} {refused}");
    Ok(())
}

fn throughput(dir: &Path, procs: u32, seconds: u64, kind: &str) -> Result<(), Error> {
    request(kind)?;
    let reg = open(dir)?;
    let before = read_registry(dir)?;
    let placement = reg.options().placement.clone();
    // A checker samples the file throughout the run: no moment may be oversubscribed.
    let stop = Arc::new(AtomicBool::new(false));
    let samples = Arc::new(AtomicU64::new(0));
    let checker = {
        let (stop, samples, dir, placement) = (
            stop.clone(),
            samples.clone(),
            dir.to_path_buf(),
            placement.clone(),
        );
        std::thread::spawn(move || -> Result<(), String> {
            while !stop.load(Ordering::Relaxed) {
                let file = read_registry(&dir).map_err(|e| e.to_string())?;
                let broken = violations(&file, &placement);
                if !broken.is_empty() {
                    return Err(format!("oversubscribed: {broken:?}"));
                }
                samples.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(())
        })
    };
    let exe = std::env::current_exe()?;
    let start_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as u64
        + 300;
    let until_ms = start_ms + seconds * 1000;
    let children: Vec<_> = (0..procs)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "worker",
                    &dir.display().to_string(),
                    &until_ms.to_string(),
                    kind,
                ])
                .stdout(Stdio::piped())
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    let t0 = Instant::now();
    let (mut pairs, mut refused) = (0u64, 0u64);
    for mut c in children {
        let out = c.stdout.take().ok_or("no stdout")?;
        let mut line = String::new();
        BufReader::new(out).read_line(&mut line)?;
        if !c.wait()?.success() {
            return Err("a worker failed".into());
        }
        let mut f = line.split_whitespace().map(str::parse::<u64>);
        pairs += f.next().ok_or("no count")??;
        refused += f.next().ok_or("no count")??;
    }
    let elapsed = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    checker.join().map_err(|_| "checker panicked")??;
    let after = read_registry(dir)?;
    let broken = violations(&after, &placement);
    if !broken.is_empty() {
        return Err(format!("oversubscribed at the end: {broken:?}").into());
    }
    if after.reservations != before.reservations {
        return Err("the live reservations changed during the run".into());
    }
    let secs = seconds as f64;
    println!(
        "{procs} processes, {kind} requests, {seconds} s: {pairs} reserve+release pairs ({:.0}/s), \
         {refused} refused ({:.0}/s), {:.0} registry operations/s; \
         {} samples without oversubscription; wall {:.1} s",
        pairs as f64 / secs,
        refused as f64 / secs,
        (2 * pairs + refused) as f64 / secs,
        samples.load(Ordering::Relaxed),
        elapsed.as_secs_f64()
    );
    Ok(())
}

fn run(args: &[String]) -> Result<(), Error> {
    let usage = "usage: registry_bench setup|once|noop|loop|throughput|teardown DIR [options]";
    let cmd = args.first().ok_or(usage)?;
    let dir = PathBuf::from(args.get(1).ok_or(usage)?);
    let rest = &args[2..];
    match cmd.as_str() {
        "setup" => setup(
            &dir,
            flag(rest, "--gpus", 8)?,
            flag(rest, "--reservations", 100)?,
        ),
        "once" => once(&dir),
        "noop" => Ok(()),
        "loop" => repeat(&dir, flag(rest, "--count", 1000)?),
        "throughput" => throughput(
            &dir,
            flag(rest, "--procs", 16)?,
            flag(rest, "--seconds", 5)?,
            &flag(rest, "--request", "contended".to_string())?,
        ),
        "worker" => worker(
            &dir,
            rest.first().ok_or(usage)?.parse()?,
            &request(rest.get(1).ok_or(usage)?)?,
        ),
        "teardown" => teardown(&dir),
        _ => Err(usage.into()),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("registry_bench: {e}");
            ExitCode::FAILURE
        }
    }
}

//! `burn` against the simulated driver: one process alone gets the whole device, two on one
//! device share it through the device's FIFO, and two on different devices do not interact.
//! Bounds are wide: they check the time model, not the speed of this machine.

use crate::common;
use common::*;

/// 50 ms of work queued per batch: robust to a loaded machine delaying the probe.
const BURN: &[&str] = &[
    "burn",
    "--seconds",
    "3",
    "--kernel-us",
    "2000",
    "--sync-every",
    "25",
];

#[test]
fn a_burn_alone_gets_the_device() {
    let node = node(1, GIB);
    let v = json(&node, BURN);
    assert!(f(&v, "nominal_share") > 0.9, "{v}");
    assert!(f(&v, "event_share") > 0.9, "{v}");
    // Events time the kernels at their modelled duration (2 ms).
    assert!((f(&v, "event_kernel_us") - 2000.0).abs() < 100.0, "{v}");
}

fn burn_pair(node: &SimFixture, devices: [&str; 2]) -> (serde_json::Value, serde_json::Value) {
    let a = probe(node, &[&["--device", devices[0]], BURN].concat()).output_async();
    let b = json(node, &[&["--device", devices[1]], BURN].concat());
    (a.finish(), b)
}

trait Async {
    fn output_async(&mut self) -> Pending;
}

struct Pending(std::process::Child);

impl Async for std::process::Command {
    fn output_async(&mut self) -> Pending {
        Pending(self.stdout(std::process::Stdio::piped()).spawn().unwrap())
    }
}

impl Pending {
    fn finish(self) -> serde_json::Value {
        let out = self.0.wait_with_output().unwrap();
        assert!(out.status.success());
        serde_json::from_slice(out.stdout.split(|b| *b == b'\n').next().unwrap()).unwrap()
    }
}

#[test]
fn two_burns_on_one_device_split_it() {
    let node = node(1, GIB);
    let (a, b) = burn_pair(&node, ["0", "0"]);
    let (sa, sb) = (f(&a, "nominal_share"), f(&b, "nominal_share"));
    assert!(
        (0.3..0.7).contains(&sa) && (0.3..0.7).contains(&sb),
        "{a}\n{b}"
    );
    assert!(
        sa + sb > 0.85 && sa + sb < 1.05,
        "the device stays busy but is never double-booked: {a}\n{b}"
    );
}

#[test]
fn burns_on_different_devices_do_not_interact() {
    let node = node(2, GIB);
    let (a, b) = burn_pair(&node, ["0", "1"]);
    assert!(
        f(&a, "nominal_share") > 0.9 && f(&b, "nominal_share") > 0.9,
        "{a}\n{b}"
    );
}

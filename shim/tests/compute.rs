//! Acceptance 4: on the simulated GPU a burn alone holds its compute share (10, 30, 50, 90)
//! within ±5 points, through every launch entry point and whichever context is current at the
//! launch, and two slices at 20 and 70 on one GPU both hold theirs.

use crate::common;
use common::*;

use std::process::Stdio;

fn share(v: &serde_json::Value) -> f64 {
    v["nominal_share"]
        .as_f64()
        .unwrap_or_else(|| panic!("no share in {v}"))
        * 100.0
}

/// The checks run one after another (one test): a share is only meaningful when the CPUs
/// are not shared with other burns of the same test binary.
#[test]
fn compute_shares_are_held() {
    a_burn_alone_holds_its_share();
    the_deprecated_launches_are_paced_alike();
    launches_are_paced_in_the_streams_context();
    two_slices_on_one_gpu_both_hold_their_shares();
    two_processes_of_one_slice_share_its_compute();
}

fn a_burn_alone_holds_its_share() {
    for cores in [10u8, 30, 50, 90] {
        let node = SliceNode::new(&[16 * GIB], &[(4 * GIB, cores)]);
        let v = run_json(node.probe(&["burn", "--seconds", "2"]));
        let got = share(&v);
        assert!(
            (got - f64::from(cores)).abs() <= 5.0,
            "cores {cores}: achieved {got:.1} %: {v}"
        );
    }
}

fn the_deprecated_launches_are_paced_alike() {
    // Kernels launched through cuLaunchGridAsync, cuLaunchGrid, cuLaunch or
    // cuLaunchCooperativeKernelMultiDevice hold the share as cuLaunchKernel's do: unpaced,
    // the burn would take the whole GPU.
    let node = SliceNode::new(&[16 * GIB], &[(4 * GIB, 30)]);
    for api in ["grid-async", "grid", "legacy", "multi-device"] {
        let v = run_json(node.probe(&["burn", "--seconds", "2", "--launch", api]));
        let got = share(&v);
        assert!(
            (got - 30.0).abs() <= 5.0,
            "--launch {api}: achieved {got:.1} % of a 30 % share: {v}"
        );
    }
}

fn launches_are_paced_in_the_streams_context() {
    // A kernel launched on a stream runs in the stream's context, whichever context is
    // current or none: with none the pacer found no device, with another context its events
    // could not be recorded on the stream, and either way the burn took the whole GPU.
    let node = SliceNode::new(&[16 * GIB], &[(4 * GIB, 30)]);
    for current in ["none", "other"] {
        let v = run_json(node.probe(&["burn", "--seconds", "2", "--current", current]));
        let got = share(&v);
        assert!(
            (got - 30.0).abs() <= 5.0,
            "--current {current}: achieved {got:.1} % of a 30 % share: {v}"
        );
    }
}

fn two_slices_on_one_gpu_both_hold_their_shares() {
    let node = SliceNode::new(&[16 * GIB], &[(4 * GIB, 20)]);
    let other = node.add_slice("other", &[(4 * GIB, 70)]);
    let a = node
        .probe(&["burn", "--seconds", "3"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn a");
    let b = node
        .probe_in(&other, &["burn", "--seconds", "3"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn b");
    let va = json_lines(&a.wait_with_output().expect("a"))
        .pop()
        .expect("a json");
    let vb = json_lines(&b.wait_with_output().expect("b"))
        .pop()
        .expect("b json");
    assert!(
        (share(&va) - 20.0).abs() <= 5.0,
        "20 % slice got {:.1} %: {va}",
        share(&va)
    );
    assert!(
        (share(&vb) - 70.0).abs() <= 5.0,
        "70 % slice got {:.1} %: {vb}",
        share(&vb)
    );
}

fn two_processes_of_one_slice_share_its_compute() {
    let node = SliceNode::new(&[16 * GIB], &[(4 * GIB, 40)]);
    let a = node
        .probe(&["burn", "--seconds", "3"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn a");
    let b = node
        .probe(&["burn", "--seconds", "3"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn b");
    let va = json_lines(&a.wait_with_output().expect("a"))
        .pop()
        .expect("a json");
    let vb = json_lines(&b.wait_with_output().expect("b"))
        .pop()
        .expect("b json");
    let total = share(&va) + share(&vb);
    assert!(
        (total - 40.0).abs() <= 5.0,
        "together {total:.1} % of a 40 % slice: {va} {vb}"
    );
}

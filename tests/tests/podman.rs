//! podman on a simulated node: whole GPUs through the node CDI spec,
//! slices through the hooks.d precreate hook, and the same view whether podman
//! or gpuslice applies a slice's CDI spec.

use std::collections::BTreeSet;
use std::process::Output;

use gpuslice_e2e::image::podman_image;
use gpuslice_e2e::node::probe;
use gpuslice_e2e::podman::Podman;
use gpuslice_e2e::view::{assert_slice_view, SLICE_ANNOTATIONS, SLICE_CHECKS};
use gpuslice_e2e::{lock, Resource, TestNode};

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "podman failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn nvidia_nodes(text: &str) -> BTreeSet<String> {
    text.split_whitespace()
        .filter(|w| w.starts_with("nvidia"))
        .map(str::to_string)
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn whole_gpu_by_index_uuid_and_all() {
    let _s = lock(&[Resource::Cdi, Resource::Podman]);
    let node = TestNode::new(&["10Gi", "10Gi"]);
    let podman = Podman::new();
    let image = podman_image();
    let uuid1 = node.uuid(1);
    let cases = [
        (
            "gpuslice.io/gpu=0".to_string(),
            set(&["nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]),
        ),
        (
            format!("gpuslice.io/gpu={uuid1}"),
            set(&["nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]),
        ),
        (
            "gpuslice.io/gpu=all".to_string(),
            set(&[
                "nvidia0",
                "nvidia1",
                "nvidiactl",
                "nvidia-uvm",
                "nvidia-uvm-tools",
            ]),
        ),
    ];
    for (device, want) in cases {
        let out = podman.run(&["run", "--rm", "--device", &device, image, "ls", "/dev"]);
        assert_eq!(nvidia_nodes(&ok(&out)), want, "{device}");
    }
    assert!(
        node.reservations().is_empty(),
        "whole GPUs not released after the containers exited"
    );
}

#[test]
fn whole_gpu_is_booked_while_it_runs_and_slices_avoid_it() {
    let _s = lock(&[Resource::Cdi, Resource::Podman]);
    let node = TestNode::new(&["10Gi", "10Gi"]);
    let podman = node.podman_with_hook();
    let image = podman_image();
    let uuid1 = node.uuid(1);
    let name = "gpuslice-e2e-whole";
    let _ = podman.run(&["rm", "-f", name]);
    ok(&podman.run(&[
        "run",
        "-d",
        "--name",
        name,
        "--device",
        "gpuslice.io/gpu=1",
        image,
        "sleep",
        "600",
    ]));
    let res = node.reservations();
    assert_eq!(res.len(), 1, "{res:?}");
    assert_eq!(res[0]["gpus"][0]["uuid"], uuid1.as_str());
    assert_eq!(res[0]["gpus"][0]["memory"], 10u64 << 30);
    assert_eq!(res[0]["gpus"][0]["cores"], 100);
    let first = res[0]["id"].clone();
    // A slice asked meanwhile lands on GPU 0 only, even under `spread`.
    let out = podman.run(&[
        "run",
        "--rm",
        "--annotation",
        "gpuslice.io/memory=2Gi",
        "--annotation",
        "gpuslice.io/policy=spread",
        image,
        "ls",
        "/dev",
    ]);
    assert_eq!(
        nvidia_nodes(&ok(&out)),
        set(&["nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"])
    );
    // A second whole booking of GPU 1 is refused while the first holds it.
    let out = podman.run(&[
        "run",
        "--rm",
        "--device",
        "gpuslice.io/gpu=1",
        image,
        "true",
    ]);
    assert!(!out.status.success(), "GPU 1 was double-booked");
    // Refused by gpuslice's placement (GPU 1 booked whole), not failed for another reason.
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .find(|l| l.contains("cannot be given whole to container"))
        .unwrap_or_default();
    assert!(
        line.contains(uuid1.as_str())
            && line.contains("free per GPU")
            && line.contains("booked whole"),
        "podman's error lacks gpuslice's refusal of GPU 1: {err}"
    );
    // The refused container reserved nothing, and its clean-up (the failed hook's release,
    // its poststop) left the holder's booking alone.
    let res = node.reservations();
    assert_eq!(res.len(), 1, "{res:?}");
    assert_eq!(res[0]["id"], first, "{res:?}");
    assert_eq!(res[0]["state"], "bound", "{res:?}");
    ok(&podman.run(&["rm", "-f", "-t", "0", name]));
    assert!(node.reservations().is_empty(), "{:?}", node.reservations());
    ok(&podman.run(&[
        "run",
        "--rm",
        "--device",
        "gpuslice.io/gpu=1",
        image,
        "true",
    ]));
}

fn wait_logs(podman: &Podman, name: &str) -> String {
    let start = std::time::Instant::now();
    loop {
        let out = podman.run(&["logs", name]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if text.contains("READY") {
            return text;
        }
        assert!(
            start.elapsed().as_secs() < 30,
            "{name} never got ready: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn podman_precreate_slice_sees_its_gpu_shim_limits_and_env() {
    let _s = lock(&[Resource::Cdi, Resource::Podman]);
    let node = TestNode::new(&["10Gi", "10Gi"]);
    let podman = node.podman_with_hook();
    let name = "gpuslice-e2e-podman-slice";
    let _ = podman.run(&["rm", "-f", name]);
    let probe_mount = format!("{}:/usr/local/bin/gpuslice-probe:ro", probe().display());
    ok(&podman.run(&[
        "run",
        "-d",
        "--name",
        name,
        "-v",
        &probe_mount,
        "--annotation",
        &format!("{}={}", SLICE_ANNOTATIONS[0].0, SLICE_ANNOTATIONS[0].1),
        "--annotation",
        &format!("{}={}", SLICE_ANNOTATIONS[1].0, SLICE_ANNOTATIONS[1].1),
        podman_image(),
        "sh",
        "-c",
        SLICE_CHECKS,
    ]));
    let out = wait_logs(&podman, name);
    let cid = ok(&podman.run(&["inspect", "--format", "{{.Id}}", name]))
        .trim()
        .to_string();
    assert_slice_view(&node, &out, &cid);
    ok(&podman.run(&["rm", "-f", "-t", "0", name]));
    assert!(node.reservations().is_empty());
    assert!(node.leftovers().is_empty(), "{:?}", node.leftovers());
}

/// What a container sees of its slice, with the reservation id replaced.
const VIEW: &str = "ls -ln /dev | grep nvidia | awk '{print $5,$6,$NF}'; \
    grep -E ' /(usr/lib/x86_64-linux-gnu/lib(cuda|nvidia)|usr/lib/gpuslice|etc/ld.so.preload|run/gpuslice)' /proc/self/mountinfo | awk '{print $5, $6}' | sort; \
    env | grep -E '^(GPUSLICE|CUDA_DEVICE|NVIDIA)' | sort; echo READY; sleep 600";

#[test]
fn podman_cdi_injection_and_gpuslice_injection_give_the_same_view() {
    let _s = lock(&[Resource::Cdi, Resource::Podman]);
    let node = TestNode::new(&["10Gi"]);
    let podman = node.podman_with_hook();
    let image = podman_image();
    for n in ["gpuslice-e2e-view-a", "gpuslice-e2e-view-b"] {
        let _ = podman.run(&["rm", "-f", n]);
    }
    // A: gpuslice applies the slice spec itself (precreate hook).
    ok(&podman.run(&[
        "run",
        "-d",
        "--name",
        "gpuslice-e2e-view-a",
        "--annotation",
        "gpuslice.io/memory=3Gi",
        image,
        "sh",
        "-c",
        VIEW,
    ]));
    let a = wait_logs(&podman, "gpuslice-e2e-view-a");
    let id_a = node.reservations()[0]["id"].as_str().unwrap().to_string();
    // B: a slice reserved by the spec edit, then handed to podman by its CDI name only.
    let spec =
        serde_json::json!({"annotations": {"gpuslice.io/memory": "3Gi"}, "process": {"env": []}});
    let mut hook = std::process::Command::new(gpuslice_e2e::bin("gpuslice"))
        .args(["--config", &node.config_str(), "hook", "precreate"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(hook.stdin.as_mut().unwrap(), spec.to_string().as_bytes()).unwrap();
    let edited: serde_json::Value =
        serde_json::from_slice(&hook.wait_with_output().unwrap().stdout).unwrap();
    let id_b = edited["annotations"]["gpuslice.io/reservation"]
        .as_str()
        .unwrap()
        .to_string();
    let dev = format!("gpuslice.io/slice={id_b}");
    // The container the slice was made for says so (a slice's hooks bind
    // it only for a spec edited for that reservation, not for anyone who names the device).
    let made_for = format!("gpuslice.io/reservation={id_b}");
    ok(&podman.run(&[
        "run",
        "-d",
        "--name",
        "gpuslice-e2e-view-b",
        "--annotation",
        &made_for,
        "--device",
        &dev,
        image,
        "sh",
        "-c",
        VIEW,
    ]));
    let b = wait_logs(&podman, "gpuslice-e2e-view-b");
    let norm = |s: &str, id: &str| s.replace(id, "<id>");
    assert_eq!(
        norm(&a, &id_a),
        norm(&b, &id_b),
        "views differ:\nA (gpuslice):\n{a}\nB (podman CDI):\n{b}"
    );
    assert!(
        a.contains("/etc/ld.so.preload")
            && a.contains("/run/gpuslice/limits.json")
            && a.contains("nvidiactl"),
        "{a}"
    );
    // Both are bound to their own containers.
    let res = node.reservations();
    assert_eq!(res.len(), 2);
    assert!(res.iter().all(|r| r["state"] == "bound"), "{res:?}");
    for n in ["gpuslice-e2e-view-a", "gpuslice-e2e-view-b"] {
        ok(&podman.run(&["rm", "-f", "-t", "0", n]));
    }
    assert!(node.reservations().is_empty());
}

#[test]
fn podman_shows_the_refusal_line_and_nothing_is_reserved() {
    let _s = lock(&[Resource::Cdi, Resource::Podman]);
    let node = TestNode::new(&["10Gi", "10Gi"]);
    let podman = node.podman_with_hook();
    for (ann, want) in [
        (
            "gpuslice.io/memory=12Gi",
            vec!["12Gi", "free per GPU", "10Gi"],
        ),
        (
            "gpuslice.io/cores=150",
            vec!["annotation gpuslice.io/cores", "\"150\"", "1 to 100"],
        ),
    ] {
        let out = podman.run(&["run", "--rm", "--annotation", ann, podman_image(), "true"]);
        assert!(!out.status.success(), "{ann} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        for w in want {
            assert!(
                err.contains(w),
                "podman's error for {ann} lacks {w:?}: {err}"
            );
        }
        assert!(node.reservations().is_empty(), "{ann} reserved something");
        assert!(
            node.leftovers().is_empty(),
            "{ann} left {:?}",
            node.leftovers()
        );
    }
}

/// The hooks.d trigger is every `gpuslice.io/` key, so a misspelled key
/// reaches the hook, which refuses it naming the key and the accepted ones, instead of the
/// container starting without its GPU; the per-container opt-out still starts the container
/// without a GPU, and a request still gets one.
#[test]
fn podman_refuses_a_misspelled_key_and_keeps_the_opt_out() {
    let _s = lock(&[Resource::Cdi, Resource::Podman]);
    let node = TestNode::new(&["10Gi"]);
    let podman = node.podman_with_hook();
    let image = podman_image();
    for ann in [
        "gpuslice.io/memroy=1Gi",
        "gpuslice.io/Memory=1Gi",
        "gpuslice.io/memory.=1Gi",
    ] {
        let out = podman.run(&["run", "--rm", "--annotation", ann, image, "ls", "/dev"]);
        let key = ann.split('=').next().unwrap_or(ann);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{ann}: the container started: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(
            err.contains(&format!("annotation {key} is not a gpuslice annotation"))
                && err.contains("gpuslice.io/{gpus,memory,cores,gpu,gpu-type,policy}"),
            "podman's error for {ann} does not name the key and the accepted ones: {err}"
        );
        assert!(node.reservations().is_empty(), "{ann} reserved something");
        assert!(
            node.leftovers().is_empty(),
            "{ann} left {:?}",
            node.leftovers()
        );
    }
    // The opt-out of one container of a pod: it starts, without a GPU.
    let out = podman.run(&[
        "run",
        "--rm",
        "--annotation",
        "gpuslice.io/gpus.sidecar=0",
        "--annotation",
        "io.kubernetes.cri.container-name=sidecar",
        image,
        "ls",
        "/dev",
    ]);
    assert!(
        nvidia_nodes(&ok(&out)).is_empty(),
        "the opted-out container got a GPU"
    );
    // A request (a known key beside one for another container) still gets its slice.
    let out = podman.run(&[
        "run",
        "--rm",
        "--annotation",
        "gpuslice.io/memory=1Gi",
        "--annotation",
        "gpuslice.io/cores.other=10",
        image,
        "ls",
        "/dev",
    ]);
    assert!(nvidia_nodes(&ok(&out)).contains("nvidia0"));
    assert!(node.reservations().is_empty());
}

/// The hook file the package installs triggers as `gpuslice configure podman` writes it.
#[test]
fn packaged_hook_file_triggers_on_every_gpuslice_key() {
    let packaged: serde_json::Value = serde_json::from_slice(
        &std::fs::read(gpuslice_e2e::env::workspace().join("packaging/hooks.d/gpuslice.json"))
            .unwrap(),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(gpuslice_e2e::bin("gpuslice"))
        .args(["configure", "podman", "--hooks-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("gpuslice.json")).unwrap()).unwrap();
    assert_eq!(packaged["when"], written["when"]);
    assert_eq!(
        packaged["when"]["annotations"],
        serde_json::json!({"^gpuslice\\.io/": ".*"})
    );
}

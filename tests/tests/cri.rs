//! The Kubernetes path proven without a cluster: Debian's containerd, registered
//! with `gpuslice configure containerd`, driven through its CRI v1 API like the kubelet does
//! (RunPodSandbox with the `gpuslice` runtime handler and pod annotations, CreateContainer,
//! StartContainer, StopContainer, RemoveContainer, StopPodSandbox, RemovePodSandbox).
//! The pod annotations reach the container's spec, the sandbox (pause) container is left
//! alone, the app container gets its slice, a sidecar opted out with
//! `gpuslice.io/gpus.<name>: "0"` gets none, and everything is released afterwards.

use gpuslice_e2e::cri::{
    container_config, image_archive, pod_config, v1, wait_for_log, Containerd, APP_IMAGE,
    PAUSE_IMAGE,
};
use gpuslice_e2e::node::probe;
use gpuslice_e2e::{lock, Resource, TestNode};

const CHECKS: &str = "ls /dev | grep nvidia | tr '\\n' ' '; echo; \
    echo preload=$(cat /etc/ld.so.preload); \
    echo limits=$(cat /run/gpuslice/limits.json); \
    env | grep -E '^(GPUSLICE|CUDA_DEVICE|NVIDIA)' | sort; \
    gpuslice-probe info --json; \
    echo READY; exec sleep 600";

fn annotations(spec: &serde_json::Value) -> &serde_json::Map<String, serde_json::Value> {
    spec["annotations"].as_object().expect("annotations")
}

fn mounts_to(spec: &serde_json::Value, dest: &str) -> bool {
    spec["mounts"]
        .as_array()
        .is_some_and(|m| m.iter().any(|m| m["destination"] == dest))
}

#[test]
fn kubelet_style_pod_through_containerd_cri_gets_its_slice() {
    let _s = lock(&[Resource::Cdi, Resource::CriContainerd]);
    let node = TestNode::new(&["10Gi", "10Gi"]);
    let mut ctd = Containerd::new();

    // Register exactly as an operator would, against this containerd's config.
    let original = std::fs::read(&ctd.config).unwrap();
    let out = node.gpuslice(&[
        "configure",
        "containerd",
        "--config-path",
        &ctd.config.display().to_string(),
    ]);
    assert!(
        out.status.success(),
        "configure containerd: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let drop_in = ctd.dir.path().join("conf.d/gpuslice.toml");
    let text = std::fs::read_to_string(&drop_in).expect("drop-in written");
    assert!(
        text.contains("Root = \"/run/gpuslice-e2e-containerd/runc\""),
        "the runtime must inherit the default runtime's options:\n{text}"
    );

    let mut cri = ctd.start();
    let images = tempfile::tempdir().unwrap();
    ctd.import(&image_archive(
        images.path(),
        PAUSE_IMAGE,
        &["/bin/sleep", "2147483647"],
    ));
    ctd.import(&image_archive(images.path(), APP_IMAGE, &["/bin/sh"]));

    let logs = tempfile::tempdir().unwrap();
    let pod = pod_config(
        "infer-0",
        &[
            ("gpuslice.io/memory", "4Gi"),
            ("gpuslice.io/cores", "30"),
            // The per-container override wins for the container named `app`.
            ("gpuslice.io/memory.app", "3Gi"),
            // The sidecar wants no GPU from the pod's request.
            ("gpuslice.io/gpus.sidecar", "0"),
        ],
        logs.path(),
    );
    let sandbox = cri
        .run_pod_sandbox(&pod, "gpuslice")
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", ctd.log_text()));

    // The sandbox got the pod annotations (pod_annotations passes them) and no slice.
    let sandbox_spec = ctd.bundle_spec(&sandbox);
    let ann = annotations(&sandbox_spec);
    assert_eq!(ann["io.kubernetes.cri.container-type"], "sandbox");
    assert_eq!(ann["gpuslice.io/memory"], "4Gi");
    assert!(!ann.contains_key("gpuslice.io/reservation"), "{ann:?}");
    assert!(!mounts_to(&sandbox_spec, "/etc/ld.so.preload"));
    assert!(!sandbox_spec.to_string().contains("nvidia"));
    assert!(node.reservations().is_empty(), "{:?}", node.reservations());

    let probe_path = probe();
    let ctr_config = container_config(
        "app",
        APP_IMAGE,
        CHECKS,
        &[(probe_path.as_path(), "/usr/local/bin/gpuslice-probe")],
    );
    let ctr = cri
        .create_container(&sandbox, &ctr_config, &pod)
        .unwrap_or_else(|e| panic!("CreateContainer: {e}\n{}", ctd.log_text()));
    cri.start_container(&ctr)
        .unwrap_or_else(|e| panic!("StartContainer: {e}\n{}", ctd.log_text()));
    let out = wait_for_log(&logs.path().join("app.log"), "READY");
    assert_eq!(
        cri.container_state(&ctr).unwrap(),
        v1::ContainerState::ContainerRunning
    );

    // The registry: one reservation, bound to the app container, with the override.
    let res = node.reservations();
    assert_eq!(res.len(), 1, "{res:?}");
    let r = &res[0];
    assert_eq!(r["state"], "bound");
    assert_eq!(r["container_id"], ctr.as_str());
    assert_eq!(r["gpus"][0]["memory"], 3u64 << 30);
    assert_eq!(r["gpus"][0]["cores"], 30);
    let id = r["id"].as_str().unwrap().to_string();
    let uuid = r["gpus"][0]["uuid"].as_str().unwrap().to_string();

    // The sidecar of the same pod, opted out: created and running with no slice, no GPU
    // node, no shim, and no second reservation.
    let sidecar_config = container_config(
        "sidecar",
        APP_IMAGE,
        "echo devices=$(ls /dev | grep nvidia | tr '\\n' ' '); \
         echo preload=$(cat /etc/ld.so.preload 2>/dev/null); echo READY; exec sleep 600",
        &[],
    );
    let sidecar = cri
        .create_container(&sandbox, &sidecar_config, &pod)
        .unwrap_or_else(|e| panic!("CreateContainer (sidecar): {e}\n{}", ctd.log_text()));
    cri.start_container(&sidecar)
        .unwrap_or_else(|e| panic!("StartContainer (sidecar): {e}\n{}", ctd.log_text()));
    let sidecar_out = wait_for_log(&logs.path().join("sidecar.log"), "READY");
    assert!(
        sidecar_out.lines().any(|l| l == "devices="),
        "{sidecar_out}"
    );
    assert!(
        sidecar_out.lines().any(|l| l == "preload="),
        "{sidecar_out}"
    );
    let sidecar_spec = ctd.bundle_spec(&sidecar);
    let sidecar_ann = annotations(&sidecar_spec);
    assert_eq!(sidecar_ann["gpuslice.io/gpus.sidecar"], "0");
    assert!(
        !sidecar_ann.contains_key("gpuslice.io/reservation"),
        "{sidecar_ann:?}"
    );
    assert!(!mounts_to(&sidecar_spec, "/etc/ld.so.preload"));
    for part in [
        &sidecar_spec["mounts"],
        &sidecar_spec["linux"]["devices"],
        &sidecar_spec["linux"]["resources"]["devices"],
        &sidecar_spec["process"]["env"],
        &sidecar_spec["hooks"],
    ] {
        let text = part.to_string();
        assert!(
            !text.contains("nvidia") && !text.contains("GPUSLICE") && !text.contains("libgpuslice"),
            "the sidecar got a part of a slice: {text}"
        );
    }
    assert_eq!(node.reservations().len(), 1, "{:?}", node.reservations());

    // The pod annotations reached the app container's spec, edited by gpuslice-runtime.
    let spec = ctd.bundle_spec(&ctr);
    let ann = annotations(&spec);
    assert_eq!(ann["io.kubernetes.cri.container-type"], "container");
    assert_eq!(ann["gpuslice.io/memory"], "4Gi");
    assert_eq!(ann["gpuslice.io/memory.app"], "3Gi");
    assert_eq!(ann["gpuslice.io/reservation"], id.as_str());
    assert!(mounts_to(&spec, "/etc/ld.so.preload"));

    // What the container sees: one GPU node plus control nodes, the shim, its limits.
    let devices = out.lines().next().unwrap_or_default();
    assert_eq!(
        devices
            .split_whitespace()
            .filter(|d| d.starts_with("nvidia") && d[6..].parse::<u32>().is_ok())
            .count(),
        1,
        "{out}"
    );
    assert!(devices.contains("nvidiactl"), "{out}");
    assert!(
        out.contains("preload=/usr/lib/gpuslice/libgpuslice_shim.so"),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "limits={{\"version\":1,\"reservation\":\"{id}\",\"devices\":[{{\"uuid\":\"{uuid}\",\"memory_limit\":3221225472,\"cores\":30}}]}}"
        )),
        "{out}"
    );
    for env in [
        format!("GPUSLICE_RESERVATION={id}"),
        "NVIDIA_VISIBLE_DEVICES=void".to_string(),
        "CUDA_DEVICE_MEMORY_LIMIT_0=3072m".to_string(),
        "CUDA_DEVICE_SM_LIMIT=30".to_string(),
    ] {
        assert!(out.lines().any(|l| l == env), "missing {env}: {out}");
    }

    // Tear down like the kubelet: stop and remove the containers, then the sandbox.
    cri.stop_container(&sidecar, 0).unwrap();
    cri.remove_container(&sidecar).unwrap();
    assert_eq!(node.reservations().len(), 1, "{:?}", node.reservations());
    cri.stop_container(&ctr, 0).unwrap();
    cri.remove_container(&ctr).unwrap();
    cri.stop_pod_sandbox(&sandbox).unwrap();
    cri.remove_pod_sandbox(&sandbox).unwrap();
    assert!(node.reservations().is_empty(), "{:?}", node.reservations());
    assert!(node.leftovers().is_empty(), "{:?}", node.leftovers());

    // And the registration comes off again: the original config, byte for byte.
    drop(cri);
    let out = node.gpuslice(&[
        "configure",
        "containerd",
        "--config-path",
        &ctd.config.display().to_string(),
        "--remove",
    ]);
    assert!(
        out.status.success(),
        "configure containerd --remove: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(&ctd.config).unwrap(), original);
    assert!(!drop_in.exists() && !ctd.dir.path().join("gpuslice-runtime.sh").exists());
}

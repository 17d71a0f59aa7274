//! The packaging, validated without a cluster or kubectl: every Kubernetes manifest under
//! `packaging/kubernetes/` deserialises into the Kubernetes API types of `k8s-openapi` and
//! serialises back to exactly what the file says (so an unknown or misspelt field, a wrong
//! type or a missing required field fails), and the parts that must agree with gpuslice do:
//! the RuntimeClass handler is the one `configure` registers, selectors match their pods,
//! the installer's config and paths, the example pod's annotations, podman's hooks.d file
//! and the systemd units.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use k8s_openapi::api::node::v1::RuntimeClass;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

fn packaging() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging")
}

/// Every YAML document of every manifest: (file name, document).
fn documents() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(packaging().join("kubernetes"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 3, "manifests missing: {files:?}");
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let v = Value::deserialize(doc)
                .unwrap_or_else(|e| panic!("{}: not valid YAML: {e}", f.display()));
            let name = f.file_name().unwrap().to_string_lossy().into_owned();
            out.push((name, v));
        }
    }
    out
}

/// The first path where `a` and `b` differ.
fn first_difference(a: &Value, b: &Value, path: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for k in x.keys().chain(y.keys()) {
                let (va, vb) = (
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                );
                if let Some(d) = first_difference(va, vb, &format!("{path}.{k}")) {
                    return Some(d);
                }
            }
            None
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (va, vb))| first_difference(va, vb, &format!("{path}[{i}]"))),
        _ if a == b => None,
        _ => Some(format!("{path}: file has {a}, the API type keeps {b}")),
    }
}

/// Deserialises `doc` as `T` and checks nothing was dropped or changed on the way back.
fn typed<T: DeserializeOwned + Serialize>(file: &str, doc: &Value) -> T {
    let t: T = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{file}: {} does not match the API: {e}", doc["kind"]));
    let back = serde_json::to_value(&t).unwrap();
    if let Some(d) = first_difference(doc, &back, "") {
        panic!(
            "{file}: {} has a field the Kubernetes API does not know or reads differently: {d}",
            doc["kind"]
        );
    }
    t
}

struct Manifests {
    runtime_class: RuntimeClass,
    daemonset: DaemonSet,
    config_map: ConfigMap,
    namespace: Namespace,
    pod: Pod,
}

fn manifests() -> Manifests {
    let (mut rc, mut ds, mut cm, mut ns, mut pod) = (None, None, None, None, None);
    for (file, doc) in documents() {
        match (doc["apiVersion"].as_str(), doc["kind"].as_str()) {
            (Some("node.k8s.io/v1"), Some("RuntimeClass")) => rc = Some(typed(&file, &doc)),
            (Some("apps/v1"), Some("DaemonSet")) => ds = Some(typed(&file, &doc)),
            (Some("v1"), Some("ConfigMap")) => cm = Some(typed(&file, &doc)),
            (Some("v1"), Some("Namespace")) => ns = Some(typed(&file, &doc)),
            (Some("v1"), Some("Pod")) => pod = Some(typed(&file, &doc)),
            // The policy keeping a pod's request annotations as created, and its binding
            // (docs/annotations.md): checked by the webhook's and the chart's tests.
            (
                Some("admissionregistration.k8s.io/v1"),
                Some("ValidatingAdmissionPolicy" | "ValidatingAdmissionPolicyBinding"),
            ) if file == "annotations-policy.yaml" => {}
            other => panic!("{file}: unexpected apiVersion/kind {other:?}"),
        }
    }
    Manifests {
        runtime_class: rc.expect("a RuntimeClass"),
        daemonset: ds.expect("a DaemonSet"),
        config_map: cm.expect("a ConfigMap"),
        namespace: ns.expect("a Namespace"),
        pod: pod.expect("an example Pod"),
    }
}

#[test]
fn runtime_class_names_the_handler_configure_registers() {
    let m = manifests();
    assert_eq!(
        m.runtime_class.handler,
        gpuslice_configure::containerd::HANDLER
    );
    assert_eq!(m.runtime_class.handler, gpuslice_configure::crio::HANDLER);
    let rc_name = m.runtime_class.metadata.name.clone().unwrap();
    assert_eq!(
        m.pod.spec.as_ref().unwrap().runtime_class_name.as_deref(),
        Some(rc_name.as_str())
    );
    // Pods using it land where the installer runs.
    let sched = m
        .runtime_class
        .scheduling
        .as_ref()
        .unwrap()
        .node_selector
        .clone()
        .unwrap();
    let ds_sel = m
        .daemonset
        .spec
        .template
        .spec
        .as_ref()
        .unwrap()
        .node_selector
        .clone()
        .unwrap();
    assert_eq!(sched, ds_sel);
}

#[test]
fn daemonset_selects_its_pods_and_installs_what_its_config_names() {
    let m = manifests();
    let ns = m.namespace.metadata.name.clone().unwrap();
    assert_eq!(m.daemonset.metadata.namespace.as_deref(), Some(ns.as_str()));
    assert_eq!(
        m.config_map.metadata.namespace.as_deref(),
        Some(ns.as_str())
    );
    let spec = &m.daemonset.spec;
    let labels = spec
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .clone()
        .unwrap();
    for (k, v) in spec.selector.match_labels.clone().unwrap() {
        assert_eq!(
            labels.get(&k),
            Some(&v),
            "selector {k}={v} does not match the pod template"
        );
    }
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(
        pod.host_pid,
        Some(true),
        "the installer enters the host's mount namespace"
    );
    let c = &pod.containers[0];
    assert_eq!(c.security_context.as_ref().unwrap().privileged, Some(true));
    // The entry point is the installer script the image copies.
    let cmd = c.command.clone().unwrap();
    assert_eq!(cmd, ["/opt/gpuslice-image/installer.sh"]);
    let containerfile =
        std::fs::read_to_string(packaging().join("kubernetes/Containerfile")).unwrap();
    assert!(
        containerfile.lines().any(|l| l.starts_with("COPY ")
            && l.split_whitespace().any(|w| w == "installer.sh")
            && l.ends_with(" /opt/gpuslice-image/")),
        "{containerfile}"
    );
    let installer = std::fs::read_to_string(packaging().join("kubernetes/installer.sh")).unwrap();
    // The ConfigMap's config parses and points at where the installer puts the files.
    let cm_name = pod
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .find_map(|v| v.config_map.as_ref())
        .unwrap()
        .name
        .clone();
    assert_eq!(Some(cm_name), m.config_map.metadata.name.clone());
    let text = m.config_map.data.as_ref().unwrap()["config.toml"].clone();
    let cfg = gpuslice_config::parse_config(&text, Path::new("/etc/gpuslice/config.toml")).unwrap();
    assert!(installer.contains("PREFIX=/opt/gpuslice"));
    assert_eq!(
        cfg.shim.library,
        Path::new("/opt/gpuslice/lib/libgpuslice_shim.so")
    );
    assert!(installer.contains("\"$PREFIX/lib/libgpuslice_shim.so\""));
    assert_eq!(
        cfg.hook.path.as_deref(),
        Some(Path::new("/opt/gpuslice/bin/gpuslice"))
    );
    assert!(installer.contains("GS=\"$PREFIX/bin/gpuslice\""));
    assert!(installer.contains("configure containerd"));
    // The ConfigMap is mounted where the installer reads it.
    let mounts = c.volume_mounts.clone().unwrap();
    let cm_mount = mounts.iter().find(|v| v.name == "config").unwrap();
    assert!(installer.contains(&format!("{}/config.toml", cm_mount.mount_path)));
    let host = mounts.iter().find(|v| v.name == "host-root").unwrap();
    let env = c.env.clone().unwrap();
    let host_root = env.iter().find(|e| e.name == "GPUSLICE_HOST_ROOT").unwrap();
    assert_eq!(host_root.value.as_deref(), Some(host.mount_path.as_str()));
}

#[test]
fn example_pod_annotations_are_valid_requests() {
    let m = manifests();
    let ann = m.pod.metadata.annotations.clone().unwrap();
    for c in &m.pod.spec.as_ref().unwrap().containers {
        let mut a: BTreeMap<String, String> = ann.clone();
        a.insert("io.kubernetes.cri.container-name".into(), c.name.clone());
        a.insert(
            "io.kubernetes.cri.container-type".into(),
            "container".into(),
        );
        match gpuslice_hook::create::annotations::parse_ask(&a) {
            Ok(gpuslice_hook::create::annotations::Ask::Slice(_)) => {}
            other => panic!("container {}: {other:?}", c.name),
        }
    }
}

#[test]
fn podman_hook_file_is_what_configure_podman_writes() {
    use gpuslice_config::{Config, ConfigOrigin, LoadedConfig, DEFAULT_CONFIG_PATH};
    let mut config = Config::default();
    config.hook.path = Some("/usr/bin/gpuslice".into());
    let node = gpuslice_hook::node::NodeContext::from_loaded(LoadedConfig {
        config,
        path: DEFAULT_CONFIG_PATH.into(),
        origin: ConfigOrigin::Default { exists: false },
    });
    let want = gpuslice_configure::podman::hook_json(&node).unwrap();
    let got = std::fs::read_to_string(packaging().join("hooks.d/gpuslice.json")).unwrap();
    assert_eq!(got, want);
}

#[test]
fn systemd_units_regenerate_the_spec_at_boot_and_on_driver_change() {
    let service =
        std::fs::read_to_string(packaging().join("systemd/gpuslice-cdi.service")).unwrap();
    let path = std::fs::read_to_string(packaging().join("systemd/gpuslice-cdi.path")).unwrap();
    let keys = |text: &str, key: &str| -> Vec<String> {
        text.lines()
            .filter_map(|l| l.strip_prefix(&format!("{key}=")))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(
        keys(&service, "ExecStart"),
        ["/usr/bin/gpuslice cdi generate"]
    );
    assert_eq!(keys(&service, "Type"), ["oneshot"]);
    assert_eq!(keys(&service, "WantedBy"), ["multi-user.target"]);
    assert!(keys(&service, "Before")
        .concat()
        .contains("containerd.service"));
    assert_eq!(keys(&path, "Unit"), ["gpuslice-cdi.service"]);
    let watched = keys(&path, "PathChanged");
    assert!(watched.iter().any(|p| p == "/dev/nvidiactl"), "{watched:?}");
    assert!(
        watched.iter().any(|p| p.ends_with("/libcuda.so.1")),
        "{watched:?}"
    );
    // procfs and sysfs raise no inotify events: a path unit on them never fires.
    assert!(watched
        .iter()
        .all(|p| !p.starts_with("/proc/") && !p.starts_with("/sys/")));
}

#[test]
fn the_node_agent_unit_runs_the_installed_enforcer_always_and_is_packaged() {
    let unit = std::fs::read_to_string(packaging().join("systemd/gpuslice-serve.service")).unwrap();
    let keys = |key: &str| -> Vec<&str> {
        unit.lines()
            .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .collect()
    };
    assert_eq!(keys("ExecStart"), ["/usr/bin/gpuslice serve"]);
    assert_eq!(keys("Restart"), ["always"]);
    assert_eq!(keys("WantedBy"), ["multi-user.target"]);
    assert!(keys("After").concat().contains("gpuslice-cdi.service"));
    // The package installs it, its maintainer scripts enable, start, stop and forget it.
    let manifest =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml")).unwrap();
    assert!(
        manifest.contains(
            r#"["../packaging/systemd/gpuslice-serve.service", "lib/systemd/system/", "644"]"#
        ),
        "cli/Cargo.toml's deb assets lack the node agent's unit"
    );
    for script in ["postinst", "prerm", "postrm"] {
        let text = std::fs::read_to_string(packaging().join("deb").join(script)).unwrap();
        assert!(
            text.contains("gpuslice-serve.service"),
            "packaging/deb/{script} does not handle gpuslice-serve.service"
        );
    }
}

/// packaging/deb/postinst, run with deb-systemd-helper, deb-systemd-invoke and systemctl
/// stubbed (they log their arguments): `ARG...`; the log.
fn postinst(args: &[&str], disabled: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    // was-enabled answers no for the units in $DISABLED (an admin disabled them).
    let stub = "#!/bin/sh\n\
        echo \"$(basename \"$0\") $*\" >> \"$LOG\"\n\
        [ \"$1\" = --quiet ] && shift\n\
        if [ \"$1\" = was-enabled ]; then\n\
        case \" $DISABLED \" in *\" $2 \"*) exit 1 ;; esac\n\
        fi\n\
        exit 0\n";
    for tool in ["deb-systemd-helper", "deb-systemd-invoke", "systemctl"] {
        let path = dir.path().join(tool);
        std::fs::write(&path, stub).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
    }
    let path = format!(
        "{}:{}",
        dir.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = std::process::Command::new("sh")
        .arg(packaging().join("deb/postinst"))
        .args(args)
        .env("PATH", path)
        .env("LOG", &log)
        .env("DISABLED", disabled)
        .env_remove("GPUSLICE_CONFIGURE")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "postinst {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_to_string(&log).unwrap_or_default()
}

/// As dh_installsystemd's postinst: a unit is enabled on first install (and while it stays
/// enabled, so a changed unit file's links are added); one the admin disabled only has its
/// state brought up to date, on every upgrade. An aborted removal or upgrade, after prerm
/// stopped the units, does what configure does.
#[test]
fn postinst_enables_units_once_and_keeps_an_admins_disable() {
    let units = [
        "gpuslice-cdi.path",
        "gpuslice-cdi.service",
        "gpuslice-serve.service",
    ];
    let first = postinst(&["configure"], "");
    for u in units {
        assert!(
            first.contains(&format!("deb-systemd-helper enable {u}\n")),
            "{first}"
        );
    }
    let disabled = "gpuslice-cdi.path gpuslice-serve.service";
    for args in [
        &["configure", "0.1.0-1"][..],
        &["abort-upgrade", "0.1.0-1"][..],
        &["abort-remove"][..],
        &["abort-deconfigure", "in-favour", "x", "1"][..],
    ] {
        let log = postinst(args, disabled);
        for u in ["gpuslice-cdi.path", "gpuslice-serve.service"] {
            assert!(
                !log.contains(&format!("deb-systemd-helper enable {u}\n")),
                "{args:?}: enabled {u}, which the admin disabled: {log}"
            );
            assert!(
                log.contains(&format!("deb-systemd-helper update-state {u}\n")),
                "{args:?}: {log}"
            );
        }
        assert!(
            log.contains("deb-systemd-helper enable gpuslice-cdi.service\n"),
            "{args:?}: {log}"
        );
    }
}

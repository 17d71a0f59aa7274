//! The Kubernetes installer image ships the same build as the .deb: the static create-path
//! binaries with the full build installed where the static `gpuslice` looks for it; the pods
//! that use what its installer writes on the host (the kubelet plugin, the node agent) wait
//! for this release's copies (wait-installed.sh), whose paths agree with installer.sh's.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::Value;

use gpuslice_hook::staticbuild::{full_build_candidates, FULL_BUILD_NAME};

fn kubernetes(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../packaging/kubernetes")
        .join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_installer_image_ships_the_static_build_with_its_full_build_where_it_is_looked_for() {
    let build = kubernetes("build-image.sh");
    assert!(build.contains("./scripts/build-static.sh"), "{build}");
    assert!(build.contains("\"$ctx/gpuslice-full\""), "{build}");
    let containerfile = kubernetes("Containerfile");
    assert!(
        containerfile.contains("COPY gpuslice gpuslice-runtime gpuslice-full "),
        "{containerfile}"
    );
    // The installer puts the static `gpuslice` at $PREFIX/bin and the full build at
    // $PREFIX/lib/gpuslice/, one of the places the static build hands its commands to.
    let installer = kubernetes("installer.sh");
    assert!(installer.contains("PREFIX=/opt/gpuslice"), "{installer}");
    assert!(
        installer.contains("GS=\"$PREFIX/bin/gpuslice\""),
        "{installer}"
    );
    assert!(
        installer.contains(&format!(
            "put \"$SRC/{FULL_BUILD_NAME}\" \"$PREFIX/lib/gpuslice/{FULL_BUILD_NAME}\" 0755"
        )),
        "{installer}"
    );
    assert!(
        full_build_candidates(Path::new("/opt/gpuslice/bin/gpuslice"))
            .contains(&PathBuf::from("/opt/gpuslice/lib/gpuslice").join(FULL_BUILD_NAME))
    );
}

fn packaging(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../packaging")
        .join(file)
}

/// installer.sh's `put FROM TO MODE` lines, its variables expanded: (file in the installer
/// pod, host path).
fn installer_puts() -> Vec<(String, String)> {
    let installer = kubernetes("installer.sh");
    let expand = |s: &str| {
        s.trim_matches('"')
            .replace("$GS", "$PREFIX/bin/gpuslice")
            .replace("$PREFIX", "/opt/gpuslice")
            .replace("$SRC", "/opt/gpuslice-image")
            .replace("$CONFIGMAP", "/etc/gpuslice-configmap/config.toml")
    };
    // What those expansions stand for, outside the tests.
    for default in [
        "SRC=${GPUSLICE_IMAGE_DIR:-/opt/gpuslice-image}",
        "CONFIGMAP=${GPUSLICE_CONFIGMAP:-/etc/gpuslice-configmap/config.toml}",
    ] {
        assert!(installer.contains(default), "{default}: {installer}");
    }
    let puts: Vec<(String, String)> = installer
        .lines()
        .filter_map(|l| l.trim().strip_prefix("put "))
        .map(|rest| {
            let w: Vec<&str> = rest.split_whitespace().collect();
            (expand(w[0]), expand(w[1]))
        })
        .collect();
    assert!(puts.len() >= 4, "installer.sh puts: {puts:?}");
    puts
}

/// The DaemonSet of a manifest file.
fn daemonset(file: &str) -> Value {
    let text = std::fs::read_to_string(packaging(file)).unwrap();
    let ds = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap())
        .find(|v| v["kind"] == "DaemonSet");
    ds.unwrap_or_else(|| panic!("{file}: no DaemonSet"))
}

/// The host path behind `path` in a container with `mounts`, in a pod with `volumes`
/// (hostPath volumes only; `None` for any other).
fn host_path(path: &str, mounts: &Value, volumes: &Value) -> Option<String> {
    let m = mounts
        .as_array()?
        .iter()
        .filter(|m| {
            let at = m["mountPath"].as_str().unwrap_or("");
            path == at || path.starts_with(&format!("{}/", at.trim_end_matches('/')))
        })
        .max_by_key(|m| m["mountPath"].as_str().unwrap_or("").len())?;
    let vol = volumes
        .as_array()?
        .iter()
        .find(|v| v["name"] == m["name"])?;
    let base = vol["hostPath"]["path"].as_str()?;
    let rest = &path[m["mountPath"].as_str()?.trim_end_matches('/').len()..];
    Some(format!("{}{rest}", base.trim_end_matches('/')).replace("//", "/"))
}

/// Each pod that uses the installer's files on the host starts only once its node holds this
/// release's: its init container compares every file it names with the host copy installer.sh
/// writes from it (so a path moved in one place fails here), the config among them.
#[test]
fn the_pods_that_use_the_installers_files_wait_for_this_releases() {
    let puts = installer_puts();
    let containerfile = kubernetes("Containerfile");
    assert!(
        containerfile.contains(" wait-installed.sh /opt/gpuslice-image/"),
        "{containerfile}"
    );
    assert!(kubernetes("build-image.sh").contains("packaging/kubernetes/wait-installed.sh"));
    for file in [
        "kubernetes/dra/kubelet-plugin.yaml",
        "monitoring/exporter.yaml",
    ] {
        let ds = daemonset(file);
        let pod = &ds["spec"]["template"]["spec"];
        let init = pod["initContainers"]
            .as_array()
            .and_then(|a| a.iter().find(|c| c["name"] == "wait-installed"))
            .unwrap_or_else(|| panic!("{file}: no init container wait-installed"));
        let cmd: Vec<&str> = init["command"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap())
            .collect();
        assert_eq!(cmd[0], "/opt/gpuslice-image/wait-installed.sh", "{file}");
        let mut wanted = Vec::new();
        for pair in &cmd[1..] {
            let (want, have) = pair.split_once('=').unwrap();
            let (_, dest) = puts
                .iter()
                .find(|(from, _)| from == want)
                .unwrap_or_else(|| panic!("{file}: installer.sh puts no {want}"));
            assert_eq!(
                host_path(have, &init["volumeMounts"], &pod["volumes"]).as_deref(),
                Some(dest.as_str()),
                "{file}: {have} is not the host's {dest}"
            );
            wanted.push(want);
        }
        assert!(
            wanted.contains(&"/etc/gpuslice-configmap/config.toml")
                && wanted.contains(&"/opt/gpuslice-image/gpuslice"),
            "{file}: {wanted:?}"
        );
        // The ConfigMap is optional: without it (no installer) nothing is waited for.
        let mount = init["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["mountPath"] == "/etc/gpuslice-configmap")
            .unwrap_or_else(|| panic!("{file}: the ConfigMap is not mounted"));
        let vol = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap();
        assert_eq!(vol["configMap"]["name"], "gpuslice-config", "{file}");
        assert_eq!(vol["configMap"]["optional"], true, "{file}");
    }
    // The plugin reads the very file its init container waited for.
    let ds = daemonset("kubernetes/dra/kubelet-plugin.yaml");
    let pod = &ds["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let args: Vec<&str> = c["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let config = args[args.iter().position(|a| *a == "--config").unwrap() + 1];
    assert_eq!(
        host_path(config, &c["volumeMounts"], &pod["volumes"]).as_deref(),
        Some("/etc/gpuslice/config.toml")
    );
}

fn wait_installed(dir: &Path, args: &[String]) -> Command {
    let mut c = Command::new("sh");
    c.arg(packaging("kubernetes/wait-installed.sh"))
        .args(args)
        .env("GPUSLICE_CONFIGMAP", dir.join("configmap.toml"))
        .env("GPUSLICE_WAIT_INTERVAL", "1");
    c
}

/// wait-installed.sh waits while a host copy differs, says which, and returns once the
/// installer wrote it; without the installer's ConfigMap it does not wait; a malformed
/// argument or a file missing from the pod is an error naming it.
#[test]
fn wait_installed_returns_once_the_host_holds_this_releases_files() {
    let d = tempfile::tempdir().unwrap();
    let p = |n: &str| d.path().join(n);
    let pair = |a: &str, b: &str| format!("{}={}", p(a).display(), p(b).display());
    std::fs::write(p("configmap.toml"), "x").unwrap();
    std::fs::write(p("want-config"), "state_dir = \"/run/gpuslice\"\n").unwrap();
    std::fs::write(p("host-config"), "# the previous release's\n").unwrap();
    std::fs::write(p("want-bin"), "new").unwrap();
    std::fs::write(p("host-bin"), "new").unwrap();
    let args = [
        pair("want-config", "host-config"),
        pair("want-bin", "host-bin"),
    ];
    let mut child = wait_installed(d.path(), &args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(
        line.contains("waiting") && line.contains("host-config") && !line.contains("host-bin"),
        "{line}"
    );
    assert!(
        child.try_wait().unwrap().is_none(),
        "it returned while the config differs"
    );
    // The installer's atomic put.
    std::fs::write(p("host-config.new"), "state_dir = \"/run/gpuslice\"\n").unwrap();
    std::fs::rename(p("host-config.new"), p("host-config")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "still waiting after the put");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(rest.contains("holds this release's files"), "{rest}");

    // No installer ConfigMap: nothing to wait for, even with every host copy differing.
    std::fs::remove_file(p("configmap.toml")).unwrap();
    std::fs::write(p("host-bin"), "old").unwrap();
    let o = wait_installed(d.path(), &args).output().unwrap();
    assert!(o.status.success(), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("nothing to wait for"));

    std::fs::write(p("configmap.toml"), "x").unwrap();
    for (bad, names) in [
        (
            vec![p("want-bin").display().to_string()],
            "is not WANT=HAVE",
        ),
        (vec![pair("absent", "host-bin")], "absent is missing"),
    ] {
        let o = wait_installed(d.path(), &bad).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {err}");
        assert!(err.contains(names), "{err}");
    }
}

/// A node for installer.sh: the host's root, this image's files and the ConfigMap's config
/// under a temporary directory, with stubs first on PATH that log to `calls`: `nsenter` runs
/// its command with host paths under the host's root, `systemctl` fails while `fail-restart`
/// exists (once), `touch` only logs (the ready file), `sleep` returns at once (`sleep
/// infinity` succeeds; `sleep 60` fails, ending the driver poll). The host's (install: the
/// image's) `gpuslice` changes containerd's config on its first `configure containerd`,
/// then finds nothing to change until `configured` is removed.
struct FakeNode {
    dir: tempfile::TempDir,
    seen: usize,
}

impl FakeNode {
    const PENDING: &'static str = "host/var/lib/gpuslice/containerd-restart-pending";

    fn new() -> Self {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let exe = |rel: &str, text: &str| {
            let p = dir.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, format!("#!/bin/sh\n{text}")).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        };
        exe(
            "bin/nsenter",
            r#"while [ "$1" != -- ]; do shift; done
shift
case $1 in /*) cmd=$GPUSLICE_HOST_ROOT$1; shift; exec "$cmd" "$@" ;; esac
exec "$@"
"#,
        );
        exe(
            "bin/systemctl",
            r#"[ -e "$GPUSLICE_HOST_ROOT/opt/gpuslice" ] && opt=present || opt=gone
echo "systemctl $* (/opt/gpuslice $opt)" >>"$FAKE/calls"
if [ -e "$FAKE/fail-restart" ]; then rm "$FAKE/fail-restart"; exit 1; fi
"#,
        );
        exe("bin/touch", "echo \"touch $*\" >>\"$FAKE/calls\"\n");
        exe(
            "bin/sleep",
            "echo \"sleep $*\" >>\"$FAKE/calls\"\n[ \"$1\" = infinity ]\n",
        );
        let gpuslice = r#"echo "gpuslice $*" >>"$FAKE/calls"
case "$*" in
*"configure containerd"*)
    if [ -e "$FAKE/configured" ]; then echo "nothing to change"; exit 0; fi
    : >"$FAKE/configured"
    echo "wrote /etc/containerd/conf.d/gpuslice.toml"
    echo "containerd reads its config only when it starts: restart it to apply" ;;
esac
"#;
        exe("host/opt/gpuslice/bin/gpuslice", gpuslice);
        exe("image/gpuslice", gpuslice);
        for f in ["gpuslice-runtime", "gpuslice-full", "libgpuslice_shim.so"] {
            exe(&format!("image/{f}"), "");
        }
        std::fs::write(dir.path().join("configmap.toml"), "[placement]\n").unwrap();
        std::fs::create_dir_all(dir.path().join("host/var/run/cdi")).unwrap();
        std::fs::write(
            dir.path().join("host/var/run/cdi/gpuslice.io-gpu.json"),
            "{}",
        )
        .unwrap();
        FakeNode { dir, seen: 0 }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Runs installer.sh once: whether it succeeded, and the calls it made.
    fn run(&mut self, mode: &str, restart: bool) -> (bool, Vec<String>) {
        let (ok, calls, _) = self.run_out(mode, restart);
        (ok, calls)
    }

    /// `run`, with its output.
    fn run_out(&mut self, mode: &str, restart: bool) -> (bool, Vec<String>, String) {
        let d = self.dir.path();
        let path = format!(
            "{}:{}",
            d.join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let o = Command::new("sh")
            .arg(packaging("kubernetes/installer.sh"))
            .env("PATH", path)
            .env("FAKE", d)
            .env("GPUSLICE_MODE", mode)
            .env("GPUSLICE_HOST_ROOT", d.join("host"))
            .env("GPUSLICE_IMAGE_DIR", d.join("image"))
            .env("GPUSLICE_CONFIGMAP", d.join("configmap.toml"))
            .env("GPUSLICE_RESTART_CONTAINERD", restart.to_string())
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        eprintln!(
            "{mode}: {:?}\n{out}{}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
        let calls = std::fs::read_to_string(d.join("calls")).unwrap_or_default();
        let calls: Vec<String> = calls.lines().map(String::from).collect();
        let new = calls[self.seen..].to_vec();
        self.seen = calls.len();
        (o.status.success(), new, out)
    }
}

const RESTART: &str = "systemctl restart containerd (/opt/gpuslice present)";

/// An uninstall whose containerd restart failed (or whose pod was killed before it) restarts
/// containerd on the pod's next start, although `configure --remove` then has nothing to
/// change, and only then deletes /opt/gpuslice: no containerd is left running with a runtime
/// whose binary is gone.
#[test]
fn an_uninstall_interrupted_before_containerds_restart_restarts_it_on_the_next_start() {
    let mut node = FakeNode::new();
    std::fs::write(node.path("fail-restart"), "").unwrap();
    let (ok, calls) = node.run("uninstall", true);
    assert!(!ok, "{calls:?}");
    let remove = "gpuslice --config /dev/null configure containerd --remove";
    assert_eq!(calls, [remove, RESTART]);
    assert!(node.path("host/opt/gpuslice/bin/gpuslice").exists());

    // The pod's restart: nothing to change, yet containerd restarts before the removal.
    let (ok, calls) = node.run("uninstall", true);
    assert!(ok, "{calls:?}");
    assert_eq!(
        calls,
        [
            remove,
            RESTART,
            "touch /run/gpuslice-installer.ready",
            "sleep infinity"
        ]
    );
    assert!(!node.path("host/opt/gpuslice").exists());
    assert!(!node.path("host/var/run/cdi/gpuslice.io-gpu.json").exists());
    assert!(
        !node.path("host/var/lib/gpuslice").exists(),
        "no trace left"
    );

    // Done: a later start restarts nothing.
    let (ok, calls) = node.run("uninstall", true);
    assert!(ok);
    assert_eq!(
        calls,
        ["touch /run/gpuslice-installer.ready", "sleep infinity"]
    );
}

/// Likewise an install: the pod is ready only once containerd restarted with its new config,
/// on a later start if the first one's restart failed; with GPUSLICE_RESTART_CONTAINERD=false
/// the operator is told once and the owed restart is theirs.
#[test]
fn an_install_interrupted_before_containerds_restart_restarts_it_on_the_next_start() {
    let mut node = FakeNode::new();
    std::fs::remove_dir_all(node.path("host/opt")).unwrap();
    std::fs::write(node.path("fail-restart"), "").unwrap();
    let (cdi, configure) = ("gpuslice cdi generate", "gpuslice configure containerd");
    let (ok, calls) = node.run("install", true);
    assert!(!ok, "{calls:?}");
    assert_eq!(calls, [cdi, configure, RESTART], "not ready");

    let (ok, calls) = node.run("install", true);
    assert!(ok, "{calls:?}");
    let ready = "touch /run/gpuslice-installer.ready";
    assert_eq!(calls, [cdi, configure, RESTART, ready, "sleep 60"]);
    assert!(!node.path(FakeNode::PENDING).exists());
    assert_eq!(
        std::fs::read_to_string(node.path("host/etc/gpuslice/config.toml")).unwrap(),
        "[placement]\n"
    );

    let (ok, calls) = node.run("install", true);
    assert!(ok);
    assert_eq!(calls, [cdi, configure, ready, "sleep 60"]);

    // The restart left to the operator: owed after a failed one, said once, then cleared.
    std::fs::remove_file(node.path("configured")).unwrap();
    std::fs::write(node.path("fail-restart"), "").unwrap();
    let (ok, _) = node.run("install", true);
    assert!(!ok);
    let yourself = "restart containerd yourself";
    let (ok, calls, out) = node.run_out("install", false);
    assert!(ok && out.contains(yourself), "{out}");
    assert_eq!(calls, [cdi, configure, ready, "sleep 60"]);
    assert!(!node.path(FakeNode::PENDING).exists());
    let (ok, calls, out) = node.run_out("install", false);
    assert!(ok && !out.contains(yourself), "{out}");
    assert_eq!(calls, [cdi, configure, ready, "sleep 60"]);
}

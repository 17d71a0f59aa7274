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
    };
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

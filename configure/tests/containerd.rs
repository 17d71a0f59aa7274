//! `gpuslice configure containerd` on real-world configs (Debian's, kubeadm's with systemd
//! cgroups, nvidia-ctk's, kata's, drop-in layouts, containerd 2.x): golden files, the
//! effective config containerd itself computes (`containerd config dump`, when containerd is
//! installed) differs only by the gpuslice runtime, idempotence, `--remove` restores the
//! original byte for byte, malformed or unsupported configs are refused untouched.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{dirs, fixture, golden, mode, stage, tree};
use gpuslice_configure::containerd::{plan_add, plan_remove, ContainerdError, Target, Version};
use gpuslice_configure::files::backup_path;
use gpuslice_configure::registration::Registration;

const RUNTIME: &str = "/usr/bin/gpuslice-runtime";

fn reg() -> Registration {
    Registration {
        runtime: RUNTIME.into(),
        config: None,
    }
}

fn target(dir: &Path, fallback: Version) -> Target {
    Target {
        config: dir.join("config.toml"),
        fallback_version: fallback,
    }
}

fn add(t: &Target, r: &Registration) -> String {
    plan_add(t, r).expect("plan").apply(false).expect("apply")
}

fn remove(t: &Target) -> String {
    plan_remove(t).expect("plan").apply(false).expect("apply")
}

/// `containerd config dump` of `config` as values, without `imports` (which names the file
/// itself); `None` when containerd is not installed.
fn dump(config: &Path) -> Option<toml::Table> {
    let out = Command::new("containerd")
        .arg("--config")
        .arg(config)
        .args(["config", "dump"])
        .output()
        .ok()?;
    assert!(
        out.status.success(),
        "containerd config dump {}: {}",
        config.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut t: toml::Table = toml::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();
    t.remove("imports");
    Some(t)
}

fn runtimes(t: &mut toml::Table) -> &mut toml::Table {
    t["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
        .as_table_mut()
        .unwrap()
}

/// The whole life of one fixture: configure (golden), again (no change), effective config
/// (containerd 1.x), remove (original restored, nothing left).
fn lifecycle(case: &str, fallback: Version) -> Option<toml::Value> {
    let d = tempfile::tempdir().unwrap();
    stage(&fixture("containerd", case).join("input"), d.path());
    let before = tree(d.path());
    let before_dirs = dirs(d.path());
    let t = target(d.path(), fallback);
    let pristine = tempfile::tempdir().unwrap();
    stage(&fixture("containerd", case).join("input"), pristine.path());

    add(&t, &reg());
    golden("containerd", case, d.path());
    let after = tree(d.path());
    assert!(
        add(&t, &reg()).contains("nothing to change"),
        "{case}: not idempotent"
    );
    assert_eq!(tree(d.path()), after, "{case}: a second run changed files");

    let mut effective = None;
    if t.drop_in().exists()
        && std::fs::read_to_string(t.drop_in())
            .unwrap()
            .contains("version = 2")
    {
        let pristine_config = pristine.path().join("config.toml");
        if let (Some(mut was), Some(mut now)) = (
            if pristine_config.exists() {
                dump(&pristine_config)
            } else {
                dump(Path::new("/dev/null"))
            },
            dump(&t.config),
        ) {
            let ours = runtimes(&mut now)
                .remove("gpuslice")
                .expect("gpuslice runtime in the effective config");
            // Paths of the fixture differ between the two temp dirs.
            let was_text = toml::to_string(&was)
                .unwrap()
                .replace(&pristine.path().display().to_string(), "@DIR@");
            let now_text = toml::to_string(&now)
                .unwrap()
                .replace(&d.path().display().to_string(), "@DIR@");
            was = toml::from_str(&was_text).unwrap();
            now = toml::from_str(&now_text).unwrap();
            assert_eq!(
                now, was,
                "{case}: the effective config changed beyond the gpuslice runtime"
            );
            effective = Some(ours);
        }
    }

    let containerd_installed = Command::new("containerd").arg("--version").output().is_ok();
    let v2 = std::fs::read_to_string(t.drop_in())
        .unwrap()
        .contains("\nversion = 2\n");
    assert_eq!(
        effective.is_some(),
        containerd_installed && v2,
        "{case}: the effective config was not checked"
    );

    remove(&t);
    assert_eq!(
        tree(d.path()),
        before,
        "{case}: --remove did not restore every file"
    );
    assert_eq!(
        dirs(d.path()),
        before_dirs,
        "{case}: --remove left directories behind"
    );
    assert!(plan_remove(&t)
        .unwrap()
        .apply(false)
        .unwrap()
        .contains("nothing to change"));
    effective
}

#[test]
fn debian_default_config() {
    let rt = lifecycle("debian", Version::V2);
    if let Some(rt) = rt {
        assert_eq!(rt["options"]["BinaryName"].as_str(), Some(RUNTIME));
        assert_eq!(rt["runtime_type"].as_str(), Some("io.containerd.runc.v2"));
        assert_eq!(
            rt["pod_annotations"].as_array().unwrap(),
            &vec![toml::Value::from("gpuslice.io/*")]
        );
    }
}

#[test]
fn kubeadm_config_with_systemd_cgroups_is_inherited() {
    if let Some(rt) = lifecycle("kubeadm-systemd", Version::V2) {
        assert_eq!(rt["options"]["SystemdCgroup"].as_bool(), Some(true));
        assert_eq!(rt["options"]["BinaryName"].as_str(), Some(RUNTIME));
        assert_eq!(
            rt["container_annotations"][0].as_str(),
            Some("gpuslice.io/*")
        );
    }
}

#[test]
fn nvidia_default_runtime_options_but_not_its_binary() {
    if let Some(rt) = lifecycle("nvidia-default", Version::V2) {
        assert_eq!(rt["options"]["SystemdCgroup"].as_bool(), Some(true));
        assert_eq!(rt["options"]["BinaryName"].as_str(), Some(RUNTIME));
        assert_eq!(
            rt["base_runtime_spec"].as_str(),
            Some("/etc/containerd/base-spec.json")
        );
    }
}

#[test]
fn kata_default_runtime_is_not_inherited() {
    let d = tempfile::tempdir().unwrap();
    stage(
        &fixture("containerd", "kata-default").join("input"),
        d.path(),
    );
    let out = add(&target(d.path(), Version::V2), &reg());
    assert!(out.contains("inherits none"), "{out}");
    lifecycle("kata-default", Version::V2);
}

#[test]
fn drop_in_layout_copies_the_imported_cri_section() {
    // The CRI section lives in conf.d/10-cri.toml; the glob already imports the drop-in.
    lifecycle("imports-glob", Version::V2);
    let d = tempfile::tempdir().unwrap();
    stage(
        &fixture("containerd", "imports-glob").join("input"),
        d.path(),
    );
    let t = target(d.path(), Version::V2);
    let main_before = std::fs::read_to_string(&t.config).unwrap();
    add(&t, &reg());
    assert_eq!(std::fs::read_to_string(&t.config).unwrap(), main_before);
    let dropin = std::fs::read_to_string(t.drop_in()).unwrap();
    assert!(
        dropin.contains("config_path = \"/etc/containerd/certs.d\""),
        "{dropin}"
    );
}

#[test]
fn containerd_2_configs_get_a_runtime_only_drop_in() {
    lifecycle("v3-systemd", Version::V2);
    lifecycle("v3-conf-d", Version::V2);
    let d = tempfile::tempdir().unwrap();
    stage(&fixture("containerd", "v3-systemd").join("input"), d.path());
    let t = target(d.path(), Version::V2);
    add(&t, &reg());
    let v: toml::Table = toml::from_str(&std::fs::read_to_string(t.drop_in()).unwrap()).unwrap();
    let rt = &v["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["gpuslice"];
    assert_eq!(rt["options"]["SystemdCgroup"].as_bool(), Some(true));
    assert_eq!(rt["options"]["BinaryName"].as_str(), Some(RUNTIME));
    assert_eq!(rt["sandboxer"].as_str(), Some("podsandbox"));
    assert_eq!(v["version"].as_integer(), Some(3));
    assert!(v["plugins"]["io.containerd.cri.v1.runtime"]
        .get("enable_cdi")
        .is_none());
}

#[test]
fn empty_and_missing_configs() {
    lifecycle("empty", Version::V2);
    lifecycle("missing", Version::V3);
    let d = tempfile::tempdir().unwrap();
    let t = target(d.path(), Version::V2);
    add(&t, &reg());
    if let Some(mut now) = dump(&t.config) {
        assert!(runtimes(&mut now).contains_key("gpuslice"));
        assert!(runtimes(&mut now).contains_key("runc"));
    }
}

#[test]
fn malformed_and_unsupported_configs_are_refused_untouched() {
    for (file, want) in [
        ("config.toml", "not valid TOML"),
        ("version1.toml", "version 1"),
    ] {
        let d = tempfile::tempdir().unwrap();
        let src = fixture("containerd", "malformed").join(file);
        let cfg = d.path().join("config.toml");
        std::fs::copy(&src, &cfg).unwrap();
        let t = target(d.path(), Version::V2);
        let err = plan_add(&t, &reg()).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(want) && msg.contains(&cfg.display().to_string()),
            "{msg}"
        );
        assert!(!msg.contains('\n'), "one line: {msg}");
        assert_eq!(std::fs::read(&cfg).unwrap(), std::fs::read(&src).unwrap());
        assert_eq!(tree(d.path()).len(), 1, "something was written");
    }
    let d = tempfile::tempdir().unwrap();
    std::fs::write(
        d.path().join("config.toml"),
        "version = 2\nimports = \"conf.d\"\n",
    )
    .unwrap();
    assert!(matches!(
        plan_add(&target(d.path(), Version::V2), &reg()),
        Err(ContainerdError::Shape { .. })
    ));
}

#[test]
fn an_imported_malformed_file_is_refused() {
    let d = tempfile::tempdir().unwrap();
    stage(
        &fixture("containerd", "imports-glob").join("input"),
        d.path(),
    );
    std::fs::write(d.path().join("conf.d/20-bad.toml"), "[plugins\n").unwrap();
    let err = plan_add(&target(d.path(), Version::V2), &reg()).unwrap_err();
    assert!(err.to_string().contains("20-bad.toml"), "{err}");
}

#[test]
fn a_foreign_drop_in_is_never_overwritten() {
    let d = tempfile::tempdir().unwrap();
    stage(&fixture("containerd", "debian").join("input"), d.path());
    let t = target(d.path(), Version::V2);
    std::fs::create_dir_all(t.drop_in().parent().unwrap()).unwrap();
    std::fs::write(t.drop_in(), "# mine\n").unwrap();
    assert!(matches!(
        plan_add(&t, &reg()),
        Err(ContainerdError::Foreign { .. })
    ));
    assert!(matches!(
        plan_remove(&t),
        Err(ContainerdError::Foreign { .. })
    ));
}

#[test]
fn dry_run_writes_nothing() {
    let d = tempfile::tempdir().unwrap();
    stage(
        &fixture("containerd", "kubeadm-systemd").join("input"),
        d.path(),
    );
    let before = tree(d.path());
    let t = target(d.path(), Version::V2);
    let out = plan_add(&t, &reg()).unwrap().apply(true).unwrap();
    assert!(
        out.contains("would write") && out.contains("+imports = ["),
        "{out}"
    );
    assert_eq!(tree(d.path()), before);
}

#[test]
fn operator_edits_after_configure_survive_remove() {
    let d = tempfile::tempdir().unwrap();
    stage(&fixture("containerd", "debian").join("input"), d.path());
    let t = target(d.path(), Version::V2);
    add(&t, &reg());
    let edited = std::fs::read_to_string(&t.config)
        .unwrap()
        .replace("bin_dir = \"/usr/lib/cni\"", "bin_dir = \"/opt/cni/bin\"");
    std::fs::write(&t.config, &edited).unwrap();
    // Re-running refreshes the copy of the CRI section in the drop-in.
    add(&t, &reg());
    assert!(std::fs::read_to_string(t.drop_in())
        .unwrap()
        .contains("/opt/cni/bin"));
    remove(&t);
    let now = std::fs::read_to_string(&t.config).unwrap();
    assert!(
        now.contains("/opt/cni/bin") && !now.contains("gpuslice"),
        "{now}"
    );
    assert!(!backup_path(&t.config).exists());
    assert!(!t.drop_in().exists());
}

#[test]
fn a_non_default_gpuslice_config_goes_through_a_wrapper() {
    let d = tempfile::tempdir().unwrap();
    stage(&fixture("containerd", "debian").join("input"), d.path());
    let t = target(d.path(), Version::V2);
    let r = Registration {
        runtime: RUNTIME.into(),
        config: Some(PathBuf::from("/srv/gpuslice/node.toml")),
    };
    add(&t, &r);
    let wrapper = std::fs::read_to_string(t.wrapper()).unwrap();
    assert!(
        wrapper.contains("GPUSLICE_CONFIG='/srv/gpuslice/node.toml'"),
        "{wrapper}"
    );
    assert!(
        wrapper.contains(&format!("exec '{RUNTIME}' \"$@\"")),
        "{wrapper}"
    );
    assert_eq!(mode(&t.wrapper()), 0o755);
    let dropin = std::fs::read_to_string(t.drop_in()).unwrap();
    assert!(dropin.contains(&format!("BinaryName = \"{}\"", t.wrapper().display())));
    // Back to the default config: the wrapper goes, BinaryName is the runtime again.
    add(&t, &reg());
    assert!(!t.wrapper().exists());
    add(&t, &r);
    remove(&t);
    assert!(!t.wrapper().exists());
}

/// containerd 1.x: the drop-in copies the CRI section, registry credentials included, from
/// whichever file defines it last; the copy must not be readable by more than that file.
#[test]
fn the_drop_in_is_as_private_as_the_imported_file_it_copies() {
    use std::os::unix::fs::PermissionsExt;
    let set = |p: &Path, m: u32| std::fs::set_permissions(p, PermissionsExt::from_mode(m)).unwrap();
    let d = tempfile::tempdir().unwrap();
    let t = target(d.path(), Version::V2);
    std::fs::write(&t.config, "version = 2\nimports = [\"conf.d/*.toml\"]\n").unwrap();
    set(&t.config, 0o644);
    let creds = d.path().join("conf.d/10-registry.toml");
    std::fs::create_dir_all(creds.parent().unwrap()).unwrap();
    std::fs::write(
        &creds,
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".registry.configs.\"reg.example\".auth]\nusername = \"u\"\npassword = \"s3cret\"\n",
    )
    .unwrap();
    set(&creds, 0o600);
    add(&t, &reg());
    assert!(std::fs::read_to_string(t.drop_in())
        .unwrap()
        .contains("s3cret"));
    assert_eq!(mode(&t.drop_in()), 0o600, "the copied password is readable");
    assert_eq!(mode(&t.config), 0o644);

    // A group-readable source and a 0644 drop-in an older run left: the text is unchanged,
    // the mode narrows to what both allow.
    set(&creds, 0o640);
    set(&t.drop_in(), 0o644);
    let out = add(&t, &reg());
    assert!(out.contains("set the mode of"), "{out}");
    assert_eq!(mode(&t.drop_in()), 0o640);
    remove(&t);
    assert!(!t.drop_in().exists());
}

/// The main config as a symlink stays one through configure and `--remove`.
#[test]
fn a_symlinked_main_config_stays_a_symlink() {
    let d = tempfile::tempdir().unwrap();
    stage(&fixture("containerd", "debian").join("input"), d.path());
    let t = target(d.path(), Version::V2);
    let real = d.path().join("managed.toml");
    std::fs::rename(&t.config, &real).unwrap();
    std::os::unix::fs::symlink(&real, &t.config).unwrap();
    let original = std::fs::read_to_string(&real).unwrap();
    let is_link = |p: &Path| {
        std::fs::symlink_metadata(p)
            .unwrap()
            .file_type()
            .is_symlink()
    };
    add(&t, &reg());
    assert!(is_link(&t.config));
    assert!(std::fs::read_to_string(&real)
        .unwrap()
        .contains("conf.d/gpuslice.toml"));
    remove(&t);
    assert!(is_link(&t.config));
    assert_eq!(std::fs::read_to_string(&real).unwrap(), original);
}

/// A `gpuslice` runtime the operator defined already is refused, naming the file and the
/// table: containerd 2.x would merge it key by key with the drop-in's into a hybrid (kata's
/// `privileged_without_host_devices` and `options.ConfigPath` on gpuslice's runc runtime).
/// Exactly the runtime gpuslice writes is accepted.
#[test]
fn an_existing_gpuslice_runtime_is_refused_unless_it_is_ours() {
    let d = tempfile::tempdir().unwrap();
    let t = target(d.path(), Version::V3);
    let table = "plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.gpuslice";
    let kata = format!(
        "version = 3\n[{table}]\nruntime_type = \"io.containerd.kata.v2\"\nprivileged_without_host_devices = true\n[{table}.options]\nConfigPath = \"/kata.toml\"\n"
    );
    std::fs::write(&t.config, &kata).unwrap();
    let err = plan_add(&t, &reg()).unwrap_err();
    assert!(matches!(err, ContainerdError::Shape { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(&t.config.display().to_string())
            && msg.contains(&format!("`{table}`"))
            && msg.contains("nothing was changed")
            && !msg.contains('\n'),
        "{msg}"
    );
    assert_eq!(std::fs::read_to_string(&t.config).unwrap(), kata);
    assert_eq!(tree(d.path()).len(), 1, "something was written");

    // The same in an imported file, on containerd 1.x (the drop-in would replace it).
    let d = tempfile::tempdir().unwrap();
    let t = target(d.path(), Version::V2);
    std::fs::write(&t.config, "version = 2\nimports = [\"conf.d/*.toml\"]\n").unwrap();
    let imported = d.path().join("conf.d/50-kata.toml");
    std::fs::create_dir_all(imported.parent().unwrap()).unwrap();
    std::fs::write(
        &imported,
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.gpuslice]\nruntime_type = \"io.containerd.kata.v2\"\n",
    )
    .unwrap();
    let msg = plan_add(&t, &reg()).unwrap_err().to_string();
    assert!(
        msg.contains(&imported.display().to_string()) && msg.contains("runtimes.gpuslice"),
        "{msg}"
    );

    // What gpuslice itself writes, moved into the main config: nothing to merge badly.
    let d = tempfile::tempdir().unwrap();
    let t = target(d.path(), Version::V3);
    std::fs::write(&t.config, "version = 3\n").unwrap();
    add(&t, &reg());
    let drop_in = std::fs::read_to_string(t.drop_in()).unwrap();
    remove(&t);
    let ours = drop_in
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("version"))
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&t.config, format!("version = 3\n{ours}\n")).unwrap();
    add(&t, &reg());
    remove(&t);
}

/// containerd 1.x takes a plugin's whole section from the last file that has it: an import
/// with a CRI section that sorts after gpuslice's drop-in would hide the gpuslice runtime.
/// That is refused, naming the file, and nothing is written (glob absolute or relative).
#[test]
fn a_cri_section_imported_after_the_drop_in_is_refused_on_containerd_1() {
    for glob in ["@DIR@/conf.d/*.toml", "conf.d/*.toml"] {
        let d = tempfile::tempdir().unwrap();
        let t = target(d.path(), Version::V2);
        let glob = glob.replace("@DIR@", &d.path().display().to_string());
        std::fs::write(
            &t.config,
            format!("version = 2\nimports = [\"{glob}\"]\n\n[grpc]\n  address = \"/run/containerd/containerd.sock\"\n"),
        )
        .unwrap();
        let later = d.path().join("conf.d/zz-mirrors.toml");
        std::fs::create_dir_all(later.parent().unwrap()).unwrap();
        std::fs::write(
            &later,
            "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = \"/etc/containerd/certs.d\"\n",
        )
        .unwrap();
        let before = tree(d.path());
        let err = plan_add(&t, &reg()).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(&later.display().to_string())
                && msg.contains(&t.drop_in().display().to_string())
                && msg.contains("nothing was changed")
                && !msg.contains('\n'),
            "{glob}: {msg}"
        );
        assert_eq!(tree(d.path()), before, "{glob}: something was written");
    }
}

/// `--remove` where gpuslice was never registered is a no-op, whatever the main config's
/// version (none: containerd's version 1) or shape.
#[test]
fn remove_without_a_registration_changes_nothing() {
    for main in [
        "[grpc]\n  address = \"/run/containerd/containerd.sock\"\n",
        "version = 1\n",
        "[plugins\n",
    ] {
        let d = tempfile::tempdir().unwrap();
        let t = target(d.path(), Version::V2);
        std::fs::write(&t.config, main).unwrap();
        let before = tree(d.path());
        let out = plan_remove(&t).unwrap().apply(false).unwrap();
        assert!(out.contains("nothing to change"), "{main}: {out}");
        assert_eq!(tree(d.path()), before, "{main}");
    }
}

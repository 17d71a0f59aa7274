//! The `[health]` table (docs/configuration.md, docs/troubleshooting.md "GPU health and
//! XIDs"): which XIDs leave a GPU healthy, the taint effect, their defaults, and bad values
//! refused with one line naming the key, the value and what is accepted.

use std::path::Path;

use gpuslice_config::{parse_config, TaintEffect, DEFAULT_IGNORED_XIDS};

fn err(text: &str) -> String {
    let e = parse_config(text, Path::new("/etc/gpuslice/config.toml")).expect_err(text);
    let line = e.to_string();
    assert!(!line.contains('\n'), "one line: {line}");
    line
}

#[test]
fn defaults_are_nvidias_device_plugin_application_errors_and_no_schedule() {
    let c = parse_config("", Path::new("/c.toml")).unwrap();
    assert_eq!(c.health.ignored_xids, DEFAULT_IGNORED_XIDS);
    assert_eq!(DEFAULT_IGNORED_XIDS, [13, 31, 43, 45, 68, 109]);
    assert_eq!(c.health.taint_effect, TaintEffect::NoSchedule);
    for fatal in [48, 63, 64, 79, 94, 95, 119, 120] {
        assert!(c.health.is_fatal(fatal), "XID {fatal}");
    }
    for ignored in DEFAULT_IGNORED_XIDS {
        assert!(!c.health.is_fatal(ignored), "XID {ignored}");
    }
}

#[test]
fn every_key_is_read() {
    let c = parse_config(
        "[health]\nignored_xids = [13, 79]\ntaint_effect = \"NoExecute\"\n",
        Path::new("/c.toml"),
    )
    .unwrap();
    assert_eq!(c.health.ignored_xids, [13, 79]);
    assert!(!c.health.is_fatal(79) && c.health.is_fatal(31));
    assert_eq!(c.health.taint_effect, TaintEffect::NoExecute);
    let c = parse_config("[health]\nignored_xids = []\n", Path::new("/c.toml")).unwrap();
    assert!(c.health.is_fatal(13), "an empty list makes every XID fatal");
}

#[test]
fn bad_values_name_the_key_the_value_and_the_accepted_form() {
    let e = err("[health]\ntaint_effect = \"NoExecut\"\n");
    assert!(
        e.contains("health.taint_effect")
            && e.contains("\"NoExecut\"")
            && e.contains("`NoSchedule` or `NoExecute`"),
        "{e}"
    );
    for bad in ["[0]", "[70000]", "[\"13\"]"] {
        let e = err(&format!("[health]\nignored_xids = {bad}\n"));
        assert!(
            e.contains("health.ignored_xids") && e.contains("array of XIDs"),
            "{e}"
        );
    }
    let e = err("[health]\nignored_xids = 13\n");
    assert!(
        e.contains("health.ignored_xids") && e.contains("integer"),
        "{e}"
    );
    let e = err("[health]\nfatal = true\n");
    assert!(
        e.contains("health.fatal") && e.contains("ignored_xids, taint_effect"),
        "{e}"
    );
}

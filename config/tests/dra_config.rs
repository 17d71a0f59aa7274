//! The `[dra]` table (docs/kubernetes-dra.md, "Slot mode: every DRA cluster"): `mode` and `slots_per_gpu`, their
//! defaults, and each bad value refused with one line naming the key, the value and what is
//! accepted.

use std::path::Path;

use gpuslice_config::{parse_config, DraMode, DEFAULT_SLOTS_PER_GPU};

fn err(text: &str) -> String {
    let e = parse_config(text, Path::new("/etc/gpuslice/config.toml")).expect_err(text);
    let line = e.to_string();
    assert!(!line.contains('\n'), "one line: {line}");
    line
}

#[test]
fn defaults_detect_the_mode_and_publish_sixteen_slots() {
    let c = parse_config("", Path::new("/c.toml")).unwrap();
    assert_eq!(c.dra.mode, DraMode::Auto);
    assert_eq!(c.dra.slots_per_gpu, DEFAULT_SLOTS_PER_GPU);
    assert_eq!(DEFAULT_SLOTS_PER_GPU, 6);
}

#[test]
fn every_key_is_read() {
    for (text, mode) in [
        ("auto", DraMode::Auto),
        ("capacity", DraMode::Capacity),
        ("slots", DraMode::Slots),
    ] {
        let c = parse_config(
            &format!("[dra]\nmode = \"{text}\"\nslots_per_gpu = 128\n"),
            Path::new("/c.toml"),
        )
        .unwrap();
        assert_eq!(c.dra.mode, mode);
        assert_eq!(c.dra.mode.as_str(), text);
        assert_eq!(c.dra.slots_per_gpu, 128);
    }
    let c = parse_config("[dra]\nslots_per_gpu = 1\n", Path::new("/c.toml")).unwrap();
    assert_eq!(c.dra.slots_per_gpu, 1);
}

#[test]
fn bad_values_name_the_key_the_value_and_the_accepted_form() {
    let e = err("[dra]\nmode = \"slot\"\n");
    assert!(
        e.contains("dra.mode")
            && e.contains("\"slot\"")
            && e.contains("`auto`, `capacity` or `slots`"),
        "{e}"
    );
    for n in ["0", "129", "-1"] {
        let e = err(&format!("[dra]\nslots_per_gpu = {n}\n"));
        assert!(
            e.contains("dra.slots_per_gpu") && e.contains(n) && e.contains("from 1 to 128"),
            "{e}"
        );
    }
    let e = err("[dra]\nslots_per_gpu = \"16\"\n");
    assert!(
        e.contains("dra.slots_per_gpu") && e.contains("from 1 to 128"),
        "{e}"
    );
    let e = err("[dra]\nslots = 4\n");
    assert!(
        e.contains("`dra.slots`") && e.contains("mode, slots_per_gpu"),
        "{e}"
    );
}

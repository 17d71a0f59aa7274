//! The config file as an operator writes it: defaults, every key, and one-line refusals.

use std::path::Path;
use std::time::Duration;

use gpuslice_config::quantity::ACCEPTED_BYTES;
use gpuslice_config::*;

fn parse(text: &str) -> Result<Config, ConfigError> {
    parse_config(text, Path::new("/etc/gpuslice/config.toml"))
}

fn err(text: &str) -> String {
    let e = parse(text).expect_err("config should be refused");
    let line = e.to_string();
    assert!(!line.contains('\n'), "error is not one line: {line}");
    assert!(
        line.starts_with("config /etc/gpuslice/config.toml: "),
        "{line}"
    );
    line
}

#[test]
fn empty_file_gives_defaults() {
    let c = parse("").expect("empty config");
    assert_eq!(c, Config::default());
    assert_eq!(c.state_dir, Path::new("/run/gpuslice"));
    assert_eq!(c.cdi.spec_dir, Path::new("/var/run/cdi"));
    assert_eq!(c.placement.policy, Policy::Binpack);
    assert_eq!(c.inventory.source, InventorySource::Nvml);
    assert_eq!(
        c.shim.library,
        Path::new("/usr/lib/gpuslice/libgpuslice_shim.so")
    );
    assert_eq!(c.runtime.path, Path::new("runc"));
    assert_eq!(c.registry.pending_timeout, Duration::from_secs(120));
}

#[test]
fn full_file_is_read() {
    let c = parse(
        r#"
state_dir = "/tmp/gs"
[inventory]
source = "simulated"
[[inventory.simulated]]
model = "NVIDIA H200"
memory = "141Gi"
[[inventory.simulated]]
model = "NVIDIA A100-SXM4-40GB"
memory = "40Gi"
uuid = "GPU-12345678-1234-1234-1234-123456789abc"
[cdi]
spec_dir = "/tmp/cdi"
[placement]
policy = "spread"
memory_overcommit = 1.5
max_slices_per_gpu = 8
[shim]
library = "/opt/gpuslice/libgpuslice_shim.so"
[runtime]
path = "/usr/sbin/runc"
[registry]
pending_timeout = "30s"
[driver]
root = "/run/nvidia/driver"
[hook]
path = "/usr/bin/gpuslice"
[serve]
listen = "0.0.0.0:9500"
"#,
    )
    .expect("valid config");
    assert_eq!(c.state_dir, Path::new("/tmp/gs"));
    assert_eq!(c.inventory.simulated.len(), 2);
    assert_eq!(c.inventory.simulated[0].memory, 141 << 30);
    assert_eq!(
        c.inventory.simulated[0].uuid,
        simulated_uuid(0, "NVIDIA H200")
    );
    assert_eq!(
        c.inventory.simulated[1].uuid,
        "GPU-12345678-1234-1234-1234-123456789abc"
    );
    assert_eq!(c.placement.policy, Policy::Spread);
    assert_eq!(c.placement.memory_overcommit, 1.5);
    assert_eq!(c.placement.max_slices_per_gpu, Some(8));
    assert_eq!(c.registry.pending_timeout, Duration::from_secs(30));
    assert_eq!(c.effective_driver_root(), Path::new("/tmp/gs/sim"));
    assert_eq!(c.hook.path.as_deref(), Some(Path::new("/usr/bin/gpuslice")));
    assert_eq!(c.serve.listen.port(), 9500);
}

#[test]
fn unknown_key_names_key_and_accepted() {
    let line = err("[placement]\npolcy = \"spread\"\n");
    assert!(line.contains("unknown key `placement.polcy`"), "{line}");
    assert!(
        line.contains("policy, memory_overcommit, max_slices_per_gpu"),
        "{line}"
    );
    let line = err("colour = 1\n");
    assert!(line.contains("unknown key `colour`"), "{line}");
    let line = err("[inventory]\nsource=\"simulated\"\n[[inventory.simulated]]\nmemroy=\"1Gi\"\n");
    assert!(
        line.contains("unknown key `inventory.simulated[0].memroy`"),
        "{line}"
    );
}

#[test]
fn wrong_type_names_key_value_and_expected() {
    let line = err("state_dir = 5\n");
    assert!(
        line.contains("key `state_dir`: value 5 is a integer; expected a string"),
        "{line}"
    );
    let line = err("[placement]\nmax_slices_per_gpu = \"4\"\n");
    assert!(
        line.contains("key `placement.max_slices_per_gpu`: value \"4\" is a string"),
        "{line}"
    );
    let line = err("placement = \"binpack\"\n");
    assert!(line.contains("expected a table"), "{line}");
    let sim = "[inventory]\nsource=\"simulated\"\n[[inventory.simulated]]\nmemory = \"1Gi\"\n";
    let line = err(&format!("{sim}[[inventory.simulated]]\nmodel = 7\n"));
    assert!(
        line.contains(
            "key `inventory.simulated[1].model`: value 7 is a integer; expected a string"
        ),
        "{line}"
    );
    let line = err(&format!("{sim}uuid = true\n"));
    assert!(
        line.contains(
            "key `inventory.simulated[0].uuid`: value true is a boolean; expected a string"
        ),
        "{line}"
    );
    let line = err(&format!("{sim}uuid = \"GPU-nope\"\n"));
    assert!(
        line.contains("key `inventory.simulated[0].uuid`: value \"GPU-nope\" is not accepted"),
        "{line}"
    );
}

#[test]
fn bad_quantity_is_refused() {
    let line =
        err("[inventory]\nsource=\"simulated\"\n[[inventory.simulated]]\nmemory = \"100m\"\n");
    assert!(
        line.contains("key `inventory.simulated[0].memory`: value \"100m\" is not accepted"),
        "{line}"
    );
    assert!(line.contains("Gi"), "{line}");
    let line =
        err("[inventory]\nsource=\"simulated\"\n[[inventory.simulated]]\nmemory = \"25%\"\n");
    assert!(line.contains("value \"25%\" is not accepted"), "{line}");
}

/// The refusal keeps the quantity parser's reason (docs/configuration.md, "Quantities"):
/// one line with the key, the value, why, and what is accepted.
#[test]
fn bad_quantity_says_why() {
    let sim = "[inventory]\nsource=\"simulated\"\n[[inventory.simulated]]\n";
    for (value, reason) in [
        ("100m", "milli"),
        ("4GB", "without `B`, here `G`"),
        ("4GiB", "here `Gi`"),
        ("4gi", "capital letter"),
        ("16Ei", "too large, more than 2^64-1 bytes"),
        ("1.5", "not a whole number of bytes"),
        ("25%", "only an absolute size"),
    ] {
        let line = err(&format!("{sim}memory = \"{value}\"\n"));
        assert!(
            line.contains(&format!(
                "key `inventory.simulated[0].memory`: value \"{value}\" is not accepted ("
            )) && line.contains(reason)
                && line.contains(&format!("expected {ACCEPTED_BYTES}")),
            "{line}"
        );
        let line = err(&format!(
            "{sim}memory = \"16Gi\"\ncontext_memory = \"{value}\"\n"
        ));
        assert!(
            line.contains("key `inventory.simulated[0].context_memory`") && line.contains(reason),
            "{line}"
        );
    }
}

#[test]
fn bad_policy_is_refused() {
    let line = err("[placement]\npolicy = \"fastest\"\n");
    assert!(line.contains("key `placement.policy`: value \"fastest\" is not accepted; expected `binpack` or `spread`"), "{line}");
}

#[test]
fn other_bad_values_are_refused() {
    assert!(err("state_dir = \"relative/dir\"\n").contains("absolute path"));
    assert!(err("state_dir = \"/run/../etc\"\n").contains("absolute path"));
    assert!(err("[inventory]\nsource = \"cuda\"\n").contains("`nvml` or `simulated`"));
    assert!(err("[inventory]\nsource = \"simulated\"\n")
        .contains("at least one [[inventory.simulated]]"));
    assert!(err("[registry]\npending_timeout = \"forever\"\n").contains("duration"));
    assert!(err("[registry]\npending_timeout = \"0s\"\n").contains("duration"));
    assert!(err("[placement]\nmemory_overcommit = 0.5\n").contains("1.0 to 16.0"));
    assert!(err("[serve]\nlisten = \"localhost\"\n").contains("address and port"));
    assert!(err("[runtime]\npath = \"bin/runc\"\n").contains("absolute path or a program name"));
    assert!(
        err("[inventory]\nsource=\"simulated\"\n[[inventory.simulated]]\nuuid=\"nope\"\n")
            .contains("`GPU-` followed by a UUID")
    );
    let dup = "[inventory]\nsource=\"simulated\"\n[[inventory.simulated]]\nuuid=\"GPU-12345678-1234-1234-1234-123456789abc\"\n[[inventory.simulated]]\nuuid=\"GPU-12345678-1234-1234-1234-123456789abc\"\n";
    assert!(err(dup).contains("not used by another"));
}

#[test]
fn syntax_error_has_line_and_column() {
    let line = err("state_dir = \"/x\"\n[placement\n");
    assert!(line.contains("invalid TOML at line 2"), "{line}");
}

#[test]
fn load_prefers_flag_then_env_then_default() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = dir.path().join("a.toml");
    let b = dir.path().join("b.toml");
    std::fs::write(&a, "state_dir = \"/a\"\n").expect("write");
    std::fs::write(&b, "state_dir = \"/b\"\n").expect("write");
    let l = load_config(Some(&a), Some(b.as_os_str())).expect("flag");
    assert_eq!(l.config.state_dir, Path::new("/a"));
    assert_eq!(l.origin, ConfigOrigin::Flag);
    assert_eq!(
        l.hook_args(),
        vec!["--config".to_string(), a.display().to_string()]
    );
    let l = load_config(None, Some(b.as_os_str())).expect("env");
    assert_eq!(l.config.state_dir, Path::new("/b"));
    assert_eq!(l.origin, ConfigOrigin::Env);
    let missing = dir.path().join("missing.toml");
    let e = load_config(Some(&missing), None).expect_err("missing explicit file");
    assert!(e.to_string().contains("cannot read"), "{e}");
    assert!(e.to_string().contains("missing.toml"), "{e}");
}

#[test]
fn simulated_context_memory_is_a_byte_quantity_with_a_default() {
    let sim = "[inventory]\nsource=\"simulated\"\n[[inventory.simulated]]\nmemory = \"16Gi\"\n";
    let c = parse(sim).expect("default context memory");
    assert_eq!(
        c.inventory.simulated[0].context_memory,
        DEFAULT_SIM_CONTEXT_MEMORY
    );
    let c = parse(&format!("{sim}context_memory = \"300Mi\"\n")).expect("300Mi");
    assert_eq!(c.inventory.simulated[0].context_memory, 300 << 20);
    let c = parse(&format!("{sim}context_memory = 0\n")).expect("0 for exact figures");
    assert_eq!(c.inventory.simulated[0].context_memory, 0);
    // A small GPU's default leaves it three quarters of its memory.
    let small = "[inventory]\nsource=\"simulated\"\n[[inventory.simulated]]\nmemory = \"1Gi\"\n";
    assert_eq!(
        parse(small).expect("small").inventory.simulated[0].context_memory,
        256 << 20
    );
    let line = err(&format!("{sim}context_memory = \"5Gi\"\n"));
    assert!(
        line.contains("key `inventory.simulated[0].context_memory`: value \"5Gi\" is not accepted")
            && line.contains("at most a quarter of `memory`"),
        "{line}"
    );
    let line = err(&format!("{sim}context_memory = \"lots\"\n"));
    assert!(line.contains("Mi"), "{line}");
    let line = err(&format!("{sim}context_memory = -1\n"));
    assert!(line.contains("context_memory"), "{line}");
}

#[test]
fn simulated_reserved_memory_is_a_byte_quantity_below_memory() {
    let sim = "[inventory]\nsource=\"simulated\"\n[[inventory.simulated]]\nmemory = \"16Gi\"\n";
    let c = parse(sim).expect("no reserved memory");
    assert_eq!(c.inventory.simulated[0].reserved_memory, 0);
    let c = parse(&format!("{sim}reserved_memory = \"470Mi\"\n")).expect("470Mi");
    assert_eq!(c.inventory.simulated[0].reserved_memory, 470 << 20);
    let c = parse(&format!("{sim}reserved_memory = 1048576\n")).expect("bytes");
    assert_eq!(c.inventory.simulated[0].reserved_memory, 1 << 20);
    for value in ["\"16Gi\"", "\"17Gi\""] {
        let line = err(&format!("{sim}reserved_memory = {value}\n"));
        assert!(
            line.contains(&format!(
                "key `inventory.simulated[0].reserved_memory`: value {value} is not accepted"
            )) && line.contains("less than `memory` (16Gi)"),
            "{line}"
        );
    }
    let line = err(&format!("{sim}reserved_memory = \"lots\"\n"));
    assert!(
        line.contains("reserved_memory") && line.contains("\"lots\"") && line.contains("Mi"),
        "{line}"
    );
    let line = err(&format!("{sim}reserved_memory = -1\n"));
    assert!(
        line.contains("reserved_memory") && line.contains("-1"),
        "{line}"
    );
    let line = err(&format!("{sim}reserved_memory = true\n"));
    assert!(line.contains("reserved_memory"), "{line}");
}

/// "1 to 96 printable characters" counts characters: 96 `é` (192 bytes) are a valid model.
#[test]
fn simulated_model_length_counts_characters() {
    let sim = "[inventory]\nsource=\"simulated\"\n[[inventory.simulated]]\n";
    let long = "é".repeat(96);
    let c = parse(&format!("{sim}model = \"{long}\"\n")).expect("96 characters");
    assert_eq!(c.inventory.simulated[0].model, long);
    let line = err(&format!("{sim}model = \"{}\"\n", "é".repeat(97)));
    assert!(
        line.contains("key `inventory.simulated[0].model`")
            && line.contains("1 to 96 printable characters"),
        "{line}"
    );
}

/// A NUL in a path would fail in the first system call that takes it, far from the key:
/// refused here, naming the key (`\u0000` in TOML is a NUL character).
#[test]
fn paths_with_nul_are_refused_naming_the_key() {
    for (text, key) in [
        ("state_dir = \"/run/gp\\u0000x\"\n", "state_dir"),
        (
            "[cdi]\nspec_dir = \"/var/run/cdi\\u0000\"\n",
            "cdi.spec_dir",
        ),
        (
            "[runtime]\npath = \"/usr/bin/ru\\u0000nc\"\n",
            "runtime.path",
        ),
        ("[runtime]\npath = \"ru\\u0000nc\"\n", "runtime.path"),
    ] {
        let line = err(text);
        assert!(
            line.contains(&format!("key `{key}`: value ")) && line.contains("NUL"),
            "{line}"
        );
    }
    assert_eq!(runtime_path_of("[runtime]\npath = \"ru\\u0000nc\"\n"), None);
}

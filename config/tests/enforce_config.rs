//! The `[enforce]` table: its defaults (docs/configuration.md), every key parsed, each bad value refused
//! with one line naming the key, the value and what is accepted.

use std::path::Path;
use std::time::Duration;

use gpuslice_config::{parse_config, ComputeAction, MemoryAction};

fn err(text: &str) -> String {
    let e = parse_config(text, Path::new("/etc/gpuslice/config.toml")).expect_err(text);
    let line = e.to_string();
    assert!(!line.contains('\n'), "one line: {line}");
    assert!(line.contains("/etc/gpuslice/config.toml"), "{line}");
    line
}

#[test]
fn defaults_are_kill_report_two_seconds_half_a_second() {
    let c = parse_config("", Path::new("/c.toml")).unwrap();
    assert_eq!(c.enforce.memory, MemoryAction::Kill);
    assert_eq!(c.enforce.compute, ComputeAction::Report);
    assert_eq!(c.enforce.grace, Duration::from_secs(2));
    assert_eq!(c.enforce.interval, Duration::from_millis(500));
    assert_eq!(c.enforce.window, Duration::from_secs(5));
}

#[test]
fn every_key_is_read() {
    let c = parse_config(
        "[enforce]\nmemory = \"report\"\ncompute = \"throttle\"\ngrace = \"0s\"\ninterval = \"100ms\"\nwindow = \"10s\"\n",
        Path::new("/c.toml"),
    )
    .unwrap();
    assert_eq!(c.enforce.memory, MemoryAction::Report);
    assert_eq!(c.enforce.compute, ComputeAction::Throttle);
    assert_eq!(c.enforce.grace, Duration::ZERO);
    assert_eq!(c.enforce.interval, Duration::from_millis(100));
    assert_eq!(c.enforce.window, Duration::from_secs(10));
}

#[test]
fn bad_values_name_the_key_the_value_and_the_accepted_form() {
    let e = err("[enforce]\nmemory = \"freeze\"\n");
    assert!(
        e.contains("enforce.memory")
            && e.contains("\"freeze\"")
            && e.contains("`kill` or `report`"),
        "{e}"
    );
    let e = err("[enforce]\ncompute = \"kill\"\n");
    assert!(
        e.contains("enforce.compute") && e.contains("`report` or `throttle`"),
        "{e}"
    );
    let e = err("[enforce]\ngrace = \"soon\"\n");
    assert!(
        e.contains("enforce.grace") && e.contains("0s to 10m"),
        "{e}"
    );
    let e = err("[enforce]\ninterval = \"1ms\"\n");
    assert!(
        e.contains("enforce.interval") && e.contains("50ms to 60s"),
        "{e}"
    );
    let e = err("[enforce]\ninterval = 500\n");
    assert!(
        e.contains("enforce.interval") && e.contains("integer"),
        "{e}"
    );
    let e = err("[enforce]\ninterval = \"10s\"\nwindow = \"2s\"\n");
    assert!(
        e.contains("enforce.window") && e.contains("at least as long as enforce.interval"),
        "{e}"
    );
    let e = err("[enforce]\nkill = true\n");
    assert!(
        e.contains("unknown key `enforce.kill`")
            && e.contains("memory, compute, grace, interval, window"),
        "{e}"
    );
    let e = err("enforce = \"kill\"\n");
    assert!(e.contains("`enforce`") && e.contains("a table"), "{e}");
}

//! The runtime wrapper must hand the container the signal state it was started with: it
//! blocks the signals it forwards for itself, and a child inherits a blocked mask (Rust's
//! `Command` does not reset it), which runc passes on through `runc init` to the container's
//! process. Each test here compares a container's `SigBlk`/`SigIgn` (its own
//! `/proc/self/status`) through `gpuslice-runtime` with plain runc's for the same bundle.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpuslice_e2e::runc::{run_detached, Bundle, Containers, RUNC_ROOT};
use gpuslice_e2e::view::SLICE_ANNOTATIONS;
use gpuslice_e2e::{bin, lock, TestNode};

/// The container's process: prints its own signal lines and exits.
const SIG_ARGS: [&str; 3] = ["grep", "^Sig", "/proc/self/status"];

/// How the engine starts the runtime: `env` flags (GNU coreutils) giving the runtime a
/// start state. Empty: what this harness gives a child (nothing blocked, nothing ignored);
/// the other one has a signal blocked and one ignored, as an engine might leave them.
const START_STATES: [&[&str]; 2] = [&[], &["--block-signal=USR2", "--ignore-signal=HUP"]];

/// `SigBlk` and `SigIgn` of a `/proc/<pid>/status` text, as printed.
fn blk_ign(text: &str) -> (String, String) {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|| panic!("no {name} line in {text:?}"))
    };
    (field("SigBlk:"), field("SigIgn:"))
}

/// `program` under `env` with the start state `start`, runc's root the tests' own.
fn started(program: &Path, start: &[&str], node: &TestNode) -> Command {
    let mut c = Command::new("env");
    c.args(start)
        .arg(format!("GPUSLICE_CONFIG={}", node.config_str()))
        .arg(program)
        .args(["--root", RUNC_ROOT])
        .stdin(Stdio::null());
    c
}

fn runc() -> &'static Path {
    Path::new("runc")
}

/// A bundle whose process prints its signal lines, with `annotations`.
fn bundle(annotations: &[(&str, &str)]) -> Bundle {
    let b = Bundle::new("true", annotations);
    let mut c = b.config();
    c["process"]["args"] = serde_json::json!(SIG_ARGS);
    b.set_config(&c);
    b
}

/// `<program> run -b <bundle> <id>` in the foreground: the container's signal lines.
fn via_run(program: &Path, start: &[&str], node: &TestNode, b: &Bundle, id: &str) -> String {
    let out = started(program, start, node)
        .args(["run", "-b"])
        .arg(b.path())
        .arg(id)
        .output()
        .expect("run");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{} run {id}: {text}{}",
        program.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// `<program> create` then `<program> start`: the container's signal lines, from the file
/// its stdout went to (`create` leaves the container's stdio open in `runc init`).
fn via_create_start(
    program: &Path,
    start: &[&str],
    node: &TestNode,
    b: &Bundle,
    id: &str,
) -> String {
    let log = b.path().join("create-start.log");
    let f = std::fs::File::create(&log).expect("log file");
    let status = started(program, start, node)
        .args(["create", "-b"])
        .arg(b.path())
        .arg(id)
        .stdout(f.try_clone().expect("dup"))
        .stderr(f)
        .status()
        .expect("create");
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        status.success(),
        "{} create {id}: {}",
        program.display(),
        read()
    );
    let out = started(program, start, node)
        .args(["start", id])
        .output()
        .expect("start");
    assert!(
        out.status.success(),
        "{} start {id}: {}",
        program.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let begin = Instant::now();
    while !read().contains("SigCgt") {
        assert!(
            begin.elapsed() < Duration::from_secs(30),
            "{id} never printed its signal lines: {}",
            read()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    read()
}

/// Through `gpuslice-runtime run` and `create` + `start`, with and without a slice, for
/// each start state: the container's blocked and ignored signals are plain runc's.
#[test]
fn containers_get_the_signal_state_plain_runc_gives_them() {
    let _s = lock(&[]);
    let node = TestNode::with_models(&[("NVIDIA H200", "10Gi")]);
    let wrapper = bin("gpuslice-runtime");
    let slice: Vec<(&str, &str)> = SLICE_ANNOTATIONS.to_vec();
    let cases: [(&str, &[(&str, &str)]); 2] = [("plain", &[]), ("slice", &slice)];
    let mut failures = Vec::new();
    for (s, start) in START_STATES.iter().enumerate() {
        for (kind, ann) in cases {
            let ids: Vec<String> = ["runc", "run", "cs"]
                .iter()
                .map(|p| format!("e2e-sig-{kind}-{s}-{p}"))
                .collect();
            let _c = Containers::new(&node, &ids.iter().map(String::as_str).collect::<Vec<_>>());
            // A fresh bundle for each: the wrapper edits a slice request into the spec.
            let want = blk_ign(&via_run(runc(), start, &node, &bundle(ann), &ids[0]));
            let run = blk_ign(&via_run(&wrapper, start, &node, &bundle(ann), &ids[1]));
            let cs = blk_ign(&via_create_start(
                &wrapper,
                start,
                &node,
                &bundle(ann),
                &ids[2],
            ));
            for (path, got) in [("run", run), ("create+start", cs)] {
                if got != want {
                    failures.push(format!(
                        "{kind} bundle, start {start:?}, gpuslice-runtime {path}: \
                         (SigBlk, SigIgn) = {got:?}, plain runc {want:?}"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(node.reservations().is_empty(), "{:?}", node.reservations());
}

/// `exec` passes straight through the wrapper: a process it adds to a running container
/// has the blocked and ignored signals of one that plain `runc exec` adds.
#[test]
fn exec_through_the_wrapper_keeps_the_signal_state() {
    let _s = lock(&[]);
    let node = TestNode::with_models(&[("NVIDIA H200", "10Gi")]);
    let wrapper = bin("gpuslice-runtime");
    let id = "e2e-sig-exec";
    let _c = Containers::new(&node, &[id]);
    let b = Bundle::new("echo READY; sleep 600", &SLICE_ANNOTATIONS);
    let c = run_detached(&node, &b, id).expect("container starts");
    c.wait_for("READY");
    let exec = |program: &Path, start: &[&str]| {
        let out = started(program, start, &node)
            .args(["exec", id])
            .args(SIG_ARGS)
            .output()
            .expect("exec");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{} exec: {text}{}",
            program.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        blk_ign(&text)
    };
    for start in START_STATES {
        assert_eq!(
            exec(&wrapper, start),
            exec(runc(), start),
            "start {start:?}: gpuslice-runtime exec against plain runc exec"
        );
    }
    c.remove(&node);
}

/// A runtime that only prints its own `SigBlk` and `SigIgn` and exits (C, not Go: runc's
/// Go runtime takes over SIGPIPE and SIGCHLD, so only a plain program shows whether the
/// wrapper hands on the dispositions it was started with).
fn signal_printing_runtime(dir: &Path) -> std::path::PathBuf {
    let src = dir.join("sigrt.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\n#include <string.h>\n\
         int main(void) { FILE *f = fopen(\"/proc/self/status\", \"r\"); char l[256];\n\
         if (!f) return 2;\n\
         while (fgets(l, sizeof l, f))\n\
           if (!strncmp(l, \"SigBlk:\", 7) || !strncmp(l, \"SigIgn:\", 7)) fputs(l, stdout);\n\
         return 0; }\n",
    )
    .unwrap();
    let exe = dir.join("sigrt");
    let cc = Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .status()
        .unwrap();
    assert!(cc.success(), "cc {}", src.display());
    exe
}

/// With a signal ignored that Rust's runtime changes (SIGPIPE), one the wrapper changes
/// (SIGCHLD) and signals blocked, the runtime the wrapper starts for `create` (as its child)
/// and for `state` (through exec) has the mask and ignored signals it would have had
/// without the wrapper.
#[test]
fn the_runtime_gets_the_mask_and_dispositions_the_wrapper_started_with() {
    let _s = lock(&[]);
    let node = TestNode::with_models(&[("NVIDIA H200", "10Gi")]);
    let fake = signal_printing_runtime(node.dir.path());
    let mut config = std::fs::read_to_string(&node.config).unwrap();
    config.push_str(&format!("[runtime]\npath = \"{}\"\n", fake.display()));
    std::fs::write(&node.config, config).unwrap();
    let bundle = tempfile::tempdir().unwrap();
    std::fs::write(
        bundle.path().join("config.json"),
        r#"{"ociVersion": "1.0.2", "process": {"args": ["true"]}}"#,
    )
    .unwrap();
    let wrapper = bin("gpuslice-runtime");
    let starts: [&[&str]; 2] = [
        &[],
        &["--ignore-signal=PIPE,CHLD", "--block-signal=USR2,HUP"],
    ];
    let mut failures = Vec::new();
    for start in starts {
        let printed = |c: &mut Command, what: &str| {
            let out = c.stdin(Stdio::null()).output().expect(what);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(
                out.status.success(),
                "{what}: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            blk_ign(&text)
        };
        let want = printed(Command::new("env").args(start).arg(&fake), "runtime");
        let mut create = Command::new("env");
        create
            .args(start)
            .arg(format!("GPUSLICE_CONFIG={}", node.config_str()))
            .arg(&wrapper)
            .args(["create", "-b"])
            .arg(bundle.path())
            .arg("e2e-sig-fake");
        let mut state = Command::new("env");
        state
            .args(start)
            .arg(format!("GPUSLICE_CONFIG={}", node.config_str()))
            .arg(&wrapper)
            .args(["state", "e2e-sig-fake"]);
        for (path, command) in [("create", &mut create), ("state", &mut state)] {
            let got = printed(command, path);
            if got != want {
                failures.push(format!(
                    "start {start:?}, gpuslice-runtime {path}: (SigBlk, SigIgn) = {got:?}, \
                     the runtime alone {want:?}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

//! The one reader of a hook's command line: the hook lines gpuslice itself writes into specs
//! and hooks.d files, read without clap. A hook is a process of a millisecond that runs cold,
//! and building clap's command tree was a quarter of the code it touched (docs/benchmarks.md,
//! "Create path").
//!
//! Only these exact forms are read here:
//!
//! ```text
//! gpuslice [--config PATH] hook precreate [--config PATH]
//! gpuslice [--config PATH] hook create-runtime|prestart|poststop
//!          [--config PATH] [--reservation ID] [--whole-gpu UUID]… | [--claim ID]
//! gpuslice [--config PATH] hook fail [--config PATH] MESSAGE
//! ```
//!
//! (flags after the subcommand in any order, each value a separate non-empty argument that
//! does not start with `-`). Anything else — `--help`, `--config=PATH`, a repeated flag, an
//! unknown one, a non-UTF-8 argument — returns `None`: it is not a hook line gpuslice wrote,
//! and the caller hands the whole line to clap's [`crate::cli::Cli`] (the full build's, for
//! the static one), which gives its help or its error. This reader accepts nothing clap
//! refuses and yields what clap yields (tests compare the two).

use std::ffi::OsString;
use std::path::PathBuf;

use crate::cli::{Cli, Command, HookArgs, HookCommand};

/// The command line (arguments after the program name), when it is one of the forms above.
pub fn parse(args: &[OsString]) -> Option<Cli> {
    let mut it = args.iter().map(|a| a.to_str());
    let mut config: Option<PathBuf> = None;
    let mut word = it.next()??;
    if word == "--config" {
        config = Some(PathBuf::from(value(it.next()?)?));
        word = it.next()??;
    }
    if word != "hook" {
        return None;
    }
    let sub = it.next()??;
    let takes_args = match sub {
        "precreate" | "fail" => false,
        "create-runtime" | "prestart" | "poststop" => true,
        _ => return None,
    };
    let mut hook_args = HookArgs {
        reservation: None,
        whole_gpu: Vec::new(),
        claim: None,
    };
    let mut message: Option<String> = None;
    while let Some(arg) = it.next() {
        let arg = arg?;
        if sub == "fail" && arg != "--config" {
            if message.is_some() {
                return None;
            }
            message = Some(value(Some(arg))?.to_string());
            continue;
        }
        let v = value(it.next()?)?;
        match arg {
            "--config" if config.is_none() => config = Some(PathBuf::from(v)),
            "--reservation" if takes_args && hook_args.reservation.is_none() => {
                hook_args.reservation = Some(v.to_string());
            }
            "--whole-gpu" if takes_args => hook_args.whole_gpu.push(v.to_string()),
            "--claim" if takes_args && hook_args.claim.is_none() => {
                hook_args.claim = Some(v.to_string());
            }
            _ => return None,
        }
    }
    // `--claim` stands alone, as clap has it.
    if hook_args.claim.is_some()
        && (hook_args.reservation.is_some() || !hook_args.whole_gpu.is_empty())
    {
        return None;
    }
    let command = match sub {
        "precreate" => HookCommand::Precreate,
        "poststop" => HookCommand::Poststop(hook_args),
        "fail" => HookCommand::Fail { message: message? },
        _ => HookCommand::CreateRuntime(hook_args),
    };
    Some(Cli {
        config,
        command: Command::Hook(command),
    })
}

/// A flag's value as clap takes it without further settings: present, UTF-8, not empty and
/// not looking like a flag.
fn value(arg: Option<&str>) -> Option<&str> {
    arg.filter(|v| !v.is_empty() && !v.starts_with('-'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn os(line: &[&str]) -> Vec<OsString> {
        line.iter().map(OsString::from).collect()
    }

    /// What clap makes of the line (with the program name), as the hook parser's result.
    fn clap(line: &[&str]) -> Result<String, String> {
        let mut full = vec!["gpuslice"];
        full.extend_from_slice(line);
        Cli::try_parse_from(&full)
            .map(|c| format!("{c:?}"))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn every_line_gpuslice_writes_reads_as_clap_reads_it() {
        let flags: &[&[&str]] = &[
            &[],
            &["--reservation", "5f3c9a0e12ab34cd"],
            &["--claim", "5f3c9a0e12ab34cd"],
            &["--whole-gpu", "GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"],
            &["--whole-gpu", "GPU-a", "--whole-gpu", "GPU-b"],
            &["--reservation", "r1", "--whole-gpu", "GPU-a"],
            &[
                "--whole-gpu",
                "GPU-a",
                "--reservation",
                "r1",
                "--whole-gpu",
                "GPU-b",
            ],
            &["--config", "/etc/gpuslice/other.toml"],
            &["--reservation", "r1", "--config", "/c.toml"],
        ];
        let mut checked = 0;
        for before in [&[][..], &["--config", "/tmp/x y/config.toml"][..]] {
            for sub in ["create-runtime", "prestart", "poststop", "precreate"] {
                for tail in flags {
                    let mut line: Vec<&str> = before.to_vec();
                    line.extend(["hook", sub]);
                    line.extend_from_slice(tail);
                    let fast = parse(&os(&line)).map(|c| format!("{c:?}"));
                    match (fast, clap(&line)) {
                        (Some(a), Ok(b)) => {
                            assert_eq!(a, b, "{line:?}");
                            checked += 1;
                        }
                        // Declined: clap decides (precreate takes no hook flags; --config
                        // given twice).
                        (None, _) => {
                            let twice = before.len() == 2 && tail.contains(&"--config");
                            let precreate_flags = sub == "precreate"
                                && tail.iter().any(|f| {
                                    matches!(*f, "--reservation" | "--whole-gpu" | "--claim")
                                });
                            assert!(twice || precreate_flags, "declined {line:?}");
                        }
                        (Some(a), Err(e)) => panic!("{line:?}: read as {a}, clap refuses: {e}"),
                    }
                }
            }
        }
        assert!(checked >= 40, "{checked}");
        // The refusal hook precreate writes into a spec (`hooks::failing_spec`).
        for line in [
            &["hook", "fail", "no room"][..],
            &["--config", "/c.toml", "hook", "fail", "no room"],
            &["hook", "fail", "--config", "/c.toml", "annotation x: bad"],
            &["hook", "fail", "no room", "--config", "/c.toml"],
        ] {
            let fast = parse(&os(line)).map(|c| format!("{c:?}"));
            assert_eq!(fast, clap(line).ok(), "{line:?}");
            assert!(fast.is_some(), "{line:?}");
        }
    }

    /// Lines that look like hook lines but that clap refuses too, with its own message.
    const CLAP_REFUSES: &[&[&str]] = &[
        &[
            "hook",
            "poststop",
            "--reservation",
            "r1",
            "--reservation",
            "r2",
        ],
        &["hook", "poststop", "--bogus", "x"],
        &["hook", "precreate", "--reservation", "r1"],
        &[
            "hook",
            "create-runtime",
            "--claim",
            "r1",
            "--reservation",
            "r2",
        ],
        &[
            "hook",
            "create-runtime",
            "--whole-gpu",
            "GPU-a",
            "--claim",
            "r1",
        ],
    ];

    #[test]
    fn anything_else_is_left_to_clap() {
        let lines: &[&[&str]] = &[
            &[],
            &["hook"],
            &["status"],
            &["--help"],
            &["hook", "--help"],
            &["hook", "poststop", "--help"],
            &["hook", "create-runtime", "-h"],
            &["--config=/c.toml", "hook", "poststop"],
            &["hook", "poststop", "--reservation=r1"],
            &["hook", "poststop", "--reservation"],
            &["hook", "poststop", "--reservation", ""],
            &["hook", "poststop", "--reservation", "-r1"],
            &["hook", "poststop", "extra"],
            &["hook", "fail"],
            &["hook", "fail", "a", "b"],
            &["hook", "fail", "-x"],
            &["hook", "bogus"],
            &[
                "--config", "/c.toml", "--config", "/d.toml", "hook", "poststop",
            ],
            &["--config", "hook", "poststop"],
            &["-V"],
        ];
        for line in lines.iter().chain(CLAP_REFUSES) {
            assert!(parse(&os(line)).is_none(), "{line:?}");
        }
        for line in CLAP_REFUSES {
            assert!(clap(line).is_err(), "{line:?}");
        }
        // A non-UTF-8 argument.
        use std::os::unix::ffi::OsStringExt;
        let mut line = os(&["hook", "poststop", "--reservation"]);
        line.push(OsString::from_vec(vec![0xff, 0x41]));
        assert!(parse(&line).is_none());
    }
}

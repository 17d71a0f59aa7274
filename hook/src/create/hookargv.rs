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
//! and the caller hands the whole line to the `gpuslice` binary's clap command tree (the full
//! build's, for the static one), which gives its help or its error. This reader accepts nothing clap
//! refuses and yields what clap yields (tests compare the two).

use std::ffi::OsString;
use std::path::PathBuf;

use crate::args::{HookArgs, HookCommand, HookLine};

/// The command line (arguments after the program name), when it is one of the forms above.
pub fn parse(args: &[OsString]) -> Option<HookLine> {
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
    Some(HookLine { config, command })
}

/// A flag's value as clap takes it without further settings: present, UTF-8, not empty and
/// not looking like a flag.
fn value(arg: Option<&str>) -> Option<&str> {
    arg.filter(|v| !v.is_empty() && !v.starts_with('-'))
}

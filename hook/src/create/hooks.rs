//! The OCI hooks gpuslice writes into specs and hooks.d: `precreate` (the spec edit for
//! podman and CRI-O), `createRuntime` (bind the reservation to the container's init
//! process, or book CDI whole GPUs) and `poststop` (release). Idempotent, quiet on success.

use std::io::{Read, Write};

use gpuslice_registry::{Owner, ProcessRef, RegistryError, Request, Selector};
use serde::Deserialize;

use crate::args::HookCommand;
use crate::create::annotations::kubernetes_ref;
use crate::create::specedit::{edit_spec, Outcome};
use crate::create::specfile::MAX_SPEC_BYTES;
use crate::node::NodeContext;

/// Runs one hook.
pub fn run(node: &NodeContext, command: HookCommand) -> Result<(), HookError> {
    match command {
        HookCommand::Precreate => precreate(node),
        HookCommand::CreateRuntime(a) => match a.claim.as_deref() {
            Some(claim) => join_claim(node, claim),
            None => create_runtime(node, a.reservation.as_deref(), &a.whole_gpu),
        },
        HookCommand::Poststop(a) if a.claim.is_some() => Err(HookError::Refused(
            "--claim is a createRuntime flag: a claim's containers are recorded when they start and forgotten once gone".into(),
        )),
        HookCommand::Poststop(a) => poststop(node, a.reservation.as_deref()),
        HookCommand::Fail { message } => fail(&message),
    }
}

/// The OCI state runtimes pass to hooks on stdin.
#[derive(Debug, Deserialize)]
pub struct State {
    pub id: String,
    #[serde(default)]
    pub pid: Option<u32>,
    #[serde(default)]
    pub annotations: std::collections::BTreeMap<String, String>,
}

/// Hook input or output that is not usable.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("cannot read the OCI state from stdin: {0}")]
    Read(std::io::Error),
    #[error("the input on stdin is larger than {} MiB, the limit gpuslice's hooks read; accepted: an OCI spec (precreate) or OCI state (createRuntime, poststop) of at most {} MiB", MAX_SPEC_BYTES >> 20, MAX_SPEC_BYTES >> 20)]
    TooLarge,
    #[error("the OCI state on stdin is not valid: {0}")]
    State(serde_json::Error),
    #[error("the OCI state of container {id} has no pid; createRuntime hooks need the container's init pid")]
    NoPid { id: String },
    #[error("cannot write the edited spec to stdout: {0}")]
    Write(std::io::Error),
    #[error("{0}")]
    Unhealthy(Box<crate::create::health::HealthRefusal>),
    #[error("{0}")]
    Edit(#[from] crate::create::specedit::EditError),
    #[error(transparent)]
    Registry(Box<RegistryError>),
    #[error("GPU {uuid} cannot be given whole to container {id}: {source}")]
    Whole {
        uuid: String,
        id: String,
        source: Box<RegistryError>,
    },
    #[error("{0}")]
    Refused(String),
    #[error("`{value}` is not a GPU UUID for --whole-gpu; accepted: GPU-<uuid>")]
    WholeSelector { value: String },
    #[error("container {id} names reservation {reservation} in its createRuntime hook, but its spec {found}: only the spec gpuslice edited for a reservation (annotation {RESERVATION_ANNOTATION}={reservation}) may bind it")]
    ForeignReservation {
        id: String,
        reservation: String,
        found: String,
    },
}

impl From<RegistryError> for HookError {
    fn from(e: RegistryError) -> Self {
        HookError::Registry(Box::new(e))
    }
}

/// The annotation the spec edit writes: the reservation a spec was edited for.
const RESERVATION_ANNOTATION: &str = "gpuslice.io/reservation";

/// Refuses to bind `reservation` for a container whose spec was not edited for it: the hook
/// line alone (copied from another spec, or injected with the slice's CDI device) does not
/// carry the annotation, and a spec that arrives with the annotation is refused by the edit.
fn check_edited_for(state: &State, reservation: &str) -> Result<(), HookError> {
    let found = match state.annotations.get(RESERVATION_ANNOTATION) {
        Some(v) if v == reservation => return Ok(()),
        Some(v) => format!("was edited for reservation {v}"),
        None => format!("has no annotation {RESERVATION_ANNOTATION}"),
    };
    Err(HookError::ForeignReservation {
        id: state.id.clone(),
        reservation: reservation.to_string(),
        found,
    })
}

/// Reads the spec (precreate) or OCI state (the other hooks) on stdin, at most
/// [`MAX_SPEC_BYTES`]: the same bound as the wrapper's read of `config.json`.
fn read_stdin() -> Result<Vec<u8>, HookError> {
    let mut buf = Vec::new();
    std::io::stdin()
        .lock()
        .take(MAX_SPEC_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(HookError::Read)?;
    if buf.len() as u64 > MAX_SPEC_BYTES {
        return Err(HookError::TooLarge);
    }
    Ok(buf)
}

/// The container's init pid from the OCI state: what a createRuntime hook records.
fn init_pid(state: &State) -> Result<u32, HookError> {
    state
        .pid
        .filter(|p| *p > 0)
        .ok_or_else(|| HookError::NoPid {
            id: state.id.clone(),
        })
}

fn read_state() -> Result<State, HookError> {
    serde_json::from_slice(&read_stdin()?).map_err(HookError::State)
}

/// `hook precreate`: spec on stdin, edited (or unchanged) spec on stdout.
///
/// podman and CRI-O discard a precreate hook's stderr and report only its exit status, so
/// a refusal (a malformed annotation, a request that does not fit) would reach the user as
/// "exit status 1". Instead the hook returns the spec with a first `createRuntime` hook,
/// `gpuslice hook fail <message>`: the runtime then refuses the container and its error,
/// which engines do show, carries gpuslice's one line. Nothing is reserved either way.
///
/// An edited spec that cannot be written back (the engine stopped reading: EPIPE) reaches no
/// container, so its reservation is given back before the hook fails, not left pending until
/// `registry.pending_timeout`.
pub fn precreate(node: &NodeContext) -> Result<(), HookError> {
    let input = read_stdin()?;
    let (output, reserved) = match edit_spec(node, &input) {
        Ok(Outcome::Edited { bytes, .. }) => (bytes, true),
        Ok(Outcome::Untouched | Outcome::AlreadyEdited { .. }) => (input, false),
        Err(e) => {
            let message = e.to_string();
            eprintln!("gpuslice: {message}");
            match failing_spec(node, &input, &message) {
                Some(bytes) => (bytes, false),
                None => return Err(HookError::Edit(e)),
            }
        }
    };
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(&output).and_then(|_| out.flush()) {
        if reserved {
            if let Err(back) = node.give_back_pending() {
                eprintln!("gpuslice: cannot release the slice reserved for this create: {back}");
            }
        }
        return Err(HookError::Write(e));
    }
    Ok(())
}

/// The spec `input` with a first createRuntime hook that prints `message` and fails; `None`
/// when the input is not a JSON object or the hook binary is unknown.
fn failing_spec(node: &NodeContext, input: &[u8], message: &str) -> Option<Vec<u8>> {
    let mut spec: serde_json::Value = serde_json::from_slice(input).ok()?;
    let binary = node.hook_binary().ok()?;
    let hook = serde_json::json!({
        "path": binary.display().to_string(),
        "args": node.hook_args(&["hook", "fail", message]),
        "env": crate::node::HOOK_ENV,
    });
    let hooks = spec
        .as_object_mut()?
        .entry("hooks")
        .or_insert_with(|| serde_json::json!({}));
    let list = hooks
        .as_object_mut()?
        .entry("createRuntime")
        .or_insert_with(|| serde_json::json!([]));
    list.as_array_mut()?.insert(0, hook);
    serde_json::to_vec(&spec).ok()
}

/// `hook fail MESSAGE`: prints the message and fails (see [`precreate`]).
pub fn fail(message: &str) -> Result<(), HookError> {
    Err(HookError::Refused(message.to_string()))
}

/// `hook create-runtime --claim ID`: records the container (its init pid from the runtime's
/// state, its start time and cgroup from `/proc`) as one of the containers of the DRA claim
/// holding reservation `ID`.
pub fn join_claim(node: &NodeContext, reservation: &str) -> Result<(), HookError> {
    let state = read_state()?;
    let pid = init_pid(&state)?;
    node.open_registry()?.join_claim(reservation, pid)?;
    Ok(())
}

/// `hook create-runtime`: binds `reservation` to the container; books `whole` GPUs.
///
/// Whole-GPU bookings are the container's init process's (pid, start time, boot id: unique
/// on the node), not its id's: container ids are unique per runtime root or namespace only.
pub fn create_runtime(
    node: &NodeContext,
    reservation: Option<&str>,
    whole: &[String],
) -> Result<(), HookError> {
    let state = read_state()?;
    let pid = init_pid(&state)?;
    let registry = node.open_registry()?;
    if let Some(id) = reservation {
        check_edited_for(&state, id)?;
        registry.bind(id, &state.id, pid)?;
    }
    if whole.is_empty() {
        return Ok(());
    }
    let snapshot = registry.snapshot()?;
    let process: ProcessRef = registry.process_ref(pid)?;
    for uuid in whole {
        let selector = Selector::parse(uuid)
            .ok()
            .filter(|s| matches!(s, Selector::Uuid(_)));
        let Some(selector) = selector else {
            return Err(HookError::WholeSelector {
                value: uuid.clone(),
            });
        };
        // The same GPU named twice (`=0` and `=GPU-…`, or `=all`) is booked once.
        let held = snapshot.reservations.iter().any(|r| {
            r.whole_gpu
                && r.owner.process().is_some_and(|p| p.same_process(&process))
                && r.gpus.iter().any(|b| b.uuid.eq_ignore_ascii_case(uuid))
        });
        if held {
            continue;
        }
        let mut req = Request::new(Owner::Container {
            container_id: Some(state.id.clone()),
            process: Some(process.clone()),
            kubernetes: kubernetes_ref(&state.annotations),
        });
        req.whole_gpu = true;
        if let Err(e) = crate::create::health::refuse_whole(node, &snapshot.inventory, &selector) {
            let _ = registry.release_container_process(&state.id, &process);
            return Err(HookError::Unhealthy(Box::new(e)));
        }
        req.selectors = vec![selector];
        if let Err(source) = registry.reserve(&req) {
            // Give back what this container got so far (not what a container of the same id
            // under another runtime root holds); the runtime fails the create.
            let _ = registry.release_container_process(&state.id, &process);
            return Err(HookError::Whole {
                uuid: uuid.clone(),
                id: state.id.clone(),
                source: Box::new(source),
            });
        }
    }
    Ok(())
}

/// `hook poststop`: releases `reservation` (a slice's hook), or what the stopped container
/// booked (the whole-GPU devices' hook, which names no reservation): the bookings of its id
/// whose owner process is gone, never those of a running container of the same id under
/// another runtime root or namespace. A slice's hook releases only when the stopped
/// container's spec was edited for that reservation (its annotation names it) and the
/// registry finds the container holding it (`Registry::release_for_container`): the
/// annotation is written by whoever hands runc the spec (a CDI-aware engine applies no
/// spec edit that would refuse it), so it alone never releases another container's slice.
pub fn poststop(node: &NodeContext, reservation: Option<&str>) -> Result<(), HookError> {
    let state = read_state()?;
    if let Some(id) = reservation {
        // A spec that only copied the hook line cannot release someone else's slice.
        check_edited_for(&state, id)?;
    }
    let registry = node.open_registry()?;
    match reservation {
        Some(id) => registry.release_for_container(id, &state.id, state.pid.filter(|p| *p > 0))?,
        None => registry.release_stopped_container(&state.id)?,
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(annotations: &[(&str, &str)]) -> State {
        State {
            id: "ctr".into(),
            pid: Some(7),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    /// The hook line alone does not let a container bind or release a slice.
    #[test]
    fn only_a_spec_edited_for_the_reservation_may_use_it() {
        let rid = "0123456789abcdef";
        assert!(check_edited_for(&state(&[(RESERVATION_ANNOTATION, rid)]), rid).is_ok());
        let none = check_edited_for(&state(&[("gpuslice.io/memory", "4Gi")]), rid)
            .expect_err("no annotation")
            .to_string();
        assert!(
            none.contains(rid) && none.contains("has no annotation gpuslice.io/reservation"),
            "{none}"
        );
        let other = check_edited_for(&state(&[(RESERVATION_ANNOTATION, "1111111111111111")]), rid)
            .expect_err("edited for another")
            .to_string();
        assert!(
            other.contains("edited for reservation 1111111111111111"),
            "{other}"
        );
    }
}

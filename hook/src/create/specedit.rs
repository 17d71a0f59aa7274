//! The spec edit: the one function every front end (gpuslice-runtime, the hooks.d precreate
//! hook) calls. It reads a container's annotations, reserves a slice, writes the slice's
//! directory and CDI spec, and applies that spec to the OCI spec exactly as a CDI-aware
//! engine would. Specs without a request pass through byte for byte, whatever else they
//! hold; an edited spec keeps what the edit does not touch as written (`specjson`); any
//! failure after reserving releases the reservation.

use std::collections::BTreeMap;

use gpuslice_cdi::InjectError;
use gpuslice_registry::{Registry, RegistryError, Reservation, ReservationState};
use serde_json::Value;

use crate::create::annotations::{parse_ask, AnnotationError, Ask, PREFIX, RESERVATION};
use crate::create::slicewriter::{SliceWriteError, Writer};
use crate::create::specfile::SpecFileError as SpecReadError;
use crate::create::specjson::{SpecJsonError, SpecText};
use crate::node::NodeContext;
use crate::specfiles::Holder;

/// Why a container's creation is refused. Each prints as one line for the user.
#[derive(Debug, thiserror::Error)]
pub enum EditError {
    #[error("{what} is not a valid JSON object ({source}); a spec that mentions gpuslice.io/ is edited and must be one")]
    Json {
        /// "the OCI spec", or the file's path.
        what: String,
        source: SpecJsonError,
    },
    #[error("cannot encode the edited OCI spec: {0}")]
    Encode(serde_json::Error),
    #[error("{0}")]
    Read(#[from] SpecReadError),
    #[error("the OCI spec's {field} is malformed: {detail}")]
    Shape { field: String, detail: String },
    #[error("{0}")]
    Annotation(#[from] AnnotationError),
    #[error("annotation {RESERVATION}={id:?} is set by gpuslice only and does not belong to this spec; remove it")]
    Forged { id: String },
    #[error("no GPU slice: {0}")]
    Registry(Box<RegistryError>),
    #[error("{0}")]
    Slice(#[from] SliceWriteError),
    #[error("{0}")]
    Inject(#[from] InjectError),
    #[error("{0}")]
    Open(Box<RegistryError>),
    #[error("no GPU slice: {0}")]
    Health(#[from] crate::create::health::HealthRefusal),
}

impl EditError {
    /// The error with the spec named by its file `path`.
    pub fn in_file(self, path: &std::path::Path) -> EditError {
        match self {
            EditError::Json { source, .. } => EditError::Json {
                what: format!("OCI spec {}", path.display()),
                source,
            },
            other => other,
        }
    }
}

impl From<RegistryError> for EditError {
    fn from(e: RegistryError) -> Self {
        EditError::Registry(Box::new(e))
    }
}

/// What the edit did.
#[derive(Debug)]
pub enum Outcome {
    /// No request (or a sandbox container): the spec is left byte for byte.
    Untouched,
    /// The spec already carries gpuslice's edit for this reservation (wrapper and precreate
    /// hook both configured): nothing more is reserved.
    AlreadyEdited { reservation: String },
    /// A slice was reserved and the spec edited.
    Edited {
        reservation: Box<Reservation>,
        bytes: Vec<u8>,
    },
}

/// The spec's `annotations` member (`None` when absent) as a map of strings.
fn annotations(member: Option<&Value>) -> Result<BTreeMap<String, String>, EditError> {
    let mut out = BTreeMap::new();
    match member {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (k, v) in map {
                let v = v.as_str().ok_or_else(|| EditError::Shape {
                    field: format!("annotations.{k}"),
                    detail: "annotation values must be strings".into(),
                })?;
                out.insert(k.clone(), v.to_string());
            }
        }
        Some(_) => {
            return Err(EditError::Shape {
                field: "annotations".into(),
                detail: "expected an object of strings".into(),
            })
        }
    }
    Ok(out)
}

/// True when the spec carries gpuslice's createRuntime hook for reservation `id`.
fn has_our_hook(spec: &Value, id: &str) -> bool {
    spec.pointer("/hooks/createRuntime")
        .and_then(Value::as_array)
        .is_some_and(|hooks| {
            hooks.iter().any(|h| {
                h.get("args").and_then(Value::as_array).is_some_and(|args| {
                    args.windows(3)
                        .any(|w| w[0] == "create-runtime" && w[1] == "--reservation" && w[2] == id)
                })
            })
        })
}

/// Releases a reservation unless disarmed: every failure after reserving gives it back.
struct Rollback<'a> {
    registry: &'a Registry,
    id: Option<String>,
}

impl Drop for Rollback<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let _ = self.registry.release(&id);
        }
    }
}

/// A spec that arrives with gpuslice's reservation annotation `id`: edited already when it
/// also carries our createRuntime hook for a pending reservation (wrapper and precreate hook
/// both configured), forged otherwise.
fn already_edited(node: &NodeContext, spec: &Value, id: &str) -> Result<Outcome, EditError> {
    let registry = node
        .open_registry()
        .map_err(|e| EditError::Open(Box::new(e)))?;
    let ours = has_our_hook(spec, id)
        && registry
            .snapshot()?
            .reservation(id)
            .is_some_and(|r| r.state == ReservationState::Pending);
    if ours {
        Ok(Outcome::AlreadyEdited {
            reservation: id.to_string(),
        })
    } else {
        Err(EditError::Forged { id: id.to_string() })
    }
}

/// True when `input` holds the bytes `gpuslice.io/` anywhere.
fn mentions_gpuslice(input: &[u8]) -> bool {
    input.windows(PREFIX.len()).any(|w| w == PREFIX.as_bytes())
}

/// Edits the OCI spec `input` for `node`.
///
/// A spec serde_json cannot read as an object (invalid UTF-8, …) carries no request when the
/// bytes `gpuslice.io/` appear nowhere in it: it passes untouched for the runtime to judge.
/// Otherwise it is refused, since a request in it could not be honoured.
pub fn edit_spec(node: &NodeContext, input: &[u8]) -> Result<Outcome, EditError> {
    let json = |source| EditError::Json {
        what: "the OCI spec".into(),
        source,
    };
    let (lossy, invalid_utf8) = SpecText::text(input);
    let mut text = match SpecText::parse(&lossy) {
        Ok(t) => t,
        Err(_) if !mentions_gpuslice(input) => return Ok(Outcome::Untouched),
        Err(e) => return Err(json(e)),
    };
    let ann = match text.member("annotations") {
        Ok(v) => match annotations(v.as_ref()) {
            Ok(ann) => ann,
            Err(_) if !mentions_gpuslice(input) => return Ok(Outcome::Untouched),
            Err(e) => return Err(e),
        },
        Err(_) if !mentions_gpuslice(input) => return Ok(Outcome::Untouched),
        Err(e) => return Err(json(e)),
    };
    // A spec with a request is read further; the edit must not replace invalid UTF-8.
    let reservation = ann.get(RESERVATION);
    let request = match reservation {
        Some(_) => None,
        None => match parse_ask(&ann)? {
            Ask::Nothing | Ask::Sandbox => return Ok(Outcome::Untouched),
            Ask::Slice(r) => Some(r),
        },
    };
    if let Some(e) = invalid_utf8 {
        return Err(json(e));
    }
    let mut spec = text.view_all().map_err(json)?;
    let (Some(mut request), None) = (request, reservation) else {
        return already_edited(node, &spec, reservation.map_or("", String::as_str));
    };

    // Everything that can be checked before reserving is checked first.
    let writer = Writer::new(node)?;
    let registry = node
        .open_registry()
        .map_err(|e| EditError::Open(Box::new(e)))?;
    crate::create::health::restrict(node, &registry, &mut request)?;
    let reservation = registry.reserve(&request)?;
    let mut rollback = Rollback {
        registry: &registry,
        id: Some(reservation.id.clone()),
    };
    let holder = Holder::Container {
        reservation: &reservation.id,
    };
    // Its spec is written before injection: the rollback's release removes it again
    // (registry cleanup).
    let cdi = writer.write(&registry, &reservation, holder)?;
    gpuslice_cdi::inject(&mut spec, &cdi, &[holder.device_id().as_str()])?;
    // `inject` checked the spec is an object; annotations is an object or absent.
    if let Some(obj) = spec.as_object_mut() {
        let ann = obj
            .entry("annotations")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(a) = ann.as_object_mut() {
            a.insert(
                RESERVATION.to_string(),
                Value::String(reservation.id.clone()),
            );
        }
    }
    let bytes = text.encode(&spec).map_err(EditError::Encode)?;
    rollback.id = None;
    Ok(Outcome::Edited {
        reservation: Box::new(reservation),
        bytes,
    })
}

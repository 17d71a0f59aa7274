//! The user interface: `gpuslice.io/*` annotations (docs/annotations.md) turned into a registry
//! request, with the per-container override `gpuslice.io/<key>.<container-name>` for
//! Kubernetes containers, and the sandbox and owner facts the CRI annotations carry. One
//! definition for the node, which reads them when a container is created (gpuslice-hook), and
//! the admission webhook, which tells by them which pods ask the node for slices.

use std::collections::BTreeMap;

use crate::{KubernetesRef, Owner, Request, Selector, MAX_GPUS};
use gpuslice_config::quantity::ACCEPTED_QUANTITY;
use gpuslice_config::{is_model_text, parse_quantity, Policy, Quantity, MAX_MODEL_CHARS};

/// Prefix of every gpuslice annotation.
pub const PREFIX: &str = "gpuslice.io/";
/// Written by gpuslice only: the reservation a spec was edited for.
pub const RESERVATION: &str = "gpuslice.io/reservation";
/// The request keys users may set.
pub const KEYS: &[&str] = &["gpus", "memory", "cores", "gpu", "gpu-type", "policy"];

/// containerd's CRI plugin / CRI-O: the container's name inside its pod (the first is the
/// one [`parse_ask`] is given by a caller that names the container itself).
pub const CONTAINER_NAME: &[&str] = &[
    "io.kubernetes.cri.container-name",
    "io.kubernetes.container.name",
];
const SANDBOX: &[(&str, &str)] = &[
    ("io.kubernetes.cri.container-type", "sandbox"),
    ("io.kubernetes.cri-o.ContainerType", "sandbox"),
];
const NAMESPACE: &[&str] = &[
    "io.kubernetes.cri.sandbox-namespace",
    "io.kubernetes.pod.namespace",
];
const POD: &[&str] = &["io.kubernetes.cri.sandbox-name", "io.kubernetes.pod.name"];
const POD_UID: &[&str] = &["io.kubernetes.cri.sandbox-uid", "io.kubernetes.pod.uid"];

/// A malformed request: one line naming the annotation, the value and the accepted form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnnotationError {
    #[error("annotation {key}: value {value:?} is not accepted; expected {accepted}")]
    Value {
        key: String,
        value: String,
        accepted: String,
    },
    /// A value refused for a reason its parser gives (a quantity's unit, its size).
    #[error("annotation {key}: value {value:?} is not accepted ({reason}); expected {accepted}")]
    Refused {
        key: String,
        value: String,
        reason: String,
        accepted: String,
    },
    #[error("annotation {key} is not a gpuslice annotation; accepted: gpuslice.io/{{{}}}, optionally suffixed with .<container-name>", KEYS.join(","))]
    UnknownKey { key: String },
}

/// What the annotations of one container ask for.
#[derive(Debug, Clone, PartialEq)]
pub enum Ask {
    /// No gpuslice annotation applies to this container.
    Nothing,
    /// A Kubernetes sandbox (pause) container: never touched.
    Sandbox,
    /// A slice request.
    Slice(Box<Request>),
}

/// The request key `key` sets, and the container it is for (`None`: every container of the
/// pod): `gpuslice.io/<key>` or `gpuslice.io/<key>.<container-name>`, `<key>` one of
/// [`KEYS`]. `None` for any other annotation, under [`PREFIX`] or not: only these ask the
/// node for a slice (another key under it fails the container's creation, and
/// [`RESERVATION`] is gpuslice's own).
pub fn request_key(key: &str) -> Option<(&str, Option<&str>)> {
    let rest = key.strip_prefix(PREFIX)?;
    let (base, target) = match rest.split_once('.') {
        Some((b, t)) => (b, Some(t)),
        None => (rest, None),
    };
    (KEYS.contains(&base) && target != Some("")).then_some((base, target))
}

fn first<'a>(ann: &'a BTreeMap<String, String>, keys: &[&str]) -> Option<&'a str> {
    keys.iter()
        .find_map(|k| ann.get(*k))
        .map(String::as_str)
        .filter(|v| !v.is_empty())
}

/// True for a Kubernetes sandbox container.
pub fn is_sandbox(ann: &BTreeMap<String, String>) -> bool {
    SANDBOX
        .iter()
        .any(|(k, v)| ann.get(*k).map(String::as_str) == Some(*v))
}

/// The Kubernetes identity of a container, when the CRI annotations tell it.
pub fn kubernetes_ref(ann: &BTreeMap<String, String>) -> Option<KubernetesRef> {
    let pod = first(ann, POD)?;
    Some(KubernetesRef {
        namespace: first(ann, NAMESPACE).unwrap_or_default().to_string(),
        pod: pod.to_string(),
        pod_uid: first(ann, POD_UID).map(str::to_string),
        container: first(ann, CONTAINER_NAME).unwrap_or_default().to_string(),
        unknown: Default::default(),
    })
}

/// The value of request key `key` for this container: the per-container override wins.
fn value<'a>(
    ann: &'a BTreeMap<String, String>,
    key: &str,
    container: Option<&str>,
) -> Option<(String, &'a str)> {
    if let Some(name) = container {
        let k = format!("{PREFIX}{key}.{name}");
        if let Some(v) = ann.get(&k) {
            return Some((k, v.as_str()));
        }
    }
    let k = format!("{PREFIX}{key}");
    ann.get(&k).map(|v| (k, v.as_str()))
}

fn bad(key: &str, value: &str, accepted: impl Into<String>) -> AnnotationError {
    AnnotationError::Value {
        key: key.to_string(),
        value: value.to_string(),
        accepted: accepted.into(),
    }
}

/// A plain whole number from `lo` to `hi` (an annotation is a string, not a quantity: no
/// unit); a refusal says why, in the words the webhook gives for the same limits
/// (kube/webhook/src/ask.rs), and [`refused`] names the key, the value and what is accepted.
fn integer(v: &str, lo: u32, hi: u32) -> Result<u32, String> {
    let t = v.trim();
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if t.is_empty() {
        return Err("no digits".to_string());
    }
    if t.strip_prefix('-').is_some_and(digits) {
        return Err("negative".to_string());
    }
    if !digits(t) {
        return Err("not a whole number".to_string());
    }
    if t.len() > 6 {
        return Err("more than 6 digits".to_string());
    }
    match t.parse::<u32>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(n),
        Ok(n) => Err(format!("{n} is out of range")),
        Err(e) => Err(e.to_string()),
    }
}

fn refused(key: &str, value: &str, reason: String, accepted: impl Into<String>) -> AnnotationError {
    AnnotationError::Refused {
        key: key.to_string(),
        value: value.to_string(),
        reason,
        accepted: accepted.into(),
    }
}

/// Reads the request of a container from its annotations. Sandbox containers, containers
/// no gpuslice annotation applies to and containers opted out with
/// `gpuslice.io/gpus.<container-name>: "0"` ask for nothing; a malformed value is an error.
pub fn parse_ask(ann: &BTreeMap<String, String>) -> Result<Ask, AnnotationError> {
    if is_sandbox(ann) {
        return Ok(Ask::Sandbox);
    }
    let container = first(ann, CONTAINER_NAME);
    let mut applies = false;
    for key in ann.keys().filter(|k| k.starts_with(PREFIX)) {
        if key == RESERVATION {
            continue;
        }
        let Some((_, target)) = request_key(key) else {
            return Err(AnnotationError::UnknownKey { key: key.clone() });
        };
        // An override for another container of the pod does not concern this one.
        if target.is_none() || target == container {
            applies = true;
        }
    }
    if !applies {
        return Ok(Ask::Nothing);
    }

    // `gpuslice.io/gpus.<container-name>: "0"`: this container of the pod (a sidecar) wants
    // no GPU from the pod-level request. Pod-wide, 0 would ask for nothing: refused.
    let gpus = match value(ann, "gpus", container) {
        Some((k, v)) => {
            let per_container = k != format!("{PREFIX}gpus");
            let lo = u32::from(!per_container);
            let accepted = if per_container {
                format!("a whole number from 0 (no GPU for this container) to {MAX_GPUS}")
            } else {
                format!("a whole number from 1 to {MAX_GPUS} (no GPU for one container of a pod: gpuslice.io/gpus.<container-name>: \"0\")")
            };
            match integer(v, lo, MAX_GPUS).map_err(|r| refused(&k, v, r, accepted))? {
                0 => return Ok(Ask::Nothing),
                n => Some(n),
            }
        }
        None => None,
    };
    let owner = Owner::Container {
        container_id: None,
        process: None,
        kubernetes: kubernetes_ref(ann),
    };
    let mut req = Request::new(owner);
    if let Some(n) = gpus {
        req.gpus = n;
    }
    if let Some((k, v)) = value(ann, "memory", container) {
        let q = parse_quantity(v).map_err(|e| AnnotationError::Refused {
            key: k.clone(),
            value: v.to_string(),
            reason: e.reason(),
            accepted: ACCEPTED_QUANTITY.to_string(),
        })?;
        if q == Quantity::Bytes(0) {
            return Err(bad(
                &k,
                v,
                format!("more than 0 bytes: {ACCEPTED_QUANTITY}"),
            ));
        }
        req.memory = Some(q);
    }
    if let Some((k, v)) = value(ann, "cores", container) {
        // One optional `%`: `30` or `30%`, never `30%%%%`.
        let number = v.trim().strip_suffix('%').unwrap_or(v);
        req.cores = integer(number, 1, 100).map_err(|r| {
            refused(
                &k,
                v,
                r,
                "a compute share in percent from 1 to 100 (`30` or `30%`)",
            )
        })? as u8;
    }
    if let Some((k, v)) = value(ann, "gpu", container) {
        req.selectors = Selector::parse_list(v).map_err(|e| {
            bad(
                &k,
                v,
                format!("GPU indexes or UUIDs separated by commas ({e})"),
            )
        })?;
    }
    if let Some((k, v)) = value(ann, "gpu-type", container) {
        let t = v.trim();
        if !is_model_text(t) {
            return Err(bad(
                &k,
                v,
                format!(
                    "part of a GPU model name, 1 to {MAX_MODEL_CHARS} printable characters (e.g. H200)"
                ),
            ));
        }
        req.model = Some(t.to_string());
    }
    if let Some((k, v)) = value(ann, "policy", container) {
        req.policy = Some(Policy::parse(v.trim()).ok_or_else(|| bad(&k, v, Policy::ACCEPTED))?);
    }
    Ok(Ask::Slice(Box::new(req)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn slice(pairs: &[(&str, &str)]) -> Request {
        match parse_ask(&ann(pairs)) {
            Ok(Ask::Slice(r)) => *r,
            other => panic!("expected a slice request, got {other:?}"),
        }
    }

    #[test]
    fn request_keys_are_the_keys_the_node_reads_with_or_without_a_container() {
        for (key, want) in [
            ("gpuslice.io/memory", Some(("memory", None))),
            ("gpuslice.io/gpu-type", Some(("gpu-type", None))),
            ("gpuslice.io/gpus.sidecar", Some(("gpus", Some("sidecar")))),
            ("gpuslice.io/memory.", None),
            ("gpuslice.io/job", None),
            ("gpuslice.io/reservation", None),
            ("gpuslice.io/Memory", None),
            ("example.com/memory", None),
            ("placement.gpuslice.io/rule", None),
        ] {
            assert_eq!(request_key(key), want, "{key}");
        }
        // What is not a request key fails the container's creation under the prefix.
        let e = parse_ask(&ann(&[("gpuslice.io/job", "x")])).expect_err("not a request key");
        assert_eq!(
            e,
            AnnotationError::UnknownKey {
                key: "gpuslice.io/job".into()
            }
        );
    }

    #[test]
    fn full_request() {
        let r = slice(&[
            ("gpuslice.io/gpus", "2"),
            ("gpuslice.io/memory", "4Gi"),
            ("gpuslice.io/cores", "30"),
            (
                "gpuslice.io/gpu",
                "0,GPU-12345678-1234-1234-1234-123456789abc",
            ),
            ("gpuslice.io/gpu-type", "h200"),
            ("gpuslice.io/policy", "spread"),
        ]);
        assert_eq!(r.gpus, 2);
        assert_eq!(r.memory, Some(Quantity::Bytes(4 << 30)));
        assert_eq!(r.cores, 30);
        assert_eq!(r.selectors.len(), 2);
        assert_eq!(r.model.as_deref(), Some("h200"));
        assert_eq!(r.policy, Some(Policy::Spread));
        assert!(!r.whole_gpu);
    }

    #[test]
    fn defaults_and_percent() {
        let r = slice(&[("gpuslice.io/memory", "25%")]);
        assert_eq!(
            (r.gpus, r.cores, r.memory),
            (1, 0, Some(Quantity::Percent(25)))
        );
        let r = slice(&[("gpuslice.io/cores", "50")]);
        assert_eq!(
            r.memory, None,
            "no memory annotation books the whole GPU's memory"
        );
    }

    #[test]
    fn nothing_and_sandbox() {
        assert_eq!(parse_ask(&ann(&[("other.io/x", "1")])), Ok(Ask::Nothing));
        assert_eq!(
            parse_ask(&ann(&[
                ("gpuslice.io/memory", "4Gi"),
                ("io.kubernetes.cri.container-type", "sandbox")
            ])),
            Ok(Ask::Sandbox)
        );
        assert_eq!(
            parse_ask(&ann(&[
                ("gpuslice.io/memory", "4Gi"),
                ("io.kubernetes.cri-o.ContainerType", "sandbox")
            ])),
            Ok(Ask::Sandbox)
        );
    }

    #[test]
    fn per_container_override_wins_and_others_are_ignored() {
        let pod = [
            ("gpuslice.io/memory", "8Gi"),
            ("gpuslice.io/memory.app", "4Gi"),
            ("gpuslice.io/cores.app", "20"),
            ("io.kubernetes.cri.container-name", "app"),
            ("io.kubernetes.cri.sandbox-namespace", "ml"),
            ("io.kubernetes.cri.sandbox-name", "infer-0"),
            ("io.kubernetes.cri.sandbox-uid", "uid-1"),
        ];
        let r = slice(&pod);
        assert_eq!(r.memory, Some(Quantity::Bytes(4 << 30)));
        assert_eq!(r.cores, 20);
        match &r.owner {
            Owner::Container {
                kubernetes: Some(k),
                ..
            } => {
                assert_eq!(
                    (k.namespace.as_str(), k.pod.as_str(), k.container.as_str()),
                    ("ml", "infer-0", "app")
                )
            }
            other => panic!("{other:?}"),
        }
        // A sidecar of the same pod sees only the app's overrides: nothing applies to it.
        let sidecar = ann(&[
            ("gpuslice.io/memory.app", "4Gi"),
            ("io.kubernetes.container.name", "sidecar"),
        ]);
        assert_eq!(parse_ask(&sidecar), Ok(Ask::Nothing));
    }

    #[test]
    fn zero_gpus_for_one_container_opts_it_out_of_the_pod_request() {
        let pod = |name: &str| {
            ann(&[
                ("gpuslice.io/memory", "8Gi"),
                ("gpuslice.io/cores", "30"),
                ("gpuslice.io/gpus.sidecar", "0"),
                ("io.kubernetes.cri.container-name", name),
            ])
        };
        assert_eq!(parse_ask(&pod("sidecar")), Ok(Ask::Nothing));
        let app = slice(&[
            ("gpuslice.io/memory", "8Gi"),
            ("gpuslice.io/gpus.sidecar", "0"),
            ("io.kubernetes.cri.container-name", "app"),
        ]);
        assert_eq!((app.gpus, app.memory), (1, Some(Quantity::Bytes(8 << 30))));
        assert!(matches!(parse_ask(&pod("app")), Ok(Ask::Slice(_))));
        // A per-container count other than 0 is still a request, in range.
        let two = slice(&[
            ("gpuslice.io/memory", "8Gi"),
            ("gpuslice.io/gpus.app", "2"),
            ("io.kubernetes.cri.container-name", "app"),
        ]);
        assert_eq!(two.gpus, 2);
        let e = parse_ask(&ann(&[
            ("gpuslice.io/gpus.app", "17"),
            ("io.kubernetes.cri.container-name", "app"),
        ]))
        .expect_err("17 GPUs");
        assert!(
            e.to_string()
                .contains("from 0 (no GPU for this container) to 16"),
            "{e}"
        );
        // Pod-wide, 0 asks for nothing and is refused with the per-container form named.
        let e = parse_ask(&ann(&[("gpuslice.io/gpus", "0")])).expect_err("0 GPUs");
        assert!(
            e.to_string().contains("gpuslice.io/gpus.<container-name>"),
            "{e}"
        );
    }

    #[test]
    fn malformed_values_name_key_value_and_form() {
        for (k, v, want) in [
            ("gpuslice.io/memory", "lots", "bytes (`1073741824`)"),
            ("gpuslice.io/memory", "100m", "milli"),
            (
                "gpuslice.io/memory",
                "16Ei",
                "too large, more than 2^64-1 bytes",
            ),
            ("gpuslice.io/memory", "4GB", "here `G`"),
            ("gpuslice.io/memory", "0.5", "not a whole number of bytes"),
            ("gpuslice.io/memory", "0%", "from 1% to 100%"),
            ("gpuslice.io/memory", "0", "more than 0 bytes"),
            (
                "gpuslice.io/cores",
                "150",
                "(150 is out of range); expected a compute share in percent from 1 to 100",
            ),
            ("gpuslice.io/cores", "0", "(0 is out of range)"),
            ("gpuslice.io/cores", "30%%%%", "(`30` or `30%`)"),
            ("gpuslice.io/cores", "30%%", "(not a whole number)"),
            ("gpuslice.io/cores", "30.5", "(not a whole number)"),
            ("gpuslice.io/cores", "%", "(no digits)"),
            ("gpuslice.io/gpus", "0", "(0 is out of range); expected"),
            ("gpuslice.io/gpus", "17", "from 1 to 16"),
            ("gpuslice.io/gpus", "two", "(not a whole number)"),
            (
                "gpuslice.io/gpus",
                "1.5",
                "(not a whole number); expected a whole number from 1 to 16",
            ),
            ("gpuslice.io/gpus", "100m", "(not a whole number)"),
            ("gpuslice.io/gpus", "-1", "(negative)"),
            ("gpuslice.io/gpus", "1000000", "(more than 6 digits)"),
            ("gpuslice.io/gpu", "first", "indexes or UUIDs"),
            ("gpuslice.io/gpu-type", "", "model name"),
            ("gpuslice.io/policy", "fastest", "`binpack` or `spread`"),
        ] {
            let e = parse_ask(&ann(&[(k, v)])).expect_err(v).to_string();
            assert!(
                e.starts_with(&format!("annotation {k}: value {v:?} is not accepted")),
                "{e}"
            );
            assert!(e.contains(want), "{e}");
            assert!(!e.contains('\n'));
            if k == "gpuslice.io/memory" && v != "0" {
                assert!(e.contains(&format!("expected {ACCEPTED_QUANTITY}")), "{e}");
            }
        }
    }

    #[test]
    fn gpu_type_length_counts_characters() {
        // 96 two-byte characters are 96 characters (docs/annotations.md), not 192 bytes.
        let long = "é".repeat(96);
        let r = slice(&[("gpuslice.io/gpu-type", &long)]);
        assert_eq!(r.model.as_deref(), Some(long.as_str()));
        let e = parse_ask(&ann(&[("gpuslice.io/gpu-type", &"é".repeat(97))]))
            .expect_err("97 characters");
        assert!(
            e.to_string().contains("1 to 96 printable characters"),
            "{e}"
        );
    }

    #[test]
    fn unknown_keys_are_refused() {
        let e = parse_ask(&ann(&[("gpuslice.io/memroy", "4Gi")])).expect_err("typo");
        assert!(
            e.to_string().contains("gpuslice.io/memroy") && e.to_string().contains("memory"),
            "{e}"
        );
        assert!(parse_ask(&ann(&[("gpuslice.io/memory.", "4Gi")])).is_err());
    }
}

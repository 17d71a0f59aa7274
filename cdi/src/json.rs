//! Deterministic JSON encoding of specs (the same spec always gives the same bytes:
//! fixed field order, sorted annotations, pretty-printed, trailing newline), with the
//! lowest sufficient `cdiVersion` stamped, and strict decoding.

use crate::model::Spec;
use crate::validate::ValidationError;
use crate::version::minimum_version;

/// A spec that cannot be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum JsonError {
    /// The spec breaks a CDI rule.
    #[error("invalid CDI spec: {0}")]
    Invalid(#[from] ValidationError),
    /// The bytes are not a CDI spec in JSON (syntax, unknown or missing field, wrong type).
    #[error("not a CDI spec in JSON: {0}")]
    Parse(serde_json::Error),
    /// serde_json failed to encode (not expected for these types).
    #[error("cannot encode CDI spec of kind {kind:?}: {source}")]
    Encode {
        kind: String,
        source: serde_json::Error,
    },
}

/// A copy of `spec` with `cdiVersion` set to the lowest version that expresses its fields.
pub fn stamped(spec: &Spec) -> Spec {
    let mut out = spec.clone();
    out.cdi_version = minimum_version(spec).to_string();
    out
}

/// Encodes `spec` after stamping the lowest sufficient `cdiVersion` and validating it.
pub fn to_json(spec: &Spec) -> Result<Vec<u8>, JsonError> {
    encode(spec, true)
}

/// As [`to_json`], without the indentation: for copies only gpuslice reads, on every
/// container's create path (half the bytes to scan).
pub fn to_json_compact(spec: &Spec) -> Result<Vec<u8>, JsonError> {
    encode(spec, false)
}

fn encode(spec: &Spec, pretty: bool) -> Result<Vec<u8>, JsonError> {
    let spec = stamped(spec);
    spec.validate()?;
    let encoded = if pretty {
        serde_json::to_vec_pretty(&spec)
    } else {
        serde_json::to_vec(&spec)
    };
    let mut bytes = encoded.map_err(|source| JsonError::Encode {
        kind: spec.kind.clone(),
        source,
    })?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// Decodes a spec, rejecting unknown fields, and validates it (including its `cdiVersion`).
pub fn from_json(bytes: &[u8]) -> Result<Spec, JsonError> {
    let spec: Spec = serde_json::from_slice(bytes).map_err(JsonError::Parse)?;
    spec.validate()?;
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ContainerEdits, Device, DeviceNode, Mount};

    fn spec() -> Spec {
        let mut s = Spec::new("gpuslice.io/gpu");
        s.devices.push(Device::new(
            "0",
            ContainerEdits {
                env: vec!["NVIDIA_VISIBLE_DEVICES=void".into()],
                device_nodes: vec![DeviceNode::char_device("/dev/nvidia0", 195, 0)],
                mounts: vec![Mount::bind("/a", "/b", &["ro"])],
                ..Default::default()
            },
        ));
        s
    }

    #[test]
    fn output_is_minimal_stamped_and_newline_terminated() {
        let bytes = to_json(&spec()).expect("encode");
        let text = String::from_utf8(bytes).expect("utf8");
        assert!(text.ends_with("}\n"));
        assert!(text.contains("\"cdiVersion\": \"0.5.0\""), "{text}");
        for absent in [
            "annotations",
            "hostPath\": null",
            "hooks",
            "netDevices",
            "intelRdt",
            "additionalGids",
            "null",
            "\"type\": \"\"",
        ] {
            assert!(!text.contains(absent), "{absent} in {text}");
        }
        assert_eq!(
            from_json(text.as_bytes()).expect("decode"),
            stamped(&spec())
        );
    }

    #[test]
    fn compact_encoding_is_the_same_spec_on_one_line() {
        let pretty = to_json(&spec()).expect("encode");
        let compact = to_json_compact(&spec()).expect("encode");
        let text = String::from_utf8(compact.clone()).expect("utf8");
        assert_eq!(text.matches('\n').count(), 1, "{text}");
        assert!(
            text.ends_with("}\n") && text.contains("\"cdiVersion\":\"0.5.0\""),
            "{text}"
        );
        assert!(compact.len() < pretty.len());
        assert_eq!(
            from_json(&compact).expect("decode"),
            from_json(&pretty).expect("decode")
        );
    }

    #[test]
    fn decoding_is_strict() {
        let unknown = br#"{"cdiVersion":"0.3.0","kind":"a.io/b","devices":[{"name":"x","containerEdits":{"env":["A=1"],"bogus":1}}]}"#;
        let e = from_json(unknown).expect_err("unknown field").to_string();
        assert!(e.contains("bogus"), "{e}");
        let missing = br#"{"cdiVersion":"0.3.0","kind":"a.io/b"}"#;
        assert!(from_json(missing)
            .expect_err("no devices field")
            .to_string()
            .contains("devices"));
        let old = br#"{"cdiVersion":"0.3.0","kind":"a.io/b","devices":[{"name":"0","containerEdits":{"env":["A=1"]}}]}"#;
        assert!(from_json(old)
            .expect_err("version too old")
            .to_string()
            .contains("0.5.0 or newer"));
    }

    #[test]
    fn invalid_specs_are_not_encoded() {
        let mut s = spec();
        s.devices[0].container_edits.mounts[0].container_path = "b".into();
        assert!(matches!(to_json(&s), Err(JsonError::Invalid(_))));
    }
}

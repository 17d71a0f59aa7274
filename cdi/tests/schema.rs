//! Generated specs validate against the CDI project's JSON schema (tests/schema/), with
//! schema.json's `defs.json#/...` references served by a retriever.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod support;

use gpuslice_cdi::{to_json, ContainerEdits, Device, Spec};
use serde_json::Value;

struct DefsRetriever(Value);

impl jsonschema::Retrieve for DefsRetriever {
    fn retrieve(
        &self,
        uri: &jsonschema::Uri<String>,
    ) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        if uri.path().as_str().ends_with("/defs.json") {
            Ok(self.0.clone())
        } else {
            Err(format!("the CDI schema refers only to defs.json, not {uri}").into())
        }
    }
}

fn validator() -> jsonschema::Validator {
    let schema: Value =
        serde_json::from_str(include_str!("schema/schema.json")).expect("schema.json");
    let defs: Value = serde_json::from_str(include_str!("schema/defs.json")).expect("defs.json");
    jsonschema::options()
        .with_draft(jsonschema::Draft::Draft7)
        .with_retriever(DefsRetriever(defs))
        .build(&schema)
        .expect("the CDI schema compiles")
}

fn assert_schema_valid(v: &jsonschema::Validator, spec: &Spec) {
    let bytes = to_json(spec).expect("encodes");
    let instance: Value = serde_json::from_slice(&bytes).expect("json");
    let errors: Vec<String> = v
        .iter_errors(&instance)
        .map(|e| format!("{} at {}", e, e.instance_path))
        .collect();
    assert!(
        errors.is_empty(),
        "{} does not match the CDI schema: {errors:?}",
        spec.kind
    );
}

#[test]
fn generated_specs_match_the_cdi_schema() {
    let v = validator();
    assert_schema_valid(&v, &support::node_spec());
    assert_schema_valid(&v, &support::slice_spec("3f9a0c1d2e4b5a69"));
    assert_schema_valid(&v, &support::every_field_spec());
    let mut minimal = Spec::new("gpuslice.io/test");
    minimal.devices.push(Device::new(
        "x",
        ContainerEdits {
            env: vec!["A=1".into()],
            ..Default::default()
        },
    ));
    assert_schema_valid(&v, &minimal);
}

#[test]
fn the_schema_check_can_fail() {
    // Guards against a validator that accepts everything (e.g. unresolved references).
    let v = validator();
    let missing_required: Value = serde_json::json!({"cdiVersion": "0.3.0", "kind": "a.io/b"});
    assert!(!v.is_valid(&missing_required));
    let bad_uid: Value = serde_json::json!({
        "cdiVersion": "0.3.0", "kind": "a.io/b",
        "devices": [{"name": "x", "containerEdits": {"deviceNodes": [{"path": "/dev/x", "uid": -1}]}}]
    });
    assert!(
        !v.is_valid(&bad_uid),
        "a negative uid must fail defs.json#/definitions/uint32"
    );
}

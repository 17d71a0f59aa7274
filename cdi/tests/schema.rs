//! Generated specs validate against the CDI project's JSON schema (tests/schema/), with
//! schema.json's `defs.json#/...` references served by a retriever.

use crate::support;

use gpuslice_cdi::{to_json, ContainerEdits, Device, Spec};
use serde_json::Value;

#[path = "schema/validator.rs"]
mod cdi_schema;
use cdi_schema::validator;

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

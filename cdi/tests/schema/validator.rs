//! The CDI project's JSON schema (schema.json beside this file, its `defs.json#/...`
//! references served by a retriever) as one validator, shared by every test that checks a
//! generated spec against it (included with `#[path]`).

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

/// The compiled CDI schema (Draft 7, as the CDI project publishes it).
pub fn validator() -> jsonschema::Validator {
    let schema: Value = serde_json::from_str(include_str!("schema.json")).expect("schema.json");
    let defs: Value = serde_json::from_str(include_str!("defs.json")).expect("defs.json");
    jsonschema::options()
        .with_draft(jsonschema::Draft::Draft7)
        .with_retriever(DefsRetriever(defs))
        .build(&schema)
        .expect("the CDI schema compiles")
}

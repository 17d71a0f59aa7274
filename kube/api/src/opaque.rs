//! The opaque parameters of driver `gpuslice.io` (`{"cores": N}`) and which requests a claim's
//! configuration applies to: the one reading of them, for prepare and for the tools that show
//! a claim.

/// What the opaque parameters of driver `gpuslice.io` accept.
pub const OPAQUE_ACCEPTED: &str = "a JSON object {\"cores\": <percent per GPU, 1 to 100>}, optionally with \"apiVersion\": \"gpuslice.io/v1\" and \"kind\": \"SliceParameters\", for requests of slots (a request of the shared device asks cores in capacity.requests)";

/// Why opaque parameters of this driver are not what it accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpaqueError {
    #[error("{0} is not an object")]
    NotObject(String),
    #[error("cores {0} is not a percent from 1 to 100")]
    Cores(String),
    #[error("`{key}`: {value} is not accepted")]
    Field { key: String, value: String },
    #[error("no `cores`")]
    NoCores,
}

/// The compute share opaque parameters of driver `gpuslice.io` ask (`{"cores": N}`, with
/// optionally their `apiVersion` and `kind`), refusing anything else.
pub fn opaque_cores(parameters: &serde_json::Value) -> Result<u32, OpaqueError> {
    let serde_json::Value::Object(map) = parameters else {
        return Err(OpaqueError::NotObject(parameters.to_string()));
    };
    let mut cores = None;
    for (k, v) in map {
        match (k.as_str(), v) {
            ("apiVersion", serde_json::Value::String(s)) if s == "gpuslice.io/v1" => {}
            ("kind", serde_json::Value::String(s)) if s == "SliceParameters" => {}
            ("cores", serde_json::Value::Number(n)) => match n.as_u64() {
                Some(p @ 1..=100) => cores = u32::try_from(p).ok(),
                _ => return Err(OpaqueError::Cores(n.to_string())),
            },
            _ => {
                return Err(OpaqueError::Field {
                    key: k.clone(),
                    value: v.to_string(),
                })
            }
        }
    }
    cores.ok_or(OpaqueError::NoCores)
}

/// The request a result or a configuration names: `<request>` itself, or the parent of a
/// prioritized list's `<request>/<subrequest>` (a configuration naming the parent applies to
/// every subrequest).
pub fn parent_request(name: &str) -> &str {
    name.split_once('/').map_or(name, |(parent, _)| parent)
}

/// Whether a configuration naming `requests` (none: every request) applies to the result of
/// request `result` (`<request>` or `<request>/<subrequest>`).
pub fn config_applies(requests: Option<&[String]>, result: &str) -> bool {
    match requests {
        None | Some([]) => true,
        Some(names) => names
            .iter()
            .any(|n| n == result || n == parent_request(result)),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn cores_are_read_and_anything_else_is_refused_by_name() {
        assert_eq!(opaque_cores(&json!({"cores": 30})), Ok(30));
        assert_eq!(
            opaque_cores(
                &json!({"apiVersion": "gpuslice.io/v1", "kind": "SliceParameters", "cores": 100})
            ),
            Ok(100)
        );
        assert_eq!(
            opaque_cores(&json!({"cores": 0})),
            Err(OpaqueError::Cores("0".into()))
        );
        assert_eq!(
            opaque_cores(&json!({"cores": 101})),
            Err(OpaqueError::Cores("101".into()))
        );
        assert_eq!(
            opaque_cores(&json!({"cores": 30, "memory": "1Gi"})),
            Err(OpaqueError::Field {
                key: "memory".into(),
                value: "\"1Gi\"".into()
            })
        );
        assert_eq!(
            opaque_cores(&json!({"kind": "Other", "cores": 30})),
            Err(OpaqueError::Field {
                key: "kind".into(),
                value: "\"Other\"".into()
            })
        );
        assert_eq!(opaque_cores(&json!({})), Err(OpaqueError::NoCores));
        assert_eq!(
            opaque_cores(&json!([30])),
            Err(OpaqueError::NotObject("[30]".into()))
        );
    }

    #[test]
    fn a_configuration_applies_to_its_requests_and_their_subrequests() {
        assert!(config_applies(Some(&["gpu".to_string()]), "gpu/slots-1"));
        assert!(config_applies(Some(&["gpu".to_string()]), "gpu"));
        assert!(!config_applies(Some(&["gpu-1".to_string()]), "gpu/slots-1"));
        assert!(config_applies(None, "x"));
        assert!(config_applies(Some(&[]), "x"));
        assert_eq!(parent_request("gpu/slots-2"), "gpu");
        assert_eq!(parent_request("gpu"), "gpu");
    }
}

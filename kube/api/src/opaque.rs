//! The opaque parameters of driver `gpuslice.io` (`{"cores": N}`), which requests a claim's
//! configuration applies to, and the compute share a claim asks on a GPU from them: the one
//! reading of them, for prepare, the budgets' charge and the tools that show a claim.

use k8s_openapi::api::resource::v1::OpaqueDeviceConfiguration;

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

/// One configuration of driver `gpuslice.io`, read: the requests it names (`None` or empty:
/// every request) and the compute share it asks, in percent of a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareConfig {
    pub requests: Option<Vec<String>>,
    pub cores: u32,
}

/// The configurations of driver `gpuslice.io` among a claim's `configs` (each its `requests`
/// and its opaque configuration, in the claim's order; other drivers' are skipped), each read
/// or why its parameters are not accepted.
pub fn share_configs<'a>(
    configs: impl IntoIterator<Item = (Option<&'a [String]>, Option<&'a OpaqueDeviceConfiguration>)>,
) -> Vec<Result<ShareConfig, OpaqueError>> {
    configs
        .into_iter()
        .filter_map(|(requests, opaque)| {
            let opaque = opaque.filter(|o| o.driver == crate::DRIVER)?;
            Some(opaque_cores(&opaque.parameters.0).map(|cores| ShareConfig {
                requests: requests.map(<[String]>::to_vec),
                cores,
            }))
        })
        .collect()
}

/// The compute share a claim asks on one GPU where it holds the results `results` (`<request>`
/// or `<request>/<subrequest>`): the largest share of the configurations that apply to any of
/// them. A share is asked per GPU, so a configuration counts once on a GPU however many of the
/// claim's requests lie there (a whole GPU asked slot by slot is N requests on one GPU).
/// `None`: none applies, the claim is not throttled there. The kubelet plugin books this and
/// the budgets charge it (kube/api/src/quota.rs), so the two cannot differ.
pub fn gpu_share<'a>(
    configs: &[ShareConfig],
    results: impl IntoIterator<Item = &'a str>,
) -> Option<u32> {
    let results: Vec<&str> = results.into_iter().collect();
    configs
        .iter()
        .filter(|c| {
            results
                .iter()
                .any(|r| config_applies(c.requests.as_deref(), r))
        })
        .map(|c| c.cores)
        .max()
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

    #[test]
    fn a_gpus_share_is_the_largest_configuration_applying_there_counted_once() {
        let config = |requests: Option<&[&str]>, cores: u32| ShareConfig {
            requests: requests.map(|r| r.iter().map(|s| s.to_string()).collect()),
            cores,
        };
        // One configuration for every request, six requests on the GPU: its share, once.
        let all = [config(None, 30)];
        let slots: Vec<String> = (0..6).map(|j| format!("gpu-0-slot-{j}")).collect();
        assert_eq!(gpu_share(&all, slots.iter().map(String::as_str)), Some(30));
        // Several that apply: the largest, whatever their order.
        for configs in [
            [config(None, 1), config(None, 96)],
            [config(None, 96), config(None, 1)],
        ] {
            assert_eq!(gpu_share(&configs, ["gpu"]), Some(96));
        }
        // Per request: only those naming a request (or its parent) on the GPU.
        let named = [config(Some(&["a"]), 10), config(Some(&["b"]), 20)];
        assert_eq!(gpu_share(&named, ["a"]), Some(10));
        assert_eq!(gpu_share(&named, ["a", "b"]), Some(20));
        assert_eq!(gpu_share(&named, ["c"]), None);
        assert_eq!(
            gpu_share(&[config(Some(&["gpu"]), 10)], ["gpu/slots-1"]),
            Some(10)
        );
        assert_eq!(gpu_share(&named, std::iter::empty()), None);
    }

    #[test]
    fn only_this_drivers_configurations_are_read_each_or_why_not() {
        let opaque = |driver: &str, parameters: serde_json::Value| OpaqueDeviceConfiguration {
            driver: driver.to_string(),
            parameters: k8s_openapi::apimachinery::pkg::runtime::RawExtension(parameters),
        };
        let ours = opaque(crate::DRIVER, json!({"cores": 30}));
        let bad = opaque(crate::DRIVER, json!({"cores": 0}));
        let theirs = opaque("gpu.nvidia.com", json!("x"));
        let named = vec!["gpu".to_string()];
        assert_eq!(
            share_configs([
                (None, Some(&ours)),
                (Some(named.as_slice()), Some(&theirs)),
                (Some(named.as_slice()), None),
                (Some(named.as_slice()), Some(&bad)),
            ]),
            vec![
                Ok(ShareConfig {
                    requests: None,
                    cores: 30
                }),
                Err(OpaqueError::Cores("0".into())),
            ]
        );
    }
}

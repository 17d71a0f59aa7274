//! ResourceClaims and ResourceClaimTemplates read through views that keep only what a charge
//! reads (the metadata that names and owns them, the device requests, constraints and
//! gpuslice's own opaque parameters), so that what the webhook never reads cannot stop it from
//! reading them: opaque parameters of other drivers and `managedFields` may nest deeper than
//! the JSON parser's recursion limit (the API server accepts them), and are skipped unbuilt. A
//! list is read object by object, so that one object that cannot be read is named and skipped
//! rather than failing the list (docs/quotas.md).

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    DeviceClaim, DeviceClaimConfiguration, DeviceConstraint, DeviceRequest,
    OpaqueDeviceConfiguration, ResourceClaim, ResourceClaimSpec, ResourceClaimTemplate,
    ResourceClaimTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::value::RawValue;

use gpuslice_dra::DRIVER;

/// An object that cannot be read through its view: its kind, its name as far as it can be
/// read, and the parser's reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} {name} cannot be read: {detail}; accepted: a {kind} as the API server stores it")]
pub struct ViewError {
    pub kind: &'static str,
    pub name: String,
    pub detail: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MetaView {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    generate_name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    creation_timestamp: Option<Time>,
    #[serde(default)]
    deletion_timestamp: Option<Time>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    annotations: Option<BTreeMap<String, String>>,
    #[serde(default)]
    owner_references: Option<Vec<OwnerReference>>,
}

impl From<MetaView> for ObjectMeta {
    fn from(m: MetaView) -> ObjectMeta {
        ObjectMeta {
            name: m.name,
            generate_name: m.generate_name,
            namespace: m.namespace,
            uid: m.uid,
            resource_version: m.resource_version,
            creation_timestamp: m.creation_timestamp,
            deletion_timestamp: m.deletion_timestamp,
            labels: m.labels,
            annotations: m.annotations,
            owner_references: m.owner_references,
            ..ObjectMeta::default()
        }
    }
}

#[derive(Deserialize)]
struct SpecView {
    #[serde(default)]
    devices: Option<DevicesView>,
}

#[derive(Deserialize)]
struct DevicesView {
    #[serde(default)]
    requests: Option<Vec<DeviceRequest>>,
    #[serde(default)]
    constraints: Option<Vec<DeviceConstraint>>,
    #[serde(default)]
    config: Option<Vec<ConfigView>>,
}

#[derive(Deserialize)]
struct ConfigView {
    #[serde(default)]
    requests: Option<Vec<String>>,
    #[serde(default)]
    opaque: Option<OpaqueView>,
}

#[derive(Deserialize)]
struct OpaqueView {
    driver: String,
    /// Kept unparsed: only gpuslice's are read.
    parameters: Box<RawValue>,
}

impl From<SpecView> for ResourceClaimSpec {
    fn from(s: SpecView) -> ResourceClaimSpec {
        ResourceClaimSpec {
            devices: s.devices.map(|d| DeviceClaim {
                requests: d.requests,
                constraints: d.constraints,
                // gpuslice's opaque parameters (a slot claim's compute share); others, and
                // any the parser cannot build, are dropped (the plugin cannot read those
                // either: its claim is charged as not throttled).
                config: d.config.map(|c| {
                    c.into_iter()
                        .filter_map(|c| {
                            let o = c.opaque?;
                            if o.driver != DRIVER {
                                return None;
                            }
                            let parameters = serde_json::from_str(o.parameters.get()).ok()?;
                            Some(DeviceClaimConfiguration {
                                requests: c.requests,
                                opaque: Some(OpaqueDeviceConfiguration {
                                    driver: o.driver,
                                    parameters: RawExtension(parameters),
                                }),
                            })
                        })
                        .collect()
                }),
            }),
        }
    }
}

#[derive(Deserialize)]
struct ClaimView {
    #[serde(default)]
    metadata: Option<MetaView>,
    #[serde(default)]
    spec: Option<SpecView>,
}

#[derive(Deserialize)]
struct TemplateView {
    #[serde(default)]
    metadata: Option<MetaView>,
    #[serde(default)]
    spec: Option<TemplateSpecView>,
}

#[derive(Deserialize)]
struct TemplateSpecView {
    #[serde(default)]
    spec: Option<SpecView>,
}

#[derive(Deserialize)]
struct NameView {
    #[serde(default)]
    metadata: Option<NameMetaView>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NameMetaView {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    generate_name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
}

/// `namespace/name` of the object in `json` as far as it can be read (`generateName` while it
/// has no name; `?` for what is missing).
pub fn name_of(json: &str) -> String {
    let m = serde_json::from_str::<NameView>(json)
        .ok()
        .and_then(|v| v.metadata);
    let ns = m.as_ref().and_then(|m| m.namespace.clone());
    let name = m.and_then(|m| m.name.or(m.generate_name));
    match (ns, name) {
        (Some(ns), Some(n)) => format!("{ns}/{n}"),
        (None, Some(n)) => n,
        (Some(ns), None) => format!("{ns}/?"),
        (None, None) => "?".to_string(),
    }
}

/// A kind read through its view.
pub trait Viewed: Sized {
    /// The kind, for messages.
    const KIND: &'static str;
    /// The object `json` holds, as far as its view keeps it.
    fn read(json: &str) -> Result<Self, ViewError>;
}

fn view<V: DeserializeOwned>(kind: &'static str, json: &str) -> Result<V, ViewError> {
    serde_json::from_str::<V>(json).map_err(|e| ViewError {
        kind,
        name: name_of(json),
        detail: e.to_string(),
    })
}

impl Viewed for ResourceClaim {
    const KIND: &'static str = "ResourceClaim";
    fn read(json: &str) -> Result<ResourceClaim, ViewError> {
        let v: ClaimView = view(Self::KIND, json)?;
        Ok(ResourceClaim {
            metadata: v.metadata.map(ObjectMeta::from).unwrap_or_default(),
            spec: v.spec.map(ResourceClaimSpec::from),
            status: None,
        })
    }
}

impl Viewed for ResourceClaimTemplate {
    const KIND: &'static str = "ResourceClaimTemplate";
    fn read(json: &str) -> Result<ResourceClaimTemplate, ViewError> {
        let v: TemplateView = view(Self::KIND, json)?;
        Ok(ResourceClaimTemplate {
            metadata: v.metadata.map(ObjectMeta::from).unwrap_or_default(),
            spec: v.spec.map(|s| ResourceClaimTemplateSpec {
                metadata: None,
                spec: s.spec.map(ResourceClaimSpec::from),
            }),
        })
    }
}

impl Viewed for k8s_openapi::api::core::v1::Pod {
    const KIND: &'static str = "Pod";
    /// A pod is read whole (nothing in it nests without bound).
    fn read(json: &str) -> Result<Self, ViewError> {
        view(Self::KIND, json)
    }
}

#[derive(Deserialize)]
struct ListView<'a> {
    #[serde(default)]
    metadata: Option<ListMetaView>,
    #[serde(default, borrow)]
    items: Vec<&'a RawValue>,
}

#[derive(Deserialize)]
struct ListMetaView {
    #[serde(default, rename = "continue")]
    continue_: Option<String>,
}

/// One page of a list: the objects read, those that could not be (each naming the object and
/// why), and the token of the next page (`None`: the last).
pub struct Page<K> {
    pub objects: Vec<K>,
    pub unread: Vec<ViewError>,
    pub next: Option<String>,
}

/// The objects of a list's JSON `text`, each read through its view.
pub fn read_list<K: Viewed>(text: &str) -> Result<Page<K>, serde_json::Error> {
    let list: ListView = serde_json::from_str(text)?;
    let mut objects = Vec::new();
    let mut unread = Vec::new();
    for item in list.items {
        match K::read(item.get()) {
            Ok(o) => objects.push(o),
            Err(e) => unread.push(e),
        }
    }
    let next = list
        .metadata
        .and_then(|m| m.continue_)
        .filter(|c| !c.is_empty());
    Ok(Page {
        objects,
        unread,
        next,
    })
}

/// One page of the objects of kind `K` that `params` selects, in namespace `ns` (`None`: all
/// namespaces), each read through its view.
pub async fn list_page<K>(
    client: &kube::Client,
    ns: Option<&str>,
    params: &kube::api::ListParams,
) -> Result<Page<K>, kube::Error>
where
    K: Viewed + kube::Resource<DynamicType = ()>,
{
    let req = kube::core::Request::new(K::url_path(&(), ns))
        .list(params)
        .map_err(kube::Error::BuildRequest)?;
    let text = client.request_text(req).await?;
    read_list(&text).map_err(kube::Error::SerdeError)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// JSON nesting `depth` objects inside each other, past the parser's recursion limit.
    pub fn nested(depth: usize) -> String {
        format!("{}1{}", r#"{"a":"#.repeat(depth), "}".repeat(depth))
    }

    fn claim_json(depth: usize) -> String {
        let c = json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "free", "namespace": "team",
                "managedFields": [{"manager": "kubectl", "fieldsV1": "DEEP"}]},
            "spec": {"devices": {
                "requests": [{"name": "g", "exactly": {"deviceClassName": "gpuslice.io", "count": 8}}],
                "config": [
                    {"opaque": {"driver": "example.com", "parameters": "DEEP"}},
                    {"opaque": {"driver": "gpuslice.io", "parameters": {
                        "apiVersion": "gpuslice.io/v1", "kind": "SliceParameters", "cores": 30}}}]}},
        });
        c.to_string().replace("\"DEEP\"", &nested(depth))
    }

    #[test]
    fn deep_opaque_parameters_of_other_drivers_do_not_stop_a_claim_being_read() {
        let text = claim_json(200);
        // The whole-object parser gives up on it.
        assert!(serde_json::from_str::<ResourceClaim>(&text).is_err());
        let c = ResourceClaim::read(&text).unwrap();
        assert_eq!(c.metadata.name.as_deref(), Some("free"));
        let devices = c.spec.unwrap().devices.unwrap();
        assert_eq!(
            devices.requests.unwrap()[0].exactly.as_ref().unwrap().count,
            Some(8)
        );
        // gpuslice's own parameters are kept.
        let config = devices.config.unwrap();
        assert_eq!(config.len(), 1);
        assert_eq!(config[0].opaque.as_ref().unwrap().parameters.0["cores"], 30);
    }

    #[test]
    fn a_list_skips_only_the_object_it_cannot_read_and_names_it() {
        let good = claim_json(3);
        let bad = r#"{"metadata": {"name": "odd", "namespace": "team"}, "spec": {"devices": {"requests": 5}}}"#;
        let text = format!(
            r#"{{"kind": "ResourceClaimList", "items": [{good}, {bad}, {}]}}"#,
            claim_json(300)
        );
        let page = read_list::<ResourceClaim>(&text).unwrap();
        assert_eq!(page.objects.len(), 2);
        assert_eq!(page.unread.len(), 1);
        assert_eq!(page.next, None);
        let e = page.unread[0].to_string();
        assert!(
            e.starts_with("ResourceClaim team/odd cannot be read: "),
            "{e}"
        );
        // Templates likewise.
        let t = format!(
            r#"{{"metadata": {{"continue": "abc"}}, "items": [{{"metadata": {{"name": "t"}}, "spec": {{"metadata": {{"labels": {{"a": "b"}}}}, "spec": {}}}}}]}}"#,
            serde_json::from_str::<serde_json::Value>(&claim_json(3)).unwrap()["spec"]
        );
        let page = read_list::<ResourceClaimTemplate>(&t).unwrap();
        assert!(page.unread.is_empty());
        assert_eq!(page.next.as_deref(), Some("abc"));
        assert_eq!(page.objects[0].metadata.name.as_deref(), Some("t"));
    }
}

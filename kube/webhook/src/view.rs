//! ResourceClaims and ResourceClaimTemplates read through views that keep only what a charge
//! reads (the metadata that names and owns them, the device requests, constraints and
//! gpuslice's own opaque parameters, the consumers a claim is reserved for), so that what the
//! webhook never reads cannot stop it from reading them: opaque parameters of other drivers
//! (in a claim's spec or its allocation) and `managedFields` may nest deeper than the JSON
//! parser's recursion limit (the API server accepts them), and are skipped unbuilt. A
//! list is read object by object as its answer arrives, so that one object that cannot be read
//! is named and skipped rather than failing the list (docs/quotas.md), and a page holds in
//! memory one object's text at a time and, of each object, only what its reader keeps
//! ([`list_page`]); a watch likewise, event by event ([`Watch`]).

use std::collections::BTreeMap;
use std::fmt;
use std::io::{BufReader, Read};
use std::marker::PhantomData;

use hyper::body::Bytes;
use k8s_openapi::api::core::v1::{
    Pod, PodResourceClaim, PodResourceClaimStatus, PodSpec, PodStatus,
};
use k8s_openapi::api::resource::v1::{
    DeviceClaim, DeviceClaimConfiguration, DeviceConstraint, DeviceRequest,
    OpaqueDeviceConfiguration, ResourceClaim, ResourceClaimConsumerReference, ResourceClaimSpec,
    ResourceClaimStatus, ResourceClaimTemplate, ResourceClaimTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::api::{ListParams, WatchParams};
use kube::core::Status;
use serde::de::{
    DeserializeOwned, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor,
};
use serde::Deserialize;
use serde_json::value::RawValue;

use gpuslice_dra::DRIVER;

/// An object that cannot be read through its view: its kind, where it is as far as that can be
/// read, and the parser's reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} {object} cannot be read: {detail}; accepted: a {kind} as the API server stores it")]
pub struct ViewError {
    pub kind: &'static str,
    pub object: Named,
    pub detail: String,
}

/// An object's namespace and name as far as its metadata can be read (its `generateName` while
/// it has no name).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Named {
    pub namespace: Option<String>,
    pub name: Option<String>,
}

impl fmt::Display for Named {
    /// `namespace/name`, `?` for what is missing.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.namespace, &self.name) {
            (Some(ns), Some(n)) => write!(f, "{ns}/{n}"),
            (None, Some(n)) => write!(f, "{n}"),
            (Some(ns), None) => write!(f, "{ns}/?"),
            (None, None) => write!(f, "?"),
        }
    }
}

/// The metadata every view keeps (`managedFields`, which may nest without bound, is skipped);
/// also what names an object that cannot be read otherwise, and a bookmark's version.
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
                config: d
                    .config
                    .map(|c| c.into_iter().map(DeviceClaimConfiguration::from).collect()),
            }),
        }
    }
}

impl From<ConfigView> for DeviceClaimConfiguration {
    /// gpuslice's opaque parameters as written (a slot claim's compute share); those of other
    /// drivers, and any the parser cannot build, as `null` (the plugin cannot read those
    /// either: its claim is charged as not throttled). The entry itself is kept, so that a
    /// template carrying more configuration than the webhook wrote is not taken for its own
    /// (`claim_shape::is_ours` compares them).
    fn from(c: ConfigView) -> DeviceClaimConfiguration {
        DeviceClaimConfiguration {
            requests: c.requests,
            opaque: c.opaque.map(|o| {
                let parameters = (o.driver == DRIVER)
                    .then(|| serde_json::from_str(o.parameters.get()).ok())
                    .flatten()
                    .unwrap_or(serde_json::Value::Null);
                OpaqueDeviceConfiguration {
                    driver: o.driver,
                    parameters: RawExtension(parameters),
                }
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
    #[serde(default)]
    status: Option<ClaimStatusView>,
}

/// Of a claim's status, only who holds it (a claim made for a pod that is done is freed only
/// while no live pod holds it, crate::budget); the allocation, which carries other drivers'
/// opaque parameters, is skipped unbuilt.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClaimStatusView {
    #[serde(default)]
    reserved_for: Option<Vec<ResourceClaimConsumerReference>>,
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

/// Only an object's metadata: what names it when the rest cannot be read.
#[derive(Deserialize)]
struct ObjectView {
    #[serde(default)]
    metadata: Option<MetaView>,
}

/// Where the object in `json` is, as far as its metadata can be read.
pub fn named(json: &str) -> Named {
    match serde_json::from_str::<ObjectView>(json)
        .ok()
        .and_then(|v| v.metadata)
    {
        Some(m) => Named {
            namespace: m.namespace,
            name: m.name.or(m.generate_name),
        },
        None => Named::default(),
    }
}

/// `namespace/name` of the object in `json` as far as it can be read (`generateName` while it
/// has no name; `?` for what is missing).
pub fn name_of(json: &str) -> String {
    named(json).to_string()
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
        object: named(json),
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
            status: v.status.map(|s| ResourceClaimStatus {
                reserved_for: s.reserved_for,
                ..ResourceClaimStatus::default()
            }),
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

#[derive(Deserialize)]
struct PodView {
    #[serde(default)]
    metadata: Option<MetaView>,
    #[serde(default)]
    spec: Option<PodSpecView>,
    #[serde(default)]
    status: Option<PodStatusView>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodSpecView {
    #[serde(default)]
    resource_claims: Option<Vec<PodResourceClaim>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodStatusView {
    #[serde(default)]
    phase: Option<String>,
    #[serde(default)]
    resource_claim_statuses: Option<Vec<PodResourceClaimStatus>>,
}

impl Viewed for Pod {
    const KIND: &'static str = "Pod";
    /// Of a pod, what a charge and the template sweep read: its name, namespace, uid and
    /// version, its claim entries, its phase and the claims made for its entries; its
    /// containers, volumes, labels and annotations are skipped unbuilt.
    fn read(json: &str) -> Result<Self, ViewError> {
        let v: PodView = view(Self::KIND, json)?;
        let metadata = v.metadata.map(|m| ObjectMeta {
            labels: None,
            annotations: None,
            owner_references: None,
            ..ObjectMeta::from(m)
        });
        Ok(Pod {
            metadata: metadata.unwrap_or_default(),
            spec: v.spec.map(|s| PodSpec {
                resource_claims: s.resource_claims,
                ..PodSpec::default()
            }),
            status: v.status.map(|s| PodStatus {
                phase: s.phase,
                resource_claim_statuses: s.resource_claim_statuses,
                ..PodStatus::default()
            }),
        })
    }
}

impl Viewed for k8s_openapi::api::core::v1::ResourceQuota {
    const KIND: &'static str = "ResourceQuota";
    /// A quota is read whole: it is written back whole (its status), and nothing in it nests
    /// without bound.
    fn read(json: &str) -> Result<Self, ViewError> {
        view(Self::KIND, json)
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListMetaView {
    #[serde(default, rename = "continue")]
    continue_: Option<String>,
    #[serde(default)]
    resource_version: Option<String>,
}

/// Objects asked per list call (`limit`), as kube's own reflector asks: a page's answer is
/// read an object at a time ([`list_page`]), so its size bounds API calls, not memory.
pub const PAGE: u32 = 500;

/// Frames of an answer in flight to a list's reader ([`list_page`]): a few, so that the
/// reader, not the network, sets the pace.
const FRAMES: usize = 4;

/// One page of a list: what was kept of the objects read, the objects that could not be read
/// (each naming the object and why), the token of the next page (`None`: the last) and the
/// list's resourceVersion (a watch of what the list shows starts from it).
pub struct Page<S> {
    pub objects: Vec<S>,
    pub unread: Vec<ViewError>,
    pub next: Option<String>,
    pub version: Option<String>,
}

/// A list's JSON object: its metadata, and its items read one at a time through their views,
/// each given to `keep` as soon as it is read (only what `keep` returns is held).
struct ListSeed<'p, K, S, F> {
    page: &'p mut Page<S>,
    keep: &'p mut F,
    kind: PhantomData<fn() -> K>,
}

impl<'de, K: Viewed, S, F: FnMut(K) -> Option<S>> Visitor<'de> for ListSeed<'_, K, S, F> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a list of {}s", K::KIND)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "metadata" => {
                    if let Some(m) = map.next_value::<Option<ListMetaView>>()? {
                        self.page.next = m.continue_.filter(|c| !c.is_empty());
                        self.page.version = m.resource_version;
                    }
                }
                "items" => map.next_value_seed(Items {
                    page: &mut *self.page,
                    keep: &mut *self.keep,
                    kind: PhantomData::<fn() -> K>,
                })?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// A list's `items`: each object's text alone is held while it is read through its view.
struct Items<'p, K, S, F> {
    page: &'p mut Page<S>,
    keep: &'p mut F,
    kind: PhantomData<fn() -> K>,
}

impl<'de, K: Viewed, S, F: FnMut(K) -> Option<S>> DeserializeSeed<'de> for Items<'_, K, S, F> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, K: Viewed, S, F: FnMut(K) -> Option<S>> Visitor<'de> for Items<'_, K, S, F> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the {}s of a list", K::KIND)
    }

    /// `null`: no items.
    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(item) = seq.next_element::<Box<RawValue>>()? {
            match K::read(item.get()) {
                Ok(o) => self.page.objects.extend((self.keep)(o)),
                Err(e) => self.page.unread.push(e),
            }
        }
        Ok(())
    }
}

/// The page the list JSON `d` holds, each object read through its view and kept as `keep`
/// keeps it (`None`: not kept).
fn read_page<'de, D, K, S, F>(d: D, keep: &mut F) -> Result<Page<S>, D::Error>
where
    D: Deserializer<'de>,
    K: Viewed,
    F: FnMut(K) -> Option<S>,
{
    let mut page = Page {
        objects: Vec::new(),
        unread: Vec::new(),
        next: None,
        version: None,
    };
    d.deserialize_map(ListSeed {
        page: &mut page,
        keep,
        kind: PhantomData::<fn() -> K>,
    })?;
    Ok(page)
}

/// The objects of a list's JSON `text`, each read through its view.
pub fn read_list<K: Viewed>(text: &str) -> Result<Page<K>, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    let page = read_page(&mut de, &mut Some)?;
    de.end()?;
    Ok(page)
}

/// The frames of an answer as they arrive, read as one stream of bytes (by a blocking task).
struct Frames {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
    /// What is left of the frame being read.
    at: Bytes,
}

impl Read for Frames {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.at.is_empty() {
            match self.rx.blocking_recv() {
                Some(frame) => self.at = frame,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.at.len());
        buf[..n].copy_from_slice(&self.at.split_to(n));
        Ok(n)
    }
}

/// Sends `req`; an answer that is not a success is the API server's `Status` as an error.
async fn send(
    client: &kube::Client,
    mut req: hyper::Request<Vec<u8>>,
) -> Result<hyper::Response<kube::client::Body>, kube::Error> {
    // Uncompressed, as kube's own watch asks: the answer is read as it arrives.
    req.headers_mut().insert(
        hyper::header::ACCEPT_ENCODING,
        hyper::header::HeaderValue::from_static("identity"),
    );
    let res = client.send(req.map(kube::client::Body::from)).await?;
    let code = res.status();
    if code.is_success() {
        return Ok(res);
    }
    let text = http_body_util::BodyExt::collect(res.into_body())
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
        .unwrap_or_default();
    let status = serde_json::from_str::<Status>(&text).unwrap_or_else(|_| {
        Status::failure(text.trim(), "Failed to parse error data").with_code(code.as_u16())
    });
    Err(kube::Error::Api(status.boxed()))
}

/// One page of the objects of kind `K` that `params` selects (with a `limit`, [`PAGE`], and
/// the `continue` token of the page before), in namespace `ns` (`None`: all namespaces), each
/// read through its view and kept as `keep` keeps it (`None`: not kept). The answer is read as
/// it arrives: one object's text at a time is held, and of each object only what `keep`
/// returns, so that a page of large objects costs the memory of what is kept of them.
pub async fn list_page<K, S>(
    client: &kube::Client,
    ns: Option<&str>,
    params: &ListParams,
    mut keep: impl FnMut(K) -> Option<S> + Send + 'static,
) -> Result<Page<S>, kube::Error>
where
    K: Viewed + kube::Resource<DynamicType = ()> + 'static,
    S: Send + 'static,
{
    let req = kube::core::Request::new(K::url_path(&(), ns))
        .list(params)
        .map_err(kube::Error::BuildRequest)?;
    let res = send(client, req).await?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(FRAMES);
    let reading = tokio::task::spawn_blocking(move || {
        let frames = Frames {
            rx,
            at: Bytes::new(),
        };
        let mut de = serde_json::Deserializer::from_reader(BufReader::new(frames));
        let page = read_page(&mut de, &mut keep)?;
        de.end()?;
        Ok::<_, serde_json::Error>(page)
    });
    let mut body = res.into_body();
    let mut failed = None;
    while let Some(frame) = http_body_util::BodyExt::frame(&mut body).await {
        match frame {
            Ok(frame) => {
                if let Ok(data) = frame.into_data() {
                    // The reader stopped (the text is no list): its error is the answer.
                    if tx.send(data).await.is_err() {
                        break;
                    }
                }
            }
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    drop(tx);
    let read = reading
        .await
        .map_err(|e| kube::Error::Service(Box::new(e)))?;
    match failed {
        Some(e) => Err(e),
        None => read.map_err(kube::Error::SerdeError),
    }
}

/// Every object of kind `K` that `params` selects, in namespace `ns` (`None`: all
/// namespaces), a page of [`PAGE`] at a time, each kept as `keep` keeps it; those that cannot
/// be read are given to `unread`.
pub async fn list_kept<K, S>(
    client: &kube::Client,
    ns: Option<&str>,
    params: ListParams,
    keep: impl FnMut(K) -> Option<S> + Clone + Send + 'static,
    mut unread: impl FnMut(ViewError),
) -> Result<Vec<S>, kube::Error>
where
    K: Viewed + kube::Resource<DynamicType = ()> + 'static,
    S: Send + 'static,
{
    let mut params = params.limit(PAGE);
    let mut kept = Vec::new();
    loop {
        let page = list_page::<K, S>(client, ns, &params, keep.clone()).await?;
        kept.extend(page.objects);
        page.unread.into_iter().for_each(&mut unread);
        match page.next {
            Some(c) => params = params.continue_token(&c),
            None => return Ok(kept),
        }
    }
}

/// Every object `params` selects through `api`, read whole (kinds only cluster
/// administrators and drivers write: quotas, ResourceSlices), a page of [`PAGE`] at a time.
pub async fn list_all<K>(api: &kube::Api<K>, params: ListParams) -> Result<Vec<K>, kube::Error>
where
    K: Clone + DeserializeOwned + fmt::Debug,
{
    let mut params = params.limit(PAGE);
    let mut all = Vec::new();
    loop {
        let page = api.list(&params).await?;
        all.extend(page.items);
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => params = params.continue_token(&c),
            _ => return Ok(all),
        }
    }
}

/// Why one object could not be read: the API call failed, or the object cannot be read through
/// its view.
#[derive(Debug, thiserror::Error)]
pub enum GetError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error(transparent)]
    View(#[from] ViewError),
}

/// The object of kind `K` named `name` in namespace `ns`, read through its view; `None` when
/// there is none.
pub async fn get_opt<K>(client: &kube::Client, ns: &str, name: &str) -> Result<Option<K>, GetError>
where
    K: Viewed + kube::Resource<DynamicType = ()>,
{
    let req = kube::core::Request::new(K::url_path(&(), Some(ns)))
        .get(name, &kube::api::GetParams::default())
        .map_err(kube::Error::BuildRequest)?;
    match client.request_text(req).await {
        Ok(text) => Ok(Some(K::read(&text)?)),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// One event of a watch, its object read through its view.
#[derive(Debug)]
pub enum Event<K> {
    /// `ADDED` or `MODIFIED`: the object as it is now.
    Put(Result<K, ViewError>),
    /// `DELETED`: the object as it was last.
    Deleted(Result<K, ViewError>),
    /// `BOOKMARK`: nothing the watch selects changed up to this resourceVersion.
    Bookmark(String),
    /// `ERROR`: the watch ends (a failure, or a version that expired: code 410): the status (one
    /// whose object is no status: its text as the message, code 0).
    Error(Box<Status>),
}

#[derive(Deserialize)]
struct EventView<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    #[serde(borrow)]
    object: &'a RawValue,
}

/// The event of one line of a watch, its object read through its view: an object that cannot
/// be read is an event of an unread object (the others are read all the same); an error only
/// when the line is no event.
pub fn read_event<K: Viewed>(line: &[u8]) -> Result<Event<K>, serde_json::Error> {
    let e: EventView = serde_json::from_slice(line)?;
    let json = e.object.get();
    Ok(match e.kind {
        "ADDED" | "MODIFIED" => Event::Put(K::read(json)),
        "DELETED" => Event::Deleted(K::read(json)),
        "BOOKMARK" => {
            let v: ObjectView = serde_json::from_str(json)?;
            Event::Bookmark(
                v.metadata
                    .and_then(|m| m.resource_version)
                    .unwrap_or_default(),
            )
        }
        "ERROR" => Event::Error(Box::new(
            serde_json::from_str::<Status>(json).unwrap_or_else(|_| Status::failure(json, "")),
        )),
        other => {
            return Err(serde::de::Error::unknown_variant(
                other,
                &["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"],
            ))
        }
    })
}

/// A watch of the objects of one kind, its events read line by line through their views (the
/// API server writes one event a line).
pub struct Watch {
    body: kube::client::Body,
    /// What was received and not yet read: the start of the next line.
    buf: Vec<u8>,
    /// How much of `buf` holds no line end.
    scanned: usize,
}

impl Watch {
    /// Starts watching the objects of kind `K` that `params` selects, in every namespace, from
    /// resourceVersion `version`.
    pub async fn start<K>(
        client: &kube::Client,
        params: &WatchParams,
        version: &str,
    ) -> Result<Watch, kube::Error>
    where
        K: kube::Resource<DynamicType = ()>,
    {
        let req = kube::core::Request::new(K::url_path(&(), None))
            .watch(params, version)
            .map_err(kube::Error::BuildRequest)?;
        // One event a line.
        let res = send(client, req).await?;
        Ok(Watch {
            body: res.into_body(),
            buf: Vec::new(),
            scanned: 0,
        })
    }

    /// The next event; `None` when the watch ended (the API server ends it at its timeout; a
    /// broken connection ends it too, and a part line left is dropped: the next watch resumes
    /// from the last version read).
    pub async fn next<K: Viewed>(&mut self) -> Option<Result<Event<K>, serde_json::Error>> {
        loop {
            if let Some(at) = self.buf[self.scanned..].iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=self.scanned + at).collect();
                self.scanned = 0;
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Some(read_event(&line));
            }
            self.scanned = self.buf.len();
            let frame = http_body_util::BodyExt::frame(&mut self.body).await?.ok()?;
            if let Ok(data) = frame.into_data() {
                self.buf.extend_from_slice(&data);
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
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
            "status": {
                "allocation": {"devices": {"config": [{"source": "FromClaim",
                    "opaque": {"driver": "example.com", "parameters": "DEEP"}}]}},
                "reservedFor": [{"resource": "pods", "name": "p", "uid": "up"}]},
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
        // Who holds it is kept past its allocation's deep parameters.
        let held = c.status.as_ref().and_then(|s| s.reserved_for.as_ref());
        assert_eq!(
            held.map(|l| l.iter().map(|r| r.uid.as_str()).collect::<Vec<_>>()),
            Some(vec!["up"])
        );
        let devices = c.spec.unwrap().devices.unwrap();
        assert_eq!(
            devices.requests.unwrap()[0].exactly.as_ref().unwrap().count,
            Some(8)
        );
        // gpuslice's own parameters are kept; the other driver's entry, without them.
        let config = devices.config.unwrap();
        assert_eq!(config.len(), 2);
        let other = config[0].opaque.as_ref().unwrap();
        assert_eq!(
            (other.driver.as_str(), &other.parameters.0),
            ("example.com", &serde_json::Value::Null)
        );
        assert_eq!(config[1].opaque.as_ref().unwrap().parameters.0["cores"], 30);
    }

    #[test]
    fn a_template_carrying_more_configuration_than_the_webhooks_is_not_taken_for_it() {
        let spec = |config: serde_json::Value| {
            json!({"metadata": {"namespace": "team", "name": "t",
                    "labels": {"app.kubernetes.io/managed-by": "gpuslice-webhook"}},
                "spec": {"spec": {"devices": {
                    "requests": [{"name": "g", "exactly": {"deviceClassName": "gpuslice.io"}}],
                    "config": config}}}})
            .to_string()
        };
        let ours = json!({"opaque": {"driver": "gpuslice.io", "parameters": {
            "apiVersion": "gpuslice.io/v1", "kind": "SliceParameters", "cores": 30}}});
        let want = ResourceClaimTemplate::read(&spec(json!([ours]))).unwrap();
        let same = ResourceClaimTemplate::read(&spec(json!([ours]))).unwrap();
        assert!(gpuslice_dra::claim_shape::is_ours(&same, &want));
        let more = spec(json!([ours, {"opaque": {"driver": "example.com", "parameters": "DEEP"}}]))
            .replace("\"DEEP\"", &nested(200));
        let more = ResourceClaimTemplate::read(&more).unwrap();
        assert!(!gpuslice_dra::claim_shape::is_ours(&more, &want));
        // Nor one whose own parameters cannot be built.
        let unbuilt = spec(json!([{"opaque": {"driver": "gpuslice.io", "parameters": "DEEP"}}]))
            .replace("\"DEEP\"", &nested(200));
        let unbuilt = ResourceClaimTemplate::read(&unbuilt).unwrap();
        assert!(!gpuslice_dra::claim_shape::is_ours(&unbuilt, &want));
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

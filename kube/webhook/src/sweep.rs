//! The webhook's templates that no pod uses are deleted, so that neither the pods that came and
//! went nor a caller that reaches the webhook without the API server can leave them piling up.
//! A template is first marked (annotation [`UNUSED_SINCE`]) when no pod of its namespace names
//! it and it is older than the grace; it is deleted at a later sweep when it is still unused
//! and was marked at least the grace ago, conditionally on the version that was read. An
//! admission that reuses a marked template clears the mark first (a new version), so a pod
//! admitted while its template is being collected never names a deleted one (docs/webhook.md).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::Api;
use serde_json::json;

use gpuslice_dra::claim_shape::{MANAGED_BY, TEMPLATE_PREFIX};

use crate::view::list_kept;

/// The annotation that marks a template no pod used at the last sweep: when (RFC 3339).
pub const UNUSED_SINCE: &str = "gpuslice.io/unused-since";
/// How long a template may go unused before it is marked, and marked before it is deleted.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(600);
/// The longest pause between sweeps.
const MAX_EVERY: Duration = Duration::from_secs(300);

/// A sweep's API call failed (the next sweep tries again).
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("cannot list the webhook's ResourceClaimTemplates: {0}")]
    ListTemplates(kube::Error),
    #[error("cannot list the pods of namespace {namespace}: {source}")]
    ListPods {
        namespace: String,
        source: kube::Error,
    },
    #[error("cannot {op} ResourceClaimTemplate {namespace}/{name}: {source}")]
    Write {
        op: &'static str,
        namespace: String,
        name: String,
        source: kube::Error,
    },
}

/// What a sweep does with one of the webhook's templates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Keep,
    /// Unused and older than the grace: mark it unused since now.
    Mark,
    /// Used again: clear the mark.
    Unmark,
    /// Unused and marked at least the grace ago.
    Delete,
}

/// The pause between sweeps for `grace`: half of it, from 1 s to 5 min.
pub fn every(grace: Duration) -> Duration {
    (grace / 2).clamp(Duration::from_secs(1), MAX_EVERY)
}

/// Whether `name` is the name the webhook gives its templates (`gpuslice-` and a 16-digit
/// hexadecimal hash): a template of another name is never touched, whatever its label.
pub fn webhook_name(name: &str) -> bool {
    name.strip_prefix(TEMPLATE_PREFIX)
        .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// When `t` was marked unused; an unreadable mark reads as now (it is renewed).
fn marked(t: &ResourceClaimTemplate, now: Timestamp) -> Option<Timestamp> {
    let v = t.metadata.annotations.as_ref()?.get(UNUSED_SINCE)?;
    Some(v.parse().unwrap_or(now))
}

/// Whether `t` carries the mark.
pub fn is_marked(t: &ResourceClaimTemplate) -> bool {
    t.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(UNUSED_SINCE))
}

fn at_least(since: Timestamp, now: Timestamp, grace: Duration) -> bool {
    now.as_second().saturating_sub(since.as_second())
        >= i64::try_from(grace.as_secs()).unwrap_or(i64::MAX)
}

/// The step for template `t`, given whether a pod of its namespace names it (`used`).
pub fn decide(t: &ResourceClaimTemplate, used: bool, now: Timestamp, grace: Duration) -> Step {
    let ours = t
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY.0))
        .is_some_and(|v| v == MANAGED_BY.1)
        && t.metadata.name.as_deref().is_some_and(webhook_name);
    if !ours || t.metadata.deletion_timestamp.is_some() {
        return Step::Keep;
    }
    match (used, marked(t, now)) {
        (true, Some(_)) => Step::Unmark,
        (true, None) => Step::Keep,
        (false, Some(since)) if at_least(since, now, grace) => Step::Delete,
        (false, Some(_)) => Step::Keep,
        (false, None) => {
            let created = t.metadata.creation_timestamp.as_ref().map(|c| c.0);
            // A template without its creation time is as new as it can be.
            if created.is_some_and(|c| at_least(c, now, grace)) {
                Step::Mark
            } else {
                Step::Keep
            }
        }
    }
}

/// What the sweep keeps of template `t` while it lists them: `None` for one not named as the
/// webhook names its own (never touched); of the others, what [`decide`] and the delete read:
/// the name, namespace, uid, version, creation and deletion times, the webhook's label and the
/// mark.
pub fn sweep_view(t: ResourceClaimTemplate) -> Option<ResourceClaimTemplate> {
    let m = t.metadata;
    if !m.name.as_deref().is_some_and(webhook_name) {
        return None;
    }
    let only = |map: Option<BTreeMap<String, String>>, key: &str| {
        let kept: BTreeMap<String, String> = map?.into_iter().filter(|(k, _)| k == key).collect();
        (!kept.is_empty()).then_some(kept)
    };
    Some(ResourceClaimTemplate {
        metadata: ObjectMeta {
            name: m.name,
            namespace: m.namespace,
            uid: m.uid,
            resource_version: m.resource_version,
            creation_timestamp: m.creation_timestamp,
            deletion_timestamp: m.deletion_timestamp,
            labels: only(m.labels, MANAGED_BY.0),
            annotations: only(m.annotations, UNUSED_SINCE),
            ..ObjectMeta::default()
        },
        spec: None,
    })
}

/// The template names the pods name (`spec.resourceClaims[].resourceClaimTemplateName`).
pub fn named_templates(pods: &[Pod]) -> BTreeSet<String> {
    pods.iter()
        .filter_map(|p| p.spec.as_ref())
        .flat_map(|s| s.resource_claims.iter().flatten())
        .filter_map(|c| c.resource_claim_template_name.clone())
        .collect()
}

/// The merge patch that sets the mark to `since`, or (`None`) clears it.
pub fn mark_patch(since: Option<Timestamp>) -> serde_json::Value {
    json!({"metadata": {"annotations": {UNUSED_SINCE: since.map(|s| s.to_string())}}})
}

/// One sweep over every namespace holding a template of the webhook's; what it did, as
/// (namespace/name, step) for the steps that wrote. Each replica may sweep: a mark written
/// twice is harmless, a delete whose object changed or went is skipped.
pub async fn sweep_once(
    client: &kube::Client,
    grace: Duration,
) -> Result<Vec<(String, Step)>, SweepError> {
    let selector = format!("{}={}", MANAGED_BY.0, MANAGED_BY.1);
    let mut by_ns: BTreeMap<String, Vec<ResourceClaimTemplate>> = BTreeMap::new();
    // Read through their view (crate::view): a template whose other drivers' parameters nest
    // past the parser's limit is read all the same, and one that cannot be read is named and
    // left alone, never stopping the sweep of the others.
    // Of the templates labelled as the webhook's, only those named as it names them are kept,
    // and of each only what the sweep reads ([`sweep_view`]).
    let templates = list_kept(
        client,
        None,
        ListParams::default().labels(&selector),
        sweep_view,
        |e| eprintln!("gpuslice webhook: template sweep: skipped: {e}"),
    )
    .await
    .map_err(SweepError::ListTemplates)?;
    for t in templates {
        by_ns
            .entry(t.metadata.namespace.clone().unwrap_or_default())
            .or_default()
            .push(t);
    }
    let mut done = Vec::new();
    for (namespace, templates) in by_ns {
        // Read after the templates: a pod that names one of them exists in this list, or was
        // admitted after the template was read (and so after any mark, which it cleared).
        // Of each pod, only the template names it names.
        let named: BTreeSet<String> = list_kept(
            client,
            Some(&namespace),
            ListParams::default(),
            |p: Pod| Some(named_templates(std::slice::from_ref(&p))),
            |e| eprintln!("gpuslice webhook: template sweep: skipped: {e}"),
        )
        .await
        .map_err(|source| SweepError::ListPods {
            namespace: namespace.clone(),
            source,
        })?
        .into_iter()
        .flatten()
        .collect();
        let now = Timestamp::now();
        let api: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), &namespace);
        for t in templates {
            let name = t.metadata.name.clone().unwrap_or_default();
            let step = decide(&t, named.contains(&name), now, grace);
            let err = |op, source| SweepError::Write {
                op,
                namespace: namespace.clone(),
                name: name.clone(),
                source,
            };
            let result = match step {
                Step::Keep => continue,
                Step::Mark | Step::Unmark => api
                    .patch(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(mark_patch((step == Step::Mark).then_some(now))),
                    )
                    .await
                    .map(|_| ())
                    .map_err(|e| err(if step == Step::Mark { "mark" } else { "unmark" }, e)),
                Step::Delete => {
                    let params = DeleteParams {
                        preconditions: Some(Preconditions {
                            uid: t.metadata.uid.clone(),
                            resource_version: t.metadata.resource_version.clone(),
                        }),
                        ..DeleteParams::default()
                    };
                    api.delete(&name, &params)
                        .await
                        .map(|_| ())
                        .map_err(|e| err("delete", e))
                }
            };
            match result {
                Ok(()) => done.push((format!("{namespace}/{name}"), step)),
                // Gone already (another replica, a person): done. Changed since it was read
                // (an admission cleared the mark): kept, as it should be.
                Err(SweepError::Write {
                    source: kube::Error::Api(s),
                    ..
                }) if s.is_not_found() || s.is_conflict() => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(done)
}

/// Sweeps every [`every`]`(grace)` for as long as the webhook runs; a failed sweep is
/// reported and the next one tries again.
pub async fn run(client: kube::Client, grace: Duration) {
    loop {
        tokio::time::sleep(every(grace)).await;
        match sweep_once(&client, grace).await {
            Ok(done) => {
                for (t, _) in done.iter().filter(|(_, s)| *s == Step::Delete) {
                    eprintln!(
                        "gpuslice webhook: deleted ResourceClaimTemplate {t}: no pod of its namespace named it for twice the grace of {}s",
                        grace.as_secs()
                    );
                }
            }
            Err(e) => eprintln!("gpuslice webhook: template sweep: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap as Map;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    const GRACE: Duration = Duration::from_secs(600);

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn t(created: i64, mark: Option<&str>) -> ResourceClaimTemplate {
        let mut t = ResourceClaimTemplate::default();
        t.metadata.name = Some("gpuslice-0123456789abcdef".into());
        t.metadata.labels = Some(Map::from([(MANAGED_BY.0.into(), MANAGED_BY.1.into())]));
        t.metadata.creation_timestamp = Some(Time(at(created)));
        if let Some(m) = mark {
            t.metadata.annotations = Some(Map::from([(UNUSED_SINCE.into(), m.into())]));
        }
        t
    }

    #[test]
    fn an_unused_template_is_marked_after_the_grace_and_deleted_a_grace_later() {
        let now = at(10_000);
        // Younger than the grace: a pod being admitted may be about to name it.
        assert_eq!(decide(&t(9_500, None), false, now, GRACE), Step::Keep);
        assert_eq!(decide(&t(9_400, None), false, now, GRACE), Step::Mark);
        assert_eq!(decide(&t(0, None), true, now, GRACE), Step::Keep);
        let recent = at(9_500).to_string();
        let old = at(9_400).to_string();
        assert_eq!(decide(&t(0, Some(&recent)), false, now, GRACE), Step::Keep);
        assert_eq!(decide(&t(0, Some(&old)), false, now, GRACE), Step::Delete);
        // Used again: the mark goes, whatever its age.
        assert_eq!(decide(&t(0, Some(&old)), true, now, GRACE), Step::Unmark);
        // An unreadable mark counts from now.
        assert_eq!(decide(&t(0, Some("soon")), false, now, GRACE), Step::Keep);
    }

    #[test]
    fn only_the_webhooks_own_templates_are_touched() {
        let now = at(10_000);
        let mut other = t(0, None);
        other.metadata.name = Some("my-template".into());
        assert_eq!(decide(&other, false, now, GRACE), Step::Keep);
        let mut unlabelled = t(0, None);
        unlabelled.metadata.labels = None;
        assert_eq!(decide(&unlabelled, false, now, GRACE), Step::Keep);
        let mut going = t(0, None);
        going.metadata.deletion_timestamp = Some(Time(at(0)));
        assert_eq!(decide(&going, false, now, GRACE), Step::Keep);
        assert!(webhook_name("gpuslice-0123456789abcdef"));
        assert!(!webhook_name("gpuslice-0123456789abcde"));
        assert!(!webhook_name("gpuslice-0123456789abcdeg"));
    }

    #[test]
    fn the_pods_name_their_templates_and_the_mark_round_trips() {
        let pods: Vec<Pod> = serde_json::from_value(json!([
            {"spec": {"containers": [], "resourceClaims": [
                {"name": "gpuslice-c0", "resourceClaimTemplateName": "gpuslice-a"},
                {"name": "other", "resourceClaimName": "claim"}]}},
            {"spec": {"containers": []}},
        ]))
        .unwrap();
        assert_eq!(
            named_templates(&pods),
            BTreeSet::from(["gpuslice-a".into()])
        );
        let p = mark_patch(Some(at(0)));
        let since: Timestamp = p["metadata"]["annotations"][UNUSED_SINCE]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(since, at(0));
        assert_eq!(
            mark_patch(None),
            json!({"metadata": {"annotations": {UNUSED_SINCE: null}}})
        );
        assert_eq!(every(GRACE), Duration::from_secs(300));
        assert_eq!(every(Duration::from_secs(2)), Duration::from_secs(1));
    }
}

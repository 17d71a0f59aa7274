//! The kinds the fake serves and the REST paths that name them, as the API server lays them
//! out: `/api/v1/...` for the core group, `/apis/GROUP/VERSION/...` for the others, a
//! namespaced kind's objects under `namespaces/NS/`.

use serde_json::{json, Value};

/// One kind the fake serves.
#[derive(Debug)]
pub struct Kind {
    /// The API group; empty for the core group.
    pub group: &'static str,
    pub version: &'static str,
    /// The resource, as paths name it.
    pub plural: &'static str,
    /// The kind of its lists.
    pub list_kind: &'static str,
    pub namespaced: bool,
    /// The fields its field selectors may name besides `metadata.name` and
    /// `metadata.namespace`.
    pub fields: &'static [&'static str],
    /// Its `status` subresource, if it has one.
    pub status: Option<&'static StatusRules>,
}

/// What the API server lets each write change of a kind with a `status` subresource, as its
/// registry strategy prepares the write: a create starts the status afresh, a write of the
/// object (replace, patch) keeps the status stored, and a write of the status keeps the spec
/// stored and, of the metadata, the fields `status_keeps` names (the rest is taken as sent).
#[derive(Debug)]
pub struct StatusRules {
    /// The status a create stores, whatever status was sent.
    pub created: fn() -> Value,
    /// The metadata fields a write of the status keeps as stored, whatever it sends.
    pub status_keeps: &'static [&'static str],
}

/// Pods: created Pending (the API server also sets `qosClass` from the containers' resources,
/// which the fake does not compute); a status write cannot change the owner references or the
/// deletion timestamp.
const POD_STATUS: StatusRules = StatusRules {
    created: || json!({"phase": "Pending"}),
    status_keeps: &["deletionTimestamp", "ownerReferences"],
};

/// ResourceQuotas: created with an empty status; a status write may change any metadata.
const QUOTA_STATUS: StatusRules = StatusRules {
    created: || json!({}),
    status_keeps: &[],
};

/// ResourceClaims: created with an empty status; a status write keeps the labels, annotations,
/// finalizers, owner references, generation and deletion timestamp as stored.
const CLAIM_STATUS: StatusRules = StatusRules {
    created: || json!({}),
    status_keeps: &[
        "deletionTimestamp",
        "generation",
        "labels",
        "annotations",
        "finalizers",
        "ownerReferences",
    ],
};

/// What the kubelet plugin and the webhook read and write (the webhook's budget Lease too).
pub const KINDS: &[Kind] = &[
    Kind {
        group: "",
        version: "v1",
        plural: "nodes",
        list_kind: "NodeList",
        namespaced: false,
        fields: &[],
        status: None,
    },
    Kind {
        group: "",
        version: "v1",
        plural: "pods",
        list_kind: "PodList",
        namespaced: true,
        fields: &[],
        status: Some(&POD_STATUS),
    },
    Kind {
        group: "",
        version: "v1",
        plural: "resourcequotas",
        list_kind: "ResourceQuotaList",
        namespaced: true,
        fields: &[],
        status: Some(&QUOTA_STATUS),
    },
    Kind {
        group: "resource.k8s.io",
        version: "v1",
        plural: "resourceclaims",
        list_kind: "ResourceClaimList",
        namespaced: true,
        fields: &[],
        status: Some(&CLAIM_STATUS),
    },
    Kind {
        group: "resource.k8s.io",
        version: "v1",
        plural: "resourceclaimtemplates",
        list_kind: "ResourceClaimTemplateList",
        namespaced: true,
        fields: &[],
        status: None,
    },
    Kind {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        list_kind: "LeaseList",
        namespaced: true,
        fields: &[],
        status: None,
    },
    Kind {
        group: "resource.k8s.io",
        version: "v1",
        plural: "resourceslices",
        list_kind: "ResourceSliceList",
        namespaced: false,
        fields: &["spec.nodeName", "spec.driver", "spec.pool.name"],
        status: None,
    },
];

impl Kind {
    /// The kind named by its resource (`resourceslices`), if the fake serves it.
    pub fn named(plural: &str) -> Option<&'static Kind> {
        KINDS.iter().find(|k| k.plural == plural)
    }

    /// The `apiVersion` of its objects and lists.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The resource as the API server's messages name it: `nodes`,
    /// `resourceslices.resource.k8s.io`.
    pub fn resource(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}

/// What a request's path names: a kind's collection (in one namespace or, `namespace` `None`,
/// across all), one object of it, or that object's status subresource.
#[derive(Debug)]
pub struct Target {
    pub kind: &'static Kind,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// The path names the object's `status` subresource.
    pub status: bool,
}

impl Target {
    /// The namespace its objects are stored under: empty for a cluster-scoped kind.
    pub fn namespace_key(&self) -> String {
        self.namespace.clone().unwrap_or_default()
    }
}

/// What `path` (no query) names, or `None` when it is no collection or object of a served
/// kind (a cluster-scoped kind under a namespace, a namespaced object without one, a
/// subresource other than a kind's `status`).
pub fn target(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (group, version, rest) = match parts.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return None,
    };
    let (namespace, plural, name, status) = match rest {
        ["namespaces", ns, plural] => (Some(*ns), *plural, None, false),
        ["namespaces", ns, plural, name] => (Some(*ns), *plural, Some(*name), false),
        ["namespaces", ns, plural, name, "status"] => (Some(*ns), *plural, Some(*name), true),
        [plural] => (None, *plural, None, false),
        [plural, name] => (None, *plural, Some(*name), false),
        [plural, name, "status"] => (None, *plural, Some(*name), true),
        _ => return None,
    };
    let kind = KINDS
        .iter()
        .find(|k| k.group == group && k.version == version && k.plural == plural)?;
    if status && kind.status.is_none() {
        return None;
    }
    let scoped = match (kind.namespaced, namespace, name) {
        (false, Some(_), _) | (true, None, Some(_)) => false,
        (_, Some(ns), _) => !ns.is_empty(),
        _ => true,
    };
    if !scoped || name == Some("") {
        return None;
    }
    Some(Target {
        kind,
        namespace: namespace.map(str::to_string),
        name: name.map(str::to_string),
        status,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(path: &str) -> Option<(&'static str, Option<String>, Option<String>)> {
        target(path)
            .filter(|t| !t.status)
            .map(|t| (t.kind.plural, t.namespace, t.name))
    }

    #[test]
    fn paths_name_collections_and_objects_in_their_scope() {
        let s = |v: &str| Some(v.to_string());
        assert_eq!(
            named("/apis/resource.k8s.io/v1/resourceslices"),
            Some(("resourceslices", None, None))
        );
        assert_eq!(
            named("/apis/resource.k8s.io/v1/namespaces/team/resourceclaimtemplates/t"),
            Some(("resourceclaimtemplates", s("team"), s("t")))
        );
        assert_eq!(
            named("/api/v1/resourcequotas"),
            Some(("resourcequotas", None, None))
        );
        assert_eq!(named("/api/v1/nodes/n"), Some(("nodes", None, s("n"))));
        assert_eq!(
            named("/api/v1/namespaces/team/pods"),
            Some(("pods", s("team"), None))
        );
        // A status subresource, of a kind that has one.
        let status = target("/api/v1/namespaces/team/resourcequotas/q/status").unwrap();
        assert!(status.status && status.name.as_deref() == Some("q"));
        // Out of scope, another subresource, another group's version, a kind not served.
        for path in [
            "/api/v1/namespaces/team/nodes/n",
            "/apis/resource.k8s.io/v1/resourceclaims/c",
            "/apis/resource.k8s.io/v1/namespaces/team/resourceclaimtemplates/t/status",
            "/api/v1/namespaces/team/pods/p/log",
            "/apis/resource.k8s.io/v1beta1/resourceslices",
            "/api/v1/namespaces/team/services",
            "/api/v1/namespaces/team",
        ] {
            assert!(target(path).is_none(), "{path}");
        }
    }
}

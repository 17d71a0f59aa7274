//! The kinds the fake serves and the REST paths that name them, as the API server lays them
//! out: `/api/v1/...` for the core group, `/apis/GROUP/VERSION/...` for the others, a
//! namespaced kind's objects under `namespaces/NS/`.

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
}

/// What the kubelet plugin and the webhook read and write.
pub const KINDS: &[Kind] = &[
    Kind {
        group: "",
        version: "v1",
        plural: "nodes",
        list_kind: "NodeList",
        namespaced: false,
        fields: &[],
    },
    Kind {
        group: "",
        version: "v1",
        plural: "resourcequotas",
        list_kind: "ResourceQuotaList",
        namespaced: true,
        fields: &[],
    },
    Kind {
        group: "resource.k8s.io",
        version: "v1",
        plural: "resourceclaims",
        list_kind: "ResourceClaimList",
        namespaced: true,
        fields: &[],
    },
    Kind {
        group: "resource.k8s.io",
        version: "v1",
        plural: "resourceclaimtemplates",
        list_kind: "ResourceClaimTemplateList",
        namespaced: true,
        fields: &[],
    },
    Kind {
        group: "resource.k8s.io",
        version: "v1",
        plural: "resourceslices",
        list_kind: "ResourceSliceList",
        namespaced: false,
        fields: &["spec.nodeName", "spec.driver", "spec.pool.name"],
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
/// across all) or one object of it.
#[derive(Debug)]
pub struct Target {
    pub kind: &'static Kind,
    pub namespace: Option<String>,
    pub name: Option<String>,
}

impl Target {
    /// The namespace its objects are stored under: empty for a cluster-scoped kind.
    pub fn namespace_key(&self) -> String {
        self.namespace.clone().unwrap_or_default()
    }
}

/// What `path` (no query) names, or `None` when it is no collection or object of a served
/// kind (a cluster-scoped kind under a namespace, a namespaced object without one, a
/// subresource).
pub fn target(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (group, version, rest) = match parts.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return None,
    };
    let (namespace, plural, name) = match rest {
        ["namespaces", ns, plural] => (Some(*ns), *plural, None),
        ["namespaces", ns, plural, name] => (Some(*ns), *plural, Some(*name)),
        [plural] => (None, *plural, None),
        [plural, name] => (None, *plural, Some(*name)),
        _ => return None,
    };
    let kind = KINDS
        .iter()
        .find(|k| k.group == group && k.version == version && k.plural == plural)?;
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
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(path: &str) -> Option<(&'static str, Option<String>, Option<String>)> {
        target(path).map(|t| (t.kind.plural, t.namespace, t.name))
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
        // Out of scope, a subresource, another group's version, a kind not served.
        for path in [
            "/api/v1/namespaces/team/nodes/n",
            "/apis/resource.k8s.io/v1/resourceclaims/c",
            "/api/v1/namespaces/team/resourcequotas/q/status",
            "/apis/resource.k8s.io/v1beta1/resourceslices",
            "/api/v1/namespaces/team/pods",
            "/api/v1/namespaces/team",
        ] {
            assert!(named(path).is_none(), "{path}");
        }
    }
}

//! Field and label selectors as the API server reads them from a list's or a watch's query:
//! comma-separated terms, fields `f=v`, `f==v`, `f!=v` over the fields the kind may be
//! selected by, labels the same and `key`, `!key`. Set-based label terms (`in`, `notin`) are
//! refused: the fake does not parse them.

use serde_json::Value;

use crate::kinds::Kind;

/// One label term.
#[derive(Debug, PartialEq)]
enum Label {
    Is(String, String),
    IsNot(String, String),
    Has(String),
    HasNot(String),
}

/// The objects a list or a watch selects; the empty selector selects every one.
#[derive(Debug, Default, PartialEq)]
pub struct Selector {
    /// (field path, equal or not, value).
    fields: Vec<(String, bool, String)>,
    labels: Vec<Label>,
}

/// `term` split at its operator: (left, equal or not, right), or `None` without one.
fn split_term(term: &str) -> Option<(&str, bool, &str)> {
    if let Some((l, r)) = term.split_once("!=") {
        return Some((l.trim(), false, r.trim()));
    }
    let (l, r) = term.split_once("==").or_else(|| term.split_once('='))?;
    Some((l.trim(), true, r.trim()))
}

impl Selector {
    /// The selector of `kind` a query's `fieldSelector` and `labelSelector` say; an error
    /// (the API server's 400) names the term it cannot take.
    pub fn parse(kind: &Kind, fields: Option<&str>, labels: Option<&str>) -> Result<Self, String> {
        let mut s = Selector::default();
        for term in fields
            .unwrap_or("")
            .split(',')
            .filter(|t| !t.trim().is_empty())
        {
            let (field, equal, value) =
                split_term(term).ok_or_else(|| format!("invalid field selector term {term:?}"))?;
            if !["metadata.name", "metadata.namespace"].contains(&field)
                && !kind.fields.contains(&field)
            {
                return Err(format!(
                    "field label not supported for {}: {field}",
                    kind.plural
                ));
            }
            s.fields.push((field.into(), equal, value.into()));
        }
        let labels = labels.unwrap_or("");
        if labels.contains('(') {
            return Err(format!(
                "the fake API server does not parse set-based label selectors: {labels:?}"
            ));
        }
        for term in labels.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            s.labels.push(match split_term(term) {
                Some((k, true, v)) => Label::Is(k.into(), v.into()),
                Some((k, false, v)) => Label::IsNot(k.into(), v.into()),
                None => match term.strip_prefix('!') {
                    Some(k) => Label::HasNot(k.trim().into()),
                    None => Label::Has(term.into()),
                },
            });
        }
        Ok(s)
    }

    /// Whether `object` is selected: a field it lacks reads as empty, as the API server's
    /// field sets have it.
    pub fn matches(&self, object: &Value) -> bool {
        let fields = self.fields.iter().all(|(path, equal, value)| {
            let at = path.split('.').fold(object, |v, part| &v[part]);
            (at.as_str().unwrap_or("") == value) == *equal
        });
        let label = |k: &str| object["metadata"]["labels"][k].as_str();
        fields
            && self.labels.iter().all(|l| match l {
                Label::Is(k, v) => label(k) == Some(v.as_str()),
                Label::IsNot(k, v) => label(k) != Some(v.as_str()),
                Label::Has(k) => label(k).is_some(),
                Label::HasNot(k) => label(k).is_none(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slices() -> &'static Kind {
        Kind::named("resourceslices").unwrap()
    }

    #[test]
    fn terms_select_by_field_and_label_and_unknown_fields_are_refused() {
        let slice = json!({"metadata": {"name": "a", "labels": {"app": "x", "tier": "gpu"}},
            "spec": {"nodeName": "n1", "driver": "gpuslice.io"}});
        let yes = |f: Option<&str>, l: Option<&str>| {
            Selector::parse(slices(), f, l).unwrap().matches(&slice)
        };
        assert!(yes(None, None));
        assert!(yes(Some("spec.nodeName=n1,spec.driver==gpuslice.io"), None));
        assert!(!yes(Some("spec.nodeName=n2"), None));
        assert!(yes(Some("spec.nodeName!=n2"), None));
        // An absent field reads as empty.
        assert!(yes(Some("spec.pool.name="), None));
        assert!(yes(None, Some("app=x, tier")));
        assert!(!yes(None, Some("app!=x")));
        assert!(yes(None, Some("!missing")));
        assert!(!yes(None, Some("missing")));
        for (f, l) in [
            (Some("spec.devices=x"), None),
            (Some("spec.nodeName"), None),
            (None, Some("app in (x,y)")),
        ] {
            assert!(Selector::parse(slices(), f, l).is_err(), "{f:?} {l:?}");
        }
        let templates = Kind::named("resourceclaimtemplates").unwrap();
        assert!(Selector::parse(templates, Some("spec.nodeName=n1"), None).is_err());
        assert!(Selector::parse(templates, Some("metadata.namespace=team"), None).is_ok());
    }
}

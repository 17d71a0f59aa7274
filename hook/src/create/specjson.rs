//! The OCI spec as gpuslice edits it, without re-encoding what it does not edit: the spec
//! edit works on a `serde_json::Value` view in which every part the CDI injection does not
//! read (unknown fields, `root`, `linux.seccomp`, …) and every value `Value` cannot hold as
//! written (`12345678901234567890123`, `1E+2`, `-0`, a string with a lone surrogate) stands
//! as a placeholder for its original text (`serde_json::value::RawValue`), written back
//! verbatim. serde_json reads the raw parts without a nesting limit.

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// Starts every placeholder string of the view; a genuine string starting with it is kept
/// raw too, so none is mistaken for a placeholder.
const MARKER: &str = "\u{0}gpuslice-kept:";
/// Top-level members the edit reads or writes (the CDI injection's parts and annotations).
const EDITED: [&str; 4] = ["process", "mounts", "hooks", "annotations"];
/// Members of `linux` the CDI injection reads or writes.
const EDITED_LINUX: [&str; 4] = ["devices", "resources", "intelRdt", "netDevices"];
/// Nesting below which the view keeps raw text: the injection reads 4 levels deep.
const MAX_VIEW_DEPTH: usize = 16;

/// The spec could not be read as a JSON object.
#[derive(Debug, thiserror::Error)]
pub enum SpecJsonError {
    #[error("invalid UTF-8 at byte {at}")]
    Utf8 { at: usize },
    #[error("{0}")]
    Json(#[from] serde_json::Error),
}

/// A JSON object's members in document order, values unparsed.
struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(map.size_hint().unwrap_or(0));
                while let Some(entry) = map.next_entry::<String, &'de RawValue>()? {
                    out.push(entry);
                }
                Ok(Members(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// An OCI spec's text and the raw parts its view stands for.
pub struct SpecText<'a> {
    members: Vec<(String, &'a RawValue)>,
    kept: Vec<&'a RawValue>,
}

impl<'a> SpecText<'a> {
    /// Reads the top level of `input`, which must be a JSON object.
    pub fn parse(input: &'a str) -> Result<SpecText<'a>, SpecJsonError> {
        let Members(members) = serde_json::from_str(input)?;
        Ok(SpecText {
            members,
            kept: Vec::new(),
        })
    }

    /// The text of `input` for [`SpecText::parse`]: invalid UTF-8 replaced by U+FFFD as runc
    /// reads it, with the offset of the first invalid byte, if any (a spec that is edited
    /// must be valid UTF-8: the replacement would change it).
    pub fn text(input: &[u8]) -> (std::borrow::Cow<'_, str>, Option<SpecJsonError>) {
        let invalid = std::str::from_utf8(input)
            .err()
            .map(|e| SpecJsonError::Utf8 {
                at: e.valid_up_to(),
            });
        (String::from_utf8_lossy(input), invalid)
    }

    /// The view of the top-level member `key` (the last one, as runc reads duplicates).
    pub fn member(&mut self, key: &str) -> Result<Option<Value>, SpecJsonError> {
        let Some(raw) = self
            .members
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|m| m.1)
        else {
            return Ok(None);
        };
        self.view(raw, 1, true).map(Some)
    }

    /// The view of the whole spec: the parts the edit touches as values, the rest kept.
    pub fn view_all(&mut self) -> Result<Value, SpecJsonError> {
        let mut root = Map::new();
        for i in 0..self.members.len() {
            let (key, raw) = (self.members[i].0.clone(), self.members[i].1);
            let value = if EDITED.contains(&key.as_str()) {
                self.view(raw, 1, true)?
            } else if key == "linux" && raw.get().starts_with('{') {
                let Members(linux) = serde_json::from_str(raw.get())?;
                let mut part = Map::new();
                for (k, v) in linux {
                    let expand = EDITED_LINUX.contains(&k.as_str());
                    part.insert(k, self.view(v, 2, expand)?);
                }
                Value::Object(part)
            } else {
                self.keep(raw)
            };
            root.insert(key, value);
        }
        Ok(Value::Object(root))
    }

    fn keep(&mut self, raw: &'a RawValue) -> Value {
        self.kept.push(raw);
        Value::String(format!("{MARKER}{}", self.kept.len() - 1))
    }

    fn view(
        &mut self,
        raw: &'a RawValue,
        depth: usize,
        expand: bool,
    ) -> Result<Value, SpecJsonError> {
        let text = raw.get();
        let expand = expand && depth < MAX_VIEW_DEPTH;
        Ok(match text.as_bytes().first() {
            Some(b'{') if expand => {
                let Members(members) = serde_json::from_str(text)?;
                let mut map = Map::new();
                for (k, v) in members {
                    let v = self.view(v, depth + 1, true)?;
                    map.insert(k, v);
                }
                Value::Object(map)
            }
            Some(b'[') if expand => {
                let items: Vec<&'a RawValue> = serde_json::from_str(text)?;
                let mut out = Vec::with_capacity(items.len());
                for v in items {
                    out.push(self.view(v, depth + 1, true)?);
                }
                Value::Array(out)
            }
            Some(b'{' | b'[') => self.keep(raw),
            Some(b'"') => match serde_json::from_str::<String>(text) {
                Ok(s) if !s.starts_with(MARKER) => Value::String(s),
                // A lone surrogate, or a string that looks like a placeholder.
                _ => self.keep(raw),
            },
            Some(b'-' | b'0'..=b'9') => {
                let v: Value = serde_json::from_str(text)?;
                if serde_json::to_string(&v).is_ok_and(|t| t == text) {
                    v
                } else {
                    self.keep(raw)
                }
            }
            _ => serde_json::from_str(text)?,
        })
    }

    /// Encodes `view` (a view of this spec, edited), its placeholders as the original text.
    pub fn encode(&self, view: &Value) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(&Emit {
            value: view,
            kept: &self.kept,
        })
    }
}

/// Serializes a view, placeholders as their raw text.
struct Emit<'v, 'a> {
    value: &'v Value,
    kept: &'v [&'a RawValue],
}

impl Serialize for Emit<'_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let child = |value| Emit {
            value,
            kept: self.kept,
        };
        match self.value {
            Value::String(text) => {
                let raw = text
                    .strip_prefix(MARKER)
                    .and_then(|i| i.parse::<usize>().ok())
                    .and_then(|i| self.kept.get(i));
                match raw {
                    Some(raw) => raw.serialize(s),
                    None => text.serialize(s),
                }
            }
            Value::Array(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for v in items {
                    seq.serialize_element(&child(v))?;
                }
                seq.end()
            }
            Value::Object(map) => {
                let mut m = s.serialize_map(Some(map.len()))?;
                for (k, v) in map {
                    m.serialize_entry(k, &child(v))?;
                }
                m.end()
            }
            other => other.serialize(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ODD: &str = r#"{"big":12345678901234567890123,"exp":1E+2,"neg0":-0,"frac":1.50,"lone":"\udc00","fake":"\u0000gpuslice-kept:0"}"#;

    #[test]
    fn untouched_and_odd_values_are_written_as_read() {
        let input = format!(
            r#"{{"ociVersion":"1.2.0","x-vendor":{ODD},"process":{{"env":["A=1"],"user":{{"uid":0,"gid":0}},"x":{ODD},"oomScoreAdj":-0}},"linux":{{"resources":{{"x":{ODD}}},"seccomp":{{"defaultAction":"SCMP_ACT_ERRNO","n":1E+2}}}}}}"#
        );
        let mut spec = SpecText::parse(&input).expect("parse");
        let mut view = spec.view_all().expect("view");
        assert_eq!(view["process"]["env"], serde_json::json!(["A=1"]));
        assert_eq!(view["process"]["user"]["uid"], 0);
        view["process"]["env"]
            .as_array_mut()
            .expect("env")
            .push("B=2".into());
        let out = String::from_utf8(spec.encode(&view).expect("encode")).expect("utf8");
        assert_eq!(out, input.replace(r#"["A=1"]"#, r#"["A=1","B=2"]"#));
    }

    #[test]
    fn deep_nesting_is_kept_raw_and_refusals_name_the_problem() {
        let deep = format!("{}1{}", "[".repeat(5000), "]".repeat(5000));
        let input = format!(r#"{{"process":{{"x":{deep}}},"y":{deep}}}"#);
        let mut spec = SpecText::parse(&input).expect("no depth limit");
        let view = spec.view_all().expect("view");
        assert_eq!(spec.encode(&view).expect("encode"), input.as_bytes());
        let (text, invalid) = SpecText::text(b"{\"a\":\"\xff\"}");
        assert!(matches!(invalid, Some(SpecJsonError::Utf8 { at: 6 })));
        assert_eq!(text, "{\"a\":\"\u{fffd}\"}");
        assert!(SpecText::parse("[1]").is_err());
        assert!(SpecText::parse("{\"a\":1} x").is_err());
    }
}

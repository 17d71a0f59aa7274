//! Navigation of an OCI runtime spec held as `serde_json::Value`: finds or creates the
//! objects and arrays edits go into, and reports a wrong shape with the field's path.
//! A `null` counts as absent, as it does for Go's decoder.

use serde_json::{Map, Value};

use super::InjectError;

fn shape(path: &[&str], expected: &'static str) -> InjectError {
    InjectError::Shape {
        field: path.join("."),
        expected,
    }
}

/// The object at `path` below the root object, created (with its parents) when absent.
pub(crate) fn object_mut<'a>(
    root: &'a mut Value,
    path: &[&str],
) -> Result<&'a mut Map<String, Value>, InjectError> {
    let mut current = root.as_object_mut().ok_or(InjectError::NotAnObject)?;
    for (depth, key) in path.iter().enumerate() {
        let slot = current.entry(key.to_string()).or_insert(Value::Null);
        if slot.is_null() {
            *slot = Value::Object(Map::new());
        }
        current = slot
            .as_object_mut()
            .ok_or_else(|| shape(&path[..=depth], "an object"))?;
    }
    Ok(current)
}

/// The array at `path` (at least one key) below the root object, created when absent.
pub(crate) fn array_mut<'a>(
    root: &'a mut Value,
    path: &[&str],
) -> Result<&'a mut Vec<Value>, InjectError> {
    let (last, parents) = path.split_last().ok_or(InjectError::NotAnObject)?;
    let parent = object_mut(root, parents)?;
    let slot = parent.entry(last.to_string()).or_insert(Value::Null);
    if slot.is_null() {
        *slot = Value::Array(Vec::new());
    }
    slot.as_array_mut().ok_or_else(|| shape(path, "an array"))
}

/// The unsigned 32-bit number at `path`, `None` when absent.
pub(crate) fn u32_at(root: &Value, path: &[&str]) -> Result<Option<u32>, InjectError> {
    let mut current = root;
    for key in path {
        match current.get(key) {
            None | Some(Value::Null) => return Ok(None),
            Some(v) => current = v,
        }
    }
    current
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .map(Some)
        .ok_or_else(|| shape(path, "a number from 0 to 4294967295"))
}

/// The string field `key` of element `index` of the array at `array_path`.
pub(crate) fn string_field<'a>(
    item: &'a Value,
    array_path: &str,
    index: usize,
    key: &str,
) -> Result<&'a str, InjectError> {
    item.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| InjectError::Shape {
            field: format!("{array_path}[{index}].{key}"),
            expected: "a string",
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn creates_missing_and_null() {
        let mut v = json!({"linux": null});
        array_mut(&mut v, &["linux", "resources", "devices"])
            .expect("create")
            .push(json!(1));
        assert_eq!(v, json!({"linux": {"resources": {"devices": [1]}}}));
    }

    #[test]
    fn wrong_shapes_name_the_field() {
        let mut v = json!({"linux": {"devices": {}}});
        let e = array_mut(&mut v, &["linux", "devices"])
            .expect_err("not an array")
            .to_string();
        assert!(e.contains("linux.devices is not an array"), "{e}");
        let mut v = json!({"process": "x"});
        let e = object_mut(&mut v, &["process", "user"])
            .expect_err("not an object")
            .to_string();
        assert!(e.contains("process is not an object"), "{e}");
        let mut v = json!([]);
        assert!(matches!(
            object_mut(&mut v, &["a"]),
            Err(InjectError::NotAnObject)
        ));
        let v = json!({"process": {"user": {"uid": -1}}});
        assert!(u32_at(&v, &["process", "user", "uid"]).is_err());
        assert_eq!(
            u32_at(&json!({}), &["process", "user", "uid"]).expect("absent"),
            None
        );
    }
}

//! Application of one set of container edits to an OCI spec `Value`, following the
//! reference library's `ContainerEdits.Apply`: environment, device nodes with their cgroup
//! rules, net devices, mounts, hooks, Intel RDT, additional groups, in that order.
//!
//! Beyond the library, re-applying the same edits is idempotent: an identical cgroup rule
//! or hook already present is moved to the end rather than duplicated, and every device
//! entry or mount with the same path is replaced (the library replaces the first).

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use super::mounts::apply_mounts;
use super::oci::{array_mut, object_mut, string_field, u32_at};
use super::stat::{DeviceStat, HostDeviceType};
use super::InjectError;
use crate::model::{ContainerEdits, DeviceNode, Hook, IntelRdt};

/// Applies `edits` to `root` in place. It touches only `process`, `mounts`, `hooks` and
/// `linux.{devices,resources,intelRdt,netDevices}` (the parts `scratch` copies); the caller
/// works on that copy and keeps it only on success.
pub(crate) fn apply(
    root: &mut Value,
    edits: &ContainerEdits,
    stat: &dyn DeviceStat,
) -> Result<(), InjectError> {
    if !root.is_object() {
        return Err(InjectError::NotAnObject);
    }
    apply_env(root, &edits.env)?;
    apply_device_nodes(root, &edits.device_nodes, stat)?;
    for dev in &edits.net_devices {
        object_mut(root, &["linux", "netDevices"])?
            .insert(dev.host_interface_name.clone(), json!({ "name": dev.name }));
    }
    apply_mounts(root, &edits.mounts)?;
    for hook in &edits.hooks {
        let list = array_mut(root, &["hooks", hook.hook_name.as_str()])?;
        push_last(list, hook_to_oci(hook));
    }
    if let Some(rdt) = &edits.intel_rdt {
        object_mut(root, &["linux"])?.insert("intelRdt".into(), rdt_to_oci(rdt));
    }
    apply_additional_gids(root, &edits.additional_gids)?;
    Ok(())
}

/// Appends `item`, first removing any equal element so it appears once, last.
fn push_last(list: &mut Vec<Value>, item: Value) {
    list.retain(|existing| *existing != item);
    list.push(item);
}

fn env_key(entry: &str) -> &str {
    entry.split_once('=').map_or(entry, |(k, _)| k)
}

fn apply_env(root: &mut Value, env: &[String]) -> Result<(), InjectError> {
    if env.is_empty() {
        return Ok(());
    }
    let list = array_mut(root, &["process", "env"])?;
    let mut index: HashMap<String, usize> = HashMap::with_capacity(list.len() + env.len());
    for (i, entry) in list.iter().enumerate() {
        let text = entry.as_str().ok_or_else(|| InjectError::Shape {
            field: format!("process.env[{i}]"),
            expected: "a string",
        })?;
        index.insert(env_key(text).to_string(), i);
    }
    for entry in env {
        let key = env_key(entry);
        match index.get(key) {
            Some(&i) => list[i] = Value::String(entry.clone()),
            None => {
                list.push(Value::String(entry.clone()));
                index.insert(key.to_string(), list.len() - 1);
            }
        }
    }
    Ok(())
}

/// Type, major and minor of a node, taken from the host node when the edit leaves them
/// out (the library's `fillMissingInfo`).
fn resolve_node(
    node: &DeviceNode,
    stat: &dyn DeviceStat,
) -> Result<(String, i64, i64), InjectError> {
    let host_path = node.host_path.as_deref().unwrap_or(&node.path);
    let major = node.major.unwrap_or(0);
    let minor = node.minor.unwrap_or(0);
    if let Some(t) = node.device_type.as_deref() {
        if major != 0 || t == "p" {
            return Ok((t.to_string(), major, minor));
        }
    }
    let host = stat
        .stat(std::path::Path::new(host_path))
        .map_err(|source| InjectError::Stat {
            path: node.path.clone(),
            host_path: host_path.to_string(),
            source,
        })?
        .ok_or_else(|| InjectError::NotADevice {
            path: node.path.clone(),
            host_path: host_path.to_string(),
        })?;
    let found = host.device_type.as_str();
    let device_type = match node.device_type.as_deref() {
        None => found.to_string(),
        // `u` is an unbuffered character device: the host reports it as `c`.
        Some(t) if t == found || (t == "u" && host.device_type == HostDeviceType::Char) => {
            t.to_string()
        }
        Some(t) => {
            return Err(InjectError::TypeMismatch {
                path: node.path.clone(),
                host_path: host_path.to_string(),
                declared: t.to_string(),
                found: found.to_string(),
            })
        }
    };
    if major == 0 && device_type != "p" {
        return Ok((device_type, host.major, host.minor));
    }
    Ok((device_type, major, minor))
}

fn apply_device_nodes(
    root: &mut Value,
    nodes: &[DeviceNode],
    stat: &dyn DeviceStat,
) -> Result<(), InjectError> {
    if nodes.is_empty() {
        return Ok(());
    }
    // The library gives nodes without an owner the process's uid/gid when non-zero.
    let process_uid = u32_at(root, &["process", "user", "uid"])?.filter(|id| *id > 0);
    let process_gid = u32_at(root, &["process", "user", "gid"])?.filter(|id| *id > 0);
    for node in nodes {
        let (device_type, major, minor) = resolve_node(node, stat)?;
        let mut dev = Map::new();
        dev.insert("path".into(), node.path.clone().into());
        dev.insert("type".into(), device_type.clone().into());
        dev.insert("major".into(), major.into());
        dev.insert("minor".into(), minor.into());
        if let Some(mode) = node.file_mode {
            dev.insert("fileMode".into(), mode.into());
        }
        if let Some(uid) = node.uid.or(process_uid) {
            dev.insert("uid".into(), uid.into());
        }
        if let Some(gid) = node.gid.or(process_gid) {
            dev.insert("gid".into(), gid.into());
        }

        let devices = array_mut(root, &["linux", "devices"])?;
        let mut kept = Vec::with_capacity(devices.len() + 1);
        for (i, existing) in devices.drain(..).enumerate() {
            if string_field(&existing, "linux.devices", i, "path")? != node.path {
                kept.push(existing);
            }
        }
        kept.push(Value::Object(dev));
        *devices = kept;

        if device_type == "b" || device_type == "c" {
            let access = node
                .permissions
                .clone()
                .unwrap_or_else(|| "rwm".to_string());
            let rule = json!({
                "allow": true,
                "type": device_type,
                "major": major,
                "minor": minor,
                "access": access,
            });
            push_last(array_mut(root, &["linux", "resources", "devices"])?, rule);
        }
    }
    Ok(())
}

fn hook_to_oci(hook: &Hook) -> Value {
    let mut h = Map::new();
    h.insert("path".into(), hook.path.clone().into());
    if !hook.args.is_empty() {
        h.insert("args".into(), hook.args.clone().into());
    }
    if !hook.env.is_empty() {
        h.insert("env".into(), hook.env.clone().into());
    }
    if let Some(t) = hook.timeout {
        h.insert("timeout".into(), t.into());
    }
    Value::Object(h)
}

fn rdt_to_oci(rdt: &IntelRdt) -> Value {
    let mut r = Map::new();
    for (key, value) in [
        ("closID", &rdt.clos_id),
        ("l3CacheSchema", &rdt.l3_cache_schema),
        ("memBwSchema", &rdt.mem_bw_schema),
    ] {
        if let Some(v) = value.as_ref().filter(|v| !v.is_empty()) {
            r.insert(key.into(), v.clone().into());
        }
    }
    if !rdt.schemata.is_empty() {
        r.insert("schemata".into(), rdt.schemata.clone().into());
    }
    if rdt.enable_monitoring {
        r.insert("enableMonitoring".into(), true.into());
    }
    Value::Object(r)
}

fn apply_additional_gids(root: &mut Value, gids: &[u32]) -> Result<(), InjectError> {
    // The library skips gid 0 and adds each other gid once.
    if gids.iter().all(|g| *g == 0) {
        return Ok(());
    }
    let list = array_mut(root, &["process", "user", "additionalGids"])?;
    for gid in gids.iter().copied().filter(|g| *g != 0) {
        let value = Value::from(gid);
        if !list.contains(&value) {
            list.push(value);
        }
    }
    Ok(())
}

//! What the API server holds for gpuslice's GPUs, computed by the tests from the raw objects
//! (never through the console's code): the ResourceSlices' devices and the allocated claims'
//! `consumedCapacity`, so the console's figures are checked against an independent sum.

use std::collections::BTreeMap;

use gpuslice_config::quantity::parse_kube_quantity;
use serde_json::Value;

use crate::kube::KubeCluster;

/// One published GPU: what its ResourceSlice offers and what allocated claims consume of it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PublishedGpu {
    pub node: String,
    pub index: u64,
    pub uuid: String,
    pub model: String,
    pub memory: u64,
    pub cores: u64,
    pub memory_allocated: u64,
    pub cores_allocated: u64,
    /// `namespace/name` of the claims on it, sorted.
    pub claims: Vec<String>,
}

/// One allocated claim's share of one GPU.
#[derive(Debug, Clone)]
pub struct Share {
    pub claim: String,
    pub uuid: String,
    pub memory: u64,
    pub cores: u64,
}

/// A Kubernetes quantity string as a whole number (bytes, or cores' percent points).
pub fn quantity(v: &Value) -> u64 {
    parse_kube_quantity(v.as_str().unwrap_or_else(|| panic!("not a quantity: {v}")))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The GPUs of driver `gpuslice.io` by (node, device name), and the claims' shares of them.
pub fn published(cluster: &KubeCluster) -> (BTreeMap<(String, String), PublishedGpu>, Vec<Share>) {
    let mut gpus = BTreeMap::new();
    for s in cluster.get_json(&["resourceslices"])["items"]
        .as_array()
        .expect("resourceslices: items")
    {
        if s["spec"]["driver"] != "gpuslice.io" {
            continue;
        }
        let pool = s["spec"]["pool"]["name"]
            .as_str()
            .expect("pool name")
            .to_string();
        for d in s["spec"]["devices"].as_array().expect("devices") {
            let a = &d["attributes"];
            gpus.insert(
                (
                    pool.clone(),
                    d["name"].as_str().expect("device name").to_string(),
                ),
                PublishedGpu {
                    node: pool.clone(),
                    index: a["index"]["int"].as_u64().expect("index attribute"),
                    uuid: a["uuid"]["string"]
                        .as_str()
                        .expect("uuid attribute")
                        .to_string(),
                    model: a["productName"]["string"]
                        .as_str()
                        .expect("productName attribute")
                        .to_string(),
                    memory: quantity(&d["capacity"]["memory"]["value"]),
                    cores: quantity(&d["capacity"]["cores"]["value"]),
                    ..Default::default()
                },
            );
        }
    }
    let mut shares = Vec::new();
    for c in cluster.get_json(&["resourceclaims", "-A"])["items"]
        .as_array()
        .expect("resourceclaims: items")
    {
        let name = format!(
            "{}/{}",
            c["metadata"]["namespace"].as_str().expect("namespace"),
            c["metadata"]["name"].as_str().expect("name")
        );
        for r in c["status"]["allocation"]["devices"]["results"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let key = (
                r["pool"].as_str().expect("pool").to_string(),
                r["device"].as_str().expect("device").to_string(),
            );
            let g = gpus
                .get_mut(&key)
                .unwrap_or_else(|| panic!("claim {name} on an unpublished device: {r}"));
            let memory = quantity(&r["consumedCapacity"]["memory"]);
            let cores = quantity(&r["consumedCapacity"]["cores"]);
            g.memory_allocated += memory;
            g.cores_allocated += cores;
            g.claims.push(name.clone());
            shares.push(Share {
                claim: name.clone(),
                uuid: g.uuid.clone(),
                memory,
                cores,
            });
        }
    }
    for g in gpus.values_mut() {
        g.claims.sort();
    }
    (gpus, shares)
}

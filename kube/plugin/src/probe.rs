//! What the API server keeps of a ResourceSlice: alpha and beta fields whose feature gate is
//! off are dropped silently, and the version string cannot say which gates are on. One
//! dry-run create (nothing is stored) of a capacity-mode device carrying a taint, read back,
//! answers both questions the plugin has: consumable capacity (`DRAConsumableCapacity`, for
//! `dra.mode: auto`) and device taints (`DRADeviceTaints`, for unhealthy GPUs).

use gpuslice_dra::slices::{build_slices, slice_name, OfferedGpu, SliceError, CAP_MEMORY};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::PostParams;
use kube::Api;

use crate::offer::{HealthTaint, TaintReason};
use crate::publisher::apply_taints;

/// The API server could not be asked (it is retried).
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("{0}")]
    Slice(#[from] SliceError),
    #[error("cannot ask the API server which ResourceSlice fields it keeps (a dry-run create of ResourceSlice {name}): {source}; the plugin needs resource.k8s.io/v1 (Kubernetes 1.34+) and the right to create ResourceSlices")]
    Api { name: String, source: kube::Error },
}

/// The answers of one probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kept {
    /// `allowMultipleAllocations` and the capacities' request policies.
    pub consumable_capacity: bool,
    /// A device's `taints`.
    pub device_taints: bool,
}

/// The slice the probe sends: one capacity-mode device on `node`, tainted.
pub fn probe_slice(node: &str) -> Result<ResourceSlice, SliceError> {
    let gpu = OfferedGpu {
        index: 0,
        uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
        model: "gpuslice probe".into(),
        numa_node: None,
        pcie_root: None,
        memory: 1 << 30,
        cores: 100,
        slots: None,
    };
    let mut slices = build_slices(node, &[gpu], 1, None)?;
    apply_taints(
        &mut slices,
        &[HealthTaint {
            index: 0,
            reason: TaintReason::Xid(79),
            since_s: 0,
            effect: gpuslice_config::TaintEffect::NoSchedule,
        }],
    );
    let mut slice = slices.remove(0);
    // `<node>-gpuslice.io-p`: no longer than the second slice's name, which `build_slices`
    // checked fits, and no real slice's name.
    slice.metadata.name = Some(format!("{}-p", slice_name(node, 0)));
    Ok(slice)
}

/// What `back`, the API server's answer to [`probe_slice`], still carries.
pub fn kept(back: &ResourceSlice) -> Kept {
    let device = back.spec.devices.as_ref().and_then(|d| d.first());
    Kept {
        consumable_capacity: device.is_some_and(|d| {
            d.allow_multiple_allocations == Some(true)
                && d.capacity
                    .as_ref()
                    .and_then(|c| c.get(CAP_MEMORY))
                    .is_some_and(|c| c.request_policy.is_some())
        }),
        device_taints: device.is_some_and(|d| d.taints.as_ref().is_some_and(|t| !t.is_empty())),
    }
}

/// Asks the API server: a dry-run create of [`probe_slice`] for `node`, read back.
pub async fn what_the_api_server_keeps(
    client: &kube::Client,
    node: &str,
) -> Result<Kept, ProbeError> {
    let slice = probe_slice(node)?;
    let name = slice.metadata.name.clone().unwrap_or_default();
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let params = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let back = api
        .create(&params, &slice)
        .await
        .map_err(|source| ProbeError::Api { name, source })?;
    Ok(kept(&back))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_is_named_for_any_node_the_slices_can_be_named_for() {
        use gpuslice_dra::slices::{is_dns_subdomain, MAX_NAME};
        // The longest node name the real slices fit (`<node>-gpuslice.io-1`), and one longer.
        // Labels of 62 letters and dots.
        let longest: String = (0..MAX_NAME - slice_name("", 1).len())
            .map(|i| if i % 63 == 62 { '.' } else { 'n' })
            .collect();
        assert!(is_dns_subdomain(&slice_name(&longest, 1), MAX_NAME));
        let name = probe_slice(&longest).unwrap().metadata.name.unwrap();
        assert!(is_dns_subdomain(&name, MAX_NAME), "{} chars", name.len());
        assert!(name.len() <= slice_name(&longest, 1).len());
        assert_ne!(name, slice_name(&longest, 0));
        assert!(probe_slice(&format!("{longest}n")).is_err());
    }

    #[test]
    fn each_dropped_field_set_is_read_as_its_gate_off() {
        let sent = probe_slice("n1").unwrap();
        assert_eq!(
            kept(&sent),
            Kept {
                consumable_capacity: true,
                device_taints: true
            }
        );
        // What an API server with DRAConsumableCapacity off stores: the device without the
        // sharing fields.
        let mut s = sent.clone();
        let d = &mut s.spec.devices.as_mut().unwrap()[0];
        d.allow_multiple_allocations = None;
        for c in d.capacity.as_mut().unwrap().values_mut() {
            c.request_policy = None;
        }
        assert_eq!(
            kept(&s),
            Kept {
                consumable_capacity: false,
                device_taints: true
            }
        );
        // And with DRADeviceTaints off: no taints.
        let mut s = sent;
        s.spec.devices.as_mut().unwrap()[0].taints = None;
        assert_eq!(
            kept(&s),
            Kept {
                consumable_capacity: true,
                device_taints: false
            }
        );
    }
}

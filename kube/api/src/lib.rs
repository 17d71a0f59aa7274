//! gpuslice's cluster-side DRA vocabulary, shared by the kubelet plugin, the admission webhook
//! and the console: the driver and DeviceClass names, the devices the plugin publishes (their
//! names, attributes and capacities, and the ResourceSlices that carry them), the claims the
//! front ends write for an ask and read back, the opaque parameters of the driver, and the API
//! server client. Nothing here touches a node.

// Tests may panic on unexpected errors; the library itself may not.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod api;
pub mod claim_shape;
pub mod jobs;
pub mod opaque;
pub mod quota;
pub mod slices;

/// The DRA driver name and the DeviceClass name.
pub const DRIVER: &str = "gpuslice.io";
/// The DeviceClass of slot mode.
pub const SLOTS_CLASS: &str = "slots.gpuslice.io";

/// The extended resource names Kubernetes gives every DeviceClass (since 1.37 always on):
/// `deviceclass.resource.kubernetes.io/<class>`. A pod asking one in its limits gets, from
/// the scheduler as it binds it, a claim of that class naming no capacity: gpuslice's
/// devices by a way no pod webhook is sent unless it asks for it.
pub const IMPLICIT_EXTENDED_RESOURCES: [&str; 2] = [EXTENDED_RESOURCE, SLOTS_EXTENDED_RESOURCE];
/// [`DRIVER`]'s extended resource: whole GPUs in capacity mode (a device's default memory is
/// all of it).
pub const EXTENDED_RESOURCE: &str = "deviceclass.resource.kubernetes.io/gpuslice.io";
/// [`SLOTS_CLASS`]'s extended resource: slots of any size.
pub const SLOTS_EXTENDED_RESOURCE: &str = "deviceclass.resource.kubernetes.io/slots.gpuslice.io";

#[cfg(test)]
mod tests {
    #[test]
    fn the_implicit_extended_resources_name_the_device_classes() {
        let classes = [super::DRIVER, super::SLOTS_CLASS];
        for (name, class) in super::IMPLICIT_EXTENDED_RESOURCES.iter().zip(classes) {
            assert_eq!(*name, format!("deviceclass.resource.kubernetes.io/{class}"));
        }
    }
}

//! What a caller asks the registry for: a slice request and the GPU selectors in it.

use std::fmt;

use gpuslice_config::{Policy, Quantity};

use crate::model::{Gpu, Owner};

/// Most GPUs one request may ask for.
pub const MAX_GPUS: u32 = 16;

/// Restricts placement to one GPU, by index or UUID.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Selector {
    Index(u32),
    /// `GPU-<uuid>`, compared case-insensitively.
    Uuid(String),
}

/// A selector that is neither an index nor a UUID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{value}` is not a GPU selector; accepted: an index (`0`) or a UUID (`GPU-…`)")]
pub struct SelectorError {
    pub value: String,
}

impl Selector {
    /// Parses `3` or `GPU-…` (surrounding spaces ignored).
    pub fn parse(s: &str) -> Result<Selector, SelectorError> {
        let v = s.trim();
        if !v.is_empty() && v.len() <= 10 && v.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(i) = v.parse::<u32>() {
                return Ok(Selector::Index(i));
            }
        }
        if v.len() > 4 && v.as_bytes()[..4].eq_ignore_ascii_case(b"GPU-") {
            return Ok(Selector::Uuid(v.to_string()));
        }
        Err(SelectorError {
            value: s.to_string(),
        })
    }

    /// Parses a comma-separated list (`0,GPU-…`); empty items are refused.
    pub fn parse_list(s: &str) -> Result<Vec<Selector>, SelectorError> {
        s.split(',').map(Selector::parse).collect()
    }

    /// True when this selector names `gpu`.
    pub fn matches(&self, gpu: &Gpu) -> bool {
        match self {
            Selector::Index(i) => gpu.index == *i,
            Selector::Uuid(u) => gpu.uuid.eq_ignore_ascii_case(u),
        }
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Selector::Index(i) => write!(f, "{i}"),
            Selector::Uuid(u) => f.write_str(u),
        }
    }
}

/// A GPU placement leaves out because the driver reported it unhealthy (the create path
/// reads `health.json`), with the line saying so: its index, UUID, XID and time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnhealthyGpu {
    /// `GPU-<uuid>`, compared case-insensitively.
    pub uuid: String,
    /// `GPU 1 (GPU-…) is unhealthy: the driver reported XID 79 at …`.
    pub why: String,
}

/// A request for a slice.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Number of distinct GPUs, 1 to [`MAX_GPUS`].
    pub gpus: u32,
    /// Memory per GPU; `None` books the whole GPU's memory.
    pub memory: Option<Quantity>,
    /// Compute share per GPU in percent, 0 (none booked) to 100.
    pub cores: u8,
    /// Only these GPUs (any of them); empty means any GPU.
    pub selectors: Vec<Selector>,
    /// Only GPUs whose model contains this text, case-insensitively.
    pub model: Option<String>,
    /// Overrides the node's placement policy.
    pub policy: Option<Policy>,
    pub owner: Owner,
    /// Book whole GPUs (all memory, 100% cores, nothing else on them); `memory` and `cores`
    /// are then ignored.
    pub whole_gpu: bool,
    /// GPUs placed on by no one: a refusal for too few GPUs names those it left out.
    pub unhealthy: Vec<UnhealthyGpu>,
}

impl Request {
    /// One GPU, all of its memory, no compute share, any GPU, for `owner`.
    pub fn new(owner: Owner) -> Request {
        Request {
            gpus: 1,
            memory: None,
            cores: 0,
            selectors: Vec::new(),
            model: None,
            policy: None,
            owner,
            whole_gpu: false,
            unhealthy: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_parse_index_and_uuid_only() {
        assert_eq!(Selector::parse(" 3 "), Ok(Selector::Index(3)));
        assert_eq!(
            Selector::parse_list("0,gpu-ABC"),
            Ok(vec![Selector::Index(0), Selector::Uuid("gpu-ABC".into())])
        );
        // A character across byte 4 is refused, not a panic (the create path aborts on one).
        for bad in [
            "",
            "-1",
            "abc",
            "GPU-",
            "99999999999",
            "0,,1",
            "ab€x",
            "GP€-x",
        ] {
            let e = Selector::parse_list(bad).expect_err(bad);
            assert!(e.to_string().contains("accepted"), "{e}");
        }
        let gpu = Gpu {
            index: 2,
            uuid: "GPU-abc".into(),
            model: "m".into(),
            memory_total: 1,
            minor: 2,
            pci_bus_id: None,
            numa_node: None,
            pcie_root: None,
        };
        assert!(Selector::Uuid("gpu-ABC".into()).matches(&gpu));
        assert!(Selector::Index(2).matches(&gpu));
        assert!(!Selector::Index(1).matches(&gpu));
    }
}

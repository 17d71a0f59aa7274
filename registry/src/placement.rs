//! Placement as a pure function: which GPUs a request lands on, given the inventory and the
//! live reservations, or a one-line refusal saying what was asked and what is free.
//!
//! Filter (selectors, model text, then the request's unhealthy GPUs left out), fit (free
//! memory under the overcommit factor, free cores, the slice cap, whole-GPU exclusivity),
//! score (`binpack`: fullest first; `spread`: emptiest first), then take N distinct GPUs;
//! ties go to the lower index.

use std::fmt;

use gpuslice_config::{format_bytes, PlacementConfig, Policy, Quantity};

use crate::load::{gpu_loads, memory_capacity, GpuLoad};
use crate::model::{Booking, Gpu, Inventory, Reservation};
use crate::request::{Request, UnhealthyGpu, MAX_GPUS};

/// Why a request was refused; the counter key in `refused_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefusalReason {
    /// Not enough free capacity on the eligible GPUs.
    NoFit,
    /// A selector or model text matches no GPU, or too few.
    BadSelector,
    /// The request itself is out of range.
    BadRequest,
    /// The registry holds no inventory yet.
    NoInventory,
    /// Enough GPUs match, but too few of them are healthy (`Request::unhealthy`).
    Unhealthy,
}

impl RefusalReason {
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::NoFit => "no-fit",
            RefusalReason::BadSelector => "bad-selector",
            RefusalReason::BadRequest => "bad-request",
            RefusalReason::NoInventory => "no-inventory",
            RefusalReason::Unhealthy => "unhealthy",
        }
    }
}

impl fmt::Display for RefusalReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refused request: one line for the user.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    pub reason: RefusalReason,
    pub message: String,
}

fn refuse(reason: RefusalReason, message: String) -> Refusal {
    Refusal { reason, message }
}

/// A GPU that passed the filter, with what is booked on it.
struct Candidate<'a> {
    gpu: &'a Gpu,
    load: GpuLoad,
    capacity: u64,
}

impl Candidate<'_> {
    fn free_memory(&self) -> u64 {
        self.capacity.saturating_sub(self.load.memory)
    }

    fn free_cores(&self) -> u32 {
        100u32.saturating_sub(self.load.cores)
    }

    /// Booked memory per million of capacity: the fullness score.
    fn fullness(&self) -> u64 {
        let cap = u128::from(self.capacity.max(1));
        let used = u128::from(self.load.memory).min(cap);
        (used * 1_000_000 / cap) as u64
    }
}

/// Places `request`: one booking per chosen GPU, in the order chosen.
pub fn place(
    inventory: &Inventory,
    reservations: &[Reservation],
    config: &PlacementConfig,
    request: &Request,
) -> Result<Vec<Booking>, Refusal> {
    validate(request)?;
    if inventory.gpus.is_empty() {
        return Err(refuse(
            RefusalReason::NoInventory,
            "the registry holds no GPU inventory: run `gpuslice cdi generate`".into(),
        ));
    }
    let (eligible, left_out) = filter(inventory, request)?;
    let loads = gpu_loads(reservations);
    let candidates: Vec<Candidate> = eligible
        .into_iter()
        .map(|gpu| Candidate {
            gpu,
            load: loads.get(gpu.uuid.as_str()).copied().unwrap_or_default(),
            capacity: memory_capacity(gpu.memory_total, config.memory_overcommit),
        })
        .collect();
    let mut fits: Vec<&Candidate> = candidates
        .iter()
        .filter(|c| fits(c, request, config))
        .collect();
    let policy = request.policy.unwrap_or(config.policy);
    fits.sort_by(|a, b| {
        let by_fullness = match policy {
            Policy::Binpack => b
                .fullness()
                .cmp(&a.fullness())
                .then(b.load.cores.cmp(&a.load.cores)),
            Policy::Spread => a
                .fullness()
                .cmp(&b.fullness())
                .then(a.load.cores.cmp(&b.load.cores)),
        };
        by_fullness.then(a.gpu.index.cmp(&b.gpu.index))
    });
    let wanted = request.gpus as usize;
    if fits.len() < wanted {
        return Err(refuse(
            RefusalReason::NoFit,
            no_fit_message(&candidates, request, config) + &unhealthy_note(&left_out),
        ));
    }
    Ok(fits[..wanted]
        .iter()
        .map(|c| Booking {
            index: c.gpu.index,
            uuid: c.gpu.uuid.clone(),
            memory: needed_memory(c.gpu, request),
            cores: needed_cores(request),
            unknown: Default::default(),
        })
        .collect())
}

fn validate(request: &Request) -> Result<(), Refusal> {
    let bad = |m: String| Err(refuse(RefusalReason::BadRequest, m));
    if !(1..=MAX_GPUS).contains(&request.gpus) {
        return bad(format!(
            "{} GPUs asked for; accepted: 1 to {MAX_GPUS}",
            request.gpus
        ));
    }
    if request.whole_gpu {
        return Ok(());
    }
    if request.cores > 100 {
        return bad(format!(
            "{}% cores asked for; accepted: 0 to 100",
            request.cores
        ));
    }
    match request.memory {
        Some(Quantity::Bytes(0)) => {
            bad("0 bytes of memory asked for; accepted: more than 0 bytes or 1% to 100%".into())
        }
        Some(Quantity::Percent(p)) if !(1..=100).contains(&p) => {
            bad(format!("{p}% memory asked for; accepted: 1% to 100%"))
        }
        _ => Ok(()),
    }
}

/// The lines of the unhealthy GPUs placement left out, and what that means.
fn unhealthy_lines(left_out: &[&UnhealthyGpu]) -> String {
    let whys: Vec<&str> = left_out.iter().map(|u| u.why.as_str()).collect();
    format!(
        "{}; gpuslice gives an unhealthy GPU no new work until the driver reports it healthy again (see `gpuslice status`)",
        whys.join("; ")
    )
}

/// What a refusal for another reason adds for the unhealthy GPUs placement left out.
fn unhealthy_note(left_out: &[&UnhealthyGpu]) -> String {
    if left_out.is_empty() {
        return String::new();
    }
    format!("; left out: {}", unhealthy_lines(left_out))
}

/// The healthy GPUs the selectors and model text allow, in index order, and the unhealthy
/// ones they allow, which are left out.
fn filter<'a>(
    inventory: &'a Inventory,
    request: &'a Request,
) -> Result<(Vec<&'a Gpu>, Vec<&'a UnhealthyGpu>), Refusal> {
    let bad = |m: String| refuse(RefusalReason::BadSelector, m);
    let node = || {
        inventory
            .gpus
            .iter()
            .map(|g| format!("{} ({}, {})", g.index, g.model, g.uuid))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for s in &request.selectors {
        if !inventory.gpus.iter().any(|g| s.matches(g)) {
            return Err(bad(format!(
                "GPU selector `{s}` matches no GPU; GPUs here: {}",
                node()
            )));
        }
    }
    let mut gpus: Vec<&Gpu> = inventory
        .gpus
        .iter()
        .filter(|g| request.selectors.is_empty() || request.selectors.iter().any(|s| s.matches(g)))
        .collect();
    if let Some(text) = request.model.as_deref() {
        let needle = text.to_lowercase();
        gpus.retain(|g| g.model.to_lowercase().contains(&needle));
        if gpus.is_empty() {
            return Err(bad(format!(
                "no selected GPU has a model containing `{text}`; GPUs here: {}",
                node()
            )));
        }
    }
    gpus.sort_by_key(|g| g.index);
    let unhealthy = |g: &Gpu| {
        request
            .unhealthy
            .iter()
            .find(|u| u.uuid.eq_ignore_ascii_case(&g.uuid))
    };
    let left_out: Vec<&UnhealthyGpu> = gpus.iter().filter_map(|g| unhealthy(g)).collect();
    let matched = gpus.len();
    gpus.retain(|g| unhealthy(g).is_none());
    let wanted = request.gpus as usize;
    if gpus.len() < wanted {
        let narrowed = !request.selectors.is_empty() || request.model.is_some();
        let (reason, scope) = if narrowed {
            (RefusalReason::BadSelector, "match the selectors and model")
        } else {
            (RefusalReason::BadRequest, "are on this node")
        };
        if matched >= wanted {
            // Enough GPUs, too few healthy: health refuses, naming the GPUs it left out.
            return Err(refuse(
                RefusalReason::Unhealthy,
                format!(
                    "{} GPUs asked for but only {} of the {matched} GPUs that {scope} are healthy: {}; GPUs here: {}",
                    request.gpus,
                    gpus.len(),
                    unhealthy_lines(&left_out),
                    node()
                ),
            ));
        }
        return Err(refuse(
            reason,
            format!(
                "{} GPUs asked for but only {matched} {scope}{}; GPUs here: {}",
                request.gpus,
                unhealthy_note(&left_out),
                node()
            ),
        ));
    }
    Ok((gpus, left_out))
}

fn needed_memory(gpu: &Gpu, request: &Request) -> u64 {
    match (request.whole_gpu, request.memory) {
        (true, _) | (false, None) => gpu.memory_total,
        (false, Some(q)) => q.resolve(gpu.memory_total),
    }
}

fn needed_cores(request: &Request) -> u8 {
    if request.whole_gpu {
        100
    } else {
        request.cores
    }
}

fn fits(c: &Candidate, request: &Request, config: &PlacementConfig) -> bool {
    if c.load.whole || (request.whole_gpu && c.load.slices > 0) {
        return false;
    }
    if let Some(max) = config.max_slices_per_gpu {
        if c.load.slices >= max {
            return false;
        }
    }
    let memory = needed_memory(c.gpu, request);
    memory <= c.free_memory() && u32::from(needed_cores(request)) <= c.free_cores()
}

fn no_fit_message(candidates: &[Candidate], request: &Request, config: &PlacementConfig) -> String {
    let asked = if request.whole_gpu {
        "a whole GPU (nothing else on it)".to_string()
    } else {
        let memory = match request.memory {
            None => "the whole GPU's memory".to_string(),
            Some(Quantity::Bytes(b)) => format!("{} memory", format_bytes(b)),
            Some(Quantity::Percent(p)) => format!("{p}% memory"),
        };
        if request.cores > 0 {
            format!("{memory} and {}% cores", request.cores)
        } else {
            memory
        }
    };
    let subject = if request.gpus == 1 {
        "no GPU fits".to_string()
    } else {
        format!("no {} GPUs fit", request.gpus)
    };
    let free: Vec<String> = candidates
        .iter()
        .map(|c| {
            let mut s = format!(
                "{} ({}) {}, {}% cores",
                c.gpu.index,
                c.gpu.model,
                format_bytes(c.free_memory()),
                c.free_cores()
            );
            if c.load.whole {
                s.push_str(", booked whole");
            } else if config
                .max_slices_per_gpu
                .is_some_and(|m| c.load.slices >= m)
            {
                s.push_str(&format!(", {} slices (the most allowed)", c.load.slices));
            } else if request.whole_gpu && c.load.slices > 0 {
                s.push_str(&format!(", {} slices", c.load.slices));
            }
            s
        })
        .collect();
    format!("{subject} {asked}: free per GPU: {}", free.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Owner, ReservationState};
    use crate::request::Selector;

    const GI: u64 = 1 << 30;

    fn gpu(index: u32, model: &str, mem: u64) -> Gpu {
        Gpu {
            index,
            uuid: format!("GPU-{index:08}-0000-0000-0000-000000000000"),
            model: model.into(),
            memory_total: mem,
            minor: index,
            pci_bus_id: None,
            numa_node: None,
            pcie_root: None,
        }
    }

    fn inv(gpus: Vec<Gpu>) -> Inventory {
        Inventory { gpus }
    }

    fn held(id: &str, gpu: &Gpu, memory: u64, cores: u8, whole: bool) -> Reservation {
        Reservation {
            id: id.into(),
            state: ReservationState::Pending,
            owner: Owner::container(),
            whole_gpu: whole,
            gpus: vec![Booking {
                index: gpu.index,
                uuid: gpu.uuid.clone(),
                memory,
                cores,
                unknown: Default::default(),
            }],
            created_ms: 0,
            deadline_ms: Some(1),
            bound_ms: None,
            reserved_by: None,
            unknown: Default::default(),
        }
    }

    fn cfg(policy: Policy) -> PlacementConfig {
        PlacementConfig {
            policy,
            memory_overcommit: 1.0,
            max_slices_per_gpu: None,
        }
    }

    fn req(memory: Option<Quantity>, cores: u8) -> Request {
        Request {
            memory,
            cores,
            ..Request::new(Owner::container())
        }
    }

    /// A request naming no GPU on a node whose GPU 1 is unhealthy: placed on the healthy
    /// GPUs, and refused for too few of them under `unhealthy`, naming the GPU left out.
    #[test]
    fn unhealthy_gpus_are_left_out_and_named_when_too_few_remain() {
        let g = vec![gpu(0, "L4", 10 * GI), gpu(1, "L4", 10 * GI)];
        let rs = vec![held("a", &g[0], 4 * GI, 0, false)];
        let i = inv(g.clone());
        let why = format!(
            "GPU 1 ({}) is unhealthy: the driver reported XID 79 at 2026-11-30T00:53:20Z",
            g[1].uuid
        );
        let sick = |r: Request| Request {
            unhealthy: vec![UnhealthyGpu {
                uuid: g[1].uuid.to_lowercase(),
                why: why.clone(),
            }],
            ..r
        };
        // Spread would take the empty GPU 1: it is left out.
        let b = place(
            &i,
            &rs,
            &cfg(Policy::Spread),
            &sick(req(Some(Quantity::Bytes(GI)), 0)),
        )
        .expect("fits on GPU 0");
        assert_eq!(b[0].index, 0);

        let two = sick(Request {
            gpus: 2,
            ..req(Some(Quantity::Bytes(GI)), 0)
        });
        let e = place(&i, &rs, &cfg(Policy::Binpack), &two).expect_err("one healthy");
        assert_eq!(e.reason, RefusalReason::Unhealthy);
        assert_eq!(e.reason.as_str(), "unhealthy");
        assert!(
            e.message.starts_with("2 GPUs asked for but only 1 of the 2 GPUs that are on this node are healthy: GPU 1 (GPU-00000001-")
                && e.message.contains(&why)
                && !e.message.contains('\n'),
            "{}",
            e.message
        );

        // More than the node has: still what the request asks, with the GPU left out named.
        let three = Request {
            gpus: 3,
            ..two.clone()
        };
        let e = place(&i, &rs, &cfg(Policy::Binpack), &three).expect_err("two GPUs");
        assert_eq!(e.reason, RefusalReason::BadRequest);
        assert!(
            e.message.contains(&format!("left out: {why}")),
            "{}",
            e.message
        );

        // Too little room on the healthy GPU: no fit, with the GPU left out named.
        let big = sick(req(Some(Quantity::Bytes(8 * GI)), 0));
        let e = place(&i, &rs, &cfg(Policy::Binpack), &big).expect_err("6Gi free");
        assert_eq!(e.reason, RefusalReason::NoFit);
        assert!(
            e.message.contains(&format!("left out: {why}")),
            "{}",
            e.message
        );
    }

    #[test]
    fn binpack_takes_the_fullest_and_spread_the_emptiest() {
        let g = vec![
            gpu(0, "H200", 10 * GI),
            gpu(1, "H200", 10 * GI),
            gpu(2, "H200", 10 * GI),
        ];
        let rs = vec![
            held("a", &g[1], 6 * GI, 0, false),
            held("b", &g[2], 2 * GI, 0, false),
        ];
        let i = inv(g);
        let r = req(Some(Quantity::Bytes(GI)), 0);
        let b = place(&i, &rs, &cfg(Policy::Binpack), &r).expect("fits");
        assert_eq!(b[0].index, 1);
        let s = place(&i, &rs, &cfg(Policy::Spread), &r).expect("fits");
        assert_eq!(s[0].index, 0);
        // The request's policy overrides the node's.
        let over = Request {
            policy: Some(Policy::Spread),
            ..r.clone()
        };
        assert_eq!(
            place(&i, &rs, &cfg(Policy::Binpack), &over).expect("fits")[0].index,
            0
        );
        // A request that does not fit on the fullest goes to the next fullest.
        let big = req(Some(Quantity::Bytes(5 * GI)), 0);
        assert_eq!(
            place(&i, &rs, &cfg(Policy::Binpack), &big).expect("fits")[0].index,
            2
        );
    }

    #[test]
    fn ties_go_to_the_lower_index_and_n_gpus_are_distinct() {
        let i = inv((0..4).map(|n| gpu(n, "H200", 10 * GI)).collect());
        let r = Request {
            gpus: 3,
            ..req(Some(Quantity::Percent(50)), 10)
        };
        let b = place(&i, &[], &cfg(Policy::Binpack), &r).expect("fits");
        let idx: Vec<u32> = b.iter().map(|b| b.index).collect();
        assert_eq!(idx, vec![0, 1, 2]);
        assert!(b.iter().all(|b| b.memory == 5 * GI && b.cores == 10));
    }

    #[test]
    fn refusal_names_request_and_free_capacity_per_gpu() {
        let g = vec![
            gpu(0, "NVIDIA H200", 20 * GI),
            gpu(1, "NVIDIA H200", 20 * GI),
        ];
        let rs = vec![
            held("a", &g[0], 10 * GI, 30, false),
            held("b", &g[1], 20 * GI, 0, false),
        ];
        let e = place(
            &inv(g),
            &rs,
            &cfg(Policy::Binpack),
            &req(Some(Quantity::Bytes(12 * GI)), 30),
        )
        .expect_err("no fit");
        assert_eq!(e.reason, RefusalReason::NoFit);
        assert_eq!(
            e.message,
            "no GPU fits 12Gi memory and 30% cores: free per GPU: 0 (NVIDIA H200) 10Gi, 70% cores; 1 (NVIDIA H200) 0 B, 100% cores"
        );
    }

    #[test]
    fn cores_and_memory_both_bound_the_fit() {
        let g = vec![gpu(0, "H200", 10 * GI)];
        let rs = vec![held("a", &g[0], GI, 80, false)];
        let i = inv(g);
        assert!(place(
            &i,
            &rs,
            &cfg(Policy::Binpack),
            &req(Some(Quantity::Bytes(GI)), 21)
        )
        .is_err());
        assert!(place(
            &i,
            &rs,
            &cfg(Policy::Binpack),
            &req(Some(Quantity::Bytes(GI)), 20)
        )
        .is_ok());
        assert!(place(
            &i,
            &rs,
            &cfg(Policy::Binpack),
            &req(Some(Quantity::Bytes(9 * GI + 1)), 0)
        )
        .is_err());
        assert!(place(
            &i,
            &rs,
            &cfg(Policy::Binpack),
            &req(Some(Quantity::Bytes(9 * GI)), 0)
        )
        .is_ok());
        // No memory given: the whole GPU's memory, which no longer fits.
        assert!(place(&i, &rs, &cfg(Policy::Binpack), &req(None, 0)).is_err());
    }

    #[test]
    fn overcommit_and_slice_cap() {
        let g = vec![gpu(0, "H200", 10 * GI)];
        let rs = vec![held("a", &g[0], 10 * GI, 0, false)];
        let i = inv(g);
        let mut c = cfg(Policy::Binpack);
        assert!(place(&i, &rs, &c, &req(Some(Quantity::Bytes(5 * GI)), 0)).is_err());
        c.memory_overcommit = 1.5;
        assert!(place(&i, &rs, &c, &req(Some(Quantity::Bytes(5 * GI)), 0)).is_ok());
        assert!(place(&i, &rs, &c, &req(Some(Quantity::Bytes(5 * GI + 1)), 0)).is_err());
        c.max_slices_per_gpu = Some(1);
        let e = place(&i, &rs, &c, &req(Some(Quantity::Bytes(GI)), 0)).expect_err("cap");
        assert!(e.message.contains("1 slices (the most allowed)"), "{e}");
    }

    #[test]
    fn whole_gpu_bookings_are_exclusive_both_ways() {
        let g = vec![gpu(0, "H200", 10 * GI), gpu(1, "H200", 10 * GI)];
        let i = inv(g.clone());
        let whole = Request {
            whole_gpu: true,
            ..req(None, 0)
        };
        let slices = vec![held("a", &g[0], GI, 0, false)];
        let b = place(&i, &slices, &cfg(Policy::Binpack), &whole).expect("GPU 1 is free");
        assert_eq!((b[0].index, b[0].memory, b[0].cores), (1, 10 * GI, 100));
        let both = vec![
            held("a", &g[0], GI, 0, false),
            held("w", &g[1], 10 * GI, 100, true),
        ];
        assert!(place(&i, &both, &cfg(Policy::Binpack), &whole).is_err());
        // A slice never lands on a whole-booked GPU, even with memory to spare there.
        let mut c = cfg(Policy::Binpack);
        c.memory_overcommit = 4.0;
        let w = vec![held("w", &g[1], 10 * GI, 100, true)];
        let b = place(&i, &w, &c, &req(Some(Quantity::Bytes(GI)), 0)).expect("fits on 0");
        assert_eq!(b[0].index, 0);
        let only1 = Request {
            selectors: vec![Selector::Index(1)],
            ..req(Some(Quantity::Bytes(GI)), 0)
        };
        let e = place(&i, &w, &c, &only1).expect_err("whole-booked");
        assert!(e.message.contains("booked whole"), "{e}");
    }

    #[test]
    fn selectors_and_model_filter() {
        let i = inv(vec![
            gpu(0, "NVIDIA A100", 10 * GI),
            gpu(1, "NVIDIA H200", 10 * GI),
        ]);
        let c = cfg(Policy::Binpack);
        let by_model = Request {
            model: Some("h200".into()),
            ..req(Some(Quantity::Bytes(GI)), 0)
        };
        assert_eq!(place(&i, &[], &c, &by_model).expect("fits")[0].index, 1);
        let by_uuid = Request {
            selectors: vec![Selector::Uuid(i.gpus[1].uuid.to_lowercase())],
            ..req(Some(Quantity::Bytes(GI)), 0)
        };
        assert_eq!(place(&i, &[], &c, &by_uuid).expect("fits")[0].index, 1);
        let bad = Request {
            selectors: vec![Selector::Index(7)],
            ..req(None, 0)
        };
        let e = place(&i, &[], &c, &bad).expect_err("no GPU 7");
        assert_eq!(e.reason, RefusalReason::BadSelector);
        assert!(e.message.contains("`7`"), "{e}");
        let none = Request {
            model: Some("V100".into()),
            ..req(None, 0)
        };
        assert_eq!(
            place(&i, &[], &c, &none).expect_err("no V100").reason,
            RefusalReason::BadSelector
        );
        let two = Request {
            gpus: 2,
            model: Some("H200".into()),
            ..req(None, 0)
        };
        assert_eq!(
            place(&i, &[], &c, &two).expect_err("one H200").reason,
            RefusalReason::BadSelector
        );
    }

    #[test]
    fn bad_requests_and_empty_inventory() {
        let i = inv(vec![gpu(0, "H200", 10 * GI)]);
        let c = cfg(Policy::Binpack);
        for r in [
            Request {
                gpus: 0,
                ..req(None, 0)
            },
            Request {
                gpus: 17,
                ..req(None, 0)
            },
            req(None, 101),
            req(Some(Quantity::Bytes(0)), 0),
            Request {
                gpus: 2,
                ..req(None, 0)
            },
        ] {
            assert_eq!(
                place(&i, &[], &c, &r).expect_err("bad").reason,
                RefusalReason::BadRequest,
                "{r:?}"
            );
        }
        let e = place(&inv(vec![]), &[], &c, &req(None, 0)).expect_err("empty");
        assert_eq!(e.reason, RefusalReason::NoInventory);
    }

    #[test]
    fn percent_resolves_per_gpu() {
        let i = inv(vec![gpu(0, "small", 8 * GI), gpu(1, "big", 80 * GI)]);
        let r = Request {
            gpus: 2,
            ..req(Some(Quantity::Percent(25)), 0)
        };
        let b = place(&i, &[], &cfg(Policy::Binpack), &r).expect("fits");
        assert_eq!(
            b.iter().map(|b| b.memory).collect::<Vec<_>>(),
            vec![2 * GI, 20 * GI]
        );
    }
}

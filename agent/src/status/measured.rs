//! The measured figures `gpuslice status` shows next to the booked ones, taken with the
//! exporter's collector (one collection, NVML loaded for it): per GPU used memory and
//! utilisation, per reservation the memory its processes hold from its usage file.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use gpuslice_registry::RegistryFile;

use super::render::{GpuMeasured, Measured};

use crate::collect::Collector;
use crate::errors::ErrorLog;
use crate::model::Scrape;

/// Measured figures of a scrape, keyed as the status renderers want them.
pub fn from_scrape(scrape: &Scrape) -> Measured {
    let mut m = Measured::default();
    for g in &scrape.gpus {
        if g.memory_used.is_some() || g.utilization.is_some() {
            m.gpus.insert(
                g.uuid.clone(),
                GpuMeasured {
                    memory_used: g.memory_used,
                    utilization: g.utilization.map(|u| (u * 100.0).round() as u32),
                },
            );
        }
    }
    for s in &scrape.slices {
        if let Some(used) = s.memory_used {
            m.memory_used
                .entry(s.reservation.clone())
                .or_insert_with(BTreeMap::new)
                .insert(s.uuid.clone(), used);
        }
    }
    m
}

/// Measures the node once for `status`, from the registry `file` it already read. The
/// first NVML problem becomes [`Measured::gpu_error`]; other read errors only blank cells.
pub fn measure(node: &gpuslice_hook::node::NodeContext, file: &RegistryFile) -> Measured {
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = lines.clone();
    let errors = ErrorLog::with_sink(Box::new(move |l| {
        if let Ok(mut v) = sink.lock() {
            v.push(l.to_string());
        }
    }));
    let mut collector: Collector = crate::collector_for(node, errors);
    let scrape = collector.collect_from(Some(file), Instant::now());
    let mut m = from_scrape(&scrape);
    m.gpu_error = lines.lock().ok().and_then(|v| {
        v.iter()
            .find_map(|l| l.strip_prefix("nvml: ").map(str::to_string))
    });
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{GpuSample, SliceSample};

    #[test]
    fn scrape_becomes_status_measurements() {
        let scrape = Scrape {
            gpus: vec![
                GpuSample {
                    uuid: "GPU-a".into(),
                    memory_used: Some(5),
                    utilization: Some(0.304),
                    ..GpuSample::default()
                },
                GpuSample {
                    uuid: "GPU-b".into(),
                    ..GpuSample::default()
                },
            ],
            slices: vec![
                SliceSample {
                    reservation: "r1".into(),
                    uuid: "GPU-a".into(),
                    memory_used: Some(7),
                    ..SliceSample::default()
                },
                SliceSample {
                    reservation: "r2".into(),
                    uuid: "GPU-a".into(),
                    memory_used: None,
                    ..SliceSample::default()
                },
            ],
            ..Scrape::default()
        };
        let m = from_scrape(&scrape);
        assert_eq!(m.gpus["GPU-a"].memory_used, Some(5));
        assert_eq!(m.gpus["GPU-a"].utilization, Some(30));
        assert!(!m.gpus.contains_key("GPU-b"), "nothing measured");
        assert_eq!(m.memory_used["r1"]["GPU-a"], 7);
        assert!(!m.memory_used.contains_key("r2"));
    }
}

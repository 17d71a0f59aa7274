//! A reader polling a spec file while another thread rewrites it never sees a partial or
//! invalid file: every read parses, validates, and equals one of the two specs written.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use gpuslice_cdi::{
    read_spec, stamped, write_spec, ContainerEdits, Device, DeviceNode, Mount, Spec,
};

fn spec(variant: u32) -> Spec {
    let mut s = Spec::new("gpuslice.io/slice");
    let mut edits = ContainerEdits {
        env: vec![format!("GPUSLICE_VARIANT={variant}")],
        device_nodes: vec![DeviceNode::char_device("/dev/nvidia0", 195, 0)],
        ..Default::default()
    };
    // Make the two files differ in size, so a torn read would show.
    for i in 0..(variant * 40) {
        edits.mounts.push(Mount::bind(
            format!("/host/lib{i}.so"),
            format!("/usr/lib/lib{i}.so"),
            &["ro", "bind"],
        ));
    }
    s.devices.push(Device::new(format!("r{variant}"), edits));
    s
}

#[test]
fn readers_never_see_partial_specs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = spec(1);
    let b = spec(2);
    let path = write_spec(dir.path(), &a).expect("first write");
    let expected = [stamped(&a), stamped(&b)];

    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (dir, stop) = (dir.path().to_path_buf(), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut writes = 0u32;
            while !stop.load(Ordering::Relaxed) || writes < 200 {
                let s = if writes.is_multiple_of(2) { &b } else { &a };
                write_spec(&dir, s).expect("rewrite");
                writes += 1;
            }
            writes
        })
    };

    let mut seen = [0u32; 2];
    for _ in 0..3000 {
        let got = read_spec(&path).unwrap_or_else(|e| panic!("reader saw a broken spec: {e}"));
        let which = expected
            .iter()
            .position(|e| *e == got)
            .expect("one of the two specs");
        seen[which] += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let writes = writer.join().expect("writer thread");
    assert!(writes >= 200);
    assert_eq!(seen.iter().sum::<u32>(), 3000);
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .expect("readdir")
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .filter(|n| n != "gpuslice.io-slice.json")
        .collect();
    assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");
}

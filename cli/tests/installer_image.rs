//! The Kubernetes installer image ships the same build as the .deb: the static create-path
//! binaries with the full build installed where the static `gpuslice` looks for it.

use std::path::{Path, PathBuf};

use gpuslice_hook::staticbuild::{full_build_candidates, FULL_BUILD_NAME};

fn kubernetes(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../packaging/kubernetes")
        .join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_installer_image_ships_the_static_build_with_its_full_build_where_it_is_looked_for() {
    let build = kubernetes("build-image.sh");
    assert!(build.contains("./scripts/build-static.sh"), "{build}");
    assert!(build.contains("\"$ctx/gpuslice-full\""), "{build}");
    let containerfile = kubernetes("Containerfile");
    assert!(
        containerfile.contains("COPY gpuslice gpuslice-runtime gpuslice-full "),
        "{containerfile}"
    );
    // The installer puts the static `gpuslice` at $PREFIX/bin and the full build at
    // $PREFIX/lib/gpuslice/, one of the places the static build hands its commands to.
    let installer = kubernetes("installer.sh");
    assert!(installer.contains("PREFIX=/opt/gpuslice"), "{installer}");
    assert!(
        installer.contains("GS=\"$PREFIX/bin/gpuslice\""),
        "{installer}"
    );
    assert!(
        installer.contains(&format!(
            "put \"$SRC/{FULL_BUILD_NAME}\" \"$PREFIX/lib/gpuslice/{FULL_BUILD_NAME}\" 0755"
        )),
        "{installer}"
    );
    assert!(
        full_build_candidates(Path::new("/opt/gpuslice/bin/gpuslice"))
            .contains(&PathBuf::from("/opt/gpuslice/lib/gpuslice").join(FULL_BUILD_NAME))
    );
}

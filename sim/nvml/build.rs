//! Gives the simulated NVML the soname of the real one, so `dlopen("libnvidia-ml.so.1")`
//! and programs linked with `-lnvidia-ml` load it.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
}

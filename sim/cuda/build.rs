//! Gives the simulated driver the soname of the real one, so a program linked with `-lcuda`
//! or dlopening `libcuda.so.1` loads it.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}

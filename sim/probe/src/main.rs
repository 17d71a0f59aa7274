//! The CUDA probe program (being built).
fn main() {}

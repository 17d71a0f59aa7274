//! The enforcement shim (being built).

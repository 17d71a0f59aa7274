//! The create path: what runs while a container is created, in short-lived root processes
//! (the `gpuslice-runtime` wrapper and the OCI hooks): reading the request from annotations,
//! reserving the slice, writing its files and CDI spec, editing the OCI spec, and the hooks
//! that bind and release the reservation.

pub mod annotations;
pub mod driveredits;
pub mod health;
pub mod hookargv;
pub mod hooks;
pub mod runtime;
pub mod slicespec;
pub mod slicewriter;
pub mod specedit;
pub mod specfile;
pub mod specjson;

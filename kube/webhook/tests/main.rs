//! gpuslice-webhook's integration tests: the server's start-up refusals and its TLS reload.

mod server;

//! `gpuslice console`, the web page over the console's model: Nodes, a node's GPUs, Pods,
//! Workloads with a workload's GPU tab and Budgets, rendered on the server per request from the same
//! functions kubectl-gpuslice uses (`fetch::sources`, `model::build`, `workload::allocate`
//! and `release`), Prometheus range queries for the charts. It acts with its kubeconfig's
//! rights, so it listens on loopback by default, answers only requests naming it
//! ([`http`]), and changes workloads only when started with `--allow-edit`.
//!
//! Where each behaviour lives: `server.rs` binds, accepts and serves connections
//! (`--max-connections`, shedding a slow client for a new one) under the deadlines and caps
//! of `gpuslice_conn`; `routes.rs` maps a path to its handler after the checks of `http.rs`;
//! the pages are `nodes.rs`, `pods.rs`, `workloads.rs` (over `sources.rs`, the model and
//! its missing-source banners) and `budgets.rs` (quotas and Kueue's queues), the forms' POSTs `actions.rs`; `respond.rs` gives every
//! answer its headers; `pages.rs` and `charts.rs` draw the HTML (`escape.rs` makes text
//! safe in it); `options.rs` holds the flags, `state.rs` what every request needs.

mod actions;
mod budgets;
pub mod charts;
mod escape;
pub mod http;
mod nodes;
mod options;
pub mod pages;
mod pods;
mod respond;
mod routes;
mod server;
mod sources;
mod state;
mod workloads;

pub use gpuslice_conn::Limits;
pub use options::{rights, Options};
pub use respond::CSP;
pub use server::{run_until_signal, Server, WebError};
pub use workloads::template_request;

//! What every request needs (the API client, the rights line, Prometheus, the edit switch,
//! the listen address and public URLs) and the frame every page is drawn in.

use std::net::SocketAddr;

use crate::client::Cluster;

use super::http::PublicUrl;

use super::pages::{Banner, Chrome};

/// What every request needs.
pub(super) struct State {
    pub(super) cluster: Cluster,
    pub(super) rights: String,
    pub(super) prometheus: Option<String>,
    pub(super) allow_edit: bool,
    /// `--hami-compat`: the webhook counts HAMi's quota names.
    pub(super) hami_compat: bool,
    pub(super) listen: SocketAddr,
    /// `--public-url`: the URLs a proxy or ingress serves the console at.
    pub(super) public: Vec<PublicUrl>,
}

/// The frame of a page: whose rights, read-only or not, the banners of missing sources.
pub(super) fn chrome(state: &State, banners: Vec<Banner>) -> Chrome {
    Chrome {
        rights: state.rights.clone(),
        allow_edit: state.allow_edit,
        banners,
    }
}

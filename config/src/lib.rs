//! gpuslice's node configuration: the TOML file (docs/configuration.md), its defaults, strict
//! validation with one-line errors, and the quantity syntax shared with annotations.

mod load;
mod model;
mod parse;
mod passthrough;
pub mod quantity;

pub use load::{load_config, load_from_env, ConfigOrigin, LoadedConfig, CONFIG_ENV};
pub use model::*;
pub use parse::{parse_config, ConfigError, MAX_SIMULATED_GPUS};
pub use passthrough::{passthrough_runtime, runtime_path_of};
pub use quantity::{
    format_bytes, format_bytes_rounded, format_kube_quantity, parse_bytes, parse_kube_quantity,
    parse_quantity, KubeQuantityError, Quantity, QuantityError,
};

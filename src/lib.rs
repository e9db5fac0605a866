//! tfinit: a PID-1 init for containers of Kubernetes controllers that drive the terraform CLI.
//!
//! The binary (src/main.rs) is a table of contents over these modules; the library exists so
//! that the fuzz targets and tests reach the parsers directly.
#![warn(missing_docs)]

pub mod cli;
pub mod client;
pub mod config;
pub mod init;
pub mod locks;
pub mod logging;
pub mod metrics;
pub mod metrics_server;
pub mod protocol;
pub mod signals;
pub mod sys;
pub mod terraform;

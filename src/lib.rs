//! tfinit: a PID-1 init for containers of Kubernetes controllers that drive the terraform CLI.
//!
//! The binary (src/main.rs) is a table of contents over these modules; the library exists so
//! that the fuzz targets and tests reach the parsers directly. It exports what the binary and
//! the tests use, and nothing more, so that the compiler reports code nothing calls.
#![warn(missing_docs)]

pub mod calendar;
pub mod cli;
pub mod client;
pub mod config;
pub mod duration;
pub mod init;
pub mod ip;
pub mod kube;
pub mod locks;
pub mod logging;
pub mod metrics;
pub mod metrics_server;
pub mod mutation;
mod phase;
pub mod protocol;
mod signals;
pub mod sys;
mod terraform;
mod throttle;

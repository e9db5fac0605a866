//! Lock-owner records and safe recovery of state locks left by dead owners.
//!
//! The init writes a record for each state-locking run and refreshes its owner's heartbeat. Before
//! a state-locking run in a directory with a dead owner's record, a recovery helper probes the lock
//! and releases it only when terraform's own Lock Info proves the dead owner holds it.

pub mod book;
pub mod follower;
pub mod handoff;
pub mod labels;
pub mod liveness;
pub mod lockinfo;
pub mod names;
pub mod record;
pub mod record_id;
pub mod recorder;
pub mod recover;
pub mod state;
pub mod store;
pub mod who;
pub mod workspace;

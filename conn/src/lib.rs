//! What a slow or hostile client can hold of a gpuslice HTTP server (the console, the
//! admission webhook): deadlines on a request's head, its body and every write, each
//! connection's [`Activity`], and a connection cap at which a new connection takes the slot
//! of the one that has waited longest on its client ([`Slots`]), so that clients that stop
//! reading or sending cannot hold every slot, nor the memory of bodies they never finish.

// Tests may panic on unexpected errors; the library itself may not.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod limits;
mod slots;

pub use limits::{Activity, Holding, Limits, Serving, TimedIo};
pub use slots::{serve_until_shed, Conn, Slot, Slots};

//! Plumbing that knows nothing of Talos: how a controller is driven, status writes and
//! conditions, finalizers, leader election, metrics and the HTTP endpoints, the clock, the
//! watches several controllers share, the watched tasks and panic containment.

pub mod clock;
pub mod conditions;
pub(crate) mod drive;
pub mod finalizer;
pub mod http;
pub mod leader;
pub mod metrics;
pub mod panics;
pub(crate) mod shared;
pub mod status;
pub mod tasks;

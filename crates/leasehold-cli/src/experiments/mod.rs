//! One module per experiment of the tutorial.

pub(crate) mod backoff;
pub(crate) mod failover;
pub(crate) mod fencing;
pub(crate) mod lock;
pub(crate) mod race;
pub(crate) mod redlock;
pub(crate) mod ttl;
pub(crate) mod verify;

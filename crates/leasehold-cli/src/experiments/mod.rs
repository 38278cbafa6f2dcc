//! One module per experiment of the tutorial.

pub(crate) mod backoff;
pub(crate) mod lock;
pub(crate) mod race;

//! Why a lease was lost. The lease core reports it (the watchdog, a
//! caller's refresh) and the error type carries it, so it lives in a leaf
//! of its own that both import, instead of one importing the other.

/// Why the watchdog gave up on a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostCause {
    /// The key no longer held our token: the lease expired or changed hands
    /// (the service cannot tell which), or its validity ran out before anything
    /// tried to refresh it.
    Expired,
    /// Refreshes kept failing (the service slow, paused, partitioned or
    /// refusing)
    /// until the lease's confirmed deadline passed, so it may have expired
    /// and been taken.
    Unreachable,
    /// The service marked it superseded ([`Lease::mark_superseded`]): the
    /// database refused a write of this holder's as stale, so a newer
    /// holder exists, whatever the lock service says.
    ///
    /// [`Lease::mark_superseded`]: crate::Lease::mark_superseded
    Superseded,
}

impl LostCause {
    /// Its value in traces and metrics: `expired`, `unreachable`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            LostCause::Expired => "expired",
            LostCause::Unreachable => "unreachable",
            LostCause::Superseded => "superseded",
        }
    }
}

impl std::fmt::Display for LostCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LostCause::Expired => "the lease expired or changed hands",
            LostCause::Unreachable => {
                "the service could not confirm it before the lease's deadline"
            }
            LostCause::Superseded => "the database refused it as stale: a newer holder exists",
        })
    }
}

//! What a hand-off locker subscribes through: the public [`HandoffClient`],
//! made from any client that can reach the server (a node, a sentinel, a
//! cluster). The subscription itself is `subscriptions`'s.

use crate::endpoint::Endpoint;

/// The client a [`HandoffLocker`](super::HandoffLocker) opens its one
/// subscription connection with: a [`redis::Client`] (one node), a
/// [`Sentinel`](crate::Sentinel) (the primary it names, resolved again at
/// every reconnect; feature `sentinel`) or, with
/// the `cluster` feature, a [`redis::cluster::ClusterClient`] (which must
/// speak RESP3: `ClusterClientBuilder::use_protocol(ProtocolVersion::RESP3)`).
/// Made with `From`, so [`build`](super::HandoffLockerBuilder::build) takes
/// `&client` of either kind.
///
/// A node client is opened with RESP3 whatever its URL says (the
/// subscription needs RESP3 pushes; the locker's own connection is not
/// affected).
///
/// ```no_run
/// # #[cfg(feature = "cluster")]
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use leasehold::redis::{ProtocolVersion, cluster::ClusterClient};
/// use leasehold::{HandoffLocker, Lessor, Locker};
///
/// let client = ClusterClient::builder(["redis://10.0.0.1:7000"])
///     .use_protocol(ProtocolVersion::RESP3)
///     .build()?;
/// let locker = Locker::builder().build(client.get_async_connection().await?)?;
/// let handoff = HandoffLocker::builder().build(locker, &client).await?;
/// // A hash tag: the lock, its queue and its shard channel share a slot.
/// let lease = handoff.acquire("lock:{wallet:42}", Duration::from_secs(5)).await?;
/// lease.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct HandoffClient {
    pub(super) source: Source,
}

// One per locker: the size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub(super) enum Source {
    /// One node, or through Sentinel the primary it names at each connect.
    Node(Endpoint),
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster::ClusterClient),
}

impl From<&redis::Client> for HandoffClient {
    fn from(client: &redis::Client) -> Self {
        Endpoint::from(client).into()
    }
}

impl From<redis::Client> for HandoffClient {
    fn from(client: redis::Client) -> Self {
        Endpoint::from(client).into()
    }
}

impl From<Endpoint> for HandoffClient {
    fn from(endpoint: Endpoint) -> Self {
        HandoffClient {
            source: Source::Node(endpoint),
        }
    }
}

#[cfg(feature = "sentinel")]
impl From<&crate::Sentinel> for HandoffClient {
    fn from(sentinel: &crate::Sentinel) -> Self {
        Endpoint::from(sentinel).into()
    }
}

#[cfg(feature = "sentinel")]
impl From<crate::Sentinel> for HandoffClient {
    fn from(sentinel: crate::Sentinel) -> Self {
        Endpoint::from(sentinel).into()
    }
}

#[cfg(feature = "cluster")]
impl From<&redis::cluster::ClusterClient> for HandoffClient {
    fn from(client: &redis::cluster::ClusterClient) -> Self {
        HandoffClient {
            source: Source::Cluster(client.clone()),
        }
    }
}

#[cfg(feature = "cluster")]
impl From<redis::cluster::ClusterClient> for HandoffClient {
    fn from(client: redis::cluster::ClusterClient) -> Self {
        HandoffClient {
            source: Source::Cluster(client),
        }
    }
}

impl HandoffClient {
    /// Whether the subscription goes to one node, which the locker must
    /// reconnect itself when it drops (a cluster connection reconnects and
    /// resubscribes on its own).
    pub(super) fn is_node(&self) -> bool {
        matches!(self.source, Source::Node(_))
    }
}

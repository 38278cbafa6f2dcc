//! etcd leases: grant, revoke, one keep-alive, time to live.
//!
//! A keep-alive's success says only that etcd renewed the lease: not that
//! a key attached to it still exists (an operator may have deleted it; a
//! put whose outcome was unknown may never have been applied), and, on
//! etcd 3.4 before 3.4.38 (Debian's 3.4.23 among them), not even that the
//! lease was not revoked meanwhile. A lock is held while its key is there,
//! under the holder's lease, with the holder's value: check the key, never
//! the keep-alive alone.

use std::time::Duration;

use futures_util::StreamExt;
use tokio::time::Instant;

use super::api::etcdserverpb::lease_client::LeaseClient;
use super::api::etcdserverpb::{
    LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest, LeaseTimeToLiveRequest,
};
use super::calls::{EtcdClient, Retry};
use super::error::EtcdError;
use super::kv::Header;

/// A lease etcd granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseGrant {
    /// The lease ID.
    pub id: i64,
    /// Its time to live as etcd granted it, in seconds (etcd may raise a
    /// small TTL to its minimum).
    pub ttl: i64,
    /// The reply's header.
    pub header: Header,
}

/// What etcd says of a live lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseTtl {
    /// Seconds left (the lease ends in under `ttl + 1` seconds).
    pub ttl: i64,
    /// The TTL it was granted with, in seconds.
    pub granted_ttl: i64,
}

/// A fresh lease ID: random, positive, never 0 (which asks etcd to pick).
fn new_lease_id() -> i64 {
    let random = getrandom::u64().unwrap_or_else(|_| {
        // No system randomness: the clock's nanoseconds, unique enough
        // among one client's retries.
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |elapsed| elapsed.as_nanos() as u64)
    });
    let id = (random >> 1) as i64;
    id.max(1)
}

impl EtcdClient {
    /// Grants a lease of `ttl` (whole seconds, rounded up, at least 1) by
    /// `deadline`.
    ///
    /// The client picks the lease ID, so sending the grant again after a
    /// lost answer is safe: if the first one was applied, etcd answers the
    /// second with `lease already exists`, which means ours, and the TTL is
    /// read back.
    ///
    /// # Errors
    ///
    /// [`EtcdError::DeadlineExceeded`], or [`EtcdError::Rejected`] (a TTL
    /// etcd refuses).
    pub async fn grant(&self, ttl: Duration, deadline: Instant) -> Result<LeaseGrant, EtcdError> {
        let seconds = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
        let seconds = if ttl.subsec_nanos() > 0 || seconds == 0 {
            seconds.saturating_add(1)
        } else {
            seconds
        };
        let request = LeaseGrantRequest {
            ttl: seconds,
            id: new_lease_id(),
        };
        let reply = self
            .call(deadline, Retry::Safe, |session| {
                let request = session.request(request);
                async move { LeaseClient::new(session.channel).lease_grant(request).await }
            })
            .await;
        match reply {
            Ok(reply) => {
                let reply = reply.into_inner();
                Ok(LeaseGrant {
                    id: reply.id,
                    ttl: reply.ttl,
                    header: reply.header.into(),
                })
            }
            Err(err)
                if err
                    .rejected_message()
                    .is_some_and(|message| message.contains("lease already exists")) =>
            {
                let ttl = self
                    .time_to_live(request.id, deadline)
                    .await?
                    .ok_or(EtcdError::LeaseNotFound { lease: request.id })?;
                Ok(LeaseGrant {
                    id: request.id,
                    ttl: ttl.granted_ttl,
                    header: Header::default(),
                })
            }
            Err(err) => Err(err),
        }
    }

    /// Revokes lease `id` by `deadline`: every key attached to it is
    /// deleted. `true` if this call revoked it, `false` if it was gone
    /// already (expired, revoked, or revoked by an earlier attempt of this
    /// call whose answer was lost). Safe to send again.
    ///
    /// # Errors
    ///
    /// [`EtcdError::DeadlineExceeded`], [`EtcdError::Rejected`].
    pub async fn revoke(&self, id: i64, deadline: Instant) -> Result<bool, EtcdError> {
        let request = LeaseRevokeRequest { id };
        let reply = self
            .call(deadline, Retry::Safe, |session| {
                let request = session.request(request);
                async move {
                    LeaseClient::new(session.channel)
                        .lease_revoke(request)
                        .await
                }
            })
            .await;
        match reply {
            Ok(_) => Ok(true),
            Err(err) if err.is_lease_not_found() => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// Renews lease `id` once, by `deadline`, and returns its new TTL in
    /// seconds. Safe to send again.
    ///
    /// A success proves only that etcd renewed the lease, not that a lock
    /// attached to it is still held (see the module docs): check the key.
    ///
    /// # Errors
    ///
    /// [`EtcdError::LeaseNotFound`] if the lease has ended,
    /// [`EtcdError::DeadlineExceeded`].
    pub async fn keep_alive_once(&self, id: i64, deadline: Instant) -> Result<i64, EtcdError> {
        let request = LeaseKeepAliveRequest { id };
        let reply = self
            .call(deadline, Retry::Safe, |session| {
                let request = session.request(futures_util::stream::iter([request]));
                async move {
                    let mut replies = LeaseClient::new(session.channel)
                        .lease_keep_alive(request)
                        .await?
                        .into_inner();
                    match replies.next().await {
                        Some(reply) => reply,
                        None => Err(tonic::Status::unavailable(
                            "the keep-alive stream ended without a reply",
                        )),
                    }
                }
            })
            .await;
        match reply {
            Ok(reply) if reply.ttl > 0 => Ok(reply.ttl),
            Ok(_) => Err(EtcdError::LeaseNotFound { lease: id }),
            Err(err) if err.is_lease_not_found() => Err(EtcdError::LeaseNotFound { lease: id }),
            Err(err) => Err(err),
        }
    }

    /// What etcd says of lease `id`, by `deadline`: `None` if it has ended
    /// (expired or revoked) or never was.
    ///
    /// # Errors
    ///
    /// [`EtcdError::DeadlineExceeded`], [`EtcdError::Rejected`].
    pub async fn time_to_live(
        &self,
        id: i64,
        deadline: Instant,
    ) -> Result<Option<LeaseTtl>, EtcdError> {
        let request = LeaseTimeToLiveRequest { id, keys: false };
        let reply = self
            .call(deadline, Retry::Safe, |session| {
                let request = session.request(request);
                async move {
                    LeaseClient::new(session.channel)
                        .lease_time_to_live(request)
                        .await
                }
            })
            .await;
        match reply {
            Ok(reply) => {
                let reply = reply.into_inner();
                Ok((reply.ttl >= 0).then_some(LeaseTtl {
                    ttl: reply.ttl,
                    granted_ttl: reply.granted_ttl,
                }))
            }
            Err(err) if err.is_lease_not_found() => Ok(None),
            Err(err) => Err(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ids_are_positive() {
        for _ in 0..1000 {
            assert!(new_lease_id() > 0);
        }
    }
}

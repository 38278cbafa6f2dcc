//! Watches: a stream of a key's (or a prefix's) events from a revision on,
//! which the caller restarts from [`WatchStream::next_revision`] after it
//! breaks.
//!
//! etcd keeps history: a watch from revision `r` gets every event at `r`
//! or later, unless compaction removed it ([`EtcdError::Compacted`]). So a
//! stream that broke (its member stopped or lost its leader; every watch
//! carries `hasleader`, so etcd ends it when its member loses the leader,
//! rather than leaving it silent) loses nothing: open a new one from the
//! revision after the last one seen, on whichever member answers.

use futures_util::{Stream, StreamExt, stream};
use tokio::time::Instant;
use tonic::Streaming;

use super::api::etcdserverpb::watch_client::WatchClient;
use super::api::etcdserverpb::{WatchCreateRequest, WatchRequest, WatchResponse, watch_request};
use super::api::mvccpb::event::EventType;
use super::calls::{EtcdClient, Retry};
use super::error::EtcdError;
use super::kv::{KeyValue, prefix_end};

/// What happened to a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// It was written (created if its `version` is 1).
    Put,
    /// It was deleted (by a delete, or its lease ended); the key value's
    /// `mod_revision` is the deletion's revision.
    Delete,
}

/// One change to one key.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Event {
    /// Put or delete.
    pub kind: EventKind,
    /// The key after a put; the key (and its revision of deletion) after a
    /// delete.
    pub kv: KeyValue,
}

/// What a watch reply brought: events, or (with none) progress.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WatchBatch {
    /// The events, oldest first (empty for a progress notification).
    pub events: Vec<Event>,
    /// The store's revision when it was sent: every later event has a
    /// higher revision.
    pub revision: i64,
}

/// A watch on one key or one prefix, open on one member.
///
/// It ends with an error when its member stops, loses its leader, or the
/// connection breaks; open a new one from
/// [`next_revision`](Self::next_revision) to miss nothing.
#[must_use]
pub struct WatchStream {
    replies: Streaming<WatchResponse>,
    endpoint: String,
    next_revision: i64,
}

impl std::fmt::Debug for WatchStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchStream")
            .field("endpoint", &self.endpoint)
            .field("next_revision", &self.next_revision)
            .finish_non_exhaustive()
    }
}

/// What to watch: a key, or every key with a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct WatchKeys {
    key: Vec<u8>,
    range_end: Vec<u8>,
}

impl WatchKeys {
    /// The key `key` alone.
    pub fn key(key: impl Into<Vec<u8>>) -> Self {
        Self {
            key: key.into(),
            range_end: Vec::new(),
        }
    }

    /// Every key that starts with `prefix`.
    pub fn prefix(prefix: impl Into<Vec<u8>>) -> Self {
        let key = prefix.into();
        Self {
            range_end: prefix_end(&key),
            key,
        }
    }
}

/// The requests a watch sends: the create request, then nothing, with
/// the stream kept open (closing it would end the watch).
fn requests(create: WatchCreateRequest) -> impl Stream<Item = WatchRequest> + Send + 'static {
    stream::iter([WatchRequest {
        request_union: Some(watch_request::RequestUnion::CreateRequest(create)),
    }])
    .chain(stream::pending())
}

impl EtcdClient {
    /// Opens a watch on `keys` from revision `from` (inclusive; 0 or less:
    /// from now), by `deadline`: returns once etcd has confirmed it.
    /// Opening is safe to repeat, so it tries the members in turn.
    ///
    /// # Errors
    ///
    /// [`EtcdError::Compacted`] if `from` is compacted away,
    /// [`EtcdError::DeadlineExceeded`], [`EtcdError::WatchCanceled`].
    pub async fn watch(
        &self,
        keys: &WatchKeys,
        from: i64,
        deadline: Instant,
    ) -> Result<WatchStream, EtcdError> {
        let create = WatchCreateRequest {
            key: keys.key.clone(),
            range_end: keys.range_end.clone(),
            start_revision: from.max(0),
            progress_notify: true,
            ..WatchCreateRequest::default()
        };
        let (replies, created, endpoint) = self
            .call(deadline, Retry::Safe, |session| {
                let request = session.request(requests(create.clone()));
                let endpoint = session.endpoint().to_owned();
                async move {
                    let mut replies = WatchClient::new(session.channel)
                        .watch(request)
                        .await?
                        .into_inner();
                    match replies.message().await? {
                        Some(created) => Ok((replies, created, endpoint)),
                        None => Err(tonic::Status::unavailable(
                            "the watch stream ended before the watch was created",
                        )),
                    }
                }
            })
            .await?;
        if created.compact_revision != 0 {
            return Err(EtcdError::Compacted {
                revision: from,
                compact_revision: created.compact_revision,
            });
        }
        if created.canceled || !created.created {
            return Err(EtcdError::WatchCanceled {
                reason: created.cancel_reason,
            });
        }
        let next_revision = if from > 0 {
            from
        } else {
            created.header.map_or(0, |header| header.revision + 1)
        };
        Ok(WatchStream {
            replies,
            endpoint,
            next_revision,
        })
    }
}

impl WatchStream {
    /// The revision to open a new watch from to miss nothing: one past the
    /// last revision this stream delivered (or reported as progress).
    pub fn next_revision(&self) -> i64 {
        self.next_revision
    }

    /// The endpoint of the member the watch runs on.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The next events (or a progress notification, with none).
    ///
    /// Cancel safety: cancel-safe; a reply not yet returned stays in the
    /// stream.
    ///
    /// # Errors
    ///
    /// [`EtcdError::WatchLost`] when the stream ends or breaks (open a new
    /// one from [`next_revision`](Self::next_revision)),
    /// [`EtcdError::Compacted`], [`EtcdError::WatchCanceled`].
    pub async fn next(&mut self) -> Result<WatchBatch, EtcdError> {
        let reply = match self.replies.message().await {
            Ok(Some(reply)) => reply,
            Ok(None) => {
                return Err(EtcdError::WatchLost {
                    endpoint: self.endpoint.clone(),
                    source: None,
                });
            }
            Err(status) => {
                return Err(EtcdError::WatchLost {
                    endpoint: self.endpoint.clone(),
                    source: Some(status),
                });
            }
        };
        if reply.compact_revision != 0 {
            return Err(EtcdError::Compacted {
                revision: self.next_revision,
                compact_revision: reply.compact_revision,
            });
        }
        if reply.canceled {
            return Err(EtcdError::WatchCanceled {
                reason: reply.cancel_reason,
            });
        }
        let revision = reply.header.map_or(0, |header| header.revision);
        let events: Vec<Event> = reply
            .events
            .into_iter()
            .filter_map(|event| {
                let kind = match EventType::try_from(event.r#type) {
                    Ok(EventType::Put) => EventKind::Put,
                    Ok(EventType::Delete) => EventKind::Delete,
                    Err(_) => return None,
                };
                Some(Event {
                    kind,
                    kv: event.kv?.into(),
                })
            })
            .collect();
        let last = events
            .last()
            .map_or(revision, |event| event.kv.mod_revision);
        // A fragmented reply continues in the next one at the same
        // revision: resume there, not past it.
        let seen = if reply.fragment { last } else { last + 1 };
        self.next_revision = self.next_revision.max(seen);
        Ok(WatchBatch { events, revision })
    }
}

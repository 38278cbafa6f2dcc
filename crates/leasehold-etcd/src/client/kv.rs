//! Keys: ranges (reads) and transactions (compare, then put, delete or
//! range), in the client's own types.

use tokio::time::Instant;

use super::api::etcdserverpb::kv_client::KvClient;
use super::api::etcdserverpb::{
    self as pb, RangeRequest, RequestOp, TxnRequest, compare, range_request, request_op,
    response_op,
};
use super::api::mvccpb;
use super::calls::{EtcdClient, Retry};
use super::error::EtcdError;

/// A key and what etcd keeps with it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyValue {
    /// The key.
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
    /// The revision of the write that created the key (since its last
    /// deletion): a lock key's fencing token.
    pub create_revision: i64,
    /// The revision of the last write to the key.
    pub mod_revision: i64,
    /// Writes to the key since it was created (1 at creation).
    pub version: i64,
    /// The lease the key is attached to (0: none).
    pub lease: i64,
}

impl From<mvccpb::KeyValue> for KeyValue {
    fn from(kv: mvccpb::KeyValue) -> Self {
        Self {
            key: kv.key,
            value: kv.value,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            version: kv.version,
            lease: kv.lease,
        }
    }
}

/// What every reply says of the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Header {
    /// The store's revision when the request was applied.
    pub revision: i64,
    /// The member that answered.
    pub member_id: u64,
    /// Its raft term.
    pub raft_term: u64,
}

impl From<Option<pb::ResponseHeader>> for Header {
    fn from(header: Option<pb::ResponseHeader>) -> Self {
        header.map_or_else(Self::default, |header| Self {
            revision: header.revision,
            member_id: header.member_id,
            raft_term: header.raft_term,
        })
    }
}

/// `prefix` plus one: the end of the range of keys starting with
/// `prefix` (`\0`, every key, for an empty prefix or one of only `0xff`s).
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// Which keys to read: one key, or every key with a prefix.
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub struct Range {
    request: RangeRequest,
}

impl Range {
    /// The key `key` alone.
    pub fn key(key: impl Into<Vec<u8>>) -> Self {
        Self {
            request: RangeRequest {
                key: key.into(),
                ..RangeRequest::default()
            },
        }
    }

    /// Every key that starts with `prefix`.
    pub fn prefix(prefix: impl Into<Vec<u8>>) -> Self {
        let key = prefix.into();
        Self {
            request: RangeRequest {
                range_end: prefix_end(&key),
                key,
                ..RangeRequest::default()
            },
        }
    }

    /// At most `limit` keys. Defaults to no limit.
    pub fn limit(mut self, limit: i64) -> Self {
        self.request.limit = limit;
        self
    }

    /// Oldest key first (by creation revision): a FIFO queue of waiters.
    /// Defaults to key order.
    pub fn oldest_first(mut self) -> Self {
        self.request.sort_order = range_request::SortOrder::Ascend as i32;
        self.request.sort_target = range_request::SortTarget::Create as i32;
        self
    }

    /// Newest key first (by creation revision): with
    /// [`created_before`](Self::created_before) and a [`limit`](Self::limit)
    /// of 1, the key just ahead of a waiter in a FIFO queue. Defaults to
    /// key order.
    pub fn newest_first(mut self) -> Self {
        self.request.sort_order = range_request::SortOrder::Descend as i32;
        self.request.sort_target = range_request::SortTarget::Create as i32;
        self
    }

    /// Only keys created before revision `revision` (etcd's
    /// `max_create_revision`, set to `revision - 1`): the keys ahead of a
    /// waiter whose key was created at `revision`. A `revision` of 1 or
    /// less (no key can be older) is sent as 1. Defaults to no bound.
    pub fn created_before(mut self, revision: i64) -> Self {
        // 0 would mean no bound to etcd.
        self.request.max_create_revision = revision.saturating_sub(1).max(1);
        self
    }

    /// A serializable read: the member's own store, possibly stale, served
    /// without asking the leader. (Every request of this client carries
    /// `hasleader`, so a member that knows no leader refuses even this.)
    /// Defaults to linearizable (the leader confirms it is current).
    pub fn serializable(mut self) -> Self {
        self.request.serializable = true;
        self
    }
}

/// What a range read found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RangeResult {
    /// The reply's header: `header.revision` is the revision read at.
    pub header: Header,
    /// The keys found.
    pub kvs: Vec<KeyValue>,
    /// Whether the limit left keys out.
    pub more: bool,
}

/// How a [`Compare`] compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    /// Equal to.
    Equal,
    /// Not equal to.
    NotEqual,
    /// Greater than.
    Greater,
    /// Less than.
    Less,
}

impl Cmp {
    fn result(self) -> compare::CompareResult {
        match self {
            Self::Equal => compare::CompareResult::Equal,
            Self::NotEqual => compare::CompareResult::NotEqual,
            Self::Greater => compare::CompareResult::Greater,
            Self::Less => compare::CompareResult::Less,
        }
    }
}

/// One condition of a [`Txn`], on one key. An absent key has creation
/// revision 0, lease 0, and a value that equals nothing.
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub struct Compare(pb::Compare);

impl Compare {
    fn new(
        key: impl Into<Vec<u8>>,
        cmp: Cmp,
        target: compare::CompareTarget,
        union: compare::TargetUnion,
    ) -> Self {
        Self(pb::Compare {
            result: cmp.result() as i32,
            target: target as i32,
            key: key.into(),
            target_union: Some(union),
            range_end: Vec::new(),
        })
    }

    /// The key's creation revision: `create_revision(key, Cmp::Equal, 0)`
    /// holds when the key is absent.
    pub fn create_revision(key: impl Into<Vec<u8>>, cmp: Cmp, revision: i64) -> Self {
        Self::new(
            key,
            cmp,
            compare::CompareTarget::Create,
            compare::TargetUnion::CreateRevision(revision),
        )
    }

    /// The key's value.
    pub fn value(key: impl Into<Vec<u8>>, cmp: Cmp, value: impl Into<Vec<u8>>) -> Self {
        Self::new(
            key,
            cmp,
            compare::CompareTarget::Value,
            compare::TargetUnion::Value(value.into()),
        )
    }

    /// The lease the key is attached to (0: none).
    pub fn lease(key: impl Into<Vec<u8>>, cmp: Cmp, lease: i64) -> Self {
        Self::new(
            key,
            cmp,
            compare::CompareTarget::Lease,
            compare::TargetUnion::Lease(lease),
        )
    }

    /// The revision of the key's last write.
    pub fn mod_revision(key: impl Into<Vec<u8>>, cmp: Cmp, revision: i64) -> Self {
        Self::new(
            key,
            cmp,
            compare::CompareTarget::Mod,
            compare::TargetUnion::ModRevision(revision),
        )
    }
}

/// One operation of a [`Txn`].
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub struct Op(request_op::Request);

impl Op {
    /// Writes `key = value`, attached to `lease` (0: none): the key is
    /// deleted when the lease ends.
    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, lease: i64) -> Self {
        Self(request_op::Request::RequestPut(pb::PutRequest {
            key: key.into(),
            value: value.into(),
            lease,
            ..pb::PutRequest::default()
        }))
    }

    /// Deletes `key`.
    pub fn delete(key: impl Into<Vec<u8>>) -> Self {
        Self(request_op::Request::RequestDeleteRange(
            pb::DeleteRangeRequest {
                key: key.into(),
                ..pb::DeleteRangeRequest::default()
            },
        ))
    }

    /// Reads `range`.
    pub fn range(range: Range) -> Self {
        Self(request_op::Request::RequestRange(range.request))
    }

    fn is_read(&self) -> bool {
        matches!(self.0, request_op::Request::RequestRange(_))
    }
}

/// A transaction: if every comparison holds, the `then` operations, else
/// the `otherwise` ones, applied atomically at one revision.
#[derive(Debug, Clone, PartialEq, Default)]
#[must_use]
pub struct Txn {
    compare: Vec<Compare>,
    success: Vec<Op>,
    failure: Vec<Op>,
}

impl Txn {
    /// An empty transaction (no condition, no operation).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a condition (all must hold).
    pub fn when(mut self, compare: Compare) -> Self {
        self.compare.push(compare);
        self
    }

    /// Adds an operation to run when the conditions hold.
    pub fn then(mut self, op: Op) -> Self {
        self.success.push(op);
        self
    }

    /// Adds an operation to run when a condition fails.
    pub fn otherwise(mut self, op: Op) -> Self {
        self.failure.push(op);
        self
    }

    /// Whether it only reads (and so is safe to send again).
    fn is_read_only(&self) -> bool {
        self.success.iter().chain(&self.failure).all(Op::is_read)
    }

    fn request(&self) -> TxnRequest {
        let ops = |ops: &[Op]| {
            ops.iter()
                .map(|op| RequestOp {
                    request: Some(op.0.clone()),
                })
                .collect()
        };
        TxnRequest {
            compare: self
                .compare
                .iter()
                .map(|compare| compare.0.clone())
                .collect(),
            success: ops(&self.success),
            failure: ops(&self.failure),
        }
    }
}

/// What one operation of a transaction did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum OpResult {
    /// A read's keys.
    Range(Vec<KeyValue>),
    /// A put was applied.
    Put,
    /// A delete removed this many keys.
    Delete {
        /// 0 or 1 for one key.
        deleted: i64,
    },
}

/// What a transaction did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TxnResult {
    /// The reply's header: `header.revision` is the revision of the
    /// transaction's writes (a key it created has this creation revision).
    pub header: Header,
    /// Whether every comparison held (so the `then` operations ran).
    pub succeeded: bool,
    /// The results of the operations that ran, in order.
    pub results: Vec<OpResult>,
}

impl TxnResult {
    /// The key-values of each range operation that ran, in order.
    pub fn ranges(&self) -> impl Iterator<Item = &Vec<KeyValue>> {
        self.results.iter().filter_map(|result| match result {
            OpResult::Range(kvs) => Some(kvs),
            _ => None,
        })
    }

    /// The key-values of the first range operation that ran (none if no
    /// range ran).
    pub fn first_range(&self) -> &[KeyValue] {
        self.results
            .iter()
            .find_map(|result| match result {
                OpResult::Range(kvs) => Some(kvs.as_slice()),
                _ => None,
            })
            .unwrap_or(&[])
    }
}

impl EtcdClient {
    /// Reads `range` by `deadline`, trying the members in turn (a read is
    /// safe to send again).
    ///
    /// # Errors
    ///
    /// [`EtcdError::DeadlineExceeded`] if no member answered in time,
    /// [`EtcdError::Rejected`] if etcd refused it.
    pub async fn range(&self, range: &Range, deadline: Instant) -> Result<RangeResult, EtcdError> {
        let reply = self
            .call(deadline, Retry::Safe, |session| {
                let request = session.request(range.request.clone());
                async move { KvClient::new(session.channel).range(request).await }
            })
            .await?
            .into_inner();
        Ok(RangeResult {
            header: reply.header.into(),
            kvs: reply.kvs.into_iter().map(KeyValue::from).collect(),
            more: reply.more,
        })
    }

    /// Runs `txn` by `deadline`.
    ///
    /// A transaction that writes is sent again only when it is known not
    /// to have been applied (see [`EtcdClient`]); one that only reads is
    /// sent again as a [`range`](Self::range) is.
    ///
    /// # Errors
    ///
    /// [`EtcdError::OutcomeUnknown`] if a write went out and no answer
    /// came (it may have been applied: read to find out),
    /// [`EtcdError::DeadlineExceeded`] if nothing was applied in time,
    /// [`EtcdError::Rejected`] if etcd refused it (e.g. the same key
    /// written twice in one transaction).
    pub async fn txn(&self, txn: &Txn, deadline: Instant) -> Result<TxnResult, EtcdError> {
        let retry = if txn.is_read_only() {
            Retry::Safe
        } else {
            Retry::Unsafe
        };
        let request = txn.request();
        let reply = self
            .call(deadline, retry, |session| {
                let request = session.request(request.clone());
                async move { KvClient::new(session.channel).txn(request).await }
            })
            .await?
            .into_inner();
        let results = reply
            .responses
            .into_iter()
            .filter_map(|response| response.response)
            .map(|response| match response {
                response_op::Response::ResponseRange(range) => {
                    OpResult::Range(range.kvs.into_iter().map(KeyValue::from).collect())
                }
                response_op::Response::ResponsePut(_) => OpResult::Put,
                response_op::Response::ResponseDeleteRange(delete) => OpResult::Delete {
                    deleted: delete.deleted,
                },
                // Nested transactions are never sent.
                response_op::Response::ResponseTxn(_) => OpResult::Put,
            })
            .collect();
        Ok(TxnResult {
            header: reply.header.into(),
            succeeded: reply.succeeded,
            results,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_ends_one_past_its_last_byte() {
        assert_eq!(prefix_end(b"lock/"), b"lock0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
        assert_eq!(prefix_end(b""), vec![0]);
    }

    #[test]
    fn only_a_transaction_that_reads_is_safe_to_resend() {
        let read = Txn::new().then(Op::range(Range::key("k")));
        assert!(read.is_read_only());
        let write = Txn::new()
            .when(Compare::create_revision("k", Cmp::Equal, 0))
            .then(Op::put("k", "v", 7))
            .otherwise(Op::range(Range::key("k")));
        assert!(!write.is_read_only());
        assert!(!Txn::new().otherwise(Op::delete("k")).is_read_only());
    }

    #[test]
    fn a_create_if_absent_txn_is_encoded_as_etcd_expects() {
        let request = Txn::new()
            .when(Compare::create_revision("k", Cmp::Equal, 0))
            .then(Op::put("k", "token", 42))
            .request();
        let compare = &request.compare[0];
        assert_eq!(compare.key, b"k");
        assert_eq!(compare.target, compare::CompareTarget::Create as i32);
        assert_eq!(compare.result, compare::CompareResult::Equal as i32);
        assert_eq!(
            compare.target_union,
            Some(compare::TargetUnion::CreateRevision(0))
        );
        match &request.success[0].request {
            Some(request_op::Request::RequestPut(put)) => {
                assert_eq!((put.key.as_slice(), put.lease), (&b"k"[..], 42));
            }
            other => panic!("not a put: {other:?}"),
        }
    }
}

//! ZooKeeper's errors as a lock service's faults.

use leasehold::Service;
use leasehold::backend::ServiceFault;
use zookeeper_client::Error as ZkError;

/// How errors name ZooKeeper as a lock service.
pub(crate) const ZOOKEEPER: Service = Service::named("zookeeper");

/// The source of a fault whose request got no answer by its deadline.
pub(crate) const NO_ANSWER: &str = "no answer before the deadline";

/// `future`, bounded by `deadline`: no answer by then is
/// [`ZkError::Timeout`].
pub(crate) async fn within<T>(
    deadline: tokio::time::Instant,
    future: impl Future<Output = Result<T, ZkError>>,
) -> Result<T, ZkError> {
    tokio::time::timeout_at(deadline, future)
        .await
        .unwrap_or(Err(ZkError::Timeout))
}

/// A client error as a lock service's fault: a write (`wrote`) whose
/// answer was lost may have acted ([`ServiceFault::Unknown`]); a lost
/// connection, an ended session (a new one is opened at the next request)
/// or a busy server may pass ([`ServiceFault::Transient`]); anything else
/// is the server's refusal ([`ServiceFault::Refused`]: no permission, a
/// bad path, quota).
///
/// The client reports a broken connection with the requests on it as
/// [`ZkError::Custom`] (an I/O error such as a reset, or "no response from
/// connection" when a paused server stops answering), not as
/// [`ZkError::ConnectionLoss`]: it is a lost connection all the same (the
/// client's other uses of `Custom`, TLS and SASL setup, are features this
/// crate does not turn on). Taken for a refusal, it reached callers
/// whose wait could have ridden it out (`leasehold chaos`, a ZooKeeper
/// leader killed or a follower paused).
pub(crate) fn zk_fault(op: &'static str, err: ZkError, wrote: bool) -> leasehold::Error {
    let kind = match err {
        ZkError::Timeout | ZkError::ConnectionLoss | ZkError::Custom(_) if wrote => {
            ServiceFault::Unknown
        }
        ZkError::Timeout
        | ZkError::ConnectionLoss
        | ZkError::Custom(_)
        | ZkError::SessionExpired
        | ZkError::SessionMoved
        | ZkError::Throttled
        | ZkError::NoHosts
        | ZkError::NotReadOnly
        | ZkError::ClientClosed => ServiceFault::Transient,
        _ => ServiceFault::Refused,
    };
    leasehold::Error::service(ZOOKEEPER, op, kind, err)
}

//! How an etcd failure reaches the caller: a [`leasehold::Error::Service`]
//! naming etcd, the operation and what the request did, with the
//! [`EtcdError`] as its source ([`etcd_error`] finds it again).

use leasehold::Error;
use leasehold::Service;
use leasehold::backend::ServiceFault;

use crate::client::EtcdError;

/// `source`, a failure of etcd during `op`, as the caller sees it: what the
/// request did decides the fault ([`ServiceFault::Unknown`] for a write
/// whose answer was lost, [`ServiceFault::Transient`] for a fault that may
/// pass, [`ServiceFault::Refused`] for the rest).
pub(crate) fn failed(op: &'static str, source: EtcdError) -> Error {
    let fault = if source.is_outcome_unknown() {
        ServiceFault::Unknown
    } else if source.is_retryable() {
        ServiceFault::Transient
    } else {
        ServiceFault::Refused
    };
    Error::service(Service::ETCD, op, fault, source)
}

/// The etcd failure inside `err`, if etcd failed it: to tell a cluster out
/// of space ([`EtcdError::is_no_space`]) or refused credentials from other
/// faults, or to read the TLS failure of a refused connection.
pub fn etcd_error(err: &Error) -> Option<&EtcdError> {
    match err {
        Error::Service {
            service, source, ..
        } if *service == Service::ETCD => source.downcast_ref(),
        _ => None,
    }
}

//! The client: a list of members, and one loop that sends a request to
//! the current member, bounded by the caller's deadline, and moves to the
//! next member (passing over the ones that fell silent) when it fails in
//! a way that is safe to retry.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::{Instant, sleep_until, timeout_at};
use tonic::{Code, Status};

use super::error::EtcdError;
use super::member::{Credentials, Member, Session, SessionLost, TlsSettings};

/// How long one attempt of a retry-safe request may take before the
/// client tries the next member. Defaults to this.
pub const DEFAULT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);

/// The pause after every member failed once, before the next round.
const ROUND_PAUSE: Duration = Duration::from_millis(50);

/// Whether a request may be sent again after a failure whose outcome is
/// unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retry {
    /// A read, or a write that is harmless to apply twice: sent again to
    /// the next member on any transport failure or timeout.
    Safe,
    /// A write: sent again only when it is known not to have been
    /// applied; otherwise [`EtcdError::OutcomeUnknown`].
    Unsafe,
}

/// What a failed attempt says about the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// etcd answered with a refusal: return it.
    Answer,
    /// Refused before anything was applied: safe to send to another
    /// member, even a write.
    NotApplied,
    /// Not sent: the session's connection had broken (it is never
    /// redialled behind the client's back). Safe to send elsewhere.
    NotSent,
    /// The auth token was refused (not applied): authenticate again.
    BadToken,
    /// The answer was lost (transport error, timeout on etcd's side):
    /// a read may be resent, a write's outcome is unknown.
    Lost,
}

/// Sorts a failed attempt's status.
///
/// etcd's own refusals before a proposal: `no leader` (the `hasleader`
/// check of every request, or no leader to forward to), `not capable`,
/// `too many requests` (the apply loop lags). Not sent at all: tonic's
/// `Service was not ready` (the stub's failure before sending) and
/// [`SessionLost`] (a request on a session whose connection had broken,
/// which is never redialled). `request timed out`, `leader changed` and
/// other transport errors are `Lost`: a proposal may still commit.
pub(crate) fn verdict(status: &Status) -> Verdict {
    if SessionLost::caused(status) {
        return Verdict::NotSent;
    }
    let message = status.message();
    match status.code() {
        Code::Unauthenticated if message.contains("invalid auth token") => Verdict::BadToken,
        Code::Unavailable | Code::ResourceExhausted
            if message == "etcdserver: no leader"
                || message == "etcdserver: not capable"
                || message == "etcdserver: too many requests" =>
        {
            Verdict::NotApplied
        }
        Code::Unknown if message.starts_with("Service was not ready") => Verdict::NotSent,
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::Cancelled
        | Code::Unknown
        | Code::Internal => Verdict::Lost,
        _ => Verdict::Answer,
    }
}

/// An etcd v3 client over gRPC: a list of members, each request sent to
/// one of them and bounded by the caller's deadline.
///
/// # Deadlines and retries
///
/// Every request takes a deadline (a [`tokio::time::Instant`]); no
/// request outlives it, whatever the members do (a member cut off from
/// its peers holds a write for about 6 s before it fails it; a member
/// restarted without a quorum accepts connections and answers nothing).
/// A deadline that has passed fails at once with
/// [`EtcdError::DeadlineExceeded`], sending nothing.
///
/// The client sends to its current member and moves on when an attempt
/// fails:
///
/// - **Reads, and requests safe to repeat** (range, lease keep-alive,
///   time-to-live, revoke, grant with the client's own lease ID, opening a
///   watch): each attempt gets at most the attempt timeout
///   ([`DEFAULT_ATTEMPT_TIMEOUT`], or less for a request with a shorter
///   budget than its deadline, such as a lease's refresh), and any
///   transport failure or timeout sends it to the next member, until the
///   deadline. A keep-alive is safe to repeat because renewing a lease
///   twice only renews it again (to its granted TTL, from when it lands);
///   a keep-alive left on a silent member may still land when the member
///   wakes, which can only lengthen the lease on etcd's side, never
///   shorten it.
/// - **Writes** (a txn that puts or deletes): sent again only when the
///   first one is known not to have been applied: the connection could
///   not be made or did not prove itself (every new connection asks the
///   member for its status first), the session's connection had already
///   broken (a session is one connection, never redialled behind the
///   client's back, so nothing was sent), or etcd refused it before proposing
///   (`no leader`, which the `hasleader` flag on every request makes a
///   member without a leader answer at once, `not capable`, `too many
///   requests`). A write that went out and got no answer (the connection
///   broke, the deadline passed, `request timed out`, `leader changed`)
///   is [`EtcdError::OutcomeUnknown`]: it may still commit. The caller
///   learns the outcome by reading the key (a lock's key carries its
///   owner's token), never by resending blindly. The next request goes to
///   another member.
///
/// # Which member
///
/// The first endpoint is tried first. A member that falls silent (an
/// attempt timed out, the answer was lost with its connection, or it
/// could not be reached) is **demoted** until it answers again: moving on
/// from a failed member, the client takes the next one in the order given
/// that is not demoted, and a demoted one only when every other member is
/// demoted too. So the requests after a move start at the member that
/// answered, and a paused member is not tried again (at the cost of an
/// attempt) while another one answers; one that answers again (a
/// refusal is an answer) is no longer passed over. A member that refuses
/// before proposing (`no leader`, ...) is moved on from, not demoted: it
/// answered.
///
/// A connection is kept per member and dropped when a request on it
/// fails, so the next request there connects and checks afresh.
#[derive(Debug, Clone)]
pub struct EtcdClient {
    inner: Arc<Inner>,
    /// What one attempt of a retry-safe request may take: the builder's
    /// setting, or less in a view made by
    /// [`with_attempt_timeout`](Self::with_attempt_timeout).
    attempt_timeout: Duration,
}

#[derive(Debug)]
struct Inner {
    members: Vec<Member>,
    current: AtomicUsize,
    credentials: Option<Credentials>,
}

/// Builds an [`EtcdClient`]: `EtcdClient::builder(endpoints)`.
#[derive(Debug)]
#[must_use]
pub struct EtcdClientBuilder {
    endpoints: Vec<String>,
    credentials: Option<Credentials>,
    tls: Option<TlsSettings>,
    attempt_timeout: Duration,
}

impl EtcdClientBuilder {
    /// Authenticates with this user and password on every member (etcd's
    /// `Authenticate`; the token goes with every request). Defaults to no
    /// authentication.
    pub fn credentials(mut self, credentials: Credentials) -> Self {
        self.credentials = Some(credentials);
        self
    }

    /// Speaks TLS to the `https://` endpoints with these settings (feature
    /// `tls`). Defaults to none: an `https://` endpoint is then refused by
    /// [`build`](Self::build).
    #[cfg(feature = "tls")]
    pub fn tls(mut self, settings: TlsSettings) -> Self {
        self.tls = Some(settings);
        self
    }

    /// How long one attempt of a retry-safe request (a read) may take
    /// before the next member is tried, within the caller's deadline.
    /// Writes are not cut short by it (cutting one short would make its
    /// outcome unknown); they run to the caller's deadline. Defaults to
    /// [`DEFAULT_ATTEMPT_TIMEOUT`] (1 s).
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout;
        self
    }

    /// The client. Dials nothing: each member is connected on its first
    /// request.
    ///
    /// # Errors
    ///
    /// [`EtcdError::NoEndpoints`], [`EtcdError::InvalidEndpoint`],
    /// [`EtcdError::TlsRequired`] for an `https://` endpoint without
    /// `tls` settings (feature `tls`).
    pub fn build(self) -> Result<EtcdClient, EtcdError> {
        if self.endpoints.is_empty() {
            return Err(EtcdError::NoEndpoints);
        }
        let members = self
            .endpoints
            .iter()
            .map(|endpoint| Member::new(endpoint, self.tls.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(EtcdClient {
            inner: Arc::new(Inner {
                members,
                current: AtomicUsize::new(0),
                credentials: self.credentials,
            }),
            attempt_timeout: self.attempt_timeout,
        })
    }
}

impl EtcdClient {
    /// A builder for a client of the members at `endpoints`
    /// (`http://host:port`, one per member; the first is tried first).
    pub fn builder<I, S>(endpoints: I) -> EtcdClientBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        EtcdClientBuilder {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            credentials: None,
            tls: None,
            attempt_timeout: DEFAULT_ATTEMPT_TIMEOUT,
        }
    }

    /// The endpoint the next request goes to first.
    pub fn current_endpoint(&self) -> &str {
        self.member(self.inner.current.load(Ordering::Relaxed))
            .url()
    }

    /// Whether the member at `endpoint` fell silent (an attempt there
    /// timed out, its answer was lost, it could not be reached) and has
    /// not answered since: a watch open there may be waiting on a member
    /// that will not speak (see [`WatchStream::endpoint`](super::WatchStream::endpoint)).
    pub(crate) fn is_demoted(&self, endpoint: &str) -> bool {
        self.inner
            .members
            .iter()
            .any(|member| member.url() == endpoint && member.is_demoted())
    }

    fn member(&self, index: usize) -> &Member {
        &self.inner.members[index % self.inner.members.len()]
    }

    /// This client, sharing its members, their sessions and the choice of
    /// member, whose retry-safe attempts take at most `timeout` (and never
    /// longer than this client's own): for a request whose budget is
    /// shorter than the caller's deadline (a lease's refresh, due before
    /// its next one), so that it still moves on from a silent member in
    /// time.
    pub(crate) fn with_attempt_timeout(&self, timeout: Duration) -> EtcdClient {
        EtcdClient {
            inner: Arc::clone(&self.inner),
            attempt_timeout: self
                .attempt_timeout
                .min(timeout.max(Duration::from_millis(1))),
        }
    }

    /// Moves on from member `index` (unless another request already has)
    /// to the next one in order that is not demoted, or, when every other
    /// one is, to the next one in order.
    fn advance(&self, index: usize) {
        let members = self.inner.members.len();
        let next = (1..members)
            .map(|step| (index + step) % members)
            .find(|&next| !self.inner.members[next].is_demoted())
            .unwrap_or((index + 1) % members);
        let _ =
            self.inner
                .current
                .compare_exchange(index, next, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Sends a request, as `attempt` builds it on a session, to the
    /// current member and on to the next ones as the type of `retry`
    /// allows, until `deadline`. See the type's docs.
    ///
    /// Cancel safety: dropping the future abandons the request; a write
    /// may or may not have been applied.
    pub(crate) async fn call<T, F, Fut>(
        &self,
        deadline: Instant,
        retry: Retry,
        mut attempt: F,
    ) -> Result<T, EtcdError>
    where
        F: FnMut(Session) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let members = self.inner.members.len();
        let mut attempts: u32 = 0;
        let mut last: Option<EtcdError> = None;
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Err(EtcdError::DeadlineExceeded {
                    attempts,
                    last: last.map(Box::new),
                });
            }
            if attempts > 0 && (attempts as usize).is_multiple_of(members) {
                // Every member failed once: a short pause, so that a
                // cluster that refuses at once is not hammered.
                sleep_until((now + ROUND_PAUSE).min(deadline)).await;
                if Instant::now() >= deadline {
                    continue;
                }
            }
            attempts += 1;
            let index = self.inner.current.load(Ordering::Relaxed) % members;
            let member = self.member(index);
            // Making a session sends nothing of the request, so it is cut
            // short as a read would be, even for a write.
            let safe_deadline = deadline.min(Instant::now() + self.attempt_timeout);
            let attempt_deadline = match retry {
                Retry::Safe => safe_deadline,
                Retry::Unsafe => deadline,
            };
            let session = match member
                .session(safe_deadline, self.inner.credentials.as_ref())
                .await
            {
                Ok(session) => session,
                Err(err @ EtcdError::AuthFailed { .. }) => return Err(err),
                Err(err) => {
                    tracing::debug!(endpoint = member.url(), error = %err, "etcd member unreachable");
                    member.demote();
                    self.advance(index);
                    remember(&mut last, err);
                    continue;
                }
            };
            let status = match timeout_at(attempt_deadline, attempt(session.clone())).await {
                Ok(Ok(reply)) => {
                    member.answered();
                    return Ok(reply);
                }
                Ok(Err(status)) => status,
                Err(_elapsed) => {
                    tracing::debug!(
                        endpoint = member.url(),
                        "etcd member did not answer in time"
                    );
                    member.forget(&session);
                    member.demote();
                    self.advance(index);
                    if retry == Retry::Unsafe {
                        return Err(EtcdError::OutcomeUnknown {
                            endpoint: member.url().to_owned(),
                            source: None,
                        });
                    }
                    remember(
                        &mut last,
                        EtcdError::AttemptTimedOut {
                            endpoint: member.url().to_owned(),
                        },
                    );
                    continue;
                }
            };
            match verdict(&status) {
                Verdict::Answer => {
                    member.answered();
                    return Err(EtcdError::Rejected { source: status });
                }
                Verdict::BadToken => {
                    member.answered();
                    member.forget(&session);
                }
                Verdict::NotApplied => {
                    member.answered();
                    self.advance(index);
                }
                Verdict::NotSent => {
                    member.forget(&session);
                    self.advance(index);
                }
                Verdict::Lost => {
                    member.forget(&session);
                    member.demote();
                    self.advance(index);
                    if retry == Retry::Unsafe {
                        return Err(EtcdError::OutcomeUnknown {
                            endpoint: member.url().to_owned(),
                            source: Some(status),
                        });
                    }
                }
            }
            tracing::debug!(endpoint = member.url(), code = ?status.code(), "etcd request failed; trying again");
            remember(
                &mut last,
                EtcdError::Unavailable {
                    endpoint: member.url().to_owned(),
                    source: status,
                },
            );
        }
    }
}

/// Keeps `err` as the last failure of a request, unless the last one was a
/// TLS failure and `err` is not: a refused certificate says more than the
/// attempt after it that the deadline cut short.
fn remember(last: &mut Option<EtcdError>, err: EtcdError) {
    if err.is_tls() || !last.as_ref().is_some_and(EtcdError::is_tls) {
        *last = Some(err);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_before_a_proposal_are_safe_to_retry() {
        for message in ["etcdserver: no leader", "etcdserver: not capable"] {
            assert_eq!(verdict(&Status::unavailable(message)), Verdict::NotApplied);
        }
        assert_eq!(
            verdict(&Status::resource_exhausted("etcdserver: too many requests")),
            Verdict::NotApplied
        );
        assert_eq!(
            verdict(&Status::unknown("Service was not ready: transport error")),
            Verdict::NotSent
        );
        let mut lost = Status::unavailable("error trying to connect");
        lost.set_source(std::sync::Arc::new(std::io::Error::new(
            std::io::ErrorKind::NotConnected,
            SessionLost,
        )));
        assert_eq!(verdict(&lost), Verdict::NotSent);
    }

    #[test]
    fn a_lost_answer_is_not_a_refusal() {
        for message in [
            "etcdserver: request timed out",
            "etcdserver: leader changed",
            "error trying to connect",
        ] {
            assert_eq!(verdict(&Status::unavailable(message)), Verdict::Lost);
        }
        assert_eq!(verdict(&Status::cancelled("h2 reset")), Verdict::Lost);
        assert_eq!(
            verdict(&Status::internal("h2 protocol error")),
            Verdict::Lost
        );
    }

    #[test]
    fn etcd_refusals_are_answers() {
        assert_eq!(
            verdict(&Status::not_found("etcdserver: requested lease not found")),
            Verdict::Answer
        );
        assert_eq!(
            verdict(&Status::resource_exhausted(
                "etcdserver: mvcc: database space exceeded"
            )),
            Verdict::Answer
        );
        assert_eq!(
            verdict(&Status::unauthenticated("etcdserver: invalid auth token")),
            Verdict::BadToken
        );
    }

    #[test]
    fn a_client_needs_an_endpoint() {
        let err = EtcdClient::builder(Vec::<String>::new())
            .build()
            .expect_err("no endpoints");
        assert!(matches!(err, EtcdError::NoEndpoints));
    }

    fn three_members() -> EtcdClient {
        EtcdClient::builder([
            "http://127.0.0.1:1",
            "http://127.0.0.1:2",
            "http://127.0.0.1:3",
        ])
        .build()
        .expect("valid endpoints")
    }

    #[test]
    fn moving_on_passes_over_a_demoted_member_until_it_answers_again() {
        let client = three_members();
        let members = &client.inner.members;
        members[1].demote();
        client.advance(0);
        assert_eq!(client.current_endpoint(), "http://127.0.0.1:3");
        members[1].answered();
        client.advance(2);
        assert_eq!(client.current_endpoint(), "http://127.0.0.1:1");
        client.advance(0);
        assert_eq!(client.current_endpoint(), "http://127.0.0.1:2");
    }

    #[test]
    fn with_every_other_member_demoted_the_next_in_order_is_tried() {
        let client = three_members();
        for member in &client.inner.members {
            member.demote();
        }
        client.advance(0);
        assert_eq!(client.current_endpoint(), "http://127.0.0.1:2");
    }

    #[test]
    fn a_request_already_moved_on_is_not_moved_again() {
        let client = three_members();
        client.advance(0);
        // A second request that failed on the first member too.
        client.advance(0);
        assert_eq!(client.current_endpoint(), "http://127.0.0.1:2");
    }

    #[test]
    fn a_view_with_a_shorter_attempt_shares_the_choice_of_member() {
        let client = three_members();
        let view = client.with_attempt_timeout(Duration::from_millis(100));
        assert_eq!(view.attempt_timeout, Duration::from_millis(100));
        assert_eq!(
            client
                .with_attempt_timeout(Duration::from_secs(60))
                .attempt_timeout,
            DEFAULT_ATTEMPT_TIMEOUT
        );
        view.advance(0);
        assert_eq!(client.current_endpoint(), "http://127.0.0.1:2");
    }

    #[tokio::test]
    async fn a_past_deadline_fails_at_once_and_sends_nothing() {
        let client = EtcdClient::builder(["http://127.0.0.1:1"])
            .build()
            .expect("valid endpoint");
        let mut sent = 0;
        let result: Result<(), _> = client
            .call(Instant::now(), Retry::Safe, |_| {
                sent += 1;
                async { Ok(()) }
            })
            .await;
        assert!(matches!(
            result,
            Err(EtcdError::DeadlineExceeded {
                attempts: 0,
                last: None
            })
        ));
        assert_eq!(sent, 0);
    }
}

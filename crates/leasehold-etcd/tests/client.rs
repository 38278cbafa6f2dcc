//! The etcd protocol layer (`leasehold_etcd::client`, feature `client`) against a
//! real etcd cluster: a create-if-absent transaction under a lease names
//! the owner; keys go with their lease (revoked or expired); a watch sees
//! a delete and resumes from its revision; every request is bounded by
//! its deadline, moves off a stopped leader within it, and errors by it
//! on a cut-off member, after which another member answers.

use std::time::Duration;

use leasehold_etcd::client::{
    Cmp, Compare, Credentials, EtcdClient, EtcdError, EventKind, Op, OpResult, Range, Txn,
    WatchKeys,
};
use leasehold_testkit::EtcdCluster;
use tokio::time::{Instant, timeout};

/// A deadline for requests that should succeed: long enough to ride out
/// an election (about a second with the test kit's timers).
const PATIENT: Duration = Duration::from_secs(10);

/// How late past its deadline a request may return: scheduling slack, far
/// below the ~6 s a cut-off member holds a request.
const SLACK: Duration = Duration::from_millis(400);

fn start(members: usize) -> EtcdCluster {
    EtcdCluster::start(members).expect("etcd cluster (scripts/install-deps.sh installs etcd)")
}

fn client(endpoints: Vec<String>) -> EtcdClient {
    EtcdClient::builder(endpoints).build().expect("client")
}

fn patient() -> Instant {
    Instant::now() + PATIENT
}

/// Creates `key = owner` under `lease` if the key is absent; either way
/// reads the key back (the owner's value and lease).
fn claim(key: &str, owner: &str, lease: i64) -> Txn {
    Txn::new()
        .when(Compare::create_revision(key, Cmp::Equal, 0))
        .then(Op::put(key, owner, lease))
        .then(Op::range(Range::key(key)))
        .otherwise(Op::range(Range::key(key)))
}

/// The endpoints with member `first`'s first, so the client starts there.
fn starting_at(cluster: &EtcdCluster, first: usize) -> Vec<String> {
    let mut endpoints = cluster.endpoints();
    endpoints.swap(0, first);
    endpoints
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_txn_creates_a_key_under_a_lease_only_if_absent_and_names_its_owner() {
    let cluster = start(1);
    let etcd = client(cluster.endpoints());
    let alice = etcd
        .grant(Duration::from_secs(30), patient())
        .await
        .expect("grant");
    let bob = etcd
        .grant(Duration::from_secs(30), patient())
        .await
        .expect("grant");
    assert_ne!(alice.id, bob.id);
    assert!(alice.ttl >= 30, "granted ttl {}", alice.ttl);

    let won = etcd
        .txn(&claim("lock/a", "alice", alice.id), patient())
        .await
        .expect("txn");
    assert!(won.succeeded);
    assert_eq!(won.results[0], OpResult::Put);
    let kv = &won.first_range()[0];
    assert_eq!((kv.value.as_slice(), kv.lease), (&b"alice"[..], alice.id));
    // The key's creation revision is the transaction's: the fencing token.
    assert_eq!(kv.create_revision, won.header.revision);

    let lost = etcd
        .txn(&claim("lock/a", "bob", bob.id), patient())
        .await
        .expect("txn");
    assert!(!lost.succeeded, "a second owner was let in");
    let owner = &lost.first_range()[0];
    assert_eq!(
        (owner.value.as_slice(), owner.lease),
        (&b"alice"[..], alice.id)
    );
    assert_eq!(owner.create_revision, kv.create_revision);
    assert!(lost.header.revision >= won.header.revision);

    // A comparison on the lease tells the owner from the loser.
    let mine = Txn::new()
        .when(Compare::lease("lock/a", Cmp::Equal, bob.id))
        .then(Op::delete("lock/a"));
    let mine = etcd.txn(&mine, patient()).await.expect("txn");
    assert!(!mine.succeeded, "bob deleted alice's key");
    let read = etcd
        .range(&Range::key("lock/a"), patient())
        .await
        .expect("range");
    assert_eq!(read.kvs, vec![kv.clone()]);
}

/// A waiter's read of the key just ahead of it: the newest key of the
/// queue created before its own, whatever the keys' names (creation order,
/// not key order), and none for the oldest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_just_ahead_is_the_newest_created_before() {
    let cluster = start(1);
    let etcd = client(cluster.endpoints());
    let mut created = Vec::new();
    // Names in the reverse of creation order, and a key outside the queue
    // created in between.
    for name in ["q/c", "q/b", "elsewhere", "q/a"] {
        let put = Txn::new().then(Op::put(name, "", 0));
        let put = etcd.txn(&put, patient()).await.expect("put");
        created.push((name, put.header.revision));
    }
    let ahead_of = |revision| {
        Range::prefix("q/")
            .created_before(revision)
            .newest_first()
            .limit(1)
    };
    for (of, expected) in [(3, Some("q/b")), (1, Some("q/c")), (0, None)] {
        let (name, revision) = created[of];
        let read = etcd
            .range(&ahead_of(revision), patient())
            .await
            .expect("range");
        let found = read
            .kvs
            .first()
            .map(|kv| String::from_utf8_lossy(&kv.key).into_owned());
        assert_eq!(found.as_deref(), expected, "ahead of {name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_disappears_when_its_lease_is_revoked() {
    let cluster = start(1);
    let etcd = client(cluster.endpoints());
    let lease = etcd
        .grant(Duration::from_secs(30), patient())
        .await
        .expect("grant");
    let put = Txn::new().then(Op::put("lock/r", "alice", lease.id));
    etcd.txn(&put, patient()).await.expect("put");
    assert!(
        etcd.keep_alive_once(lease.id, patient())
            .await
            .expect("keep-alive")
            > 0
    );
    let ttl = etcd.time_to_live(lease.id, patient()).await.expect("ttl");
    assert!(
        ttl.is_some_and(|ttl| ttl.ttl > 0 && ttl.granted_ttl == lease.ttl),
        "{ttl:?}"
    );

    assert!(etcd.revoke(lease.id, patient()).await.expect("revoke"));
    let read = etcd
        .range(&Range::key("lock/r"), patient())
        .await
        .expect("range");
    assert!(
        read.kvs.is_empty(),
        "the key outlived its lease: {:?}",
        read.kvs
    );
    assert_eq!(
        etcd.time_to_live(lease.id, patient()).await.expect("ttl"),
        None
    );
    assert!(matches!(
        etcd.keep_alive_once(lease.id, patient()).await,
        Err(EtcdError::LeaseNotFound { lease: id }) if id == lease.id
    ));
    assert!(
        !etcd
            .revoke(lease.id, patient())
            .await
            .expect("second revoke")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_disappears_when_its_lease_expires() {
    let cluster = start(1);
    let etcd = client(cluster.endpoints());
    let lease = etcd
        .grant(Duration::from_secs(1), patient())
        .await
        .expect("grant");
    let granted = Instant::now();
    let put = Txn::new().then(Op::put("lock/e", "alice", lease.id));
    let put = etcd.txn(&put, patient()).await.expect("put");
    let mut watch = etcd
        .watch(&WatchKeys::key("lock/e"), put.header.revision, patient())
        .await
        .expect("watch");

    let deleted = timeout(PATIENT, async {
        loop {
            let batch = watch.next().await.expect("watch");
            if let Some(event) = batch.events.iter().find(|e| e.kind == EventKind::Delete) {
                return event.clone();
            }
        }
    })
    .await
    .expect("the key outlived its expired lease");
    assert!(deleted.kv.mod_revision > put.header.revision);
    // Not before the lease could end: etcd gives a lease at least its TTL.
    assert!(
        granted.elapsed() >= Duration::from_millis(900),
        "{:?}",
        granted.elapsed()
    );
    let read = etcd
        .range(&Range::key("lock/e"), patient())
        .await
        .expect("range");
    assert!(read.kvs.is_empty());
    assert_eq!(
        etcd.time_to_live(lease.id, patient()).await.expect("ttl"),
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_sees_a_delete_and_resumes_from_its_revision() {
    let cluster = start(1);
    let etcd = client(cluster.endpoints());
    let put = Txn::new().then(Op::put("queue/1", "w1", 0));
    let put = etcd.txn(&put, patient()).await.expect("put");
    let mut watch = etcd
        .watch(
            &WatchKeys::prefix("queue/"),
            put.header.revision + 1,
            patient(),
        )
        .await
        .expect("watch");
    assert_eq!(watch.next_revision(), put.header.revision + 1);

    let delete = etcd
        .txn(&Txn::new().then(Op::delete("queue/1")), patient())
        .await
        .expect("delete");
    assert_eq!(delete.results, vec![OpResult::Delete { deleted: 1 }]);
    let batch = timeout(PATIENT, watch.next())
        .await
        .expect("no event")
        .expect("watch");
    assert_eq!(batch.events.len(), 1, "{batch:?}");
    assert_eq!(batch.events[0].kind, EventKind::Delete);
    assert_eq!(batch.events[0].kv.key, b"queue/1");
    assert_eq!(batch.events[0].kv.mod_revision, delete.header.revision);
    assert_eq!(watch.next_revision(), delete.header.revision + 1);

    // What happens while no watch runs is not lost: a new watch from the
    // old one's next revision sees it, and not the delete again.
    let resume = watch.next_revision();
    drop(watch);
    let put = etcd
        .txn(&Txn::new().then(Op::put("queue/2", "w2", 0)), patient())
        .await
        .expect("put");
    let mut watch = etcd
        .watch(&WatchKeys::prefix("queue/"), resume, patient())
        .await
        .expect("watch again");
    let batch = timeout(PATIENT, watch.next())
        .await
        .expect("no event")
        .expect("watch");
    assert_eq!(batch.events.len(), 1, "{batch:?}");
    assert_eq!(batch.events[0].kind, EventKind::Put);
    assert_eq!(batch.events[0].kv.key, b"queue/2");
    assert_eq!(batch.events[0].kv.create_revision, put.header.revision);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_already_past_errors_at_once_and_writes_nothing() {
    let cluster = start(1);
    let etcd = client(cluster.endpoints());
    let started = Instant::now();
    let past = started
        .checked_sub(Duration::from_millis(1))
        .unwrap_or(started);
    let result = etcd.txn(&claim("lock/p", "alice", 0), past).await;
    assert!(
        matches!(result, Err(EtcdError::DeadlineExceeded { attempts: 0, .. })),
        "{result:?}"
    );
    let result = etcd.range(&Range::key("lock/p"), past).await;
    assert!(matches!(
        result,
        Err(EtcdError::DeadlineExceeded { attempts: 0, .. })
    ));
    assert!(
        started.elapsed() < Duration::from_millis(100),
        "{:?}",
        started.elapsed()
    );
    let read = etcd
        .range(&Range::key("lock/p"), patient())
        .await
        .expect("range");
    assert!(read.kvs.is_empty(), "a request past its deadline wrote");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_to_a_stopped_leader_moves_to_another_member_within_the_deadline() {
    let cluster = start(3);
    let leader = cluster.wait_for_leader(PATIENT).expect("leader");
    let leader_id = cluster.member(leader).id();
    let etcd = client(starting_at(&cluster, leader));
    let put = Txn::new().then(Op::put("k", "v", 0));
    let put = etcd.txn(&put, patient()).await.expect("put");
    assert_eq!(
        put.header.member_id, leader_id,
        "the client did not start at the leader"
    );

    cluster.member(leader).stop().expect("stop the leader");
    let deadline = Instant::now() + Duration::from_secs(5);
    let read = etcd
        .range(&Range::key("k"), deadline)
        .await
        .expect("read after the leader stopped");
    assert!(Instant::now() <= deadline + SLACK);
    assert_ne!(read.header.member_id, leader_id);
    assert_eq!(read.kvs[0].value, b"v");

    // A write from a client that has not met the leader yet: the new
    // connection's check finds it gone before the write goes out, so the
    // write moves on too.
    let fresh = client(starting_at(&cluster, leader));
    let deadline = Instant::now() + Duration::from_secs(5);
    let write = fresh
        .txn(&Txn::new().then(Op::put("k", "w", 0)), deadline)
        .await
        .expect("write after the leader stopped");
    assert!(Instant::now() <= deadline + SLACK);
    assert_ne!(write.header.member_id, leader_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_to_a_cut_off_member_errors_by_the_deadline_then_another_member_answers() {
    let cluster = start(3);
    let leader = cluster.wait_for_leader(PATIENT).expect("leader");
    let leader_id = cluster.member(leader).id();
    let etcd = client(starting_at(&cluster, leader));
    let read = etcd.range(&Range::key("k"), patient()).await.expect("read");
    assert_eq!(
        read.header.member_id, leader_id,
        "the client did not start at the leader"
    );

    // Cut off, the leader still believes it leads for an election timeout
    // (500 ms): it takes the write and cannot commit it, and would hold
    // it about 6 s. The deadline ends the wait, and the write's outcome is
    // unknown: it went out. (On a machine so slow that the leader stepped
    // down first, it refuses with `no leader`, and the client finds no
    // other leader before the deadline either.)
    cluster.member(leader).cut_off();
    let deadline = Instant::now() + Duration::from_millis(300);
    let result = etcd.txn(&claim("lock/c", "alice", 0), deadline).await;
    let returned = Instant::now();
    assert!(
        matches!(
            result,
            Err(EtcdError::OutcomeUnknown { .. } | EtcdError::DeadlineExceeded { .. })
        ),
        "{result:?}"
    );
    assert!(
        returned <= deadline + SLACK,
        "returned {:?} late",
        returned - deadline
    );

    // The next request goes to another member, which answers once the
    // others have elected a leader among themselves.
    let read = etcd
        .range(&Range::key("lock/c"), patient())
        .await
        .expect("read");
    assert_ne!(read.header.member_id, leader_id);
    let write = etcd
        .txn(&claim("lock/c", "bob", 0), patient())
        .await
        .expect("write on the majority");
    assert_ne!(write.header.member_id, leader_id);

    // A read sent to the cut-off member by a fresh client moves on within
    // one deadline: reads are retried on the next member.
    let fresh = client(starting_at(&cluster, leader));
    let deadline = Instant::now() + Duration::from_secs(4);
    let read = fresh
        .range(&Range::key("lock/c"), deadline)
        .await
        .expect("read");
    assert!(Instant::now() <= deadline + SLACK);
    assert_ne!(read.header.member_id, leader_id);
    assert_eq!(read.kvs[0].value, b"bob");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_broken_by_a_stopped_member_resumes_on_another_from_its_revision() {
    let cluster = start(3);
    let leader = cluster.wait_for_leader(PATIENT).expect("leader");
    // A follower: stopping it needs no election.
    let follower = (leader + 1) % cluster.len();
    let etcd = client(starting_at(&cluster, follower));
    let put = etcd
        .txn(&Txn::new().then(Op::put("queue/1", "w1", 0)), patient())
        .await
        .expect("put");
    let mut watch = etcd
        .watch(&WatchKeys::prefix("queue/"), put.header.revision, patient())
        .await
        .expect("watch");
    assert_eq!(watch.endpoint(), cluster.member(follower).endpoint());
    let batch = timeout(PATIENT, watch.next())
        .await
        .expect("no event")
        .expect("watch");
    assert_eq!(batch.events[0].kv.key, b"queue/1");

    cluster.member(follower).stop().expect("stop the member");
    let ended = timeout(Duration::from_secs(30), async {
        loop {
            match watch.next().await {
                // Progress notifications may come first.
                Ok(batch) if batch.events.is_empty() => {}
                other => return other,
            }
        }
    })
    .await
    .expect("the watch did not notice its member stopped");
    assert!(
        matches!(ended, Err(EtcdError::WatchLost { .. })),
        "{ended:?}"
    );

    // The stopped member's session may learn that it is gone only from
    // this write, whose outcome is then unknown (the client never resends
    // a write that may have been applied): a create-if-absent, asked
    // again, settles it, and the key's revision is the one write the
    // resumed watch must see.
    let create = Txn::new()
        .when(Compare::create_revision("queue/2", Cmp::Equal, 0))
        .then(Op::put("queue/2", "w2", 0))
        .otherwise(Op::range(Range::key("queue/2")));
    let mut missed = None;
    for _ in 0..3 {
        match etcd.txn(&create, patient()).await {
            Ok(reply) if reply.succeeded => missed = Some(reply.header.revision),
            Ok(reply) => missed = reply.first_range().first().map(|kv| kv.mod_revision),
            Err(EtcdError::OutcomeUnknown { .. }) => continue,
            Err(err) => panic!("put on the others: {err:?}"),
        }
        break;
    }
    let missed = missed.expect("put on the others: the outcome stayed unknown");
    let mut resumed = etcd
        .watch(
            &WatchKeys::prefix("queue/"),
            watch.next_revision(),
            patient(),
        )
        .await
        .expect("watch again");
    assert_ne!(resumed.endpoint(), cluster.member(follower).endpoint());
    let batch = timeout(PATIENT, resumed.next())
        .await
        .expect("no event")
        .expect("watch");
    assert_eq!(batch.events.len(), 1, "{batch:?}");
    assert_eq!(batch.events[0].kv.key, b"queue/2");
    assert_eq!(batch.events[0].kv.mod_revision, missed);
}

/// One JSON request to a member's HTTP gateway, past its gate; the reply's
/// body.
fn gateway(member: &leasehold_testkit::EtcdMember, path: &str, body: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(member.client_addr()).expect("connect");
    stream
        .set_read_timeout(Some(PATIENT))
        .expect("read timeout");
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: etcd\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut reply = String::new();
    stream.read_to_string(&mut reply).expect("read");
    assert!(reply.starts_with("HTTP/1.1 200"), "{path}: {reply}");
    reply
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_authenticate_and_a_password_never_shows_in_an_error() {
    const PASSWORD: &str = "correct-horse-battery";
    const WRONG: &str = "wrong-staple-secret";
    let cluster = start(1);
    let member = cluster.member(0);
    gateway(member, "/v3/auth/role/add", r#"{"name":"root"}"#);
    gateway(
        member,
        "/v3/auth/user/add",
        &format!(r#"{{"name":"root","password":"{PASSWORD}"}}"#),
    );
    gateway(
        member,
        "/v3/auth/user/grant",
        r#"{"user":"root","role":"root"}"#,
    );
    gateway(member, "/v3/auth/enable", "{}");

    let root = EtcdClient::builder(cluster.endpoints())
        .credentials(Credentials::new("root", PASSWORD))
        .build()
        .expect("client");
    let put = root
        .txn(&Txn::new().then(Op::put("k", "v", 0)), patient())
        .await
        .expect("an authenticated write");
    let read = root.range(&Range::key("k"), patient()).await.expect("read");
    assert_eq!(read.kvs[0].mod_revision, put.header.revision);

    let anonymous = client(cluster.endpoints());
    let refused = anonymous.range(&Range::key("k"), patient()).await;
    assert!(
        matches!(refused, Err(EtcdError::Rejected { .. })),
        "{refused:?}"
    );

    let wrong = EtcdClient::builder(cluster.endpoints())
        .credentials(Credentials::new("root", WRONG))
        .build()
        .expect("client");
    let started = Instant::now();
    let err = wrong
        .range(&Range::key("k"), patient())
        .await
        .expect_err("a wrong password was let in");
    assert!(
        matches!(err, EtcdError::AuthFailed { ref user, .. } if user == "root"),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "a refusal was retried"
    );
    let mut text = format!("{err} {err:?} {wrong:?}");
    let mut source = std::error::Error::source(&err);
    while let Some(cause) = source {
        text.push_str(&format!(" {cause} {cause:?}"));
        source = cause.source();
    }
    assert!(!text.contains(WRONG), "{text}");
    assert!(!text.contains(PASSWORD), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_member_costs_a_read_one_attempt_timeout_and_a_write_its_deadline() {
    let cluster = start(3);
    let leader = cluster.wait_for_leader(PATIENT).expect("leader");
    let follower = (leader + 1) % cluster.len();
    let follower_id = cluster.member(follower).id();
    let etcd = client(starting_at(&cluster, follower));
    let put = etcd
        .txn(&Txn::new().then(Op::put("k", "v", 0)), patient())
        .await
        .expect("put");
    assert_eq!(put.header.member_id, follower_id);

    // A frozen member keeps its connections and answers nothing.
    cluster.member(follower).pause().expect("pause");
    let deadline = Instant::now() + Duration::from_millis(700);
    let write = etcd
        .txn(&Txn::new().then(Op::put("k", "w", 0)), deadline)
        .await;
    assert!(
        matches!(write, Err(EtcdError::OutcomeUnknown { .. })),
        "{write:?}"
    );
    assert!(Instant::now() <= deadline + SLACK);

    // A fresh client starting there: the new connection's check times out
    // after one attempt timeout (1 s), and the read moves on.
    let fresh = client(starting_at(&cluster, follower));
    let started = Instant::now();
    let read = fresh
        .range(&Range::key("k"), patient())
        .await
        .expect("read");
    assert_ne!(read.header.member_id, follower_id);
    assert!(
        started.elapsed() < leasehold_etcd::client::DEFAULT_ATTEMPT_TIMEOUT + SLACK * 2,
        "{:?}",
        started.elapsed()
    );
    cluster.member(follower).resume().expect("resume");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_carries_on_after_the_whole_cluster_restarts() {
    let cluster = start(3);
    let etcd = client(cluster.endpoints());
    let lease = etcd
        .grant(Duration::from_secs(60), patient())
        .await
        .expect("grant");
    let put = Txn::new().then(Op::put("k", "v", lease.id));
    let put = etcd.txn(&put, patient()).await.expect("put");

    cluster.restart().expect("restart every member");
    // Every session's connection broke: each request finds that out
    // before sending, and connects afresh.
    let read = etcd.range(&Range::key("k"), patient()).await.expect("read");
    assert_eq!(read.kvs[0].mod_revision, put.header.revision);
    assert!(
        etcd.keep_alive_once(lease.id, patient())
            .await
            .expect("keep-alive")
            > 0
    );
    let write = etcd
        .txn(&Txn::new().then(Op::put("k", "w", lease.id)), patient())
        .await
        .expect("write after the restart");
    assert!(write.header.revision > put.header.revision);
}

//! Leadership over every way of taking a lease: one leader at a time,
//! terms numbered by their fencing tokens, resign hands over, a stopped
//! leader is replaced and learns it lost, a superseded term ends, observers
//! see each change, faults shorter than the budget never reach the caller,
//! and bad input gets a typed error.
#![cfg(all(feature = "handoff", feature = "quorum"))]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use leasehold::{
    Election, Error, FencingToken, HandoffLocker, Lessor, Locker, LostCause, Quorum, RetryStrategy,
    TermOutcome,
};
use leasehold_testkit::{FaultProxy, RedisServer};

mod common;

type TestResult = Result<(), Box<dyn std::error::Error>>;
type Made<L> = Result<L, Box<dyn std::error::Error>>;

const SECOND: Duration = Duration::from_secs(1);
/// A hang detector, not a timing assertion.
const HUNG: Duration = Duration::from_secs(30);

fn clients(addrs: &[String]) -> Result<Vec<redis::Client>, redis::RedisError> {
    addrs
        .iter()
        .map(|a| redis::Client::open(a.as_str()))
        .collect()
}

/// The three ways, each over the servers at `urls` (one for the first
/// two, all of them for the quorum): what one candidate process opens.
async fn polling(urls: &[String], timeout: Duration) -> Made<Locker> {
    let client = redis::Client::open(urls[0].as_str())?;
    Ok(Locker::builder()
        .command_timeout(timeout)
        .connect(&client)
        .await?)
}

async fn handoff(urls: &[String], timeout: Duration) -> Made<HandoffLocker> {
    let client = redis::Client::open(urls[0].as_str())?;
    let locker = Locker::builder()
        .command_timeout(timeout)
        .connect(&client)
        .await?;
    Ok(HandoffLocker::builder().build(locker, &client).await?)
}

async fn quorum(urls: &[String], timeout: Duration) -> Made<Quorum> {
    Ok(Quorum::builder()
        .node_timeout(timeout)
        .connect(clients(urls)?)
        .await?)
}

fn urls(servers: &[RedisServer]) -> Vec<String> {
    servers.iter().map(RedisServer::url).collect()
}

fn election<L: Lessor>(lessor: L, name: &str, candidate: &str, ttl: Duration) -> Made<Election<L>> {
    Ok(Election::builder(lessor, name)
        .candidate(candidate)
        .ttl(ttl)
        .observe_every(Duration::from_millis(10))
        .build()?)
}

/// Three candidates campaign at once, each leads in turn: never two terms
/// at once, each term's token above the last, and `leader()` names the
/// one that leads.
async fn one_leader_at_a_time<L: Lessor>(
    name: &str,
    open: impl AsyncFn() -> Made<L>,
) -> TestResult {
    let leading = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..3 {
        let election = election(open().await?, name, &format!("c{i}"), SECOND)?;
        let (leading, most) = (leading.clone(), most.clone());
        tasks.spawn(async move {
            let term = election.campaign().await?;
            let now = leading.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            let seen = election.leader().await?;
            leading.fetch_sub(1, Ordering::SeqCst);
            let fence = term.fence();
            term.resign().await?;
            Ok::<_, Error>((election.candidate().to_owned(), fence, seen))
        });
    }
    let mut terms = Vec::new();
    while let Some(done) = tokio::time::timeout(HUNG, tasks.join_next()).await? {
        terms.push(done??);
    }
    assert_eq!(most.load(Ordering::SeqCst), 1, "{name}: two terms at once");
    assert_eq!(terms.len(), 3);
    for (candidate, fence, seen) in &terms {
        let seen = seen
            .as_ref()
            .ok_or(format!("{name}: nobody named while {candidate} led"))?;
        assert_eq!(&seen.candidate, candidate, "{name}");
        assert_eq!(seen.fence, *fence, "{name}");
    }
    let mut fences: Vec<FencingToken> = terms.iter().map(|t| t.1).collect();
    fences.sort();
    fences.dedup();
    assert_eq!(fences.len(), 3, "{name}: a term token repeated: {terms:?}");
    Ok(())
}

#[tokio::test]
async fn one_leader_at_a_time_every_way() -> TestResult {
    let servers = RedisServer::start_many(3)?;
    let urls = urls(&servers);
    one_leader_at_a_time("turns-poll", async || polling(&urls, SECOND).await).await?;
    one_leader_at_a_time("turns-handoff", async || handoff(&urls, SECOND).await).await?;
    one_leader_at_a_time("turns-quorum", async || quorum(&urls, SECOND).await).await?;
    Ok(())
}

/// A waits as follower behind B; B resigns and A leads, with a greater
/// token; an observer sees B, then A (perhaps nobody in between), and
/// nobody once A resigns.
async fn resign_hands_over_and_observers_see_it<L: Lessor>(
    name: &str,
    open: impl AsyncFn() -> Made<L>,
) -> TestResult {
    // A long TTL: only a resign can hand over within the test.
    let ttl = Duration::from_secs(60);
    let first = election(open().await?, name, "first", ttl)?;
    let second = election(open().await?, name, "second", ttl)?;
    let mut observer = election(open().await?, name, "observer", ttl)?.observe();
    assert!(
        observer.changed().await?.is_none(),
        "{name}: a leader before any campaign"
    );

    let term = first.campaign().await?;
    let seen = tokio::time::timeout(HUNG, observer.changed()).await??;
    assert_eq!(
        seen.map(|l| (l.candidate, l.fence)),
        Some(("first".to_owned(), term.fence()))
    );

    let follower = tokio::spawn(async move { second.campaign().await });
    let first_fence = term.fence();
    term.resign().await?;
    let next = tokio::time::timeout(HUNG, follower).await???;
    assert!(
        next.fence() > first_fence,
        "{name}: {:?} after {first_fence:?}",
        next.fence()
    );

    let seen = tokio::time::timeout(HUNG, async {
        loop {
            match observer.changed().await? {
                Some(leader) => return Ok::<_, Error>(leader),
                None => continue,
            }
        }
    })
    .await??;
    assert_eq!(
        (seen.candidate.as_str(), seen.fence),
        ("second", next.fence())
    );
    assert!(seen.expires_within <= ttl);

    next.resign().await?;
    let seen = tokio::time::timeout(HUNG, observer.changed()).await??;
    assert!(
        seen.is_none(),
        "{name}: a leader after the last resigned: {seen:?}"
    );

    // The lock taken by someone who never named itself: the record left
    // by the last leader is not believed.
    let lessor = open().await?;
    let keys = first.keys().clone();
    let lease = lessor.acquire(&keys, ttl).await?;
    let seen = first.leader().await?;
    assert!(
        seen.is_none(),
        "{name}: an earlier term's record believed: {seen:?}"
    );
    lease.release().await?;
    Ok(())
}

#[tokio::test]
async fn resign_hands_over_at_once_and_observers_see_each_change_every_way() -> TestResult {
    let servers = RedisServer::start_many(3)?;
    let urls = urls(&servers);
    resign_hands_over_and_observers_see_it("resign-poll", async || polling(&urls, SECOND).await)
        .await?;
    resign_hands_over_and_observers_see_it("resign-handoff", async || handoff(&urls, SECOND).await)
        .await?;
    resign_hands_over_and_observers_see_it("resign-quorum", async || quorum(&urls, SECOND).await)
        .await?;
    Ok(())
}

/// The leader's connections go silent (a stopped process, as Redis sees
/// it): its term is lost (its watchdog cannot refresh), and a follower
/// leads with a greater token once the lease ran out.
async fn a_stopped_leader_is_replaced<L: Lessor>(
    name: &str,
    proxies: &[FaultProxy],
    through_proxies: impl AsyncFn() -> Made<L>,
    direct: impl AsyncFn() -> Made<L>,
) -> TestResult {
    let ttl = Duration::from_millis(600);
    let stopped = election(through_proxies().await?, name, "stopped", ttl)?;
    let follower = election(direct().await?, name, "follower", ttl)?;
    let term = stopped.campaign().await?;
    let waiting = tokio::spawn(async move { follower.campaign().await });
    for proxy in proxies {
        proxy.blackhole(true);
    }
    let cause = tokio::time::timeout(HUNG, term.lost()).await?;
    assert_eq!(cause, LostCause::Unreachable, "{name}");
    assert!(!term.is_leader());
    let next = tokio::time::timeout(HUNG, waiting).await???;
    assert!(next.fence() > term.fence(), "{name}");
    assert!(matches!(
        term.run(async {}).await,
        Err(Error::LeaseLost {
            cause: LostCause::Unreachable,
            ..
        })
    ));
    for proxy in proxies {
        proxy.blackhole(false);
    }
    drop(term);
    next.resign().await?;
    Ok(())
}

#[tokio::test]
async fn a_stopped_leader_is_replaced_and_its_term_is_lost_every_way() -> TestResult {
    let servers = RedisServer::start_many(3)?;
    let direct = urls(&servers);
    let proxies = servers
        .iter()
        .map(|s| FaultProxy::start(s.addr()))
        .collect::<Result<Vec<_>, _>>()?;
    let proxied: Vec<String> = proxies
        .iter()
        .map(|p| format!("redis://{}", p.addr()))
        .collect();
    let short = Duration::from_millis(150);
    a_stopped_leader_is_replaced(
        "stopped-poll",
        &proxies[..1],
        async || polling(&proxied, short).await,
        async || polling(&direct, short).await,
    )
    .await?;
    a_stopped_leader_is_replaced(
        "stopped-handoff",
        &proxies[..1],
        async || handoff(&proxied, short).await,
        async || handoff(&direct, short).await,
    )
    .await?;
    a_stopped_leader_is_replaced(
        "stopped-quorum",
        &proxies,
        async || quorum(&proxied, short).await,
        async || quorum(&direct, short).await,
    )
    .await?;
    Ok(())
}

/// A term marked superseded (the guard refused it) stops its work, says
/// why, and still resigns cleanly so the next term starts at once.
#[tokio::test]
async fn a_superseded_term_stops_its_work_and_says_why() -> TestResult {
    let servers = RedisServer::start_many(1)?;
    let urls = urls(&servers);
    let ttl = Duration::from_secs(60);
    let leader = election(polling(&urls, SECOND).await?, "superseded", "a", ttl)?;
    let other = election(polling(&urls, SECOND).await?, "superseded", "b", ttl)?;
    let term = leader.campaign().await?;
    let (work, stopped) = tokio::join!(term.run(std::future::pending::<()>()), async {
        term.mark_superseded();
        term.lost().await
    });
    assert!(
        matches!(
            work,
            Err(Error::LeaseLost {
                cause: LostCause::Superseded,
                ..
            })
        ),
        "{work:?}"
    );
    assert_eq!(stopped, LostCause::Superseded);
    assert!(!term.is_leader());
    let first = term.fence();
    term.resign().await?;
    let next = tokio::time::timeout(HUNG, other.campaign()).await??;
    assert!(next.fence() > first);
    next.resign().await?;
    Ok(())
}

/// `lead` runs one term and resigns; a lost term is an outcome, not an
/// error; a work that panics unwinds, and the next term still starts.
#[tokio::test]
async fn lead_runs_one_term_and_a_panicking_work_leaves_the_election_usable() -> TestResult {
    let servers = RedisServer::start_many(1)?;
    let urls = urls(&servers);
    let ttl = Duration::from_secs(2);
    let election = election(polling(&urls, SECOND).await?, "lead", "a", ttl)?;

    let outcome = election.lead(async |term| term.fence()).await?;
    let TermOutcome::Finished {
        output: first,
        resign,
    } = outcome
    else {
        return Err(format!("{outcome:?}").into());
    };
    resign?;

    let outcome = election
        .lead(async |term| {
            term.mark_superseded();
            std::future::pending::<()>().await;
        })
        .await?;
    assert!(
        matches!(outcome, TermOutcome::Lost { cause: LostCause::Superseded, fence } if fence > first),
        "{outcome:?}"
    );

    let panicking = election.clone();
    let joined = tokio::spawn(async move {
        panicking
            .lead(async |_term| -> () { panic!("the work panicked") })
            .await
    })
    .await;
    assert!(joined.is_err_and(|e| e.is_panic()));
    let next = tokio::time::timeout(HUNG, election.campaign()).await??;
    assert!(next.fence() > first);
    next.resign().await?;
    Ok(())
}

/// A Redis restart shorter than the budget, while a candidate campaigns
/// and another leads: the campaign rides it out and wins (the restart
/// lost the lock), with a token above the lost term's.
#[tokio::test]
async fn a_campaign_rides_out_a_restart_shorter_than_its_budget() -> TestResult {
    let mut servers = RedisServer::start_many(1)?;
    let urls = urls(&servers);
    let ttl = Duration::from_secs(60);
    let leader = election(polling(&urls, SECOND).await?, "restart", "a", ttl)?;
    let follower = election(polling(&urls, SECOND).await?, "restart", "b", ttl)?;
    let term = leader.campaign().await?;
    let waiting = tokio::spawn(async move { follower.campaign().await });
    servers[0].restart()?;
    let next = tokio::time::timeout(HUNG, waiting).await???;
    assert!(next.fence() > term.fence());
    assert_eq!(next.candidate(), "b");
    drop(term);
    next.resign().await?;
    Ok(())
}

/// The settings a campaign's acquires take are honoured: a cancelled
/// token ends a waiting campaign, and a replica wait no replica can
/// answer keeps a term from starting.
#[tokio::test]
async fn a_campaign_honours_its_cancel_token_and_replica_wait() -> TestResult {
    let servers = RedisServer::start_many(1)?;
    let urls = urls(&servers);
    let leader = election(polling(&urls, SECOND).await?, "settings", "a", 10 * SECOND)?;
    let term = leader.campaign().await?;
    let cancel = tokio_util::sync::CancellationToken::new();
    let follower = Election::builder(polling(&urls, SECOND).await?, "settings")
        .candidate("b")
        .cancel(cancel.clone())
        .build()?;
    let waiting = tokio::spawn(async move { follower.campaign().await });
    cancel.cancel();
    let ended = tokio::time::timeout(HUNG, waiting).await?;
    assert!(
        matches!(
            ended?,
            Err(Error::NotAcquired {
                reason: leasehold::GiveUpReason::Cancelled,
                ..
            })
        ),
        "a cancelled campaign"
    );
    term.resign().await?;

    // No replica to acknowledge: the term never starts; the campaign
    // rides it out for its budget, then says why.
    let unreplicated = Election::builder(polling(&urls, SECOND).await?, "replicas")
        .wait_replicas(1, Duration::from_millis(50))
        .budget(SECOND)
        .build()?;
    let got = tokio::time::timeout(HUNG, unreplicated.campaign()).await?;
    assert!(
        matches!(got, Err(Error::NotReplicated { .. })),
        "{:?}",
        got.map(|t| t.fence())
    );
    Ok(())
}

/// Bad input is refused before any I/O, and what cannot pass returns at
/// once instead of being ridden out.
#[tokio::test]
async fn bad_input_gets_a_typed_error() -> TestResult {
    let servers = RedisServer::start_many(1)?;
    let urls = urls(&servers);
    let locker = polling(&urls, SECOND).await?;
    let refused = |b: leasehold::ElectionBuilder<Locker>| b.build().map(drop);
    assert!(matches!(
        refused(Election::builder(locker.clone(), "")),
        Err(Error::InvalidKey { .. })
    ));
    assert!(matches!(
        refused(Election::builder(locker.clone(), "x").ttl(Duration::ZERO)),
        Err(Error::InvalidTtl { .. })
    ));
    assert!(matches!(
        refused(Election::builder(locker.clone(), "x").candidate("")),
        Err(Error::InvalidOptions(_))
    ));
    assert!(matches!(
        refused(Election::builder(locker.clone(), "x").budget(Duration::ZERO)),
        Err(Error::InvalidOptions(_))
    ));
    assert!(matches!(
        refused(Election::builder(locker.clone(), "x").retry(RetryStrategy::none())),
        Err(Error::InvalidOptions(_))
    ));

    // The election's lock holds a hash: a key of the wrong type is not
    // a fault to ride out.
    let election = election(locker.clone(), "wrongtype", "a", SECOND)?;
    let mut conn = redis::Client::open(urls[0].as_str())?
        .get_multiplexed_async_connection()
        .await?;
    redis::cmd("HSET")
        .arg(election.keys().lock())
        .arg("f")
        .arg("v")
        .query_async::<()>(&mut conn)
        .await?;
    let err = tokio::time::timeout(HUNG, election.campaign())
        .await?
        .expect_err("a campaign on a key of the wrong type must fail");
    assert!(matches!(err, Error::WrongType { .. }), "{err:?}");
    assert!(!err.is_retryable());
    Ok(())
}

/// The README's minimal ACL covers an election: its lock, fence counter
/// and leader record, every way.
#[tokio::test]
async fn an_election_runs_under_the_minimal_acl() -> TestResult {
    let servers = RedisServer::start_many(3)?;
    for server in &servers {
        server.set_acl_user("locker", "pw", common::LOCK_USER_ACL)?;
    }
    let urls: Vec<String> = servers
        .iter()
        .map(|s| format!("redis://locker:pw@{}:{}", s.host(), s.port()))
        .collect();
    async fn lead_once<L: Lessor>(lessor: L, name: &str) -> TestResult {
        let election = election(lessor, name, "acl", SECOND)?;
        let term = election.campaign().await?;
        let leader = election.leader().await?.ok_or("nobody named")?;
        assert_eq!(
            (leader.candidate.as_str(), leader.fence),
            ("acl", term.fence())
        );
        term.resign().await?;
        Ok(())
    }
    lead_once(polling(&urls, SECOND).await?, "acl-poll").await?;
    lead_once(handoff(&urls, SECOND).await?, "acl-handoff").await?;
    lead_once(quorum(&urls, SECOND).await?, "acl-quorum").await?;
    Ok(())
}

/// On a polling way, a leader that resigns and campaigns again at once
/// stands back for its step-down, so the follower waiting leads next
/// (without it, the resigner's own `SET` usually comes first).
#[tokio::test]
async fn a_resigned_leader_that_campaigns_again_at_once_hands_over_on_a_polling_way() -> TestResult
{
    let servers = RedisServer::start_many(3)?;
    let urls = urls(&servers);
    async fn stands_back<L: Lessor>(name: &str, open: impl AsyncFn() -> Made<L>) -> TestResult {
        let ttl = Duration::from_secs(60);
        // A step-down far above any scheduling delay: the follower polls
        // every 5 to 15 ms.
        let make = async |candidate: &str| -> Made<Election<L>> {
            Ok(Election::builder(open().await?, name)
                .candidate(candidate)
                .ttl(ttl)
                .step_down(Duration::from_secs(2))
                .build()?)
        };
        let (leader, follower) = (make("leader").await?, make("follower").await?);
        let term = leader.campaign().await?;
        let waiting = tokio::spawn(async move { follower.campaign().await });
        term.resign().await?;
        let again = tokio::spawn({
            let leader = leader.clone();
            async move { leader.campaign().await }
        });
        let next = tokio::time::timeout(HUNG, waiting).await???;
        assert_eq!(next.candidate(), "follower", "{name}");
        next.resign().await?;
        let back = tokio::time::timeout(HUNG, again).await???;
        assert_eq!(back.candidate(), "leader", "{name}");
        back.resign().await?;
        Ok(())
    }
    stands_back("standback-poll", async || polling(&urls, SECOND).await).await?;
    stands_back("standback-quorum", async || quorum(&urls, SECOND).await).await?;
    stands_back("standback-handoff", async || handoff(&urls, SECOND).await).await?;
    Ok(())
}

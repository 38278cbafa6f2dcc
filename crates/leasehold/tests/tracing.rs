//! What the library tells a tracing subscriber: an acquire span whose
//! fields are all recorded on every path (polling, hand-off, quorum,
//! several keys; acquired, gave up, error, dropped), releases (stale ones
//! a WARN), refreshes, lease loss with its cause, hand-off grants and
//! relays; never a lease token or a password.
#![cfg(all(feature = "handoff", feature = "quorum"))]

use leasehold::Lessor;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::{AcquireOptions, FencedKeys, HandoffLocker, Lease, Locker, Quorum, RetryStrategy};
use leasehold_testkit::{RedisOptions, RedisServer};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::prelude::*;
use tracing_subscriber::registry::LookupSpan;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const TTL: Duration = Duration::from_secs(5);
/// A hang detector, not a timing assertion.
const HUNG: Duration = Duration::from_secs(10);
const PASSWORD: &str = "tr4ce-s3cret";

type Fields = BTreeMap<String, String>;

/// A span as last seen: its name and every field recorded on it.
#[derive(Debug, Clone)]
struct SpanSeen {
    name: String,
    fields: Fields,
}

/// One event: level, target, message, fields, and the span it belongs to.
#[derive(Debug, Clone)]
struct EventSeen {
    level: tracing::Level,
    target: String,
    fields: Fields,
    span: Option<String>,
}

impl EventSeen {
    fn message(&self) -> &str {
        self.fields.get("message").map_or("", String::as_str)
    }

    fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

#[derive(Default)]
struct State {
    spans: Vec<SpanSeen>,
    ids: HashMap<u64, usize>,
    events: Vec<EventSeen>,
}

/// Everything seen by the subscriber.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<State>>);

struct Visitor<'a>(&'a mut Fields);

impl Visit for Visitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Seen {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut fields = Fields::new();
        attrs.record(&mut Visitor(&mut fields));
        let mut state = self.0.lock().expect("lock");
        state.spans.push(SpanSeen {
            name: attrs.metadata().name().to_owned(),
            fields,
        });
        let index = state.spans.len() - 1;
        state.ids.insert(id.into_u64(), index);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut state = self.0.lock().expect("lock");
        if let Some(&index) = state.ids.get(&id.into_u64()) {
            values.record(&mut Visitor(&mut state.spans[index].fields));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::new();
        event.record(&mut Visitor(&mut fields));
        let span = ctx.event_span(event).map(|s| s.name().to_owned());
        self.0.lock().expect("lock").events.push(EventSeen {
            level: *event.metadata().level(),
            target: event.metadata().target().to_owned(),
            fields,
            span,
        });
    }
}

impl Seen {
    /// Captures everything traced on this thread while the guard lives (the
    /// tests run on a current-thread runtime, spawned tasks included).
    fn install() -> (Seen, tracing::subscriber::DefaultGuard) {
        let seen = Seen::default();
        let guard = tracing_subscriber::registry()
            .with(seen.clone())
            .set_default();
        (seen, guard)
    }

    fn spans(&self, name: &str) -> Vec<Fields> {
        let state = self.0.lock().expect("lock");
        state
            .spans
            .iter()
            .filter(|s| s.name == name)
            .map(|s| s.fields.clone())
            .collect()
    }

    fn events(&self) -> Vec<EventSeen> {
        self.0.lock().expect("lock").events.clone()
    }

    fn event(&self, message: &str) -> Option<EventSeen> {
        self.events()
            .into_iter()
            .find(|e| e.message().starts_with(message))
    }

    /// Waits (bounded) until an event whose message starts with `message`
    /// and that `matches` has been seen.
    async fn until(
        &self,
        message: &str,
        matches: impl Fn(&EventSeen) -> bool,
    ) -> Result<EventSeen, Box<dyn std::error::Error>> {
        let found = tokio::time::timeout(HUNG, async {
            loop {
                let hit = self
                    .events()
                    .into_iter()
                    .find(|e| e.message().starts_with(message) && matches(e));
                match hit {
                    Some(event) => return event,
                    None => tokio::time::sleep(Duration::from_millis(5)).await,
                }
            }
        })
        .await;
        found.map_err(|_| format!("no event {message:?} in {:#?}", self.events()).into())
    }

    /// Everything seen, as text (to look for secrets).
    fn text(&self) -> String {
        let state = self.0.lock().expect("lock");
        format!("{:?} {:?}", state.spans, state.events)
    }
}

fn once() -> AcquireOptions {
    AcquireOptions::new().retry(RetryStrategy::none())
}

/// Polls `fut` once (it sends its first request) and drops it, as a
/// caller's own timeout would.
async fn poll_once_and_drop<F: Future>(fut: F) -> bool {
    let mut fut = Box::pin(fut);
    tokio::select! {
        biased;
        _ = &mut fut => false,
        () = std::future::ready(()) => true,
    }
}

async fn release_all(leases: Vec<Lease>) -> TestResult {
    for lease in leases {
        lease.release().await?;
    }
    Ok(())
}

#[tokio::test]
async fn every_acquire_span_records_every_field_on_every_path() -> TestResult {
    let (seen, _guard) = Seen::install();
    let server = RedisServer::start_with(RedisOptions::default().password(PASSWORD))?;
    let client = redis::Client::open(server.url())?;
    let locker = Locker::connect(&client).await?;
    let mut tokens = Vec::new();

    // Polling: acquired, gave up, dropped by the caller, failed.
    let held = locker.acquire("t:poll", TTL).await?;
    tokens.push(held.token().as_str().to_owned());
    assert!(locker.acquire_with("t:poll", TTL, &once()).await.is_err());
    let waiting = AcquireOptions::new().wait(Duration::from_secs(30));
    assert!(poll_once_and_drop(locker.acquire_with("t:poll", TTL, &waiting)).await);
    server.redis_cli(&["SET", "fence:{t:err}", "not-a-counter"])?;
    let bad_fence = locker
        .acquire(&FencedKeys::for_resource("t:err")?, TTL)
        .await;
    assert!(
        matches!(bad_fence, Err(leasehold::Error::InvalidFence { .. })),
        "{bad_fence:?}"
    );

    // Several keys: one span per key.
    let both = locker
        .acquire_all(["t:all:b", "t:all:a"], TTL, &AcquireOptions::new())
        .await?;
    tokens.push(both.token().as_str().to_owned());

    // Hand-off: granted across lockers (relay off), relayed in process,
    // gave up.
    let first = HandoffLocker::builder()
        .relay_limit(0)
        .build(locker.clone(), &client)
        .await?;
    let second = HandoffLocker::builder()
        .relay_limit(0)
        .connect(&client)
        .await?;
    let holder = first.acquire("t:grant", TTL).await?;
    tokens.push(holder.token().as_str().to_owned());
    let waiter = {
        let second = second.clone();
        tokio::spawn(async move { second.acquire("t:grant", TTL).await })
    };
    tokio::time::timeout(HUNG, async {
        while server
            .redis_cli(&["ZCARD", "t:grant:waitq"])
            .ok()
            .as_deref()
            != Some("1")
        {
            tokio::task::yield_now().await;
        }
    })
    .await?;
    holder.release().await?;
    let granted = waiter.await??;
    tokens.push(granted.token().as_str().to_owned());
    assert!(first.acquire_with("t:grant", TTL, &once()).await.is_err());
    granted.release().await?;

    let relaying = HandoffLocker::builder()
        .build(locker.clone(), &client)
        .await?;
    let holder = relaying.acquire("t:relay", TTL).await?;
    let queued = {
        let relaying = relaying.clone();
        tokio::spawn(async move { relaying.acquire("t:relay", TTL).await })
    };
    tokio::time::timeout(HUNG, async {
        while relaying.queued_in_process("t:relay") != 1 {
            tokio::task::yield_now().await;
        }
    })
    .await?;
    holder.release().await?;
    let relayed = queued.await??;
    tokens.push(relayed.token().as_str().to_owned());

    // Quorum (one node): acquired, gave up.
    let quorum = Quorum::connect(vec![client.clone()]).await?;
    let voted = quorum.acquire("t:quorum", TTL).await?;
    tokens.push(voted.token().as_str().to_owned());
    assert!(quorum.acquire_with("t:quorum", TTL, &once()).await.is_err());

    release_all(vec![held, both, relayed, voted]).await?;

    let spans = seen.spans("leasehold.acquire");
    for span in &spans {
        for field in ["key", "mode", "fenced", "attempts", "waited_ms", "outcome"] {
            assert!(span.contains_key(field), "no {field} in {span:?}");
        }
    }
    let mut ended: Vec<(String, String, String)> = spans
        .iter()
        .map(|s| (s["mode"].clone(), s["key"].clone(), s["outcome"].clone()))
        .collect();
    ended.sort();
    let expected = [
        ("handoff", "t:grant", "acquired"),
        ("handoff", "t:grant", "acquired"),
        ("handoff", "t:grant", "gave_up"),
        ("handoff", "t:relay", "acquired"),
        ("handoff", "t:relay", "acquired"),
        ("poll", "lock:{t:err}", "error"),
        ("poll", "t:all:a", "acquired"),
        ("poll", "t:all:b", "acquired"),
        ("poll", "t:poll", "acquired"),
        ("poll", "t:poll", "dropped"),
        ("poll", "t:poll", "gave_up"),
        ("quorum", "t:quorum", "acquired"),
        ("quorum", "t:quorum", "gave_up"),
    ]
    .map(|(m, k, o)| (m.to_owned(), k.to_owned(), o.to_owned()));
    assert_eq!(ended, expected);
    // The attempts are counted whatever the way: one request each for the
    // single tries, the dropped acquire's first request, a queued wait.
    for span in &spans {
        let attempts: u32 = span["attempts"].parse()?;
        let at_least = u32::from(span["outcome"] != "error");
        assert!(attempts >= at_least, "{span:?}");
        if span["outcome"] == "gave_up" || span["outcome"] == "dropped" {
            assert_eq!(attempts, 1, "{span:?}");
        }
    }

    // The event that ends each span says why.
    let gave_up = seen.event("gave up").ok_or("no give-up event")?;
    assert_eq!(gave_up.field("reason"), Some("retries_exhausted"));
    assert_eq!(gave_up.span.as_deref(), Some("leasehold.acquire"));
    assert!(seen.event("acquire dropped by its caller").is_some());
    let failed = seen.event("acquire failed").ok_or("no failure event")?;
    assert!(failed.field("error").is_some(), "{failed:?}");

    // Hand-off grants and relays.
    let handed: Vec<_> = seen
        .events()
        .into_iter()
        .filter(|e| e.message() == "handed the lock by a release")
        .map(|e| {
            (
                e.field("key").map(str::to_owned),
                e.field("via").map(str::to_owned),
            )
        })
        .collect();
    assert!(
        handed.contains(&(Some("t:grant".into()), Some("grant".into()))),
        "{handed:?}"
    );
    assert!(
        handed.contains(&(Some("t:relay".into()), Some("relay".into()))),
        "{handed:?}"
    );
    assert!(
        seen.event("passed the lock to a waiter of this locker")
            .is_some()
    );
    assert!(
        seen.event("handed the lock to the next waiter in the queue")
            .is_some()
    );

    let text = seen.text();
    assert!(!text.contains(PASSWORD), "a password in a trace: {text}");
    for token in tokens {
        assert!(!text.contains(&token), "a lease token in a trace: {text}");
    }
    Ok(())
}

#[tokio::test]
async fn releases_say_how_they_went_and_a_stale_one_warns() -> TestResult {
    let (seen, _guard) = Seen::install();
    let server = RedisServer::start()?;
    let locker = Locker::connect(&redis::Client::open(server.url())?).await?;

    locker.acquire("t:rel:ok", TTL).await?.release().await?;
    let stale = locker.acquire("t:rel:stale", TTL).await?;
    server.redis_cli(&["DEL", "t:rel:stale"])?;
    assert!(matches!(
        stale.release().await,
        Err(leasehold::Error::NotHeld { .. })
    ));
    drop(locker.acquire("t:rel:dropped", TTL).await?);
    let dropped = seen
        .until("released dropped lease", |e| {
            e.field("key") == Some("t:rel:dropped")
        })
        .await?;
    assert_eq!(dropped.field("outcome"), Some("released"));

    let outcomes: Vec<(String, String)> = seen
        .spans("leasehold.release")
        .iter()
        .map(|s| {
            (
                s["key"].clone(),
                s.get("outcome").cloned().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        [("t:rel:ok", "released"), ("t:rel:stale", "not_held")]
            .map(|(k, o)| (k.to_owned(), o.to_owned()))
    );
    let warn = seen
        .event("release found the lease gone")
        .ok_or("no stale-release event")?;
    assert_eq!(warn.level, tracing::Level::WARN);
    assert_eq!(warn.target, "leasehold::lease");
    assert_eq!(warn.field("key"), Some("t:rel:stale"));
    assert_eq!(warn.field("outcome"), Some("not_held"));
    assert_eq!(warn.span.as_deref(), Some("leasehold.release"));
    Ok(())
}

#[tokio::test]
async fn refreshes_and_lost_leases_are_traced_with_their_cause() -> TestResult {
    let (seen, _guard) = Seen::install();
    let server = RedisServer::start()?;
    let locker = Locker::connect(&redis::Client::open(server.url())?).await?;

    // A caller's refresh: ok, then gone.
    let lease = locker.acquire("t:refresh", TTL).await?;
    lease.refresh(TTL).await?;
    server.redis_cli(&["DEL", "t:refresh"])?;
    assert!(lease.refresh(TTL).await.is_err());
    let ok = seen.event("refreshed").ok_or("no refresh event")?;
    assert_eq!(ok.field("by"), Some("caller"));
    assert_eq!(ok.field("outcome"), Some("ok"));
    let gone = seen
        .event("refresh found the lease gone")
        .ok_or("no lost-lease event")?;
    assert_eq!(gone.level, tracing::Level::WARN);
    assert_eq!(gone.field("cause"), Some("expired"));
    assert_eq!(gone.field("outcome"), Some("not_held"));
    drop(lease);

    // The watchdog: refreshes, then finds the lease gone.
    let watched = locker
        .acquire("t:watched", Duration::from_millis(300))
        .await?;
    let lost = watched.watch()?;
    seen.until("refreshed", |e| e.field("by") == Some("watchdog"))
        .await?;
    server.redis_cli(&["DEL", "t:watched"])?;
    tokio::time::timeout(HUNG, lost.cancelled()).await?;
    let warn = seen
        .event("lease lost")
        .ok_or("no watchdog lost-lease event")?;
    assert_eq!(warn.level, tracing::Level::WARN);
    assert_eq!(warn.target, "leasehold::watchdog");
    assert_eq!(warn.field("key"), Some("t:watched"));
    assert_eq!(warn.field("cause"), Some("expired"));
    assert_eq!(watched.lost(), Some(leasehold::LostCause::Expired));
    Ok(())
}

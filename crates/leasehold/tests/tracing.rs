//! What the library tells a tracing subscriber: an acquire span with its
//! outcome, give-ups, stale releases and hand-off grants; never a token.
#![cfg(feature = "handoff")]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::{AcquireOptions, HandoffLocker, Locker, RetryStrategy};
use leasehold_testkit::RedisServer;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::prelude::*;
use tracing_subscriber::registry::LookupSpan;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Everything seen, as text lines: `span NAME k=v ...`, `record k=v ...`,
/// `event LEVEL k=v ...`.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<String>>>);

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={:?}", field.name(), value));
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Seen {
    fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
        let mut fields = Fields(format!("span {}", attrs.metadata().name()));
        attrs.record(&mut fields);
        self.push(fields.0);
    }

    fn on_record(&self, _: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut fields = Fields("record".to_owned());
        values.record(&mut fields);
        self.push(fields.0);
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut fields = Fields(format!("event {}", event.metadata().level()));
        event.record(&mut fields);
        self.push(fields.0);
    }
}

impl Seen {
    fn push(&self, line: String) {
        if let Ok(mut lines) = self.0.lock() {
            lines.push(line);
        }
    }

    fn all(&self) -> String {
        self.0.lock().map(|l| l.join("\n")).unwrap_or_default()
    }
}

#[tokio::test]
async fn acquire_give_up_release_and_grants_are_traced_without_tokens() -> TestResult {
    let seen = Seen::default();
    let _guard = tracing_subscriber::registry()
        .with(seen.clone())
        .set_default();
    let server = RedisServer::start()?;
    let client = redis::Client::open(server.url())?;
    let locker = Locker::connect(&client).await?;
    let ttl = Duration::from_secs(5);

    let held = locker.acquire("t:trace", ttl).await?;
    let once = AcquireOptions::new().retry(RetryStrategy::none());
    let err = locker.acquire_with("t:trace", ttl, &once).await.err();
    assert!(err.is_some());
    server.redis_cli(&["DEL", "t:trace"])?;
    let token = held.token().as_str().to_owned();
    let _ = held.release().await;

    let handoff = HandoffLocker::builder(locker.clone(), &client)
        .relay_limit(0)
        .connect()
        .await?;
    let other = HandoffLocker::builder(Locker::connect(&client).await?, &client)
        .relay_limit(0)
        .connect()
        .await?;
    let first = handoff.acquire("t:trace:q", ttl).await?;
    let waiter = {
        let other = other.clone();
        tokio::spawn(async move { other.acquire("t:trace:q", ttl).await })
    };
    while server.redis_cli(&["ZCARD", "t:trace:q:waitq"])? != "1" {
        tokio::task::yield_now().await;
    }
    first.release().await?;
    waiter.await??.release().await?;

    let seen = seen.all();
    assert!(
        seen.contains(r#"span leasehold.acquire key=t:trace mode="poll" fenced=false"#),
        "{seen}"
    );
    assert!(seen.contains(r#"outcome="acquired""#), "{seen}");
    assert!(
        seen.contains(r#"outcome="gave up" reason=retries exhausted attempts=1"#),
        "{seen}"
    );
    assert!(seen.contains("attempts=1"), "{seen}");
    assert!(
        seen.contains("event WARN") && seen.contains("release found the lease gone"),
        "{seen}"
    );
    assert!(seen.contains(r#"mode="handoff""#), "{seen}");
    assert!(seen.contains("granted the lock by a release"), "{seen}");
    assert!(!seen.contains(&token), "a token in a trace: {seen}");
    Ok(())
}

//! What the writes tell a tracing subscriber: a span per fenced write and
//! per guarded resource with its outcome, token and the current fence, and
//! a WARN for every write refused as stale (the money alarm); never a
//! connection URL, a password or a lease token.

use leasehold::Lessor;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::{FencedKeys, FencingToken, Locker};
use leasehold_pg::tokio_postgres::Client;
use leasehold_pg::{Guard, Outcome};
use leasehold_testkit::{RedisOptions, RedisServer};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::prelude::*;
use tracing_subscriber::registry::LookupSpan;

mod common;
use common::server;

/// A token far above any the server's clock gives (a counter that ran
/// ahead of it).
const AHEAD: u64 = FencingToken::MAX.get() - 1;

type TestResult = Result<(), Box<dyn std::error::Error>>;
type Fields = BTreeMap<String, String>;

const REDIS_PASSWORD: &str = "pg-tr4ce-s3cret";

/// Spans (name and final fields, by id) and events (level, target,
/// fields, the span they belong to).
/// A span: its id, name and fields as last recorded.
type SpanSeen = (u64, String, Fields);
/// An event: level, target, fields, and the span it belongs to.
type EventSeen = (Level, String, Fields, Option<String>);

#[derive(Clone, Default)]
struct Seen(Arc<Mutex<(Vec<SpanSeen>, Vec<EventSeen>)>>);

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
        let name = attrs.metadata().name().to_owned();
        self.0
            .lock()
            .expect("lock")
            .0
            .push((id.into_u64(), name, fields));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut seen = self.0.lock().expect("lock");
        if let Some(span) = seen.0.iter_mut().rev().find(|s| s.0 == id.into_u64()) {
            values.record(&mut Visitor(&mut span.2));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::new();
        event.record(&mut Visitor(&mut fields));
        let span = ctx.event_span(event).map(|s| s.name().to_owned());
        let meta = event.metadata();
        self.0.lock().expect("lock").1.push((
            *meta.level(),
            meta.target().to_owned(),
            fields,
            span,
        ));
    }
}

impl Seen {
    fn spans(&self, name: &str) -> Vec<Fields> {
        let seen = self.0.lock().expect("lock");
        seen.0
            .iter()
            .filter(|s| s.1 == name)
            .map(|s| s.2.clone())
            .collect()
    }

    /// The WARN events, as (target, fields, span).
    fn warnings(&self) -> Vec<(String, Fields, Option<String>)> {
        let seen = self.0.lock().expect("lock");
        seen.1
            .iter()
            .filter(|e| e.0 == Level::WARN)
            .map(|e| (e.1.clone(), e.2.clone(), e.3.clone()))
            .collect()
    }

    fn text(&self) -> String {
        format!("{:?}", self.0.lock().expect("lock"))
    }
}

fn fields(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Whether `fields` holds every pair of `wanted`.
fn has(fields: &Fields, wanted: &[(String, String)]) -> bool {
    wanted.iter().all(|(k, v)| fields.get(k) == Some(v))
}

async fn db(url: &str) -> Result<Client, Box<dyn std::error::Error>> {
    let mut client = leasehold_pg::connect(url).await?;
    leasehold_pg::setup(&mut client).await?;
    leasehold_pg::setup_wallets(&mut client).await?;
    Ok(client)
}

#[tokio::test]
async fn fenced_and_guarded_writes_are_traced_and_stale_ones_warn() -> TestResult {
    let seen = Seen::default();
    let _guard = tracing_subscriber::registry()
        .with(seen.clone())
        .set_default();
    let pg = server()?;
    let url = pg.url();
    let mut db = db(&url).await?;
    let id = 7_001;
    leasehold_pg::reset_wallet(&db, id, 100).await?;

    // Fenced: applied (34), stale token (33), stale read (35 with 34's
    // read... taken before 34 wrote).
    let before = leasehold_pg::read_wallet(&db, id).await?;
    let token = FencingToken::new;
    let applied = leasehold_pg::debit_fenced(&db, &before, 10, token(34)).await?;
    assert_eq!(applied, Outcome::Applied { balance: 90 });
    let stale = leasehold_pg::debit_fenced(&db, &before, 10, token(33)).await?;
    assert_eq!(stale, Outcome::StaleToken { fence: 34 });
    let stale_read = leasehold_pg::debit_check_and_set(&db, &before, 10, token(35)).await?;
    assert_eq!(stale_read, Outcome::StaleRead { fence: 34 });

    // Guarded: a resource written by a token far above the clock's (a
    // counter that ran ahead), then a lease whose token is below it:
    // refused, and the Redis counter healed.
    let redis = RedisServer::start_with(RedisOptions::default().password(REDIS_PASSWORD))?;
    let locker = Locker::connect(&leasehold::redis::Client::open(redis.url())?).await?;
    let keys = FencedKeys::for_resource("pg:trace")?;
    let resource = "fence:{pg:trace}";
    let holder = leasehold::HolderId::parse("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa").ok_or("holder")?;
    let tx = db.transaction().await?;
    let first = leasehold_pg::guard_token(&tx, resource, token(AHEAD), &holder).await?;
    assert_eq!(first, Guard::Accepted);
    tx.commit().await?;
    let lease = locker.acquire(&keys, Duration::from_secs(5)).await?;
    let lease_token = lease.token().as_str().to_owned();
    let tx = db.transaction().await?;
    let refused = leasehold_pg::guard(&tx, &lease).await?;
    assert!(
        matches!(refused, Guard::Refused { healed: true, .. }),
        "{refused:?}"
    );
    tx.rollback().await?;
    lease.release().await?;

    let debits = seen.spans("leasehold_pg.debit");
    let expected = [
        ("token", "34", "applied", None),
        ("token", "33", "stale_token", Some("34")),
        ("token_and_version", "35", "stale_read", Some("34")),
    ];
    assert_eq!(debits.len(), expected.len(), "{debits:?}");
    for (span, (check, token, outcome, current)) in debits.iter().zip(expected) {
        assert!(
            has(
                span,
                &fields(&[
                    ("wallet", "7001"),
                    ("check", check),
                    ("token", token),
                    ("outcome", outcome)
                ])
            ),
            "{span:?}"
        );
        assert_eq!(span.get("current").map(String::as_str), current, "{span:?}");
    }
    let guards = seen.spans("leasehold_pg.guard");
    assert_eq!(guards.len(), 2, "{guards:?}");
    assert!(has(
        &guards[0],
        &fields(&[
            ("resource", resource),
            ("token", &AHEAD.to_string()),
            ("outcome", "accepted")
        ])
    ));
    assert!(
        has(
            &guards[1],
            &fields(&[
                ("resource", resource),
                ("outcome", "refused"),
                ("current", &AHEAD.to_string()),
                ("healed", "true")
            ])
        ),
        "{:?}",
        guards[1]
    );

    // Every stale write is a WARN in its span, with the token and the
    // fence that beat it.
    let warnings = seen.warnings();
    let stale: Vec<_> = warnings
        .iter()
        .filter(|(_, f, _)| {
            f.get("message")
                .is_some_and(|m| m.starts_with("write refused"))
        })
        .collect();
    assert_eq!(stale.len(), 3, "{warnings:?}");
    for (target, f, span) in &stale {
        assert!(target.starts_with("leasehold_pg::"), "{target}");
        assert!(
            f.contains_key("token") && f.contains_key("current"),
            "{f:?}"
        );
        assert!(
            matches!(
                span.as_deref(),
                Some("leasehold_pg.debit" | "leasehold_pg.guard")
            ),
            "{span:?}"
        );
    }
    assert_eq!(stale[2].1.get("healed").map(String::as_str), Some("true"));

    let text = seen.text();
    for secret in [
        url.as_str(),
        pg.password(),
        REDIS_PASSWORD,
        lease_token.as_str(),
    ] {
        assert!(!text.contains(secret), "{secret:?} in a trace: {text}");
    }
    Ok(())
}

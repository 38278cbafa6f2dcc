//! The servers an experiment runs against: given by URL, or throwaway.

use std::time::Duration;

use anyhow::Context;
use leasehold::Locker;
use leasehold_testkit::RedisServer;
use redis::aio::MultiplexedConnection;

use crate::cli::Global;
use crate::redact::redact_url;

/// How long any single Redis request of the CLI may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// Connections shared by every experiment of one CLI invocation.
pub(crate) struct Env {
    pub(crate) redis: MultiplexedConnection,
    pub(crate) locker: Locker,
    /// Opens further connections (the hand-off pub/sub connection).
    pub(crate) client: redis::Client,
    /// Kept alive for the whole run; stopped on drop.
    _throwaway_redis: Option<RedisServer>,
}

impl Env {
    pub(crate) async fn connect(global: &Global) -> anyhow::Result<Env> {
        let (url, throwaway) = match &global.redis_url {
            Some(url) => (url.clone(), None),
            None => {
                let server = tokio::task::spawn_blocking(RedisServer::start)
                    .await
                    .context("starting a throwaway redis-server")?
                    .context("starting a throwaway redis-server")?;
                eprintln!(
                    "leasehold: started a throwaway redis-server at {} (pid {}); pass --redis-url to use your own",
                    redact_url(&server.url()),
                    server.pid()
                );
                (server.url(), Some(server))
            }
        };
        let shown = redact_url(&url);
        let client = redis::Client::open(url.as_str())
            .map_err(|_| anyhow::anyhow!("invalid redis url {shown}"))?;
        let redis = leasehold::connect(&client, COMMAND_TIMEOUT)
            .await
            .with_context(|| format!("connecting to redis at {shown}"))?;
        let locker = Locker::builder(redis.clone())
            .command_timeout(COMMAND_TIMEOUT)
            .build()?;
        Ok(Env {
            redis,
            locker,
            client,
            _throwaway_redis: throwaway,
        })
    }
}

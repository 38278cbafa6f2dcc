//! What the test files share: waiting on a lock's directory by a watch.

use std::time::Duration;

use zookeeper_client::Client;

pub(crate) type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Long enough for anything that should happen to happen: a hang guard,
/// never a timing assertion.
pub(crate) const PATIENCE: Duration = Duration::from_secs(20);

/// Waits (on a watch of the directory, `PATIENCE` at most) until the lock
/// `dir` has `n` contenders.
pub(crate) async fn until_contenders(raw: &Client, dir: &str, n: usize) -> TestResult {
    let wait = async {
        loop {
            let watched = match raw.list_and_watch_children(dir).await {
                Ok((children, watcher)) => Some((children.len(), watcher)),
                Err(zookeeper_client::Error::NoNode) => None,
                Err(err) => return Err(err),
            };
            match watched {
                Some((count, _)) if count == n => return Ok(()),
                Some((_, watcher)) => {
                    watcher.changed().await;
                }
                None if n == 0 => return Ok(()),
                None => {
                    let (_, watcher) = raw.check_and_watch_stat(dir).await?;
                    watcher.changed().await;
                }
            }
        }
    };
    tokio::time::timeout(PATIENCE, wait)
        .await
        .map_err(|_| format!("{dir} never had {n} contenders"))??;
    Ok(())
}

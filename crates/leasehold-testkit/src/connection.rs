//! An async connection for a test's own commands.

use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};

/// Opens a reconnecting connection to `client`'s server for a test's own
/// commands (seeding keys, checking what the code under test left behind),
/// apart from any the code under test opens. Connecting and each reply are
/// bounded by `timeout`: a command that blocks (`WAIT`) needs a longer
/// `timeout` than its own. After a restart or a killed connection, the
/// command that finds it broken fails and a reconnect starts, retried
/// twice 20 to 200 ms apart, as leasehold's own connection does.
///
/// # Errors
/// The client's error when the server cannot be reached in time.
pub async fn connection(
    client: &::redis::Client,
    timeout: Duration,
) -> Result<ConnectionManager, ::redis::RedisError> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(20))
        .set_max_delay(Duration::from_millis(200));
    ConnectionManager::new_with_config(client.clone(), config).await
}

//! What the Redis server itself reports about a run.

use std::time::Duration;

use anyhow::Context;
use leasehold::Connection;

/// CPU time the server process has used so far (`INFO cpu`:
/// `used_cpu_sys + used_cpu_user`); `None` when the user may not run `INFO`
/// (a lock user's minimal ACL leaves it out).
pub(crate) async fn cpu(conn: &Connection) -> anyhow::Result<Option<Duration>> {
    let mut conn = conn.clone();
    let info: String = match redis::cmd("INFO").arg("cpu").query_async(&mut conn).await {
        Ok(info) => info,
        Err(err) if err.code() == Some("NOPERM") => return Ok(None),
        Err(err) => return Err(anyhow::Error::new(err).context("reading INFO cpu")),
    };
    info_cpu(&info).map(Some)
}

/// The CPU time in an `INFO cpu` reply: `used_cpu_sys + used_cpu_user`.
pub(crate) fn info_cpu(info: &str) -> anyhow::Result<Duration> {
    let mut total = 0.0;
    for field in ["used_cpu_sys:", "used_cpu_user:"] {
        let value = info
            .lines()
            .find_map(|line| line.strip_prefix(field))
            .with_context(|| format!("INFO cpu has no {field}"))?;
        total += value
            .trim()
            .parse::<f64>()
            .with_context(|| format!("INFO cpu {field} {value}"))?;
    }
    Ok(Duration::from_secs_f64(total.max(0.0)))
}

/// CPU time the server has used since `before` (from [`cpu`]), if known.
pub(crate) async fn cpu_since(
    conn: &Connection,
    before: Option<Duration>,
) -> anyhow::Result<Option<Duration>> {
    let after = cpu(conn).await?;
    Ok(before
        .zip(after)
        .map(|(before, after)| after.saturating_sub(before)))
}

/// Milliseconds, with microsecond precision, for the JSON output.
pub(crate) fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

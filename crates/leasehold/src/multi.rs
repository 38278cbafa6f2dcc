//! Several locks in one lease: the keys in one global order, one watchdog.
//!
//! A transfer between two wallets needs both. Taking them in the order the
//! caller names them deadlocks two transfers in opposite directions (each
//! holds one lock and waits for the other until its deadline); taking them
//! in one global order (sorted by lock key) cannot: whoever holds the
//! smaller key is never waiting for someone who waits for it. Every way of
//! taking a lease uses this one routine, so the order is the same whatever
//! the mode.

use std::future::Future;

use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::fencing::{LockKeys, Target};
use crate::lease::Lease;
use crate::options::AcquireOptions;

/// The targets of `keys`, sorted by lock key, duplicates dropped. No I/O.
///
/// # Errors
/// [`Error::InvalidKey`] for no keys at all, an empty key, or one lock key
/// named with two different fence keys.
pub(crate) fn targets<K: LockKeys>(keys: impl IntoIterator<Item = K>) -> Result<Vec<Target>> {
    let mut targets = keys
        .into_iter()
        .map(|k| Target::of(&k))
        .collect::<Result<Vec<_>>>()?;
    if targets.is_empty() {
        return Err(Error::InvalidKey {
            key: String::new(),
            reason: "no keys to lock",
        });
    }
    targets.sort();
    targets.dedup();
    if let Some(pair) = targets.windows(2).find(|w| w[0].lock == w[1].lock) {
        return Err(Error::InvalidKey {
            key: pair[0].lock.clone(),
            reason: "the same lock key is named with two different fence keys",
        });
    }
    Ok(targets)
}

/// Takes every target in order through `one` (without a watchdog, all under
/// one deadline), merging the leases into one; on failure, gives back what
/// it took and returns the error. Starts the merged lease's watchdog if
/// `opts` asks for one.
pub(crate) async fn acquire_all<F, Fut>(
    targets: Vec<Target>,
    opts: &AcquireOptions,
    mut one: F,
) -> Result<Lease>
where
    F: FnMut(Target, AcquireOptions) -> Fut,
    Fut: Future<Output = Result<Lease>>,
{
    let each = opts.fixed_from(Instant::now()).watchdog(false);
    let mut held: Option<Lease> = None;
    for target in targets {
        let part = match one(target, each.clone()).await {
            Ok(part) => part,
            Err(err) => {
                if let Some(taken) = held {
                    let key = taken.key().to_owned();
                    if let Err(release) = taken.release().await {
                        tracing::debug!(key, error = %release, "could not give back a lock of an incomplete acquire_all; the ttl will end it");
                    }
                }
                return Err(err);
            }
        };
        match &mut held {
            None => held = Some(part),
            Some(lease) => lease.absorb(part),
        }
    }
    let mut lease = held.ok_or(Error::InvalidKey {
        key: String::new(),
        reason: "no keys to lock",
    })?;
    if opts.watchdog {
        lease.watch()?;
    }
    Ok(lease)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fencing::FencedKeys;

    #[test]
    fn targets_are_sorted_and_deduplicated_whatever_the_order_given() -> Result<()> {
        let a = targets(["wallet:b", "wallet:a", "wallet:b"])?;
        let b = targets(["wallet:a", "wallet:b"])?;
        assert_eq!(a, b);
        assert_eq!(a[0].lock, "wallet:a");
        let fenced = targets([
            FencedKeys::for_resource("w:2")?,
            FencedKeys::for_resource("w:1")?,
        ])?;
        assert_eq!(fenced[0].lock, "lock:{w:1}");
        assert_eq!(fenced[0].fence.as_deref(), Some("fence:{w:1}"));
        Ok(())
    }

    #[test]
    fn no_keys_empty_keys_and_conflicting_fences_are_refused() -> Result<()> {
        assert!(matches!(
            targets(Vec::<&str>::new()),
            Err(Error::InvalidKey { .. })
        ));
        assert!(matches!(targets(["a", ""]), Err(Error::InvalidKey { .. })));
        let conflicting = [
            FencedKeys::new("lock:{x}", "fence:{x}")?,
            FencedKeys::new("lock:{x}", "fence2:{x}")?,
        ];
        assert!(matches!(
            targets(conflicting),
            Err(Error::InvalidKey { .. })
        ));
        Ok(())
    }
}

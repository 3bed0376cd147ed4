//! [`connect_semaphore`], [`connect_rw`] and [`connect_election`]: the semaphore, the
//! read-write lock and leader election by URL.
//!
//! Each primitive is its own object-safe trait, so each has its own connector returning
//! `Arc<dyn …>`, with the same URLs as [`crate::connect`]. Every backend offers both
//! ([`crate::Capabilities::semaphore`], [`crate::Capabilities::rw_lock`]) except Redlock,
//! which is refused once connected.

use std::sync::Arc;

use crate::{DistributedRwLock, DistributedSemaphore, LeaderElection, LockError};

/// Connects a semaphore client to the backend named by `url` (the URLs of
/// [`crate::connect`]). Clients connected by the same URL share permits.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::LockError> {
/// use std::time::Duration;
/// let jobs = distlock::connect_semaphore("memory://jobs").await?;
/// let key = distlock::LockKey::new("nightly-export")?;
/// // At most 3 exports at once, across every client using 3 for this key.
/// let permit = jobs.acquire(&key, 3, &distlock::LockOptions::new(Duration::from_secs(30))).await?;
/// permit.release().await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// The configuration errors of [`crate::connect`] (a scheme whose feature is off among
/// them), the backend's connection errors, and [`LockError::Unsupported`] for a Redlock
/// URL, after connecting: its nodes cannot agree on a count of holders.
pub async fn connect_semaphore(url: &str) -> Result<Arc<dyn DistributedSemaphore>, LockError> {
    Ok(crate::connect(url).await?.semaphore())
}

/// Connects a read-write lock client to the backend named by `url` (the URLs of
/// [`crate::connect`]). Clients connected by the same URL share locks.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::LockError> {
/// use std::time::Duration;
/// use distlock::RwMode;
/// let catalog = distlock::connect_rw("memory://catalog").await?;
/// let key = distlock::LockKey::new("prices")?;
/// let options = distlock::LockOptions::new(Duration::from_secs(30));
/// let reader = catalog.acquire(&key, RwMode::Read, &options).await?;
/// let other_reader = catalog.acquire(&key, RwMode::Read, &options).await?;
/// reader.release().await?;
/// other_reader.release().await?;
/// let writer = catalog.acquire(&key, RwMode::Write, &options).await?;
/// writer.release().await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// The configuration errors of [`crate::connect`] (a scheme whose feature is off among
/// them), the backend's connection errors, and [`LockError::Unsupported`] for a Redlock
/// URL, after connecting.
pub async fn connect_rw(url: &str) -> Result<Arc<dyn DistributedRwLock>, LockError> {
    Ok(crate::connect(url).await?.rw_lock())
}

/// Connects an election client to the backend named by `url` (the URLs of
/// [`crate::connect`]). Clients connected by the same URL campaign in the same
/// elections.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use distlock::{AutoRenew, Candidate, LockKey, LockOptions};
/// let elections = distlock::connect_election("memory://cluster").await?;
/// let name = LockKey::new("scheduler")?;
/// let me = Candidate::new("host-a:8080")?;
/// let options = LockOptions::new(Duration::from_secs(10)).with_auto_renew(AutoRenew::new());
/// let leadership = elections.campaign(&name, &me, &options).await?;
/// // Lead: send leadership.term() with every write; stop when leadership.lost() fires.
/// let leader = elections.leader(&name).await?.expect("we lead");
/// assert_eq!(leader.term, leadership.term());
/// leadership.resign().await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// The configuration errors of [`crate::connect`] (a scheme whose feature is off among
/// them), the backend's connection errors, and [`LockError::Unsupported`] from a
/// backend without elections (its reason says why), after connecting.
pub async fn connect_election(url: &str) -> Result<Arc<dyn LeaderElection>, LockError> {
    Ok(crate::connect(url).await?.election())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bad_urls_are_config_errors() {
        assert!(matches!(
            connect_rw("nope://x").await,
            Err(LockError::Config { .. })
        ));
        assert!(matches!(
            connect_election("nope://x").await,
            Err(LockError::Config { .. })
        ));
        assert!(matches!(
            connect_semaphore("memory://a?b").await,
            Err(LockError::Config { .. })
        ));
    }

    /// A scheme whose feature is off is refused naming the feature, as `connect` does.
    #[cfg(not(feature = "redis"))]
    #[tokio::test]
    async fn a_scheme_whose_feature_is_off_names_it() {
        for refused in [
            connect_semaphore("redis://127.0.0.1:1").await.err(),
            connect_rw("redis://127.0.0.1:1").await.err(),
        ] {
            match refused {
                Some(error @ LockError::Config { .. }) => {
                    assert!(error.to_string().contains("redis"), "{error}")
                }
                other => panic!("{other:?}"),
            }
        }
    }

    /// ZooKeeper offers both: an unreachable server is a connection error, not a refusal.
    #[cfg(feature = "zookeeper")]
    #[tokio::test]
    async fn zookeeper_offers_both_primitives() {
        let url = "zk://127.0.0.1:1?session_timeout_ms=2000";
        let semaphore = connect_semaphore(url).await.expect_err("nothing listens");
        assert!(
            matches!(semaphore, LockError::Connection { .. }),
            "{semaphore}"
        );
        let rw = connect_rw(url).await.expect_err("nothing listens");
        assert!(matches!(rw, LockError::Connection { .. }), "{rw}");
    }

    /// etcd offers both too.
    #[cfg(feature = "etcd")]
    #[tokio::test]
    async fn etcd_offers_both_primitives() {
        let url = "etcd://127.0.0.1:1";
        let semaphore = connect_semaphore(url).await.expect_err("nothing listens");
        assert!(
            matches!(semaphore, LockError::Connection { .. }),
            "{semaphore}"
        );
        let rw = connect_rw(url).await.expect_err("nothing listens");
        assert!(matches!(rw, LockError::Connection { .. }), "{rw}");
    }
}

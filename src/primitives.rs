//! [`connect_semaphore`] and [`connect_rw`]: the semaphore and the read-write lock by URL.
//!
//! Each primitive is its own object-safe trait, so each has its own connector returning
//! `Arc<dyn …>`, with the same URLs as [`crate::connect`]. A backend that does not offer
//! the primitive yet ([`crate::Capabilities::semaphore`], [`crate::Capabilities::rw_lock`])
//! is refused by its scheme, before any connection is made.

use std::sync::Arc;

use crate::{Backend, DistributedRwLock, DistributedSemaphore, LockError, NOT_YET};

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
/// The configuration errors of [`crate::connect`], the backend's connection errors,
/// and [`LockError::Unsupported`] for a backend without semaphores yet.
pub async fn connect_semaphore(url: &str) -> Result<Arc<dyn DistributedSemaphore>, LockError> {
    let (backend, rest) = crate::backend_for(url)?;
    match backend {
        Backend::Memory => Ok(Arc::new(crate::memory_client(rest)?.semaphore())),
        #[cfg(feature = "file")]
        Backend::File => Ok(Arc::new(
            distlock_file::FileLock::connect(url).await?.semaphore(),
        )),
        #[cfg(not(feature = "file"))]
        Backend::File => Err(crate::feature_off(url, backend)),
        #[cfg(feature = "postgres")]
        Backend::Postgres => Ok(Arc::new(
            distlock_postgres::PostgresLock::connect(url)
                .await?
                .semaphore(),
        )),
        #[cfg(not(feature = "postgres"))]
        Backend::Postgres => Err(crate::feature_off(url, backend)),
        other => Err(not_offered(other, "semaphores")),
    }
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
/// The configuration errors of [`crate::connect`], the backend's connection errors,
/// and [`LockError::Unsupported`] for a backend without read-write locks yet.
pub async fn connect_rw(url: &str) -> Result<Arc<dyn DistributedRwLock>, LockError> {
    let (backend, rest) = crate::backend_for(url)?;
    match backend {
        Backend::Memory => Ok(Arc::new(crate::memory_client(rest)?.rw_lock())),
        #[cfg(feature = "file")]
        Backend::File => Ok(Arc::new(
            distlock_file::FileLock::connect(url).await?.rw_lock(),
        )),
        #[cfg(not(feature = "file"))]
        Backend::File => Err(crate::feature_off(url, backend)),
        #[cfg(feature = "postgres")]
        Backend::Postgres => Ok(Arc::new(
            distlock_postgres::PostgresLock::connect(url)
                .await?
                .rw_lock(),
        )),
        #[cfg(not(feature = "postgres"))]
        Backend::Postgres => Err(crate::feature_off(url, backend)),
        other => Err(not_offered(other, "read-write locks")),
    }
}

/// The refusal for a backend that does not offer `primitive` yet.
fn not_offered(backend: Backend, primitive: &'static str) -> LockError {
    // Its feature may be off too: the answer is the same either way.
    LockError::Unsupported {
        backend: backend.feature(),
        operation: primitive,
        reason: NOT_YET,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn backends_without_the_primitives_say_so() {
        for url in ["redis://127.0.0.1:1", "zk://127.0.0.1:1"] {
            let refused = connect_semaphore(url).await.expect_err(url);
            assert!(
                matches!(
                    refused,
                    LockError::Unsupported {
                        operation: "semaphores",
                        ..
                    }
                ),
                "{refused}"
            );
            let refused = connect_rw(url).await.expect_err(url);
            assert!(
                matches!(
                    refused,
                    LockError::Unsupported {
                        operation: "read-write locks",
                        ..
                    }
                ),
                "{refused}"
            );
        }
        assert!(matches!(
            connect_rw("nope://x").await,
            Err(LockError::Config { .. })
        ));
        assert!(matches!(
            connect_semaphore("memory://a?b").await,
            Err(LockError::Config { .. })
        ));
    }
}

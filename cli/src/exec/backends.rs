//! What exec tells the operator about a lock, backend by backend, as the README's
//! semantics and fault tables state it: how a lock distlock could not release ends, and
//! whether a release that found the lease still ours shows that nobody else held it.

use distlock::file::FILE_BACKEND;
use distlock::memory::MEMORY_BACKEND;
use distlock::postgres::POSTGRES_BACKEND;
use distlock::redis::{REDIS_BACKEND, REDLOCK_BACKEND};
use distlock::zookeeper::ZOOKEEPER_BACKEND;

/// How a lock that distlock could not release ends on `backend` (its
/// [`distlock::BackendInfo::name`]), for the line that reports the failed release.
pub fn after_failed_release(backend: &str) -> &'static str {
    match backend {
        REDIS_BACKEND => "it is freed when its lease (--ttl) runs out on the server",
        REDLOCK_BACKEND => "it is freed when its lease (--ttl) runs out on each node",
        POSTGRES_BACKEND => {
            "a Postgres lock lives as long as its database session: it ended with the \
             server or the connection if they went down, and otherwise ends when distlock \
             exits and its session closes"
        }
        ZOOKEEPER_BACKEND => {
            "it is freed when distlock exits and closes its ZooKeeper session, or, if the \
             server cannot be reached, when the session expires (the session timeout, \
             whatever --ttl is); already, if the session ended"
        }
        FILE_BACKEND => "it is freed when distlock exits (the kernel drops its file lock)",
        MEMORY_BACKEND => "it is freed when distlock exits (the lock lives in its memory)",
        _ => "it is freed when the backend ends its lease",
    }
}

/// Whether a release on `backend` that found our lease (`ReleaseOutcome::Released`)
/// shows that no one else held the lock since the grant: the Redis value was still our
/// token, the Postgres session still held the advisory lock, the ZooKeeper node still
/// existed, the file lock was still ours. Not on Redlock, which reports our lease found
/// on any one node, while another client may have held a majority of the others.
pub fn release_shows_continuity(backend: &str) -> bool {
    backend != REDLOCK_BACKEND
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_backend_says_how_its_unreleased_lock_ends() {
        assert!(after_failed_release(REDIS_BACKEND).contains("--ttl"));
        let postgres = after_failed_release(POSTGRES_BACKEND);
        assert!(postgres.contains("session") && !postgres.contains("lease"));
        let zookeeper = after_failed_release(ZOOKEEPER_BACKEND);
        assert!(zookeeper.contains("session timeout"));
        assert!(after_failed_release(FILE_BACKEND).contains("exits"));
        assert!(!release_shows_continuity(REDLOCK_BACKEND));
        assert!(release_shows_continuity(REDIS_BACKEND));
    }
}

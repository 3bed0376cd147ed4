//! [`FileLock`]: a client of the file backend, the state every primitive keeps per
//! client, and the handles it gives out.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use distlock_api::{
    Client, DistributedLock, DistributedRwLock, DistributedSemaphore, LeaderElection, LockError,
    LockKey,
};

use crate::election::{self, Elections};
use crate::mutex::{self, Mutexes};
use crate::rw::RwLocks;
use crate::semaphore::Semaphores;
use crate::waiter::Waiters;
use crate::{config, FILE_BACKEND};

/// A client of the file backend: every primitive's locks in one directory. It is the
/// backend's [`Engine`](distlock_api::backend::Engine); use it through [`Client`]
/// ([`FileLock::client`], or [`FileLock::lock`] and its siblings).
///
/// Cloning gives another handle on the same client (same held locks). Separate
/// [`FileLock::open`] calls give independent clients, which exclude each other like
/// separate processes do.
#[derive(Debug, Clone)]
pub struct FileLock {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    /// Threads blocked in `flock` for waiting mutex acquires and campaigns.
    waiters: Arc<Waiters>,
    mutexes: Mutexes,
    semaphores: Semaphores,
    rw_locks: RwLocks,
    elections: Elections,
}

impl FileLock {
    /// A client for locks in `dir`, created (with parents) if missing.
    ///
    /// # Errors
    /// [`LockError::Config`] when the directory cannot be created or is not a directory.
    pub fn open(dir: impl Into<PathBuf>) -> Result<FileLock, LockError> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(|e| {
            LockError::config(
                FILE_BACKEND,
                format!("cannot create lock directory {}: {e}", dir.display()),
            )
        })?;
        Ok(Self::in_dir(dir))
    }

    /// A client for a `file://` URL: `file:///ABSOLUTE/DIR`, or `file://` for
    /// [`default_dir`](crate::default_dir) (created private to the user). See
    /// [`crate::parse_url`] for the URL forms.
    ///
    /// # Errors
    /// [`LockError::Config`] for a malformed URL, a relative path, a host other than
    /// `localhost`, a default directory owned by another user, or a directory that
    /// cannot be created.
    pub async fn connect(url: &str) -> Result<FileLock, LockError> {
        match config::parse_url(url)?.dir {
            Some(dir) => Self::open(dir),
            None => config::private_default_dir().map(Self::in_dir),
        }
    }

    fn in_dir(dir: PathBuf) -> FileLock {
        FileLock {
            inner: Arc::new(Inner {
                dir,
                waiters: Arc::default(),
                mutexes: Mutexes::default(),
                semaphores: Semaphores::default(),
                rw_locks: RwLocks::default(),
                elections: Elections::default(),
            }),
        }
    }

    /// This client, for every primitive.
    pub fn client(&self) -> Client {
        Client::new(self.clone())
    }

    /// The mutex of this client (`self.client().lock()`).
    pub fn lock(&self) -> Arc<dyn DistributedLock> {
        self.client().lock()
    }

    /// The semaphore of this client: permits as slot files beside the mutex's lock
    /// files (see the crate docs).
    pub fn semaphore(&self) -> Arc<dyn DistributedSemaphore> {
        self.client().semaphore()
    }

    /// The read-write lock of this client, with writer preference (see the crate
    /// docs).
    pub fn rw_lock(&self) -> Arc<dyn DistributedRwLock> {
        self.client().rw_lock()
    }

    /// Leader election on this client (see the crate docs).
    pub fn election(&self) -> Arc<dyn LeaderElection> {
        self.client().election()
    }

    /// The lock directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The lock file of `key`: `k-` and the key with bytes outside `[a-z0-9._-]` as
    /// `%xx`, then `.lock`; or `h-` and the key's SHA-256 for names past 255 bytes.
    pub fn lock_file_path(&self, key: &LockKey) -> PathBuf {
        mutex::lock_path(self.dir(), key)
    }

    /// The election file of `name`: [`FileLock::lock_file_path`] of the name with
    /// `.election` in place of `.lock`.
    pub fn election_file_path(&self, name: &LockKey) -> PathBuf {
        election::election_path(self.dir(), name)
    }

    /// The leader file of `name`, with `.leader` in place of `.lock`.
    pub fn leader_file_path(&self, name: &LockKey) -> PathBuf {
        election::leader_path(self.dir(), name)
    }

    pub(crate) fn waiters(&self) -> &Arc<Waiters> {
        &self.inner.waiters
    }

    pub(crate) fn mutexes(&self) -> &Mutexes {
        &self.inner.mutexes
    }

    pub(crate) fn semaphores(&self) -> &Semaphores {
        &self.inner.semaphores
    }

    pub(crate) fn rw_locks(&self) -> &RwLocks {
        &self.inner.rw_locks
    }

    pub(crate) fn elections(&self) -> &Elections {
        &self.inner.elections
    }
}

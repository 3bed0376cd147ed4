//! The file backend of distlock: OS file locks in one directory, for processes on one
//! host. Like `flock(1)`, behind distlock's API: [`FileLock`] is the backend's
//! [`Engine`](distlock_api::backend::Engine), and its [`Client`](distlock_api::Client)
//! ([`FileLock::client`]) hands out the mutex, semaphore, read-write lock and election.
//!
//! ```
//! # async fn demo() -> Result<(), distlock_api::LockError> {
//! use std::time::Duration;
//! use distlock_api::{LockKey, LockOptions};
//! use distlock_file::FileLock;
//!
//! let dir = std::env::temp_dir().join(format!("distlock-doc-{}", std::process::id()));
//! let locks = FileLock::connect(&format!("file://{}", dir.display())).await?.lock();
//! let guard = locks
//!     .acquire(&LockKey::new("nightly-report")?, &LockOptions::new(Duration::from_secs(30)))
//!     .await?;
//! guard.release().await?;
//! # std::fs::remove_dir_all(&dir).expect("removes the example's directory");
//! # Ok(()) }
//! # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
//! ```
//!
//! # Protocol
//! Each key has a lock file in the directory, named injectively from the key (see
//! [`FileLock::lock_file_path`]). A holder keeps the file open with an exclusive
//! `flock(2)` lock on it; releasing closes it. The file holds one line: the last
//! fencing token handed out for the key and the holder's process id. The next holder
//! increments it, under the lock, and syncs it to disk. Lock files are never deleted:
//! deleting a lock file races with processes that have it open, and the counter must
//! outlive every holder.
//!
//! # Guarantees
//! - At most one holder per key across every process (and every [`FileLock`] in one
//!   process) using the same directory on a local file system.
//! - The kernel frees a lock the moment its holder process dies, even by `kill -9`.
//! - Fencing tokens strictly increase per key, across processes and restarts, as long
//!   as the lock file is kept (see the caveats).
//! - Waiters block in the kernel and wake on release; no polling.
//! - Interoperates with `flock(1)` on the same file (`flock DIR/k-KEY.lock CMD`).
//!
//! These are the mutex's; the other primitives' follow.
//!
//! # Caveats
//! - **No TTL expiry.** A lock is held until it is released or its process exits; the
//!   TTL only sets the guard's local validity deadline, which `extend` and auto-renew
//!   push out. A hung but live process keeps its lock.
//! - One host only: `flock` on network file systems is not reliable.
//! - A waiter that gives up (timeout, dropped future) leaves its key's waiting thread
//!   blocked until the lock frees; it then unlocks at once. One thread per key waited
//!   on, per client.
//! - [`DistributedLock::inspect`](distlock_api::DistributedLock::inspect) and owner
//!   checks of foreign leases briefly take a shared lock on the file, during which an
//!   exclusive try fails.
//! - Do not delete lock files or their directory while they are in use (mind
//!   `/tmp` cleaners when using the default directory): a holder's lock on a deleted
//!   file no longer excludes a process that creates the file anew, and that process's
//!   tokens start again at 1. Acquire checks the locked file is still the one at its
//!   path, and every extend (so auto-renew) does too and reports the lease expired,
//!   so a holder with auto-renew learns it within a renewal interval.
//!
//! # Semaphores and read-write locks
//! [`FileLock::semaphore`] and [`FileLock::rw_lock`] give the other two primitives on
//! the same directory: permits as slot files `k-KEY.permit-N` with the count recorded
//! beside them in `k-KEY.permits` (holders using another count are refused with
//! [`LockError::PermitMismatch`](distlock_api::LockError::PermitMismatch)), and shared
//! and exclusive `flock`s on `k-KEY.rw` with a writer gate `k-KEY.rw-gate` for writer
//! preference (a waiting writer holds the gate, so readers that come after it wait).
//! Their grants carry no fencing token, and their waiters poll at the options' backoff
//! rather than block in the kernel. No TTL expiry, as for the mutex. Their files, too,
//! must not be deleted while in use: release and extend do not check that the locked
//! files are still the ones at their paths, as the mutex's do.
//!
//! # Leader election
//! [`FileLock::election`] gives leader election: the leadership of a name is the
//! exclusive `flock` of its election file `k-NAME.election`
//! ([`FileLock::election_file_path`]: a lock file like the mutex's, apart from it,
//! whose counter gives the term, so terms rise strictly per name as long as the file
//! is kept), and the leader's identity and term are in the leader file `k-NAME.leader`
//! ([`FileLock::leader_file_path`]), which the leader keeps locked exclusive and
//! deletes when it resigns. `leader()` reads that record only while its lock is held,
//! so a dead leader's record never reads as leader; it stays in its file until the
//! next leader overwrites it, and every election file stays, as lock files do.
//! [`Leader::remaining`](distlock_api::Leader::remaining) is `None`. Campaigns wait in
//! the kernel as the mutex's acquires do, woken when the leader resigns or its process
//! dies; observers (`wait_change`) poll. No TTL expiry, as for the mutex.
//!
//! # Capabilities
//! [`Client::info`](distlock_api::Client::info) states the above per primitive: no
//! primitive has TTL expiry, leases that outlive their client (so `run_once` is
//! refused), or FIFO waiting (`flock` promises no order among blocked processes, so a
//! FIFO wait is refused with
//! [`LockError::Unsupported`](distlock_api::LockError::Unsupported)); the mutex and
//! election have fencing tokens and waiters woken on release; the semaphore and
//! read-write lock have neither.

// docs.rs (`--cfg docsrs`, nightly) shows which feature each gated item needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
mod election;
mod engine;
mod error;
mod held;
mod keys;
mod lock;
mod lock_file;
mod mutex;
mod rw;
mod semaphore;
mod waiter;

pub use config::{default_dir, parse_url, FileUrl};
pub use lock::FileLock;

/// The backend name in errors and reports.
pub const FILE_BACKEND: &str = "file";

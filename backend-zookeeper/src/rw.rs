//! The read-write lock's place over ZooKeeper, in the node layout of Curator's
//! `InterProcessReadWriteLock` (the engine's [`distlock_api::backend::Claim::Rw`]).
//!
//! Readers and writers of a key are ephemeral-sequential nodes of one directory (see
//! [`ZooKeeperLock::rw_path`]): `_c_<guid>-__READ__<seq>` and `_c_<guid>-__WRIT__<seq>`,
//! ranked together by sequence. A writer holds when its node is the lowest of all and
//! watches the next lower node; a reader holds when no writer node is ranked before it
//! and watches the first such writer. It is the mutex's recipe with Curator's
//! `ReadLock` predicate (`lock.rs`), and the same creation, clean-up, lease and release.

use distlock_api::LockKey;

use crate::ZooKeeperLock;

impl ZooKeeperLock {
    /// The directory of `key`'s read-write lock:
    /// `[chroot]{base_path}/.rw/{encode_key(key)}` (never a mutex's directory: no key
    /// encodes to a name starting with `.`). A Curator
    /// `new InterProcessReadWriteLock(client, path)` on this path shares it with ours.
    pub fn rw_path(&self, key: &LockKey) -> String {
        self.namespaced_dir(".rw", key)
    }
}

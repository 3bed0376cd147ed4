//! Where each primitive's contenders put their keys, for tools that share them
//! (`etcdctl lock`, `etcdctl elect`, Go's recipes) and for inspection.

use distlock_api::LockKey;

use crate::keys::{election_prefix, lock_prefix, Kind};
use crate::EtcdLock;

impl EtcdLock {
    /// The range `key`'s contenders put their keys in (`PREFIX/<encoded key>/`):
    /// `etcdctl lock` on this name without the trailing `/` contends for the same lock.
    pub fn lock_prefix(&self, key: &LockKey) -> String {
        lock_prefix(self.prefix(), key)
    }

    /// The range of `key`'s semaphore, `PREFIX/+semaphore/<encoded key>/` (never a
    /// mutex's range: no key encodes to a name with `+`).
    pub fn semaphore_prefix(&self, key: &LockKey) -> String {
        Kind::Permit(1).range(self.prefix(), key)
    }

    /// The range of `key`'s read-write lock, `PREFIX/+rw/<encoded key>/` (never a
    /// mutex's range: no key encodes to a name with `+`). A Go
    /// `recipe.NewRWMutex(session, prefix)` with this range less its trailing `/`
    /// shares the lock with ours.
    pub fn rw_prefix(&self, key: &LockKey) -> String {
        Kind::Write.range(self.prefix(), key)
    }

    /// The range the candidates of the election `name` put their keys in
    /// (`P/+election/<encode_key(name)>/`, see [`election_prefix`]): never a lock's
    /// range. `etcdctl elect` on it without the trailing `/` campaigns in the same
    /// election.
    pub fn election_prefix(&self, name: &LockKey) -> String {
        election_prefix(self.prefix(), name)
    }
}

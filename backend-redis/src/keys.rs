//! The Redis names one lock key maps to.

use distlock_api::LockKey;

/// The Redis names behind one [`LockKey`] `K`: the lock, its fencing counter
/// ([`KeyNames::fence`]), the waiting marker and the release channel
/// ([`KeyNames::waiting`], [`KeyNames::channel`]), and the FIFO queue's two keys
/// ([`KeyNames::queue`], [`KeyNames::queue_deadlines`]).
///
/// All of them but the fence start with the hash tag `{K}`, so they live in one Redis
/// Cluster slot; the fence is the server's one counter, and on a Cluster
/// ([`KeyNames::cluster_fence`]) the counter of that slot, named with a tag of the
/// same slot.
/// A key starting with `}` would make that tag empty (Redis then hashes each whole
/// name, scattering them over slots), so such a key's names start with
/// `{\0<K without '}'>}` instead, followed by `K}`: a tag that is never empty, and a
/// prefix no other key's names have (keys contain no NUL).
///
/// The hot-path scripts are passed only the lock (and fence) and derive the other names
/// by these same suffixes: each key passed costs the server time on every call. For
/// the same reason only the lock's name is built up front (every acquire and release
/// builds one); the others are built when asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyNames {
    /// `{K}`: holds the owner token, with a `PX` expiry.
    pub lock: String,
}

impl KeyNames {
    /// The fencing counter on one server or a Sentinel-managed master:
    /// [`SERVER_FENCE`], one counter per server (per database) that every grant (of a
    /// mutex, a permit, a read or write lock, a leadership's term) `INCR`s, so it rises
    /// for every key at once. It never expires; when it is gone (a
    /// restart without persistence) the server's clock seeds it again, at the µs since
    /// 1970 (below 2^53), above every token it handed out before (see the Redis guide's
    /// "Fencing" for the trust model). On a Cluster the counter must share the lock's
    /// slot, and [`KeyNames::cluster_fence`] is used instead. Redlock uses neither.
    pub fn fence(&self) -> &str {
        SERVER_FENCE
    }

    /// `{K}:waiting`: set (with an expiry) by waiters that find the key held and by
    /// FIFO waiters while queued, and deleted by the release, which publishes a
    /// wake-up only when it was there, so only when someone waits.
    pub fn waiting(&self) -> String {
        [self.lock.as_str(), ":waiting"].concat()
    }

    /// `{K}:released`: the pub/sub channel a release publishes on.
    pub fn channel(&self) -> String {
        [self.lock.as_str(), ":released"].concat()
    }
}

impl KeyNames {
    /// The names for `key`.
    pub fn for_key(key: &LockKey) -> Self {
        // `concat` sizes each string once, without the formatter: this runs on every
        // acquire and release.
        let key = key.as_str();
        let lock = if key.starts_with('}') {
            ["{\0", &key.replace('}', ""), "}", key, "}"].concat()
        } else {
            ["{", key, "}"].concat()
        };
        KeyNames { lock }
    }
}

/// The name of the one fencing counter of a server (or Sentinel-managed master) in
/// key layout 3: no lock's name (each starts with `{`) can be it.
///
/// Key layouts of the fencing counters: 1, a per-key `{K}:fence` expiring with the
/// lock; 2, a counter per hash slot, `{<n>}:distlock-fence`, everywhere; 3 (this
/// release), this one counter per server, and layout 2's slot counters on a Cluster.
/// The semaphore, read-write lock and election kept per-key counters
/// (`{K}:<kind>:fence`, expiring 10 s after the TTL of the grant that seeded them) until
/// layout 3, which gives them the mutex's counter. The lock keys themselves are the same
/// in every layout.
pub const SERVER_FENCE: &str = "distlock-fence:v3";

impl KeyNames {
    /// `{<n>}:distlock-fence`: the fencing counter on a Redis Cluster, one per
    /// hash slot, in `{K}`'s slot (`n` is the smallest number whose decimal form hashes
    /// to that slot), so that it lives on the lock's node and moves with the slot. It
    /// rises for every key of the slot, never expires (at most 16384 of them), and is
    /// seeded from the clock as [`KeyNames::fence`] is.
    pub fn cluster_fence(&self) -> String {
        crate::slots::fence_of(&self.lock)
    }

    /// `{K}:queue`: the FIFO queue, a sorted set of waiter ids scored by arrival.
    /// It expires with its longest-lived entry and is deleted when it empties.
    pub fn queue(&self) -> String {
        [self.lock.as_str(), ":queue"].concat()
    }

    /// `{K}:queue:deadlines`: the same waiter ids scored by the server time (ms) at
    /// which each entry expires unless its waiter refreshes it.
    pub fn queue_deadlines(&self) -> String {
        [self.lock.as_str(), ":queue:deadlines"].concat()
    }
}

/// The namespaces of the primitives beside the mutex: each key's names under one of
/// these are those of [`KeyNames::for_key`] with the base name `{K}:<kind>`, so they
/// share the mutex's hash tag but never its names (a mutex name is `{K'}` or `{K'}:`
/// and a suffix of its own, and `{K}:<kind>` does not end in `}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Primitive {
    /// `{K}:semaphore`: a sorted set of permit holders scored by expiry.
    Semaphore,
    /// `{K}:rw`: a sorted set of readers scored by expiry.
    Rw,
    /// `{K}:election`: the leader's record (a hash of its owner token, term and
    /// candidate identity) with a `PX` expiry.
    Election,
}

impl Primitive {
    fn suffix(self) -> &'static str {
        match self {
            Primitive::Semaphore => ":semaphore",
            Primitive::Rw => ":rw",
            Primitive::Election => ":election",
        }
    }
}

impl KeyNames {
    /// The names of `key` in `primitive`'s namespace: `lock` is the base name
    /// `{K}:<kind>` (the holders' sorted set), and the waiting marker and channel are
    /// the base name with the mutex's suffixes, so the scripts derive them the same
    /// way. The fencing counter is the mutex's.
    pub(crate) fn for_primitive(key: &LockKey, primitive: Primitive) -> Self {
        let mutex = KeyNames::for_key(key);
        KeyNames {
            lock: [mutex.lock.as_str(), primitive.suffix()].concat(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documented_layout() {
        let names = KeyNames::for_key(&LockKey::new("orders/42").unwrap());
        assert_eq!(names.lock, "{orders/42}");
        assert_eq!(names.fence(), "distlock-fence:v3");
        assert_eq!(names.cluster_fence(), crate::slots::fence_of("{orders/42}"));
        assert!(names.cluster_fence().ends_with("}:distlock-fence"));
        assert_eq!(names.channel(), "{orders/42}:released");
        assert_eq!(names.waiting(), "{orders/42}:waiting");
        assert_eq!(names.queue(), "{orders/42}:queue");
        assert_eq!(names.queue_deadlines(), "{orders/42}:queue:deadlines");
    }

    /// The hash tag Redis Cluster hashes a name by: between the first `{` and the
    /// first `}` after it, if not empty; else the whole name.
    fn hash_tag(name: &str) -> &str {
        match name.find('{') {
            Some(open) => match name[open + 1..].find('}') {
                Some(0) | None => name,
                Some(len) => &name[open + 1..open + 1 + len],
            },
            None => name,
        }
    }

    #[test]
    fn every_name_of_a_key_shares_a_non_empty_tag() {
        for key in ["}", "}}", "}x", "a}b", "{}", "x{}y", "{", "}{}"] {
            let names = KeyNames::for_key(&LockKey::new(key).unwrap());
            let tag = hash_tag(&names.lock);
            assert_ne!(tag, names.lock, "{key:?}: no hash tag");
            assert_eq!(
                crate::slots::key_slot(&names.cluster_fence()),
                crate::slots::key_slot(&names.lock),
                "{key:?}"
            );
            for other in [
                &names.channel(),
                &names.waiting(),
                &names.queue(),
                &names.queue_deadlines(),
            ] {
                assert_eq!(hash_tag(other), tag, "{key:?}: {other:?}");
            }
        }
        // The escaped form cannot be any other key's lock name.
        let escaped = KeyNames::for_key(&LockKey::new("}x").unwrap()).lock;
        assert_eq!(escaped, "{\0x}}x}");
        assert_ne!(
            KeyNames::for_key(&LockKey::new("{}x").unwrap()).lock,
            escaped
        );
    }

    #[test]
    fn primitive_names_share_the_tag_and_never_a_mutex_name() {
        for key in ["k", "}x", "a}b"] {
            let key = LockKey::new(key).unwrap();
            let mutex = KeyNames::for_key(&key);
            for primitive in [Primitive::Semaphore, Primitive::Rw, Primitive::Election] {
                let names = KeyNames::for_primitive(&key, primitive);
                let tag = hash_tag(&mutex.lock);
                for name in [names.lock.as_str(), &names.waiting(), &names.channel()] {
                    assert_eq!(hash_tag(name), tag, "{name:?}");
                    assert!(!name.ends_with('}'), "{name:?}");
                }
                // The mutex's counter: on a Cluster, the one of the same slot.
                assert_eq!(names.cluster_fence(), mutex.cluster_fence());
                assert_eq!(names.waiting(), [names.lock.as_str(), ":waiting"].concat());
                assert_eq!(names.channel(), [names.lock.as_str(), ":released"].concat());
            }
        }
        let names = KeyNames::for_primitive(&LockKey::new("jobs").unwrap(), Primitive::Semaphore);
        assert_eq!(names.lock, "{jobs}:semaphore");
        assert_eq!(names.fence(), SERVER_FENCE);
    }

    /// The scripts derive these names as `KEYS[1] .. suffix`.
    #[test]
    fn every_name_is_the_lock_name_and_a_suffix() {
        let names = KeyNames::for_key(&LockKey::new("k").unwrap());
        for (name, suffix) in [
            (names.waiting(), ":waiting"),
            (names.channel(), ":released"),
            (names.queue(), ":queue"),
            (names.queue_deadlines(), ":queue:deadlines"),
        ] {
            assert_eq!(name, [names.lock.as_str(), suffix].concat());
        }
    }
}

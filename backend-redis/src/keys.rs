//! The Redis names one lock key maps to.

use distlock_api::LockKey;

/// The Redis names behind one [`LockKey`] `K`: four fields, and the FIFO queue's two
/// keys from [`KeyNames::queue`] and [`KeyNames::queue_deadlines`].
///
/// All of them start with the hash tag `{K}`, so they live in one Redis Cluster slot.
/// A key starting with `}` would make that tag empty (Redis then hashes each whole
/// name, scattering them over slots), so such a key's names start with
/// `{\0<K without '}'>}` instead, followed by `K}`: a tag that is never empty, and a
/// prefix no other key's names have (keys contain no NUL).
///
/// The hot-path scripts are passed only the lock (and fence) and derive the other names
/// by these same suffixes: each key passed costs the server time on every call.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyNames {
    /// `{K}`: holds the owner token, with a `PX` expiry.
    pub lock: String,
    /// `{K}:fence`: the fencing counter of a single node, `INCR`ed by every grant;
    /// seeded with the server's clock (µs) and expiring the TTL plus a margin after
    /// that (then the clock seeds a new one, see the README's trust model). Redlock
    /// does not use it.
    pub fence: String,
    /// `{K}:waiting`: set (with an expiry) by waiters that find the key held, so that
    /// a release publishes a wake-up only when someone waits.
    pub waiting: String,
    /// `{K}:released`: the pub/sub channel a release publishes on.
    pub channel: String,
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
        KeyNames {
            fence: [lock.as_str(), ":fence"].concat(),
            channel: [lock.as_str(), ":released"].concat(),
            waiting: [lock.as_str(), ":waiting"].concat(),
            lock,
        }
    }
}

impl KeyNames {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documented_layout() {
        let names = KeyNames::for_key(&LockKey::new("orders/42").unwrap());
        assert_eq!(names.lock, "{orders/42}");
        assert_eq!(names.fence, "{orders/42}:fence");
        assert_eq!(names.channel, "{orders/42}:released");
        assert_eq!(names.waiting, "{orders/42}:waiting");
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
            for other in [
                &names.fence,
                &names.channel,
                &names.waiting,
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

    /// The scripts derive these names as `KEYS[1] .. suffix`.
    #[test]
    fn every_name_is_the_lock_name_and_a_suffix() {
        let names = KeyNames::for_key(&LockKey::new("k").unwrap());
        for (name, suffix) in [
            (names.waiting.clone(), ":waiting"),
            (names.channel.clone(), ":released"),
            (names.queue(), ":queue"),
            (names.queue_deadlines(), ":queue:deadlines"),
        ] {
            assert_eq!(name, [names.lock.as_str(), suffix].concat());
        }
    }
}

//! The Redis names one lock key maps to.

use distlock_api::LockKey;

/// The three Redis names behind one [`LockKey`] `K`.
///
/// All three start with the hash tag `{K}`, so they live in one Redis Cluster slot
/// (except when `K` itself starts with `}`, which makes the tag empty).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyNames {
    /// `{K}`: holds the owner token, with a `PX` expiry.
    pub lock: String,
    /// `{K}:fence`: the fencing counter, `INCR`ed on every single-node grant; never
    /// expires. Redlock does not use it.
    pub fence: String,
    /// `{K}:released`: the pub/sub channel a release publishes on.
    pub channel: String,
}

impl KeyNames {
    /// The names for `key`.
    pub fn for_key(key: &LockKey) -> Self {
        // `concat` sizes each string once, without the formatter: this runs on every
        // acquire and release.
        let lock = ["{", key.as_str(), "}"].concat();
        KeyNames {
            fence: [lock.as_str(), ":fence"].concat(),
            channel: [lock.as_str(), ":released"].concat(),
            lock,
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
        assert_eq!(names.fence, "{orders/42}:fence");
        assert_eq!(names.channel, "{orders/42}:released");
    }
}

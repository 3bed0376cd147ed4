//! Where a lock lives in etcd's key space.
//!
//! Lock `K` under prefix `P` is the key range `P/<encode_key(K)>/`: every contender
//! puts `P/<encode_key(K)>/<its lease id in hex>`, exactly as etcd's
//! `concurrency.NewMutex(session, "P/<name>")` (and so `etcdctl lock P/<name>`) does.
//! The semaphore and the read-write lock have namespaces of their own,
//! `P/.semaphore/<encode_key(K)>/` and `P/.rw/<encode_key(K)>/`: no key encodes to a
//! name starting with `.`, so no range lies inside another. A read-write grant after a
//! wait also writes a marker `P/.rw-granted/<encode_key(K)>/<lease id in hex>` (see
//! [`crate::EtcdRwLock`]).

use distlock_api::LockKey;

/// Encodes a lock key as one path segment: ASCII letters, digits and `-`, `_`, `.`
/// (except as the first byte), `~`, `:`, `@` stay as they are; every other byte (`/`,
/// `%` and a leading `.` among them) becomes `%XX`. The encoding is injective, so different keys (case included) never share a
/// lock, and a key containing `/` cannot reach into another key's range. A key made
/// only of kept characters is its own encoding, so `etcdctl lock P/orders` and the
/// key `orders` are the same lock.
pub fn encode_key(key: &LockKey) -> String {
    let mut out = String::with_capacity(key.as_str().len());
    for (i, byte) in key.as_str().bytes().enumerate() {
        // A leading `.` is escaped: names starting with `.` are the other primitives'
        // namespaces.
        if byte.is_ascii_alphanumeric() || b"-_~:@".contains(&byte) || (byte == b'.' && i > 0) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The namespace of a primitive under the prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Space {
    /// The mutex's: `P/<K>/`.
    Mutex,
    /// The semaphore's: `P/.semaphore/<K>/`.
    Semaphore,
    /// The read-write lock's: `P/.rw/<K>/`.
    Rw,
}

/// A contender's primitive: where its key goes and which older contenders keep it
/// from holding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The mutex: `P/<K>/<lease>`; held with no older contender.
    Mutex,
    /// A permit of a semaphore of this many: `P/.semaphore/<K>/<lease>`; held with
    /// fewer older contenders than the count.
    Permit(u32),
    /// A reader: `P/.rw/<K>/read/<lease>`; held with no older writer.
    Read,
    /// A writer: `P/.rw/<K>/write/<lease>`; held with no older contender.
    Write,
}

impl Kind {
    /// The range every contender of `key` of this primitive puts its key in.
    pub(crate) fn range(self, prefix: &str, key: &LockKey) -> String {
        match self {
            Kind::Mutex => lock_prefix(prefix, key),
            Kind::Permit(_) => format!("{prefix}/.semaphore/{}/", encode_key(key)),
            Kind::Read | Kind::Write => format!("{prefix}/.rw/{}/", encode_key(key)),
        }
    }

    /// Our key in `range`, named by the lease id it was put under.
    pub(crate) fn own_key(self, range: &str, lease_id: i64) -> String {
        match self {
            Kind::Mutex | Kind::Permit(_) => contender_key(range, lease_id),
            Kind::Read => contender_key(&format!("{range}read/"), lease_id),
            Kind::Write => contender_key(&format!("{range}write/"), lease_id),
        }
    }

    /// The part of `range` whose older contenders count against ours: a reader's are
    /// the writers (etcd's `recipes.RWMutex` waits on `PFX/write`), everyone else's
    /// the whole range.
    pub(crate) fn blocking(self, range: &str) -> String {
        match self {
            Kind::Read => format!("{range}write/"),
            _ => range.to_owned(),
        }
    }

    /// Where a read-write contender named by `lease_id` puts its grant's marker (the
    /// write whose revision is a waited grant's fencing token, see
    /// [`crate::EtcdRwLock`]): `P/.rw-granted/<K>/<lease>`, outside the lock's range
    /// `P/.rw/<K>/` (and outside the range a Go `RWMutex` on `P/.rw/<K>` reads), so no
    /// contender ranks it. Other primitives write no marker.
    pub(crate) fn grant_marker(self, prefix: &str, key: &LockKey, lease_id: i64) -> Option<String> {
        match self {
            Kind::Read | Kind::Write => Some(contender_key(
                &format!("{prefix}/.rw-granted/{}/", encode_key(key)),
                lease_id,
            )),
            Kind::Mutex | Kind::Permit(_) => None,
        }
    }

    /// How many older blocking contenders ours may have and still hold.
    pub(crate) fn room(self) -> usize {
        match self {
            Kind::Permit(max) => max as usize,
            _ => 1,
        }
    }
}

/// `P/<encode_key(K)>/`: the range every contender of `key` puts its key in.
pub fn lock_prefix(prefix: &str, key: &LockKey) -> String {
    format!("{prefix}/{}/", encode_key(key))
}

/// A contender's key: the lock's range, then the lease id in lowercase hex, as
/// etcd's `concurrency.Mutex` names it.
pub(crate) fn contender_key(lock_prefix: &str, lease_id: i64) -> String {
    format!("{lock_prefix}{lease_id:x}")
}

/// The end of the range that holds every key starting with `prefix`, as etcd's
/// `clientv3.GetPrefixRangeEnd` computes it.
pub(crate) fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte was 0xff: the range runs to the end of the key space.
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> LockKey {
        LockKey::new(s).unwrap()
    }

    #[test]
    fn encoding_is_injective_and_keeps_plain_names() {
        assert_eq!(encode_key(&key("orders")), "orders");
        assert_eq!(encode_key(&key("a/b")), "a%2Fb");
        assert_eq!(encode_key(&key("a%2Fb")), "a%252Fb");
        assert_ne!(encode_key(&key("Orders")), encode_key(&key("orders")));
        assert_eq!(encode_key(&key("é")), "%C3%A9");
        assert_eq!(encode_key(&key(".semaphore")), "%2Esemaphore");
        assert_eq!(encode_key(&key("a.b")), "a.b");
        assert_eq!(Kind::Permit(2).range("p", &key("a")), "p/.semaphore/a/");
        assert_eq!(Kind::Read.range("p", &key(".rw")), "p/.rw/%2Erw/");
        assert_eq!(Kind::Read.own_key("p/.rw/a/", 0x1f), "p/.rw/a/read/1f");
        assert_eq!(Kind::Read.blocking("p/.rw/a/"), "p/.rw/a/write/");
        assert_eq!(Kind::Write.blocking("p/.rw/a/"), "p/.rw/a/");
        assert_eq!(
            Kind::Read.grant_marker("p", &key("a"), 0x1f).as_deref(),
            Some("p/.rw-granted/a/1f")
        );
        assert_eq!(Kind::Permit(2).grant_marker("p", &key("a"), 1), None);
        assert_eq!(lock_prefix("distlock", &key("a b")), "distlock/a%20b/");
        assert_eq!(contender_key("p/k/", 0x694d_7a1b), "p/k/694d7a1b");
    }

    #[test]
    fn prefix_end_covers_the_prefix() {
        assert_eq!(prefix_end("p/k/"), b"p/k0".to_vec());
        assert_eq!(prefix_end("a\u{7f}"), b"a\x80".to_vec());
    }
}

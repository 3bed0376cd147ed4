//! Where a lock lives in etcd's key space.
//!
//! Lock `K` under prefix `P` is the key range `P/<encode_key(K)>/`: every contender
//! puts `P/<encode_key(K)>/<its lease id in hex>`, exactly as etcd's
//! `concurrency.NewMutex(session, "P/<name>")` (and so `etcdctl lock P/<name>`) does.

use distlock_api::LockKey;

/// Encodes a lock key as one path segment: ASCII letters, digits and `-`, `_`, `.`,
/// `~`, `:`, `@` stay as they are; every other byte (`/` and `%` among them) becomes
/// `%XX`. The encoding is injective, so different keys (case included) never share a
/// lock, and a key containing `/` cannot reach into another key's range. A key made
/// only of kept characters is its own encoding, so `etcdctl lock P/orders` and the
/// key `orders` are the same lock.
pub fn encode_key(key: &LockKey) -> String {
    let mut out = String::with_capacity(key.as_str().len());
    for byte in key.as_str().bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~:@".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    // `.` and `..` alone are kept: etcd keys are not paths, so they mean nothing special.
    out
}

/// `P/<encode_key(K)>/`: the range every contender of `key` puts its key in.
pub fn lock_prefix(prefix: &str, key: &LockKey) -> String {
    format!("{prefix}/{}/", encode_key(key))
}

/// The path segment under the prefix that holds the elections. `+` is never part of
/// an encoded key (it becomes `%2B`), so no lock's range `P/<encode_key(K)>/` covers
/// an election's, whatever `K`.
pub const ELECTION_SEGMENT: &str = "+election";

/// `P/+election/<encode_key(name)>/`: the range every candidate of the election `name`
/// puts its key in; `etcdctl elect P/+election/<name>` (without the trailing `/`)
/// campaigns in the same election.
pub fn election_prefix(prefix: &str, name: &LockKey) -> String {
    format!("{prefix}/{ELECTION_SEGMENT}/{}/", encode_key(name))
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
        assert_eq!(lock_prefix("distlock", &key("a b")), "distlock/a%20b/");
        assert_eq!(contender_key("p/k/", 0x694d_7a1b), "p/k/694d7a1b");
        assert_eq!(
            election_prefix("distlock", &key("a/b")),
            "distlock/+election/a%2Fb/"
        );
        // No lock's range covers an election's.
        let elections = format!("distlock/{ELECTION_SEGMENT}/");
        assert!(!elections.starts_with(&lock_prefix("distlock", &key("+election"))));
    }

    #[test]
    fn prefix_end_covers_the_prefix() {
        assert_eq!(prefix_end("p/k/"), b"p/k0".to_vec());
        assert_eq!(prefix_end("a\u{7f}"), b"a\x80".to_vec());
    }
}

//! [`advisory_key`]: the stable 64-bit advisory-lock key of a [`LockKey`].

use distlock_api::LockKey;
use sha2::{Digest, Sha256};

/// The advisory-lock key (`bigint`) that `key` is locked under.
///
/// The first 8 bytes of the SHA-256 digest of the key's UTF-8 bytes, read as a
/// big-endian two's-complement `i64`. The function is fixed: it does not depend on
/// the Rust release, the platform or a random seed (unlike `std`'s `DefaultHasher`),
/// so every version of distlock, on every machine, locks a key under the same number.
/// Other languages compute it the same way, and so does SQL:
///
/// ```sql
/// SELECT ('x' || left(encode(sha256(convert_to('invoices/2026-11', 'UTF8')), 'hex'), 16))::bit(64)::bigint;
/// ```
///
/// A collision (two keys with the same 64-bit value; about one chance in 2^32 among
/// 2^16 keys, by the birthday bound) only makes the two keys contend with each other
/// as if they were one lock: waiting longer than needed, never two holders of one key.
///
/// ```
/// # use distlock_api::LockKey;
/// let key = LockKey::new("hello").unwrap();
/// assert_eq!(distlock_postgres::advisory_key(&key), 0x2cf2_4dba_5fb0_a30e);
/// ```
pub fn advisory_key(key: &LockKey) -> i64 {
    let digest = Sha256::digest(key.as_str().as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// The digest of `key` in the namespace `namespace` (a semaphore's, read-write
/// lock's or election's advisory ids): SHA-256 of `namespace`, a zero byte, then the
/// key's UTF-8 bytes. The prefix keeps these ids apart from the
/// mutex's ([`advisory_key`] hashes the key alone) and from each other: they meet only
/// by a hash collision, as two mutex keys can.
fn namespaced(namespace: &str, key: &LockKey) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(namespace.as_bytes());
    hasher.update([0u8]);
    hasher.update(key.as_str().as_bytes());
    hasher.finalize().into()
}

fn first_i64(digest: &[u8; 32]) -> i64 {
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// The advisory key (`bigint`) of the read-write lock `key`: readers lock it shared,
/// writers exclusive. The first 8 bytes of SHA-256 of `"distlock-rw"`, a zero byte and
/// the key, big-endian, as [`advisory_key`] does.
pub(crate) fn rw_advisory_key(key: &LockKey) -> i64 {
    first_i64(&namespaced("distlock-rw", key))
}

/// The advisory key (`bigint`) of the election `name`, held exclusive by its leader:
/// SHA-256 of `"distlock-election"`, a zero byte and the name, as [`rw_advisory_key`].
pub(crate) fn election_advisory_key(name: &LockKey) -> i64 {
    first_i64(&namespaced("distlock-election", name))
}

/// The advisory key (`bigint`) of permit slot `slot` of the semaphore `key`: SHA-256
/// of `"distlock-permit-{slot}"`, a zero byte and the key, as [`rw_advisory_key`].
pub(crate) fn permit_slot_key(key: &LockKey, slot: u32) -> i64 {
    first_i64(&namespaced(&format!("distlock-permit-{slot}"), key))
}

/// The first `int4` of the two-`int4` advisory key `(count key, permit count)` that
/// every permit holder of the semaphore `key` holds shared: the first 4 bytes of
/// SHA-256 of `"distlock-permits"`, a zero byte and the key, with the top bit cleared
/// (so it reads the same as `int4` and as the `oid` in `pg_locks.classid`).
pub(crate) fn permit_count_key(key: &LockKey) -> i32 {
    let digest = namespaced("distlock-permits", key);
    let mut first = [0u8; 4];
    first.copy_from_slice(&digest[..4]);
    (u32::from_be_bytes(first) >> 1) as i32
}

/// The `pg_locks` columns (`classid`, `objid`) under which a `bigint` advisory key
/// shows (`objsubid` is 1): its high and low 32 bits, as unsigned numbers.
pub(crate) fn pg_locks_ids(hash: i64) -> (i64, i64) {
    let bits = hash as u64;
    ((bits >> 32) as i64, (bits & 0xffff_ffff) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> LockKey {
        LockKey::new(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    #[test]
    fn known_keys_map_to_fixed_values() {
        // sha256("hello") = 2cf24dba5fb0a30e…
        assert_eq!(advisory_key(&key("hello")), 0x2cf2_4dba_5fb0_a30e);
        // sha256("a") = ca978112ca1bbdca…: the top bit is set, so the key is negative.
        assert_eq!(
            advisory_key(&key("a")),
            i64::from_be_bytes([0xca, 0x97, 0x81, 0x12, 0xca, 0x1b, 0xbd, 0xca])
        );
        assert!(advisory_key(&key("a")) < 0);
    }

    #[test]
    fn case_and_prefix_give_different_keys() {
        let keys = ["job", "Job", "job2", "jo", "job/..", "🔒"];
        let hashes: std::collections::HashSet<i64> =
            keys.iter().map(|k| advisory_key(&key(k))).collect();
        assert_eq!(hashes.len(), keys.len());
    }

    #[test]
    fn namespaces_keep_primitives_apart() {
        let k = key("job");
        let ids = [
            advisory_key(&k),
            rw_advisory_key(&k),
            election_advisory_key(&k),
            permit_slot_key(&k, 0),
            permit_slot_key(&k, 1),
        ];
        let distinct: std::collections::HashSet<i64> = ids.iter().copied().collect();
        assert_eq!(distinct.len(), ids.len());
        assert!(permit_count_key(&k) >= 0);
        assert_eq!(permit_count_key(&k), permit_count_key(&key("job")));
    }

    #[test]
    fn pg_locks_split() {
        assert_eq!(pg_locks_ids(-5), (0xffff_ffff, 0xffff_fffb));
        assert_eq!(pg_locks_ids(0x1_0000_0002), (1, 2));
        assert_eq!(pg_locks_ids(0), (0, 0));
    }
}

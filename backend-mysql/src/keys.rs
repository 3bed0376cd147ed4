//! [`lock_name`]: the `GET_LOCK` name of a [`LockKey`], and the names of the other
//! primitives' locks.
//!
//! `GET_LOCK` names are limited to 64 characters, and MySQL compares them
//! case-insensitively while MariaDB 10.11 compares them as written. So every name
//! this backend uses is lowercase ASCII, and two keys get one name only when they
//! are equal (or by a SHA-256 collision): the mapping is injective and the same on
//! both servers.
//!
//! - **Direct form**: `dl:` followed by the key itself, when the key is at most 61
//!   characters, all of them lowercase ASCII letters, digits or one of `_ - . / :`.
//!   The name reads as the key, and other programs can take the same lock by writing
//!   it (`SELECT GET_LOCK('dl:invoices/2026-11', 10)`).
//! - **Hashed form**: `dl#` followed by the first 60 hex digits (lowercase) of
//!   SHA-256 of the key's UTF-8 bytes, for every other key (upper case letters,
//!   spaces, other symbols, non-ASCII, or longer). In SQL:
//!   `CONCAT('dl#', LEFT(SHA2('Invoices 2026', 256), 60))`.
//!
//! The two forms differ in their third character, so a direct name never equals a
//! hashed one. The semaphore's permit slots and the elections' locks use names of
//! their own, always hashed with a namespace (`dp#…`, `de#…`), so they never meet a
//! mutex's name.

use distlock_api::LockKey;
use sha2::{Digest, Sha256};

/// The longest `GET_LOCK` name MySQL accepts.
pub const MAX_NAME_CHARS: usize = 64;
/// The prefix of a name that spells its key.
const DIRECT: &str = "dl:";
/// The prefix of a name that hashes its key.
const HASHED: &str = "dl#";
/// Hex digits of the hash kept in a hashed name (240 bits).
const HASH_DIGITS: usize = 60;

/// The `GET_LOCK` name the mutex `key` is locked under: see the module docs (the
/// direct form `dl:<key>` for short lowercase keys, else `dl#` + 60 hex digits of
/// SHA-256 of the key).
///
/// ```
/// # use distlock_api::LockKey;
/// let key = LockKey::new("invoices/2026-11").unwrap();
/// assert_eq!(distlock_mysql::lock_name(&key), "dl:invoices/2026-11");
/// let key = LockKey::new("Invoices").unwrap();
/// assert!(distlock_mysql::lock_name(&key).starts_with("dl#"));
/// ```
pub fn lock_name(key: &LockKey) -> String {
    let text = key.as_str();
    if is_direct(text) {
        format!("{DIRECT}{text}")
    } else {
        hashed(HASHED, text.as_bytes())
    }
}

/// Whether `key` is spelled as itself in its lock name.
fn is_direct(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= MAX_NAME_CHARS - DIRECT.len()
        && key.bytes().all(|b| {
            b.is_ascii_lowercase()
                || b.is_ascii_digit()
                || matches!(b, b'_' | b'-' | b'.' | b'/' | b':')
        })
}

/// `prefix` followed by the first [`HASH_DIGITS`] lowercase hex digits of SHA-256
/// of `bytes`.
fn hashed(prefix: &str, bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut name = String::with_capacity(prefix.len() + HASH_DIGITS);
    name.push_str(prefix);
    for byte in digest.iter().take(HASH_DIGITS / 2) {
        name.push_str(&format!("{byte:02x}"));
    }
    name
}

/// SHA-256 of `namespace`, a zero byte and the key, hashed under `prefix`.
fn namespaced(prefix: &str, namespace: &str, key: &LockKey) -> String {
    let mut bytes = Vec::with_capacity(namespace.len() + 1 + key.as_str().len());
    bytes.extend_from_slice(namespace.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(key.as_str().as_bytes());
    hashed(prefix, &bytes)
}

/// The lock name of the election `name`: `de#` + 60 hex digits of SHA-256 of
/// `"distlock-election"`, a zero byte and the name.
pub(crate) fn election_name(name: &LockKey) -> String {
    namespaced("de#", "distlock-election", name)
}

/// The lock name of permit slot `slot` of the semaphore `key`: `dp#` + 60 hex digits
/// of SHA-256 of `"distlock-permit-{slot}"`, a zero byte and the key.
pub(crate) fn permit_slot_name(key: &LockKey, slot: u32) -> String {
    namespaced("dp#", &format!("distlock-permit-{slot}"), key)
}

/// The row of the semaphore `key` in the permit-count table: `dc#` + 60 hex digits
/// of SHA-256 of `"distlock-permits"`, a zero byte and the key.
pub(crate) fn permit_count_name(key: &LockKey) -> String {
    namespaced("dc#", "distlock-permits", key)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn key(s: &str) -> LockKey {
        LockKey::new(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    #[test]
    fn short_lowercase_keys_are_spelled() {
        assert_eq!(lock_name(&key("job")), "dl:job");
        assert_eq!(lock_name(&key("a/b-c_d.e:f")), "dl:a/b-c_d.e:f");
        let longest = "x".repeat(61);
        assert_eq!(lock_name(&key(&longest)), format!("dl:{longest}"));
    }

    #[test]
    fn other_keys_are_hashed_to_a_fixed_value() {
        // sha256("hello") = 2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824
        assert_eq!(
            hashed(HASHED, b"hello"),
            "dl#2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b"
        );
        let name = lock_name(&key("Job"));
        assert!(name.starts_with("dl#"), "{name}");
        assert_eq!(lock_name(&key(&"x".repeat(62))).len(), 63);
    }

    #[test]
    fn every_name_fits_and_is_lowercase() {
        for k in ["job", "Job", "JOB", "🔒", "a b", &"y".repeat(1000)] {
            let name = lock_name(&key(k));
            assert!(name.chars().count() <= MAX_NAME_CHARS, "{name}");
            assert_eq!(name, name.to_ascii_lowercase(), "{name}");
        }
    }

    #[test]
    fn injective_including_case_variants() {
        let mut keys: Vec<String> = [
            "job", "Job", "JOB", "jOb", "job2", "jo", "job/..", "🔒", "dl:job", "dl#job",
        ]
        .map(String::from)
        .to_vec();
        keys.extend(["x".repeat(61), "x".repeat(62), "X".repeat(61)]);
        let names: HashSet<String> = keys.iter().map(|k| lock_name(&key(k))).collect();
        assert_eq!(names.len(), keys.len());
        // Case-folded, as MySQL compares them: still all distinct.
        let folded: HashSet<String> = names.iter().map(|n| n.to_lowercase()).collect();
        assert_eq!(folded.len(), keys.len());
    }

    #[test]
    fn namespaces_keep_primitives_apart() {
        let k = key("job");
        let names = [
            lock_name(&k),
            election_name(&k),
            permit_slot_name(&k, 0),
            permit_slot_name(&k, 1),
            permit_count_name(&k),
        ];
        let distinct: HashSet<&String> = names.iter().collect();
        assert_eq!(distinct.len(), names.len());
        assert!(names.iter().all(|n| n.len() <= MAX_NAME_CHARS));
    }
}

//! Key to file name: injective, portable and free of path tricks.

use distlock_api::LockKey;
use sha2::{Digest, Sha256};

/// Longest file name we produce; most file systems allow 255 bytes.
const MAX_NAME: usize = 255;
const SUFFIX: &str = ".lock";

/// The lock file name for `key`.
///
/// `k-` + the key with every byte outside `[a-z0-9._-]` written as `%xx` (so `/`, `..`,
/// upper case and NUL-free UTF-8 all map to plain, distinct names, also on
/// case-insensitive file systems) + `.lock`. Keys whose name would pass 255 bytes use
/// `h-` + the SHA-256 of the key instead: still distinct unless SHA-256 collides.
pub(crate) fn file_name(key: &LockKey) -> String {
    derived_name(key, SUFFIX)
}

/// The name of one of `key`'s semaphore or read-write lock files: [`file_name`] with
/// `suffix` (such as `.rw` or `.permit-3`) in place of `.lock`, hashed the same way
/// when too long: when either the `.lock` name or this one would pass 255 bytes. No
/// suffix ends another suffix, or `.lock`, so names stay distinct across keys and
/// kinds.
///
/// Built without `format!`: it runs for every file of every attempt.
pub(crate) fn derived_name(key: &LockKey, suffix: &str) -> String {
    let key = key.as_str();
    let mut name = String::with_capacity(2 + key.len() + suffix.len());
    name.push_str("k-");
    for byte in key.bytes() {
        if byte.is_ascii_lowercase() || byte.is_ascii_digit() || b"._-".contains(&byte) {
            name.push(char::from(byte));
        } else {
            name.push('%');
            push_hex(&mut name, byte);
        }
    }
    if name.len() + SUFFIX.len().max(suffix.len()) <= MAX_NAME {
        name.push_str(suffix);
        return name;
    }
    let mut hashed = String::with_capacity(2 + 64 + suffix.len());
    hashed.push_str("h-");
    for byte in Sha256::digest(key.as_bytes()) {
        push_hex(&mut hashed, byte);
    }
    hashed.push_str(suffix);
    hashed
}

/// Appends `byte` as two lowercase hex digits.
fn push_hex(name: &mut String, byte: u8) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    name.push(char::from(DIGITS[usize::from(byte >> 4)]));
    name.push(char::from(DIGITS[usize::from(byte & 0xf)]));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(key: &str) -> String {
        file_name(&LockKey::new(key).expect("valid key"))
    }

    #[test]
    fn plain_keys_stay_readable() {
        assert_eq!(name("nightly-report.v2"), "k-nightly-report.v2.lock");
    }

    #[test]
    fn path_tricks_and_case_are_escaped() {
        assert_eq!(name(".."), "k-...lock");
        assert_eq!(name("../etc/passwd"), "k-..%2fetc%2fpasswd.lock");
        assert_eq!(name("A"), "k-%41.lock");
        assert_ne!(name("A"), name("a"));
        assert_eq!(name("%41"), "k-%2541.lock");
        assert_ne!(name("%41"), name("A"));
        assert_eq!(name("é"), "k-%c3%a9.lock");
    }

    #[test]
    fn long_keys_are_hashed_within_the_name_limit() {
        let long = "x".repeat(300);
        let hashed = name(&long);
        assert!(
            hashed.starts_with("h-") && hashed.len() <= MAX_NAME,
            "{hashed}"
        );
        assert_ne!(hashed, name(&"x".repeat(301)));
        let longest_plain = "x".repeat(MAX_NAME - 2 - SUFFIX.len());
        assert!(name(&longest_plain).starts_with("k-"));
    }

    #[test]
    fn derived_names_keep_the_key_and_fit() {
        let key = LockKey::new("Jobs/a").unwrap();
        assert_eq!(derived_name(&key, ".rw"), "k-%4aobs%2fa.rw");
        let long = LockKey::new("x".repeat(250)).unwrap();
        let name = derived_name(&long, ".permit-1023");
        assert!(name.starts_with("h-") && name.len() <= MAX_NAME, "{name}");
    }

    #[test]
    fn a_key_with_a_hashed_lock_name_has_every_derived_name_hashed() {
        // `k-` + the key + `.rw` would fit, `k-` + the key + `.lock` does not.
        let key = LockKey::new("x".repeat(MAX_NAME - 2 - SUFFIX.len() + 1)).unwrap();
        let digest = Sha256::digest(key.as_str().as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(file_name(&key), format!("h-{hex}.lock"));
        assert_eq!(derived_name(&key, ".rw"), format!("h-{hex}.rw"));
        let plain = LockKey::new("x".repeat(MAX_NAME - 2 - SUFFIX.len())).unwrap();
        assert!(derived_name(&plain, ".rw").starts_with("k-"));
    }

    #[test]
    fn names_never_contain_separators() {
        for key in ["a/b", "a\\b", "/", "a b", "\u{7f}", "ü/../x"] {
            let n = name(key);
            assert!(
                !n.contains('/') && !n.contains('\\') && !n.contains(' '),
                "{n}"
            );
        }
    }
}

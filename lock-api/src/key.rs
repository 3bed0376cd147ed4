//! [`LockKey`]: a validated lock name.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// The longest key accepted, in bytes of UTF-8.
///
/// Backends map keys to their own namespaces (Redis keys, ZooKeeper paths, Postgres
/// hashes); this bound keeps every mapping within the servers' limits.
pub const MAX_KEY_LEN: usize = 1024;

/// Why a string was refused as a [`LockKey`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key was empty.
    #[error("the key is empty")]
    Empty,
    /// The key contained a NUL character, which several servers cannot store.
    #[error("the key contains a NUL character at byte {offset}")]
    ContainsNul {
        /// Byte offset of the first NUL.
        offset: usize,
    },
    /// The key was longer than [`MAX_KEY_LEN`] bytes.
    #[error("the key is {len} bytes long; the maximum is {max}")]
    TooLong {
        /// The key's length in bytes.
        len: usize,
        /// [`MAX_KEY_LEN`].
        max: usize,
    },
}

/// The name of a lock.
///
/// Any non-empty UTF-8 string of at most [`MAX_KEY_LEN`] bytes without NUL is a key,
/// including `/`, `..`, spaces and emoji. Keys compare byte for byte: keys that differ
/// only by case, or where one is a prefix of the other, name different locks.
/// Cloning is cheap.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockKey(Arc<str>);

impl LockKey {
    /// Validates `key`.
    ///
    /// # Errors
    /// [`KeyError`] when the key is empty, too long or contains NUL.
    pub fn new(key: impl AsRef<str>) -> Result<Self, KeyError> {
        let key = key.as_ref();
        if key.is_empty() {
            return Err(KeyError::Empty);
        }
        if key.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong {
                len: key.len(),
                max: MAX_KEY_LEN,
            });
        }
        if let Some(offset) = key.find('\0') {
            return Err(KeyError::ContainsNul { offset });
        }
        Ok(LockKey(Arc::from(key)))
    }

    /// The key as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for LockKey {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, KeyError> {
        LockKey::new(s)
    }
}

impl TryFrom<&str> for LockKey {
    type Error = KeyError;
    fn try_from(s: &str) -> Result<Self, KeyError> {
        LockKey::new(s)
    }
}

impl TryFrom<String> for LockKey {
    type Error = KeyError;
    fn try_from(s: String) -> Result<Self, KeyError> {
        LockKey::new(s)
    }
}

impl AsRef<str> for LockKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_any_other_utf8() {
        for key in ["a", "a/b", "..", "../x", "with space", "🔒 lock", "A"] {
            assert_eq!(
                LockKey::new(key).map(|k| k.to_string()),
                Ok(key.to_string())
            );
        }
        assert!(LockKey::new("x".repeat(MAX_KEY_LEN)).is_ok());
    }

    #[test]
    fn rejects_empty_nul_and_long() {
        assert_eq!(LockKey::new(""), Err(KeyError::Empty));
        assert_eq!(
            LockKey::new("ab\0c"),
            Err(KeyError::ContainsNul { offset: 2 })
        );
        assert_eq!(
            LockKey::new("x".repeat(1 << 20)),
            Err(KeyError::TooLong {
                len: 1 << 20,
                max: MAX_KEY_LEN
            })
        );
    }

    #[test]
    fn case_and_prefix_are_distinct() {
        let a = LockKey::new("job").ok();
        assert_ne!(a, LockKey::new("Job").ok());
        assert_ne!(a, LockKey::new("job2").ok());
    }
}

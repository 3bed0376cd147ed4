//! Lock keys to ZooKeeper node names, and the Curator-compatible contender names.

use distlock_api::backend::prelude::*;
use distlock_api::{LockKey, OwnerToken};

/// The lock name Curator's `InterProcessMutex` uses: contender nodes are called
/// `_c_<guid>-lock-<sequence>`.
pub const LOCK_NAME: &str = "lock-";

/// Curator's prefix of protected node names (`CreateBuilder.withProtection()`).
pub const PROTECTED_PREFIX: &str = "_c_";

/// Encodes a lock key as one ZooKeeper node name (one path segment).
///
/// The encoding works byte by byte on the key's UTF-8:
/// - ASCII letters, digits, `-` and `_` are kept;
/// - `.` is kept, except as the first byte;
/// - every other byte (including `/`, `%`, a leading `.`, spaces, control characters
///   and every byte of a non-ASCII character) is written as `%XX`, two uppercase hex
///   digits.
///
/// It is injective (`%` itself is always escaped, so [`decode_key`] undoes it), and
/// its output is always a valid node name: never empty, never `.` or `..`, no `/`,
/// and only printable ASCII, so none of the characters ZooKeeper's path validation
/// refuses. A key of [`distlock_api::MAX_KEY_LEN`] bytes encodes to at most three times
/// that, well within ZooKeeper's packet limit. Keys that differ only by case stay
/// distinct (ZooKeeper names are case-sensitive).
///
/// A Java service that locks the same key with Curator uses
/// `new InterProcessMutex(client, base + "/" + encode(key))` with the same rule.
///
/// ```
/// use distlock_api::LockKey;
/// use distlock_zookeeper::encode_key;
///
/// let key = LockKey::new("invoices/2026-11").unwrap();
/// assert_eq!(encode_key(&key), "invoices%2F2026-11");
/// assert_eq!(encode_key(&LockKey::new("..").unwrap()), "%2E.");
/// assert_eq!(encode_key(&LockKey::new("🔒").unwrap()), "%F0%9F%94%92");
/// ```
pub fn encode_key(key: &LockKey) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let bytes = key.as_str().as_bytes();
    let mut out = String::with_capacity(bytes.len());
    for (i, &b) in bytes.iter().enumerate() {
        let keep = b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || (b == b'.' && i > 0);
        if keep {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0x0f)]));
        }
    }
    out
}

/// Reverses [`encode_key`]: the key a node name stands for, or `None` if the name is
/// not the encoding of any key.
///
/// ```
/// use distlock_api::LockKey;
/// use distlock_zookeeper::{decode_key, encode_key};
///
/// let key = LockKey::new("a/../ü").unwrap();
/// assert_eq!(decode_key(&encode_key(&key)), Some(key));
/// assert_eq!(decode_key("%zz"), None);
/// ```
pub fn decode_key(name: &str) -> Option<LockKey> {
    let bytes = name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = name.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    let key = LockKey::new(String::from_utf8(out).ok()?).ok()?;
    // Only canonical encodings decode: this keeps the mapping a bijection.
    (encode_key(&key) == name).then_some(key)
}

/// The owner token in UUID form (`8-4-4-4-12` lowercase hex digits), the GUID of
/// Curator's protected names.
pub fn owner_guid(owner: OwnerToken) -> String {
    let v = owner.as_u128();
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        v >> 96,
        (v >> 80) & 0xffff,
        (v >> 64) & 0xffff,
        (v >> 48) & 0xffff,
        v & 0xffff_ffff_ffff
    )
}

/// `_c_<guid>-`: every node of one contender starts with this.
pub(crate) fn protected_prefix(owner: OwnerToken) -> String {
    format!("{PROTECTED_PREFIX}{}-", owner_guid(owner))
}

/// `_c_<guid>-<name>`: the name a contender of `kind` asks ZooKeeper to append a
/// sequence to (`_c_<guid>-lock-` for the mutex).
pub(crate) fn contender_prefix(owner: OwnerToken, kind: NodeKind) -> String {
    format!("{}{}", protected_prefix(owner), kind.name())
}

/// Curator's `InterProcessSemaphoreV2` lease nodes: `_c_<guid>-lease-<sequence>`.
pub const LEASE_NAME: &str = "lease-";

/// Curator's `InterProcessReadWriteLock` read contenders: `_c_<guid>-__READ__<sequence>`.
pub const READ_NAME: &str = "__READ__";

/// Curator's `InterProcessReadWriteLock` write contenders: `_c_<guid>-__WRIT__<sequence>`.
pub const WRITE_NAME: &str = "__WRIT__";

/// Curator's `LeaderLatch` candidates: `_c_<guid>-latch-<sequence>`.
pub const LATCH_NAME: &str = "latch-";

/// What one sequential node of ours stands for, by the Curator recipe it follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NodeKind {
    /// An `InterProcessMutex` contender (also the semaphore's guard mutex).
    Lock,
    /// An `InterProcessSemaphoreV2` lease.
    Lease,
    /// An `InterProcessReadWriteLock` reader.
    Read,
    /// An `InterProcessReadWriteLock` writer.
    Write,
    /// A `LeaderLatch` candidate.
    Latch,
}

impl NodeKind {
    /// The name its sequence follows.
    pub(crate) fn name(self) -> &'static str {
        match self {
            NodeKind::Lock => LOCK_NAME,
            NodeKind::Lease => LEASE_NAME,
            NodeKind::Read => READ_NAME,
            NodeKind::Write => WRITE_NAME,
            NodeKind::Latch => LATCH_NAME,
        }
    }

    /// The sequence of `name` if it is a node of this kind's directory (of any kind
    /// sharing it: readers and writers share one), as Curator ranks them.
    fn sequence(self, name: &str) -> Option<i64> {
        match self {
            NodeKind::Lock => lock_sequence(name),
            NodeKind::Lease => sequence_after(name, &[LEASE_NAME]),
            NodeKind::Read | NodeKind::Write => sequence_after(name, &[READ_NAME, WRITE_NAME]),
            NodeKind::Latch => sequence_after(name, &[LATCH_NAME]),
        }
    }
}

/// The digits ending `name` right after one of `names`.
fn sequence_after(name: &str, names: &[&str]) -> Option<i64> {
    let prefix = name.trim_end_matches(|c: char| c.is_ascii_digit());
    let digits = &name[prefix.len()..];
    if digits.is_empty() || !names.iter().any(|n| prefix.ends_with(n)) {
        return None;
    }
    digits.parse().ok()
}

/// Whether `name` is a writer of a read-write lock (ours or Curator's).
pub(crate) fn is_writer(name: &str) -> bool {
    sequence_after(name, &[WRITE_NAME]).is_some()
}

/// The owner token in a protected contender name, if it is one of ours (or Curator's).
pub fn owner_of(name: &str) -> Option<OwnerToken> {
    let rest = name.strip_prefix(PROTECTED_PREFIX)?;
    let guid = rest.get(..36)?;
    if rest.as_bytes().get(36) != Some(&b'-') {
        return None;
    }
    let shape_ok = guid.char_indices().all(|(i, c)| match i {
        8 | 13 | 18 | 23 => c == '-',
        _ => c.is_ascii_hexdigit(),
    });
    if !shape_ok {
        return None;
    }
    let hex: String = guid.chars().filter(|c| *c != '-').collect();
    u128::from_str_radix(&hex, 16)
        .ok()
        .map(OwnerToken::from_u128)
}

/// kazoo's lock name: its `Lock` (and `WriteLock`) contenders are
/// `<uuid>__lock__<sequence>`.
pub const KAZOO_LOCK_NAME: &str = "__lock__";

/// The sequence number of a contender node name: the digits after a trailing `lock-`
/// (ours and Curator's, as Curator's `StandardLockInternalsDriver.fixForSorting` reads
/// them) or a trailing `__lock__` (kazoo's, [`KAZOO_LOCK_NAME`]).
/// `None` for any other name, in particular one without a sequence suffix.
pub fn lock_sequence(name: &str) -> Option<i64> {
    sequence_after(name, &[LOCK_NAME, KAZOO_LOCK_NAME])
}

/// The contenders among `children`, lowest sequence (the holder) first: ours, Curator's
/// and kazoo's (see [`lock_sequence`]), ranked together by their sequence, which the
/// server counts per directory whoever creates the node. Children that are not
/// contender nodes are ignored.
pub(crate) fn rank(children: &[String]) -> Vec<(i64, &str)> {
    rank_kind(children, NodeKind::Lock)
}

/// [`rank`] for the directory of `kind`'s nodes: semaphore leases, or the readers and
/// writers of a read-write lock together.
pub(crate) fn rank_kind(children: &[String], kind: NodeKind) -> Vec<(i64, &str)> {
    let mut ranked: Vec<(i64, &str)> = children
        .iter()
        .filter_map(|name| kind.sequence(name).map(|seq| (seq, name.as_str())))
        .collect();
    ranked.sort_unstable();
    ranked
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock_api::MAX_KEY_LEN;

    fn key(s: &str) -> LockKey {
        LockKey::new(s).unwrap()
    }

    #[test]
    fn encoding_is_path_safe_and_reversible() {
        let long = "é".repeat(MAX_KEY_LEN / 2);
        for raw in [
            "a",
            ".",
            "..",
            "...",
            "a/b",
            "/",
            "a/../b",
            "%",
            "%2F",
            "A",
            "a.b",
            ".hidden",
            "with space",
            "🔒 lock",
            "tab\there",
            "zookeeper",
            &long,
        ] {
            let encoded = encode_key(&key(raw));
            assert!(!encoded.is_empty());
            assert_ne!(encoded, ".");
            assert_ne!(encoded, "..");
            assert!(!encoded.starts_with('.'), "{encoded}");
            assert!(
                encoded.bytes().all(|b| b.is_ascii_graphic() && b != b'/'),
                "{encoded}"
            );
            assert!(encoded.len() <= 3 * MAX_KEY_LEN);
            assert_eq!(decode_key(&encoded), Some(key(raw)), "{raw:?}");
        }
    }

    #[test]
    fn encoding_is_injective_on_tricky_pairs() {
        let pairs = [
            ("a/b", "a%2Fb"),
            ("job", "Job"),
            ("a", "a/"),
            (".", "%2E"),
            ("x.", "x%2E"),
        ];
        for (a, b) in pairs {
            assert_ne!(encode_key(&key(a)), encode_key(&key(b)), "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn non_canonical_names_do_not_decode() {
        for name in ["%2e", "a%2Db", ".x", "%", "%G0", "", "%00"] {
            assert_eq!(decode_key(name), None, "{name:?}");
        }
    }

    #[test]
    fn guid_round_trips_through_curator_names() {
        let owner = OwnerToken::from_u128(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
        assert_eq!(owner_guid(owner), "01234567-89ab-cdef-0011-223344556677");
        let name = format!("{}0000000042", contender_prefix(owner, NodeKind::Lock));
        assert_eq!(
            name,
            "_c_01234567-89ab-cdef-0011-223344556677-lock-0000000042"
        );
        assert_eq!(owner_of(&name), Some(owner));
        assert_eq!(lock_sequence(&name), Some(42));
        assert_eq!(owner_of("lock-0000000001"), None);
        assert_eq!(owner_of("_c_not-a-guid-lock-0000000001"), None);
    }

    #[test]
    fn ranking_follows_sequence_and_skips_strangers() {
        let children: Vec<String> = [
            "_c_aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa-lock-0000000003",
            "garbage",
            "_c_bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb-lock-0000000001",
            "lock-0000000002",
            "lock-",
            "5f1c9e3a8b2d4c6e9f0a1b2c3d4e5f60__lock__0000000004",
            "0123456789abcdef0123456789abcdef__lock__0000000000",
            "0123456789abcdef0123456789abcdef__rlock__0000000009",
            "plain-0000000007",
            "x__lock__",
            "__lock__abc",
        ]
        .map(String::from)
        .to_vec();
        let ranked: Vec<i64> = rank(&children).into_iter().map(|(s, _)| s).collect();
        assert_eq!(ranked, [0, 1, 2, 3, 4]);
    }

    #[test]
    fn curator_semaphore_and_rw_names_rank_by_sequence() {
        let owner = OwnerToken::from_u128(1);
        let read = format!("{}0000000002", contender_prefix(owner, NodeKind::Read));
        let write = format!("{}0000000001", contender_prefix(owner, NodeKind::Write));
        assert!(read.ends_with("-__READ__0000000002"), "{read}");
        let children = vec![read.clone(), write.clone(), "lock-0000000000".to_owned()];
        let ranked = rank_kind(&children, NodeKind::Read);
        assert_eq!(ranked, [(1, write.as_str()), (2, read.as_str())]);
        assert!(is_writer(&write) && !is_writer(&read));
        let lease = format!("{}0000000007", contender_prefix(owner, NodeKind::Lease));
        assert_eq!(NodeKind::Lease.sequence(&lease), Some(7));
        assert_eq!(NodeKind::Lock.sequence(&lease), None);
        let latch = format!("{}0000000003", contender_prefix(owner, NodeKind::Latch));
        assert!(latch.ends_with("-latch-0000000003"), "{latch}");
        assert_eq!(NodeKind::Latch.sequence(&latch), Some(3));
        assert_eq!(NodeKind::Latch.sequence(&lease), None);
    }

    #[test]
    fn foreign_sequences_read_like_kazoo_and_curator() {
        assert_eq!(lock_sequence("abc__lock__0000000012"), Some(12));
        assert_eq!(lock_sequence("_c_x-lock-0000000014"), Some(14));
        // No sequence, or another library's name we do not know: not a contender.
        // kazoo's read locks share a mutex's directory only with other read locks.
        for name in [
            "abc__lock__",
            "lock-",
            "abc__rlock__0000000001",
            "lease-0000000001",
        ] {
            assert_eq!(lock_sequence(name), None, "{name}");
        }
    }
}

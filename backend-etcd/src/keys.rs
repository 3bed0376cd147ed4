//! Where a lock lives in etcd's key space.
//!
//! Lock `K` under prefix `P` is the key range `P/<encode_key(K)>/`: every contender
//! puts `P/<encode_key(K)>/<name>`, as etcd's `concurrency.NewMutex(session, "P/<name>")`
//! (and so `etcdctl lock P/<name>`) puts `P/<name>/<its lease id in hex>`. A distlock
//! contender's name is [`contender_key`]'s (key layout 2): `<client id>-<slot>` in hex,
//! reused by its client (see `lock::names`).
//! The other primitives have namespaces of their own under the prefix, each a path
//! segment starting with `+`, which no encoded key contains (it becomes `%2B`), so no
//! range lies inside another: elections `P/+election/<encode_key(K)>/`, semaphores
//! `P/+semaphore/<encode_key(K)>/`, read-write locks `P/+rw/<encode_key(K)>/`. A
//! semaphore or read-write waiter also marks its grant pending in
//! `P/+semaphore-pending/<encode_key(K)>/` or `P/+rw-pending/<encode_key(K)>/` until it
//! has its fencing token.

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

/// The path segment under the prefix that holds the semaphores.
pub const SEMAPHORE_SEGMENT: &str = "+semaphore";

/// The path segment under the prefix that holds the read-write locks.
pub const RW_SEGMENT: &str = "+rw";

/// A contender's primitive: where its key goes and which older contenders keep it
/// from holding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The mutex: `P/<K>/<lease>`; held with no older contender.
    Mutex,
    /// An election's candidate: `P/+election/<K>/<lease>`; leads with no older one.
    Candidate,
    /// A permit of a semaphore of this many: `P/+semaphore/<K>/<lease>`; held with
    /// fewer older contenders than the count.
    Permit(u32),
    /// A reader: `P/+rw/<K>/read/<lease>`; held with no older writer.
    Read,
    /// A writer: `P/+rw/<K>/write/<lease>`; held with no older contender.
    Write,
}

impl Kind {
    /// The range every contender of `key` of this primitive puts its key in.
    pub(crate) fn range(self, prefix: &str, key: &LockKey) -> String {
        match self {
            Kind::Mutex => lock_prefix(prefix, key),
            Kind::Candidate => election_prefix(prefix, key),
            Kind::Permit(_) => format!("{prefix}/{SEMAPHORE_SEGMENT}/{}/", encode_key(key)),
            Kind::Read | Kind::Write => format!("{prefix}/{RW_SEGMENT}/{}/", encode_key(key)),
        }
    }

    /// Our key in `range`, named by the name id `named` (see [`contender_key`]).
    pub(crate) fn own_key(self, range: &str, named: i64) -> String {
        match self {
            Kind::Mutex | Kind::Candidate | Kind::Permit(_) => contender_key(range, named),
            Kind::Read => contender_key(&format!("{range}read/"), named),
            Kind::Write => contender_key(&format!("{range}write/"), named),
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

    /// Whether contenders' keys sit one level down, in `read/` and `write/` (the
    /// read-write lock's), rather than right in the range.
    pub(crate) fn layered(self) -> bool {
        matches!(self, Kind::Read | Kind::Write)
    }

    /// Whether a waiter of this kind parks its key on the short waiting lease. Not a
    /// read-write contender: a move writes the key again, and etcd's `recipes.RWMutex`
    /// ranks contenders by mod revision.
    pub(crate) fn parks(self) -> bool {
        !self.layered()
    }

    /// Where a semaphore or read-write waiter marks its grant pending until it has its
    /// fencing token (see [`crate::EtcdLock::semaphore`]): `P/+semaphore-pending/<K>/` and
    /// `P/+rw-pending/<K>/`, outside every range a contender reads (a Go `RWMutex` on
    /// `P/+rw/<K>` included). The mutex and the election have none: their waiters are
    /// granted one at a time.
    pub(crate) fn pending_range(self, prefix: &str, key: &LockKey) -> Option<String> {
        let segment = match self {
            Kind::Permit(_) => SEMAPHORE_SEGMENT,
            Kind::Read | Kind::Write => RW_SEGMENT,
            Kind::Mutex | Kind::Candidate => return None,
        };
        Some(format!("{prefix}/{segment}-pending/{}/", encode_key(key)))
    }

    /// How many older blocking contenders ours may have and still hold.
    pub(crate) fn room(self) -> usize {
        match self {
            Kind::Permit(max) => max as usize,
            _ => 1,
        }
    }
}

/// A waiter's pending marker in `pending` (a [`Kind::pending_range`]): its key's create
/// revision in 20 digits, so that markers sort as their contenders queue.
pub(crate) fn pending_marker(pending: &str, revision: i64) -> String {
    format!("{pending}{revision:020}")
}

/// Bits of a name id that hold the slot; the client id is the bits above.
pub(crate) const SLOT_BITS: u32 = 24;

/// A name id's client id (high bits) and slot (low [`SLOT_BITS`]).
pub(crate) fn split(named: i64) -> (u64, u64) {
    let named = named as u64;
    (named >> SLOT_BITS, named & ((1 << SLOT_BITS) - 1))
}

/// A distlock contender's key (key layout 2): the lock's range, then its name id's
/// client id and slot in lowercase hex, joined by `-`.
///
/// The `-` sets these names apart from layout 1's (a lease id or a random id alone in
/// hex, as etcd's `concurrency.Mutex` names its keys): a client of layout 1 takes a key
/// of this shape for another tool's data and fails its acquire
/// ([`crate::error::Fail::Foreign`]) rather than count down a reused name by its name
/// alone, which it would mistake for a later incarnation's deletion. etcd's own
/// recipes do not look at names.
pub(crate) fn contender_key(lock_prefix: &str, named: i64) -> String {
    let (client, slot) = split(named);
    format!("{lock_prefix}{client:x}-{slot:x}")
}

/// Whether `name` (a key's last segment, past its range and any `read/`/`write/`) is a
/// contender's: a layout-2 name ([`contender_key`]), or one id alone in lowercase hex of
/// at most `longest` characters (layout 1, etcd's `concurrency.Mutex`, `etcdctl lock`,
/// a Go service; a Go `recipes.RWMutex` names its keys by a decimal time in
/// nanoseconds).
pub(crate) fn is_contender_name(name: &[u8], longest: usize) -> bool {
    let hex = |id: &[u8], most: usize| {
        !id.is_empty()
            && id.len() <= most
            && id
                .iter()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
    };
    match name.iter().position(|b| *b == b'-') {
        Some(dash) => {
            let (client, slot) = (&name[..dash], &name[dash + 1..]);
            hex(client, 10) && hex(slot, 6)
        }
        None => hex(name, longest),
    }
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
        assert_eq!(contender_key("p/k/", 0x694d_7a1b), "p/k/69-4d7a1b");
        assert_eq!(contender_key("p/k/", (0x3f << SLOT_BITS) | 2), "p/k/3f-2");
        assert_eq!(
            contender_key("p/k/", i64::MAX),
            "p/k/7fffffffff-ffffff",
            "the longest name"
        );
        for name in ["3f-2", "7fffffffff-ffffff", "694d7a1b", "0"] {
            assert!(is_contender_name(name.as_bytes(), 16), "{name}");
        }
        for name in [
            "",
            "3f-",
            "-2",
            "3f-2-1",
            "3F-2",
            "7fffffffff0-1",
            "1-fffffff",
            "x1",
        ] {
            assert!(!is_contender_name(name.as_bytes(), 16), "{name}");
        }
        assert!(!is_contender_name(b"12345678901234567", 16));
        assert!(is_contender_name(b"12345678901234567", 20));
        assert_eq!(
            election_prefix("distlock", &key("a/b")),
            "distlock/+election/a%2Fb/"
        );
        // No lock's range covers an election's.
        let elections = format!("distlock/{ELECTION_SEGMENT}/");
        assert!(!elections.starts_with(&lock_prefix("distlock", &key("+election"))));
    }

    #[test]
    fn every_primitive_has_a_range_of_its_own() {
        assert_eq!(encode_key(&key(".semaphore")), ".semaphore");
        assert_eq!(Kind::Permit(2).range("p", &key("a")), "p/+semaphore/a/");
        assert_eq!(Kind::Read.range("p", &key("+rw")), "p/+rw/%2Brw/");
        assert_eq!(Kind::Candidate.range("p", &key("a")), "p/+election/a/");
        assert_eq!(Kind::Read.own_key("p/+rw/a/", 0x1f), "p/+rw/a/read/0-1f");
        assert_eq!(Kind::Write.own_key("p/+rw/a/", 0x1f), "p/+rw/a/write/0-1f");
        assert_eq!(Kind::Read.blocking("p/+rw/a/"), "p/+rw/a/write/");
        assert_eq!(Kind::Write.blocking("p/+rw/a/"), "p/+rw/a/");
        assert_eq!(
            Kind::Read.pending_range("p", &key("a")).as_deref(),
            Some("p/+rw-pending/a/")
        );
        assert_eq!(
            Kind::Permit(2).pending_range("p", &key("a")).as_deref(),
            Some("p/+semaphore-pending/a/")
        );
        assert_eq!(
            pending_marker("p/+rw-pending/a/", 42),
            "p/+rw-pending/a/00000000000000000042"
        );
        assert_eq!(Kind::Mutex.pending_range("p", &key("a")), None);
        assert_eq!(Kind::Candidate.pending_range("p", &key("a")), None);
        assert!(Kind::Permit(3).parks() && !Kind::Read.parks() && !Kind::Write.parks());
        // No range (nor pending range) of one kind lies inside another's, whatever the key.
        let ranges = |k: &LockKey| {
            let mut all = vec![
                Kind::Mutex.range("p", k),
                Kind::Candidate.range("p", k),
                Kind::Permit(1).range("p", k),
                Kind::Write.range("p", k),
            ];
            all.extend(Kind::Permit(1).pending_range("p", k));
            all.extend(Kind::Write.pending_range("p", k));
            all
        };
        for a in ["+semaphore", "+rw", "+rw-pending", "x", "+election"] {
            for b in ["+semaphore", "+rw", "+rw-pending", "x", "+election"] {
                for (i, ra) in ranges(&key(a)).iter().enumerate() {
                    for (j, rb) in ranges(&key(b)).iter().enumerate() {
                        if i != j {
                            assert!(!ra.starts_with(rb.as_str()), "{ra} in {rb}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn prefix_end_covers_the_prefix() {
        assert_eq!(prefix_end("p/k/"), b"p/k0".to_vec());
        assert_eq!(prefix_end("a\u{7f}"), b"a\x80".to_vec());
    }
}

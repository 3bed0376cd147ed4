//! The semaphore ([`crate::EtcdLock::semaphore`]) on the mutex's recipe, with room for
//! `max` holders: the permit count each contender's key records, and its check.
//!
//! etcd ships no semaphore recipe, so this one is the mutex's key-space discipline
//! with a wider door. Each contender puts `P/+semaphore/<K>/<its name>` under
//! its lease, holding `distlock:permits=<max>`; contenders are ranked by create
//! revision and the `max` oldest hold a permit. A waiter watches the `max` youngest
//! contenders older than its own: it can hold only once one of those goes (with
//! `k ≥ max` older contenders it holds once `k - max + 1` have gone, and only `k - max`
//! are not watched), so a deletion makes at most `max` waiters look again, never the
//! whole queue. (One watched key is watched alone; several through one watch of the
//! range, whose other deletions the waiter passes over without a request.)
//! Permits pass on in FIFO order of arrival. Leases, keep-alives, the loss watch, the
//! waiting lease, release, extend and clean-up are the mutex's.

use distlock_api::{LockError, LockKey, PermitMismatch};
use etcd_client::KeyValue;

use crate::keys::Kind;
use crate::ETCD_BACKEND;

/// What our permit keys hold, before the permit count: `distlock:permits=3`.
pub const PERMITS_VALUE_PREFIX: &str = "distlock:permits=";

/// The value a `kind` contender's key holds: a permit's count, else nothing.
pub(crate) fn value_of(kind: Kind) -> String {
    match kind {
        Kind::Permit(max) => format!("{PERMITS_VALUE_PREFIX}{max}"),
        _ => String::new(),
    }
}

/// [`LockError::PermitMismatch`] when a permit contender other than `own` among `seen`
/// records a count other than ours.
pub(crate) fn check_count(
    kind: Kind,
    key: &LockKey,
    own: &str,
    seen: &[KeyValue],
) -> Result<(), LockError> {
    let Kind::Permit(max) = kind else {
        return Ok(());
    };
    let in_use = seen
        .iter()
        .filter(|kv| kv.key() != own.as_bytes())
        .find_map(|kv| recorded_count(kv.value()).filter(|count| *count != max));
    match in_use {
        None => Ok(()),
        Some(in_use) => Err(LockError::PermitMismatch {
            backend: ETCD_BACKEND,
            source: PermitMismatch::new(key.clone(), max, in_use),
        }),
    }
}

/// The permit count a key's value records, if it is one of ours.
fn recorded_count(value: &[u8]) -> Option<u32> {
    std::str::from_utf8(value)
        .ok()?
        .strip_prefix(PERMITS_VALUE_PREFIX)?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_values_record_a_count() {
        assert_eq!(recorded_count(b"distlock:permits=3"), Some(3));
        for foreign in [&b""[..], b"distlock:permits=", b"x", b"\xff"] {
            assert_eq!(recorded_count(foreign), None);
        }
        assert_eq!(value_of(Kind::Permit(7)), "distlock:permits=7");
        assert_eq!(value_of(Kind::Mutex), "");
    }
}

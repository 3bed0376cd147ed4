//! The semaphore's permits: advisory locks, one per permit slot, beside a shared
//! "count" lock that records the permit count in use.
//!
//! Protocol, per key `K` and count `M`: permit `i` is the `bigint` advisory lock
//! `permit_slot_key(K, i)` held exclusive, for `i` in `0..M`; beside it the holder
//! holds the two-`int4` advisory lock `(permit_count_key(K), M)` shared, the count id.
//! One statement takes the count id, reads `pg_locks` for a count id of `K` with
//! another count held by anyone, and only if there is none try-locks the slots in
//! order (see `Statements::permit_try`). Since every holder takes its count id before
//! it looks, of two callers with different counts the later to look sees the earlier:
//! never both granted ([`distlock_api::LockError::PermitMismatch`] instead; two that
//! race may both be refused). Once the last holder of `K` leaves, no count id is
//! held and the next caller's count becomes the key's.

use distlock_api::LockKey;

use crate::keys::{permit_count_key, permit_slot_key};
use crate::lock::Plan;
use crate::mailbox::{Grab, Probe};

/// Why a semaphore acquire neither waits in FIFO order nor is woken by a release: a
/// permit waiter is held in no queue of the server's.
pub(crate) const POLLED: &str =
    "a permit waiter polls the slots at the options' backoff; it does not queue";

/// The permit try of `max` permits of `key`, and the hash it is filed under. Each
/// permit is then held by a dedicated session of the client (one of
/// [`crate::PostgresConfig::wait_sessions`]) and released with
/// `pg_advisory_unlock_all` on it; a waiting acquire tries again at the options'
/// backoff.
pub(crate) fn plan(key: &LockKey, max: u32) -> (i64, Plan) {
    let slots: Vec<i64> = (0..max).map(|slot| permit_slot_key(key, slot)).collect();
    let first = permit_slot_key(key, 0);
    let grab = Grab::PermitTry {
        count_key: permit_count_key(key),
        max,
        slots,
    };
    (first, Plan::Permit(grab))
}

/// What finds the other permit holders of `key`, for a release's or extend's outcome.
pub(crate) fn probe(key: &LockKey) -> Probe {
    Probe::permit_counts(permit_count_key(key))
}

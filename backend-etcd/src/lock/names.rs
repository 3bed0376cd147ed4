//! The names of a client's contender keys (key layout 2): `<client id>-<slot>` in hex
//! (see [`crate::keys::contender_key`]), the slot the lowest one free, so that a lock
//! acquired again and again by one client puts a key of the same name each time.
//!
//! etcd keeps every key name ever written in its index until a compaction (none by
//! default) as a dead revision, and a read of a range walks them all: the uncontended
//! put's check that the range is empty, a waiter's read of the queue. With a fresh name
//! per acquire (key layout 1), every cycle left one more dead name in the lock's range
//! and the server's work per acquire grew with the number of acquires so far. Here a
//! range sees about as many names as the client ever had contenders at once, plus one
//! for each contender whose key's end was not confirmed. (Go's `concurrency.Mutex` names
//! its key by its session's lease: one name per session.)
//!
//! A slot comes back only once nothing of this client can write a key of its name
//! again: a release of the grant recorded in this client (its key deleted by its create
//! revision, or found gone), or an abandoned contender's key deleted after its put was
//! answered. Every other end (a put whose answer never came, a deletion that failed)
//! keeps the slot out of use. Reused names are why every deletion is matched to an
//! incarnation by revision (a deletion at revision `D` ends only a key created before
//! `D`), in the loss watch, the waiters' count-down and the single-key wait.

use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};

use crate::keys::{split, SLOT_BITS};

/// The client ids are this many bits (so that a name id is a positive `i64`).
const CLIENT_BITS: u32 = 63 - SLOT_BITS;

/// The contender-key names of one client.
#[derive(Debug)]
pub(super) struct Names(Mutex<Slots>);

#[derive(Debug)]
struct Slots {
    /// A random id, drawn again once every slot has been used (then no slot of the
    /// former id is given out again).
    client: u64,
    /// Slots given back, reused lowest first.
    free: BTreeSet<u64>,
    /// The lowest slot never given out under `client`.
    next: u64,
}

impl Default for Names {
    fn default() -> Self {
        Names(Mutex::new(Slots {
            client: client_id(),
            free: BTreeSet::new(),
            next: 0,
        }))
    }
}

/// A random client id of [`CLIENT_BITS`] bits.
fn client_id() -> u64 {
    rand::random::<u64>() >> (64 - CLIENT_BITS)
}

impl Names {
    fn slots(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A name id no live contender of this client is named by (nor, the client id
    /// being random, any other client's), the lowest free slot.
    pub(super) fn take(&self) -> i64 {
        let mut slots = self.slots();
        let slot = match slots.free.pop_first() {
            Some(slot) => slot,
            None => {
                if slots.next >= 1 << SLOT_BITS {
                    *slots = Slots {
                        client: client_id(),
                        free: BTreeSet::new(),
                        next: 0,
                    };
                }
                slots.next += 1;
                slots.next - 1
            }
        };
        ((slots.client << SLOT_BITS) | slot) as i64
    }

    /// Nothing of this client will write a key named by `named` again: its slot is
    /// free for the next contender (unless the client id was drawn again since).
    pub(super) fn give_back(&self, named: i64) {
        let (client, slot) = split(named);
        let mut slots = self.slots();
        if client == slots.client && slot < slots.next {
            slots.free.insert(slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_free_slot_is_taken_and_a_kept_one_never() {
        let names = Names::default();
        let (a, b, c) = (names.take(), names.take(), names.take());
        assert_eq!(split(a).0, split(b).0);
        assert_eq!([split(a).1, split(b).1, split(c).1], [0, 1, 2]);
        assert!(a > 0 && b > 0 && c > 0);
        names.give_back(c);
        names.give_back(a);
        assert_eq!(names.take(), a);
        assert_eq!(names.take(), c);
        // `b` was kept (never given back): a fourth name is new.
        assert_eq!(split(names.take()).1, 3);
        // A foreign or unknown id is not taken in.
        names.give_back(i64::MAX);
        assert_eq!(split(names.take()).1, 4);
    }

    #[test]
    fn a_used_up_client_id_is_drawn_again() {
        let names = Names::default();
        let first = names.take();
        names.slots().next = 1 << SLOT_BITS;
        let fresh = names.take();
        assert_eq!(split(fresh).1, 0);
        names.give_back(first);
        assert_eq!(
            split(names.take()).1,
            1,
            "a slot of the former id is not reused"
        );
    }
}

//! The read-write lock ([`crate::EtcdLock::rw_lock`]) in the key layout of etcd's
//! `recipes.RWMutex` (`client/v3/experimental/recipes/rwmutex.go`).
//!
//! Readers and writers of key `K` are keys of one range `P/+rw/<K>/` (see
//! [`crate::EtcdLock::rw_prefix`]), each under its contender's lease: `P/+rw/<K>/read/<id>`
//! and `P/+rw/<K>/write/<id>`, ranked together by revision. A writer holds when no key
//! of the range is older than its own and watches the youngest older one; a reader
//! holds when no writer key is older than its own and watches the youngest older
//! writer. That is `recipes.RWMutex`'s `Lock` and `RLock`, so a Go
//! `recipe.NewRWMutex(session, "P/+rw/<K>")` and ours exclude each other. It is the
//! mutex's recipe with another rule of which older contenders block; leases,
//! keep-alives, the loss watch, release, extend and clean-up are the mutex's. (The Go
//! recipe's differences in ranking are on [`crate::EtcdLock::rw_lock`].)

use distlock_api::{Lease, RwMode};

use crate::keys::Kind;
use crate::lock::reads;

/// A reader's or a writer's kind of contender.
pub(crate) fn kind(mode: RwMode) -> Kind {
    match mode {
        RwMode::Read => Kind::Read,
        RwMode::Write => Kind::Write,
    }
}

/// A reader's or a writer's lease: its owner token tells.
pub(crate) fn kind_of(lease: &Lease) -> Kind {
    if reads(lease) {
        Kind::Read
    } else {
        Kind::Write
    }
}

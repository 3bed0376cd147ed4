//! The named scenarios, and the small vocabulary they are written in.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use distlock_api::{
    Capabilities, Capability, LockError, LockKey, LockOptions, Primitive, WaitPolicy,
};
use serde::Serialize;

use crate::Harness;

mod bad_input;
mod claims;
mod election;
pub mod fifo;
mod liveness;
mod multi;
mod rw;
mod safety;
mod schedule;
mod semaphore;
mod ttl;

/// The family a scenario belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Category {
    /// At most one holder; owner checks; fencing.
    Safety,
    /// Locks become free and waiters get them.
    Liveness,
    /// Leases expire, extend and renew as promised.
    Ttl,
    /// Bad input gets typed errors, no panic, nothing held.
    BadInput,
}

impl Category {
    /// The lowercase name used in tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Safety => "safety",
            Category::Liveness => "liveness",
            Category::Ttl => "ttl",
            Category::BadInput => "bad-input",
        }
    }
}

/// A backend guarantee or harness hook a scenario needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Requirement {
    /// [`distlock_api::Guarantees::ttl_expiry`] of the scenario's primitive.
    TtlExpiry,
    /// [`distlock_api::Guarantees::extend`] of the scenario's primitive.
    Extend,
    /// [`distlock_api::Guarantees::fencing`] of the scenario's primitive.
    Fencing,
    /// [`distlock_api::Guarantees::wake_on_release`] of the scenario's primitive.
    WakeOnRelease,
    /// [`distlock_api::Guarantees::fifo`] of the scenario's primitive.
    Fifo,
    /// [`distlock_api::Guarantees::outlives_client`] of the scenario's primitive.
    OutlivesClient,
    /// The semaphore offered ([`Capabilities::semaphore`]), and a semaphore handle on
    /// the harness's clients. Makes the semaphore the scenario's primitive.
    Semaphore,
    /// The read-write lock offered ([`Capabilities::rw_lock`]), and a read-write lock
    /// handle on the harness's clients. Makes it the scenario's primitive.
    RwLock,
    /// Election offered ([`Capabilities::election`]), and an election handle on the
    /// harness's clients. Makes it the scenario's primitive.
    Election,
    /// The harness can crash a client ([`crate::ClientFaults::crash`]).
    CrashFault,
    /// The harness has a URL connector ([`Harness::url_connector`]).
    UrlConnector,
}

impl Requirement {
    /// The capability this requirement reads, if it is one, for a scenario of
    /// `primitive`.
    pub(crate) fn capability(
        self,
        caps: &Capabilities,
        primitive: Primitive,
    ) -> Option<Capability> {
        let of = caps.of(primitive);
        match self {
            Requirement::TtlExpiry => Some(of.ttl_expiry),
            Requirement::Extend => Some(of.extend),
            Requirement::Fencing => Some(of.fencing),
            Requirement::WakeOnRelease => Some(of.wake_on_release),
            Requirement::Fifo => Some(of.fifo),
            Requirement::OutlivesClient => Some(of.outlives_client),
            Requirement::Semaphore => Some(caps.semaphore.offered),
            Requirement::RwLock => Some(caps.rw_lock.offered),
            Requirement::Election => Some(caps.election.offered),
            Requirement::CrashFault | Requirement::UrlConnector => None,
        }
    }
}

/// A scenario's body: passes with a detail line, or fails or skips with a reason.
pub type ScenarioFuture<'a> = Pin<Box<dyn Future<Output = Result<String, Failure>> + Send + 'a>>;

/// One named scenario of the kit.
#[derive(Clone, Copy)]
#[non_exhaustive]
pub struct Scenario {
    /// Unique snake_case name; also the test name the macro generates.
    pub name: &'static str,
    /// Its family.
    pub category: Category,
    /// What it checks, in one sentence (`docs/conformance.md` lists these).
    pub checks: &'static str,
    /// What it needs; it is skipped, with the backend's reason, when one is missing.
    pub requires: &'static [Requirement],
    pub(crate) run: for<'a> fn(&'a dyn Harness) -> ScenarioFuture<'a>,
}

impl Scenario {
    /// The primitive the scenario exercises: the one its requirements name, else the
    /// mutex. Its capability requirements are read from that primitive's guarantees.
    pub fn primitive(&self) -> Primitive {
        self.requires
            .iter()
            .find_map(|r| match r {
                Requirement::Semaphore => Some(Primitive::Semaphore),
                Requirement::RwLock => Some(Primitive::RwLock),
                Requirement::Election => Some(Primitive::Election),
                _ => None,
            })
            .unwrap_or(Primitive::Mutex)
    }
}

impl std::fmt::Debug for Scenario {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scenario")
            .field("name", &self.name)
            .finish()
    }
}

/// Why a scenario did not pass.
#[derive(Debug)]
#[non_exhaustive]
pub enum Failure {
    /// A check failed.
    Failed(String),
    /// The scenario does not apply here.
    Skipped(String),
}

impl From<LockError> for Failure {
    fn from(e: LockError) -> Self {
        Failure::Failed(format!("unexpected error: {e}"))
    }
}

/// Fails the scenario (returns `Err(Failure::Failed(..))` from the enclosing function)
/// with a formatted reason unless `cond` holds.
#[macro_export]
macro_rules! check {
    ($cond:expr, $($reason:tt)+) => {
        if !$cond {
            return Err($crate::Failure::Failed(format!($($reason)+)));
        }
    };
}
pub(crate) use check;

macro_rules! scenario {
    ($name:ident, $category:ident, [$($req:ident),*], $checks:literal) => {
        Scenario {
            name: stringify!($name),
            category: Category::$category,
            checks: $checks,
            requires: &[$(Requirement::$req),*],
            run: |h| Box::pin($name(h)),
        }
    };
}

use bad_input::*;
use claims::*;
use election::*;
use fifo::*;
use liveness::*;
use multi::*;
use rw::*;
use safety::*;
use schedule::*;
use semaphore::*;
use ttl::*;

/// Every scenario, in run order.
pub static SCENARIOS: &[Scenario] = &[
    scenario!(mutual_exclusion_under_contention, Safety, [],
        "16 clients x 50 rounds on one key: never two holders inside the critical section, and an unprotected read-modify-write of a balance ends exact (1000 - 200 - 300 = 500, scaled up)"),
    scenario!(try_acquire_on_held_key_returns_held, Safety, [],
        "try-acquire and a no-wait acquire on a held key report it held, promptly"),
    scenario!(release_by_non_owner_is_refused, Safety, [],
        "release and extend with another owner's token are refused and the lock stays held"),
    scenario!(late_release_after_expiry_keeps_new_holder, Safety, [TtlExpiry],
        "a holder that releases after its lease expired and another client took the key does not remove the new holder's lock"),
    scenario!(release_racing_expiry_keeps_new_holder, Safety, [TtlExpiry],
        "a release sent just before the lease expires, while a waiter takes over at expiry, never removes the waiter's lock"),
    scenario!(late_extend_after_expiry_fails_as_lost, Safety, [TtlExpiry, Extend],
        "extend after the lease expired reports it not ours (Expired, HeldByOther or Lost), whether the key is free or held by a new owner, and the new holder keeps it"),
    scenario!(fencing_token_iff_fencing_supported, Safety, [],
        "a grant (by acquire and by try-acquire) carries a fencing token exactly when the backend reports fencing supported"),
    scenario!(fencing_tokens_strictly_increase, Safety, [Fencing],
        "fencing tokens strictly increase across successive holders on different clients"),
    scenario!(fenced_store_rejects_stale_holder, Safety, [Fencing, TtlExpiry],
        "after an expiry takeover the new holder's token is higher and a fenced store rejects the stale holder's write"),
    scenario!(different_keys_are_independent, Safety, [],
        "keys that differ by case, by a prefix, or by path-like characters are separate locks"),
    scenario!(release_frees_key_at_once, Liveness, [],
        "after a release another client takes the key with a single try"),
    scenario!(inspect_reports_held_then_free, Liveness, [],
        "inspect (distlock status) reads a key free, then held with the holder's fencing token and a remaining lease within the TTL where the backend can tell, then free after release; skipped where inspect is unsupported"),
    scenario!(waiter_acquires_promptly_after_release, Liveness, [WakeOnRelease],
        "a waiting client gets the lock within the slack of the release (hand-off latency reported)"),
    scenario!(waiters_are_granted_in_arrival_order, Liveness, [Fifo],
        "a holder, then 5 clients asking for FIFO start waiting one after another (each seen queued through the backend's queue count where it has one, else 300 ms or more apart): after the release they are granted in arrival order"),
    scenario!(wait_timeout_is_honoured, Liveness, [],
        "a wait with a timeout on a held key fails as timed out, no earlier than the timeout and within the slack after it"),
    scenario!(crashed_holder_frees_within_lease, Liveness, [CrashFault],
        "a holder that crashes without releasing keeps the lock for its whole validity, and loses it within the lease bound plus slack"),
    scenario!(abandoned_waiter_does_not_delay_the_next, Liveness, [WakeOnRelease],
        "a queued waiter that gives up, by its wait running out, by its acquire future being dropped or by its process exiting (a client made on a runtime of its own, shut down while it waits), does not delay the waiter behind it, which gets the lock within the slack of the holder's release"),
    scenario!(cancelled_acquire_leaks_nothing, Liveness, [],
        "acquire futures dropped at many points, contended or not, leave no lock held"),
    scenario!(dropped_guard_frees_quickly, Liveness, [],
        "dropping a guard without release frees the key well before its TTL"),
    scenario!(unrenewed_lease_expires_after_ttl, Ttl, [TtlExpiry],
        "an unrenewed lease blocks others until its validity deadline and frees within TTL plus slack"),
    scenario!(extend_pushes_expiry_out, Ttl, [TtlExpiry, Extend],
        "after extend the key stays held past the original TTL, and frees after the new one"),
    scenario!(auto_renew_holds_past_five_ttls, Ttl, [Extend],
        "with auto-renew a lock (TTL at least the slack) stays held and its state Held for more than 5 x TTL, and is free at once after release"),
    scenario!(auto_renew_stops_at_max_hold, Ttl, [TtlExpiry, Extend],
        "the watchdog stops at the max-hold cap: lost() fires and another client gets the key, within a TTL plus slack after the cap"),
    scenario!(contended_reports_a_wait_on_a_held_key, Ttl, [TtlExpiry],
        "an acquire of a free key reports contended() false; one that starts while another client holds the key (short TTL, no renewal) and is granted after the TTL runs out reports contended() true"),
    scenario!(lost_fires_when_lease_lost, Ttl, [TtlExpiry],
        "lost() resolves at the validity deadline of an unrenewed lease, not before, and the state reads Lost"),
    scenario!(lost_fires_when_renewal_fails, Ttl, [Extend, CrashFault],
        "when a crashed client's renewals fail, lost() resolves by the validity deadline plus slack"),
    scenario!(bad_keys_are_typed_errors, BadInput, [],
        "empty, NUL-containing and 1 MB keys are refused with typed key errors; path-like and unicode keys work"),
    scenario!(bad_options_are_typed_errors, BadInput, [],
        "zero, sub-minimum and huge TTLs, and a zero backoff, are refused with InvalidOptions and nothing is held"),
    scenario!(zero_and_enormous_waits, BadInput, [],
        "a zero wait on a held key times out at once; an enormous wait on a free key succeeds without overflow"),
    scenario!(release_twice_is_a_typed_outcome, BadInput, [],
        "releasing the same lease twice reports Expired the second time, and extending it then reports Expired"),
    scenario!(invalid_urls_are_config_errors, BadInput, [UrlConnector],
        "malformed URLs and unknown schemes give configuration errors, without panicking"),
    scenario!(semaphore_grants_exactly_max, Safety, [Semaphore],
        "with 3 permits, 3 clients each take one by try-acquire, a fourth is refused (try-acquire and a no-wait acquire), and after one release a fourth gets one"),
    scenario!(semaphore_never_admits_more_than_max, Safety, [Semaphore],
        "8 clients x 10 rounds on a 3-permit key: a shared counter of holders inside never passes 3"),
    scenario!(semaphore_dropped_permit_is_freed, Liveness, [Semaphore],
        "with every permit held, dropping one guard without release lets a waiting client in within the slack"),
    scenario!(semaphore_crashed_holder_is_freed, Liveness, [Semaphore, CrashFault],
        "a permit holder that crashes without releasing keeps its permit for its validity and loses it within the lease bound plus slack"),
    scenario!(semaphore_cancelled_acquire_leaks_nothing, Liveness, [Semaphore],
        "permit acquires dropped at many points, contended or not, leave no permit held: afterwards every permit can be taken"),
    scenario!(semaphore_bad_counts_are_typed_errors, BadInput, [Semaphore],
        "0 permits and permits above MAX_PERMITS are InvalidOptions; a count other than the one the holders use is PermitMismatch, with nothing taken; once the holders leave the new count works"),
    scenario!(rw_readers_overlap, Safety, [RwLock],
        "3 clients hold the read lock at once; a writer is refused meanwhile, and a reader is refused while a writer holds"),
    scenario!(rw_reader_and_writer_never_overlap, Safety, [RwLock],
        "6 clients x 12 rounds mixing reads and writes on one key: never a writer beside a reader or another writer, and readers do overlap"),
    scenario!(rw_waiting_writer_is_not_starved, Liveness, [RwLock],
        "while 3 clients keep overlapping read holds coming, a waiting writer is granted within 3 x slack, with no reader inside"),
    scenario!(rw_cancelled_acquire_leaks_nothing, Liveness, [RwLock],
        "read and write acquires dropped at many points leave nothing held and no writer intent behind: a reader gets in at once afterwards, then a writer"),
    scenario!(rw_bad_options_are_typed_errors, BadInput, [RwLock],
        "a zero TTL and a zero backoff are InvalidOptions for reads and writes, and nothing is held"),
    scenario!(election_one_leader_at_a_time, Safety, [Election],
        "6 candidates x 8 terms campaign for one name: never two leaders at once, and terms rise strictly in the order the leaders started"),
    scenario!(election_leader_reads_identity_and_term, Safety, [Election],
        "leader() reads nobody, then the leader's identity (non-ASCII included) and term; a second candidate's try and no-wait campaigns lose; after the resign nobody leads, and the next term is higher"),
    scenario!(election_resign_hands_over_promptly, Liveness, [Election],
        "a standby campaigning while another leads leads within the slack of the leader's resign (hand-off reported)"),
    scenario!(election_crashed_leader_is_replaced_within_lease, Liveness, [Election, CrashFault],
        "a leader that crashes keeps leading for its whole validity, and a standby leads within the lease bound plus slack"),
    scenario!(election_observer_sees_changes_in_order, Liveness, [Election],
        "a LeaderWatch reads nobody, then each of three successive leaders with its term, and nobody after each resign, in order, each within 3 x slack"),
    scenario!(election_cancelled_campaign_leaves_nothing, Liveness, [Election],
        "campaigns dropped at many points, contended or not, leave no leader and no candidacy behind: another candidate leads at once afterwards"),
    scenario!(election_lost_fires_by_deadline, Ttl, [Election, TtlExpiry],
        "an unrenewed leadership's lost() fires at its validity deadline, not before, and the next leader's term is higher"),
    scenario!(election_bad_input_is_typed, BadInput, [Election],
        "empty and over-long identities are OptionsError::Candidate; zero and sub-minimum TTLs are InvalidOptions, and nothing is held"),
    scenario!(every_primitive_keeps_its_fifo_claim, Liveness, [],
        "on every primitive offered (a permit of one, a write, a leadership), FIFO waits are granted in arrival order where FIFO is claimed (3 waiters), and refused as Unsupported, leaving nothing held, where it is not"),
    scenario!(every_primitive_keeps_its_fencing_claim, Safety, [],
        "on every primitive offered, two successive grants carry rising fencing tokens where fencing is claimed, and none where it is not"),
    scenario!(every_primitive_keeps_its_extend_claim, Ttl, [],
        "on every primitive offered, extending a held grant succeeds where extend is claimed, and is refused as Unsupported where it is not"),
    scenario!(multi_key_overlapping_sets_never_deadlock, Liveness, [],
        "two clients take the same three keys, named in opposite orders, at once, 10 rounds: acquire_all never waits out its deadline (keys are taken in one canonical order)"),
    scenario!(multi_key_timeout_leaves_nothing_held, Liveness, [],
        "an acquire_all that times out on a key held elsewhere, and a try_acquire_all refused by it, leave the set's other keys free and the holder's key held"),
    scenario!(multi_key_lost_part_fires_lost, Ttl, [TtlExpiry],
        "a set's lost() fires once one unrenewed part runs out, not before its deadline, while the renewed part stays held; each part's token reads by its key"),
    scenario!(scheduled_firings_run_once_under_skew, Liveness, [TtlExpiry, OutlivesClient],
        "three replicas of a 5 s schedule, their clocks 2 s behind, right and 2 s ahead, fire 10 times with a 10 ms job through run_once: every firing runs exactly once, none missed"),
    scenario!(scheduled_firing_of_a_dead_runner_waits_at_most_for, Liveness, [TtlExpiry, OutlivesClient, CrashFault],
        "a runner that dies mid-job keeps its firing from running elsewhere until its at_most_for lease ends, and not longer than that plus slack; the firing is not marked done"),
    scenario!(unoffered_primitives_are_refused, BadInput, [],
        "every primitive the backend does not offer refuses an acquire and a try as Unsupported; skipped where every primitive is offered"),
];

/// A key no other scenario or run uses.
pub fn unique_key(label: &str) -> LockKey {
    let key = format!(
        "distlock-conformance/{label}/{:016x}",
        rand::random::<u64>()
    );
    // Short ASCII without NUL: always valid.
    LockKey::new(key).unwrap_or_else(|_| unreachable!("generated keys are valid"))
}

/// Options with `ttl`, waiting up to `wait`.
pub fn waiting(ttl: Duration, wait: Duration) -> LockOptions {
    LockOptions::new(ttl).with_wait(WaitPolicy::Timeout(wait))
}

/// Options with `ttl`, not waiting.
pub fn no_wait(ttl: Duration) -> LockOptions {
    LockOptions::new(ttl).with_wait(WaitPolicy::NoWait)
}

/// A TTL long enough that no scenario step outlives it by accident.
pub const LONG_TTL: Duration = Duration::from_secs(60);

/// `d` in milliseconds with one decimal, for scenario details.
pub fn millis(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

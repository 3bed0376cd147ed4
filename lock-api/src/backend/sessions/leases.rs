//! [`Leases`]: what one session holds, its client-enforced TTLs and its proof of life.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use crate::backend::MonitorWriter as _;
use crate::{LeaseMonitor, LeaseState};

/// A TTL timer that fires this late shows that the whole process was paused (SIGSTOP,
/// a suspended VM) or starved: the holder, which wakes up together with the session
/// task, did not renew because it could not run, not because it let the lease go.
pub const PAUSED_LATENESS: Duration = Duration::from_secs(1);
/// After such a pause, how long the release at the TTL waits for the holder's own
/// release. The lease is lost for the holder at once; only the server's lock stays, so
/// that the release finds it still held and can report that nobody else held it
/// meanwhile (`distlock exec` passes on its command's exit code then).
pub const PAUSE_GRACE: Duration = Duration::from_secs(1);

/// One held lease; `lock` is what the backend needs to release it (a name or key, a
/// flag, an election's seat).
#[derive(Debug)]
pub struct Held<X> {
    /// When the client releases it: its TTL deadline, or the end of its [`PAUSE_GRACE`].
    ttl_deadline: Instant,
    /// Its TTL ran out during a pause; the release waits for the holder's own.
    paused_past_ttl: bool,
    /// The lease's monitor, shared with its guard.
    pub monitor: LeaseMonitor,
    /// A dedicated session's wait slot, freed when the lease ends.
    _slot: Option<OwnedSemaphorePermit>,
    /// The backend's own record of the lock.
    pub lock: X,
}

/// What a session task must do now, besides its commands (see [`Leases::upkeep`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upkeep {
    /// Nothing.
    Nothing,
    /// It holds nothing and was unused for the idle period: close it.
    Close,
    /// Prove the session alive with a round trip, then [`Leases::renew_all`].
    Ping,
    /// A recent command proved it alive: [`Leases::renew_all`] without a round trip.
    Renew,
}

/// An extension's outcome (see [`Leases::extend`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extension {
    /// Not held by this session.
    NotHeld,
    /// Lost while the proof was on its way: lost is final, release it.
    Lapsed,
    /// Valid until this deadline.
    Extended(Instant),
}

/// The leases one session holds, by owner token, with their TTL deadlines, and the
/// session's proof of life: the start of its last answered round trip, from which
/// every lease's validity runs for at most `horizon` (the server's idle limit, less a
/// margin).
#[derive(Debug)]
pub struct Leases<X> {
    held: HashMap<u128, Held<X>>,
    /// `(TTL deadline, owner)` of every held lease.
    expiries: BTreeSet<(Instant, u128)>,
    horizon: Duration,
    /// The start of the last successful round trip: the server's idle clock started
    /// after it.
    last_proof: Instant,
    /// The last time held leases' validity was pushed to the proof's horizon.
    last_renewal: Instant,
    /// When the session last finished a command.
    last_used: Instant,
    /// Held leases were marked suspect since the last proof.
    suspected: bool,
}

impl<X> Leases<X> {
    /// No leases, on a session proven alive now, whose leases are valid for at most
    /// `horizon` after each proof.
    pub fn new(horizon: Duration) -> Self {
        let now = Instant::now();
        Leases {
            held: HashMap::new(),
            expiries: BTreeSet::new(),
            horizon,
            last_proof: now,
            last_renewal: now,
            last_used: now,
            suspected: false,
        }
    }

    /// Whether the session holds nothing.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Whether `owner`'s lease is held here.
    pub fn contains(&self, owner: u128) -> bool {
        self.held.contains_key(&owner)
    }

    /// `owner`'s lease.
    pub fn get(&self, owner: u128) -> Option<&Held<X>> {
        self.held.get(&owner)
    }

    /// `owner`'s lease, to change the backend's record.
    pub fn get_mut(&mut self, owner: u128) -> Option<&mut Held<X>> {
        self.held.get_mut(&owner)
    }

    /// The owners of every held lease.
    pub fn owners(&self) -> Vec<u128> {
        self.held.keys().copied().collect()
    }

    /// Notes that the session just finished a command (for the idle close).
    pub fn used(&mut self) {
        self.last_used = Instant::now();
    }

    /// Records a grant to `owner`, whose lease starts at `lease_start` and runs `ttl`;
    /// returns its monitor, valid until the TTL or the proof's horizon.
    pub fn insert(
        &mut self,
        owner: u128,
        lease_start: Instant,
        ttl: Duration,
        slot: Option<OwnedSemaphorePermit>,
        lock: X,
    ) -> LeaseMonitor {
        let ttl_deadline = lease_start
            .checked_add(ttl)
            .unwrap_or_else(|| lease_start + crate::MAX_TTL);
        let monitor = LeaseMonitor::new(ttl_deadline.min(self.last_proof + self.horizon));
        if self.held.is_empty() {
            // Nothing was held to renew: the first lease starts the heartbeat's period
            // (it is as fresh as a renewal), rather than finding it overdue at once.
            self.last_renewal = Instant::now();
        }
        self.held.insert(
            owner,
            Held {
                ttl_deadline,
                paused_past_ttl: false,
                monitor: monitor.clone(),
                _slot: slot,
                lock,
            },
        );
        self.expiries.insert((ttl_deadline, owner));
        monitor
    }

    /// Forgets `owner`'s lease and marks it lost (it no longer is held). The wait slot
    /// goes with the returned record.
    pub fn remove(&mut self, owner: u128) -> Option<Held<X>> {
        let held = self.held.remove(&owner)?;
        self.expiries.remove(&(held.ttl_deadline, owner));
        held.monitor.mark_lost();
        Some(held)
    }

    /// When the task must wake up for [`Leases::due`] or [`Leases::upkeep`].
    pub fn next_timer(&self, heartbeat: Duration, idle_close: Duration) -> Instant {
        let mut at = Instant::now() + Duration::from_secs(3600);
        if let Some((expiry, _)) = self.expiries.first() {
            at = at.min(*expiry);
        }
        if self.held.is_empty() {
            at = at.min(self.last_used + idle_close);
        } else {
            at = at.min(self.last_renewal + heartbeat);
        }
        at
    }

    /// The owners whose leases must be released now: their TTL passed. A lease whose
    /// TTL ran out while the process was paused (its timer fired [`PAUSED_LATENESS`]
    /// late) is marked lost now but kept once for [`PAUSE_GRACE`], for its holder's own
    /// release (which then finds it still held: no one else can have held it).
    pub fn due(&mut self, now: Instant) -> Vec<u128> {
        let due: Vec<(Instant, u128)> = self
            .expiries
            .iter()
            .take_while(|(t, _)| *t <= now)
            .copied()
            .collect();
        let mut release = Vec::new();
        for (deadline, owner) in due {
            let paused = now.saturating_duration_since(deadline) >= PAUSED_LATENESS;
            if !(paused && self.defer_after_pause(owner, now)) {
                release.push(owner);
            }
        }
        release
    }

    /// Defers a paused lease's release by [`PAUSE_GRACE`]; once per lease: false if it
    /// was deferred already (or is not held), and must be released now.
    fn defer_after_pause(&mut self, owner: u128, now: Instant) -> bool {
        let Some(held) = self.held.get_mut(&owner) else {
            return false;
        };
        if held.paused_past_ttl {
            return false;
        }
        held.monitor.mark_lost();
        self.expiries.remove(&(held.ttl_deadline, owner));
        held.paused_past_ttl = true;
        held.ttl_deadline = now + PAUSE_GRACE;
        self.expiries.insert((held.ttl_deadline, owner));
        true
    }

    /// What the session must do at `now`, after [`Leases::due`] was released: close
    /// when it holds nothing and was idle for `idle_close`; every `heartbeat` while it
    /// holds something, renew its leases, with a round trip unless a command proved it
    /// alive within half a heartbeat.
    pub fn upkeep(&self, now: Instant, heartbeat: Duration, idle_close: Duration) -> Upkeep {
        if self.held.is_empty() {
            if now >= self.last_used + idle_close {
                return Upkeep::Close;
            }
            return Upkeep::Nothing;
        }
        if now < self.last_renewal + heartbeat {
            Upkeep::Nothing
        } else if now.saturating_duration_since(self.last_proof) >= heartbeat / 2 {
            Upkeep::Ping
        } else {
            Upkeep::Renew
        }
    }

    /// Pushes every held lease's validity to the current proof's horizon; with
    /// `force`, also a suspect one whose deadline did not move (it is held again).
    pub fn renew_all(&mut self, force: bool) {
        self.last_renewal = Instant::now();
        let horizon = self.last_proof + self.horizon;
        for held in self.held.values() {
            // Lost is final, also when only the deadline says so: never revive.
            if held.monitor.state() == LeaseState::Lost {
                continue;
            }
            let deadline = held.ttl_deadline.min(horizon);
            if force || deadline > held.monitor.valid_until() {
                held.monitor.renewed(deadline);
            }
        }
        self.suspected = false;
    }

    /// A round trip that started at `started` was answered: the session was alive
    /// then. Leases marked suspect since the last proof are held again.
    pub fn note_proof(&mut self, started: Instant) {
        if started > self.last_proof {
            self.last_proof = started;
        }
        if self.suspected {
            self.renew_all(true);
        }
    }

    /// A reply is late: every held lease may be lost.
    pub fn suspect_all(&mut self) {
        for held in self.held.values() {
            held.monitor.suspect();
        }
        self.suspected = !self.held.is_empty();
    }

    /// Whether `owner`'s lease is lost already (its TTL ran out, or the session's
    /// horizon passed): lost is final, it must be released, not extended.
    pub fn is_lost(&self, owner: u128) -> bool {
        self.held
            .get(&owner)
            .is_some_and(|h| h.monitor.state() == LeaseState::Lost)
    }

    /// Extends `owner`'s lease to `ttl` from `started`, the start of the round trip
    /// that just proved the session alive.
    pub fn extend(&mut self, owner: u128, started: Instant, ttl: Duration) -> Extension {
        let horizon = started + self.horizon;
        let Some(held) = self.held.get_mut(&owner) else {
            return Extension::NotHeld;
        };
        let ttl_deadline = match started.checked_add(ttl) {
            // The validity ran out while the proof was on its way: lost is final.
            Some(_) if held.monitor.state() == LeaseState::Lost => None,
            deadline => deadline,
        };
        let Some(ttl_deadline) = ttl_deadline else {
            return Extension::Lapsed;
        };
        self.expiries.remove(&(held.ttl_deadline, owner));
        held.ttl_deadline = ttl_deadline;
        self.expiries.insert((ttl_deadline, owner));
        let valid_until = ttl_deadline.min(horizon);
        held.monitor.renewed(valid_until);
        Extension::Extended(valid_until)
    }
}

//! What a grant hands out: [`Lease`], [`FencingToken`], [`OwnerToken`], and the
//! [`LeaseMonitor`] that tracks a lease's state over time.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::LockKey;

/// A number that strictly increases with every grant of the same key.
///
/// Pass it with every write to a fenced resource, which rejects writes carrying a
/// token lower than the highest it has seen: a holder that stalled past its lease then
/// cannot overwrite the work of the next holder.
///
/// Only backends that can promise this order hand tokens out
/// ([`Guarantees::fencing`](crate::Guarantees::fencing)); the others' grants carry
/// none (see [`Lease::fencing_token`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw token.
    pub const fn new(value: u64) -> Self {
        FencingToken(value)
    }

    /// The raw token.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// A random 128-bit identity of one grant. Release and extend succeed only while the
/// backend still stores this token for the key.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerToken(u128);

impl OwnerToken {
    /// A fresh token from the thread-local CSPRNG.
    pub fn random() -> Self {
        OwnerToken(rand::random())
    }

    /// See [`crate::backend::OwnerBits::from_u128`].
    pub(crate) const fn from_bits(bits: u128) -> Self {
        OwnerToken(bits)
    }

    /// The raw bits.
    pub const fn as_u128(self) -> u128 {
        self.0
    }
}

impl fmt::Display for OwnerToken {
    /// 32 lowercase hex digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerToken({self})")
    }
}

/// One grant of one key: what release and extend need to prove ownership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    key: LockKey,
    owner: OwnerToken,
    fencing_token: Option<FencingToken>,
    ttl: Duration,
    acquired_at: Instant,
}

impl Lease {
    /// See [`crate::backend::NewLease::new`].
    pub(crate) fn describe(
        key: LockKey,
        owner: OwnerToken,
        fencing_token: Option<FencingToken>,
        ttl: Duration,
        acquired_at: Instant,
    ) -> Self {
        Lease {
            key,
            owner,
            fencing_token,
            ttl,
            acquired_at,
        }
    }

    /// The key.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The owner token of this grant.
    pub fn owner(&self) -> OwnerToken {
        self.owner
    }

    /// The fencing token of this grant: above every earlier grant's for this key.
    ///
    /// `None` when the backend cannot promise ordered tokens (its
    /// [`Guarantees::fencing`](crate::Guarantees::fencing) is unsupported, as on
    /// Redlock). Then nothing stops a holder that stalled past its lease from writing
    /// after the next holder: use a backend with fencing (a consensus store such as
    /// ZooKeeper) for such resources, or make every write idempotent or conditional on
    /// the state it read (a compare-and-set, a version column).
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.fencing_token
    }

    /// The TTL asked for at acquire (the renewal watchdog extends by this much).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// When the acquire request that produced this grant was sent.
    pub fn acquired_at(&self) -> Instant {
        self.acquired_at
    }
}

/// The three states of a lease.
///
/// Exhaustive by choice (see the crate docs): the lease model has exactly these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseState {
    /// Held, and its validity deadline has not passed.
    Held,
    /// Maybe held: the connection dropped or renewals are failing, but the validity
    /// deadline has not passed. Stop starting new work.
    Suspect,
    /// Known lost, or the validity deadline passed without renewal. Final.
    Lost,
}

#[derive(Debug, Clone, Copy)]
struct Status {
    state: LeaseState,
    valid_until: Instant,
}

/// Shared, observable state of one lease: its state and validity deadline.
///
/// The guard, the renewal watchdog and the backend (which may learn of a loss, for
/// example when a session dies) each hold a clone. `Lost` is final.
#[derive(Debug, Clone)]
pub struct LeaseMonitor {
    /// One allocation for all of it: a monitor is made on every grant.
    shared: Arc<MonitorShared>,
}

#[derive(Debug)]
struct MonitorShared {
    status: watch::Sender<Status>,
    /// Taken around every extend, so renewals reach the server and apply here in order.
    renewals: tokio::sync::Mutex<()>,
    /// How many renewals succeeded.
    renewed_count: AtomicU64,
}

impl LeaseMonitor {
    /// See [`crate::backend::MonitorWriter::new`].
    pub(crate) fn held_until(valid_until: Instant) -> Self {
        let (status, _) = watch::channel(Status {
            state: LeaseState::Held,
            valid_until,
        });
        LeaseMonitor {
            shared: Arc::new(MonitorShared {
                status,
                renewals: tokio::sync::Mutex::new(()),
                renewed_count: AtomicU64::new(0),
            }),
        }
    }

    /// The state now: `Lost` once the deadline has passed, even if nobody said so.
    pub fn state(&self) -> LeaseState {
        let status = *self.shared.status.borrow();
        if Instant::now() >= status.valid_until {
            LeaseState::Lost
        } else {
            status.state
        }
    }

    /// The validity deadline.
    pub fn valid_until(&self) -> Instant {
        self.shared.status.borrow().valid_until
    }

    /// See [`crate::backend::MonitorWriter::renewed`].
    pub(crate) fn apply_renewal(&self, valid_until: Instant) -> bool {
        let now = Instant::now();
        self.shared.status.send_if_modified(|s| {
            if s.state == LeaseState::Lost {
                return false;
            }
            if now >= s.valid_until {
                s.state = LeaseState::Lost;
                return true;
            }
            *s = Status {
                state: LeaseState::Held,
                valid_until,
            };
            true
        });
        let held = self.state() == LeaseState::Held;
        if held {
            self.shared.renewed_count.fetch_add(1, Ordering::Relaxed);
        }
        held
    }

    /// How many renewals (watchdog or explicit extends) succeeded so far.
    pub fn renewals(&self) -> u64 {
        self.shared.renewed_count.load(Ordering::Relaxed)
    }

    /// Serialises extends of this lease (the guard's and the watchdog's), so their
    /// results apply in the order the server saw them.
    pub(crate) async fn renewal_turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.shared.renewals.lock().await
    }

    /// See [`crate::backend::MonitorWriter::suspect`].
    pub(crate) fn mark_suspect(&self) {
        self.shared.status.send_if_modified(|s| {
            let change = s.state == LeaseState::Held;
            if change {
                s.state = LeaseState::Suspect;
            }
            change
        });
    }

    /// See [`crate::backend::MonitorWriter::mark_lost`].
    pub(crate) fn set_lost(&self) {
        self.shared.status.send_if_modified(|s| {
            let change = s.state != LeaseState::Lost;
            s.state = LeaseState::Lost;
            change
        });
    }

    /// Resolves once the lease is lost: marked lost, or its deadline passed without a
    /// renewal. Cancel-safe; does not borrow the monitor.
    pub fn lost(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let monitor = self.clone();
        async move {
            let mut changes = monitor.shared.status.subscribe();
            loop {
                let status = *changes.borrow_and_update();
                if status.state == LeaseState::Lost || Instant::now() >= status.valid_until {
                    monitor.set_lost();
                    return;
                }
                tokio::select! {
                    // The sender lives in `monitor`, so `changed` cannot fail here.
                    _ = changes.changed() => {}
                    _ = tokio::time::sleep_until(status.valid_until) => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn lost_fires_at_deadline_unless_renewed() {
        let start = Instant::now();
        let m = LeaseMonitor::held_until(start + Duration::from_secs(1));
        let lost = tokio::spawn(m.lost());
        tokio::time::sleep(Duration::from_millis(900)).await;
        m.apply_renewal(start + Duration::from_secs(2));
        assert_eq!(m.state(), LeaseState::Held);
        assert!(lost.await.is_ok());
        assert!(Instant::now() >= start + Duration::from_secs(2));
        assert_eq!(m.state(), LeaseState::Lost);
        m.apply_renewal(start + Duration::from_secs(9));
        assert_eq!(m.state(), LeaseState::Lost, "lost is final");
    }

    #[tokio::test(start_paused = true)]
    async fn suspect_then_lost() {
        let m = LeaseMonitor::held_until(Instant::now() + Duration::from_secs(60));
        m.mark_suspect();
        assert_eq!(m.state(), LeaseState::Suspect);
        let lost = tokio::spawn(m.lost());
        m.set_lost();
        assert!(lost.await.is_ok());
        assert_eq!(m.state(), LeaseState::Lost);
    }

    #[test]
    fn owner_token_is_128_bit_hex() {
        let t = OwnerToken::from_bits(0xab);
        assert_eq!(t.to_string(), format!("{:032x}", 0xab));
        assert_ne!(OwnerToken::random(), OwnerToken::random());
    }
}

//! [`SessionPool`]: a client's shared and dedicated sessions.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{AcquireError, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::{timeout_at, Instant};

use super::handle::{Kind, SessionHandle};
use crate::LockError;

/// Locks `mutex`, whether or not a holder panicked.
pub fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section of the session code is a few map operations that cannot
    // panic half-way, so a poisoned lock holds consistent data.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A client's sessions, whose tasks take commands `C`: up to `shared_sessions` shared
/// ones, and dedicated ones bounded by wait slots (one per dedicated session in use,
/// waiting or holding what it waited for), kept on an idle list between waits.
///
/// The pool only keeps handles (and which one holds which lease); the backend opens
/// sessions (the `open` functions passed in) and its session tasks report here when
/// they start, end, go idle, and take or end a lease.
#[derive(Debug)]
pub struct SessionPool<C> {
    max_shared: usize,
    /// Requests in flight per shared session in use: a client with `n` requests in
    /// flight spreads new ones over its first `n / queue_per_session + 1` shared
    /// sessions (least busy first), opening more, up to `max_shared`, as the load grows.
    queue_per_session: usize,
    shared: Mutex<Shared<C>>,
    /// Signalled when a shared session is added or dropped, or an opening ends.
    changed: Notify,
    idle_waits: Mutex<Vec<Arc<SessionHandle<C>>>>,
    wait_slots: Arc<Semaphore>,
    open_shared: AtomicUsize,
    open_waits: AtomicUsize,
    /// Owner token of every held lease → the session holding it.
    routes: Mutex<HashMap<u128, Arc<SessionHandle<C>>>>,
}

#[derive(Debug)]
struct Shared<C> {
    sessions: Vec<Arc<SessionHandle<C>>>,
    /// Shared sessions being opened.
    opening: usize,
}

/// Counts a shared session being opened, until dropped.
struct Opening<C>(Arc<SessionPool<C>>);

impl<C> Drop for Opening<C> {
    fn drop(&mut self) {
        let mut shared = locked(&self.0.shared);
        shared.opening = shared.opening.saturating_sub(1);
        drop(shared);
        self.0.changed.notify_waiters();
    }
}

impl<C: Send + 'static> SessionPool<C> {
    /// An empty pool of at most `shared_sessions` shared sessions and `wait_sessions`
    /// dedicated ones in use at once, opening a shared session per `queue_per_session`
    /// requests in flight (at least 1): more where a session runs one command at a time,
    /// fewer where what is queued on a session goes in one statement.
    pub fn new(shared_sessions: usize, wait_sessions: usize, queue_per_session: usize) -> Self {
        SessionPool {
            max_shared: shared_sessions,
            queue_per_session: queue_per_session.max(1),
            shared: Mutex::new(Shared {
                sessions: Vec::new(),
                opening: 0,
            }),
            changed: Notify::new(),
            idle_waits: Mutex::default(),
            wait_slots: Arc::new(Semaphore::new(wait_sessions)),
            open_shared: AtomicUsize::new(0),
            open_waits: AtomicUsize::new(0),
            routes: Mutex::default(),
        }
    }

    /// Notes that `session` holds `owner`'s lease.
    pub fn add_route(&self, owner: u128, session: Arc<SessionHandle<C>>) {
        locked(&self.routes).insert(owner, session);
    }

    /// Forgets the route to `owner`'s lease: it ended.
    pub fn remove_route(&self, owner: u128) {
        locked(&self.routes).remove(&owner);
    }

    /// The session holding `owner`'s lease.
    pub fn route(&self, owner: u128) -> Option<Arc<SessionHandle<C>>> {
        locked(&self.routes).get(&owner).cloned()
    }

    /// The sessions open now: `(shared, dedicated)`, as their tasks reported.
    pub fn counts(&self) -> (usize, usize) {
        (
            self.open_shared.load(Ordering::Relaxed),
            self.open_waits.load(Ordering::Relaxed),
        )
    }

    fn open_count(&self, kind: Kind) -> &AtomicUsize {
        match kind {
            Kind::Shared => &self.open_shared,
            Kind::Wait => &self.open_waits,
        }
    }

    /// A session task of `kind` started.
    pub fn task_started(&self, kind: Kind) {
        self.open_count(kind).fetch_add(1, Ordering::Relaxed);
    }

    /// A session task of `kind` ended.
    pub fn task_ended(&self, kind: Kind) {
        self.open_count(kind).fetch_sub(1, Ordering::Relaxed);
    }

    /// Forgets `session`, which takes no more commands.
    pub fn drop_session(&self, session: &Arc<SessionHandle<C>>) {
        locked(&self.idle_waits).retain(|s| !Arc::ptr_eq(s, session));
        locked(&self.shared)
            .sessions
            .retain(|s| !Arc::ptr_eq(s, session));
        self.changed.notify_waiters();
    }

    /// Adds an opened shared session.
    pub fn add_shared(&self, session: Arc<SessionHandle<C>>) {
        locked(&self.shared).sessions.push(session);
    }

    /// Puts a dedicated session that holds nothing back on the idle list.
    pub fn return_wait_session(&self, session: Arc<SessionHandle<C>>) {
        let mut idle = locked(&self.idle_waits);
        if session.is_alive() && !idle.iter().any(|s| Arc::ptr_eq(s, &session)) {
            idle.push(session);
        }
    }

    /// The least busy shared session, opening one with `open` if all are busy and
    /// there is room: with none open, the caller waits for the one it opens; otherwise
    /// the new one opens in the background and the caller queues on the least busy.
    ///
    /// # Errors
    /// What `open` returns, when no session is open and opening one fails.
    pub async fn shared_session<F, Fut>(
        self: &Arc<Self>,
        open: F,
    ) -> Result<Arc<SessionHandle<C>>, LockError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<Arc<SessionHandle<C>>, LockError>> + Send + 'static,
    {
        enum Next<C> {
            Use(Arc<SessionHandle<C>>),
            OpenAside(Arc<SessionHandle<C>>),
            Open,
            Wait,
        }
        // Armed only once there is something to wait for, so the common path takes
        // no lock on the notifier.
        let mut changed = None;
        loop {
            let next = {
                let mut shared = locked(&self.shared);
                shared.sessions.retain(|s| s.is_alive());
                // Use as many sessions as the load needs, one per `queue_per_session`
                // requests in flight.
                let load: usize = shared.sessions.iter().map(|s| s.load()).sum();
                let needed = (load / self.queue_per_session + 1).min(self.max_shared);
                let best = shared
                    .sessions
                    .iter()
                    .take(needed)
                    .min_by_key(|s| s.load())
                    .cloned();
                let room = shared.sessions.len() + shared.opening < needed;
                match best {
                    Some(s) if room && s.load() > 0 => {
                        shared.opening += 1;
                        Next::OpenAside(s)
                    }
                    Some(s) => Next::Use(s),
                    None if shared.opening == 0 => {
                        shared.opening += 1;
                        Next::Open
                    }
                    None => Next::Wait,
                }
            };
            match next {
                Next::Use(session) => return Ok(session),
                // Every slot is being opened: wait for one to finish (registering
                // first, then looking again, so no notification is missed).
                Next::Wait => match changed.take() {
                    None => {
                        let mut armed = Box::pin(self.changed.notified());
                        armed.as_mut().enable();
                        changed = Some(armed);
                    }
                    Some(armed) => armed.await,
                },
                Next::Open => {
                    let _opening = Opening(self.clone());
                    let session = open().await?;
                    self.add_shared(session.clone());
                    return Ok(session);
                }
                Next::OpenAside(session) => {
                    let opening = Opening(self.clone());
                    let opened = open();
                    tokio::spawn(async move {
                        match opened.await {
                            Ok(opened) => opening.0.add_shared(opened),
                            Err(error) => {
                                tracing::debug!(%error, "could not open another shared session")
                            }
                        }
                        drop(opening);
                    });
                    return Ok(session);
                }
            }
        }
    }

    /// A wait slot, waiting for one until `deadline` (`None`: as long as it takes);
    /// `Ok(None)` when the deadline passed first. The dedicated session the slot
    /// stands for is [`SessionPool::wait_session`].
    ///
    /// # Errors
    /// The slots were closed (never, while the pool lives).
    pub async fn wait_slot(
        &self,
        deadline: Option<Instant>,
    ) -> Result<Option<OwnedSemaphorePermit>, AcquireError> {
        let slots = self.wait_slots.clone();
        match deadline {
            Some(d) => match timeout_at(d, slots.acquire_owned()).await {
                Ok(slot) => slot.map(Some),
                Err(_) => Ok(None),
            },
            None => slots.acquire_owned().await.map(Some),
        }
    }

    /// An idle dedicated session, or a new one from `open`. The caller holds a wait
    /// slot.
    ///
    /// # Errors
    /// What `open` returns.
    pub async fn wait_session<Fut>(
        &self,
        open: impl FnOnce() -> Fut,
    ) -> Result<Arc<SessionHandle<C>>, LockError>
    where
        Fut: Future<Output = Result<Arc<SessionHandle<C>>, LockError>>,
    {
        loop {
            let idle = locked(&self.idle_waits).pop();
            match idle {
                Some(s) if s.is_alive() => return Ok(s),
                Some(_) => continue,
                None => return open().await,
            }
        }
    }
}

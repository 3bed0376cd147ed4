//! The mailbox between a client and one of its session tasks, and what a command
//! answers.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{OnceLock, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::backend::NewLease as _;
use crate::{FencingToken, Lease, LeaseMonitor, LockError, LockKey, LockOptions, OwnerToken};

/// What a session is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Carries grants that did not wait, for any number of keys.
    Shared,
    /// Waits in the server's queue for one key (or holds one permit), then holds that
    /// one grant.
    Wait,
}

/// Why a command failed.
#[derive(Debug)]
pub enum Failure {
    /// The session closed before running the command: nothing happened, retry elsewhere.
    Closed,
    /// The command ran, or may have, and failed.
    Lock(LockError),
    /// A permit try found the semaphore in use with this other permit count; nothing
    /// was taken.
    Mismatch(u32),
}

/// Where a session task answers a command.
pub type Reply<T> = oneshot::Sender<Result<T, Failure>>;

/// A lock granted to a session.
#[derive(Debug)]
pub struct Granted {
    /// The grant's fencing token.
    pub token: u64,
    /// When the lease starts, on the client's clock (conservative).
    pub acquired_at: Instant,
    /// The lease's monitor; the session task keeps a clone to report suspicion and loss.
    pub monitor: LeaseMonitor,
}

impl Granted {
    /// The lease of this grant of `key` to `owner` under `options` (its fencing token,
    /// its TTL from [`Granted::acquired_at`]), and its monitor.
    pub fn into_lease(
        self,
        key: &LockKey,
        owner: OwnerToken,
        options: &LockOptions,
    ) -> (Lease, LeaseMonitor) {
        let lease = Lease::new(
            key.clone(),
            owner,
            Some(FencingToken::new(self.token)),
            options.ttl(),
            self.acquired_at,
        );
        (lease, self.monitor)
    }
}

/// A command on one held lease, for the session holding it (see
/// [`super::release`] and [`super::extend`]).
#[derive(Debug)]
pub enum LeaseCommand {
    /// Releases `owner`'s lease if this session holds it; `true` if it did. Without a
    /// reply it is the compensation for a grant whose caller went away.
    Release {
        /// The lease's owner token.
        owner: u128,
        /// Where the answer goes, if anywhere.
        reply: Option<Reply<bool>>,
    },
    /// Proves the session alive and pushes `owner`'s TTL deadline to `ttl` from now;
    /// the new validity deadline, or `None` if this session does not hold the lease.
    Extend {
        /// The lease's owner token.
        owner: u128,
        /// The lease's new TTL, from the proof of life.
        ttl: Duration,
        /// Where the answer goes.
        reply: Reply<Option<Instant>>,
    },
}

impl LeaseCommand {
    /// Answers the command with `failure`, if it expects an answer.
    pub fn fail(self, failure: Failure) {
        match self {
            LeaseCommand::Release { reply, .. } => {
                if let Some(reply) = reply {
                    let _ = reply.send(Err(failure));
                }
            }
            LeaseCommand::Extend { reply, .. } => {
                let _ = reply.send(Err(failure));
            }
        }
    }
}

/// An election candidacy: what a grant of the election's lock records as the leader,
/// in the same session, before it is handed out.
#[derive(Debug)]
pub struct Seat {
    /// The election's name as the backend's table keys it.
    pub name: String,
    /// The candidate's identity.
    pub candidate: Vec<u8>,
}

/// A command being run in its caller's task (see [`SessionHandle::run`]).
pub(crate) type InlineRun = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A session task that lets a caller run a command in the caller's own task.
pub(crate) trait Runner<C>: Send + Sync {
    /// The run of `command`, for the caller to drive, if the session is idle (nothing
    /// queued or running, not ended); otherwise `command` back.
    fn try_run(&self, command: C) -> Result<InlineRun, C>;
}

/// The session task's [`Runner`], once its loop started.
struct RunnerSlot<C>(OnceLock<Weak<dyn Runner<C>>>);

impl<C> fmt::Debug for RunnerSlot<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "RunnerSlot(set)"
        } else {
            "RunnerSlot(unset)"
        })
    }
}

/// An inline run that, dropped before its end, finishes in a task of its own: a
/// command once started runs to its end as a queued one would, whether or not its
/// caller still waits (the session's state stays known).
struct Detached(Option<InlineRun>);

impl Future for Detached {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(run) = self.0.as_mut() else {
            return Poll::Ready(());
        };
        match run.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.0 = None;
                Poll::Ready(())
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for Detached {
    fn drop(&mut self) {
        if let Some(run) = self.0.take() {
            // Outside a runtime (it is shutting down, and the session task with it)
            // the run can only be dropped.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(run);
            }
        }
    }
}

/// The client's handle on a session task: its mailbox of commands `C`, the count of
/// commands in flight and whether the task still takes commands.
#[derive(Debug)]
pub struct SessionHandle<C> {
    tx: mpsc::UnboundedSender<C>,
    /// Commands sent and not yet finished, for picking the least busy session.
    load: AtomicUsize,
    alive: AtomicBool,
    runner: RunnerSlot<C>,
}

impl<C> SessionHandle<C> {
    /// A handle for a new task, and the task's end of the mailbox.
    pub fn new() -> (Self, mpsc::UnboundedReceiver<C>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let handle = SessionHandle {
            tx,
            load: AtomicUsize::new(0),
            alive: AtomicBool::new(true),
            runner: RunnerSlot(OnceLock::new()),
        };
        (handle, rx)
    }

    /// Lets [`SessionHandle::run`] run commands through `runner` (the session task,
    /// once its loop started).
    pub(crate) fn set_runner(&self, runner: Weak<dyn Runner<C>>) {
        let _ = self.runner.0.set(runner);
    }

    /// Counts a command run inline as in flight.
    pub(crate) fn began(&self) {
        self.load.fetch_add(1, Ordering::Relaxed);
    }

    /// Runs `command` on this session: in the caller's own task if the session is idle
    /// (nothing queued or running), which spares the hand-over to the session task and
    /// the wake-up of the caller by the reply; else queued as [`SessionHandle::send`]
    /// does. Either way the command runs as the session task would run it, in order
    /// with the session's other commands and timers, and once started it runs to its
    /// end even if this future is dropped (the rest runs in a task of its own).
    ///
    /// # Errors
    /// Gives `command` back if the session takes no more commands.
    pub async fn run(&self, command: C) -> Result<(), C> {
        let runner = self.runner.0.get().and_then(Weak::upgrade);
        let command = match runner {
            Some(runner) => match runner.try_run(command) {
                Ok(run) => {
                    Detached(Some(run)).await;
                    return Ok(());
                }
                Err(command) => command,
            },
            None => command,
        };
        self.send(command)
    }

    /// Notes that the task finished `count` commands.
    pub fn finished(&self, count: usize) {
        self.load.fetch_sub(count, Ordering::Relaxed);
    }

    /// Notes that the task stopped: the session takes no more commands.
    pub fn close(&self) {
        self.alive.store(false, Ordering::Release);
    }

    /// Queues `command`.
    ///
    /// # Errors
    /// Gives `command` back if the task has stopped taking commands.
    pub fn send(&self, command: C) -> Result<(), C> {
        self.load.fetch_add(1, Ordering::Relaxed);
        self.tx.send(command).map_err(|e| {
            self.load.fetch_sub(1, Ordering::Relaxed);
            e.0
        })
    }

    /// Commands sent and not yet finished.
    pub fn load(&self) -> usize {
        self.load.load(Ordering::Relaxed)
    }

    /// Whether the task still takes commands.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire) && !self.tx.is_closed()
    }
}

//! [`SessionTask`]: the loop of a task that owns one session, written once; the
//! backend supplies the statements.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{mpsc, Mutex, Notify, OwnedMutexGuard};
use tokio::time::{sleep_until, Instant};

use super::handle::{Failure, InlineRun, Kind, Reply, Runner, SessionHandle};
use super::leases::{Held, Leases, Upkeep};
use super::pool::SessionPool;
use super::timing::Timing;
use super::trip::Trip;
use crate::LockError;

/// A statement running on a connection borrowed for `'c`.
pub type Statement<'c, T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'c>>;

/// Why a session task stops.
#[derive(Debug)]
pub enum End {
    /// Every handle was dropped.
    ClientGone,
    /// Held nothing and was unused for the idle period.
    Idle,
    /// The connection failed or its state is unknown; the message says why.
    Broken(String),
}

/// What every session task keeps: its connection `K` (`None` once abandoned
/// mid-protocol), its mailbox of commands `C`, its place in the client's
/// [`SessionPool`], and its [`Leases`] (records `X`).
#[derive(Debug)]
pub struct TaskCore<C, X, K> {
    conn: Option<K>,
    /// The mailbox, until the loop takes it.
    rx: Option<mpsc::UnboundedReceiver<C>>,
    /// Set when a command run inline ended the session: the loop ends it.
    ended: Option<End>,
    /// When the loop wakes up for its timers, if no command comes first.
    sleeping_until: Instant,
    me: Weak<SessionHandle<C>>,
    kind: Kind,
    pool: Weak<SessionPool<C>>,
    /// What the session holds, and its proof of life.
    pub leases: Leases<X>,
    heartbeat: Duration,
    idle_close: Duration,
    /// The backend's name, for the log.
    backend: &'static str,
}

impl<C: Send + 'static, X, K> TaskCore<C, X, K> {
    /// The core of a new session task of `kind` over `conn` in `pool`, and the handle
    /// the client sends it commands through. Counts the session as open until the task
    /// ends.
    pub fn new(
        conn: K,
        kind: Kind,
        pool: &Arc<SessionPool<C>>,
        timing: Timing,
        backend: &'static str,
    ) -> (Arc<SessionHandle<C>>, Self) {
        let (handle, rx) = SessionHandle::new();
        let handle = Arc::new(handle);
        pool.task_started(kind);
        let core = TaskCore {
            conn: Some(conn),
            rx: Some(rx),
            ended: None,
            sleeping_until: Instant::now(),
            me: Arc::downgrade(&handle),
            kind,
            pool: Arc::downgrade(pool),
            leases: Leases::new(timing.horizon),
            heartbeat: timing.heartbeat,
            idle_close: timing.idle_close,
            backend,
        };
        (handle, core)
    }

    /// What kind of session this is.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// This session's handle, while anyone holds one.
    pub fn me(&self) -> Option<Arc<SessionHandle<C>>> {
        self.me.upgrade()
    }

    /// The connection, unless abandoned.
    pub fn conn_mut(&mut self) -> Option<&mut K> {
        self.conn.as_mut()
    }

    /// Drops the connection mid-protocol: its state is unknown, it must not be reused.
    pub fn abandon(&mut self) {
        self.conn = None;
    }

    /// Runs the statement `run` makes on the connection, as [`Leases::trip`] does
    /// (`limit`, `ends_session`), marking leases suspect after a heartbeat.
    pub async fn trip<T, E, F>(
        &mut self,
        limit: Duration,
        run: F,
        ends_session: impl FnOnce(&E) -> bool,
    ) -> Trip<T, E>
    where
        F: for<'c> FnOnce(&'c mut K) -> Statement<'c, T, E>,
        E: std::fmt::Display,
    {
        let Some(conn) = self.conn.as_mut() else {
            return Trip::Broken("the session was abandoned".into());
        };
        self.leases
            .trip(self.heartbeat, limit, run(conn), ends_session)
            .await
    }

    /// Routes the client's release and extend of `owner`'s lease to this session;
    /// `false` when the client or every handle of this session is gone (then nobody
    /// will ever release it).
    pub fn register(&self, owner: u128) -> bool {
        match (self.pool.upgrade(), self.me.upgrade()) {
            (Some(pool), Some(me)) => {
                pool.add_route(owner, me);
                true
            }
            _ => false,
        }
    }

    /// Forgets `owner`'s lease: marks it lost (it no longer is held) and removes the
    /// client's route to it.
    pub fn forget(&mut self, owner: u128) -> Option<Held<X>> {
        let held = self.leases.remove(owner)?;
        if let Some(pool) = self.pool.upgrade() {
            pool.remove_route(owner);
        }
        Some(held)
    }

    /// A dedicated session that holds nothing goes back to the client's idle list.
    pub fn return_if_idle(&self) {
        if self.kind != Kind::Wait || !self.leases.is_empty() {
            return;
        }
        if let (Some(pool), Some(me)) = (self.pool.upgrade(), self.me.upgrade()) {
            pool.return_wait_session(me);
        }
    }
}

/// A backend's session task: its statements, for [`SessionTask::run`], which owns the
/// loop (commands in order, timers first), the upkeep of the leases (releases at the
/// TTL, heartbeats) and the end (failing what is queued, forgetting what is held).
#[async_trait]
pub trait SessionTask: Send + Sized + 'static {
    /// The backend's commands.
    type Command: Send + 'static;
    /// The backend's record of one held lock.
    type Lock: Send + 'static;
    /// The backend's connection.
    type Conn: Send + 'static;

    /// The most commands taken at once: more than one if [`SessionTask::process`]
    /// batches them.
    const MAX_BATCH: usize;

    /// The task's core.
    fn core(&mut self) -> &mut TaskCore<Self::Command, Self::Lock, Self::Conn>;

    /// Runs `batch`, in order (or reordered where the backend shows it safe).
    async fn process(&mut self, batch: Vec<Self::Command>) -> Result<(), End>;

    /// Releases the leases of `owners`, whose TTL ran out.
    async fn expire(&mut self, owners: Vec<u128>) -> Result<(), End>;

    /// Proves the session alive with a round trip.
    async fn ping(&mut self) -> Result<(), End>;

    /// Forgets the held lease of `owner` (marking it lost) and the client's route to
    /// it: the session ended.
    fn forget(&mut self, owner: u128);

    /// Answers a command the session will not run: it ended before.
    fn refuse(&mut self, command: Self::Command);

    /// Closes the connection gracefully (the session ended without breaking); given
    /// a second.
    async fn close(conn: Self::Conn);

    /// Serves commands until the client goes, the session idles out or breaks, then
    /// ends it: what is queued fails as closed, what is held is lost. While the task
    /// waits for work, a caller may run a command in its own task instead of queueing
    /// it (see [`SessionHandle::run`]); the task and such callers take turns on the
    /// session behind one lock.
    async fn run(mut self) {
        let Some(mut rx) = self.core().rx.take() else {
            return;
        };
        let me = self.core().me();
        let cell = Arc::new(Inline {
            task: Arc::new(Mutex::new(self)),
            wake: Arc::new(Notify::new()),
        });
        if let Some(me) = me {
            let runner: Weak<dyn Runner<Self::Command>> =
                Arc::downgrade(&cell) as Weak<Inline<Self>>;
            me.set_runner(runner);
        }
        let end = serve(&cell, &mut rx).await;
        let mut task = cell.task.lock().await;
        stop(&mut *task, &mut rx, end).await;
    }
}

/// A session task behind the lock it and inline callers take turns on, and the
/// wake-up of its loop.
struct Inline<T> {
    task: Arc<Mutex<T>>,
    /// Wakes the loop: a command run inline ended the session, or changed its timers.
    wake: Arc<Notify>,
}

impl<T: SessionTask> Runner<T::Command> for Inline<T> {
    fn try_run(&self, command: T::Command) -> Result<InlineRun, T::Command> {
        let Ok(mut task) = self.task.clone().try_lock_owned() else {
            return Err(command);
        };
        let core = task.core();
        // Where what queues on a shared session goes in one statement, a command run
        // inline would take a round trip of its own and split the batch behind it.
        if T::MAX_BATCH > 1 && core.kind == Kind::Shared {
            return Err(command);
        }
        // Timers first: when one is due, the command waits for the loop to run it.
        let due = core.leases.next_timer(core.heartbeat, core.idle_close) <= Instant::now();
        if due || core.ended.is_some() || core.conn.is_none() {
            return Err(command);
        }
        match core.me.upgrade() {
            // Nothing queued or running: the command goes after everything sent before.
            Some(me) if me.load() == 0 && me.is_alive() => me.began(),
            _ => return Err(command),
        }
        Ok(Box::pin(run_inline(task, command, self.wake.clone())))
    }
}

/// Runs `command` as the loop would, in the caller's task; leaves the loop what must
/// follow (the session's end, or timers earlier than it sleeps until).
async fn run_inline<T: SessionTask>(
    mut task: OwnedMutexGuard<T>,
    command: T::Command,
    wake: Arc<Notify>,
) {
    let result = task.process(vec![command]).await;
    let core = task.core();
    let me = core.me.upgrade();
    if let Some(me) = &me {
        me.finished(1);
    }
    core.leases.used();
    match result {
        Ok(()) => {
            if core.leases.next_timer(core.heartbeat, core.idle_close) < core.sleeping_until {
                wake.notify_one();
            }
        }
        Err(end) => {
            if let Some(me) = &me {
                me.close();
            }
            core.ended = Some(end);
            wake.notify_one();
        }
    }
}

async fn serve<T: SessionTask>(
    cell: &Inline<T>,
    rx: &mut mpsc::UnboundedReceiver<T::Command>,
) -> End {
    loop {
        let wake_at = {
            let mut task = cell.task.lock().await;
            if let Some(end) = task.core().ended.take() {
                return end;
            }
            // Timers first, so a steady stream of commands cannot starve them.
            if let Err(end) = due_work(&mut *task).await {
                return end;
            }
            let core = task.core();
            // At least every heartbeat: then a grant run inline (whose first heartbeat
            // is one period away) seldom needs to wake the loop for an earlier timer.
            let wake_at = core
                .leases
                .next_timer(core.heartbeat, core.idle_close)
                .min(Instant::now() + core.heartbeat);
            core.sleeping_until = wake_at;
            wake_at
        };
        let batch = tokio::select! {
            command = rx.recv() => {
                let Some(command) = command else { return End::ClientGone };
                let mut batch = vec![command];
                while batch.len() < T::MAX_BATCH {
                    match rx.try_recv() {
                        Ok(command) => batch.push(command),
                        Err(_) => break,
                    }
                }
                batch
            }
            _ = sleep_until(wake_at) => continue,
            _ = cell.wake.notified() => continue,
        };
        let count = batch.len();
        let mut task = cell.task.lock().await;
        if let Some(end) = task.core().ended.take() {
            for command in batch {
                task.refuse(command);
            }
            if let Some(me) = task.core().me.upgrade() {
                me.finished(count);
            }
            return end;
        }
        let result = task.process(batch).await;
        let core = task.core();
        if let Some(me) = core.me.upgrade() {
            me.finished(count);
        }
        core.leases.used();
        if let Err(end) = result {
            return end;
        }
    }
}

/// Releases leases past their TTL, renews or proves the session, or ends it when idle.
async fn due_work<T: SessionTask>(task: &mut T) -> Result<(), End> {
    let now = Instant::now();
    let due = task.core().leases.due(now);
    if !due.is_empty() {
        task.expire(due).await?;
    }
    let core = task.core();
    match core.leases.upkeep(now, core.heartbeat, core.idle_close) {
        Upkeep::Nothing => {}
        Upkeep::Close => return Err(End::Idle),
        Upkeep::Ping => {
            task.ping().await?;
            task.core().leases.renew_all(false);
        }
        Upkeep::Renew => core.leases.renew_all(false),
    }
    Ok(())
}

async fn stop<T: SessionTask>(
    task: &mut T,
    rx: &mut mpsc::UnboundedReceiver<T::Command>,
    end: End,
) {
    let core = task.core();
    if let Some(me) = core.me.upgrade() {
        me.close();
    }
    if let Some(pool) = core.pool.upgrade() {
        if let Some(me) = core.me.upgrade() {
            pool.drop_session(&me);
        }
        pool.task_ended(core.kind);
    }
    rx.close();
    let mut queued = Vec::new();
    while let Ok(command) = rx.try_recv() {
        queued.push(command);
    }
    for command in queued {
        task.refuse(command);
    }
    let core = task.core();
    let owners = core.leases.owners();
    if !owners.is_empty() {
        tracing::warn!(
            locks = owners.len(),
            reason = ?end,
            "a {} lock session ended while holding locks; they are lost",
            core.backend
        );
    }
    for owner in owners {
        task.forget(owner);
    }
    if let Some(conn) = task.core().conn.take() {
        match end {
            End::Broken(_) => drop(conn),
            // A polite close, if the server answers soon.
            End::ClientGone | End::Idle => {
                let _ = tokio::time::timeout(Duration::from_secs(1), T::close(conn)).await;
            }
        }
    }
}

impl<T, E: std::fmt::Display> Trip<T, E> {
    /// The answer; a refusal or a break ends the session (`what` names the statement
    /// in the refusal's message).
    ///
    /// # Errors
    /// [`End::Broken`] unless the server answered.
    pub fn or_end(self, what: &str) -> Result<T, End> {
        match self {
            Trip::Done(value) => Ok(value),
            Trip::Refused(e) => Err(End::Broken(format!("{what} refused: {e}"))),
            Trip::Broken(why) => Err(End::Broken(why)),
        }
    }

    /// Sends a read-only statement's outcome to its caller: the answer, the refusal
    /// (as `refused` makes it a [`LockError`]; the session goes on) or the break (as
    /// `broken` makes it, and the session ends).
    ///
    /// # Errors
    /// [`End::Broken`] when the session broke.
    pub fn answer(
        self,
        reply: Reply<T>,
        refused: impl FnOnce(E) -> LockError,
        broken: impl FnOnce(String) -> LockError,
    ) -> Result<(), End> {
        match self {
            Trip::Done(value) => {
                let _ = reply.send(Ok(value));
                Ok(())
            }
            Trip::Refused(e) => {
                let _ = reply.send(Err(Failure::Lock(refused(e))));
                Ok(())
            }
            Trip::Broken(why) => {
                let _ = reply.send(Err(Failure::Lock(broken(why.clone()))));
                Err(End::Broken(why))
            }
        }
    }
}

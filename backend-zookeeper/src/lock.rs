//! [`ZooKeeperLock`]: the client of one ZooKeeper ensemble, and the contention engine
//! every primitive's recipe runs on (create a contender node, then hold, give up, or
//! wait on the node that blocks it).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::Duration;

use distlock_api::backend::prelude::*;
use distlock_api::backend::{Request, WaitReport};
use distlock_api::{
    ExtendOutcome, FencingToken, KeyStatus, Lease, LeaseMonitor, LockError, LockKey, LockOptions,
    OwnerToken, ReleaseOutcome,
};
use tokio::sync::Mutex;
use tokio::time::{sleep_until, Instant};
use zookeeper_client as zk;

use crate::config::{check_session_timeout, parse_url, validate_path, ZooKeeperConfig};
use crate::error::at_servers;
use crate::error::within;
use crate::keys::{encode_key, is_writer, protected_prefix, rank, rank_kind, NodeKind};
use crate::recipe::{create_contender, remove_own, remove_own_retrying, Cleanup};
use crate::security::{check_tls_hosts, Identity};
use crate::session::{spawn_watcher, Held, Registry, Session};
use crate::ZOOKEEPER_BACKEND;

/// A ZooKeeper lock client: the backend's [`distlock_api::backend::Engine`], for every
/// primitive. Use it through [`ZooKeeperLock::client`] (or [`ZooKeeperLock::lock`],
/// [`ZooKeeperLock::semaphore`], [`ZooKeeperLock::rw_lock`], [`ZooKeeperLock::election`]).
///
/// One ZooKeeper session at a time carries every grant and waiter of the client (and
/// of its clones); when that session expires, the grants on it are lost and the next
/// operation opens a new session. Cloning is cheap and shares the session.
#[derive(Debug, Clone)]
pub struct ZooKeeperLock {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The connect string, without chroot.
    hosts: String,
    /// Credentials and TLS of every session.
    identity: Identity,
    /// Chroot + base path: lock directories are `{root}/{encoded key}`.
    root: String,
    config: ZooKeeperConfig,
    /// The current session; replaced (never resumed) once it has ended.
    session: StdMutex<Option<Arc<Session>>>,
    /// Held while a new session is being opened, so only one is.
    opening: Mutex<()>,
    registry: Arc<Registry>,
    /// Predecessor-watch notifications received by waiters (a test hook).
    wakeups: AtomicU64,
}

/// What one acquire contends for; each follows a Curator recipe's node layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recipe<'a> {
    /// `InterProcessMutex`: the lowest `lock-` node holds.
    Mutex,
    /// `InterProcessReadWriteLock`'s read lock: held while no writer is ahead.
    Read,
    /// `InterProcessReadWriteLock`'s write lock: the lowest node of all holds.
    Write,
    /// `InterProcessSemaphoreV2` with `max` leases (see `semaphore.rs`).
    Permit { max: u32 },
    /// `LeaderLatch`: the lowest `latch-` node leads; it holds the candidate's
    /// `identity` (see `election.rs`).
    Lead { identity: &'a [u8] },
}

impl Recipe<'_> {
    /// The kind of node this recipe holds with.
    pub(crate) fn kind(self) -> NodeKind {
        match self {
            Recipe::Mutex => NodeKind::Lock,
            Recipe::Read => NodeKind::Read,
            Recipe::Write => NodeKind::Write,
            Recipe::Permit { .. } => NodeKind::Lease,
            Recipe::Lead { .. } => NodeKind::Latch,
        }
    }

    /// What the contender node holds: the leader's identity for an election, else
    /// nothing (semaphore leases write theirs themselves).
    fn data(&self) -> &[u8] {
        match self {
            Recipe::Lead { identity } => identity,
            _ => &[],
        }
    }
}

/// A node that won its contention: it holds the lock (or permit). Its removal stays
/// armed until the grant is registered (dropping it removes the node).
#[derive(Debug)]
pub(crate) struct Won {
    pub(crate) session: Arc<Session>,
    pub(crate) owner: OwnerToken,
    pub(crate) path: String,
    pub(crate) fence: u64,
    /// When the request whose answer showed the grant was sent.
    pub(crate) sent: Instant,
    pub(crate) cleanup: Cleanup,
}

/// One contention's end.
pub(crate) enum Contend {
    Granted(Won),
    /// Not the holder, and not waiting (any longer); our node is gone.
    Held,
    /// The session ended or our node vanished: start over.
    Restart,
}

/// Where a contender of `kind` stands among the `ranked` nodes of its directory, ours
/// at `index`: `None` when it holds, else the index of the node to watch. Readers are
/// held back only by a writer ahead of them (Curator's `ReadLock` driver, which watches
/// the first such writer); every other kind by any node ahead, watching the next lower.
fn blocker(kind: NodeKind, ranked: &[(i64, &str)], index: usize) -> Option<usize> {
    match kind {
        NodeKind::Read => ranked[..index].iter().position(|(_, n)| is_writer(n)),
        _ => index.checked_sub(1),
    }
}

impl ZooKeeperLock {
    /// Connects to the ensemble named by `url` with default settings, and opens a
    /// session. See [`crate::parse_url`] for the URL forms.
    ///
    /// # Errors
    /// [`LockError::Config`] for a bad URL, and for a `+tls` URL whose `ca`, `cert` or
    /// `key` file is missing, unreadable or holds no usable certificate or key, or whose
    /// host is neither a DNS name nor an IP address (or a build without the `tls`
    /// feature); [`LockError::Connection`] when no session can be established within
    /// the connect timeout (also when a TLS handshake fails). Credentials are checked
    /// by the ACLs of the nodes they meet, not at connect: a wrong password shows as a
    /// [`LockError::Config`] (`NoAuth`) from the first operation on a lock directory a
    /// client with the right one made.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        ZooKeeperLock::connect_with(url, ZooKeeperConfig::default()).await
    }

    /// Connects with `config`; a `session_timeout_ms` in the URL overrides the
    /// config's session timeout.
    ///
    /// # Errors
    /// As [`ZooKeeperLock::connect`], and [`LockError::Config`] for a zero request or
    /// connect timeout, a session timeout outside [`crate::MIN_SESSION_TIMEOUT`] ..=
    /// [`crate::MAX_SESSION_TIMEOUT`] (asked for, or granted by the server), or a base
    /// path that is not a valid absolute ZooKeeper path below `/`.
    pub async fn connect_with(url: &str, mut config: ZooKeeperConfig) -> Result<Self, LockError> {
        let url = parse_url(url)?;
        if let Some(timeout) = url.session_timeout {
            config.session_timeout = timeout;
        }
        check_session_timeout(config.session_timeout)?;
        let config_error = |message: String| LockError::config(ZOOKEEPER_BACKEND, message);
        let zero = |d: Option<Duration>| d.is_some_and(|d| d.is_zero());
        if zero(config.request_timeout) || zero(config.connect_timeout) {
            return Err(config_error("ZooKeeper timeouts must be above zero".into()));
        }
        validate_path(&config.base_path)
            .map_err(|why| config_error(format!("base path {:?}: {why}", config.base_path)))?;
        if config.base_path == "/" {
            return Err(config_error(
                "the base path must be below / (lock directories next to /zookeeper are refused)"
                    .into(),
            ));
        }
        let root = format!(
            "{}{}",
            url.chroot.as_deref().unwrap_or(""),
            config.base_path
        );
        if url.tls.is_some() {
            check_tls_hosts(&url.hosts)?;
        }
        let identity = Identity::new(url.credentials.clone(), url.tls.as_ref())?;
        let lock = ZooKeeperLock {
            inner: Arc::new(Inner {
                hosts: url.connect_string(),
                identity,
                root,
                config,
                session: StdMutex::new(None),
                opening: Mutex::new(()),
                registry: Arc::new(Registry::default()),
                wakeups: AtomicU64::new(0),
            }),
        };
        lock.session().await.map_err(|e| lock.located(e))?;
        Ok(lock)
    }

    /// The lock directory of `key`: `[chroot]{base_path}/{encode_key(key)}`. Contender
    /// nodes are its children; a Curator `InterProcessMutex` on this path excludes ours.
    pub fn lock_dir(&self, key: &LockKey) -> String {
        format!("{}/{}", self.inner.root, encode_key(key))
    }

    /// `[chroot]{base_path}/{namespace}/{encode_key(key)}`: the directory of another
    /// primitive's key. `namespace` starts with `.`, which no encoded key does.
    pub(crate) fn namespaced_dir(&self, namespace: &str, key: &LockKey) -> String {
        format!("{}/{namespace}/{}", self.inner.root, encode_key(key))
    }

    /// The current session's id, or `None` when no live session is open.
    pub fn session_id(&self) -> Option<i64> {
        self.current().map(|s| s.id)
    }

    /// The session timeout the server negotiated for the current session: how long a
    /// crashed holder keeps its locks at most. `None` as for
    /// [`ZooKeeperLock::session_id`].
    pub fn session_timeout(&self) -> Option<Duration> {
        self.current().map(|s| s.timeout)
    }

    /// The current session's id and password, to inject a session expiry in tests
    /// (a second client resumes the session, then closes it).
    #[doc(hidden)]
    pub fn session_info(&self) -> Option<zk::SessionInfo> {
        self.current().map(|s| s.client.session().clone())
    }

    /// How many predecessor-watch notifications this client's waiters received
    /// (a test hook: one release should wake one waiter).
    #[doc(hidden)]
    pub fn wakeups(&self) -> u64 {
        self.inner.wakeups.load(Ordering::Relaxed)
    }

    fn current(&self) -> Option<Arc<Session>> {
        self.inner
            .session
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .filter(|s| s.is_alive())
    }

    /// The live session, opening a new one if the last has ended.
    pub(crate) async fn session(&self) -> Result<Arc<Session>, LockError> {
        if let Some(session) = self.current() {
            return Ok(session);
        }
        let _opening = self.inner.opening.lock().await;
        if let Some(session) = self.current() {
            return Ok(session);
        }
        let session = Arc::new(
            Session::open(
                &self.inner.hosts,
                &self.inner.config,
                &self.inner.identity,
                &self.inner.registry,
            )
            .await?,
        );
        tracing::debug!(
            session = format_args!("{:#x}", session.id),
            timeout = ?session.timeout,
            "ZooKeeper session established"
        );
        spawn_watcher(&session, &self.inner.registry);
        *self
            .inner
            .session
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(session.clone());
        Ok(session)
    }

    /// Names the servers in a connection error (the connect string has no
    /// credentials: they are kept apart from it).
    pub(crate) fn located(&self, error: LockError) -> LockError {
        at_servers(&self.inner.hosts, error)
    }

    pub(crate) fn limit(&self, session: &Session) -> Duration {
        self.inner.config.request_timeout.unwrap_or(session.timeout)
    }

    /// Takes `request`'s key by `recipe` in `dir`, waiting natively until the request's
    /// deadline; notes in its report each listing that showed another contender ahead
    /// of ours. `None` when the key is still held at the deadline (at once for a try).
    ///
    /// A session that ended or a node that vanished starts the contention over on a
    /// fresh session (a try gets one more go); errors are returned at once, for the
    /// caller's error patience to retry.
    pub(crate) async fn obtain(
        &self,
        dir: &str,
        recipe: Recipe<'_>,
        request: &Request<'_>,
    ) -> Result<Option<Won>, LockError> {
        let (deadline, waits, report) = (request.deadline, request.waits(), request.report);
        let mut delays = request.options.backoff().delays();
        let mut restarts = 0u32;
        loop {
            let session = self.session().await?;
            let attempt = match recipe {
                Recipe::Permit { max } => {
                    let key = request.key;
                    self.take_permit(&session, dir, max, key, deadline, waits, report)
                        .await?
                }
                _ => {
                    let (kind, data) = (recipe.kind(), recipe.data());
                    self.contend(&session, dir, kind, data, deadline, waits, report)
                        .await?
                }
            };
            match attempt {
                Contend::Granted(won) => return Ok(Some(won)),
                Contend::Held => return Ok(None),
                // A one-shot try still gets one go on a fresh session.
                Contend::Restart if waits || restarts == 0 => restarts += 1,
                Contend::Restart => return Ok(None),
            }
            let mut pause = delays.next_delay();
            if let Some(d) = deadline {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() && restarts > 1 {
                    return Ok(None);
                }
                pause = pause.min(left);
            }
            // `sleep` saturates: an enormous backoff cannot overflow the clock.
            tokio::time::sleep(pause).await;
        }
    }

    /// One contender's life: create a node of `kind` holding `data`, then hold, give
    /// up, or wait on the node that blocks it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn contend(
        &self,
        session: &Arc<Session>,
        dir: &str,
        kind: NodeKind,
        data: &[u8],
        deadline: Option<Instant>,
        waits: bool,
        report: &WaitReport,
    ) -> Result<Contend, LockError> {
        let limit = self.limit(session);
        let owner = OwnerToken::random();
        // Armed from before the create is sent: a drop at any await removes our node.
        let mut cleanup = Cleanup::new(session.clone(), dir, owner, limit);
        let Some(created) = create_contender(session, dir, owner, kind, data, limit).await? else {
            return Ok(Contend::Restart);
        };
        let fence = u64::try_from(created.fence).map_err(|_| {
            LockError::backend_error(
                ZOOKEEPER_BACKEND,
                format!("the server gave a negative czxid {}", created.fence),
            )
        })?;
        let (name, mut listing, mut sent) = (created.name, created.listing, created.sent);
        let path = format!("{dir}/{name}");
        loop {
            let children = match listing.take() {
                Some(children) => children,
                None => {
                    sent = Instant::now();
                    match within(limit, session.client.list_children(dir)).await {
                        Ok(children) => children,
                        Err(f) if f.is_no_node() || f.session_ended() => {
                            return Ok(Contend::Restart)
                        }
                        Err(f) => return Err(f.into()),
                    }
                }
            };
            let ranked = rank_kind(&children, kind);
            let Some(index) = ranked.iter().position(|(_, n)| *n == name) else {
                // Our node is gone: the session expired, or someone deleted it.
                return Ok(Contend::Restart);
            };
            let Some(blocking) = blocker(kind, &ranked, index) else {
                return Ok(Contend::Granted(Won {
                    session: session.clone(),
                    owner,
                    path,
                    fence,
                    sent,
                    cleanup,
                }));
            };
            report.saw_held();
            if !waits || deadline.is_some_and(|d| Instant::now() >= d) {
                match within(limit, session.client.delete(&path, None)).await {
                    Ok(()) => cleanup.disarm(),
                    Err(f) if f.is_no_node() || f.session_ended() => cleanup.disarm(),
                    // Still armed: the node is removed in the background.
                    Err(f) => return Err(f.into()),
                }
                return Ok(Contend::Held);
            }
            // Watch only the node that blocks us (for the mutex, the next lower
            // contender): a release wakes one waiter.
            let predecessor = format!("{dir}/{}", ranked[blocking].1);
            let watcher = match within(limit, session.client.get_and_watch_data(&predecessor)).await
            {
                Ok((_, _, watcher)) => watcher,
                Err(f) if f.is_no_node() => continue,
                Err(f) if f.session_ended() => return Ok(Contend::Restart),
                Err(f) => return Err(f.into()),
            };
            let event = match deadline {
                Some(d) => tokio::select! {
                    event = watcher.changed() => Some(event),
                    _ = sleep_until(d) => None,
                },
                None => Some(watcher.changed().await),
            };
            if let Some(event) = event {
                self.inner.wakeups.fetch_add(1, Ordering::Relaxed);
                if event.event_type == zk::EventType::Session {
                    // Only terminal session states reach node watchers.
                    return Ok(Contend::Restart);
                }
            }
            // The predecessor changed or the wait ran out: look again (a last chance
            // before giving up, which then deletes our node).
        }
    }

    /// Registers a won node as held (its session's beat now vouches for it), and
    /// describes the grant: the lease (the node's `czxid` as token) and its monitor.
    pub(crate) fn register(
        &self,
        key: &LockKey,
        options: &LockOptions,
        mut won: Won,
    ) -> (Lease, LeaseMonitor) {
        won.cleanup.disarm();
        let Won {
            session,
            owner,
            path,
            fence,
            sent,
            ..
        } = won;
        // The session cannot expire before `sent + timeout`: the server heard from us
        // after `sent`.
        let valid_until = sent.checked_add(session.timeout).unwrap_or(sent);
        let monitor = LeaseMonitor::new(valid_until);
        self.inner.registry.insert(
            owner,
            Held {
                path,
                session,
                fence,
                monitor: monitor.clone(),
            },
        );
        let lease = Lease::new(
            key.clone(),
            owner,
            Some(FencingToken::new(fence)),
            options.ttl(),
            sent,
        );
        (lease, monitor)
    }

    /// Whether anyone contends for `dir` (some node of `kind`'s directory holds it or
    /// waits), through the live session.
    async fn held_by_other(
        &self,
        dir: &str,
        kind: NodeKind,
        except: OwnerToken,
    ) -> Result<bool, LockError> {
        let session = self.session().await?;
        let mine = protected_prefix(except);
        match within(self.limit(&session), session.client.list_children(dir)).await {
            Ok(children) => Ok(rank_kind(&children, kind)
                .iter()
                .any(|(_, name)| !name.starts_with(&mine))),
            Err(f) if f.is_no_node() => Ok(false),
            Err(f) => Err(f.into()),
        }
    }
}

impl ZooKeeperLock {
    /// Owner-checked release of a lease on a node of `kind` in `dir`: deletes our node.
    /// A delete cut off by a dropped connection is retried (the node found again by its
    /// GUID) within the request timeout; a release that still fails, or is dropped,
    /// leaves the node to a background removal that retries until it succeeds or the
    /// session ends, so the lock is never left to a live session.
    ///
    /// # Errors
    /// Connection and backend errors, naming the servers.
    pub(crate) async fn release_node(
        &self,
        dir: &str,
        kind: NodeKind,
        lease: &Lease,
    ) -> Result<ReleaseOutcome, LockError> {
        self.release_in(dir, kind, lease)
            .await
            .map_err(|e| self.located(e))
    }

    async fn release_in(
        &self,
        dir: &str,
        kind: NodeKind,
        lease: &Lease,
    ) -> Result<ReleaseOutcome, LockError> {
        let mine = protected_prefix(lease.owner());
        if let Some(held) = self.inner.registry.remove(lease.owner()) {
            if held.session.is_alive() {
                let limit = self.limit(&held.session);
                let until = Instant::now().checked_add(limit);
                // Armed until our node is known gone: a release that fails or is dropped
                // must not leave the lock to a session that lives on (nobody else would
                // ever delete the node).
                let mut cleanup = Cleanup::new(held.session.clone(), dir, lease.owner(), limit);
                match within(limit, held.session.client.delete(&held.path, None)).await {
                    Ok(()) => {
                        cleanup.disarm();
                        return Ok(ReleaseOutcome::Released);
                    }
                    Err(f) if f.is_no_node() || f.session_ended() => cleanup.disarm(),
                    // The connection dropped under the delete, which the client does not
                    // resend: look for the node again once the session has reconnected,
                    // within what is left of the request timeout.
                    Err(f) if f.is_uncertain() && until.is_some_and(|u| Instant::now() < u) => {
                        match remove_own_retrying(&held.session, dir, &mine, limit, until).await {
                            // Gone: deleted now, or by the first delete whose reply was
                            // lost (the session is live, so the node did not expire).
                            Ok(_) => {
                                cleanup.disarm();
                                return Ok(ReleaseOutcome::Released);
                            }
                            Err(f) if f.session_ended() || !held.session.is_alive() => {
                                cleanup.disarm();
                            }
                            // Still armed: the node is removed in the background.
                            Err(f) => return Err(f.into()),
                        }
                    }
                    // Still armed: the node is removed in the background.
                    Err(f) => return Err(f.into()),
                }
            }
        }
        // Not (or no longer) tracked here: remove any node carrying the lease's GUID.
        let session = self.session().await?;
        if remove_own(&session.client, dir, &mine, self.limit(&session)).await? {
            return Ok(ReleaseOutcome::Released);
        }
        Ok(if self.held_by_other(dir, kind, lease.owner()).await? {
            ReleaseOutcome::HeldByOther
        } else {
            ReleaseOutcome::Expired
        })
    }

    /// Owner-checked extend of a lease on a node of `kind` in `dir`: proves the
    /// session alive and the node present, and pushes the lease's validity to the
    /// session timeout past the request (the lease is the session: no TTL applies).
    ///
    /// # Errors
    /// Connection and backend errors, naming the servers;
    /// [`LockError::Unsupported`] for a lease held through another client's session.
    pub(crate) async fn extend_lease(
        &self,
        dir: &str,
        kind: NodeKind,
        lease: &Lease,
    ) -> Result<ExtendOutcome, LockError> {
        self.extend_in(dir, kind, lease)
            .await
            .map_err(|e| self.located(e))
    }

    async fn extend_in(
        &self,
        dir: &str,
        kind: NodeKind,
        lease: &Lease,
    ) -> Result<ExtendOutcome, LockError> {
        match self.inner.registry.lookup(lease.owner()) {
            Some((path, session, fence)) => {
                if session.is_alive() {
                    let sent = Instant::now();
                    // The sync goes through the leader and the read is answered after
                    // it, so a follower lagging behind our session's expiry cannot
                    // vouch for the node.
                    let synced = session.client.sync("/");
                    let checked = session.client.check_stat(&path);
                    let both = async {
                        let (synced, checked) = tokio::join!(synced, checked);
                        synced.and(checked)
                    };
                    match within(self.limit(&session), both).await {
                        Ok(Some(stat))
                            if u64::try_from(stat.czxid) == Ok(fence)
                                && stat.ephemeral_owner == session.id =>
                        {
                            if let Some(valid_until) = sent.checked_add(session.timeout) {
                                return Ok(ExtendOutcome::Extended { valid_until });
                            }
                        }
                        Ok(_) => {}
                        Err(f) if f.session_ended() => {}
                        Err(f) => return Err(f.into()),
                    }
                }
                // Our node or its session is gone: the lease is lost.
                self.inner.registry.lose(lease.owner(), &path);
            }
            None => {
                let session = self.session().await?;
                let mine = protected_prefix(lease.owner());
                let children =
                    match within(self.limit(&session), session.client.list_children(dir)).await {
                        Ok(children) => children,
                        Err(f) if f.is_no_node() => Vec::new(),
                        Err(f) => return Err(f.into()),
                    };
                if children.iter().any(|name| name.starts_with(&mine)) {
                    return Err(LockError::Unsupported {
                        backend: ZOOKEEPER_BACKEND,
                        operation: "extend",
                        reason: "only the client whose session holds a ZooKeeper lock can vouch for its lease",
                    });
                }
            }
        }
        Ok(if self.held_by_other(dir, kind, lease.owner()).await? {
            ExtendOutcome::HeldByOther
        } else {
            ExtendOutcome::Expired
        })
    }

    /// The mutex `key` as it is now: the lowest contender node is the holder, its
    /// `czxid` the token and its ephemeral owner the session. The lease is that
    /// session, so no remaining time.
    ///
    /// # Errors
    /// Connection and backend errors, naming the servers.
    pub(crate) async fn inspect_mutex(&self, key: &LockKey) -> Result<KeyStatus, LockError> {
        self.inspect_key(key).await.map_err(|e| self.located(e))
    }

    async fn inspect_key(&self, key: &LockKey) -> Result<KeyStatus, LockError> {
        let dir = self.lock_dir(key);
        let session = self.session().await?;
        let limit = self.limit(&session);
        // The holder may release between the listing and the stat: look again.
        for _ in 0..3 {
            let children = match within(limit, session.client.list_children(&dir)).await {
                Ok(children) => children,
                Err(f) if f.is_no_node() => return Ok(KeyStatus::free()),
                Err(f) => return Err(f.into()),
            };
            let Some((_, first)) = rank(&children).first().copied() else {
                return Ok(KeyStatus::free());
            };
            let path = format!("{dir}/{first}");
            if let Some(stat) = within(limit, session.client.check_stat(&path)).await? {
                return Ok(KeyStatus::held()
                    .with_fencing_token(u64::try_from(stat.czxid).ok().map(FencingToken::new))
                    .with_holder(Some(format!("session 0x{:x}", stat.ephemeral_owner))));
            }
        }
        Err(LockError::backend_error(
            ZOOKEEPER_BACKEND,
            "the lock's holder changed three times while being read; try again",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bad_urls_and_configs_fail_before_connecting() {
        for url in ["", "redis://h:1", "zk://", "zk://h:1?x=1"] {
            assert!(matches!(
                ZooKeeperLock::connect(url).await,
                Err(LockError::Config { .. })
            ));
        }
        for config in [
            ZooKeeperConfig::default().with_base_path("/"),
            ZooKeeperConfig::default().with_base_path("relative"),
            ZooKeeperConfig::default().with_base_path("/a/"),
            ZooKeeperConfig::default().with_session_timeout(Duration::ZERO),
            ZooKeeperConfig::default().with_request_timeout(Duration::ZERO),
        ] {
            assert!(matches!(
                ZooKeeperLock::connect_with("zk://127.0.0.1:1", config).await,
                Err(LockError::Config { .. })
            ));
        }
    }

    #[test]
    fn connecting_without_a_tokio_runtime_is_a_config_error() {
        use std::future::Future as _;
        let mut connecting = std::pin::pin!(ZooKeeperLock::connect("zk://127.0.0.1:1"));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match connecting.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(Err(LockError::Config { message, .. })) => {
                assert!(message.contains("Tokio runtime"), "{message}")
            }
            other => panic!("{:?}", other.map(|r| r.map(|_| ()))),
        }
    }

    #[tokio::test]
    async fn unreachable_server_is_a_connection_error() {
        // Port 1 on loopback refuses connections; fail-eagerly makes it quick.
        let config = ZooKeeperConfig::default().with_session_timeout(Duration::from_secs(2));
        let started = Instant::now();
        let result = ZooKeeperLock::connect_with("zk://127.0.0.1:1", config).await;
        assert!(
            matches!(result, Err(LockError::Connection { .. })),
            "{result:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(Registry::default().len(), 0);
    }
}

//! One Redis server: a multiplexed, auto-reconnecting RESP3 connection, the scripts run
//! on it, and the wake-ups it carries.

use std::borrow::Cow;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use distlock_api::connect_retry::{retry_connect, Refused};
use distlock_api::{ExtendOutcome, FencingToken, LockError, OwnerToken, ReleaseOutcome};
use redis::{
    Cmd, ConnectionAddr, ErrorKind, FromRedisValue, RedisError, Script, ServerErrorKind, Value,
};

use crate::conn::NodeConn;
use crate::driver::{driver_client, open_manager, open_manager_with, PushSink};
use crate::error::lock_error;
use crate::keys::KeyNames;
use crate::native::{Detected, NativeCommands};
use crate::replicas::ReplicaWait;
use crate::wakeups::{WakeTicket, Wakeups};
use crate::REDIS_BACKEND;

/// What one node said to an acquire attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NodeGrant {
    /// Granted, with the grant's fencing token (`None` when unfenced).
    Granted(Option<FencingToken>),
    /// Held by another owner for at most this long (`None`: no expiry set, or not
    /// asked: an attempt of nobody subscribed retries at once anyway).
    Held(Option<Duration>),
}

/// What the node said to a FIFO acquire attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QueueGrant {
    /// Granted, with the node's fencing counter after `INCR`.
    Granted(FencingToken),
    /// Not granted: the lock is held, or other waiters are ahead.
    Waiting {
        /// The holder's remaining `PX`, if held with an expiry.
        held_for: Option<Duration>,
        /// Time until the earliest queue entry's deadline, if anyone is queued: a dead
        /// waiter ahead leaves the queue then at the latest.
        next_deadline: Option<Duration>,
        /// This waiter's 0-based place in the queue, if queued.
        place: Option<u64>,
    },
}

/// One node's view of a key, read atomically.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeView {
    /// What the key holds, if it exists.
    pub(crate) owner: Option<Holder>,
    /// The lock's remaining `PX`, if held with an expiry.
    pub(crate) remaining: Option<Duration>,
    /// Live entries in the key's FIFO queue.
    pub(crate) queued: usize,
}

/// What a held lock key contains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Holder {
    /// A string: our owner token, or whatever value a foreign library stored (which
    /// may be empty or a number).
    Value(String),
    /// A key of another type (`hash`, `list`, …), which no lock library writes but
    /// which keeps the key from being locked all the same.
    OtherType(String),
}

/// One Redis server: its connection, or, for a Redlock node that did not answer at
/// start-up, the place its connection goes once it joins. Clones share everything.
#[derive(Clone)]
pub(crate) struct Node {
    address: String,
    link: Arc<Link>,
}

/// What the clones of a [`Node`] share.
struct Link {
    /// The driver's client of a direct node; `None` for a Sentinel or Cluster node,
    /// whose connection is made by its topology (see [`Node::for_topology`]).
    client: Option<redis::Client>,
    /// The database the URL selects, for error messages.
    db: i64,
    /// Host and port, to resolve (`None` for a Unix socket).
    endpoint: Option<(String, u16)>,
    connect_timeout: Duration,
    wakeups: Arc<Wakeups>,
    /// Set once the server answered (and, for Redlock, proved to be a server of its own).
    conn: OnceLock<NodeConn>,
    /// Until then: why not, for the errors of operations that skip this node.
    absent: Mutex<String>,
    /// Replicas every grant and extend must reach (`min_replicas`), once set.
    replicas: OnceLock<ReplicaWait>,
    /// Which native compare-and-set commands the server has, once asked.
    native: Detected,
}

/// A [`Node`] that does not keep its connection alive: a background joiner holds this,
/// so the joiner ends when the client is dropped.
#[derive(Clone)]
pub(crate) struct WeakNode {
    address: String,
    link: Weak<Link>,
}

impl WeakNode {
    /// The node, while its client lives.
    pub(crate) fn upgrade(&self) -> Option<Node> {
        Some(Node {
            address: self.address.clone(),
            link: self.link.upgrade()?,
        })
    }
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("address", &self.address)
            .field("joined", &self.link.conn.get().is_some())
            .finish()
    }
}

impl Node {
    /// Prepares a node for the server at `url` (`redis://…`) without connecting. It will
    /// speak RESP3, so that pub/sub pushes share the command connection.
    ///
    /// # Errors
    /// [`LockError::Config`] for a URL the driver refuses (the message does not repeat
    /// the URL: it may carry a password).
    pub(crate) fn new(url: &str, connect_timeout: Duration) -> Result<Node, LockError> {
        let (client, address, db) = driver_client(url)?;
        let endpoint = match client.get_connection_info().addr() {
            ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                Some((host.clone(), *port))
            }
            _ => None,
        };
        Ok(Node {
            address,
            link: Arc::new(Link {
                client: Some(client),
                db,
                endpoint,
                connect_timeout,
                wakeups: Arc::new(Wakeups::default()),
                conn: OnceLock::new(),
                absent: Mutex::new("not connected yet".to_owned()),
                replicas: OnceLock::new(),
                native: Detected::default(),
            }),
        })
    }

    /// A node whose connection a topology (Sentinel, Cluster) makes: `address` names it
    /// in errors; [`Node::push_sink`] routes the connection's pushes, and [`Node::join`]
    /// hands the connection over.
    pub(crate) fn for_topology(address: String, connect_timeout: Duration) -> Node {
        Node {
            address,
            link: Arc::new(Link {
                client: None,
                db: 0,
                endpoint: None,
                connect_timeout,
                wakeups: Arc::new(Wakeups::default()),
                conn: OnceLock::new(),
                absent: Mutex::new("not connected yet".to_owned()),
                replicas: OnceLock::new(),
                native: Detected::default(),
            }),
        }
    }

    /// Where the node's connection must push: its wake-up router.
    pub(crate) fn push_sink(&self) -> PushSink {
        let wakeups = self.link.wakeups.clone();
        Arc::new(move |push| wakeups.on_push(push))
    }

    /// Opens an auto-reconnecting connection to the server, without joining it to the
    /// node (see [`Node::join`]).
    ///
    /// # Errors
    /// [`LockError::Config`] when the server refuses the credentials or the database,
    /// or is not a Redis 6+ server; [`LockError::Connection`] when it cannot be reached.
    /// Either names the address.
    pub(crate) async fn open(&self) -> Result<NodeConn, LockError> {
        let Some(client) = &self.link.client else {
            return Err(LockError::connection_at(
                REDIS_BACKEND,
                &self.address,
                "a topology node is connected by its topology",
            ));
        };
        let manager = open_manager(
            client,
            &self.address,
            self.link.db,
            self.link.connect_timeout,
            self.push_sink(),
        )
        .await?;
        Ok(NodeConn::Direct(manager))
    }
}

impl Node {
    /// [`Node::open`], retrying a refused or silent port and a server still loading
    /// its dataset (with backoff) until the node's connect timeout has passed since the
    /// call, then failing with the last reason; other refusals fail at once.
    ///
    /// # Errors
    /// As [`Node::open`].
    pub(crate) async fn open_retrying(&self) -> Result<NodeConn, LockError> {
        let limit = self.link.connect_timeout;
        retry_connect(
            limit,
            |_| self.open_once(),
            |last| last.unwrap_or_else(|| self.no_connection(limit)),
        )
        .await
    }

    /// One connect attempt, its refusal sorted for
    /// [`distlock_api::connect_retry::retry_connect`]: a refused or silent port and a
    /// server still loading its dataset may pass; other refusals do not.
    pub(crate) async fn open_once(&self) -> Result<NodeConn, Refused> {
        let Some(client) = &self.link.client else {
            return self.open().await.map_err(Refused::Lasting);
        };
        let manager = open_manager_with(client, self.link.connect_timeout, self.push_sink())
            .await
            .map_err(|e| crate::error::connect_refused(&self.address, self.link.db, e))?;
        Ok(NodeConn::Direct(manager))
    }

    /// The error of a connect whose every attempt was still unanswered at the end of
    /// the connect timeout `limit`.
    pub(crate) fn no_connection(&self, limit: Duration) -> LockError {
        LockError::connection_at(
            REDIS_BACKEND,
            &self.address,
            format!(
                "no connection within the connect timeout of {} ms",
                limit.as_millis()
            ),
        )
    }
}

impl Node {
    /// Makes `conn` this node's connection: operations use it from now on. A node joins
    /// once; a later call changes nothing.
    pub(crate) fn join(&self, conn: NodeConn) {
        let _ = self.link.conn.set(conn);
    }

    /// Makes every grant and extend on this node wait for `wait`'s replicas (see
    /// [`crate::replicas`]). Set once, before the node is used; a later call changes
    /// nothing.
    pub(crate) fn require_replicas(&self, wait: ReplicaWait) {
        let _ = self.link.replicas.set(wait);
    }

    /// Records why the node has not joined, for the errors of operations meanwhile.
    pub(crate) fn set_absent(&self, why: String) {
        *self
            .link
            .absent
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = why;
    }

    /// The joined connection, if the node has joined.
    pub(crate) fn connection(&self) -> Option<NodeConn> {
        self.link.conn.get().cloned()
    }

    /// Host and port to resolve, for a TCP node.
    pub(crate) fn endpoint(&self) -> Option<(String, u16)> {
        self.link.endpoint.clone()
    }

    /// A handle that does not keep the node alive.
    pub(crate) fn downgrade(&self) -> WeakNode {
        WeakNode {
            address: self.address.clone(),
            link: Arc::downgrade(&self.link),
        }
    }

    /// The joined connection, or at once (no connect timeout spent) a connection error
    /// saying why the node is not part of the client yet.
    fn conn(&self) -> Result<NodeConn, LockError> {
        match self.link.conn.get() {
            Some(conn) => Ok(conn.clone()),
            None => {
                let why = self
                    .link
                    .absent
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone();
                Err(LockError::connection_at(
                    REDIS_BACKEND,
                    &self.address,
                    format!("node not connected: {why}"),
                ))
            }
        }
    }

    /// `host:port` of the server.
    pub(crate) fn address(&self) -> &str {
        &self.address
    }

    /// The server's identity (`INFO server`'s `run_id`; a restart changes it), over
    /// `conn`. `None` when the server does not tell (an ACL user without `INFO`).
    ///
    /// # Errors
    /// [`LockError::Connection`] when the server does not answer.
    pub(crate) async fn server_id(&self, conn: &NodeConn) -> Result<Option<String>, LockError> {
        let info: Result<String, RedisError> = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut conn.clone())
            .await;
        match info {
            Ok(info) => Ok(info
                .lines()
                .find_map(|line| line.strip_prefix("run_id:"))
                .map(|id| id.trim().to_owned())),
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoPerm) => Ok(None),
            Err(e) => Err(lock_error(&self.address, e)),
        }
    }

    /// The mutex's fencing counter for `names` on this node: the server's one counter
    /// ([`KeyNames::fence`]) on a single server or a Sentinel-managed master, where
    /// nothing ties a key to a slot; the counter of the lock's hash slot
    /// ([`KeyNames::cluster_fence`]) on a Cluster, where a script's keys must share a
    /// slot (and the counter must move with it).
    pub(crate) fn fence<'a>(&self, names: &'a KeyNames) -> Cow<'a, str> {
        match self.link.conn.get() {
            Some(NodeConn::Cluster(_)) => Cow::Owned(names.cluster_fence()),
            _ => Cow::Borrowed(names.fence()),
        }
    }

    /// One acquire attempt; `fenced` also hands out the next fencing token of the
    /// node's counter ([`Node::fence`]). `waiting`: how long a held key stays marked
    /// as waited on (`None` for an attempt of nobody subscribed to the wake-ups).
    ///
    /// An attempt of nobody subscribed (every acquire's first) is a pipeline of
    /// `SET NX PX` and `INCR` of the counter, no script: the cheapest grant that keeps
    /// tokens rising per key (the `INCR` follows the `SET` on one connection, and the
    /// next grant of the key follows this grant's release, so it comes after this
    /// `INCR`). A held key's `INCR` is a token handed to nobody, which costs no
    /// guarantee. A subscribed waiter's attempt runs [`crate::scripts::ACQUIRE`], which
    /// also marks the key waited on and says how long it is held.
    pub(crate) async fn try_grant(
        &self,
        names: &KeyNames,
        owner: OwnerToken,
        ttl: Duration,
        fenced: bool,
        waiting: Option<Duration>,
    ) -> Result<NodeGrant, LockError> {
        let Some(waiting) = waiting else {
            return self.try_grant_pipelined(names, owner, ttl, fenced).await;
        };
        let script = &*crate::scripts::ACQUIRE;
        let fence = self.fence(names);
        let keys: &[&str] = if fenced {
            &[&names.lock, &*fence]
        } else {
            &[&names.lock]
        };
        let mut cmd = evalsha(script, keys);
        cmd.arg(&hex(owner)[..])
            .arg(ttl_millis(ttl))
            .arg(ttl_millis(waiting));
        let (answer, short): (Value, _) = self.run_acked(script, &cmd).await?;
        let grant =
            grant_of(&answer, fenced).ok_or_else(|| unexpected("acquire script", &answer))?;
        // Too few replicas for a grant: the caller releases it (as after any error).
        match (grant, short) {
            (NodeGrant::Granted(_), Some(short)) => Err(short),
            (grant, _) => Ok(grant),
        }
    }

    /// [`Node::try_grant`] without a script: `SET NX PX`, and `INCR` of the node's
    /// counter when `fenced`, in one round trip.
    async fn try_grant_pipelined(
        &self,
        names: &KeyNames,
        owner: OwnerToken,
        ttl: Duration,
        fenced: bool,
    ) -> Result<NodeGrant, LockError> {
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(&names.lock)
            .arg(&hex(owner)[..])
            .arg("NX")
            .arg("PX")
            .arg(ttl_millis(ttl));
        if fenced {
            pipe.cmd("INCR").arg(&*self.fence(names));
        }
        // An error after a granted `SET` fails the attempt, whose caller releases what
        // it may hold.
        let (answers, acked) = self.query_acked(pipe).await?;
        // The writes' own errors first: on a demoted master the `SET`'s `READONLY` says
        // "follow the failover", where the `WAIT`'s refusal would not.
        if let Some(error) = answers.iter().find_map(|answer| match answer {
            Value::ServerError(error) => Some(error.clone()),
            _ => None,
        }) {
            return Err(lock_error(&self.address, error.into()));
        }
        let short = match &acked {
            Some((wait, waited)) => wait.shortfall(&self.address, waited)?,
            None => None,
        };
        let grant = match answers.as_slice() {
            [Value::Nil, ..] => return Ok(NodeGrant::Held(None)),
            [Value::Okay] if !fenced => NodeGrant::Granted(None),
            [Value::Okay, Value::Int(counted)] if fenced => {
                let token = if *counted >= crate::scripts::SEED_FLOOR {
                    counted.unsigned_abs()
                } else {
                    // The counter was gone: seed it from the server's clock.
                    self.seeded_token(names).await?
                };
                NodeGrant::Granted(Some(FencingToken::new(token)))
            }
            _ => return Err(unexpected("acquire", &Value::Array(answers))),
        };
        // Too few replicas for a grant: the caller releases it (as after any error).
        match short {
            Some(short) => Err(short),
            None => Ok(grant),
        }
    }

    /// Runs `pipe` with the `WAIT` of `min_replicas` appended when the node requires
    /// replicas, each command's own error in its place (with its code: `BUSY` and
    /// `LOADING` are transient) instead of one error listing them all. The writes'
    /// answers, and the `WAIT` with its answer.
    async fn query_acked(
        &self,
        mut pipe: redis::Pipeline,
    ) -> Result<(Vec<Value>, Option<(ReplicaWait, Value)>), LockError> {
        let wait = self.link.replicas.get().copied();
        if let Some(wait) = &wait {
            wait.append(&mut pipe);
        }
        pipe.ignore_errors();
        let mut answers: Vec<Value> = pipe
            .query_async(&mut self.conn()?)
            .await
            .map_err(|e| lock_error(&self.address, e))?;
        let acked = match wait {
            Some(wait) => answers.pop().map(|waited| (wait, waited)),
            None => None,
        };
        Ok((answers, acked))
    }

    /// The next token of the node's counter for `names`, which `INCR` found gone: seeded (see
    /// [`crate::scripts::SEEDED_TOKEN`]).
    async fn seeded_token(&self, names: &KeyNames) -> Result<u64, LockError> {
        let script = &*crate::scripts::SEEDED_TOKEN;
        let cmd = evalsha(script, &[&*self.fence(names)]);
        // The seed must reach the replicas too: a failover to one without it would
        // hand out tokens from the counter's older value.
        let (answer, short): (Value, _) = self.run_acked(script, &cmd).await?;
        if let Some(short) = short {
            return Err(short);
        }
        token_of(&answer).ok_or_else(|| unexpected("token seeding script", &answer))
    }

    /// Runs the FIFO acquire script for the queued waiter `waiter`: joins the queue
    /// (or refreshes its entry for `entry_ttl`) when `join`, else only tries.
    pub(crate) async fn try_grant_in_queue(
        &self,
        names: &KeyNames,
        owner: OwnerToken,
        ttl: Duration,
        waiter: &str,
        entry_ttl: Duration,
        join: bool,
    ) -> Result<QueueGrant, LockError> {
        let script = &*crate::scripts::QUEUED_ACQUIRE;
        let (queue, deadlines) = (names.queue(), names.queue_deadlines());
        let mut cmd = evalsha(
            script,
            &[
                &names.lock,
                &*self.fence(names),
                &queue,
                &deadlines,
                &names.channel(),
            ],
        );
        cmd.arg(&hex(owner)[..])
            .arg(ttl_millis(ttl))
            .arg(waiter)
            .arg(ttl_millis(entry_ttl))
            .arg(if join { "1" } else { "0" });
        let (answer, short): (Vec<Value>, _) = self.run_acked(script, &cmd).await?;
        if let (Some(short), [Value::Int(1), _]) = (short, answer.as_slice()) {
            // Too few replicas for a grant: the caller releases it (as after any error).
            return Err(short);
        }
        let millis = |ms: i64| u64::try_from(ms).ok().map(Duration::from_millis);
        Ok(match answer.as_slice() {
            [Value::Int(1), token] => match token_of(token) {
                Some(token) => QueueGrant::Granted(FencingToken::new(token)),
                None => return Err(unexpected("FIFO acquire script", token)),
            },
            [Value::Int(0), Value::Int(held_for), Value::Int(next_deadline), Value::Int(place)] => {
                QueueGrant::Waiting {
                    held_for: millis(*held_for),
                    next_deadline: millis(*next_deadline),
                    place: u64::try_from(*place).ok(),
                }
            }
            _ => {
                return Err(unexpected(
                    "FIFO acquire script",
                    &Value::Array(answer.clone()),
                ))
            }
        })
    }

    /// Removes `waiter` from the FIFO queue, waking the new head if the lock is free.
    pub(crate) async fn leave_queue(
        &self,
        names: &KeyNames,
        waiter: &str,
    ) -> Result<(), LockError> {
        let script = &*crate::scripts::LEAVE_QUEUE;
        let (queue, deadlines) = (names.queue(), names.queue_deadlines());
        let mut cmd = evalsha(script, &[&names.lock, &names.channel(), &queue, &deadlines]);
        cmd.arg(waiter);
        let _removed: i64 = self.run(script, &cmd).await?;
        Ok(())
    }

    /// Runs the owner-checked release script.
    pub(crate) async fn release(
        &self,
        names: &KeyNames,
        owner: OwnerToken,
    ) -> Result<ReleaseOutcome, LockError> {
        self.release_with(&crate::scripts::RELEASE, names, owner)
            .await
    }

    /// Runs an owner-checked release `script` (`KEYS = [lock]`, `ARGV = [token]`,
    /// answering 1 released, 2 held by another owner, 0 gone): the mutex's or a
    /// primitive's.
    pub(crate) async fn release_with(
        &self,
        script: &Script,
        names: &KeyNames,
        owner: OwnerToken,
    ) -> Result<ReleaseOutcome, LockError> {
        let mut cmd = evalsha(script, &[&names.lock]);
        cmd.arg(&hex(owner)[..]);
        let found: i64 = self.run(script, &cmd).await?;
        Ok(match found {
            1 => ReleaseOutcome::Released,
            2 => ReleaseOutcome::HeldByOther,
            _ => ReleaseOutcome::Expired,
        })
    }

    /// The mutex's owner-checked extend: the server's `SET … IFEQ` where it has it
    /// (see [`crate::native`]), else the extend script. `Extended`'s deadline is filled
    /// in by the caller.
    pub(crate) async fn extend(
        &self,
        names: &KeyNames,
        owner: OwnerToken,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        if self.native().await.set_ifeq {
            if let Some(outcome) = self.extend_native(names, owner, ttl).await? {
                return Ok(outcome);
            }
        }
        self.extend_with(&crate::scripts::EXTEND, names, owner, ttl)
            .await
    }

    /// The native commands of the server, asked once (again after
    /// [`Detected::forget`]). A detection that fails (the connection is down) is not
    /// stored, and reports nothing native: the caller's script works everywhere.
    pub(crate) async fn native(&self) -> NativeCommands {
        if let Some(found) = self.link.native.get() {
            return found;
        }
        let Ok(mut conn) = self.conn() else {
            return NativeCommands::default();
        };
        match crate::native::detect(&mut conn).await {
            Ok(found) => {
                self.link.native.set(found);
                found
            }
            Err(_) => NativeCommands::default(),
        }
    }

    /// The extend as `SET {K} <owner> IFEQ <owner> PX <ttl> GET` (with the `WAIT` of
    /// `min_replicas` in the same pipeline): the same value with a new expiry, written
    /// only while the owner holds the key. `None` when the server did not understand it
    /// (it did nothing; the detection is forgotten and the caller runs the script).
    async fn extend_native(
        &self,
        names: &KeyNames,
        owner: OwnerToken,
        ttl: Duration,
    ) -> Result<Option<ExtendOutcome>, LockError> {
        let token = hex(owner);
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(&names.lock)
            .arg(&token[..])
            .arg("IFEQ")
            .arg(&token[..])
            .arg("PX")
            .arg(ttl_millis(ttl))
            .arg("GET");
        let (answers, acked) = self.query_acked(pipe).await?;
        let outcome = match answers.as_slice() {
            [Value::ServerError(e)] if crate::native::not_understood(e) => {
                self.link.native.forget();
                return Ok(None);
            }
            // A key of another type: held, as the script's `pcall` of `GET` says.
            [Value::ServerError(e)] if e.code() == "WRONGTYPE" => ExtendOutcome::HeldByOther,
            [Value::ServerError(e)] => return Err(lock_error(&self.address, e.clone().into())),
            [Value::Nil] => ExtendOutcome::Expired,
            [Value::BulkString(found)] if found[..] == token[..] => ExtendOutcome::Extended {
                valid_until: tokio::time::Instant::now(),
            },
            [Value::BulkString(_)] => ExtendOutcome::HeldByOther,
            _ => return Err(unexpected("native extend", &Value::Array(answers))),
        };
        if let (Some((wait, waited)), ExtendOutcome::Extended { .. }) = (&acked, &outcome) {
            // Applied on the master, but too few replicas have it: not counted, as
            // for the script.
            if let Some(short) = wait.shortfall(&self.address, waited)? {
                return Err(short);
            }
        }
        Ok(Some(outcome))
    }

    /// Runs an owner-checked extend `script` (`KEYS = [lock]`, `ARGV = [token, ttl_ms]`,
    /// answering 1 extended, 2 held by another owner, 0 gone): the mutex's or a
    /// primitive's. `Extended`'s deadline is filled in by the caller.
    pub(crate) async fn extend_with(
        &self,
        script: &Script,
        names: &KeyNames,
        owner: OwnerToken,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        let mut cmd = evalsha(script, &[&names.lock]);
        cmd.arg(&hex(owner)[..]).arg(ttl_millis(ttl));
        let (found, short): (i64, _) = self.run_acked(script, &cmd).await?;
        if let (Some(short), 1) = (short, found) {
            // Applied on the master, but too few replicas have it: not counted, so the
            // lease keeps its earlier validity (and turns suspect).
            return Err(short);
        }
        Ok(match found {
            1 => ExtendOutcome::Extended {
                valid_until: tokio::time::Instant::now(),
            },
            2 => ExtendOutcome::HeldByOther,
            _ => ExtendOutcome::Expired,
        })
    }

    /// Reads the lock and its FIFO queue without changing them (not the slot's
    /// fencing counter: other keys of the slot move it, so it is no key's token).
    /// Whatever a foreign holder left on the key (an empty or odd value, no expiry,
    /// another type) reads as held.
    pub(crate) async fn inspect(&self, names: &KeyNames) -> Result<NodeView, LockError> {
        let (kind, value, pttl, queued): (String, String, i64, i64) = crate::scripts::INSPECT
            .key(&names.lock)
            .key(names.queue_deadlines())
            .invoke_async(&mut self.conn()?)
            .await
            .map_err(|e| lock_error(&self.address, e))?;
        let owner = match kind.as_str() {
            "none" => None,
            "string" => Some(Holder::Value(value)),
            _ => Some(Holder::OtherType(kind)),
        };
        Ok(NodeView {
            owner,
            remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
            queued: usize::try_from(queued).unwrap_or(0),
        })
    }

    /// Runs an `EVALSHA` of `script`, loading the script once on `NOSCRIPT` (a server
    /// that never saw it, or restarted) and trying again.
    pub(crate) async fn run<T: FromRedisValue>(
        &self,
        script: &Script,
        cmd: &Cmd,
    ) -> Result<T, LockError> {
        let mut conn = self.conn()?;
        let error = |e| lock_error(&self.address, e);
        match cmd.query_async(&mut conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                script.load_async(&mut conn).await.map_err(error)?;
                cmd.query_async(&mut conn).await.map_err(error)
            }
            other => other.map_err(error),
        }
    }

    /// [`Node::run`] for a write that grants or extends: with `min_replicas` set, the
    /// `EVALSHA` and a `WAIT` go in one pipeline (see [`crate::replicas`]), and the
    /// second value is the error of too few acknowledgements, for the caller to act on
    /// when the script granted or extended (`None` when enough acknowledged or none
    /// were asked for).
    pub(crate) async fn run_acked<T: FromRedisValue>(
        &self,
        script: &Script,
        cmd: &Cmd,
    ) -> Result<(T, Option<LockError>), LockError> {
        let Some(wait) = self.link.replicas.get() else {
            return Ok((self.run(script, cmd).await?, None));
        };
        let mut pipe = redis::pipe();
        pipe.add_command(cmd.clone());
        wait.append(&mut pipe);
        pipe.ignore_errors();
        let mut conn = self.conn()?;
        let error = |e| lock_error(&self.address, e);
        let mut loaded = false;
        loop {
            let answers: Vec<Value> = pipe.query_async(&mut conn).await.map_err(error)?;
            let [answer, waited] = <[Value; 2]>::try_from(answers)
                .map_err(|answers| unexpected("script and WAIT", &Value::Array(answers)))?;
            if let Value::ServerError(e) = &answer {
                let e = RedisError::from(e.clone());
                if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) && !loaded {
                    // The WAIT waited for nothing of this script, which did not run.
                    script.load_async(&mut conn).await.map_err(error)?;
                    loaded = true;
                    continue;
                }
                return Err(error(e));
            }
            let short = wait.shortfall(&self.address, &waited)?;
            let value =
                T::from_redis_value(answer.clone()).map_err(|_| unexpected("script", &answer))?;
            return Ok((value, short));
        }
    }

    /// Subscribes (once per channel per client) to `names`' release channel; `queued`
    /// is a FIFO waiter's id (see [`Wakeups::watch`]). A node that has not joined yet
    /// gives a ticket without a subscription.
    pub(crate) async fn watch(&self, names: &KeyNames, queued: Option<&str>) -> (WakeTicket, bool) {
        self.link
            .wakeups
            .watch(self.link.conn.get(), &names.channel(), queued)
            .await
    }

    /// Subscribes (once per channel per client) to `channel`, for an unordered
    /// listener (an election's observers); as [`Node::watch`] otherwise.
    pub(crate) async fn watch_channel(&self, channel: &str) -> (WakeTicket, bool) {
        self.link
            .wakeups
            .watch(self.link.conn.get(), channel, None)
            .await
    }

    /// Channels this node's connection currently tracks.
    pub(crate) fn tracked_channels(&self) -> usize {
        self.link.wakeups.tracked()
    }
}

/// What the acquire script's answer says (see [`crate::scripts::ACQUIRE`]): a grant
/// when a string (the fencing token, when `fenced`) or a positive number (unfenced),
/// else held, for `-1 - answer` ms when that is not negative. `None` for anything else.
fn grant_of(answer: &Value, fenced: bool) -> Option<NodeGrant> {
    match answer {
        Value::Int(answer) if *answer > 0 && !fenced => Some(NodeGrant::Granted(None)),
        Value::Int(answer) if *answer <= 0 => {
            let pttl = answer.saturating_neg().saturating_sub(1);
            Some(NodeGrant::Held(
                u64::try_from(pttl).ok().map(Duration::from_millis),
            ))
        }
        other if fenced => Some(NodeGrant::Granted(Some(FencingToken::new(token_of(
            other,
        )?)))),
        _ => None,
    }
}

/// A fencing token a script answered as a string (the mutex counter's, read with
/// `GET`) or a number (the primitives' per-key counters).
fn token_of(answer: &Value) -> Option<u64> {
    match answer {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        Value::SimpleString(text) => text.parse().ok(),
        Value::Int(n) => u64::try_from(*n).ok().filter(|n| *n > 0),
        _ => None,
    }
}

/// The error of a reply distlock does not understand (another program's key of the
/// same name, a server of another kind): the reply is named by its shape only.
fn unexpected(what: &str, answer: &Value) -> LockError {
    LockError::backend_error(
        REDIS_BACKEND,
        format!("unexpected answer to the {what}: {}", shape(answer)),
    )
}

/// A short description of a reply, for errors: its kind and size, no contents.
fn shape(answer: &Value) -> String {
    match answer {
        Value::Nil => "nothing".to_owned(),
        Value::Int(n) => format!("the number {n}"),
        Value::BulkString(bytes) => format!("a string of {} bytes", bytes.len()),
        Value::Array(items) => format!(
            "a list of {}",
            items.iter().map(shape).collect::<Vec<_>>().join(", ")
        ),
        Value::Okay => "OK".to_owned(),
        _ => "a reply of another kind".to_owned(),
    }
}

/// `EVALSHA <sha> <keys…>`, ready for the script's arguments. One command built in
/// place and sized once for the hot path's (at most two) arguments: redis-rs'
/// `ScriptInvocation` copies every key and argument into vectors first, and a growing
/// command reallocates. The FIFO scripts' extra arguments grow it once.
pub(crate) fn evalsha(script: &Script, keys: &[&str]) -> Cmd {
    // Name, hash, key count, keys, then an owner token (32) and a TTL (up to 20 digits).
    let data = 7 + script.get_hash().len() + 2 + keys.iter().map(|k| k.len()).sum::<usize>() + 52;
    let mut cmd = Cmd::with_capacity(3 + keys.len() + 2, data);
    cmd.arg("EVALSHA")
        .arg(script.get_hash())
        .arg(keys.len())
        .arg(keys);
    cmd
}

/// The owner token as stored: 32 lowercase hex digits (as its `Display`), without
/// going through the formatter or the heap.
pub(crate) fn hex(owner: OwnerToken) -> [u8; 32] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let bits = owner.as_u128();
    let mut out = [0u8; 32];
    for (i, digit) in out.iter_mut().enumerate() {
        *digit = DIGITS[((bits >> (124 - 4 * i)) & 0xf) as usize];
    }
    out
}

/// Milliseconds for `PX`/`PEXPIRE`; TTLs are validated to at least 10 ms, so nothing
/// rounds to zero.
pub(crate) fn ttl_millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use distlock_api::backend::prelude::*;

    use super::*;

    #[test]
    fn acquire_answers() {
        let token = Value::BulkString(b"1764410000000001".to_vec());
        assert_eq!(
            grant_of(&token, true),
            Some(NodeGrant::Granted(Some(FencingToken::new(
                1_764_410_000_000_001
            ))))
        );
        assert_eq!(
            grant_of(&Value::Int(1), false),
            Some(NodeGrant::Granted(None))
        );
        // -1 - PTTL: 1234 ms left, none (no expiry).
        assert_eq!(
            grant_of(&Value::Int(-1235), true),
            Some(NodeGrant::Held(Some(Duration::from_millis(1234))))
        );
        assert_eq!(
            grant_of(&Value::Int(-1), true),
            Some(NodeGrant::Held(Some(Duration::ZERO)))
        );
        assert_eq!(grant_of(&Value::Int(0), true), Some(NodeGrant::Held(None)));
        assert!(matches!(
            grant_of(&Value::Int(i64::MIN), false),
            Some(NodeGrant::Held(Some(_)))
        ));
        assert_eq!(grant_of(&Value::BulkString(b"x".to_vec()), true), None);
        assert_eq!(grant_of(&Value::Nil, false), None);
    }

    #[test]
    fn hex_matches_display() {
        for bits in [
            0,
            1,
            0xabc,
            u128::MAX,
            0x0123_4567_89ab_cdef_fedc_ba98_7654_3210,
        ] {
            let owner = OwnerToken::from_u128(bits);
            assert_eq!(hex(owner)[..], *owner.to_string().as_bytes());
        }
    }
}

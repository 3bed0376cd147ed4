//! Following the master of a Sentinel-managed group.
//!
//! At connect the Sentinels are asked (all at once, each bounded by the request
//! timeout) for the master's address (`SENTINEL GET-MASTER-ADDR-BY-NAME`); the address
//! a majority of the listed Sentinels name wins as soon as they have (so a silent
//! Sentinel costs nothing), else the one most answering Sentinels name, and the server
//! there must say it is a master (`ROLE`). Afterwards a background task asks again every
//! [`REFRESH_PERIOD`], and at once when a request fails the way a failover makes it
//! fail (connection lost, timed out, `READONLY` from a demoted master, `MASTERDOWN`,
//! `UNBLOCKED` from one demoted while a `WAIT` waited).
//! When the Sentinels name another master, a connection to it is opened, the
//! client's wake-up channels are subscribed there, and requests go to it from then
//! on; waiters are woken so they retry at once.
//!
//! A request is never repeated on the new master: a request that failed may have been
//! applied, and the layers above (acquire's compensation, the lease rules) already
//! decide what an unknown outcome means.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use distlock_api::connect_retry::{retry_connect, Refused};
use distlock_api::LockError;
use futures_util::stream::{FuturesUnordered, StreamExt};
use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, Pipeline, PushInfo, PushKind, RedisError, RedisFuture,
    RedisResult, ServerErrorKind, Value,
};
use tokio::sync::Notify;

use crate::config::SentinelUrl;
use crate::driver::{driver_client, open_manager_with, PushSink};
use crate::REDIS_BACKEND;

/// How often the Sentinels are asked whether the master moved, when nothing failed.
pub(crate) const REFRESH_PERIOD: Duration = Duration::from_millis(500);

/// The connection to the current master. Clones share it.
#[derive(Clone)]
pub(crate) struct SentinelConn(Arc<State>);

struct State {
    sentinels: Sentinels,
    router: PushSink,
    current: Mutex<Current>,
    /// The channels subscribed through this connection, renewed on a new master.
    channels: Mutex<HashSet<String>>,
    /// Asks the follower task to look now.
    look_now: Arc<Notify>,
}

#[derive(Clone)]
struct Current {
    address: String,
    conn: ConnectionManager,
}

/// The Sentinels of one URL and a connection to each (opened when first needed).
struct Sentinels {
    url: SentinelUrl,
    timeout: Duration,
    conns: Vec<Mutex<Option<MultiplexedConnection>>>,
}

/// Finds the master through the Sentinels of `url` and connects to it, within
/// `timeout` in all; then follows it in the background (see the module docs).
///
/// What may pass is retried with backoff until `timeout` (see
/// [`distlock_api::connect_retry`]): Sentinels or a master refusing connections
/// (restarting), Sentinels that do not know the master yet, a master still loading
/// its dataset or still a replica. The connect then fails with the last reason.
///
/// # Errors
/// At once, [`LockError::Config`] when the master refuses the credentials or
/// database, and [`LockError::Connection`] when every Sentinel refused in a way
/// retrying cannot fix. At the timeout, [`LockError::Config`] when the answering
/// Sentinels still know no master of that name, else [`LockError::Connection`]: no
/// Sentinel answered, or the master they name did not answer or is not a master.
pub(crate) async fn connect(
    url: SentinelUrl,
    timeout: Duration,
    router: PushSink,
) -> Result<SentinelConn, LockError> {
    let sentinels = Sentinels {
        conns: url.sentinels.iter().map(|_| Mutex::new(None)).collect(),
        url,
        timeout,
    };
    let first = retry_connect(
        timeout,
        |_| async {
            let address = sentinels.master_address(None).await?;
            let conn = open_master(&sentinels.url, &address, timeout, router.clone()).await?;
            Ok(Current { address, conn })
        },
        |last| {
            last.unwrap_or_else(|| {
                LockError::connection(
                    REDIS_BACKEND,
                    format!(
                        "the Sentinels ({}) did not lead to an answering master {:?} within the connect timeout of {} ms",
                        sentinels.url.sentinels.join(","),
                        sentinels.url.master_name,
                        timeout.as_millis()
                    ),
                )
            })
        },
    )
    .await?;
    let look_now = Arc::new(Notify::new());
    let state = Arc::new(State {
        sentinels,
        router,
        current: Mutex::new(first),
        channels: Mutex::new(HashSet::new()),
        look_now: look_now.clone(),
    });
    tokio::spawn(follow(Arc::downgrade(&state), look_now));
    Ok(SentinelConn(state))
}

/// The follower task: looks every [`REFRESH_PERIOD`] or when asked, until the
/// connection is dropped.
async fn follow(state: Weak<State>, look_now: Arc<Notify>) {
    loop {
        tokio::select! {
            _ = look_now.notified() => {}
            _ = tokio::time::sleep(REFRESH_PERIOD) => {}
        }
        let Some(state) = state.upgrade() else {
            return;
        };
        state.refresh().await;
    }
}

impl State {
    fn current(&self) -> Current {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Switches to the master the Sentinels name now, if it moved.
    async fn refresh(&self) {
        let now = self.current().address;
        let address = match self.sentinels.master_address(Some(&now)).await {
            Ok(address) if address != now => address,
            Ok(_) => return,
            Err(refused) => {
                let error = LockError::from(refused);
                tracing::debug!(%error, "asking the Sentinels for the master failed");
                return;
            }
        };
        let conn = match open_master(
            &self.sentinels.url,
            &address,
            self.sentinels.timeout,
            self.router.clone(),
        )
        .await
        {
            Ok(conn) => conn,
            Err(refused) => {
                let error = LockError::from(refused);
                tracing::warn!(%error, master = %address, "the Sentinels name a new master that does not answer yet");
                return;
            }
        };
        let channels: Vec<String> = self
            .channels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .cloned()
            .collect();
        for channel in channels {
            // A failure shows when waiters re-subscribe; they poll meanwhile.
            let _ = conn.clone().subscribe(&channel).await;
        }
        tracing::info!(from = %now, to = %address, master = %self.sentinels.url.master_name, "following a Sentinel failover");
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Current { address, conn };
        // Waiters retry at once, on the new master.
        (self.router)(PushInfo {
            kind: PushKind::Disconnection,
            data: Vec::new(),
        });
    }

    /// Asks the follower to look now when `error` is what a failover causes.
    fn after<T>(&self, result: RedisResult<T>) -> RedisResult<T> {
        if let Err(error) = &result {
            if master_may_have_moved(error) {
                self.look_now.notify_one();
            }
        }
        result
    }
}

/// Whether a request failed the way a failover makes it fail.
fn master_may_have_moved(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_timeout()
        || error.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
        || matches!(error.code(), Some("READONLY" | "MASTERDOWN" | "UNBLOCKED"))
}

impl Sentinels {
    /// The master's `host:port` as most answering Sentinels name it (on a tie, `now`
    /// if among them, so a Sentinel lagging behind does not flip the client).
    ///
    /// Stops waiting once a majority of the listed Sentinels agree, so one Sentinel
    /// that does not answer (a partition) costs nothing when the others do.
    ///
    /// # Errors
    /// [`Refused::Passing`] when no Sentinel names a master: those that answer do not
    /// know the name (yet: a Sentinel just started learns it from its configuration or
    /// a `SENTINEL MONITOR`; for a misspelt name this is a [`LockError::Config`] once
    /// the connect timeout is spent), or they are unreachable for now;
    /// [`Refused::Lasting`] when every Sentinel refused in a way retrying cannot fix
    /// (a password it wants, TLS on one side only, not a Sentinel).
    async fn master_address(&self, now: Option<&str>) -> Result<String, Refused> {
        let mut asking: FuturesUnordered<_> = (0..self.conns.len())
            .map(|i| async move { (i, self.ask(i).await) })
            .collect();
        let majority = self.conns.len() / 2 + 1;
        let mut votes: HashMap<String, usize> = HashMap::new();
        let (mut unknown, mut failures) = (Vec::new(), Vec::new());
        let mut lasting_failures = 0;
        while let Some((i, answer)) = asking.next().await {
            let sentinel = self.url.sentinels[i].as_str();
            match answer {
                Ok(Some(address)) => {
                    let count = votes.entry(address.clone()).or_default();
                    *count += 1;
                    if *count >= majority {
                        return Ok(address);
                    }
                }
                Ok(None) => {
                    unknown.push(sentinel);
                    if unknown.len() >= majority {
                        break;
                    }
                }
                Err(Asked { words, lasting }) => {
                    failures.push(format!("{sentinel}: {words}"));
                    lasting_failures += usize::from(lasting);
                }
            }
        }
        let most = votes.values().copied().max().unwrap_or(0);
        if most > 0 {
            let mut leaders: Vec<String> = votes
                .into_iter()
                .filter(|(_, n)| *n == most)
                .map(|(address, _)| address)
                .collect();
            leaders.sort();
            let pick = match now {
                Some(now) if leaders.iter().any(|a| a == now) => now.to_owned(),
                _ => leaders.swap_remove(0),
            };
            return Ok(pick);
        }
        let name = &self.url.master_name;
        if !unknown.is_empty() {
            return Err(Refused::Passing(LockError::config(
                REDIS_BACKEND,
                format!(
                    "the Sentinels ({}) know no master named {name:?}{}",
                    unknown.join(","),
                    if failures.is_empty() {
                        String::new()
                    } else {
                        format!("; others did not answer: {}", failures.join("; "))
                    }
                ),
            )));
        }
        let error = LockError::connection(
            REDIS_BACKEND,
            format!(
                "no Sentinel answered for master {name:?}: {}",
                failures.join("; ")
            ),
        );
        Err(if lasting_failures == self.conns.len() {
            Refused::Lasting(error)
        } else {
            Refused::Passing(error)
        })
    }

    /// Sentinel `i`'s answer: the master's `host:port`, or `None` when it does not
    /// know the name.
    async fn ask(&self, i: usize) -> Result<Option<String>, Asked> {
        let address = &self.url.sentinels[i];
        let cached = self.conns[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut conn = match cached {
            Some(conn) => conn,
            None => {
                let conn = self.open(address).await?;
                *self.conns[i].lock().unwrap_or_else(PoisonError::into_inner) = Some(conn.clone());
                conn
            }
        };
        let asked = tokio::time::timeout(
            self.timeout,
            redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(&self.url.master_name)
                .query_async::<Option<(String, String)>>(&mut conn),
        )
        .await;
        match asked {
            Ok(Ok(reply)) => Ok(reply.map(|(host, port)| format!("{host}:{port}"))),
            Ok(Err(error)) => {
                *self.conns[i].lock().unwrap_or_else(PoisonError::into_inner) = None;
                Err(Asked::from(error))
            }
            Err(_) => {
                *self.conns[i].lock().unwrap_or_else(PoisonError::into_inner) = None;
                Err(Asked {
                    words: format!("no answer within {} ms", self.timeout.as_millis()),
                    lasting: false,
                })
            }
        }
    }

    async fn open(&self, address: &str) -> Result<MultiplexedConnection, Asked> {
        let client = redis::Client::open(self.url.sentinel_url(address)).map_err(|_| Asked {
            words: "invalid Sentinel address".to_owned(),
            lasting: true,
        })?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(Asked::from)
    }
}

/// Why a Sentinel gave no master address: the cause in words, and whether retrying
/// cannot fix it (anything but a refused or silent port and a "try again" reply).
struct Asked {
    words: String,
    lasting: bool,
}

impl From<RedisError> for Asked {
    fn from(error: RedisError) -> Asked {
        let passing = error.is_connection_refusal()
            || error.is_timeout()
            || crate::error::is_transient(&error);
        let words = if error.is_connection_refusal() {
            "connection refused".to_owned()
        } else if error.is_timeout() {
            "timed out".to_owned()
        } else {
            distlock_api::in_words(&error)
        };
        Asked {
            words,
            lasting: !passing,
        }
    }
}

/// Connects to the master at `address` and checks it says it is one.
///
/// # Errors
/// As [`crate::node::Node::open_once`]; a server that says it is a replica (a
/// failover under way) may pass.
async fn open_master(
    url: &SentinelUrl,
    address: &str,
    timeout: Duration,
    router: PushSink,
) -> Result<ConnectionManager, Refused> {
    let (client, address, db) =
        driver_client(&url.master_url(address)).map_err(Refused::Lasting)?;
    let mut conn = open_manager_with(&client, timeout, router)
        .await
        .map_err(|e| crate::error::connect_refused(&address, db, e))?;
    let role: RedisResult<Vec<Value>> = redis::cmd("ROLE").query_async(&mut conn).await;
    match role.as_deref() {
        Ok([Value::BulkString(role), ..]) if role.as_slice() != b"master" => {
            Err(Refused::Passing(LockError::connection_at(
                REDIS_BACKEND,
                &address,
                format!(
                    "the Sentinels name it master {:?}, but it is a {} (a failover is under way?)",
                    url.master_name,
                    String::from_utf8_lossy(role)
                ),
            )))
        }
        // An ACL user without ROLE: trust the Sentinels.
        Ok(_) | Err(_) => Ok(conn),
    }
}

impl SentinelConn {
    /// Subscribes on the current master and on every later one.
    pub(crate) async fn subscribe(&mut self, channel: &str) -> RedisResult<()> {
        self.0
            .channels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(channel.to_owned());
        let result = self.0.current().conn.subscribe(channel).await;
        self.0.after(result)
    }

    /// Unsubscribes on the current master.
    pub(crate) async fn unsubscribe(&mut self, channel: &str) -> RedisResult<()> {
        self.0
            .channels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(channel);
        self.0.current().conn.unsubscribe(channel).await
    }

    /// `host:port` of the master requests go to now.
    pub(crate) fn master(&self) -> String {
        self.0.current().address
    }
}

impl ConnectionLike for SentinelConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let result = self.0.current().conn.req_packed_command(cmd).await;
            self.0.after(result)
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let result = self
                .0
                .current()
                .conn
                .req_packed_commands(pipeline, offset, count)
                .await;
            self.0.after(result)
        })
    }

    fn get_db(&self) -> i64 {
        self.0.sentinels.url.db
    }
}

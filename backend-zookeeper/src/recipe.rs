//! The lock recipe's building blocks: creating a contender node (or finding it again
//! after a lost connection), and removing an abandoned one in the background.

use std::sync::Arc;
use std::time::Duration;

use distlock_api::{Backoff, OwnerToken};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::error::{within, Fail};
use crate::keys::{contender_prefix, protected_prefix, rank_kind, NodeKind};
use crate::session::Session;

/// Contender nodes: ephemeral and sequential, with the session's ACL (open, as
/// Curator's default, unless the client authenticates: see `security::node_acls`).
fn contender(session: &Session) -> zk::CreateOptions<'static> {
    zk::CreateMode::EphemeralSequential.with_acls(session.acls)
}

/// Lock directories and their ancestors: container nodes, which the server deletes
/// once they have had children and have none left; with the session's ACL.
fn directory(session: &Session) -> zk::CreateOptions<'static> {
    zk::CreateMode::Container.with_acls(session.acls)
}

/// How often a create is retried after a missing parent or a lost connection.
const CREATE_TRIES: usize = 4;

/// A contender node we created.
#[derive(Debug)]
pub(crate) struct Created {
    /// Its name within the lock directory.
    pub name: String,
    /// Its `czxid`.
    pub fence: i64,
    /// The directory's children right after the create, if that read succeeded.
    pub listing: Option<Vec<String>>,
    /// When the requests that produced this were sent.
    pub sent: Instant,
}

/// Creates `owner`'s contender node in `dir`.
///
/// The fast path is one multi transaction: create the node, and touch the directory
/// (an empty `setData`). The directory's returned `Stat` tells how many children it
/// has right after our create (one: we hold the lock, no listing needed) and its
/// `mzxid`, the transaction's zxid, which is our node's `czxid` (the create's own
/// `Stat` inside a multi is not reliable before ZooKeeper 3.8.2, ZOOKEEPER-4026). If
/// the directory cannot be written (its ACL), a plain create is pipelined with a
/// listing instead: the client sends a session's requests in order and the server
/// answers them in order, so the listing includes the new node.
///
/// Missing directories are created as containers. After a lost connection the node
/// is looked for by its GUID before another is created. `Ok(None)`: the session ended.
/// The node is named for `kind` and holds `data` (empty but for semaphore leases).
pub(crate) async fn create_contender(
    session: &Session,
    dir: &str,
    owner: OwnerToken,
    kind: NodeKind,
    data: &[u8],
    limit: Duration,
) -> Result<Option<Created>, Fail> {
    let prefix = contender_prefix(owner, kind);
    let create_path = format!("{dir}/{prefix}");
    let mut touch_dir = true;
    let mut tries = 0;
    loop {
        tries += 1;
        let sent = Instant::now();
        let attempt = if touch_dir {
            create_touching(session, dir, &create_path, data, limit).await
        } else {
            create_listing(session, dir, &create_path, &prefix, data, limit).await
        };
        match attempt {
            Ok(mut created) => {
                created.sent = sent;
                return Ok(Some(created));
            }
            Err(Attempt::CannotTouch) if touch_dir => touch_dir = false,
            Err(Attempt::Failed(fail)) if fail.session_ended() => return Ok(None),
            Err(Attempt::Failed(fail)) if fail.is_no_node() && tries < CREATE_TRIES => {
                within(limit, session.client.mkdir(dir, &directory(session))).await?;
            }
            Err(Attempt::Failed(fail)) if fail.is_connection_loss() && tries < CREATE_TRIES => {
                // The create may have been applied before the connection dropped.
                if let Some((name, fence)) = find_own(session, dir, owner, kind, limit).await? {
                    return Ok(Some(Created {
                        name,
                        fence,
                        listing: None,
                        sent,
                    }));
                }
            }
            Err(Attempt::Failed(fail)) => return Err(fail),
            Err(Attempt::CannotTouch) => {
                return Err(Fail::Zk(zk::Error::UnexpectedError(
                    "the lock directory refused a write after a plain create".into(),
                )))
            }
        }
    }
}

/// Why one create attempt did not produce a node.
enum Attempt {
    Failed(Fail),
    /// The `setData` on the directory was refused (not the create): use a plain create.
    CannotTouch,
}

fn unexpected(what: &str) -> Attempt {
    Attempt::Failed(Fail::Zk(zk::Error::UnexpectedError(format!(
        "unexpected multi reply: {what}"
    ))))
}

/// `multi(create contender, setData dir)`.
async fn create_touching(
    session: &Session,
    dir: &str,
    create_path: &str,
    data: &[u8],
    limit: Duration,
) -> Result<Created, Attempt> {
    let mut writer = session.client.new_multi_writer();
    writer
        .add_create(create_path, data, &contender(session))
        .and_then(|()| writer.add_set_data(dir, &[], None))
        .map_err(|e| Attempt::Failed(Fail::Zk(e)))?;
    let results = match tokio::time::timeout(limit, writer.commit()).await {
        Err(_) => return Err(Attempt::Failed(Fail::TimedOut(limit))),
        Ok(Ok(results)) => results,
        Ok(Err(zk::MultiWriteError::OperationFailed { index: 1, source }))
            if source != zk::Error::NoNode =>
        {
            tracing::debug!(%dir, %source, "cannot touch the lock directory; plain creates");
            return Err(Attempt::CannotTouch);
        }
        Ok(Err(error)) => return Err(Attempt::Failed(Fail::Zk(error.into()))),
    };
    let mut results = results.into_iter();
    let (
        Some(zk::MultiWriteResult::Create { path, .. }),
        Some(zk::MultiWriteResult::SetData { stat }),
    ) = (results.next(), results.next())
    else {
        return Err(unexpected("not [create, setData]"));
    };
    let name = path
        .strip_prefix(dir)
        .and_then(|rest| rest.strip_prefix('/'))
        .ok_or_else(|| unexpected("created outside the lock directory"))?
        .to_owned();
    // Alone in the directory: that is the whole listing.
    let listing = (stat.num_children == 1).then(|| vec![name.clone()]);
    Ok(Created {
        name,
        fence: stat.mzxid,
        listing,
        sent: Instant::now(),
    })
}

/// A plain create, with a listing pipelined behind it.
async fn create_listing(
    session: &Session,
    dir: &str,
    create_path: &str,
    prefix: &str,
    data: &[u8],
    limit: Duration,
) -> Result<Created, Attempt> {
    let options = contender(session);
    let create = session.client.create(create_path, data, &options);
    let list = session.client.list_children(dir);
    let (created, listed) =
        match tokio::time::timeout(limit, async { tokio::join!(create, list) }).await {
            Ok(replies) => replies,
            Err(_) => return Err(Attempt::Failed(Fail::TimedOut(limit))),
        };
    let (stat, sequence) = created.map_err(|e| Attempt::Failed(Fail::Zk(e)))?;
    Ok(Created {
        name: format!("{prefix}{sequence}"),
        fence: stat.czxid,
        listing: listed.ok(),
        sent: Instant::now(),
    })
}

/// `owner`'s contender node in `dir`, found by its GUID, with its `czxid`. Should a
/// retried create have made two, the later ones are deleted.
async fn find_own(
    session: &Session,
    dir: &str,
    owner: OwnerToken,
    kind: NodeKind,
    limit: Duration,
) -> Result<Option<(String, i64)>, Fail> {
    let mine = protected_prefix(owner);
    let children = match within(limit, session.client.list_children(dir)).await {
        Ok(children) => children,
        Err(fail) if fail.is_no_node() => return Ok(None),
        Err(fail) => return Err(fail),
    };
    let ours: Vec<&str> = rank_kind(&children, kind)
        .into_iter()
        .map(|(_, name)| name)
        .filter(|name| name.starts_with(&mine))
        .collect();
    let Some((first, extra)) = ours.split_first() else {
        return Ok(None);
    };
    for name in extra {
        match within(limit, session.client.delete(&format!("{dir}/{name}"), None)).await {
            Ok(()) => {}
            Err(fail) if fail.is_no_node() => {}
            Err(fail) => return Err(fail),
        }
    }
    match within(limit, session.client.check_stat(&format!("{dir}/{first}"))).await? {
        Some(stat) => Ok(Some(((*first).to_owned(), stat.czxid))),
        None => Ok(None),
    }
}

/// Deletes every node of one contender (`_c_<guid>-…`) in `dir`.
pub(crate) async fn remove_own(
    client: &zk::Client,
    dir: &str,
    mine: &str,
    limit: Duration,
) -> Result<bool, Fail> {
    let children = match within(limit, client.list_children(dir)).await {
        Ok(children) => children,
        Err(fail) if fail.is_no_node() => return Ok(false),
        Err(fail) => return Err(fail),
    };
    let mut removed = false;
    for name in children.iter().filter(|name| name.starts_with(mine)) {
        match within(limit, client.delete(&format!("{dir}/{name}"), None)).await {
            Ok(()) => removed = true,
            Err(fail) if fail.is_no_node() => {}
            Err(fail) => return Err(fail),
        }
    }
    Ok(removed)
}

/// Deletes `mine`'s nodes in `dir` like [`remove_own`], retrying (with backoff) while
/// the outcome is uncertain and the session lives: the client fails a request in
/// flight when its connection drops and does not resend it, so such a delete may not
/// have been applied. Requests sent while the client reconnects go out once it has.
///
/// `Ok(removed)` once a listing showed none of `mine`'s nodes left (`removed`: this
/// call deleted one). Gives up with the last error on a definite failure, when the
/// session ends (its ephemeral nodes go with it), or when `until` passes.
pub(crate) async fn remove_own_retrying(
    session: &Session,
    dir: &str,
    mine: &str,
    limit: Duration,
    until: Option<Instant>,
) -> Result<bool, Fail> {
    let mut delays = Backoff::new(Duration::from_millis(10), Duration::from_secs(1)).delays();
    loop {
        let attempt = remove_own(&session.client, dir, mine, limit);
        let result = match until {
            Some(until) => tokio::time::timeout_at(until, attempt)
                .await
                .unwrap_or(Err(Fail::TimedOut(limit))),
            None => attempt.await,
        };
        match result {
            Err(fail) if fail.is_uncertain() && session.is_alive() => {
                let pause = delays.next_delay();
                if until.is_some_and(|until| Instant::now() + pause >= until) {
                    return Err(fail);
                }
                tokio::time::sleep(pause).await;
            }
            done => return done,
        }
    }
}

/// Until disarmed, dropping this removes the contender's node(s) in the background:
/// the cancel-safety of acquire, and what keeps a release that failed (or was dropped)
/// from leaving the lock held by a session that lives on.
///
/// The removal lists the directory through the same session, after the create (or
/// delete) was sent, so it sees a create that was still in flight. It retries through
/// connection trouble (with backoff) until it succeeds or the session ends, which
/// removes the ephemeral nodes anyway.
#[derive(Debug)]
pub(crate) struct Cleanup {
    session: Option<Arc<Session>>,
    dir: String,
    mine: String,
    limit: Duration,
}

impl Cleanup {
    pub(crate) fn new(
        session: Arc<Session>,
        dir: &str,
        owner: OwnerToken,
        limit: Duration,
    ) -> Self {
        Cleanup {
            session: Some(session),
            dir: dir.to_owned(),
            mine: protected_prefix(owner),
            limit,
        }
    }

    /// The node is granted or known to be gone: nothing to clean up.
    pub(crate) fn disarm(&mut self) {
        self.session = None;
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        // On the session's runtime, wherever the drop happens, counted so that a
        // program exiting right after can let it finish: should that runtime shut down
        // first, the task never runs, and the session is closed instead.
        let runtime = session.runtime.clone();
        let (dir, mine, limit) = (
            std::mem::take(&mut self.dir),
            std::mem::take(&mut self.mine),
            self.limit,
        );
        distlock_api::backend::spawn_cleanup(&runtime, async move {
            if !session.is_alive() {
                return;
            }
            match remove_own_retrying(&session, &dir, &mine, limit, None).await {
                Ok(_) => {}
                Err(fail) if fail.session_ended() || !session.is_alive() => {}
                Err(fail) => {
                    tracing::warn!(%dir, ?fail, "could not remove an abandoned contender node; it lives until the session ends");
                }
            }
        });
    }
}

//! The requests of etcd's `concurrency.Mutex` recipe, each bounded by the request
//! timeout: grant a lease, put a contender under it unless its key exists, find the
//! contender just before ours, wait for a key's deletion, keep a lease alive, revoke it.

use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, DeleteOptions, EventType, GetOptions, KeyValue, LeaseGrantOptions,
    PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, WatchFilterType, WatchOptions,
};

use crate::error::{sent, within, Fail};
use crate::keys::prefix_end;

/// The etcd requests of one client.
#[derive(Clone)]
pub(crate) struct Requests {
    pub(crate) client: Client,
    pub(crate) timeout: Duration,
}

/// What putting our contender found.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Placed {
    /// Our key's create revision: our place in the queue, and the fencing token.
    pub(crate) revision: i64,
    /// Whether ours is the oldest contender (we hold the lock).
    pub(crate) first: bool,
}

/// What looking behind our contender found.
#[derive(Debug)]
pub(crate) enum Turn {
    /// No older contender: ours holds the lock.
    Ours,
    /// The youngest older contender's key.
    After(Vec<u8>),
    /// Our own key is gone (its lease expired or was revoked, or it was deleted).
    Gone,
}

impl Requests {
    /// Runs one transaction.
    async fn txn(&self, txn: Txn) -> Result<etcd_client::TxnResponse, Fail> {
        sent(self.timeout, || {
            let (mut kv, txn) = (self.client.kv_client(), txn.clone());
            async move { kv.txn(txn).await }
        })
        .await
    }

    /// Grants lease `id` for `ttl_secs`; returns the TTL the server granted (which may
    /// be longer: etcd raises TTLs below its minimum).
    pub(crate) async fn grant(&self, id: i64, ttl_secs: i64) -> Result<i64, Fail> {
        let granted = sent(self.timeout, || {
            let mut lease = self.client.lease_client();
            async move {
                lease
                    .grant(ttl_secs, Some(LeaseGrantOptions::new().with_id(id)))
                    .await
            }
        })
        .await?;
        Ok(granted.ttl())
    }

    /// Revokes lease `id` (its keys go with it); `Ok(false)` if it did not exist.
    pub(crate) async fn revoke(&self, id: i64) -> Result<bool, Fail> {
        let revoked = sent(self.timeout, || {
            let mut lease = self.client.lease_client();
            async move { lease.revoke(id).await }
        });
        match revoked.await {
            Ok(_) => Ok(true),
            Err(fail) if fail.is_lease_not_found() => Ok(false),
            Err(fail) => Err(fail),
        }
    }

    /// One keep-alive of lease `id`; [`Fail::is_lease_not_found`] when it is gone.
    pub(crate) async fn keep_alive(&self, id: i64) -> Result<(), Fail> {
        sent(self.timeout, || {
            let mut lease = self.client.lease_client();
            async move { lease.keep_alive(id).await }
        })
        .await
        .map(drop)
    }

    /// Puts `key` with `value` (empty for a lock, the candidate for an election) under
    /// `lease` unless it exists, and in the same transaction reads the oldest
    /// contender of `lock_prefix`.
    pub(crate) async fn place(
        &self,
        lock_prefix: &str,
        key: &str,
        value: &[u8],
        lease: i64,
    ) -> Result<Placed, Fail> {
        let oldest = GetOptions::new()
            .with_range(prefix_end(lock_prefix))
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1)
            .with_keys_only();
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(key, value, Some(PutOptions::new().with_lease(lease))),
                TxnOp::get(lock_prefix, Some(oldest.clone())),
            ])
            .or_else([TxnOp::get(key, None), TxnOp::get(lock_prefix, Some(oldest))]);
        let response = self.txn(txn).await?;
        let responses = response.op_responses();
        let revision = if response.succeeded() {
            response.header().map_or(0, |h| h.revision())
        } else {
            // The key exists already: an earlier attempt's put was applied.
            first_kv(responses.first()).map_or(0, KeyValue::create_revision)
        };
        let oldest_kv = first_kv(responses.get(1));
        let oldest = oldest_kv.map_or(0, KeyValue::create_revision);
        if let Some(kv) = oldest_kv.filter(|_| oldest != revision) {
            contender_shape(lock_prefix, kv)?;
        }
        if revision <= 0 {
            return Err(Fail::Etcd(etcd_client::Error::Internal(
                "etcd's answer to the contender put carried no revision".into(),
            )));
        }
        Ok(Placed {
            revision,
            first: oldest == revision,
        })
    }

    /// Looks for the youngest contender of `lock_prefix` older than `revision` (ours),
    /// and checks that our `key` still exists, in one transaction.
    pub(crate) async fn turn(
        &self,
        lock_prefix: &str,
        key: &str,
        revision: i64,
    ) -> Result<Turn, Fail> {
        let before = GetOptions::new()
            .with_range(prefix_end(lock_prefix))
            .with_max_create_revision(revision - 1)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(1)
            .with_keys_only();
        let txn = Txn::new().and_then([
            TxnOp::get(lock_prefix, Some(before)),
            TxnOp::get(key, Some(GetOptions::new().with_keys_only())),
        ]);
        let response = self.txn(txn).await?;
        let responses = response.op_responses();
        if first_kv(responses.get(1)).is_none_or(|kv| kv.create_revision() != revision) {
            return Ok(Turn::Gone);
        }
        Ok(match first_kv(responses.first()) {
            None => Turn::Ours,
            Some(older) => {
                contender_shape(lock_prefix, older)?;
                Turn::After(older.key().to_vec())
            }
        })
    }

    /// [`Requests::turn`], and when the turn is ours, moves our `key` to lease `lease`
    /// in the same transaction (keeping its create revision and value): a granted
    /// waiter's one round trip instead of a look and a move.
    pub(crate) async fn turn_and_move(
        &self,
        lock_prefix: &str,
        key: &str,
        revision: i64,
        lease: i64,
    ) -> Result<Turn, Fail> {
        let before = GetOptions::new()
            .with_range(prefix_end(lock_prefix))
            .with_max_create_revision(revision - 1)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(1)
            .with_keys_only();
        // Ours while our key is there and no contender is older than it: every key of
        // the range was created at our revision or later (a range compare, etcd 3.3+).
        let txn = Txn::new()
            .when([
                Compare::create_revision(key, CompareOp::Equal, revision),
                Compare::create_revision(lock_prefix, CompareOp::Greater, revision - 1)
                    .with_range(prefix_end(lock_prefix)),
            ])
            .and_then([TxnOp::put(
                key,
                "",
                Some(PutOptions::new().with_lease(lease).with_ignore_value()),
            )])
            .or_else([
                TxnOp::get(lock_prefix, Some(before)),
                TxnOp::get(key, Some(GetOptions::new().with_keys_only())),
            ]);
        let response = self.txn(txn).await?;
        if response.succeeded() {
            return Ok(Turn::Ours);
        }
        let responses = response.op_responses();
        if first_kv(responses.get(1)).is_none_or(|kv| kv.create_revision() != revision) {
            return Ok(Turn::Gone);
        }
        match first_kv(responses.first()) {
            Some(older) => Ok(Turn::After(older.key().to_vec())),
            // The compare held then: not an answer etcd gives.
            None => Err(Fail::Etcd(etcd_client::Error::Internal(
                "etcd refused the turn transaction's compare yet found no older contender".into(),
            ))),
        }
    }

    /// Resolves once `key` is deleted (at once if it is gone already). Not bounded by
    /// the request timeout: it waits for as long as the key lives. Errors when the watch
    /// cannot be made or breaks.
    ///
    /// The watch starts at the current revision, and the key is looked at once the
    /// watch is in place, so a deletion in between is not missed. (A watch from an
    /// older revision would be served by etcd's catch-up loop, which runs every 100 ms:
    /// under contention most hand-offs would wait for it.)
    pub(crate) async fn deleted(&self, key: Vec<u8>) -> Result<(), Fail> {
        let watch = self.client.watch_client();
        let options = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
        let mut stream = sent(self.timeout, || {
            let (mut watch, key, options) = (watch.clone(), key.clone(), options.clone());
            async move { watch.watch(key, Some(options)).await }
        })
        .await?;
        let mut looked = false;
        loop {
            let message = if looked {
                stream.message().await.map_err(Fail::Etcd)
            } else {
                within(self.timeout, stream.message()).await
            };
            match message? {
                Some(response) => {
                    if response.canceled()
                        || response
                            .events()
                            .iter()
                            .any(|e| e.event_type() == EventType::Delete)
                    {
                        return Ok(());
                    }
                    if response.created() && !looked {
                        looked = true;
                        let found =
                            sent(self.timeout, || {
                                let (mut kv, key) = (self.client.kv_client(), key.clone());
                                async move {
                                    kv.get(key, Some(GetOptions::new().with_count_only())).await
                                }
                            })
                            .await?;
                        if found.count() == 0 {
                            return Ok(());
                        }
                    }
                }
                None => {
                    return Err(Fail::Etcd(etcd_client::Error::WatchError(
                        "the watch stream ended".into(),
                    )))
                }
            }
        }
    }

    /// Deletes `key` if its create revision is `revision`; returns the deleted key's
    /// lease, or, when it was not ours, whether any contender holds `lock_prefix`.
    pub(crate) async fn delete_own(
        &self,
        lock_prefix: &str,
        key: &str,
        revision: i64,
    ) -> Result<Result<i64, bool>, Fail> {
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, revision)])
            .and_then([TxnOp::delete(
                key,
                Some(DeleteOptions::new().with_prev_key()),
            )])
            .or_else([TxnOp::get(
                lock_prefix,
                Some(
                    GetOptions::new()
                        .with_range(prefix_end(lock_prefix))
                        .with_limit(1)
                        .with_keys_only(),
                ),
            )]);
        let response = self.txn(txn).await?;
        let responses = response.op_responses();
        if response.succeeded() {
            let lease = match responses.first() {
                Some(TxnOpResponse::Delete(deleted)) => {
                    deleted.prev_kvs().first().map_or(0, KeyValue::lease)
                }
                _ => 0,
            };
            Ok(Ok(lease))
        } else {
            Ok(Err(first_kv(responses.first()).is_some()))
        }
    }

    /// Our key if it still exists with create revision `revision`; else whether any
    /// contender holds `lock_prefix`.
    pub(crate) async fn own_key(
        &self,
        lock_prefix: &str,
        key: &str,
        revision: i64,
    ) -> Result<Result<KeyValue, bool>, Fail> {
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, revision)])
            .and_then([TxnOp::get(key, None)])
            .or_else([TxnOp::get(
                lock_prefix,
                Some(
                    GetOptions::new()
                        .with_range(prefix_end(lock_prefix))
                        .with_limit(1)
                        .with_keys_only(),
                ),
            )]);
        let response = self.txn(txn).await?;
        let responses = response.op_responses();
        match (response.succeeded(), first_kv(responses.first())) {
            (true, Some(kv)) => Ok(Ok(kv.clone())),
            (true, None) => Ok(Err(false)),
            (false, found) => Ok(Err(found.is_some())),
        }
    }

    /// Moves `key` (if its create revision is still `revision`) to lease `lease`,
    /// keeping its create revision and its value; else whether any contender holds
    /// `lock_prefix`.
    pub(crate) async fn move_to_lease(
        &self,
        lock_prefix: &str,
        key: &str,
        revision: i64,
        lease: i64,
    ) -> Result<Result<(), bool>, Fail> {
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, revision)])
            .and_then([TxnOp::put(
                key,
                "",
                Some(PutOptions::new().with_lease(lease).with_ignore_value()),
            )])
            .or_else([TxnOp::get(
                lock_prefix,
                Some(
                    GetOptions::new()
                        .with_range(prefix_end(lock_prefix))
                        .with_limit(1)
                        .with_keys_only(),
                ),
            )]);
        let response = self.txn(txn).await?;
        if response.succeeded() {
            Ok(Ok(()))
        } else {
            Ok(Err(first_kv(response.op_responses().first()).is_some()))
        }
    }

    /// The oldest contender of `lock_prefix`, how many there are, and the remaining TTL
    /// of the oldest's lease in seconds (when it has one).
    pub(crate) async fn oldest(
        &self,
        lock_prefix: &str,
    ) -> Result<Option<(KeyValue, i64, Option<i64>)>, Fail> {
        let options = GetOptions::new()
            .with_range(prefix_end(lock_prefix))
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let response = sent(self.timeout, || {
            let (mut kv, options) = (self.client.kv_client(), options.clone());
            async move { kv.get(lock_prefix, Some(options)).await }
        })
        .await?;
        let Some(oldest) = response.kvs().first().cloned() else {
            return Ok(None);
        };
        let remaining = if oldest.lease() != 0 {
            let mut lease = self.client.lease_client();
            within(self.timeout, lease.time_to_live(oldest.lease(), None))
                .await
                .ok()
                .map(|r| r.ttl())
                .filter(|ttl| *ttl >= 0)
        } else {
            None
        };
        Ok(Some((oldest, response.count(), remaining)))
    }
}

/// Checks that `kv`, a key ranked ahead of ours in `lock_prefix`, has the shape of a
/// contender of etcd's `concurrency.Mutex` recipe: named by a lease id in lowercase
/// hex (distlock's, `etcdctl lock`'s, a Go service's) and attached to a lease, so that
/// it goes when its holder releases or dies. Anything else (another name, a deeper
/// path, a key without a lease, which would never go) is data of another tool under
/// this prefix: waiting behind it could last forever, so the acquire fails with
/// [`Fail::Foreign`] instead.
fn contender_shape(lock_prefix: &str, kv: &KeyValue) -> Result<(), Fail> {
    let name = kv
        .key()
        .strip_prefix(lock_prefix.as_bytes())
        .unwrap_or(kv.key());
    let hex = !name.is_empty()
        && name.len() <= 16
        && name
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b));
    if hex && kv.lease() != 0 {
        Ok(())
    } else {
        Err(Fail::Foreign(
            String::from_utf8_lossy(kv.key())
                .chars()
                .take(200)
                .collect(),
        ))
    }
}

/// The first key of a range response inside a transaction.
fn first_kv(response: Option<&TxnOpResponse>) -> Option<&KeyValue> {
    match response {
        Some(TxnOpResponse::Get(get)) => get.kvs().first(),
        _ => None,
    }
}

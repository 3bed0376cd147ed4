//! The requests of etcd's `concurrency.Mutex` recipe, each bounded by the request
//! timeout: grant a lease, put a contender under it unless its key exists, find the
//! contender just before ours, wait for a key's deletion, keep a lease alive, revoke it.

use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, DeleteOptions, EventType, GetOptions, KeyValue, LeaseGrantOptions,
    PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, WatchFilterType, WatchOptions,
};

use crate::error::{within, Fail};
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
    /// The youngest older contender's key, and the revision to watch it from.
    After(Vec<u8>, i64),
    /// Our own key is gone (its lease expired or was revoked, or it was deleted).
    Gone,
}

impl Requests {
    /// Grants lease `id` for `ttl_secs`; returns the TTL the server granted (which may
    /// be longer: etcd raises TTLs below its minimum).
    pub(crate) async fn grant(&self, id: i64, ttl_secs: i64) -> Result<i64, Fail> {
        let mut lease = self.client.lease_client();
        let granted = within(
            self.timeout,
            lease.grant(ttl_secs, Some(LeaseGrantOptions::new().with_id(id))),
        )
        .await?;
        Ok(granted.ttl())
    }

    /// Revokes lease `id` (its keys go with it); `Ok(false)` if it did not exist.
    pub(crate) async fn revoke(&self, id: i64) -> Result<bool, Fail> {
        let mut lease = self.client.lease_client();
        match within(self.timeout, lease.revoke(id)).await {
            Ok(_) => Ok(true),
            Err(fail) if fail.is_lease_not_found() => Ok(false),
            Err(fail) => Err(fail),
        }
    }

    /// One keep-alive of lease `id`; [`Fail::is_lease_not_found`] when it is gone.
    pub(crate) async fn keep_alive(&self, id: i64) -> Result<(), Fail> {
        let mut lease = self.client.lease_client();
        within(self.timeout, lease.keep_alive(id)).await.map(drop)
    }

    /// Puts `key` (empty value) under `lease` unless it exists, and in the same
    /// transaction reads the oldest contender of `lock_prefix`.
    pub(crate) async fn place(
        &self,
        lock_prefix: &str,
        key: &str,
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
                TxnOp::put(key, "", Some(PutOptions::new().with_lease(lease))),
                TxnOp::get(lock_prefix, Some(oldest.clone())),
            ])
            .or_else([TxnOp::get(key, None), TxnOp::get(lock_prefix, Some(oldest))]);
        let mut kv = self.client.kv_client();
        let response = within(self.timeout, kv.txn(txn)).await?;
        let responses = response.op_responses();
        let revision = if response.succeeded() {
            response.header().map_or(0, |h| h.revision())
        } else {
            // The key exists already: an earlier attempt's put was applied.
            first_kv(responses.first()).map_or(0, KeyValue::create_revision)
        };
        let oldest = first_kv(responses.get(1)).map_or(0, KeyValue::create_revision);
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
        let mut kv = self.client.kv_client();
        let response = within(self.timeout, kv.txn(txn)).await?;
        let at = response.header().map_or(0, |h| h.revision());
        let responses = response.op_responses();
        if first_kv(responses.get(1)).is_none_or(|kv| kv.create_revision() != revision) {
            return Ok(Turn::Gone);
        }
        Ok(match first_kv(responses.first()) {
            None => Turn::Ours,
            Some(older) => Turn::After(older.key().to_vec(), at + 1),
        })
    }

    /// Resolves once `key` is deleted at or after revision `from` (at once if it was
    /// deleted in between). Not bounded by the request timeout: it waits for as long
    /// as the key lives. Errors when the watch cannot be made or breaks.
    pub(crate) async fn deleted(&self, key: Vec<u8>, from: i64) -> Result<(), Fail> {
        let mut watch = self.client.watch_client();
        let options = WatchOptions::new()
            .with_start_revision(from)
            .with_filters([WatchFilterType::NoPut]);
        let mut stream = within(self.timeout, watch.watch(key, Some(options))).await?;
        loop {
            match stream.message().await {
                Ok(Some(response)) => {
                    // A compacted start revision: the deletion may be in the lost part
                    // of the history, so let the caller look again.
                    if response.compact_revision() > 0 || response.canceled() {
                        return Ok(());
                    }
                    if response
                        .events()
                        .iter()
                        .any(|e| e.event_type() == EventType::Delete)
                    {
                        return Ok(());
                    }
                }
                Ok(None) => {
                    return Err(Fail::Etcd(etcd_client::Error::WatchError(
                        "the watch stream ended".into(),
                    )))
                }
                Err(error) => return Err(Fail::Etcd(error)),
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
        let mut kv = self.client.kv_client();
        let response = within(self.timeout, kv.txn(txn)).await?;
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
        let mut kv = self.client.kv_client();
        let response = within(self.timeout, kv.txn(txn)).await?;
        let responses = response.op_responses();
        match (response.succeeded(), first_kv(responses.first())) {
            (true, Some(kv)) => Ok(Ok(kv.clone())),
            (true, None) => Ok(Err(false)),
            (false, found) => Ok(Err(found.is_some())),
        }
    }

    /// Moves `key` (if its create revision is still `revision`) to lease `lease`,
    /// keeping its create revision; else whether any contender holds `lock_prefix`.
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
                Some(PutOptions::new().with_lease(lease)),
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
        let mut kv = self.client.kv_client();
        let response = within(self.timeout, kv.txn(txn)).await?;
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
        let mut kv = self.client.kv_client();
        let options = GetOptions::new()
            .with_range(prefix_end(lock_prefix))
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let response = within(self.timeout, kv.get(lock_prefix, Some(options))).await?;
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

/// The first key of a range response inside a transaction.
fn first_kv(response: Option<&TxnOpResponse>) -> Option<&KeyValue> {
    match response {
        Some(TxnOpResponse::Get(get)) => get.kvs().first(),
        _ => None,
    }
}

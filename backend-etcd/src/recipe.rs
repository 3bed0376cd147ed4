//! The requests of etcd's `concurrency.Mutex` recipe, each bounded by the request
//! timeout: grant a lease, put a contender under it unless its key exists, find the
//! contender just before ours, wait for a key's deletion, keep a lease alive, revoke it.
//! A [`Rule`] says which older contenders keep ours from holding: one of the whole
//! range for the mutex and the election, `max` for a semaphore's permit, one writer for
//! a reader. Semaphore and read-write waiters also stamp their grants ([`Stamp`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, DeleteOptions, EventType, GetOptions, KeyValue, LeaseGrantOptions,
    PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, WatchFilterType, WatchOptions,
    WatchStream,
};

use crate::error::{sent, within, Fail};
use crate::keys::{is_contender_name, prefix_end, Kind};
use crate::loss::{deletion, Feed};

/// The most older contenders a waiter reads and counts down (see [`crate::ahead`]):
/// the put's transaction reads that many, so that a waiter needs no read of its own.
pub(crate) const WATCHED_AHEAD: usize = 64;

/// A key and its create revision: one incarnation of a key name (names are reused, see
/// `lock::names`).
pub(crate) type Incarnation = (Vec<u8>, i64);

/// The contenders older than a waiter's: their keys and create revisions.
pub(crate) type Ahead = HashMap<Vec<u8>, i64>;

/// The incarnation `kv` is.
fn incarnation(kv: &KeyValue) -> Incarnation {
    (kv.key().to_vec(), kv.create_revision())
}

/// The etcd requests of one client.
#[derive(Clone)]
pub(crate) struct Requests {
    pub(crate) client: Client,
    pub(crate) timeout: Duration,
    /// The deletions the client's watch of its prefix sees (waiters count them down).
    pub(crate) feed: Arc<Feed>,
}

/// What putting our contender found.
#[derive(Debug, Clone)]
pub(crate) struct Placed {
    /// Our key's create revision: our place in the queue, and the fencing token of a
    /// grant at once.
    pub(crate) revision: i64,
    /// Whether ours holds: fewer than the rule's room of blocking contenders are older.
    pub(crate) first: bool,
    /// The oldest blocking contenders (up to the room, ours among them if it blocks),
    /// with their values when the rule asked for them.
    pub(crate) seen: Vec<KeyValue>,
    /// Every blocking contender older than ours, when the put's read saw them all
    /// (keys only, up to [`WATCHED_AHEAD`]): a waiter counts them down from there.
    pub(crate) ahead: Option<Ahead>,
}

/// Which contenders keep ours from holding: `room` or more contenders of the range
/// `blocking` (part of the primitive's `range`) older than ours.
#[derive(Debug, Clone)]
pub(crate) struct Rule {
    /// The range every contender of the key puts its key in.
    pub(crate) range: String,
    /// The part of it whose contenders block ours.
    pub(crate) blocking: String,
    /// How many older blocking contenders ours may have and still hold.
    pub(crate) room: usize,
    /// Whether placing reads the blocking contenders' values (the semaphore's counts).
    pub(crate) values: bool,
    /// Whether contenders' keys are one level down (`read/<id>`, `write/<id>`).
    pub(crate) layered: bool,
}

impl Rule {
    /// The rule of a `kind` contender in `range`.
    pub(crate) fn of(kind: Kind, range: &str) -> Rule {
        Rule {
            range: range.to_owned(),
            blocking: kind.blocking(range),
            room: kind.room(),
            values: matches!(kind, Kind::Permit(_)),
            layered: kind.layered(),
        }
    }

    /// How many older contenders one look reads.
    fn limit(&self) -> i64 {
        i64::try_from(self.room).unwrap_or(i64::MAX)
    }
}

/// What a waited grant's stamp found.
#[derive(Debug)]
pub(crate) enum Stamp {
    /// Our marker written again, at this revision: the grant's fencing token.
    At(i64),
    /// Older contenders' pending markers: their grants stamp first.
    After(Vec<Incarnation>),
    /// Our pending marker is gone (deleted from outside): it is to be put again.
    Unmarked,
    /// Our own key is gone.
    Gone,
}

/// What looking behind our contender found.
#[derive(Debug)]
pub(crate) enum Turn {
    /// Fewer blocking contenders than the room are older: ours holds.
    Ours,
    /// The youngest older blocking contenders' keys (as many as the room): ours holds
    /// once one of them goes, or earlier.
    After(Vec<Incarnation>),
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

    /// Puts `key` with `value` (empty for a lock, the candidate for an election, the
    /// count for a permit) under `lease` unless it exists, and in the same transaction
    /// reads the oldest contenders of `rule.blocking` (up to its room); or, when the
    /// caller `hopes` to be alone, first asks whether that range is empty (see below).
    pub(crate) async fn place(
        &self,
        rule: &Rule,
        key: &str,
        value: &[u8],
        lease: i64,
        hopes: bool,
    ) -> Result<Placed, Fail> {
        // Without values, enough keys for a waiter to count down (ours among them).
        let limit = if rule.values {
            rule.limit()
        } else {
            rule.limit().max(WATCHED_AHEAD as i64 + 1)
        };
        let mut oldest = GetOptions::new()
            .with_range(prefix_end(&rule.blocking))
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(limit);
        if !rule.values {
            oldest = oldest.with_keys_only();
        }
        let blocking = rule.blocking.as_str();
        let put = || TxnOp::put(key, value, Some(PutOptions::new().with_lease(lease)));
        let placing = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([put(), TxnOp::get(blocking, Some(oldest.clone()))])
            .or_else([TxnOp::get(key, None), TxnOp::get(blocking, Some(oldest))]);
        // With room for one and no values to read, a blocking range found empty (a
        // range compare, etcd 3.3+) makes ours the holder with no read at all: the
        // uncontended acquire's one write reads nothing back. Else, in the same round
        // trip, the put and read above (a nested transaction). Not for a key expected
        // held: the compare would read the whole queue before the read of it.
        let alone = hopes && rule.room == 1 && !rule.values;
        let txn = if alone {
            Txn::new()
                .when([
                    Compare::create_revision(key, CompareOp::Equal, 0),
                    Compare::create_revision(blocking, CompareOp::Equal, 0)
                        .with_range(prefix_end(blocking)),
                ])
                .and_then([put()])
                .or_else([TxnOp::txn(placing)])
        } else {
            placing
        };
        let response = self.txn(txn).await?;
        let header_revision = response.header().map_or(0, |h| h.revision());
        if alone && response.succeeded() {
            if header_revision <= 0 {
                return Err(no_revision());
            }
            return Ok(Placed {
                revision: header_revision,
                first: true,
                seen: Vec::new(),
                ahead: Some(Ahead::new()),
            });
        }
        let (succeeded, responses) = if alone {
            match response.op_responses().into_iter().next() {
                Some(TxnOpResponse::Txn(inner)) => (inner.succeeded(), inner.op_responses()),
                _ => return Err(no_revision()),
            }
        } else {
            (response.succeeded(), response.op_responses())
        };
        let revision = if succeeded {
            header_revision
        } else {
            // The key exists already: an earlier attempt's put was applied (a former key
            // of a reused name is gone before the name is taken again, see
            // `lock::names`).
            first_kv(responses.first()).map_or(0, KeyValue::create_revision)
        };
        let seen = all_kvs(responses.get(1));
        for kv in seen.iter().filter(|kv| kv.key() != key.as_bytes()) {
            contender_shape(rule, kv)?;
        }
        if revision <= 0 {
            return Err(no_revision());
        }
        let older = seen
            .iter()
            .filter(|kv| kv.create_revision() < revision)
            .count();
        // Read oldest first: with ours among them, every older one is too.
        let all_older = !rule.values
            && seen
                .iter()
                .any(|kv| kv.key() == key.as_bytes() && kv.create_revision() == revision);
        let ahead = all_older.then(|| {
            seen.iter()
                .filter(|kv| kv.create_revision() < revision)
                .map(incarnation)
                .collect()
        });
        Ok(Placed {
            revision,
            first: older < rule.room,
            seen,
            ahead,
        })
    }

    /// The youngest contenders of `rule.blocking` older than `revision`, as many as the
    /// room: the read of a look behind ours.
    fn before(rule: &Rule, revision: i64) -> TxnOp {
        let before = GetOptions::new()
            .with_range(prefix_end(&rule.blocking))
            .with_max_create_revision(revision - 1)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(rule.limit())
            .with_keys_only();
        TxnOp::get(rule.blocking.as_str(), Some(before))
    }

    /// The turn a look behind ours ([`Requests::before`], then a read of our `key`)
    /// found. Older keys of another shape than a contender's are [`Fail::Foreign`].
    fn turn_of(rule: &Rule, responses: &[TxnOpResponse], revision: i64) -> Result<Turn, Fail> {
        if first_kv(responses.get(1)).is_none_or(|kv| kv.create_revision() != revision) {
            return Ok(Turn::Gone);
        }
        let older = all_kvs(responses.first());
        for kv in &older {
            contender_shape(rule, kv)?;
        }
        Ok(if older.len() < rule.room {
            Turn::Ours
        } else {
            Turn::After(older.iter().map(incarnation).collect())
        })
    }

    /// Looks for the youngest contenders of `rule.blocking` older than `revision`
    /// (ours), as many as the room, and checks that our `key` still exists, as etcd
    /// stood at revision `seen` or later (when the last deletion we waited for was
    /// known).
    ///
    /// Where our key is in the blocking range, [`Requests::older_than_ours`]: a read
    /// that may lag the cluster (though not `seen`), but a contender older than ours is
    /// never created later, so none older at the revision it read means none older from
    /// then on. Else a linearizable transaction.
    pub(crate) async fn turn(
        &self,
        rule: &Rule,
        key: &str,
        revision: i64,
        seen: i64,
    ) -> Result<Turn, Fail> {
        if key.starts_with(&rule.blocking) {
            let at = seen.max(revision);
            return Ok(
                match self
                    .older_than_ours(rule, key, revision, rule.room, at)
                    .await?
                {
                    Err(gone) => gone,
                    Ok((older, _)) if older.len() < rule.room => Turn::Ours,
                    Ok((older, _)) => Turn::After(older),
                },
            );
        }
        let txn = Txn::new().and_then([
            Self::before(rule, revision),
            TxnOp::get(key, Some(GetOptions::new().with_keys_only())),
        ]);
        let response = self.txn(txn).await?;
        Self::turn_of(rule, &response.op_responses(), revision)
    }

    /// Reads our `key` (create revision `revision`) and up to `count` of
    /// `rule.blocking`'s contenders older than it, youngest first, as etcd stood at
    /// revision `at` or later: one serializable read (no round of the raft read index),
    /// made again linearizable when that member lags `at`. Returns the older keys
    /// (checked for shape) and whether more are older, or [`Turn::Gone`] when our key is
    /// not there. Our key must be in the blocking range.
    pub(crate) async fn older_than_ours(
        &self,
        rule: &Rule,
        key: &str,
        revision: i64,
        count: usize,
        at: i64,
    ) -> Result<Result<(Vec<Incarnation>, bool), Turn>, Fail> {
        let limit = i64::try_from(count.saturating_add(1)).unwrap_or(i64::MAX);
        let ours_and_older = GetOptions::new()
            .with_range(prefix_end(&rule.blocking))
            .with_max_create_revision(revision)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(limit)
            .with_keys_only();
        let mut read = None;
        for options in [ours_and_older.clone().with_serializable(), ours_and_older] {
            let answer = sent(self.timeout, || {
                let (mut kv, options) = (self.client.kv_client(), options.clone());
                async move { kv.get(rule.blocking.as_str(), Some(options)).await }
            })
            .await?;
            if answer.header().is_some_and(|h| h.revision() >= at) {
                read = Some(answer);
                break;
            }
        }
        let Some(read) = read else {
            return Err(Fail::Etcd(etcd_client::Error::Internal(
                "etcd answered a linearizable read at a revision older than one it had shown"
                    .into(),
            )));
        };
        let kvs = read.kvs();
        if kvs
            .first()
            .is_none_or(|kv| kv.create_revision() != revision || kv.key() != key.as_bytes())
        {
            return Ok(Err(Turn::Gone));
        }
        let older = kvs.get(1..).unwrap_or_default();
        for kv in older {
            contender_shape(rule, kv)?;
        }
        // `more` (not etcd's count, which takes in the younger contenders too: it is
        // made before the create-revision filter).
        Ok(Ok((older.iter().map(incarnation).collect(), read.more())))
    }

    /// [`Requests::turn`], and when the turn is ours, moves our `key` (and our pending
    /// `marker`, if any) to lease `lease` in the same transaction (keeping the key's
    /// create revision and value): a granted waiter's one round trip instead of a look
    /// and a move. A range compare can say "no older contender" but cannot count, so
    /// with room for more than one (a semaphore of several permits) the move is a
    /// second request after a look that finds the turn ours.
    pub(crate) async fn turn_and_move(
        &self,
        rule: &Rule,
        key: &str,
        revision: i64,
        lease: i64,
        marker: Option<&str>,
    ) -> Result<Turn, Fail> {
        if rule.room != 1 {
            return match self.turn(rule, key, revision, revision).await? {
                Turn::Ours => Ok(
                    match self
                        .move_to_lease(&rule.range, key, revision, lease, marker)
                        .await?
                    {
                        Ok(_) => Turn::Ours,
                        Err(_) => Turn::Gone,
                    },
                ),
                other => Ok(other),
            };
        }
        // Ours while our key is there and no blocking contender is older than it: every
        // key of the blocking range was created at our revision or later (a range
        // compare, etcd 3.3+).
        let txn = Txn::new()
            .when([
                Compare::create_revision(key, CompareOp::Equal, revision),
                Compare::create_revision(rule.blocking.as_str(), CompareOp::Greater, revision - 1)
                    .with_range(prefix_end(&rule.blocking)),
            ])
            .and_then(moves(key, lease, marker))
            .or_else([
                Self::before(rule, revision),
                TxnOp::get(key, Some(GetOptions::new().with_keys_only())),
            ]);
        let response = self.txn(txn).await?;
        if response.succeeded() {
            return Ok(Turn::Ours);
        }
        match Self::turn_of(rule, &response.op_responses(), revision)? {
            // The compare held then: not an answer etcd gives.
            Turn::Ours => Err(Fail::Etcd(etcd_client::Error::Internal(
                "etcd refused the turn transaction's compare yet found no older contender".into(),
            ))),
            other => Ok(other),
        }
    }

    /// Opens a watch of the deletions of `start` (up to `options`' range end, if any)
    /// from the current revision, within the request timeout.
    pub(crate) async fn watch_deletions(
        &self,
        start: &[u8],
        options: WatchOptions,
    ) -> Result<WatchStream, Fail> {
        let options = options.with_filters([WatchFilterType::NoPut]);
        let watch = self.client.watch_client();
        sent(self.timeout, || {
            let (mut watch, start, options) = (watch.clone(), start.to_vec(), options.clone());
            async move { watch.watch(start, Some(options)).await }
        })
        .await
    }

    /// Resolves once one of `keys` (each a key and its create revision, in the range
    /// `range`) is gone (at once if one is gone already), with a revision at which that
    /// was known (0 if not known). One key is watched alone; several (a semaphore's)
    /// through a watch of `range` whose other deletions are passed over. Not bounded by
    /// the request timeout: it waits for as long as the keys live. Errors when the
    /// watch cannot be made or breaks.
    ///
    /// The watch starts at the current revision, and the keys are looked at once the
    /// watch is in place, so a deletion in between is not missed. (A watch from an
    /// older revision would be served by etcd's catch-up loop, which runs every 100 ms:
    /// under contention most hand-offs would wait for it.) Names are reused, so a key
    /// is gone when a deletion of its name comes after its create revision, or when
    /// the look finds its name absent or created at another revision (a later
    /// incarnation, which may queue behind ours: waiting for it would never end).
    pub(crate) async fn deleted(&self, keys: Vec<Incarnation>, range: &str) -> Result<i64, Fail> {
        let (start, options) = match keys.as_slice() {
            [(key, _)] => (key.as_slice(), WatchOptions::new()),
            _ => (
                range.as_bytes(),
                WatchOptions::new().with_range(prefix_end(range)),
            ),
        };
        let mut stream = self.watch_deletions(start, options).await?;
        let mut looked = false;
        loop {
            let message = if looked {
                stream.message().await.map_err(Fail::Etcd)
            } else {
                within(self.timeout, stream.message()).await
            };
            match message? {
                Some(response) => {
                    if response.canceled() {
                        return Ok(0);
                    }
                    if response.events().iter().any(|e| {
                        e.event_type() == EventType::Delete
                            && e.kv().map(deletion).is_some_and(|deleted| {
                                keys.iter().any(|(key, created)| {
                                    *key == deleted.key && deleted.ends(*created)
                                })
                            })
                    }) {
                        return Ok(response.header().map_or(0, |h| h.revision()));
                    }
                    if response.created() && !looked {
                        looked = true;
                        if let Some(at) = self.one_gone(&keys, range).await? {
                            return Ok(at);
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

    /// The revision read at, if one of `keys` (in the range `range`) is gone: its name
    /// absent, or there with another create revision.
    async fn one_gone(&self, keys: &[Incarnation], range: &str) -> Result<Option<i64>, Fail> {
        let (start, options) = match keys {
            [(key, _)] => (key.clone(), GetOptions::new().with_keys_only()),
            _ => (
                range.as_bytes().to_vec(),
                GetOptions::new()
                    .with_range(prefix_end(range))
                    .with_keys_only(),
            ),
        };
        let found = sent(self.timeout, || {
            let (mut kv, start, options) =
                (self.client.kv_client(), start.clone(), options.clone());
            async move { kv.get(start, Some(options)).await }
        })
        .await?;
        let all_present = keys.iter().all(|(key, created)| {
            found
                .kvs()
                .iter()
                .any(|kv| kv.key() == key.as_slice() && kv.create_revision() == *created)
        });
        Ok((!all_present).then(|| found.header().map_or(0, |h| h.revision())))
    }

    /// Deletes `key`, a name this client reserves for the grant whose key was created
    /// at `revision` (see `lock::names`), with no compare: no other contender writes
    /// that name while the grant is recorded, so whatever key is there is the grant's
    /// (etcd's own `Mutex.Unlock` deletes its key by name alone too). Also deletes our
    /// pending `marker`, if any. `Ok(Ok(()))` when it deleted the grant's key; else
    /// whether any contender holds `lock_prefix`.
    ///
    /// Why not the owner-checked [`Requests::delete_own`]: etcd 3.4 serves every
    /// transaction from a read view that copies the writes its backend has not yet
    /// committed (up to 100 ms of them), so under load a transaction costs the server
    /// far more than a plain delete: measured with 16 workers, a delete in a
    /// transaction (with or without a compare) took the cycle's server time from about
    /// 140 to 200 µs and its throughput from 0.95 to 0.6 of etcd-client's
    /// `lock()`/`unlock()`, whose unlock is a plain delete by name. The check is made
    /// on the deleted key instead (its create revision, returned with it). A pending
    /// marker to delete as well keeps the transaction (a waited permit's or read-write
    /// grant's, not the uncontended path).
    pub(crate) async fn delete_reserved(
        &self,
        lock_prefix: &str,
        key: &str,
        revision: i64,
        marker: Option<&str>,
    ) -> Result<Result<(), bool>, Fail> {
        let with_prev = || Some(DeleteOptions::new().with_prev_key());
        let deleted = match marker {
            None => sent(self.timeout, || {
                let mut kv = self.client.kv_client();
                async move { kv.delete(key, with_prev()).await }
            })
            .await?
            .prev_kvs()
            .first()
            .cloned(),
            Some(marker) => {
                let deletes = [TxnOp::delete(key, with_prev()), TxnOp::delete(marker, None)];
                let response = self.txn(Txn::new().and_then(deletes)).await?;
                match response.op_responses().first() {
                    Some(TxnOpResponse::Delete(deleted)) => deleted.prev_kvs().first().cloned(),
                    _ => None,
                }
            }
        };
        match deleted {
            Some(kv) if kv.create_revision() == revision => Ok(Ok(())),
            found => {
                if let Some(kv) = found {
                    // Not a key this client put for the grant: someone wrote our name.
                    tracing::warn!(
                        key,
                        created = kv.create_revision(),
                        ours = revision,
                        "a release deleted a key of its reserved name that another writer had put"
                    );
                }
                Ok(Err(self.any_contender(lock_prefix).await?))
            }
        }
    }

    /// Whether any contender holds `lock_prefix` (a read of one key name).
    async fn any_contender(&self, lock_prefix: &str) -> Result<bool, Fail> {
        let options = any_contender_read(lock_prefix);
        let found = sent(self.timeout, || {
            let (mut kv, options) = (self.client.kv_client(), options.clone());
            async move { kv.get(lock_prefix, Some(options)).await }
        })
        .await?;
        Ok(!found.kvs().is_empty())
    }

    /// Deletes `key` if its create revision is `revision` (and with it our pending
    /// `marker`, if any, should it still be there); returns the deleted key's lease
    /// when `lease` asks for it (else 0), or, when it was not ours, whether any
    /// contender holds `lock_prefix`.
    pub(crate) async fn delete_own(
        &self,
        lock_prefix: &str,
        key: &str,
        revision: i64,
        marker: Option<&str>,
        lease: bool,
    ) -> Result<Result<i64, bool>, Fail> {
        let options = lease.then(|| DeleteOptions::new().with_prev_key());
        let mut deletes = vec![TxnOp::delete(key, options)];
        deletes.extend(marker.map(|marker| TxnOp::delete(marker, None)));
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, revision)])
            .and_then(deletes)
            .or_else([TxnOp::get(
                lock_prefix,
                Some(any_contender_read(lock_prefix)),
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
                Some(any_contender_read(lock_prefix)),
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
    /// keeping its create revision and its value (a permit's count), and puts our
    /// pending `marker` (if any) under that lease too; else whether any contender holds
    /// `lock_prefix`.
    pub(crate) async fn move_to_lease(
        &self,
        lock_prefix: &str,
        key: &str,
        revision: i64,
        lease: i64,
        marker: Option<&str>,
    ) -> Result<Result<i64, bool>, Fail> {
        self.write_own(lock_prefix, key, revision, moves(key, lease, marker))
            .await
    }

    /// Puts our pending marker `marker` under `lease` while our `key` still has create
    /// revision `revision`; else whether any contender holds `lock_prefix`.
    pub(crate) async fn mark_pending(
        &self,
        lock_prefix: &str,
        key: &str,
        revision: i64,
        marker: &str,
        lease: i64,
    ) -> Result<Result<i64, bool>, Fail> {
        let put = TxnOp::put(marker, "", Some(PutOptions::new().with_lease(lease)));
        self.write_own(lock_prefix, key, revision, vec![put]).await
    }

    /// Puts our pending `marker` (in the range `pending`) again as it is once no older
    /// contender's marker is left there, while our `key` still has create revision
    /// `revision`: that write's revision is a waited grant's fencing token. The marker
    /// stays until [`Requests::unmark`].
    pub(crate) async fn stamp(
        &self,
        key: &str,
        revision: i64,
        pending: &str,
        marker: &str,
    ) -> Result<Stamp, Fail> {
        let keys_only = || Some(GetOptions::new().with_keys_only());
        let txn = Txn::new()
            .when([
                Compare::create_revision(key, CompareOp::Equal, revision),
                Compare::create_revision(marker, CompareOp::Greater, 0),
                // No key in [pending, marker): an empty range compares as revision 0.
                Compare::create_revision(pending, CompareOp::Equal, 0).with_range(marker),
            ])
            .and_then([TxnOp::put(
                marker,
                "",
                Some(PutOptions::new().with_ignore_lease()),
            )])
            .or_else([
                TxnOp::get(key, keys_only()),
                TxnOp::get(marker, keys_only()),
                TxnOp::get(
                    pending,
                    Some(GetOptions::new().with_range(marker).with_keys_only()),
                ),
            ]);
        let response = self.txn(txn).await?;
        if response.succeeded() {
            return match response.header().map(|h| h.revision()) {
                Some(written) if written > 0 => Ok(Stamp::At(written)),
                _ => Err(Fail::Etcd(etcd_client::Error::Internal(
                    "etcd's answer to a grant's stamp carried no revision".into(),
                ))),
            };
        }
        let responses = response.op_responses();
        if first_kv(responses.first()).is_none_or(|kv| kv.create_revision() != revision) {
            return Ok(Stamp::Gone);
        }
        if first_kv(responses.get(1)).is_none() {
            return Ok(Stamp::Unmarked);
        }
        let older = all_kvs(responses.get(2));
        for kv in &older {
            marker_shape(pending, kv)?;
        }
        Ok(Stamp::After(older.iter().map(incarnation).collect()))
    }

    /// Deletes our pending `marker` (its grant stamped), letting the next grant stamp.
    pub(crate) async fn unmark(&self, marker: &str) -> Result<(), Fail> {
        sent(self.timeout, || {
            let mut kv = self.client.kv_client();
            async move { kv.delete(marker, None).await }
        })
        .await
        .map(drop)
    }

    /// Runs `write` if our `key`'s create revision is still `revision` and returns its
    /// revision; else whether any contender holds `lock_prefix`.
    async fn write_own(
        &self,
        lock_prefix: &str,
        key: &str,
        revision: i64,
        write: Vec<TxnOp>,
    ) -> Result<Result<i64, bool>, Fail> {
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, revision)])
            .and_then(write)
            .or_else([TxnOp::get(
                lock_prefix,
                Some(any_contender_read(lock_prefix)),
            )]);
        let response = self.txn(txn).await?;
        if !response.succeeded() {
            return Ok(Err(first_kv(response.op_responses().first()).is_some()));
        }
        match response.header().map(|h| h.revision()) {
            Some(written) if written > 0 => Ok(Ok(written)),
            _ => Err(Fail::Etcd(etcd_client::Error::Internal(
                "etcd's answer to a contender's write carried no revision".into(),
            ))),
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

/// The writes that move `key` to `lease` (keeping its create revision and value), with
/// our pending `marker` if any.
fn moves(key: &str, lease: i64, marker: Option<&str>) -> Vec<TxnOp> {
    let mut puts = vec![TxnOp::put(
        key,
        "",
        Some(PutOptions::new().with_lease(lease).with_ignore_value()),
    )];
    puts.extend(
        marker.map(|marker| TxnOp::put(marker, "", Some(PutOptions::new().with_lease(lease)))),
    );
    puts
}

/// Checks that `kv`, a key ranked ahead of ours in `rule.range`, has the shape of a
/// contender ([`is_contender_name`]: distlock's names, or an id in lowercase hex as
/// etcd's `concurrency.Mutex` names it by the lease id, `etcdctl lock`'s and a Go
/// service's too; a read-write contender, in `read/` or `write/`, may be a Go
/// `recipes.RWMutex` key named by a decimal time in nanoseconds) and attached to a
/// lease, so that it goes when its holder releases or dies. Anything else (another
/// name, a deeper path, a key without a lease, which would never go) is data of another
/// tool under this prefix: waiting behind it could last forever, so the acquire fails
/// with [`Fail::Foreign`] instead.
fn contender_shape(rule: &Rule, kv: &KeyValue) -> Result<(), Fail> {
    let name = kv
        .key()
        .strip_prefix(rule.range.as_bytes())
        .unwrap_or(kv.key());
    let shaped = if rule.layered {
        name.strip_prefix(b"read/")
            .or_else(|| name.strip_prefix(b"write/"))
            .is_some_and(|id| is_contender_name(id, 20))
    } else {
        is_contender_name(name, 16)
    };
    if shaped && kv.lease() != 0 {
        Ok(())
    } else {
        Err(foreign(kv))
    }
}

/// Checks that `kv`, a key ahead of our pending marker in `pending`, is a marker: a
/// create revision in 20 digits, under a lease. Anything else would hold back our
/// grant's stamp, maybe for ever: [`Fail::Foreign`].
fn marker_shape(pending: &str, kv: &KeyValue) -> Result<(), Fail> {
    let name = kv
        .key()
        .strip_prefix(pending.as_bytes())
        .unwrap_or(kv.key());
    if name.len() == 20 && name.iter().all(u8::is_ascii_digit) && kv.lease() != 0 {
        Ok(())
    } else {
        Err(foreign(kv))
    }
}

/// A foreign key's [`Fail`], naming it (cut short).
fn foreign(kv: &KeyValue) -> Fail {
    Fail::Foreign(
        String::from_utf8_lossy(kv.key())
            .chars()
            .take(200)
            .collect(),
    )
}

/// Every key of a range response inside a transaction.
fn all_kvs(response: Option<&TxnOpResponse>) -> Vec<KeyValue> {
    match response {
        Some(TxnOpResponse::Get(get)) => get.kvs().to_vec(),
        _ => Vec::new(),
    }
}

/// etcd's answer to a contender's put carried no revision (or not the shape asked for).
fn no_revision() -> Fail {
    Fail::Etcd(etcd_client::Error::Internal(
        "etcd's answer to the contender put carried no revision".into(),
    ))
}

/// The first key of a range response inside a transaction.
fn first_kv(response: Option<&TxnOpResponse>) -> Option<&KeyValue> {
    match response {
        Some(TxnOpResponse::Get(get)) => get.kvs().first(),
        _ => None,
    }
}

/// The read that tells whether any contender holds `lock_prefix`: one key name of its
/// range.
fn any_contender_read(lock_prefix: &str) -> GetOptions {
    GetOptions::new()
        .with_range(prefix_end(lock_prefix))
        .with_limit(1)
        .with_keys_only()
}

//! The semaphore and the read-write lock against real etcd: their keys sit where the
//! docs say (the read-write lock in the layout of etcd's `recipes.RWMutex`, so its
//! keys and ours exclude each other), a semaphore waiter is granted when any of the
//! holders before it leaves, and nothing (no key, no lease) is left once they end.

use crate::common;

use std::time::{Duration, Instant};

use common::{etcdctl, eventually, keys_under, leases, shared_port, start_server, url_for};
use distlock_api::{LockError, LockKey, LockOptions, RwMode, WaitPolicy};
use distlock_etcd::EtcdLock;

fn key(label: &str) -> LockKey {
    LockKey::new(format!("prims-{label}-{:08x}", rand::random::<u32>())).unwrap()
}

fn no_wait(ttl: Duration) -> LockOptions {
    LockOptions::new(ttl).with_wait(WaitPolicy::NoWait)
}

fn waiting(ttl: Duration, wait: Duration) -> LockOptions {
    LockOptions::new(ttl).with_wait(WaitPolicy::Timeout(wait))
}

/// Polls `check` every 20 ms until it holds or `limit` passes.
/// The range of `key`'s pending markers in the namespace `space` (`+semaphore`, `+rw`):
/// tests share one server, so each looks at its own key's.
fn pending_of(space: &str, key: &LockKey) -> String {
    format!(
        "distlock/{space}-pending/{}/",
        distlock_etcd::encode_key(key)
    )
}

async fn connect(port: u16) -> EtcdLock {
    EtcdLock::connect(&url_for(port))
        .await
        .expect("connects to etcd")
}

/// On a server of its own (so that no other test's lease is listed): permits and
/// read-write grants that are released, given up, dropped mid-wait, refused by a
/// try-acquire or a count mismatch, and granted after a wait leave no key and no lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_left_once_permits_and_rw_grants_end() {
    let server = start_server().await;
    let port = server.port();
    let (a, b) = (connect(port).await, connect(port).await);
    let ttl = Duration::from_secs(5);
    let options = waiting(ttl, Duration::from_secs(10));

    // Semaphore of 2.
    let key = key("sem-leftovers");
    let range = a.semaphore_prefix(&key);
    let (sa, sb) = (a.semaphore(), b.semaphore());
    let first = sa.acquire(&key, 2, &options).await.unwrap();
    let second = sb.acquire(&key, 2, &options).await.unwrap();
    assert!(sb
        .try_acquire(&key, 2, &no_wait(ttl))
        .await
        .unwrap()
        .is_none());
    let mismatch = sb.try_acquire(&key, 3, &no_wait(ttl)).await;
    assert!(
        matches!(mismatch, Err(LockError::PermitMismatch { .. })),
        "{mismatch:?}"
    );
    let gave_up = sb
        .acquire(&key, 2, &waiting(ttl, Duration::from_millis(200)))
        .await;
    assert!(
        matches!(gave_up, Err(LockError::Timeout { .. })),
        "{gave_up:?}"
    );
    let dropped = {
        let (sb, key, options) = (sb.clone(), key.clone(), options.clone());
        tokio::spawn(async move { sb.acquire(&key, 2, &options).await.map(drop) })
    };
    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, &range).len()
            == 3)
        .await,
        "the waiter did not queue: {:?}",
        keys_under(port, &range)
    );
    dropped.abort();
    let _ = dropped.await;
    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, &range).len()
            == 2)
        .await,
        "a dropped waiter left its key: {:?}",
        keys_under(port, &range)
    );
    let next = {
        let (sb, key, options) = (sb.clone(), key.clone(), options.clone());
        tokio::spawn(async move { sb.acquire(&key, 2, &options).await })
    };
    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, &range).len()
            == 3)
        .await
    );
    first.release().await.unwrap();
    let next = next.await.unwrap().unwrap();
    second.release().await.unwrap();
    drop(next);

    // Read-write lock: two readers, a writer dropped mid-wait, a writer granted after.
    let key = key_rw();
    let range = a.rw_prefix(&key);
    let (ra, rb) = (a.rw_lock(), b.rw_lock());
    let r1 = ra.acquire(&key, RwMode::Read, &options).await.unwrap();
    let r2 = rb.acquire(&key, RwMode::Read, &options).await.unwrap();
    assert!(rb
        .try_acquire(&key, RwMode::Write, &no_wait(ttl))
        .await
        .unwrap()
        .is_none());
    let dropped = {
        let (rb, key, options) = (rb.clone(), key.clone(), options.clone());
        tokio::spawn(async move { rb.acquire(&key, RwMode::Write, &options).await.map(drop) })
    };
    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, &range).len()
            == 3)
        .await
    );
    dropped.abort();
    let _ = dropped.await;
    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, &range).len()
            == 2)
        .await,
        "a dropped writer left its key: {:?}",
        keys_under(port, &range)
    );
    let writer = {
        let (rb, key, options) = (rb.clone(), key.clone(), options.clone());
        tokio::spawn(async move { rb.acquire(&key, RwMode::Write, &options).await })
    };
    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, &range).len()
            == 3)
        .await
    );
    // The waiting writer's grant is marked pending; it holds new readers back.
    assert_eq!(keys_under(port, &pending_of("+rw", &key)).len(), 1);
    assert!(ra
        .try_acquire(&key, RwMode::Read, &no_wait(ttl))
        .await
        .unwrap()
        .is_none());
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    let writer = writer.await.unwrap().unwrap();
    // Its pending marker goes once it is granted.
    assert!(
        eventually(Duration::from_secs(5), || keys_under(
            port,
            &pending_of("+rw", &key)
        )
        .is_empty())
        .await
    );
    writer.release().await.unwrap();

    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, "distlock/")
            .is_empty())
        .await,
        "keys left: {:?}",
        keys_under(port, "distlock/")
    );
    assert!(
        eventually(Duration::from_secs(5), || leases(port).is_empty()).await,
        "leases left: {:?}",
        leases(port)
    );
}

fn key_rw() -> LockKey {
    key("rw-leftovers")
}

/// With 2 permits held by A (older) and B, waiters C and D: B's release grants C (it
/// watches both holders), not D; A's release then grants D.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_waiter_is_granted_by_any_holder_leaving_in_order() {
    use distlock_etcd::etcd_client::{Client, GetOptions, SortOrder, SortTarget};

    let port = shared_port();
    let lock = connect(port).await;
    let semaphore = lock.semaphore();
    let key = key("sem-order");
    let range = lock.semaphore_prefix(&key);
    let ttl = Duration::from_secs(10);
    let options = waiting(ttl, Duration::from_secs(20));
    let a = semaphore.acquire(&key, 2, &options).await.unwrap();
    let b = semaphore.acquire(&key, 2, &options).await.unwrap();
    let spawn_waiter = || {
        let (semaphore, key, options) = (semaphore.clone(), key.clone(), options.clone());
        tokio::spawn(async move { semaphore.acquire(&key, 2, &options).await })
    };
    let c = spawn_waiter();
    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, &range).len()
            == 3)
        .await
    );
    let d = spawn_waiter();
    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, &range).len()
            == 4)
        .await
    );
    let released = Instant::now();
    b.release().await.unwrap();
    let c = tokio::time::timeout(Duration::from_secs(3), c)
        .await
        .expect("the first waiter is granted when the younger holder leaves")
        .unwrap()
        .unwrap();
    let took = released.elapsed();
    assert!(!d.is_finished(), "the second waiter jumped the queue");
    // C waited parked on a 3 s lease (two permits: its move back is a request of its
    // own after the look that found its turn); granted, its key is on a 10 s lease.
    let mut etcd = Client::connect([format!("127.0.0.1:{port}")], None)
        .await
        .unwrap();
    let by_age = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend);
    let found = etcd.get(range.as_str(), Some(by_age)).await.unwrap();
    let c_key = &found.kvs()[1];
    let granted_ttl = etcd
        .lease_time_to_live(c_key.lease(), None)
        .await
        .unwrap()
        .granted_ttl();
    assert_eq!(
        granted_ttl, 10,
        "the granted waiter's key is on the lock's lease"
    );
    assert_eq!(c_key.value(), b"distlock:permits=2");
    assert!(
        c.fencing_token() > a.fencing_token(),
        "tokens follow arrival"
    );
    a.release().await.unwrap();
    let d = tokio::time::timeout(Duration::from_secs(3), d)
        .await
        .expect("the second waiter is granted when the older holder leaves")
        .unwrap()
        .unwrap();
    assert!(d.fencing_token() > c.fencing_token());
    c.release().await.unwrap();
    d.release().await.unwrap();
    assert!(keys_under(port, &range).is_empty());
    eprintln!("hand-off to the waiter watching both holders took {took:?}");
}

/// Keys laid out as etcd's Go `recipes.RWMutex` puts them (`PFX/write/<unix nanos>`,
/// `PFX/read/<unix nanos>`, under a lease) and ours exclude each other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_rwmutex_keys_and_ours_exclude_each_other() {
    let port = shared_port();
    let lock = connect(port).await;
    let rw = lock.rw_lock();
    let key = key("go-rw");
    let range = lock.rw_prefix(&key);
    let ttl = Duration::from_secs(5);
    let grant = etcdctl(port, &["lease", "grant", "30"]);
    let lease = grant
        .split_whitespace()
        .nth(1)
        .expect("etcdctl prints `lease <id> granted with TTL(30s)`")
        .to_owned();

    // A Go writer holds: neither our reader nor our writer gets in.
    let go_writer = format!("{range}write/1732700000000000001");
    etcdctl(port, &["put", "--lease", &lease, &go_writer, ""]);
    for mode in [RwMode::Read, RwMode::Write] {
        assert!(
            rw.try_acquire(&key, mode, &no_wait(ttl))
                .await
                .unwrap()
                .is_none(),
            "our {} got in beside a Go writer",
            mode.as_str()
        );
    }
    etcdctl(port, &["del", &go_writer]);

    // A Go reader holds: our reader shares, our writer waits.
    let go_reader = format!("{range}read/1732700000000000002");
    etcdctl(port, &["put", "--lease", &lease, &go_reader, ""]);
    let reader = rw
        .try_acquire(&key, RwMode::Read, &no_wait(ttl))
        .await
        .unwrap()
        .expect("our reader shares with a Go reader");
    assert!(rw
        .try_acquire(&key, RwMode::Write, &no_wait(ttl))
        .await
        .unwrap()
        .is_none());
    reader.release().await.unwrap();
    let writer = {
        let (rw, key) = (rw.clone(), key.clone());
        tokio::spawn(async move {
            rw.acquire(&key, RwMode::Write, &waiting(ttl, Duration::from_secs(10)))
                .await
        })
    };
    // Our waiting writer sits where a Go reader looks for writers (`PFX/write`).
    assert!(
        eventually(Duration::from_secs(5), || keys_under(
            port,
            &format!("{range}write/")
        )
        .len()
            == 1)
        .await
    );
    etcdctl(port, &["lease", "revoke", &lease]);
    let writer = tokio::time::timeout(Duration::from_secs(3), writer)
        .await
        .expect("our writer is granted once the Go reader goes")
        .unwrap()
        .unwrap();
    writer.release().await.unwrap();
    assert!(keys_under(port, &range).is_empty());
}

/// A permit waiter of a lock whose TTL is above the 3 s waiting lease moves its key to
/// that lease while it waits and back once granted; both moves keep the count it
/// records, so a newcomer with another count is still refused once it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_permit_waiter_keeps_its_count() {
    use distlock_etcd::etcd_client::{Client, GetOptions, SortOrder, SortTarget};

    let port = shared_port();
    let lock = connect(port).await;
    let semaphore = lock.semaphore();
    let key = key("sem-parked");
    let range = lock.semaphore_prefix(&key);
    let ttl = Duration::from_secs(10);
    let mut etcd = Client::connect([format!("127.0.0.1:{port}")], None)
        .await
        .unwrap();
    let holder = semaphore
        .acquire(&key, 1, &waiting(ttl, Duration::from_secs(5)))
        .await
        .unwrap();
    let waiter = {
        let (semaphore, key) = (semaphore.clone(), key.clone());
        tokio::spawn(async move {
            semaphore
                .acquire(&key, 1, &waiting(ttl, Duration::from_secs(20)))
                .await
        })
    };
    // Wait for the waiter's key to sit on a lease of 3 s.
    let deadline = Instant::now() + Duration::from_secs(5);
    let parked = loop {
        let by_age = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        let found = etcd.get(range.as_str(), Some(by_age)).await.unwrap();
        if let [_, youngest] = found.kvs() {
            let granted = etcd
                .lease_time_to_live(youngest.lease(), None)
                .await
                .unwrap()
                .granted_ttl();
            if granted == 3 {
                break youngest.value().to_vec();
            }
        }
        assert!(Instant::now() < deadline, "the waiter never parked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(parked, b"distlock:permits=1");
    holder.release().await.unwrap();
    let granted = waiter.await.unwrap().unwrap();
    let found = etcd
        .get(range.as_str(), Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(found.kvs().len(), 1);
    assert_eq!(found.kvs()[0].value(), b"distlock:permits=1");
    assert!(
        granted.fencing_token().unwrap().get() as i64 > found.kvs()[0].create_revision(),
        "a waiter's token is its stamp's revision"
    );
    assert!(
        eventually(Duration::from_secs(5), || keys_under(
            port,
            &pending_of("+semaphore", &key)
        )
        .is_empty())
        .await
    );
    let other = semaphore.try_acquire(&key, 2, &no_wait(ttl)).await;
    assert!(
        matches!(other, Err(LockError::PermitMismatch { .. })),
        "{other:?}"
    );
    granted.release().await.unwrap();
    assert!(keys_under(port, &range).is_empty());
}

/// A grant after a wait carries the revision of its stamp (a write of its pending
/// marker), so its token is above the create revision of a contender that queued
/// behind it before it was granted (it would not be with its own create revision).
/// Its key is not written (Go's `RWMutex` ranks by mod revision); its marker, under
/// its lease, is there while it waits and goes once it is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waited_grants_take_their_token_at_the_grant() {
    use distlock_etcd::etcd_client::{Client, GetOptions, KeyValue, SortOrder, SortTarget};

    let port = shared_port();
    let lock = connect(port).await;
    let etcd = Client::connect([format!("127.0.0.1:{port}")], None)
        .await
        .unwrap();
    // 3 s: not above the waiting lease's, so the permit waiter does not move its key.
    let ttl = Duration::from_secs(3);
    let options = waiting(ttl, Duration::from_secs(20));
    let by_age = |range: String| {
        let mut etcd = etcd.clone();
        async move {
            let options = GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Ascend);
            etcd.get(range, Some(options)).await.unwrap().kvs().to_vec()
        }
    };
    let token = |guard: &distlock_api::LockGuard| guard.fencing_token().unwrap().get() as i64;

    // Semaphore of 1: A holds, C then D wait; A's release grants C.
    let semaphore = lock.semaphore();
    let sem_key = key("sem-token");
    let range = lock.semaphore_prefix(&sem_key);
    let pending = format!(
        "distlock/+semaphore-pending/{}/",
        distlock_etcd::encode_key(&sem_key)
    );
    let a = semaphore.acquire(&sem_key, 1, &options).await.unwrap();
    assert_eq!(
        token(&a),
        by_age(range.clone()).await[0].create_revision(),
        "a permit granted at once carries its key's create revision"
    );
    let spawn_waiter = || {
        let (semaphore, key, options) = (semaphore.clone(), sem_key.clone(), options.clone());
        tokio::spawn(async move { semaphore.acquire(&key, 1, &options).await })
    };
    let c = spawn_waiter();
    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, &pending).len()
            == 1)
        .await
    );
    let d = spawn_waiter();
    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, &pending).len()
            == 2)
        .await
    );
    let queued: Vec<KeyValue> = by_age(range.clone()).await;
    a.release().await.unwrap();
    let c = tokio::time::timeout(Duration::from_secs(3), c)
        .await
        .expect("the first waiter is granted")
        .unwrap()
        .unwrap();
    let now: Vec<KeyValue> = by_age(range.clone()).await;
    assert_eq!(now.len(), 2);
    assert_eq!(now[0].key(), queued[1].key());
    assert_eq!(
        now[0].mod_revision(),
        queued[1].mod_revision(),
        "the key is not written"
    );
    assert!(
        token(&c) > now[1].create_revision(),
        "D queued before C's grant"
    );
    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, &pending).len()
            == 1)
        .await,
        "only D's grant is pending"
    );
    let c_token = token(&c);
    c.release().await.unwrap();
    let d = d.await.unwrap().unwrap();
    assert!(token(&d) > c_token);
    d.release().await.unwrap();
    assert!(keys_under(port, &pending).is_empty());

    // Read-write lock: W writes, R waits to read, W2 waits to write; W's release
    // grants R.
    let rw = lock.rw_lock();
    let rw_key = key("rw-token");
    let range = lock.rw_prefix(&rw_key);
    let pending = format!(
        "distlock/+rw-pending/{}/",
        distlock_etcd::encode_key(&rw_key)
    );
    let w = rw.acquire(&rw_key, RwMode::Write, &options).await.unwrap();
    assert!(
        keys_under(port, &pending).is_empty(),
        "a grant at once marks nothing"
    );
    let spawn_waiter = |mode| {
        let (rw, key, options) = (rw.clone(), rw_key.clone(), options.clone());
        tokio::spawn(async move { rw.acquire(&key, mode, &options).await })
    };
    let r = spawn_waiter(RwMode::Read);
    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, &pending).len()
            == 1)
        .await
    );
    let w2 = spawn_waiter(RwMode::Write);
    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, &pending).len()
            == 2)
        .await
    );
    w.release().await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(3), r)
        .await
        .expect("the reader is granted")
        .unwrap()
        .unwrap();
    let keys = by_age(range.clone()).await;
    assert_eq!(keys.len(), 2);
    assert_eq!(
        keys[0].mod_revision(),
        keys[0].create_revision(),
        "the reader's key was written again"
    );
    assert!(
        token(&r) > keys[1].create_revision(),
        "W2 queued before R's grant"
    );
    let r_token = token(&r);
    r.release().await.unwrap();
    let w2 = w2.await.unwrap().unwrap();
    assert!(token(&w2) > r_token);
    w2.release().await.unwrap();
    assert!(keys_under(port, &range).is_empty());
    assert!(
        keys_under(port, &pending).is_empty(),
        "a pending marker was left"
    );
}

/// A granted waiter stamps only once no older contender's pending marker is left (the
/// chain that keeps tokens rising in the order grants are learned): with an older
/// marker planted, the waiter stays held back after its turn comes, and its token is
/// above that marker's deletion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_granted_waiter_stamps_after_older_pending_grants() {
    use distlock_etcd::etcd_client::{Client, PutOptions};

    let port = shared_port();
    let lock = connect(port).await;
    let mut etcd = Client::connect([format!("127.0.0.1:{port}")], None)
        .await
        .unwrap();
    let semaphore = lock.semaphore();
    let key = key("sem-chain");
    let range = lock.semaphore_prefix(&key);
    let pending = format!(
        "distlock/+semaphore-pending/{}/",
        distlock_etcd::encode_key(&key)
    );
    let options = waiting(Duration::from_secs(3), Duration::from_secs(20));
    let holder = semaphore.acquire(&key, 1, &options).await.unwrap();
    // A marker of an older waiter: 20 digits, under a lease (one without is foreign).
    let older = format!("{pending}{:020}", 1);
    let marker_lease = etcd.lease_grant(30, None).await.unwrap().id();
    etcd.put(
        older.as_str(),
        "",
        Some(PutOptions::new().with_lease(marker_lease)),
    )
    .await
    .unwrap();
    let waiter = {
        let (semaphore, key, options) = (semaphore.clone(), key.clone(), options.clone());
        tokio::spawn(async move { semaphore.acquire(&key, 1, &options).await })
    };
    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, &pending).len()
            == 2)
        .await,
        "the waiter did not mark its grant pending"
    );
    holder.release().await.unwrap();
    assert!(
        !eventually(Duration::from_millis(500), || waiter.is_finished()).await,
        "the waiter stamped before an older pending grant"
    );
    assert_eq!(keys_under(port, &range).len(), 1, "its turn has come");
    let deleted = etcd.delete(older.as_str(), None).await.unwrap();
    let deleted_at = deleted.header().unwrap().revision();
    let granted = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("the waiter stamps once the older marker goes")
        .unwrap()
        .unwrap();
    assert!(granted.fencing_token().unwrap().get() as i64 > deleted_at);
    etcd.lease_revoke(marker_lease).await.unwrap();

    // A key of another shape among the markers (no lease: it would never go) holds
    // back no stamp for ever: the waiter's acquire is a configuration error, and it
    // leaves nothing behind.
    etcd.put(older.as_str(), "", None).await.unwrap();
    let waiter = {
        let (semaphore, key, options) = (semaphore.clone(), key.clone(), options.clone());
        tokio::spawn(async move { semaphore.acquire(&key, 1, &options).await })
    };
    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, &range).len()
            == 2)
        .await,
        "the second waiter did not queue"
    );
    granted.release().await.unwrap();
    let refused = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("a foreign marker is refused at once")
        .unwrap();
    assert!(
        matches!(&refused, Err(LockError::Config { message, .. }) if message.contains(&older)),
        "{refused:?}"
    );
    etcd.delete(older.as_str(), None).await.unwrap();
    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, &range)
            .is_empty())
        .await,
        "a refused waiter's key stayed"
    );
    assert!(keys_under(port, &pending).is_empty());
}

/// Keys of another shape in a semaphore's or read-write lock's range (another name, a
/// deeper path, no lease) are another tool's data, which may never go: an acquire that
/// would wait behind one fails at once with a configuration error naming it, and
/// leaves nothing behind. (Keys of the Go `recipes.RWMutex` shape count as contenders:
/// see `go_rwmutex_keys_and_ours_exclude_each_other`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_keys_of_another_shape_are_config_errors() {
    use distlock_etcd::etcd_client::{Client, PutOptions};

    let port = shared_port();
    let lock = connect(port).await;
    let mut etcd = Client::connect([format!("127.0.0.1:{port}")], None)
        .await
        .unwrap();
    let ttl = Duration::from_secs(3);
    let lease = etcd.lease_grant(30, None).await.unwrap().id();
    let refused = |outcome: Result<Option<distlock_api::LockGuard>, LockError>, stray: &str| {
        assert!(
            matches!(&outcome, Err(LockError::Config { message, .. }) if message.contains(stray)),
            "{stray}: {outcome:?}"
        );
    };

    let sem_key = key("sem-foreign");
    let range = lock.semaphore_prefix(&sem_key);
    let stray = format!("{range}stray");
    etcd.put(
        stray.as_str(),
        "x",
        Some(PutOptions::new().with_lease(lease)),
    )
    .await
    .unwrap();
    refused(
        lock.semaphore()
            .try_acquire(&sem_key, 2, &no_wait(ttl))
            .await,
        &stray,
    );
    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, &range)
            == [stray.clone()])
        .await,
        "a refused permit's key stayed"
    );
    etcd.delete(stray.as_str(), None).await.unwrap();

    let rw_key = key("rw-foreign");
    let range = lock.rw_prefix(&rw_key);
    // A writer key without a lease holds a reader back for ever.
    let unleased = format!("{range}write/1f");
    etcd.put(unleased.as_str(), "", None).await.unwrap();
    refused(
        lock.rw_lock()
            .try_acquire(&rw_key, RwMode::Read, &no_wait(ttl))
            .await,
        &unleased,
    );
    etcd.delete(unleased.as_str(), None).await.unwrap();
    // A leased key outside `read/` and `write/` holds a writer back.
    let other = format!("{range}other/1f");
    etcd.put(
        other.as_str(),
        "",
        Some(PutOptions::new().with_lease(lease)),
    )
    .await
    .unwrap();
    refused(
        lock.rw_lock()
            .try_acquire(&rw_key, RwMode::Write, &no_wait(ttl))
            .await,
        &other,
    );
    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, &range)
            == [other.clone()])
        .await,
        "a refused writer's key stayed"
    );
    etcd.lease_revoke(lease).await.unwrap();
    assert!(keys_under(port, &range).is_empty());
}

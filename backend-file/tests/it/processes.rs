//! The file backend against other processes: `flock(1)` holding the same lock file,
//! a holder killed with -9, and the fencing counter outliving its clients.

use std::io::{BufRead as _, BufReader};
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use distlock_api::{LockKey, LockOptions, ReleaseOutcome, WaitPolicy};
use distlock_file::FileLock;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(30);

fn key() -> LockKey {
    LockKey::new("Nightly/Report").expect("valid key")
}

/// `flock(1)` holding `path` in its own process group; returns once it holds it.
fn flock_holder(path: &std::path::Path) -> Child {
    let mut child = Command::new("flock")
        .arg("--close")
        .arg(path)
        .args(["sh", "-c", "echo held; exec sleep 60"])
        .stdout(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("flock(1) runs (package util-linux)");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("reads flock's output");
    assert_eq!(line.trim(), "held", "flock(1) did not take the lock");
    child
}

#[allow(unsafe_code)] // FFI: see the SAFETY notes
fn kill_group(child: &mut Child) {
    let pgid = i32::try_from(child.id()).expect("pid fits");
    // SAFETY: kill(2) with a negative pid signals that process group; no memory is shared.
    let rc = unsafe { libc::kill(-pgid, libc::SIGKILL) };
    assert_eq!(rc, 0, "kill -9 of the holder's process group");
    child.wait().expect("reaps the holder");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_killed_with_sigkill_frees_the_lock_for_a_waiter() {
    let dir = tempfile::tempdir().expect("temp dir");
    let locks = FileLock::open(dir.path()).expect("opens");
    let mutex = locks.lock();
    let mut holder = flock_holder(&locks.lock_file_path(&key()));

    let no_wait = LockOptions::new(TTL);
    assert!(
        mutex
            .try_acquire(&key(), &no_wait)
            .await
            .expect("tries")
            .is_none(),
        "the key is free while flock(1) holds its file"
    );
    let status = mutex.inspect(&key()).await.expect("inspects");
    assert!(status.held, "inspect misses flock(1)'s lock: {status:?}");

    let waiting = LockOptions::new(TTL).with_wait(WaitPolicy::Timeout(Duration::from_secs(20)));
    let waiter = {
        let mutex = mutex.clone();
        tokio::spawn(async move { mutex.acquire(&key(), &waiting).await })
    };
    let killed_at = Instant::now();
    kill_group(&mut holder);
    let guard = waiter
        .await
        .expect("waiter task")
        .expect("acquires after the kill");
    let handoff = killed_at.elapsed();
    assert!(
        handoff < Duration::from_secs(5),
        "the waiter took {handoff:?} after the holder died"
    );
    assert_eq!(
        guard.release().await.expect("releases"),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flock_1_sees_our_lock_and_our_release() {
    let dir = tempfile::tempdir().expect("temp dir");
    let locks = FileLock::open(dir.path()).expect("opens");
    let mutex = locks.lock();
    let path = locks.lock_file_path(&key());
    let flock_can_take = || {
        Command::new("flock")
            .args(["--nonblock", "--conflict-exit-code", "7"])
            .arg(&path)
            .arg("true")
            .status()
            .expect("flock(1) runs")
            .code()
    };
    let guard = mutex
        .acquire(&key(), &LockOptions::new(TTL))
        .await
        .expect("acquires");
    assert_eq!(flock_can_take(), Some(7), "flock(1) took a key we hold");
    guard.release().await.expect("releases");
    assert_eq!(
        flock_can_take(),
        Some(0),
        "flock(1) could not take a released key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_survive_every_client() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut last = None;
    for round in 0..3 {
        // A fresh client each round, as a restarted process would be.
        let locks = FileLock::open(dir.path()).expect("opens");
        let mutex = locks.lock();
        let guard = mutex
            .acquire(&key(), &LockOptions::new(TTL))
            .await
            .expect("acquires");
        let token = guard.fencing_token().unwrap();
        assert!(
            last.is_none_or(|last| token > last),
            "round {round}: token {token} does not follow {last:?}"
        );
        last = Some(token);
        guard.release().await.expect("releases");
        let status = mutex.inspect(&key()).await.expect("inspects");
        assert!(
            !status.held && status.fencing_token == Some(token),
            "{status:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_give_up_leave_the_lock_free() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (a, b) = (
        FileLock::open(dir.path()).expect("opens").lock(),
        FileLock::open(dir.path()).expect("opens").lock(),
    );
    let holder = a
        .acquire(&key(), &LockOptions::new(TTL))
        .await
        .expect("acquires");
    let short = LockOptions::new(TTL).with_wait(WaitPolicy::Timeout(Duration::from_millis(50)));
    for _ in 0..20 {
        let err = b.acquire(&key(), &short).await.expect_err("times out");
        assert!(
            matches!(err, distlock_api::LockError::Timeout { .. }),
            "{err}"
        );
    }
    holder.release().await.expect("releases");
    // The abandoned waiting thread takes the lock and lets go at once: a real waiter
    // gets it well within a second.
    let patient = LockOptions::new(TTL).with_wait(WaitPolicy::Timeout(Duration::from_secs(5)));
    let guard = a.acquire(&key(), &patient).await.expect("free again");
    guard.release().await.expect("releases");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_lock_file_is_noticed_at_the_next_renewal() {
    let dir = tempfile::tempdir().expect("temp dir");
    let locks = FileLock::open(dir.path()).expect("opens");
    let mutex = locks.lock();
    let options = LockOptions::new(Duration::from_millis(300))
        .with_auto_renew(distlock_api::AutoRenew::new());
    let guard = mutex.acquire(&key(), &options).await.expect("acquires");
    std::fs::remove_file(locks.lock_file_path(&key())).expect("deletes the lock file");
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost() fires once a renewal finds the file gone");
    assert_eq!(guard.state(), distlock_api::LeaseState::Lost);
}

/// A release reports `Released` only if the lock file it locked is still the one at
/// its path: `distlock exec` reads `Released` as "nobody else held the lock meanwhile",
/// which a deleted and recreated lock file would make false.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_the_lock_file_was_replaced_is_not_released() {
    let dir = tempfile::tempdir().expect("temp dir");
    let locks = FileLock::open(dir.path()).expect("opens");
    let path = locks.lock_file_path(&key());
    let (a, b) = (
        locks.lock(),
        FileLock::open(dir.path()).expect("opens").lock(),
    );
    let options = LockOptions::new(TTL).with_wait(WaitPolicy::NoWait);

    let stale = a.acquire(&key(), &options).await.expect("acquires");
    std::fs::remove_file(&path).expect("deletes the lock file");
    let fresh = b
        .acquire(&key(), &options)
        .await
        .expect("a new file, a new lock");
    assert_eq!(
        stale.release().await.expect("releases"),
        ReleaseOutcome::HeldByOther
    );
    assert_eq!(
        fresh.release().await.expect("releases"),
        ReleaseOutcome::Released
    );

    let stale = a.acquire(&key(), &options).await.expect("acquires");
    std::fs::remove_file(&path).expect("deletes the lock file");
    assert_eq!(
        stale.release().await.expect("releases"),
        ReleaseOutcome::Expired
    );
}

/// A semaphore permit held by a process killed with -9 goes to a waiter: here
/// `flock(1)` holds the only permit's slot file, as a distlock holder would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_holder_killed_with_sigkill_frees_the_permit() {
    let dir = tempfile::tempdir().expect("temp dir");
    let semaphore = FileLock::open(dir.path()).expect("opens").semaphore();
    let jobs = LockKey::new("jobs").expect("valid key");
    let mut holder = flock_holder(&dir.path().join("k-jobs.permit-0"));
    let options = LockOptions::new(TTL);
    let refused = semaphore.try_acquire(&jobs, 1, &options).await;
    assert!(
        matches!(refused, Ok(None)),
        "the only permit was free while flock(1) held its slot: {refused:?}"
    );
    let waiting = options.with_wait(WaitPolicy::Timeout(Duration::from_secs(20)));
    let waiter = {
        let (semaphore, jobs) = (semaphore.clone(), jobs.clone());
        tokio::spawn(async move { semaphore.acquire(&jobs, 1, &waiting).await })
    };
    let killed_at = Instant::now();
    kill_group(&mut holder);
    let permit = waiter
        .await
        .expect("waiter task")
        .expect("acquires after the kill");
    let handoff = killed_at.elapsed();
    assert!(
        handoff < Duration::from_secs(5),
        "the waiter took {handoff:?} after the holder died"
    );
    assert_eq!(
        permit.release().await.expect("releases"),
        ReleaseOutcome::Released
    );
}

/// A writer holding the read-write lock (`flock(1)` on the main file, exclusive) keeps
/// readers out until it is killed with -9; then a waiting reader gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_killed_with_sigkill_lets_a_reader_in() {
    use distlock_api::RwMode;
    let dir = tempfile::tempdir().expect("temp dir");
    let rw = FileLock::open(dir.path()).expect("opens").rw_lock();
    let prices = LockKey::new("prices").expect("valid key");
    let mut holder = flock_holder(&dir.path().join("k-prices.rw"));
    let options = LockOptions::new(TTL);
    let refused = rw.try_acquire(&prices, RwMode::Read, &options).await;
    assert!(
        matches!(refused, Ok(None)),
        "a reader got in beside an exclusive holder: {refused:?}"
    );
    let waiting = options.with_wait(WaitPolicy::Timeout(Duration::from_secs(20)));
    let waiter = {
        let (rw, prices) = (rw.clone(), prices.clone());
        tokio::spawn(async move { rw.acquire(&prices, RwMode::Read, &waiting).await })
    };
    kill_group(&mut holder);
    let reader = waiter
        .await
        .expect("waiter task")
        .expect("reads after the kill");
    assert_eq!(
        reader.release().await.expect("releases"),
        ReleaseOutcome::Released
    );
}

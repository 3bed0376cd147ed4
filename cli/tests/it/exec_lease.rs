//! `distlock exec`'s exit code and messages follow what happened to the lease, on real
//! servers and on the file backend.
//!
//! distlock frozen (SIGSTOP) past its lease while the command finishes (issue 18,
//! item 6; issue 20, item 1): the exit code follows what happened to the lease. If another client
//! took the lock meanwhile, distlock says the lock was lost, names the command's own
//! exit code and exits 124, however the wake-up races go. If nobody took it and the
//! release finds the lock still ours, the command's own code is passed on, with a
//! warning about the pause, and no claim of a signal sent to the finished command.
//!
//! Each scenario runs several rounds, because the old code's outcome depended on which
//! of "the command ended" and "the lease ran out" distlock noticed first after SIGCONT.
//!
//! A server that dies under the command (issue 20, item 7): the message about the lock
//! that could not be released follows the backend's own semantics.

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use distlock::{DistributedLock, LockKey, LockOptions, WaitPolicy};
use distlock_test_servers::ServerControl;
use distlock_test_servers::{skip_or_panic, PostgresServer, RedisServer, ServerError};
use tokio::process::{Child, Command};

/// How many times each scenario runs.
const ROUNDS: usize = 4;
/// The exit code of every command here.
const COMMAND_CODE: i32 = 3;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `distlock exec --backend URL --ttl TTL KEY -- sh -c SCRIPT`: the command writes its
/// pid to `dir/pid`, waits for `dir/go` to appear, then exits [`COMMAND_CODE`].
fn spawn_exec(url: &str, ttl: &str, key: &str, dir: &Path) -> Child {
    let script = format!(
        r#"echo $$ > "{dir}/pid.tmp"; mv "{dir}/pid.tmp" "{dir}/pid"
           while [ ! -e "{dir}/go" ]; do sleep 0.01; done
           exit {COMMAND_CODE}"#,
        dir = dir.display()
    );
    Command::new(env!("CARGO_BIN_EXE_distlock"))
        .env_remove("DISTLOCK_BACKEND")
        .args([
            "exec",
            "--backend",
            url,
            "--ttl",
            ttl,
            key,
            "--",
            "sh",
            "-c",
        ])
        .arg(script)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("distlock starts")
}

/// Waits (polling: neither the file system nor `/proc` has an event to wait on) until
/// `ready` holds, with a generous deadline.
async fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The state letter of process `pid` (`T` stopped, `Z` ended but not reaped), if any.
fn process_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The state follows the command name, which is in parentheses.
    let after = &stat[stat.rfind(')')? + 1..];
    after.trim_start().chars().next()
}

#[allow(unsafe_code)] // FFI: see the SAFETY note
fn signal(pid: i32, signo: i32) {
    // SAFETY: kill(2) on a process this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(pid, signo) }, 0, "kill({pid}, {signo})");
}

/// Runs the command under `exec`, freezes distlock once the command runs, awaits
/// `while_frozen` (which must make the lease's validity deadline pass, and may let
/// another client take the lock), lets the command finish, waits until it has ended
/// (a zombie: its frozen parent cannot reap it), and resumes distlock.
async fn command_ends_while_distlock_is_frozen<F>(
    url: &str,
    ttl: &str,
    key: &str,
    while_frozen: F,
) -> Output
where
    F: std::future::Future<Output = ()>,
{
    let dir = tempfile::tempdir().unwrap();
    let exec = spawn_exec(url, ttl, key, dir.path());
    let pid_file = dir.path().join("pid");
    wait_until("the command runs", || pid_file.exists()).await;
    let command: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let distlock = i32::try_from(exec.id().expect("running")).unwrap();
    signal(distlock, libc::SIGSTOP);
    wait_until("distlock is stopped", || {
        process_state(distlock) == Some('T')
    })
    .await;
    while_frozen.await;
    std::fs::write(dir.path().join("go"), b"").unwrap();
    wait_until("the command has ended", || {
        process_state(command) == Some('Z')
    })
    .await;
    signal(distlock, libc::SIGCONT);
    tokio::time::timeout(Duration::from_secs(60), exec.wait_with_output())
        .await
        .expect("distlock exits after it resumes")
        .expect("distlock's output")
}

/// Waits until the lease of a distlock frozen at `frozen_at` with `ttl` can no longer
/// be valid (its last renewal was before the freeze), checking meanwhile that no one
/// else can take the lock: it is still held.
async fn outlast_the_lease(locks: &dyn DistributedLock, key: &LockKey, ttl: Duration) {
    let frozen_at = Instant::now();
    // Past the deadline by more than a second: what shows the Postgres backend that
    // its whole process was paused, not that the holder let its lease go.
    let past = frozen_at + ttl + Duration::from_millis(1200);
    // Waiting for a point in time is the event here: the deadline passing.
    tokio::time::sleep_until(past.into()).await;
    let options = LockOptions::new(Duration::from_secs(5)).with_wait(WaitPolicy::NoWait);
    let taken = locks.try_acquire(key, &options).await.expect("try_acquire");
    assert!(
        taken.is_none(),
        "the lock was free while distlock was frozen"
    );
}

/// Issue 20, item 1: frozen past the TTL, nobody takes the lock, the command ends
/// with 3; on resume the release finds the lock still ours, so exec exits 3, warns
/// about the pause, and does not claim to signal the finished command.
async fn nobody_took_it_so_the_command_code_is_passed_on(url: &str, ttl: Duration) {
    let locks = distlock::connect(url).await.expect("connects").lock();
    let ttl_flag = format!("{}ms", ttl.as_millis());
    for round in 0..ROUNDS {
        let key = format!("exec-paused/kept-{round}");
        let lock_key = LockKey::new(&key).unwrap();
        let out = command_ends_while_distlock_is_frozen(url, &ttl_flag, &key, async {
            outlast_the_lease(&*locks, &lock_key, ttl).await;
        })
        .await;
        let stderr = text(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(COMMAND_CODE),
            "round {round}: {stderr}"
        );
        assert!(
            stderr.contains("paused past the validity deadline") && stderr.contains("still ours"),
            "round {round}: the pause is reported: {stderr}"
        );
        assert!(!stderr.contains("SIGTERM"), "round {round}: {stderr}");
        assert!(!stderr.contains("sending"), "round {round}: {stderr}");
        // Released: free for the next owner.
        let options = LockOptions::new(Duration::from_secs(5)).with_wait(WaitPolicy::NoWait);
        let next = locks.try_acquire(&lock_key, &options).await.unwrap();
        assert!(next.is_some(), "round {round}: not released");
    }
}

fn started<T>(test: &str, server: Result<T, ServerError>) -> Option<T> {
    server.map_err(|e| skip_or_panic(test, &e)).ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_lease_outlived_by_a_pause_nobody_used_keeps_the_command_code() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    // Not shorter: a loaded CI machine can starve distlock for hundreds of milliseconds
    // before the freeze, and a lease that runs out then is lost, not outlived by a pause.
    nobody_took_it_so_the_command_code_is_passed_on(&url, Duration::from_millis(1500)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_lease_outlived_by_a_pause_nobody_used_keeps_the_command_code() {
    let test = "postgres_lease_outlived_by_a_pause_nobody_used_keeps_the_command_code";
    let Some(server) = started(test, PostgresServer::start().await) else {
        return;
    };
    // Well inside the 10 s idle_session_timeout: the session, and its lock, live on.
    nobody_took_it_so_the_command_code_is_passed_on(&server.url(), Duration::from_millis(1000))
        .await;
}

/// Issue 18, item 6: frozen past the TTL on Redis, another client takes the key, the
/// command ends with 3; on resume exec says the lock was lost, names the command's
/// exit code, and exits 124 in every round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lease_taken_during_a_pause_exits_124_naming_the_command_code() {
    let test = "redis_lease_taken_during_a_pause_exits_124_naming_the_command_code";
    let Some(server) = started(test, RedisServer::start().await) else {
        return;
    };
    let url = server.url();
    let locks = distlock::connect(&url).await.expect("connects").lock();
    for round in 0..ROUNDS {
        let key = format!("exec-paused/taken-{round}");
        let lock_key = LockKey::new(&key).unwrap();
        let mut taker = None;
        let out = command_ends_while_distlock_is_frozen(&url, "500ms", &key, async {
            // Granted once the frozen holder's key expires on the server.
            let options = LockOptions::new(Duration::from_secs(30))
                .with_wait(WaitPolicy::Timeout(Duration::from_secs(30)));
            taker = Some(
                locks
                    .acquire(&lock_key, &options)
                    .await
                    .expect("taken over"),
            );
        })
        .await;
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(124), "round {round}: {stderr}");
        assert!(stderr.contains("lost"), "round {round}: {stderr}");
        assert!(
            stderr.contains(&format!("exited with {COMMAND_CODE}")),
            "round {round}: the command's own code is named: {stderr}"
        );
        assert!(!stderr.contains("sending"), "round {round}: {stderr}");
        // The new holder's lock was left alone by the stale release.
        let taker = taker.expect("the second client holds the lock");
        assert_eq!(
            taker.release().await.unwrap(),
            distlock::ReleaseOutcome::Released,
            "round {round}"
        );
    }
}

/// Issue 20, item 7: the Postgres server dies under a running command. exec stops the
/// command (124) and, unable to release, says what Postgres does with such a lock: it
/// ended with the server's session, not "when its lease runs out".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_lock_that_died_with_its_server_is_described_as_such() {
    let test = "a_postgres_lock_that_died_with_its_server_is_described_as_such";
    let Some(mut server) = started(test, PostgresServer::start().await) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let script = format!(
        r#"trap 'kill $!; exit 0' TERM
           sleep 60 & touch "{}"; wait"#,
        ready.display()
    );
    let exec = Command::new(env!("CARGO_BIN_EXE_distlock"))
        .env_remove("DISTLOCK_BACKEND")
        .args(["exec", "--backend", &server.url(), "--ttl", "2s"])
        .args(["exec-lease/server-died", "--", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("distlock starts");
    wait_until("the command runs", || ready.exists()).await;
    server.kill();
    let out = tokio::time::timeout(Duration::from_secs(60), exec.wait_with_output())
        .await
        .expect("distlock exits once the lock is gone")
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(124), "{stderr}");
    assert!(stderr.contains("could not release"), "{stderr}");
    assert!(
        stderr.contains("lives as long as its database session"),
        "the Postgres semantics are stated: {stderr}"
    );
    assert!(!stderr.contains("lease runs out"), "{stderr}");
    assert!(
        stderr.contains("exited with 0"),
        "the stopped command's own code: {stderr}"
    );
}

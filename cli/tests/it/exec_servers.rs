//! `distlock exec` end to end on real servers and on the file backend: concurrent
//! `exec` processes never run their commands at the same time; a lock lost under a
//! running command (its connection cut by a fault proxy) terminates the command's whole
//! process group; `--no-wait` and `--wait` give up with exit code 75; the lock is
//! released when the command ends, and freed when a holder is killed with -9; a waiter
//! stopped by a signal does not hold up the next one.
// The tests signal the processes they start (libc::kill).
#![allow(unsafe_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_test_servers::FaultProxy;
use distlock_test_servers::{
    skip_or_panic, PostgresServer, RedisServer, ServerError, ZooKeeperServer,
};
use tokio::process::Command;

fn distlock() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_distlock"));
    command
        .env_remove("DISTLOCK_BACKEND")
        .env("RUST_BACKTRACE", "1")
        .kill_on_drop(true);
    command
}

/// `distlock exec --backend URL [extra…] KEY -- sh -c SCRIPT`, output captured.
fn exec_sh(url: &str, extra: &[&str], key: &str, script: &str) -> Command {
    let mut command = distlock();
    command
        .args(["exec", "--backend", url])
        .args(extra)
        .args([key, "--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

async fn output(mut command: Command) -> Output {
    tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .expect("distlock exec finishes within a minute")
        .expect("the distlock binary runs")
}

/// Waits (polling the file system, which has no event to wait on) until `path` exists.
async fn wait_for_file(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether `pid` is gone (or a zombie nobody reaped yet, which runs nothing).
fn is_dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// Three `exec` processes started together on one key: their commands' intervals,
/// written by the commands themselves with nanosecond timestamps, never overlap, and
/// their fencing tokens increase in the order they ran.
async fn commands_never_overlap(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let script = format!(
        r#"echo "start $DISTLOCK_FENCING_TOKEN $(date +%s%N)" >> "{log}"
           sleep 0.2
           echo "end $DISTLOCK_FENCING_TOKEN $(date +%s%N)" >> "{log}""#,
        log = log.display()
    );
    let runs: Vec<_> = (0..3)
        .map(|_| {
            let mut command = exec_sh(url, &["--wait", "30s"], "exec-e2e/overlap", &script);
            command.spawn().expect("distlock starts")
        })
        .collect();
    for run in runs {
        let out = tokio::time::timeout(Duration::from_secs(60), run.wait_with_output())
            .await
            .expect("every exec finishes")
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    }
    let lines = std::fs::read_to_string(&log).unwrap();
    let events: Vec<(String, u64, u128)> = lines
        .lines()
        .map(|line| {
            let parts: Vec<&str> = line.split(' ').collect();
            assert_eq!(parts.len(), 3, "{lines}");
            (
                parts[0].to_owned(),
                parts[1].parse().unwrap(),
                parts[2].parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(events.len(), 6, "{lines}");
    let mut previous: Option<(u64, u128)> = None;
    for pair in events.chunks(2) {
        let (start, end) = (&pair[0], &pair[1]);
        assert_eq!(
            (start.0.as_str(), end.0.as_str()),
            ("start", "end"),
            "{lines}"
        );
        assert_eq!(start.1, end.1, "interleaved commands: {lines}");
        assert!(start.2 <= end.2, "{lines}");
        if let Some((token, ended)) = previous {
            assert!(start.2 >= ended, "overlapping commands: {lines}");
            assert!(start.1 > token, "fencing tokens must increase: {lines}");
        }
        previous = Some((end.1, end.2));
    }
}

/// A holder whose connection is cut loses its lock; its command (and the command's
/// children) is terminated: with SIGTERM, or SIGKILL after `--kill-after` when the
/// command ignores SIGTERM. distlock exits 124 and says so on stderr.
async fn lost_lock_terminates_the_command(
    upstream: SocketAddr,
    url_for: impl Fn(SocketAddr) -> String,
    ignore_term: bool,
) {
    let proxy = FaultProxy::start(upstream).await.expect("proxy starts");
    let url = url_for(proxy.local_addr());
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let pid_file = dir.path().join("pid");
    let termed = dir.path().join("termed");
    let trap = if ignore_term {
        "trap '' TERM".to_owned()
    } else {
        format!(
            r#"trap 'touch "{}"; kill $!; exit 0' TERM"#,
            termed.display()
        )
    };
    let script = format!(
        r#"{trap}
           sleep 60 & echo $! > "{pid}"; touch "{ready}"; wait"#,
        pid = pid_file.display(),
        ready = ready.display(),
    );
    let mut command = exec_sh(
        &url,
        &["--ttl", "1500ms", "--kill-after", "1s"],
        "exec-e2e/lost",
        &script,
    );
    let run = command.spawn().expect("distlock starts");
    wait_for_file(&ready).await;
    let grandchild: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let cut_at = Instant::now();
    proxy.cut();
    let out = tokio::time::timeout(Duration::from_secs(60), run.wait_with_output())
        .await
        .expect("distlock exits after losing the lock")
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(124), "{stderr}");
    assert!(stderr.contains("lost"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    if ignore_term {
        assert!(stderr.contains("SIGKILL"), "{stderr}");
        assert!(cut_at.elapsed() >= Duration::from_secs(1), "grace period");
    } else {
        assert!(termed.exists(), "the command never got SIGTERM: {stderr}");
        assert!(!stderr.contains("SIGKILL"), "{stderr}");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !is_dead(grandchild) {
        assert!(
            Instant::now() < deadline,
            "the command's child {grandchild} survived"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// While one `exec` holds the key, `--no-wait` and `--wait` give up with 75 without
/// running their command; SIGTERM to the holder reaches its command, whose exit code is
/// passed on, and the lock is free again afterwards.
async fn busy_lock_exit_codes_and_release(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let got = dir.path().join("got");
    let ran = dir.path().join("ran");
    let key = "exec-e2e/busy";
    let holder_script = format!(
        r#"trap 'touch "{got}"; kill $!; exit 7' TERM
           sleep 60 & touch "{ready}"; wait"#,
        got = got.display(),
        ready = ready.display(),
    );
    let holder = exec_sh(url, &[], key, &holder_script)
        .spawn()
        .expect("distlock starts");
    wait_for_file(&ready).await;
    let touch_ran = format!(r#"touch "{}""#, ran.display());

    let out = output(exec_sh(url, &["--no-wait"], key, &touch_ran)).await;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("error: ") && stderr.contains("held"),
        "{stderr}"
    );

    let started = Instant::now();
    let out = output(exec_sh(url, &["--wait", "300ms"], key, &touch_ran)).await;
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(!ran.exists(), "a command ran without the lock");

    let pid = libc::pid_t::try_from(holder.id().expect("running")).unwrap();
    // SAFETY: kill(2) on the child we spawned and have not reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let out = tokio::time::timeout(Duration::from_secs(30), holder.wait_with_output())
        .await
        .expect("the holder exits")
        .unwrap();
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    assert!(got.exists(), "SIGTERM did not reach the command");

    // Released: the next --no-wait gets it at once.
    let out = output(exec_sh(url, &["--no-wait"], key, &touch_ran)).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(ran.exists());
}

/// How long after the holder's command ends the next waiter's command may start: the
/// holder's release, the waiter's wake-up and grant, and two processes started (`sh`,
/// `date`), tens of milliseconds; this is generous for a busy machine, and well below
/// how long a place left by a dead waiter would block the queue: a Redis FIFO entry's
/// TTL (3 s), the ZooKeeper session timeout these tests ask for
/// ([`ZK_WAITER_SESSION_MS`]).
const HANDOFF_BOUND: Duration = Duration::from_millis(750);

/// The key of [`signalled_waiter_does_not_delay_the_next`].
const SIGNALLED_KEY: &str = "exec-e2e/signalled-waiter";

/// The ZooKeeper session timeout of [`signalled_waiter_does_not_delay_the_next`]: a
/// waiter's contender node left to expire with its session would hold the queue this
/// long, far past [`HANDOFF_BOUND`].
const ZK_WAITER_SESSION_MS: u64 = 10_000;

/// Counts the waiters queued behind the holder of a key, as the server sees them.
type WaiterCount =
    Box<dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = usize> + Send>>>;

/// Polls `count` until it reaches `n` (there is no event to wait on from outside).
async fn wait_for_waiters(count: &WaiterCount, n: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if count().await >= n {
            return;
        }
        assert!(Instant::now() < deadline, "{what} never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A holder; a second `exec` waiting behind it, stopped by SIGTERM (exit 143); a third
/// `exec --wait` on the key runs its command within [`HANDOFF_BOUND`] of the holder's
/// command ending: the signalled waiter left nothing in the queue.
///
/// `queued` counts what the server keeps of waiters: it must be zero as soon as the
/// signalled waiter has exited (`None` where the server learns of the exit later: a
/// Postgres backend blocked in a lock wait notices its closed connection only when it
/// is granted, and then lets go at once).
async fn signalled_waiter_does_not_delay_the_next(
    url: &str,
    waiters: WaiterCount,
    queued: Option<WaiterCount>,
) {
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let ended = dir.path().join("ended");
    let started = dir.path().join("started");
    let key = SIGNALLED_KEY;
    let holder_script = format!(
        r#"trap 'kill $!; date +%s%N > "{ended}"; exit 0' TERM
           sleep 60 & touch "{ready}"; wait"#,
        ended = ended.display(),
        ready = ready.display(),
    );
    let holder = exec_sh(url, &[], key, &holder_script)
        .spawn()
        .expect("distlock starts");
    wait_for_file(&ready).await;

    let waiter = exec_sh(url, &["--wait", "60s"], key, "true")
        .spawn()
        .expect("distlock starts");
    wait_for_waiters(&waiters, 1, "the second exec").await;
    let pid = libc::pid_t::try_from(waiter.id().expect("running")).unwrap();
    // SAFETY: kill(2) on the child we spawned and have not reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let out = tokio::time::timeout(Duration::from_secs(30), waiter.wait_with_output())
        .await
        .expect("the signalled waiter exits")
        .unwrap();
    assert_eq!(out.status.code(), Some(143), "{}", text(&out.stderr));
    if let Some(queued) = queued {
        assert_eq!(
            queued().await,
            0,
            "the signalled waiter exited and left its place in the queue"
        );
    }

    let record_start = format!(r#"date +%s%N > "{}""#, started.display());
    let next = exec_sh(url, &["--wait", "20s"], key, &record_start)
        .spawn()
        .expect("distlock starts");
    // The third exec queued (or, on a backend that kept the signalled waiter's place,
    // that place still there: the hand-off below shows which).
    wait_for_waiters(&waiters, 1, "the third exec").await;

    let pid = libc::pid_t::try_from(holder.id().expect("running")).unwrap();
    // SAFETY: kill(2) on the child we spawned and have not reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let out = tokio::time::timeout(Duration::from_secs(30), holder.wait_with_output())
        .await
        .expect("the holder exits")
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = tokio::time::timeout(Duration::from_secs(60), next.wait_with_output())
        .await
        .expect("the third exec finishes")
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    let nanos = |path: &Path| -> u128 {
        std::fs::read_to_string(path)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let (ended, started) = (nanos(&ended), nanos(&started));
    assert!(
        started >= ended,
        "the third command ran before the holder's ended"
    );
    let handoff = Duration::from_nanos(u64::try_from(started - ended).unwrap());
    println!("{url}: the third exec ran {handoff:?} after the holder's command ended");
    assert!(
        handoff <= HANDOFF_BOUND,
        "the third exec ran {handoff:?} after the holder's command ended: the signalled \
         waiter held up the queue"
    );
}

/// Waiters on ZooKeeper: contender nodes in the key's lock directory, less the holder's
/// (`dump` lists every session's ephemeral nodes).
fn zookeeper_waiters(server: Arc<ZooKeeperServer>, key: &str) -> WaiterCount {
    let key = distlock::LockKey::new(key).unwrap();
    let dir = format!("/distlock/{}/", distlock::zookeeper::encode_key(&key));
    Box::new(move || {
        let (server, dir) = (server.clone(), dir.clone());
        Box::pin(async move {
            let dump = server
                .four_letter("dump", Duration::from_secs(5))
                .await
                .expect("dump");
            dump.lines()
                .filter(|line| line.trim().starts_with(&dir))
                .count()
                .saturating_sub(1)
        })
    })
}

/// Runs `program args…` to completion and returns its stdout.
async fn stdout_of(program: &str, args: &[&str]) -> String {
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        Command::new(program).args(args).output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{program} answers"))
    .unwrap_or_else(|e| panic!("{program} runs: {e}"));
    assert!(out.status.success(), "{program}: {}", text(&out.stderr));
    text(&out.stdout)
}

/// Waiters on Postgres: advisory locks requested and not granted (the test's server
/// has no other).
fn postgres_waiters(url: String) -> WaiterCount {
    Box::new(move || {
        let url = url.clone();
        Box::pin(async move {
            let sql = "select count(*) from pg_locks where locktype = 'advisory' and not granted";
            let count = stdout_of("psql", &[&url, "-Atc", sql]).await;
            count.trim().parse().expect("a count")
        })
    })
}

/// Waiters on Redis: clients subscribed to a channel or blocked in a command (how a
/// waiter is woken is the backend's business; the test's server has no other clients
/// that wait).
fn redis_waiters(port: u16) -> WaiterCount {
    Box::new(move || {
        let port = port.to_string();
        Box::pin(async move {
            let clients = stdout_of("redis-cli", &["-p", &port, "CLIENT", "LIST"]).await;
            clients
                .lines()
                .filter(|client| {
                    client.split(' ').any(|field| match field.split_once('=') {
                        Some(("sub" | "psub" | "ssub", n)) => n != "0",
                        Some(("flags", flags)) => flags.contains('b'),
                        _ => false,
                    })
                })
                .count()
        })
    })
}

/// Entries in a Redis key's FIFO queue (`ZCARD {K}:queue`).
fn redis_queue(port: u16, key: &str) -> WaiterCount {
    let queue = distlock::redis::KeyNames::for_key(&distlock::LockKey::new(key).unwrap()).queue();
    Box::new(move || {
        let (port, queue) = (port.to_string(), queue.clone());
        Box::pin(async move {
            let count = stdout_of("redis-cli", &["-p", &port, "ZCARD", &queue]).await;
            count.trim().parse().expect("a count")
        })
    })
}

/// Waiters on the file backend: `flock` requests blocked on the key's lock file
/// (`->` lines of /proc/locks with its inode).
fn file_waiters(dir: &Path, key: &str) -> WaiterCount {
    use std::os::unix::fs::MetadataExt as _;
    let locks = distlock::file::FileLock::open(dir).unwrap();
    let path = locks.lock_file_path(&distlock::LockKey::new(key).unwrap());
    Box::new(move || {
        let path = path.clone();
        Box::pin(async move {
            let Ok(inode) = std::fs::metadata(&path).map(|m| m.ino()) else {
                return 0;
            };
            let inode = format!(":{inode} ");
            std::fs::read_to_string("/proc/locks")
                .unwrap()
                .lines()
                .filter(|line| line.contains("->") && line.contains(&inode))
                .count()
        })
    })
}

fn started<T>(test: &str, server: Result<T, ServerError>) -> Option<T> {
    server.map_err(|e| skip_or_panic(test, &e)).ok()
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_on_redis() {
    let Some(server) = started("exec_on_redis", RedisServer::start().await) else {
        return;
    };
    commands_never_overlap(&server.url()).await;
    busy_lock_exit_codes_and_release(&server.url()).await;
    signalled_waiter_does_not_delay_the_next(
        &server.url(),
        redis_waiters(server.port()),
        Some(redis_queue(server.port(), SIGNALLED_KEY)),
    )
    .await;
    lost_lock_terminates_the_command(loopback(server.port()), |a| format!("redis://{a}"), false)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_on_postgres() {
    let Some(server) = started("exec_on_postgres", PostgresServer::start().await) else {
        return;
    };
    commands_never_overlap(&server.url()).await;
    signalled_waiter_does_not_delay_the_next(&server.url(), postgres_waiters(server.url()), None)
        .await;
    lost_lock_terminates_the_command(
        loopback(server.port()),
        |a| format!("postgres://postgres@{a}/postgres"),
        true,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_on_zookeeper() {
    let Some(server) = started("exec_on_zookeeper", ZooKeeperServer::start().await) else {
        return;
    };
    commands_never_overlap(&server.url()).await;
    let server = Arc::new(server);
    signalled_waiter_does_not_delay_the_next(
        &format!("{}?session_timeout_ms={ZK_WAITER_SESSION_MS}", server.url()),
        zookeeper_waiters(server.clone(), SIGNALLED_KEY),
        Some(zookeeper_waiters(server.clone(), SIGNALLED_KEY)),
    )
    .await;
    // A short session, so that the cut session expires in seconds.
    lost_lock_terminates_the_command(
        loopback(server.port()),
        |a| format!("zk://{a}?session_timeout_ms=2000"),
        false,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_on_file() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    commands_never_overlap(&url).await;
    busy_lock_exit_codes_and_release(&url).await;
    signalled_waiter_does_not_delay_the_next(
        &url,
        file_waiters(dir.path(), SIGNALLED_KEY),
        Some(file_waiters(dir.path(), SIGNALLED_KEY)),
    )
    .await;
    holder_killed_with_9_frees_the_lock(&url).await;
}

/// A holder `distlock` killed with -9 leaves no lock behind on the file backend: the
/// kernel drops its file lock with the process.
async fn holder_killed_with_9_frees_the_lock(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let key = "exec-e2e/killed";
    let script = format!(
        r#"trap 'kill $!; exit 0' TERM
           sleep 60 & touch "{ready}"; wait"#,
        ready = ready.display(),
    );
    let mut holder = exec_sh(url, &[], key, &script)
        .spawn()
        .expect("distlock starts");
    wait_for_file(&ready).await;
    let out = output(exec_sh(url, &["--no-wait"], key, "true")).await;
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    holder.kill().await.expect("kill -9 the holder");
    let out = output(exec_sh(url, &["--no-wait"], key, "true")).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

/// Without `--backend` or `DISTLOCK_BACKEND`, exec uses `file://`: the file backend's
/// default directory, `/tmp/distlock-<uid>`, whatever `TMPDIR` or `XDG_RUNTIME_DIR` say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_defaults_to_the_file_backend() {
    let scratch = tempfile::tempdir().unwrap();
    let ready = scratch.path().join("ready");
    let key = format!("exec-e2e/default-{}", std::process::id());
    let mut holder = distlock();
    holder
        .env("XDG_RUNTIME_DIR", scratch.path())
        .env("TMPDIR", scratch.path())
        .args(["exec", &key, "--", "sh", "-c"])
        .arg(format!(
            r#"test "$DISTLOCK_BACKEND" = file:// || exit 9
               trap 'kill $!; exit 0' TERM
               sleep 60 & touch "{}"; wait"#,
            ready.display()
        ));
    let holder = holder.spawn().expect("distlock starts");
    wait_for_file(&ready).await;
    let explicit = format!("file://{}", distlock::file::default_dir().display());
    let out = output(exec_sh(&explicit, &["--no-wait"], &key, "true")).await;
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));

    let pid = libc::pid_t::try_from(holder.id().expect("running")).unwrap();
    // SAFETY: kill(2) on the child we spawned and have not reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let out = tokio::time::timeout(Duration::from_secs(30), holder.wait_with_output())
        .await
        .expect("the holder exits")
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // Lock files are never deleted by the backend; this test's own one can go.
    let locks = distlock::file::FileLock::open(distlock::file::default_dir()).unwrap();
    let key = distlock::LockKey::new(&key).unwrap();
    std::fs::remove_file(locks.lock_file_path(&key)).unwrap();
}

/// Waiting execs on Redis queue in arrival order (they ask for FIFO): each is seen in
/// the key's queue before the next starts, and after the holder's release they run in
/// that order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_execs_run_in_arrival_order_on_redis() {
    let Some(server) = started(
        "waiting_execs_run_in_arrival_order_on_redis",
        RedisServer::start().await,
    ) else {
        return;
    };
    let url = server.url();
    let key = "exec-fifo";
    let lock_key = distlock::LockKey::new(key).unwrap();
    let locks = distlock::connect(&url).await.unwrap().lock();
    let holder = locks
        .acquire(&lock_key, &distlock::LockOptions::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("order");
    let mut execs = Vec::new();
    for n in 0..4 {
        let script = format!("echo {n} >> '{}'", log.display());
        execs.push(exec_sh(&url, &[], key, &script).spawn().unwrap());
        let deadline = Instant::now() + Duration::from_secs(30);
        while locks.inspect(&lock_key).await.unwrap().waiters != Some(n + 1) {
            assert!(Instant::now() < deadline, "exec {n} never queued");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    holder.release().await.unwrap();
    for exec in execs {
        let out = tokio::time::timeout(Duration::from_secs(60), exec.wait_with_output())
            .await
            .expect("exec finishes")
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let order = std::fs::read_to_string(&log).unwrap();
    assert_eq!(order, "0\n1\n2\n3\n");
}

/// Three replicas of a cron line whose clocks read 2 s behind, right and 2 s ahead
/// (`faketime`), each firing `distlock exec` at its own 5 s boundaries, for `firings`
/// firings; `mode` is exec's flags before KEY. Returns how often each firing ran (by the
/// nominal time each replica fired for).
async fn skewed_replicas(url: &str, key: &str, mode: &[&str], firings: u64) -> Vec<usize> {
    const PERIOD: u64 = 5;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("runs");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // The first boundary every replica reaches after the start, whatever its clock.
    let first = (now + 2 + PERIOD) / PERIOD * PERIOD;
    let mut replicas = Vec::new();
    for offset in [-2i64, 0, 2] {
        let (url, log, mode) = (
            url.to_owned(),
            log.clone(),
            mode.iter().map(|m| m.to_string()).collect::<Vec<_>>(),
        );
        let key = key.to_owned();
        replicas.push(tokio::spawn(async move {
            for n in 0..firings {
                let boundary = first + n * PERIOD;
                // This replica's clock reaches the boundary `offset` seconds early.
                let due =
                    std::time::UNIX_EPOCH + Duration::from_secs((boundary as i64 - offset) as u64);
                if let Ok(wait) = due.duration_since(std::time::SystemTime::now()) {
                    tokio::time::sleep(wait).await;
                }
                let script = format!("echo {boundary} >> '{}'; sleep 0.01", log.display());
                let mut command = Command::new("faketime");
                command
                    .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
                    .env_remove("DISTLOCK_BACKEND")
                    .args(["-f", &format!("{offset:+}s")])
                    .arg(env!("CARGO_BIN_EXE_distlock"))
                    .args(["exec", "--backend", &url])
                    .args(&mode)
                    .args([&key, "--", "sh", "-c", &script])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .kill_on_drop(true);
                let out = output(command).await;
                let code = out.status.code();
                assert!(
                    code == Some(0) || code == Some(75),
                    "replica {offset:+}s firing {boundary}: {code:?} {}",
                    text(&out.stderr)
                );
            }
        }));
    }
    for replica in replicas {
        replica.await.unwrap();
    }
    let runs = std::fs::read_to_string(&log).unwrap_or_default();
    (0..firings)
        .map(|n| {
            let boundary = (first + n * PERIOD).to_string();
            runs.lines().filter(|line| *line == boundary).count()
        })
        .collect()
}

/// `exec --once-per` on every replica of a cron line: under 2 s of skew each way, every
/// firing runs exactly once. The same line keyed by name only (`--no-wait`) runs
/// firings more than once, which shows the test can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_per_runs_every_firing_once_under_skew() {
    let Some(server) = started(
        "once_per_runs_every_firing_once_under_skew",
        RedisServer::start().await,
    ) else {
        return;
    };
    let url = server.url();
    let once = skewed_replicas(&url, "report", &["--once-per", "5s"], 10).await;
    assert_eq!(once, vec![1; 10], "runs per firing with --once-per");
    let plain = skewed_replicas(&url, "report-plain", &["--no-wait"], 4).await;
    let total: usize = plain.iter().sum();
    println!("--no-wait: {total} runs of 4 firings: {plain:?}");
    assert!(total > 4, "no double run with --no-wait: {plain:?}");
}

/// `--once-per` tells the command its firing and skips a firing done elsewhere with 75;
/// `--at-least` keeps the lock after a short command; both are refused (exit 2) on a
/// backend whose leases do not outlive distlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_per_and_at_least_on_redis() {
    let Some(server) = started("once_per_and_at_least_on_redis", RedisServer::start().await) else {
        return;
    };
    let url = server.url();
    let first = output(exec_sh(
        &url,
        &["--once-per", "1h"],
        "hourly",
        "echo $DISTLOCK_FIRING",
    ))
    .await;
    assert!(first.status.success(), "{}", text(&first.stderr));
    let firing: u64 = text(&first.stdout)
        .trim()
        .parse()
        .expect("DISTLOCK_FIRING is a number");
    assert_eq!(firing % 3600, 0, "the firing is the hour's boundary");
    let again = output(exec_sh(&url, &["--once-per", "1h"], "hourly", "echo ran")).await;
    assert_eq!(again.status.code(), Some(75), "{}", text(&again.stderr));
    assert!(
        text(&again.stderr).contains("ran elsewhere"),
        "{}",
        text(&again.stderr)
    );
    assert!(text(&again.stdout).is_empty());

    let started = Instant::now();
    let short = output(exec_sh(&url, &["--at-least", "3s"], "nightly", "true")).await;
    assert!(short.status.success(), "{}", text(&short.stderr));
    let held = output(exec_sh(&url, &["--no-wait"], "nightly", "true")).await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "too slow to check"
    );
    assert_eq!(held.status.code(), Some(75), "released before --at-least");
    let later = output(exec_sh(&url, &["--wait", "10s"], "nightly", "true")).await;
    assert!(later.status.success(), "{}", text(&later.stderr));
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "granted before --at-least ended"
    );

    let dir = tempfile::tempdir().unwrap();
    let file = format!("file://{}", dir.path().display());
    for flags in [&["--once-per", "1m"][..], &["--at-least", "1s"][..]] {
        let refused = output(exec_sh(&file, flags, "k", "echo ran")).await;
        assert_eq!(refused.status.code(), Some(2), "{}", text(&refused.stderr));
        assert!(
            text(&refused.stderr).contains("file"),
            "{}",
            text(&refused.stderr)
        );
        assert!(text(&refused.stdout).is_empty());
    }
}

//! File-backend elections across processes: a leader killed with -9 never reads as
//! leader and its standby leads at once, and the failover times over many trials.
//!
//! The leader processes are this test binary run again on [`leader_process`], which
//! holds its leadership while `DISTLOCK_ELECTION_HOLD` is set.

use std::io::{BufRead as _, BufReader};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use distlock_api::{Candidate, LeaderElection, Leadership, LockKey, LockOptions, WaitPolicy};
use distlock_file::FileLock;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(60);
const TRIALS: usize = 20;
/// What a leader process prints once it leads.
const LEADING: &str = "leading in term ";

fn candidate(label: &str) -> Candidate {
    Candidate::new(label).expect("valid identity")
}

fn no_wait() -> LockOptions {
    LockOptions::new(TTL).with_wait(WaitPolicy::NoWait)
}

fn waiting(limit: Duration) -> LockOptions {
    LockOptions::new(TTL).with_wait(WaitPolicy::Timeout(limit))
}

/// A leader: campaigns, reads itself back as leader, then resigns and reads nobody.
/// Run by [`spawn_leader`] with `DISTLOCK_ELECTION_HOLD` set, it leads in the
/// directory and election it is given, says so, and holds on until it is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_process() {
    // Run by `spawn_leader`, it is killed: a directory of its own would stay behind.
    let (_own, dir) = match std::env::var_os("DISTLOCK_ELECTION_DIR") {
        Some(dir) => (None, PathBuf::from(dir)),
        None => {
            let own = tempfile::tempdir().expect("temp dir");
            let dir = own.path().to_owned();
            (Some(own), dir)
        }
    };
    let name = std::env::var("DISTLOCK_ELECTION_NAME").unwrap_or_else(|_| "solo".into());
    let name = LockKey::new(name).expect("valid name");
    let me = candidate(&format!("process-{}", std::process::id()));
    let election = FileLock::open(&dir).expect("opens").election();
    let leader = election
        .campaign(&name, &me, &waiting(Duration::from_secs(30)))
        .await
        .expect("leads");
    let read = election.leader(&name).await.expect("reads");
    assert!(
        read.as_ref()
            .is_some_and(|l| l.candidate == me && l.term == leader.term()),
        "{read:?}"
    );
    if std::env::var_os("DISTLOCK_ELECTION_HOLD").is_some() {
        println!("{LEADING}{}", leader.term());
        tokio::time::sleep(Duration::from_secs(60)).await;
    }
    leader.resign().await.expect("resigns");
    assert!(election.leader(&name).await.expect("reads").is_none());
}

/// This binary as a leader of `name` in `dir`, in its own process group; returns once
/// it leads, with its term.
fn spawn_leader(dir: &Path, name: &LockKey) -> (Child, u64) {
    // libtest names a test by its module path without the crate: `election::leader_process`.
    let module = module_path!()
        .split_once("::")
        .map_or("", |(_, module)| module);
    let mut child = Command::new(std::env::current_exe().expect("the test binary"))
        .args([
            &format!("{module}::leader_process"),
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("DISTLOCK_ELECTION_DIR", dir)
        .env("DISTLOCK_ELECTION_NAME", name.as_str())
        .env("DISTLOCK_ELECTION_HOLD", "1")
        .stdout(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("the test binary runs");
    let stdout = child.stdout.take().expect("piped stdout");
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("reads the leader's output");
        // libtest may print the test's name on the same line first.
        if let Some((_, term)) = line.split_once(LEADING) {
            return (child, term.trim().parse().expect("a term"));
        }
    }
    let status = child.wait().expect("reaps the leader");
    panic!("the leader process ended ({status}) without leading");
}

#[allow(unsafe_code)] // FFI: see the SAFETY note
fn kill_group(child: &mut Child) {
    let pgid = i32::try_from(child.id()).expect("pid fits");
    // SAFETY: kill(2) with a negative pid signals that process group; no memory is shared.
    let rc = unsafe { libc::kill(-pgid, libc::SIGKILL) };
    assert_eq!(rc, 0, "kill -9 of the leader's process group");
    child.wait().expect("reaps the leader");
}

/// Threads of this process blocked in `flock` for a waiting campaign (named
/// `distlock-file-wait`, which the kernel shortens to 15 bytes).
fn parked_waiters() -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim() == "distlock-file-w")
        .count()
}

/// Waits (bounded) until the waiting threads of earlier trials are gone.
async fn until_no_waiters() {
    let deadline = Instant::now() + Duration::from_secs(10);
    while parked_waiters() > 0 {
        assert!(
            Instant::now() < deadline,
            "a waiting thread outlived its campaign"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Waits (bounded) until a campaign of this process waits in `flock`.
async fn until_parked() {
    let deadline = Instant::now() + Duration::from_secs(10);
    while parked_waiters() == 0 {
        assert!(
            Instant::now() < deadline,
            "the standby never waited in flock"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A standby campaigning for `name` in the background: its leadership and when it won.
fn standby(
    election: Arc<dyn LeaderElection>,
    name: &LockKey,
) -> tokio::task::JoinHandle<(Leadership, Instant)> {
    let name = name.clone();
    tokio::spawn(async move {
        let won = election
            .campaign(
                &name,
                &candidate("standby"),
                &waiting(Duration::from_secs(30)),
            )
            .await
            .expect("the standby leads");
        (won, Instant::now())
    })
}

fn summary(what: &str, samples: &mut [Duration]) -> Duration {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    let (p50, p99) = (at(0.5), at(0.99));
    println!(
        "failover {what}: {} trials, p50 {:.2} ms, p99 {:.2} ms",
        samples.len(),
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3
    );
    p99
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leaders_record_never_reads_as_leader() {
    let dir = tempfile::tempdir().expect("temp dir");
    let locks = FileLock::open(dir.path()).expect("opens");
    let observer = locks.election();
    let name = LockKey::new("Killed/Leader").expect("valid name");
    let (mut child, term) = spawn_leader(dir.path(), &name);
    let read = observer.leader(&name).await.expect("reads");
    let expected = format!("process-{}", child.id());
    assert!(
        read.as_ref()
            .is_some_and(|l| l.candidate.as_bytes() == expected.as_bytes() && l.term.get() == term),
        "{read:?}"
    );
    assert!(observer
        .try_campaign(&name, &candidate("observer"), &no_wait())
        .await
        .expect("tries")
        .is_none());
    kill_group(&mut child);
    // The dead leader's record stays in its file, but never reads as leader.
    let record = std::fs::read(locks.leader_file_path(&name)).expect("the leader file stays");
    assert!(
        record.ends_with(expected.as_bytes()),
        "{:?}",
        String::from_utf8_lossy(&record)
    );
    let read = observer.leader(&name).await.expect("reads");
    assert!(read.is_none(), "a killed leader read as {read:?}");
    // The next leader overwrites it, in a higher term.
    let next = observer
        .campaign(&name, &candidate("next"), &no_wait())
        .await
        .expect("leads the freed election");
    assert!(next.term().get() > term);
    let read = observer.leader(&name).await.expect("reads");
    assert!(read.is_some_and(|l| l.candidate.as_bytes() == b"next"));
    next.resign().await.expect("resigns");
    assert!(
        !locks.leader_file_path(&name).exists(),
        "a resign leaves the leader file"
    );
    assert!(observer.leader(&name).await.expect("reads").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_after_resign_and_kill() {
    let dir = tempfile::tempdir().expect("temp dir");
    let a = FileLock::open(dir.path()).expect("opens").election();
    let b = FileLock::open(dir.path()).expect("opens").election();
    let bound = Duration::from_secs(1);

    // Resign: from the call to the standby's campaign returning.
    let mut resign = Vec::new();
    for trial in 0..TRIALS {
        let name = LockKey::new(format!("resign-{trial}")).expect("valid name");
        let leader = a
            .campaign(&name, &candidate("leader"), &no_wait())
            .await
            .expect("leads");
        until_no_waiters().await;
        let waiting = standby(b.clone(), &name);
        until_parked().await;
        let resigned_at = Instant::now();
        leader.resign().await.expect("resigns");
        let (won, won_at) = waiting.await.expect("the standby task");
        resign.push(won_at - resigned_at);
        won.resign().await.expect("resigns");
    }
    let p99 = summary("on resign", &mut resign);
    assert!(p99 <= bound, "resign failover p99 {p99:?}");

    // A leader process killed with -9: from the kill to the standby's campaign
    // returning.
    let mut killed = Vec::new();
    for trial in 0..TRIALS {
        let name = LockKey::new(format!("kill-{trial}")).expect("valid name");
        let (mut child, term) = spawn_leader(dir.path(), &name);
        until_no_waiters().await;
        let waiting = standby(b.clone(), &name);
        until_parked().await;
        let killed_at = Instant::now();
        kill_group(&mut child);
        let (won, won_at) = waiting.await.expect("the standby task");
        killed.push(won_at - killed_at);
        assert!(won.term().get() > term);
        won.resign().await.expect("resigns");
    }
    let p99 = summary("on a killed leader process", &mut killed);
    assert!(p99 <= bound, "kill failover p99 {p99:?}");
}

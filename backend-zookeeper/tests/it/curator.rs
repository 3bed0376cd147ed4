//! Interoperability with the real Apache Curator (Debian's jars): its
//! `InterProcessReadWriteLock` and `InterProcessSemaphoreV2` on the paths of our
//! read-write lock and semaphore exclude and count together with ours, and its
//! `LeaderLatch` on the path of our election elects one leader with ours.
//!
//! A small Java driver (tests/curator/CuratorDriver.java) is compiled with `javac` into
//! a temporary directory at test time and driven over stdin/stdout.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use distlock_api::{Candidate, LockError, LockKey, LockOptions, RwMode, WaitPolicy};
use distlock_test_servers::{skip_or_panic, ServerError};
use distlock_zookeeper::{ZooKeeperLock, LATCH_NAME, LEASE_NAME, PERMITS_DATA_PREFIX};

const JAVA_DIR: &str = "/usr/share/java";

/// Debian's jars the driver needs: Curator and what it depends on.
const JARS: [&str; 8] = [
    "curator-client",
    "curator-framework",
    "curator-recipes",
    "zookeeper",
    "zookeeper-jute",
    "guava",
    "slf4j-api",
    "slf4j-nop",
];

fn key(name: &str) -> LockKey {
    LockKey::new(name).unwrap()
}

fn no_wait() -> LockOptions {
    LockOptions::new(Duration::from_secs(30)).with_wait(WaitPolicy::NoWait)
}

fn waiting() -> LockOptions {
    LockOptions::new(Duration::from_secs(30))
        .with_wait(WaitPolicy::Timeout(Duration::from_secs(30)))
}

/// Curator, in a JVM of its own, answering one line per command.
struct Curator {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    _classes: tempfile::TempDir,
}

fn not_installed(what: String) -> ServerError {
    ServerError::NotInstalled {
        what,
        hint: "install the Debian packages `libcurator-recipes-java libcurator-framework-java \
               libcurator-client-java` and a JDK (scripts/test.sh does)"
            .into(),
    }
}

impl Curator {
    /// Compiles and starts the driver, or `None` (after [`skip_or_panic`]) without
    /// Curator's jars or a JDK.
    fn start(port: u16) -> Option<Curator> {
        let missing: Vec<&str> = JARS
            .iter()
            .copied()
            .filter(|jar| !Path::new(JAVA_DIR).join(format!("{jar}.jar")).exists())
            .collect();
        if !missing.is_empty() {
            skip_or_panic(
                "curator",
                &not_installed(format!("{missing:?} in {JAVA_DIR}")),
            );
            return None;
        }
        let classpath = JARS.map(|jar| format!("{JAVA_DIR}/{jar}.jar")).join(":");
        let classes = tempfile::tempdir().expect("a temporary directory");
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/curator/CuratorDriver.java");
        let compiled = Command::new("javac")
            .arg("-d")
            .arg(classes.path())
            .args(["-cp", &classpath])
            .arg(&source)
            .status();
        match compiled {
            Ok(status) if status.success() => {}
            other => {
                skip_or_panic("curator", &not_installed(format!("javac ({other:?})")));
                return None;
            }
        }
        let run_path = format!("{}:{classpath}", classes.path().display());
        let mut child = Command::new("java")
            .args([
                "-cp",
                &run_path,
                "CuratorDriver",
                &format!("127.0.0.1:{port}"),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("java starts");
        let stdin = child.stdin.take().expect("stdin is piped");
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut curator = Curator {
            child,
            stdin,
            stdout: BufReader::new(stdout),
            _classes: classes,
        };
        assert_eq!(curator.read(), "ready", "the Curator driver starts");
        Some(curator)
    }

    fn read(&mut self) -> String {
        let mut line = String::new();
        let _ = self.stdout.read_line(&mut line);
        line.trim().to_owned()
    }

    /// Sends `command` and returns Curator's answer (blocking: call off the runtime).
    fn ask(&mut self, command: &str) -> String {
        writeln!(self.stdin, "{command}").expect("Curator reads its commands");
        self.read()
    }
}

impl Drop for Curator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Asks Curator off the runtime (its waits block).
async fn ask(mut curator: Curator, command: String) -> (Curator, String) {
    tokio::task::spawn_blocking(move || {
        let answer = curator.ask(&command);
        (curator, answer)
    })
    .await
    .expect("the Curator driver thread does not panic")
}

async fn client(port: u16) -> ZooKeeperLock {
    ZooKeeperLock::connect(&common::url_for(port))
        .await
        .expect("connects")
}

/// Waits (with a generous deadline) until ZooKeeper has removed `path`: the container
/// nodes of a recipe go once empty, so nothing is left behind.
async fn wait_gone(raw: &zookeeper_client::Client, path: &str) {
    let gone = async {
        while raw.check_stat(path).await.expect("stat").is_some() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), gone)
        .await
        .unwrap_or_else(|_| panic!("{path} was left behind"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_read_write_lock_and_ours_exclude_each_other() {
    let port = common::shared_port();
    let ours = client(port).await.rw_lock();
    let k = key("curator-rw");
    let path = client(port).await.rw_path(&k);
    let Some(curator) = Curator::start(port) else {
        return;
    };

    // A Curator writer excludes our readers and writers; our reader waits for it.
    let (curator, answer) = ask(curator, format!("write {path} 0")).await;
    assert_eq!(answer, "held");
    assert!(ours
        .try_acquire(&k, RwMode::Read, &no_wait())
        .await
        .unwrap()
        .is_none());
    assert!(ours
        .try_acquire(&k, RwMode::Write, &no_wait())
        .await
        .unwrap()
        .is_none());
    let reader = {
        let (ours, k) = (ours.clone(), k.clone());
        tokio::spawn(async move { ours.acquire(&k, RwMode::Read, &waiting()).await })
    };
    let raw = common::raw(port).await;
    common::wait_children(&raw, &path, 2, Duration::from_secs(10)).await;
    assert!(
        !reader.is_finished(),
        "our reader waits behind Curator's writer"
    );
    let (curator, answer) = ask(curator, "release".into()).await;
    assert_eq!(answer, "released");
    let reader = tokio::time::timeout(Duration::from_secs(10), reader)
        .await
        .expect("our reader is granted once Curator's writer left")
        .unwrap()
        .expect("acquires");

    // Our reader shares with Curator's readers and excludes Curator's writer.
    let (curator, answer) = ask(curator, format!("read {path} 0")).await;
    assert_eq!(answer, "held", "readers share");
    let (curator, answer) = ask(curator, "release".into()).await;
    assert_eq!(answer, "released");
    let (curator, answer) = ask(curator, format!("write {path} 0")).await;
    assert_eq!(answer, "busy", "our reader excludes Curator's writer");

    // A waiting Curator writer holds our new readers back (writer preference).
    let curator_writer = tokio::spawn(ask(curator, format!("write {path} 30000")));
    common::wait_children(&raw, &path, 2, Duration::from_secs(10)).await;
    assert!(
        ours.try_acquire(&k, RwMode::Read, &no_wait())
            .await
            .unwrap()
            .is_none(),
        "a reader arriving after Curator's waiting writer waits behind it"
    );
    reader.release().await.expect("releases");
    let (curator, answer) = tokio::time::timeout(Duration::from_secs(20), curator_writer)
        .await
        .expect("Curator's writer is granted once our reader left")
        .unwrap();
    assert_eq!(answer, "held");

    // Our writer excludes Curator's readers.
    let (curator, answer) = ask(curator, "release".into()).await;
    assert_eq!(answer, "released");
    let writer = ours
        .try_acquire(&k, RwMode::Write, &no_wait())
        .await
        .unwrap()
        .expect("free again");
    let (curator, answer) = ask(curator, format!("read {path} 0")).await;
    assert_eq!(answer, "busy", "our writer excludes Curator's reader");
    writer.release().await.expect("releases");
    let (_curator, answer) = ask(curator, format!("read {path} 0")).await;
    assert_eq!(answer, "held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_semaphore_and_ours_never_admit_more_than_max() {
    const MAX: u32 = 2;
    let port = common::shared_port();
    let locks = client(port).await;
    let ours = locks.semaphore();
    let k = key("curator-semaphore");
    let path = locks.semaphore_path(&k);
    let leases = format!("{path}/leases");
    let Some(curator) = Curator::start(port) else {
        return;
    };

    // One Curator lease and one of ours fill the two permits.
    let (curator, answer) = ask(curator, format!("sem {path} {MAX} 0")).await;
    assert_eq!(answer, "held");
    let first = ours
        .try_acquire(&k, MAX, &no_wait())
        .await
        .unwrap()
        .expect("a permit is free");
    assert!(ours
        .try_acquire(&k, MAX, &no_wait())
        .await
        .unwrap()
        .is_none());
    let (curator, answer) = ask(curator, format!("sem {path} {MAX} 0")).await;
    assert_eq!(answer, "busy", "Curator counts our lease");

    // Our lease node is Curator's layout and records our count.
    let raw = common::raw(port).await;
    let children = raw.list_children(&leases).await.expect("lists leases");
    assert_eq!(children.len(), 2, "{children:?}");
    let mut recorded = 0;
    for name in &children {
        assert!(name.starts_with("_c_"), "{name}");
        assert!(name.contains(&format!("-{LEASE_NAME}")), "{name}");
        let (data, _) = raw.get_data(&format!("{leases}/{name}")).await.unwrap();
        if data == format!("{PERMITS_DATA_PREFIX}{MAX}").as_bytes() {
            recorded += 1;
        }
    }
    assert_eq!(
        recorded, 1,
        "our lease records the count; Curator's does not"
    );

    // A distlock client with another count is refused while our holder is there.
    let refused = ours.try_acquire(&k, MAX + 1, &no_wait()).await;
    assert!(
        matches!(refused, Err(LockError::PermitMismatch { .. })),
        "{refused:?}"
    );

    // A waiter of ours is granted when Curator returns its lease.
    let waiter = {
        let (ours, k) = (ours.clone(), k.clone());
        tokio::spawn(async move { ours.acquire(&k, MAX, &waiting()).await })
    };
    common::wait_children(&raw, &leases, 3, Duration::from_secs(10)).await;
    assert!(!waiter.is_finished(), "full: our waiter waits");
    let (curator, answer) = ask(curator, "release".into()).await;
    assert_eq!(answer, "released");
    let second = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("our waiter is granted once Curator's lease went")
        .unwrap()
        .expect("acquires");

    // A waiting Curator client is granted when we release one.
    let curator_waiter = tokio::spawn(ask(curator, format!("sem {path} {MAX} 30000")));
    common::wait_children(&raw, &leases, 3, Duration::from_secs(10)).await;
    assert!(ours
        .try_acquire(&k, MAX, &no_wait())
        .await
        .unwrap()
        .is_none());
    first.release().await.expect("releases");
    let (curator, answer) = tokio::time::timeout(Duration::from_secs(20), curator_waiter)
        .await
        .expect("Curator's waiter is granted once our lease went")
        .unwrap();
    assert_eq!(answer, "held");
    assert!(ours
        .try_acquire(&k, MAX, &no_wait())
        .await
        .unwrap()
        .is_none());

    // Everyone leaves: nothing is left behind.
    second.release().await.expect("releases");
    let (_curator, answer) = ask(curator, "release".into()).await;
    assert_eq!(answer, "released");
    wait_gone(&raw, &path).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_semaphore_and_rw_lock_leave_nothing_behind() {
    let port = common::shared_port();
    let locks = client(port).await;
    let raw = common::raw(port).await;
    let k = key("left-behind");
    let permit = locks
        .semaphore()
        .acquire(&k, 3, &waiting())
        .await
        .expect("acquires");
    let reader = locks
        .rw_lock()
        .acquire(&k, RwMode::Read, &waiting())
        .await
        .expect("acquires");
    // The guard mutex is gone as soon as the permit is granted.
    let locks_dir = format!("{}/locks", locks.semaphore_path(&k));
    assert!(raw
        .list_children(&locks_dir)
        .await
        .unwrap_or_default()
        .is_empty());
    permit.release().await.expect("releases");
    reader.release().await.expect("releases");
    wait_gone(&raw, &locks.semaphore_path(&k)).await;
    wait_gone(&raw, &locks.rw_path(&k)).await;
}

/// Curator's threads and ours churn through a 2-permit semaphore at once; each holder
/// marks its time inside with an ephemeral node, and a watcher of the marks never sees
/// more than 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_and_our_holders_churning_together_stay_within_max() {
    const MAX: u32 = 2;
    const ROUNDS: usize = 15;
    let port = common::shared_port();
    let locks = client(port).await;
    let k = key("curator-churn");
    let path = locks.semaphore_path(&k);
    let raw = common::raw(port).await;
    let inside = "/curator-churn-inside";
    let persistent =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    raw.create(inside, &[], &persistent)
        .await
        .expect("creates the marks' directory");
    let Some(curator) = Curator::start(port) else {
        return;
    };

    let most_inside = {
        let raw = common::raw(port).await;
        tokio::spawn(async move {
            let mut most = 0;
            loop {
                match raw.get_and_watch_children(inside).await {
                    Ok((marks, _, watcher)) => {
                        most = most.max(marks.len());
                        watcher.changed().await;
                    }
                    Err(_) => return most,
                }
            }
        })
    };
    let theirs = tokio::spawn(ask(
        curator,
        format!("churn {path} {MAX} {ROUNDS} {inside}"),
    ));
    let mut ours = Vec::new();
    for _ in 0..2 {
        let (semaphore, k) = (locks.semaphore(), k.clone());
        let raw = common::raw(port).await;
        ours.push(tokio::spawn(async move {
            let mark_mode = zookeeper_client::CreateMode::EphemeralSequential
                .with_acls(zookeeper_client::Acls::anyone_all());
            for _ in 0..ROUNDS {
                let permit = semaphore
                    .acquire(&k, MAX, &waiting())
                    .await
                    .expect("acquires");
                let (_, sequence) = raw
                    .create(&format!("{inside}/ours-"), &[], &mark_mode)
                    .await
                    .expect("marks");
                tokio::time::sleep(Duration::from_millis(5)).await;
                raw.delete(&format!("{inside}/ours-{sequence}"), None)
                    .await
                    .expect("unmarks");
                permit.release().await.expect("releases");
            }
        }));
    }
    for task in ours {
        tokio::time::timeout(Duration::from_secs(120), task)
            .await
            .expect("our holders finish")
            .expect("our holder does not panic");
    }
    let (_curator, answer) = tokio::time::timeout(Duration::from_secs(120), theirs)
        .await
        .expect("Curator's holders finish")
        .unwrap();
    assert_eq!(answer, "done");
    raw.delete(inside, None)
        .await
        .expect("removes the marks' directory");
    let most = tokio::time::timeout(Duration::from_secs(10), most_inside)
        .await
        .expect("the watcher ends with the directory")
        .unwrap();
    assert!(most >= 1, "the watcher saw holders");
    assert!(most <= MAX as usize, "{most} holders inside at once");
    wait_gone(&raw, &path).await;
}

/// A Curator `LeaderLatch` and our candidates on one election path: exactly one leads,
/// each side reads the other's identity, and a resignation on either side hands the
/// leadership to the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_leader_latch_and_ours_elect_one_leader() {
    let port = common::shared_port();
    let locks = client(port).await;
    let ours = locks.election();
    let k = key("curator-election");
    let path = locks.election_path(&k);
    let raw = common::raw(port).await;
    let rust = Candidate::new("rust-1").unwrap();
    let Some(curator) = Curator::start(port) else {
        return;
    };

    // Curator leads first: we cannot, and we read its id and its node's czxid.
    let (curator, answer) = ask(curator, format!("latch {path} java-1")).await;
    assert_eq!(answer, "started");
    let (curator, answer) = ask(curator, "await 10000".into()).await;
    assert_eq!(answer, "leader");
    assert!(ours
        .try_campaign(&k, &rust, &no_wait())
        .await
        .unwrap()
        .is_none());
    let read = ours.leader(&k).await.unwrap().expect("Curator leads");
    assert_eq!(read.candidate.as_bytes(), b"java-1");
    let children = raw.list_children(&path).await.unwrap();
    assert_eq!(children.len(), 1, "{children:?}");
    assert!(
        children[0].contains(&format!("-{LATCH_NAME}")),
        "{children:?}"
    );
    let (_, stat) = raw
        .get_data(&format!("{path}/{}", children[0]))
        .await
        .unwrap();
    assert_eq!(read.term.get(), u64::try_from(stat.czxid).unwrap());

    // Our candidate queues behind Curator's and leads once Curator closes its latch.
    let standby = {
        let (ours, k, rust) = (ours.clone(), k.clone(), rust.clone());
        tokio::spawn(async move { ours.campaign(&k, &rust, &waiting()).await })
    };
    common::wait_children(&raw, &path, 2, Duration::from_secs(10)).await;
    assert!(!standby.is_finished(), "we wait while Curator leads");
    let (curator, answer) = ask(curator, "leads".into()).await;
    assert_eq!(
        answer, "leader",
        "Curator still leads with our candidate queued"
    );
    let (curator, answer) = ask(curator, "close".into()).await;
    assert_eq!(answer, "closed");
    let leading = tokio::time::timeout(Duration::from_secs(10), standby)
        .await
        .expect("we lead once Curator's latch closed")
        .unwrap()
        .expect("campaigns");
    assert!(leading.term() > read.term);

    // A new Curator latch follows us and reads our identity.
    let (curator, answer) = ask(curator, format!("latch {path} java-2")).await;
    assert_eq!(answer, "started");
    common::wait_children(&raw, &path, 2, Duration::from_secs(10)).await;
    let (curator, answer) = ask(curator, "await 300".into()).await;
    assert_eq!(answer, "follower", "Curator leads beside us");
    let (curator, answer) = ask(curator, "leader".into()).await;
    assert_eq!(answer, "id=rust-1");

    // We resign: Curator leads, and we read it.
    let term = leading.term();
    leading.resign().await.unwrap();
    let (curator, answer) = ask(curator, "await 10000".into()).await;
    assert_eq!(answer, "leader");
    let read = ours.leader(&k).await.unwrap().expect("Curator leads");
    assert_eq!(read.candidate.as_bytes(), b"java-2");
    assert!(read.term > term);
    let (curator, answer) = ask(curator, "close".into()).await;
    assert_eq!(answer, "closed");

    // A Curator latch without an id (its default) reads as its node's name.
    let (curator, answer) = ask(curator, format!("latch {path}")).await;
    assert_eq!(answer, "started");
    let (curator, answer) = ask(curator, "await 10000".into()).await;
    assert_eq!(answer, "leader");
    let read = ours.leader(&k).await.unwrap().expect("Curator leads");
    let node = read.candidate.to_text().into_owned();
    assert!(
        node.starts_with("_c_") && node.contains(&format!("-{LATCH_NAME}")),
        "{node}"
    );
    let (_curator, answer) = ask(curator, "close".into()).await;
    assert_eq!(answer, "closed");
    wait_gone(&raw, &path).await;
}

/// Curator's latches and our candidates churn through one election at once; each
/// leader marks its time leading with an ephemeral node, and a watcher of the marks
/// never sees two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_and_our_leaders_churning_together_never_overlap() {
    const ROUNDS: usize = 15;
    let port = common::shared_port();
    let locks = client(port).await;
    let k = key("curator-election-churn");
    let path = locks.election_path(&k);
    let raw = common::raw(port).await;
    let inside = "/curator-election-churn-inside";
    let persistent =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    raw.create(inside, &[], &persistent)
        .await
        .expect("creates the marks' directory");
    let Some(curator) = Curator::start(port) else {
        return;
    };

    let most_inside = {
        let raw = common::raw(port).await;
        tokio::spawn(async move {
            let mut most = 0;
            loop {
                match raw.get_and_watch_children(inside).await {
                    Ok((marks, _, watcher)) => {
                        most = most.max(marks.len());
                        watcher.changed().await;
                    }
                    Err(_) => return most,
                }
            }
        })
    };
    let theirs = tokio::spawn(ask(curator, format!("latchchurn {path} {ROUNDS} {inside}")));
    let mut ours = Vec::new();
    for n in 0..2 {
        let (election, k) = (locks.election(), k.clone());
        let raw = common::raw(port).await;
        ours.push(tokio::spawn(async move {
            let me = Candidate::new(format!("rust-{n}")).unwrap();
            let mark_mode = zookeeper_client::CreateMode::EphemeralSequential
                .with_acls(zookeeper_client::Acls::anyone_all());
            for _ in 0..ROUNDS {
                let leading = election
                    .campaign(&k, &me, &waiting())
                    .await
                    .expect("campaigns");
                let (_, sequence) = raw
                    .create(&format!("{inside}/ours-"), &[], &mark_mode)
                    .await
                    .expect("marks");
                tokio::time::sleep(Duration::from_millis(5)).await;
                raw.delete(&format!("{inside}/ours-{sequence}"), None)
                    .await
                    .expect("unmarks");
                leading.resign().await.expect("resigns");
            }
        }));
    }
    for task in ours {
        tokio::time::timeout(Duration::from_secs(120), task)
            .await
            .expect("our candidates finish")
            .expect("our candidate does not panic");
    }
    let (_curator, answer) = tokio::time::timeout(Duration::from_secs(120), theirs)
        .await
        .expect("Curator's candidates finish")
        .unwrap();
    assert_eq!(answer, "done");
    raw.delete(inside, None)
        .await
        .expect("removes the marks' directory");
    let most = tokio::time::timeout(Duration::from_secs(10), most_inside)
        .await
        .expect("the watcher ends with the directory")
        .unwrap();
    assert!(most >= 1, "the watcher saw leaders");
    assert_eq!(most, 1, "{most} leaders at once");
    wait_gone(&raw, &path).await;
}

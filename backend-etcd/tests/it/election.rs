//! The election against real etcd and etcd's own `concurrency.Election` through
//! `etcdctl elect`: one election shared by both, each reading the other's leader, and
//! nothing left in etcd once the candidates leave.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{direct, etcdctl, eventually, keys_under, shared_port};
use distlock_api::{
    AutoRenew, Candidate, FencingToken, LeaderElection, LockKey, LockOptions, ReleaseOutcome,
    WaitPolicy,
};
use distlock_etcd::EtcdLock;

fn name(label: &str) -> LockKey {
    LockKey::new(format!("elect-{label}-{:08x}", rand::random::<u32>())).unwrap()
}

fn candidate(id: &str) -> Candidate {
    Candidate::new(id).unwrap()
}

/// The election name `etcdctl elect` takes for `name`: the range without its `/`.
fn etcdctl_name(lock: &EtcdLock, name: &LockKey) -> String {
    lock.election_prefix(name).trim_end_matches('/').to_owned()
}

/// An `etcdctl elect` process whose output lines are collected as they come.
struct Elect {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Elect {
    /// `etcdctl elect ARGS…` against 127.0.0.1:`port`.
    fn spawn(port: u16, args: &[&str]) -> Elect {
        let mut child = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints=127.0.0.1:{port}"))
            .arg("elect")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("run etcdctl elect (Debian package etcd-client)");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stdout = child.stdout.take().expect("piped stdout");
        std::thread::spawn({
            let lines = lines.clone();
            move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    lines.lock().unwrap().push(line);
                }
            }
        });
        Elect { child, lines }
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    fn printed(&self, text: &str) -> bool {
        self.lines().iter().any(|l| l == text)
    }

    fn signal(&self, signal: i32) {
        let pid = i32::try_from(self.child.id()).unwrap();
        // SAFETY: signals a child process of ours, which has not been reaped.
        #[allow(unsafe_code)]
        let sent = unsafe { libc::kill(pid, signal) };
        assert_eq!(sent, 0, "kill({pid}, {signal})");
    }

    fn exited(&mut self) -> bool {
        self.child.try_wait().unwrap().is_some()
    }
}

impl Drop for Elect {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The create revision of `key`, read by `etcdctl get -w fields`.
fn create_revision(port: u16, key: &str) -> u64 {
    let fields = etcdctl(port, &["get", "-w", "fields", key]);
    fields
        .lines()
        .find_map(|l| l.strip_prefix("\"CreateRevision\" : "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no create revision for {key} in {fields}"))
}

async fn elections(port: u16) -> (EtcdLock, Arc<dyn LeaderElection>) {
    let lock = direct(port).await;
    let election = lock.election();
    (lock, election)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distlock_follows_an_etcdctl_leader() {
    let port = shared_port();
    let (lock, election) = elections(port).await;
    let name = name("etcdctl-leads");
    let range = lock.election_prefix(&name);
    let mut foreign = Elect::spawn(port, &[&etcdctl_name(&lock, &name), "etcdctl-proposal"]);
    // Elected, etcdctl prints its key, then its value.
    assert!(
        eventually(Duration::from_secs(10), || foreign
            .printed("etcdctl-proposal"))
        .await,
        "etcdctl elect did not lead: {:?}",
        foreign.lines()
    );
    let keys = keys_under(port, &range);
    assert_eq!(keys.len(), 1, "{keys:?}");
    let foreign_key = keys[0].clone();
    let foreign_term = create_revision(port, &foreign_key);

    // distlock reads etcdctl's proposal and term, with its 60 s session lease left.
    let leader = election.leader(&name).await.unwrap().expect("a leader");
    assert_eq!(leader.candidate.as_bytes(), b"etcdctl-proposal");
    assert_eq!(leader.term, FencingToken::new(foreign_term));
    let remaining = leader.remaining.expect("the lease's TTL left");
    assert!(
        remaining > Duration::ZERO && remaining <= Duration::from_secs(60),
        "{remaining:?}"
    );

    // A try is refused and leaves nothing behind.
    let options = LockOptions::new(Duration::from_secs(5)).with_wait(WaitPolicy::NoWait);
    assert!(election
        .try_campaign(&name, &candidate("distlock-a"), &options)
        .await
        .unwrap()
        .is_none());
    assert_eq!(keys_under(port, &range), vec![foreign_key.clone()]);

    // A campaign queues behind etcdctl…
    let campaign = {
        let (election, name) = (election.clone(), name.clone());
        let options = LockOptions::new(Duration::from_secs(5))
            .with_wait(WaitPolicy::Timeout(Duration::from_secs(30)))
            .with_auto_renew(AutoRenew::new());
        tokio::spawn(async move {
            let led = election
                .campaign(&name, &candidate("distlock-a"), &options)
                .await;
            (Instant::now(), led)
        })
    };
    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, &range).len()
            == 2)
        .await,
        "the campaign's key did not appear: {:?}",
        keys_under(port, &range)
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!campaign.is_finished(), "distlock led beside etcdctl");

    // …and leads once etcdctl is killed and its lease revoked (a kill -9 leaves the
    // lease to its 60 s TTL).
    foreign.signal(libc::SIGKILL);
    assert!(eventually(Duration::from_secs(5), || foreign.exited()).await);
    let lease_hex = foreign_key.rsplit('/').next().unwrap().to_owned();
    etcdctl(port, &["lease", "revoke", &lease_hex]);
    let revoked = Instant::now();
    let (led_at, led) = tokio::time::timeout(Duration::from_secs(10), campaign)
        .await
        .expect("the campaign leads after the revoke")
        .unwrap();
    let leadership = led.unwrap();
    eprintln!(
        "distlock led {:?} after etcdctl's lease was revoked",
        led_at.saturating_duration_since(revoked)
    );
    assert!(leadership.term() > FencingToken::new(foreign_term));
    let leader = election.leader(&name).await.unwrap().expect("a leader");
    assert_eq!(leader.candidate.as_bytes(), b"distlock-a");
    assert_eq!(leader.term, leadership.term());

    assert_eq!(leadership.resign().await.unwrap(), ReleaseOutcome::Released);
    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, &range)
            .is_empty())
        .await,
        "keys left behind: {:?}",
        keys_under(port, &range)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_follows_a_distlock_leader() {
    let port = shared_port();
    let (lock, election) = elections(port).await;
    let name = name("distlock-leads");
    let range = lock.election_prefix(&name);
    let etcd_name = etcdctl_name(&lock, &name);
    let options = LockOptions::new(Duration::from_secs(5))
        .with_wait(WaitPolicy::NoWait)
        .with_auto_renew(AutoRenew::new());
    let leadership = election
        .try_campaign(&name, &candidate("distlock-leader"), &options)
        .await
        .unwrap()
        .expect("nobody leads a fresh election");

    // `etcdctl elect -l` (concurrency.Election.Observe) reads our identity.
    let observer = Elect::spawn(port, &["-l", &etcd_name]);
    assert!(
        eventually(Duration::from_secs(10), || observer
            .printed("distlock-leader"))
        .await,
        "etcdctl elect -l did not print our identity: {:?}",
        observer.lines()
    );

    // `etcdctl elect NAME other` queues behind us and does not lead while we do.
    let mut other = Elect::spawn(port, &[&etcd_name, "etcdctl-other"]);
    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, &range).len()
            == 2)
        .await,
        "etcdctl's candidate key did not appear: {:?}",
        keys_under(port, &range)
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        other.lines().is_empty(),
        "etcdctl led while distlock did: {:?}",
        other.lines()
    );
    let leader = election.leader(&name).await.unwrap().expect("a leader");
    assert_eq!(leader.candidate.as_bytes(), b"distlock-leader");
    assert_eq!(leader.term, leadership.term());

    // After our resign, etcdctl leads; the observer, a watch of ours and a look see it.
    let ours = leadership.term();
    let watch = {
        let (election, name) = (election.clone(), name.clone());
        tokio::spawn(async move {
            let mut seen = Some(ours);
            loop {
                let now = election
                    .wait_change(&name, seen, Duration::from_secs(20))
                    .await?;
                match now {
                    Some(leader) if leader.term != ours => return Ok(leader),
                    other => seen = other.map(|l| l.term),
                }
            }
        })
    };
    assert_eq!(leadership.resign().await.unwrap(), ReleaseOutcome::Released);
    let resigned = Instant::now();
    assert!(
        eventually(Duration::from_secs(10), || other.printed("etcdctl-other")).await,
        "etcdctl elect did not lead after the resign: {:?}",
        other.lines()
    );
    eprintln!("etcdctl led {:?} after the resign", resigned.elapsed());
    assert!(
        eventually(Duration::from_secs(10), || observer
            .printed("etcdctl-other"))
        .await,
        "etcdctl elect -l did not see the new leader: {:?}",
        observer.lines()
    );
    let watched: distlock_api::Leader = tokio::time::timeout(Duration::from_secs(10), watch)
        .await
        .expect("wait_change returns the new leader")
        .unwrap()
        .unwrap_or_else(|e: distlock_api::LockError| panic!("{e}"));
    let leader = election.leader(&name).await.unwrap().expect("a leader");
    assert_eq!(leader.candidate.as_bytes(), b"etcdctl-other");
    assert!(leader.term > ours);
    assert_eq!(watched, leader.clone().with_remaining(watched.remaining));
    let keys = keys_under(port, &range);
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert_eq!(
        leader.term,
        FencingToken::new(create_revision(port, &keys[0]))
    );

    // etcdctl resigns on SIGINT: the election is empty again.
    other.signal(libc::SIGINT);
    assert!(eventually(Duration::from_secs(10), || other.exited()).await);
    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, &range)
            .is_empty())
        .await,
        "keys left behind: {:?}",
        keys_under(port, &range)
    );
    assert_eq!(election.leader(&name).await.unwrap(), None);
}

/// Election names are a namespace of their own: the lock of the same name, and the
/// lock whose range would be the elections' parent were `+` not encoded, are free
/// while the election is led, and the other way round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_names_are_apart_from_lock_keys() {
    let port = shared_port();
    let (lock, election) = elections(port).await;
    let name = name("apart");
    let options = LockOptions::new(Duration::from_secs(5)).with_wait(WaitPolicy::NoWait);
    let same = lock
        .lock()
        .try_acquire(&name, &options)
        .await
        .unwrap()
        .expect("free");
    let parent = LockKey::new(distlock_etcd::ELECTION_SEGMENT).unwrap();
    let leadership = election
        .try_campaign(&name, &candidate("apart"), &options)
        .await
        .unwrap()
        .expect("the lock of the same name does not hold the election");
    let outer = lock
        .lock()
        .try_acquire(&parent, &options)
        .await
        .unwrap()
        .expect("no lock's range covers the elections");
    assert!(!lock
        .election_prefix(&name)
        .starts_with(&lock.lock_prefix(&parent)));
    assert_eq!(
        election.leader(&name).await.unwrap().map(|l| l.term),
        Some(leadership.term())
    );
    assert_eq!(outer.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(same.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(leadership.resign().await.unwrap(), ReleaseOutcome::Released);
    let range = lock.election_prefix(&name);
    assert!(keys_under(port, &range).is_empty());
    assert!(keys_under(port, &lock.lock_prefix(&name)).is_empty());
}

/// An extend to a longer TTL moves the leader's key to a new lease: the key keeps its
/// value (the identity) and create revision (the term).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_longer_extend_keeps_identity_and_term() {
    let port = shared_port();
    let (lock, election) = elections(port).await;
    let name = name("extend");
    let options = LockOptions::new(Duration::from_secs(2)).with_wait(WaitPolicy::NoWait);
    let leadership = election
        .try_campaign(&name, &candidate("extended"), &options)
        .await
        .unwrap()
        .expect("nobody leads a fresh election");
    let extended = leadership.extend(Duration::from_secs(30)).await.unwrap();
    assert!(
        matches!(extended, distlock_api::ExtendOutcome::Extended { .. }),
        "{extended:?}"
    );
    let leader = election.leader(&name).await.unwrap().expect("a leader");
    assert_eq!(leader.candidate.as_bytes(), b"extended");
    assert_eq!(leader.term, leadership.term());
    let remaining = leader.remaining.expect("the lease's TTL left");
    assert!(remaining > Duration::from_secs(2), "{remaining:?}");
    assert_eq!(leadership.resign().await.unwrap(), ReleaseOutcome::Released);
    assert!(keys_under(port, &lock.election_prefix(&name)).is_empty());
}

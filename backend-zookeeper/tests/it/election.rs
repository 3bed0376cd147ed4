//! The ZooKeeper election beyond the kit, on a real server: Curator `LeaderLatch` node
//! names holding the identity, a namespace apart from the mutex's, terms that are the
//! nodes' `czxid`s, one wake-up per resignation, observers on a watch, session expiry
//! handing leadership over, and nothing left once the election ends.

use crate::common;

use std::time::Duration;

use distlock_api::{Candidate, LeaseState, LockKey, LockOptions, ReleaseOutcome, WaitPolicy};
use distlock_zookeeper::{encode_key, owner_guid, ZooKeeperLock, LATCH_NAME};
use tokio::time::{timeout, Instant};
use zookeeper_client as zk;

use common::{direct, proxied, raw, shared_port, wait_children, watches_by_path};

const SESSION: Duration = Duration::from_secs(10);

fn key(name: &str) -> LockKey {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    LockKey::new(format!("election/{name}/{nanos:08x}")).unwrap()
}

fn me(label: &str) -> Candidate {
    Candidate::new(label).unwrap()
}

fn waiting(wait: Duration) -> LockOptions {
    LockOptions::new(Duration::from_secs(30)).with_wait(WaitPolicy::Timeout(wait))
}

fn no_wait() -> LockOptions {
    LockOptions::new(Duration::from_secs(30)).with_wait(WaitPolicy::NoWait)
}

/// Waits (with a generous deadline) until ZooKeeper has removed `path`.
async fn wait_gone(raw: &zk::Client, path: &str) {
    let gone = async {
        while raw.check_stat(path).await.expect("stat").is_some() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    timeout(Duration::from_secs(20), gone)
        .await
        .unwrap_or_else(|_| panic!("{path} was left behind"));
}

/// How many requests the server has received on session `id`, from its `cons`
/// four-letter word.
async fn packets_received(port: u16, id: i64) -> u64 {
    let reply = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("4lw connect");
        stream.write_all(b"cons").expect("4lw write");
        let mut reply = String::new();
        stream.read_to_string(&mut reply).expect("4lw read");
        reply
    })
    .await
    .expect("4lw task");
    let sid = format!("sid=0x{id:x},");
    let line = reply
        .lines()
        .find(|line| line.contains(&sid))
        .unwrap_or_else(|| panic!("no connection of session {sid} in {reply}"));
    let recved = line
        .split(['(', ','])
        .find_map(|field| field.strip_prefix("recved="))
        .unwrap_or_else(|| panic!("no recved= in {line}"));
    recved.parse().expect("a count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn candidates_are_latch_nodes_holding_their_identity_apart_from_the_mutex() {
    let port = shared_port();
    let lock = direct(port, SESSION).await;
    let election = lock.election();
    let k = key("layout/é ../x");
    let dir = lock.election_path(&k);
    assert_eq!(dir, format!("/distlock/.election/{}", encode_key(&k)));
    assert_ne!(dir, lock.lock_dir(&k));

    let identity = "host-a:8080 \u{e9}";
    let leading = election
        .try_campaign(&k, &me(identity), &no_wait())
        .await
        .unwrap()
        .expect("a free election");
    // The mutex of the same key is another namespace: free.
    let mutex = lock.lock().try_acquire(&k, &no_wait()).await.unwrap();
    assert!(mutex.is_some(), "the election held the mutex of its name");

    let zk_raw = raw(port).await;
    let children = zk_raw.list_children(&dir).await.unwrap();
    assert_eq!(children.len(), 1, "{children:?}");
    let name = &children[0];
    let guid = owner_guid(leading.lease().owner());
    let prefix = format!("_c_{guid}-{LATCH_NAME}");
    assert!(name.starts_with(&prefix), "{name}");
    let digits = &name[prefix.len()..];
    assert!(
        digits.len() == 10 && digits.bytes().all(|b| b.is_ascii_digit()),
        "{name}"
    );
    let (data, stat) = zk_raw.get_data(&format!("{dir}/{name}")).await.unwrap();
    assert_eq!(data, identity.as_bytes(), "the node holds the identity");
    assert_ne!(stat.ephemeral_owner, 0, "the node is ephemeral");
    assert_eq!(leading.term().get(), u64::try_from(stat.czxid).unwrap());
    assert_eq!(leading.lease().fencing_token(), Some(leading.term()));

    let read = election.leader(&k).await.unwrap().expect("a leader");
    assert_eq!(read.candidate.as_bytes(), identity.as_bytes());
    assert_eq!(read.term, leading.term());
    assert_eq!(read.remaining, None, "the lease is a session");

    mutex.unwrap().release().await.unwrap();
    assert_eq!(leading.resign().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(election.leader(&k).await.unwrap(), None);
    wait_gone(&zk_raw, &dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_resignation_wakes_one_candidate_and_candidates_lead_in_arrival_order() {
    const STANDBYS: usize = 5;
    let port = shared_port();
    let k = key("fifo");
    let leader_client = direct(port, SESSION).await;
    let dir = leader_client.election_path(&k);
    let first = leader_client
        .election()
        .campaign(&k, &me("leader"), &no_wait())
        .await
        .unwrap();
    let zk_raw = raw(port).await;
    let mut clients = Vec::new();
    let mut standbys = Vec::new();
    for i in 0..STANDBYS {
        let client = direct(port, SESSION).await;
        let election = client.election();
        clients.push(client);
        let k = k.clone();
        standbys.push(tokio::spawn(async move {
            let won = election
                .campaign(
                    &k,
                    &me(&format!("standby-{i}")),
                    &waiting(Duration::from_secs(60)),
                )
                .await?;
            let (term, contended) = (won.term(), won.contended());
            won.resign().await?;
            Ok::<_, distlock_api::LockError>((term, contended))
        }));
        // Standby i has queued before standby i + 1 campaigns.
        wait_children(&zk_raw, &dir, i + 2, Duration::from_secs(10)).await;
    }
    // Every standby watches its predecessor, nobody the election's directory.
    let settle = Instant::now();
    loop {
        let watches = watches_by_path(port).await;
        assert_eq!(watches.get(&dir), None, "a candidate watches the directory");
        let watched: usize = watches
            .iter()
            .filter(|(path, _)| path.starts_with(&format!("{dir}/")))
            .map(|(_, n)| n)
            .sum();
        if watched == STANDBYS {
            break;
        }
        assert!(
            settle.elapsed() < Duration::from_secs(10),
            "candidate watches {watches:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let woken: u64 = clients.iter().map(ZooKeeperLock::wakeups).sum();
    assert_eq!(woken, 0, "candidates were woken while the leader led");

    assert!(!first.contended(), "the first campaign met nobody");
    let mut terms = vec![first.term()];
    first.resign().await.unwrap();
    for standby in standbys {
        let (term, contended) = timeout(Duration::from_secs(30), standby)
            .await
            .expect("each standby leads in turn")
            .unwrap()
            .expect("campaigns");
        assert!(contended, "a standby that waited reads uncontended");
        terms.push(term);
    }
    assert!(
        terms.windows(2).all(|w| w[0] < w[1]),
        "terms out of arrival order: {terms:?}"
    );
    let woken: u64 = clients.iter().map(ZooKeeperLock::wakeups).sum();
    assert_eq!(
        woken, STANDBYS as u64,
        "{STANDBYS} resignations woke candidates {woken} times"
    );
    wait_gone(&zk_raw, &dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_waits_on_a_watch_of_the_election() {
    let port = shared_port();
    let k = key("observer");
    let (candidate, observer) = (direct(port, SESSION).await, direct(port, SESSION).await);
    let dir = candidate.election_path(&k);
    let watching = {
        let (observer, k) = (observer.election(), k.clone());
        tokio::spawn(async move {
            observer
                .wait_change(&k, None, Duration::from_secs(60))
                .await
        })
    };
    // Nobody leads and the directory does not exist: the observer watches for it.
    let settle = Instant::now();
    while !watches_by_path(port).await.contains_key(&dir) {
        assert!(
            settle.elapsed() < Duration::from_secs(10),
            "the observer set no watch on {dir}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!watching.is_finished());
    let leading = candidate
        .election()
        .campaign(&k, &me("a"), &no_wait())
        .await
        .unwrap();
    let seen = timeout(Duration::from_secs(5), watching)
        .await
        .expect("the watch woke the observer")
        .unwrap()
        .unwrap()
        .expect("a leader");
    assert_eq!(seen.term, leading.term());

    // With a leader, the observer waits on a child watch (which the server's `wchp`
    // does not list): it sends nothing while nothing changes, where polling would send
    // two requests every 50 ms.
    let observer_session = observer.session_id().expect("a session");
    let watching = {
        let (observer, k, term) = (observer.election(), k.clone(), leading.term());
        tokio::spawn(async move {
            observer
                .wait_change(&k, Some(term), Duration::from_secs(60))
                .await
        })
    };
    let before = packets_received(port, observer_session).await;
    let quiet = Duration::from_secs(1);
    tokio::time::sleep(quiet).await;
    let sent = packets_received(port, observer_session).await - before;
    // The look that set the watch, and a ping or two.
    assert!(sent <= 4, "the observer sent {sent} requests in {quiet:?}");
    assert!(!watching.is_finished());
    leading.resign().await.unwrap();
    let seen = timeout(Duration::from_secs(5), watching)
        .await
        .expect("the watch woke the observer")
        .unwrap()
        .unwrap();
    assert_eq!(seen, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_expiry_loses_the_leadership_and_the_standby_takes_over() {
    let port = shared_port();
    // A long session: only the injected expiry can end the leadership quickly.
    let session_timeout = Duration::from_secs(8);
    let (leader_client, proxy) = proxied(port, session_timeout, |c| c).await;
    let standby_client = direct(port, session_timeout).await;
    let k = key("expiry");
    let dir = leader_client.election_path(&k);
    let leading = leader_client
        .election()
        .campaign(&k, &me("a"), &no_wait())
        .await
        .unwrap();
    let standby = {
        let (election, k) = (standby_client.election(), k.clone());
        tokio::spawn(async move {
            election
                .campaign(&k, &me("b"), &waiting(Duration::from_secs(30)))
                .await
        })
    };
    let zk_raw = raw(port).await;
    wait_children(&zk_raw, &dir, 2, Duration::from_secs(10)).await;

    // The leader's host is cut off: its leadership turns suspect, not lost.
    proxy.cut();
    let suspect = async {
        while leading.state() != LeaseState::Suspect {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    timeout(Duration::from_secs(10), suspect)
        .await
        .expect("the cut leader's leadership turns suspect");
    // Its session is closed by a second client resuming it: the server expires it.
    let info = leader_client.session_info().expect("a session");
    let injected_at = Instant::now();
    let intruder = zk::Client::connector()
        .with_session(info)
        .connect(&format!("127.0.0.1:{port}"))
        .await
        .expect("resumes the leader's session");
    drop(intruder);
    let next = timeout(Duration::from_secs(10), standby)
        .await
        .expect("the standby leads once the session is gone")
        .unwrap()
        .expect("campaigns");
    assert!(injected_at.elapsed() < session_timeout);
    assert!(next.term() > leading.term());
    let read = standby_client.election().leader(&k).await.unwrap();
    assert!(
        read.as_ref()
            .is_some_and(|l| l.candidate.as_bytes() == b"b" && l.term == next.term()),
        "{read:?}"
    );

    // The old leader reconnects, learns of the expiry and knows it lost.
    proxy.heal();
    timeout(Duration::from_secs(10), leading.lost())
        .await
        .expect("lost() fires once the old leader learns of the expiry");
    assert_eq!(leading.state(), LeaseState::Lost);
    drop(leading);
    next.resign().await.unwrap();
    wait_gone(&zk_raw, &dir).await;
}

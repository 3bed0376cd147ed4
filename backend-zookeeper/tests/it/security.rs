//! Digest credentials and creator-only ACLs, TLS (feature `tls`), and contenders of
//! other libraries (kazoo, Curator) in a lock directory, against real ZooKeeper.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use distlock_api::{LockError, LockKey, LockOptions, WaitPolicy};
use distlock_test_servers::{skip_or_panic, ServerError};
use distlock_zookeeper::{ZooKeeperConfig, ZooKeeperLock};
use tokio::time::Instant;
use zookeeper_client as zk;

fn key(name: &str) -> LockKey {
    LockKey::new(name).expect("valid key")
}

fn no_wait() -> LockOptions {
    LockOptions::new(Duration::from_secs(30)).with_wait(WaitPolicy::NoWait)
}

/// A short request timeout: a refused request must come back well within it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

async fn client(url: &str) -> ZooKeeperLock {
    ZooKeeperLock::connect_with(
        url,
        ZooKeeperConfig::default().with_request_timeout(REQUEST_TIMEOUT),
    )
    .await
    .unwrap_or_else(|e| panic!("connects to {url}: {e}"))
}

/// A raw session authenticated as `user:password`.
async fn raw_as(port: u16, user_password: &str) -> zk::Client {
    zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .with_auth("digest", user_password.as_bytes())
        .connect(&format!("127.0.0.1:{port}"))
        .await
        .expect("raw ZooKeeper client connects")
}

/// Creator ALL (`user`'s digest, and any other identity of the creating session, such
/// as its TLS client certificate's) and world READ, nothing else.
fn is_creator_all_world_read(acls: &[zk::Acl], user: &str) -> bool {
    let creator = acls.iter().any(|a| {
        a.scheme() == "digest"
            && a.id().starts_with(&format!("{user}:"))
            && a.permission() == zk::Permission::ALL
    });
    let world = |a: &zk::Acl| a.scheme() == "world" && a.id() == "anyone";
    let world_reads = acls
        .iter()
        .filter(|a| world(a))
        .all(|a| a.permission() == zk::Permission::READ);
    let identities_all = acls
        .iter()
        .filter(|a| !world(a))
        .all(|a| a.permission() == zk::Permission::ALL);
    creator && world_reads && identities_all && acls.iter().any(world)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_credentials_protect_nodes_and_a_wrong_password_is_refused() {
    let port = common::shared_port();
    let url = |userinfo: &str| format!("zookeeper://{userinfo}127.0.0.1:{port}/acl-test");
    let owner = client(&url("app:right@")).await;
    let k = key("payroll");
    let dir = owner.lock_dir(&k);
    let guard = owner
        .lock()
        .acquire(&k, &no_wait())
        .await
        .expect("acquires");

    // Creator ALL + world READ on every node it made: the chroot's base path, the
    // lock directory and the contender.
    let raw = common::raw(port).await;
    let children = raw.list_children(&dir).await.expect("anyone may list");
    assert_eq!(children.len(), 1, "{children:?}");
    let node = format!("{dir}/{}", children[0]);
    for path in ["/acl-test/distlock", dir.as_str(), node.as_str()] {
        let (acls, _) = raw.get_acl(path).await.expect("anyone may read the ACL");
        assert!(is_creator_all_world_read(&acls, "app"), "{path}: {acls:?}");
    }

    // Neither an anonymous session nor the right user with a wrong password may
    // delete the holder's node or add a contender.
    let wrong = raw_as(port, "app:wrong").await;
    for other in [&raw, &wrong] {
        assert_eq!(other.delete(&node, None).await, Err(zk::Error::NoAuth));
        let options = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
        let created = other.create(&format!("{dir}/x-lock-"), &[], &options).await;
        assert_eq!(created.err(), Some(zk::Error::NoAuth));
    }

    // Through distlock: a typed, non-retryable refusal within the request timeout,
    // and nothing left in the directory.
    for userinfo in ["app:wrong@", "", "other:right@"] {
        let intruder = client(&url(userinfo)).await;
        for options in [
            no_wait(),
            LockOptions::new(Duration::from_secs(30))
                .with_wait(WaitPolicy::Timeout(Duration::from_secs(20))),
        ] {
            let started = Instant::now();
            let Err(error) = intruder.lock().acquire(&k, &options).await else {
                panic!("{userinfo}: an intruder got the lock");
            };
            assert!(
                matches!(error, LockError::Config { .. }) && !error.is_retryable(),
                "{userinfo}: {error:?}"
            );
            assert!(error.to_string().contains("ACL"), "{error}");
            assert!(
                started.elapsed() < REQUEST_TIMEOUT,
                "{:?}",
                started.elapsed()
            );
        }
        // Reading is open: the status of the lock is visible to anyone.
        assert!(intruder.lock().inspect(&k).await.expect("inspects").held);
    }
    assert_eq!(raw.list_children(&dir).await.unwrap(), children);

    // The owner's identity, in another session, can take the lock after a release.
    guard.release().await.expect("releases");
    let same_identity = client(&url("app:right@")).await;
    let again = same_identity
        .lock()
        .acquire(&k, &no_wait())
        .await
        .expect("acquires");
    again.release().await.expect("releases");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_credentials_nodes_stay_open() {
    let port = common::shared_port();
    let locks = client(&format!("zookeeper://127.0.0.1:{port}/open-test")).await;
    let k = key("open");
    let guard = locks
        .lock()
        .acquire(&k, &no_wait())
        .await
        .expect("acquires");
    let raw = common::raw(port).await;
    let dir = locks.lock_dir(&k);
    let children = raw.list_children(&dir).await.unwrap();
    let (acls, _) = raw
        .get_acl(&format!("{dir}/{}", children[0]))
        .await
        .unwrap();
    assert_eq!(acls, zk::Acls::anyone_all().to_vec());
    guard.release().await.expect("releases");
}

/// Nodes that other libraries create: kazoo's `…__lock__N`, a bare Curator-style
/// `lock-N`, and nodes without a sequence (ignored).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_contenders_rank_by_their_sequence() {
    let port = common::shared_port();
    let locks = client(&common::url_for(port)).await;
    let k = key("foreign-raw");
    let dir = locks.lock_dir(&k);
    let raw = common::raw(port).await;
    let dirs = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
    raw.mkdir(&dir, &dirs)
        .await
        .expect("creates the lock directory");
    // A stranger without a sequence suffix holds nothing.
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    raw.create(&format!("{dir}/readme"), &[], &persistent)
        .await
        .unwrap();
    raw.create(&format!("{dir}/x__lock__"), &[], &persistent)
        .await
        .unwrap();
    let guard = locks
        .lock()
        .acquire(&k, &no_wait())
        .await
        .expect("strangers are ignored");
    guard.release().await.expect("releases");

    let ephemeral = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    for prefix in ["0f1e2d3c4b5a69788796a5b4c3d2e1f0__lock__", "lock-"] {
        let (_, sequence) = raw
            .create(&format!("{dir}/{prefix}"), &[], &ephemeral)
            .await
            .expect("creates a foreign contender");
        let foreign = format!("{dir}/{prefix}{sequence}");
        assert!(
            locks
                .lock()
                .try_acquire(&k, &no_wait())
                .await
                .unwrap()
                .is_none(),
            "{foreign} holds the lock"
        );
        assert!(locks.lock().inspect(&k).await.unwrap().held);
        let waiting = {
            let locks = locks.clone();
            let k = k.clone();
            tokio::spawn(async move {
                let options = LockOptions::new(Duration::from_secs(30))
                    .with_wait(WaitPolicy::Timeout(Duration::from_secs(30)));
                locks.lock().acquire(&k, &options).await
            })
        };
        // The waiter queued behind the foreign node (2 nodes + the 2 strangers).
        common::wait_children(&raw, &dir, 4, Duration::from_secs(10)).await;
        assert!(!waiting.is_finished());
        raw.delete(&foreign, None).await.unwrap();
        let guard = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("granted once the foreign contender left")
            .unwrap()
            .expect("acquires");
        guard.release().await.expect("releases");
    }
}

/// A kazoo `Lock` driven over stdin/stdout: `acquire`, `try`, `release`.
struct Kazoo {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

const KAZOO_SCRIPT: &str = r#"
import sys
from kazoo.client import KazooClient
client = KazooClient(hosts=sys.argv[1])
client.start(timeout=20)
lock = client.Lock(sys.argv[2], "kazoo", extra_lock_patterns=["-lock-"])
print("ready", flush=True)
for line in sys.stdin:
    command = line.strip()
    if command == "acquire":
        print("acquired" if lock.acquire(timeout=30) else "timeout", flush=True)
    elif command == "try":
        print("acquired" if lock.acquire(blocking=False) else "busy", flush=True)
    elif command == "release":
        lock.release()
        print("released", flush=True)
client.stop()
"#;

impl Kazoo {
    /// Starts kazoo on `dir`, or `None` (after [`skip_or_panic`]) without it.
    fn start(port: u16, dir: &str) -> Option<Kazoo> {
        let python = "/usr/bin/python3";
        let spawned = Command::new(python)
            .args(["-c", KAZOO_SCRIPT, &format!("127.0.0.1:{port}"), dir])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn();
        let mut child = match spawned {
            Ok(child) => child,
            Err(e) => {
                let missing = ServerError::NotInstalled {
                    what: format!("{python} ({e})"),
                    hint: "install the Debian package `python3-kazoo` (scripts/test.sh does)"
                        .into(),
                };
                skip_or_panic("kazoo", &missing);
                return None;
            }
        };
        let (stdin, stdout) = (child.stdin.take()?, child.stdout.take()?);
        let mut kazoo = Kazoo {
            child,
            stdin,
            stdout: BufReader::new(stdout),
        };
        if kazoo.read() != "ready" {
            skip_or_panic(
                "kazoo",
                &ServerError::NotInstalled {
                    what: "python3-kazoo".into(),
                    hint: "install the Debian package `python3-kazoo` (scripts/test.sh does)"
                        .into(),
                },
            );
            return None;
        }
        Some(kazoo)
    }

    fn read(&mut self) -> String {
        let mut line = String::new();
        let _ = self.stdout.read_line(&mut line);
        line.trim().to_owned()
    }

    /// Sends `command` and returns kazoo's answer (blocking: call off the runtime).
    fn ask(&mut self, command: &str) -> String {
        writeln!(self.stdin, "{command}").expect("kazoo reads its commands");
        self.read()
    }
}

impl Drop for Kazoo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_and_distlock_exclude_each_other() {
    let port = common::shared_port();
    let locks = client(&common::url_for(port)).await;
    let k = key("kazoo-shared");
    let dir = locks.lock_dir(&k);
    let Some(kazoo) = Kazoo::start(port, &dir) else {
        return;
    };
    let ask = |mut kazoo: Kazoo, command: &'static str| {
        tokio::task::spawn_blocking(move || {
            let answer = kazoo.ask(command);
            (kazoo, answer)
        })
    };

    // kazoo holds: distlock does not get the lock, and waits for it.
    let (kazoo, answer) = ask(kazoo, "acquire").await.unwrap();
    assert_eq!(answer, "acquired");
    assert!(locks
        .lock()
        .try_acquire(&k, &no_wait())
        .await
        .unwrap()
        .is_none());
    let waiting = {
        let locks = locks.clone();
        let k = k.clone();
        tokio::spawn(async move {
            let options = LockOptions::new(Duration::from_secs(30))
                .with_wait(WaitPolicy::Timeout(Duration::from_secs(30)));
            locks.lock().acquire(&k, &options).await
        })
    };
    let raw = common::raw(port).await;
    common::wait_children(&raw, &dir, 2, Duration::from_secs(10)).await;
    assert!(!waiting.is_finished());
    let (kazoo, answer) = ask(kazoo, "release").await.unwrap();
    assert_eq!(answer, "released");
    let guard = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("granted once kazoo released")
        .unwrap()
        .expect("acquires");

    // distlock holds: kazoo (told about `-lock-`) does not get it.
    let (kazoo, answer) = ask(kazoo, "try").await.unwrap();
    assert_eq!(answer, "busy");
    guard.release().await.expect("releases");
    let (kazoo, answer) = ask(kazoo, "try").await.unwrap();
    assert_eq!(answer, "acquired");
    let (_kazoo, answer) = ask(kazoo, "release").await.unwrap();
    assert_eq!(answer, "released");
}

#[cfg(feature = "tls")]
mod tls {
    use super::*;
    use distlock_test_servers::ZooKeeperTlsServer;

    async fn server(client_auth: bool) -> ZooKeeperTlsServer {
        ZooKeeperTlsServer::start(client_auth)
            .await
            .unwrap_or_else(|e| {
                panic!("could not start ZooKeeper with TLS (run scripts/test.sh): {e}")
            })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn locks_over_tls_with_a_client_certificate_and_credentials() {
        let server = server(true).await;
        let a = client(&server.url_with_credentials("app:pw")).await;
        let b = client(&server.url_with_credentials("app:pw")).await;
        let k = key("over-tls");
        let guard = a
            .lock()
            .acquire(&k, &no_wait())
            .await
            .expect("acquires over TLS");
        assert!(b
            .lock()
            .try_acquire(&k, &no_wait())
            .await
            .unwrap()
            .is_none());
        let status = b.lock().inspect(&k).await.unwrap();
        assert!(status.held);
        assert_eq!(status.fencing_token, guard.fencing_token());
        // The nodes carry the creator-only ACL over TLS too. Read while held: the
        // lock's directory is removed once its last contender leaves.
        let raw = common::raw(server.server().port()).await;
        let (acls, _) = raw.get_acl(&a.lock_dir(&k)).await.unwrap();
        assert!(is_creator_all_world_read(&acls, "app"), "{acls:?}");
        guard.release().await.expect("releases");
        assert!(!b.lock().inspect(&k).await.unwrap().held);
        // New sessions with credentials, one after another (ZooKeeper 3.8's Netty
        // server answered an `addauth` sent right behind a new session's connect
        // request before the connect, which failed the handshake of most of them).
        for n in 0..6 {
            let url = server.url_with_credentials("app:pw");
            let config = ZooKeeperConfig::default().with_connect_timeout(Duration::from_secs(10));
            let another = ZooKeeperLock::connect_with(&url, config)
                .await
                .unwrap_or_else(|e| panic!("session #{n}: {e}"));
            let guard = another
                .lock()
                .acquire(&k, &no_wait())
                .await
                .expect("acquires");
            guard.release().await.expect("releases");
        }
    }

    /// A session that reconnects (the client sends its credentials again, right behind
    /// the connect request) keeps its lock, and its identity: it can still create
    /// nodes in the directories it made.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn credentials_survive_reconnects_over_tls() {
        let server = server(false).await;
        let proxy = common::network_proxy(server.secure_port()).await;
        let url = server.url_with_credentials("app:pw").replace(
            &server.secure_port().to_string(),
            &proxy.local_addr().port().to_string(),
        );
        let locks = client(&url).await;
        let held = locks
            .lock()
            .acquire(&key("reconnect/held"), &no_wait())
            .await
            .expect("acquires");
        for round in 0..5 {
            let session = locks.session_id();
            proxy.reset_all();
            let k = key(&format!("reconnect/{round}"));
            let deadline = Instant::now() + Duration::from_secs(10);
            let guard = loop {
                match locks.lock().acquire(&k, &no_wait()).await {
                    Ok(guard) => break guard,
                    Err(e) if e.is_retryable() && Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(50)).await
                    }
                    Err(e) => panic!("round {round}: {e:?}"),
                }
            };
            assert_eq!(
                locks.session_id(),
                session,
                "round {round}: the session survives"
            );
            guard.release().await.expect("releases");
        }
        assert_ne!(held.state(), distlock_api::LeaseState::Lost);
        held.release().await.expect("releases after the reconnects");
    }

    /// Connection errors within the connect timeout, nothing panics or hangs.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn wrong_ports_and_certificates_are_connection_errors() {
        let server = server(true).await;
        let client_cert = server.tls().client_cert();
        let ca = server.tls().ca_cert().display().to_string();
        let identity = format!(
            "&cert={}&key={}",
            client_cert.cert.display(),
            client_cert.key.display()
        );
        let plain_port = server.server().port();
        let urls = [
            // TLS against the plaintext port.
            format!("zookeeper+tls://127.0.0.1:{plain_port}?ca={ca}{identity}"),
            // No client certificate where the server demands one.
            format!("zookeeper+tls://127.0.0.1:{}?ca={ca}", server.secure_port()),
            // A CA that did not sign the server's certificate (the client's own).
            format!(
                "zookeeper+tls://127.0.0.1:{}?ca={}{identity}",
                server.secure_port(),
                client_cert.cert.display()
            ),
            // Plaintext against the TLS port.
            format!("zookeeper://127.0.0.1:{}", server.secure_port()),
        ];
        let connect_timeout = Duration::from_secs(4);
        for url in urls {
            let started = Instant::now();
            let config = ZooKeeperConfig::default()
                .with_session_timeout(Duration::from_secs(4))
                .with_connect_timeout(connect_timeout);
            let result = ZooKeeperLock::connect_with(&url, config).await;
            let error = result.err().unwrap_or_else(|| panic!("{url} connected"));
            assert!(
                matches!(error, LockError::Connection { .. }),
                "{url}: {error:?}"
            );
            assert!(
                started.elapsed() < connect_timeout + Duration::from_secs(1),
                "{url}: {:?}",
                started.elapsed()
            );
            if url.starts_with("zookeeper+tls") {
                assert!(error.to_string().contains("TLS"), "{error}");
            }
        }
        // The right URL works on the same server.
        client(&server.url()).await;
    }

    /// rustls needs a DNS name or an IP address to check a certificate against (the
    /// client would panic on any other host that resolved): such a host is refused
    /// before connecting, not left to fail a DNS lookup as a connection error.
    #[tokio::test]
    async fn a_tls_host_that_no_certificate_can_name_is_a_config_error() {
        let ca = distlock_test_servers::TestCa::create("zk-hosts")
            .await
            .unwrap_or_else(|e| panic!("openssl makes a test CA: {e}"));
        for host in ["bad..host", "-x", "under_score-.x"] {
            let url = format!("zk+tls://{host}:2281?ca={}", ca.cert().display());
            let Err(error) = ZooKeeperLock::connect(&url).await else {
                panic!("{url} connected");
            };
            assert!(matches!(error, LockError::Config { .. }), "{error:?}");
            assert!(error.to_string().contains(host), "{error}");
        }
    }

    #[tokio::test]
    async fn missing_and_invalid_tls_files_are_config_errors() {
        let dir = tempfile::tempdir().unwrap();
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "not a certificate\n").unwrap();
        let missing = dir.path().join("missing.pem");
        for (url, names) in [
            (
                format!("zk+tls://127.0.0.1:1?ca={}", missing.display()),
                &missing,
            ),
            (
                format!("zk+tls://127.0.0.1:1?ca={}", garbage.display()),
                &garbage,
            ),
        ] {
            let Err(error) = ZooKeeperLock::connect(&url).await else {
                panic!("{url} connected");
            };
            assert!(matches!(error, LockError::Config { .. }), "{error:?}");
            assert!(
                error.to_string().contains(&names.display().to_string()),
                "{error}"
            );
        }
    }
}

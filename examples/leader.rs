//! A service that does its work only while it leads, and stops the moment it may not.
//!
//! Two replicas campaign for the election `example/scheduler`. The leader runs its work
//! (a few ticks, each sent with its term, which a resource would check as a fencing
//! token) and resigns when done, handing over to the standby. Replica `a` starts
//! without renewing its 300 ms lease, as if its process stalled: the lease runs out
//! mid-work, `lost()` fires, and `a` stops at once and campaigns again, while `b`
//! takes over under a higher term. `b` may start before `a` has noticed: that is why
//! every write carries the term, and the resource refuses lower ones.
//!
//! ```sh
//! cargo run --example leader                                # the memory backend
//! cargo run --example leader -- zookeeper://127.0.0.1:2181  # any backend URL
//! ```
//!
//! Without code, `distlock elect NAME -- COMMAND` does the same for a command.

use std::error::Error;
use std::time::Duration;

use distlock::{AutoRenew, Candidate, FencingToken, LockKey, LockOptions, WaitPolicy};

type Result<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

#[tokio::main]
async fn main() -> Result<()> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory://".into());
    run(&url).await
}

/// Runs both replicas on the backend at `url` until each has done its work once.
async fn run(url: &str) -> Result<()> {
    let a = tokio::spawn(replica(url.to_owned(), "a", true));
    tokio::time::sleep(Duration::from_millis(100)).await; // let `a` lead first
    let b = tokio::spawn(replica(url.to_owned(), "b", false));
    a.await??;
    b.await??;
    distlock::settle_cleanups(Duration::from_secs(2)).await;
    Ok(())
}

/// One replica: campaign, work while leading, stop on `lost()`, campaign again.
async fn replica(url: String, name: &'static str, stalls_first: bool) -> Result<()> {
    let client = distlock::connect(&url).await?;
    let elections = client.election();
    let election = LockKey::new("example/scheduler")?;
    let me = Candidate::new(format!("replica-{name}"))?;
    let wait = WaitPolicy::Timeout(Duration::from_secs(30));
    for attempt in 0.. {
        let options = if stalls_first && attempt == 0 {
            // A stalled process renews nothing: its lease runs out after 300 ms. (Some
            // backends have a longer shortest lease, such as etcd's 2 s.)
            LockOptions::new(Duration::from_millis(300).max(min_ttl(&url))).with_wait(wait)
        } else {
            LockOptions::new(Duration::from_secs(10))
                .with_wait(wait)
                .with_auto_renew(AutoRenew::new())
        };
        let leadership = elections.campaign(&election, &me, &options).await?;
        let term = leadership.term();
        println!("replica {name}: leads in term {term}");
        tokio::select! {
            _ = leadership.lost() => {
                // The lease may have ended: another replica may lead now. Stop writing.
                println!("replica {name}: leadership lost in term {term}: work stopped");
                continue;
            }
            () = work(name, term) => {
                println!("replica {name}: work done, resigning: {:?}", leadership.resign().await?);
                return Ok(());
            }
        }
    }
    unreachable!("the loop returns")
}

/// The work a leader does: ticks, each sent with the term.
async fn work(name: &str, term: FencingToken) {
    for tick in 1..=5 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        println!("replica {name}: tick {tick} (term {term})");
    }
}

/// The shortest lease the backend grants, roughly: etcd's is 2 s.
fn min_ttl(url: &str) -> Duration {
    if url.starts_with("etcd") {
        Duration::from_secs(2)
    } else {
        Duration::ZERO
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test(flavor = "multi_thread")]
    async fn runs_on_memory() {
        super::run("memory://example-leader").await.unwrap();
    }
}

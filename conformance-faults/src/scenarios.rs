//! The fault scenarios, and running them into a [`FaultReport`].

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock_api::{
    AutoRenew, LeaseState, LockError, LockGuard, LockKey, LockOptions, ReleaseOutcome,
};
use tokio::time::{sleep, timeout, Instant};

use super::checkers::Findings;
use super::harness::{Claim, Fault, FaultClient, FaultHarness, NetFaults, ServerAction, Topology};
use super::history::{Event, History, Op, Phase};
use super::record::{pause_holder, FencedSet, Recorder};
use super::report::{FaultReport, FaultResult, FaultVerdict};
use distlock_conformance::check;
use distlock_conformance::support::{
    fifo_with_ttl, unique_key, until_queued, waiting, Arrival, LONG_TTL,
};
use distlock_conformance::Failure;

/// What a scenario body hands back: a detail line and the history it recorded.
pub(crate) struct Outcome {
    detail: String,
    history: History,
}

type FaultFuture<'a> = Pin<Box<dyn Future<Output = Result<Outcome, Failure>> + Send + 'a>>;

/// One named fault scenario.
#[derive(Clone, Copy)]
#[non_exhaustive]
pub struct FaultScenario {
    /// Unique snake_case name.
    pub name: &'static str,
    /// The fault it injects (the key of the backend's [`FaultHarness::claim`]).
    pub fault: Fault,
    /// What it checks, in one sentence.
    pub checks: &'static str,
    run: for<'a> fn(&'a dyn FaultHarness) -> FaultFuture<'a>,
}

impl std::fmt::Debug for FaultScenario {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultScenario")
            .field("name", &self.name)
            .finish()
    }
}

macro_rules! fault_scenario {
    ($name:ident, $fault:ident, $checks:literal) => {
        FaultScenario {
            name: stringify!($name),
            fault: Fault::$fault,
            checks: $checks,
            run: |h| Box::pin($name(h)),
        }
    };
}

/// Every fault scenario, in run order.
pub static FAULT_SCENARIOS: &[FaultScenario] = &[
    fault_scenario!(partitioned_holder_is_fenced_off, Partition,
        "a holder partitioned past its lease: lost() fires by its validity deadline, another client acquires, and the stale holder's write is refused by the fenced store"),
    fault_scenario!(paused_holder_wakes_to_a_refused_write, HolderPause,
        "a holder that stops renewing and stalls past its TTL wakes up after another client took the key, and its write is refused"),
    fault_scenario!(server_paused_during_acquire, ServerPause,
        "with every server paused (SIGSTOP) an acquire returns an error within its wait (plus slack), not after a request timeout; after resume a grant that arrived late is released and the key is free"),
    fault_scenario!(lost_reply_after_applied_acquire, LostReply,
        "the reply to an acquire the server applied is lost: no deadlock (another client acquires within the lease bound) and no double holder"),
    fault_scenario!(server_restart_while_held_and_waited, ServerRestart,
        "every server is killed (-9) and restarted while a lock is held and waited on; the outcome is recorded and checked"),
    fault_scenario!(redlock_minority_then_majority_loss, NodeLoss,
        "Redlock keeps working with a minority of nodes down and fails fast with a majority down, leaving no orphan key that would block a majority"),
    fault_scenario!(ensemble_leader_loss, LeaderLoss,
        "a 3-node ZooKeeper ensemble loses its leader while a lock is held and waited on: a new leader is elected and exclusion holds"),
    fault_scenario!(terminated_session_fires_lost, SessionTerminated,
        "a holder's server session is terminated: lost() fires, another client acquires, and the stale holder's write is refused"),
    fault_scenario!(crashed_clients_do_not_stall_the_fifo_queue, QueueCrash,
        "FIFO waiting: a queued waiter killed (its connections closed) holds up the waiter behind it no longer than the dead-waiter bound after a release, and a holder killed with two waiters queued behind it is succeeded within the crash bound, the two in arrival order"),
    fault_scenario!(contention_under_random_faults, RandomFaults,
        "16 clients x 100 rounds of read-modify-write on a fenced set while seeded random network faults hit random clients: no overlap, no stale write, no lost update"),
];

/// Past the wait, how long a call against a silent server may take before it counts
/// as hung: clients give up after their own request timeouts (two of them, at most,
/// with a reconnect), which is what the scenarios report.
const HANG: Duration = Duration::from_secs(30);

/// How the skip reason of a scenario starts when the servers' provider lacks an
/// action it needs (a container cannot be paused): such a skip does not fail a
/// `must_pass` scenario.
pub const PROVIDER_LACKS: &str = "the server provider cannot do this: ";

fn skip(why: impl Into<String>) -> Failure {
    Failure::Skipped(why.into())
}

const NEEDS_NET: &str =
    "needs a network fault hook on each client (a proxy), which this harness lacks";

/// A client with its network faults, or a skip.
async fn net_client(h: &dyn FaultHarness) -> Result<(FaultClient, NetFaults), Failure> {
    let client = h.fault_client().await?;
    let net = client.net.clone().ok_or_else(|| skip(NEEDS_NET))?;
    Ok((client, net))
}

fn recorder(client: &FaultClient, n: usize, history: &History) -> Recorder {
    Recorder::new(n, client.client.lock.clone(), history.clone())
}

fn renewed(ttl: Duration, wait: Duration) -> LockOptions {
    waiting(ttl, wait).with_auto_renew(AutoRenew::new())
}

/// How long a waiter may need for a dead or cut-off holder's lock to free.
fn takeover(h: &dyn FaultHarness) -> Duration {
    h.crash_bound(h.ttl()) + 3 * h.slack()
}

fn millis(d: Duration) -> String {
    distlock_conformance::support::millis(d)
}

/// Runs `action` on every node, in order.
async fn all_nodes(h: &dyn FaultHarness, action: ServerAction) -> Result<(), Failure> {
    let nodes = h.topology().nodes();
    if nodes == 0 {
        return Err(skip(super::harness::NOT_CONTROLLED));
    }
    if let Some(why) = h.unsupported(action).await {
        return Err(skip(format!("{PROVIDER_LACKS}{why}")));
    }
    for node in 0..nodes {
        h.control(node, action)
            .await
            .map_err(|e| Failure::Failed(format!("{action:?} of node {node}: {e}")))?;
    }
    Ok(())
}

/// The stale holder's write attempt, and how it went, for the detail line.
fn stale_write(
    set: &FencedSet,
    client: usize,
    guard: &LockGuard,
    fencing: bool,
) -> Result<&'static str, Failure> {
    let accepted = set.add(client, guard.fencing_token(), 99);
    if fencing {
        check!(
            !accepted,
            "the stale holder's write with token {:?} was accepted",
            guard.fencing_token()
        );
        Ok("stale write refused")
    } else if accepted {
        Ok("stale write accepted (no fencing on this backend)")
    } else {
        Ok("stale write refused")
    }
}

fn fencing(h_client: &FaultClient) -> bool {
    h_client
        .client
        .lock
        .info()
        .capabilities
        .fencing
        .is_supported()
}

async fn partitioned_holder_is_fenced_off(h: &dyn FaultHarness) -> Result<Outcome, Failure> {
    let history = History::new();
    let (a, net) = net_client(h).await?;
    let b = h.fault_client().await?;
    let (ra, rb) = (recorder(&a, 0, &history), recorder(&b, 1, &history));
    let key = unique_key("partition");
    let set = FencedSet::new(format!("{key}#set"), history.clone());
    let guard = ra.acquire(&key, &renewed(h.ttl(), h.slack())).await?;
    check!(
        set.add(0, guard.fencing_token(), 1),
        "the holder's first write was refused"
    );
    net.blackhole();
    let cut = Instant::now();
    let deadline = guard.valid_until();
    let fired = timeout(
        deadline.saturating_duration_since(cut) + h.slack(),
        guard.lost(),
    )
    .await;
    let lost_after = cut.elapsed();
    check!(
        fired.is_ok(),
        "lost() did not fire within the validity deadline ({}) plus slack of the cut",
        millis(deadline.saturating_duration_since(cut))
    );
    ra.lost(&guard);
    let taken = rb.acquire(&key, &waiting(h.ttl(), takeover(h))).await?;
    let taken_after = cut.elapsed();
    check!(
        set.add(1, taken.fencing_token(), 2),
        "the new holder's write was refused"
    );
    let stale = stale_write(&set, 0, &guard, fencing(&a))?;
    net.heal_with_reset();
    rb.release(taken).await?;
    drop(guard);
    set.final_read();
    Ok(Outcome {
        detail: format!(
            "lost() after {}, taken over after {}, {stale}",
            millis(lost_after),
            millis(taken_after)
        ),
        history,
    })
}

async fn paused_holder_wakes_to_a_refused_write(h: &dyn FaultHarness) -> Result<Outcome, Failure> {
    let history = History::new();
    let a = h.fault_client().await?;
    let caps = a.client.lock.info().capabilities;
    if a.net.is_none() && !caps.ttl_expiry.is_supported() {
        return Err(skip(
            "needs TTL expiry or a network hook to stop the holder's session renewing",
        ));
    }
    let b = h.fault_client().await?;
    let (ra, rb) = (recorder(&a, 0, &history), recorder(&b, 1, &history));
    let key = unique_key("holder-pause");
    let set = FencedSet::new(format!("{key}#set"), history.clone());
    // No auto-renew: the paused process renews nothing.
    let guard = ra.acquire(&key, &waiting(h.ttl(), h.slack())).await?;
    check!(
        set.add(0, guard.fencing_token(), 1),
        "the holder's first write was refused"
    );
    let paused = Instant::now();
    // The stall lasts until another client has taken over and written: the event
    // the pause spans.
    let other = {
        let (rb, key, set) = (rb.clone(), key.clone(), set.clone());
        let (ttl, wait) = (h.ttl(), takeover(h));
        async move {
            let taken = rb.acquire(&key, &waiting(ttl, wait)).await?;
            let wrote = set.add(1, taken.fencing_token(), 2);
            rb.release(taken).await?;
            Ok::<_, LockError>(wrote)
        }
    };
    let wrote = pause_holder(a.net.as_ref(), other).await?;
    check!(wrote, "the new holder's write was refused");
    let stalled = paused.elapsed();
    check!(
        guard.valid_until() <= Instant::now(),
        "the other client acquired while the stalled holder's claimed validity had not run out"
    );
    ra.lost(&guard);
    let stale = stale_write(&set, 0, &guard, fencing(&a))?;
    drop(guard);
    set.final_read();
    Ok(Outcome {
        detail: format!("stalled {}, {stale}", millis(stalled)),
        history,
    })
}

async fn server_paused_during_acquire(h: &dyn FaultHarness) -> Result<Outcome, Failure> {
    if h.topology().nodes() == 0 {
        return Err(skip(super::harness::NOT_CONTROLLED));
    }
    let history = History::new();
    let (b, c) = (h.fault_client().await?, h.fault_client().await?);
    let (rb, rc) = (recorder(&b, 0, &history), recorder(&c, 1, &history));
    let key = unique_key("server-pause");
    let wait = h.slack();
    all_nodes(h, ServerAction::Pause).await?;
    let started = Instant::now();
    let attempt = timeout(wait + HANG, rb.acquire(&key, &waiting(h.ttl(), wait))).await;
    let took = started.elapsed();
    all_nodes(h, ServerAction::Resume).await?;
    let error = match attempt {
        Err(_) => {
            return Err(Failure::Failed(format!(
                "acquire against a paused server hung for {}",
                millis(took)
            )))
        }
        Ok(Ok(guard)) => {
            let _ = rb.release(guard).await;
            return Err(Failure::Failed(
                "acquire succeeded against a paused server".into(),
            ));
        }
        Ok(Err(e)) => e,
    };
    // A grant the paused server applies on resume must not block the key for good.
    let started = Instant::now();
    let taken = rc
        .acquire(&key, &waiting(h.ttl(), h.ttl() + takeover(h)))
        .await?;
    let free_after = started.elapsed();
    rc.release(taken).await?;
    // And the client that timed out works again.
    let again = rb.acquire(&key, &waiting(h.ttl(), takeover(h))).await?;
    rb.release(again).await?;
    let detail = format!(
        "acquire failed after {}, kind {} ({}), key free {} after resume",
        millis(took),
        error_kind(&error),
        short(&error),
        millis(free_after)
    );
    // The caller's wait bounds the call whatever the server does (checked last, so a
    // slow backend still leaves the key free for the scenarios after this one).
    if took > wait + h.slack() {
        return Err(Failure::Failed(format!(
            "the wait of {} did not bound the acquire: {detail}",
            millis(wait)
        )));
    }
    Ok(Outcome { detail, history })
}

/// The kind of `e`, for a report line.
fn error_kind(e: &LockError) -> &'static str {
    match e {
        LockError::Timeout { .. } => "timeout",
        LockError::Connection { .. } => "connection",
        LockError::Transient { .. } => "transient",
        LockError::Backend { .. } => "backend",
        LockError::NotHeld { .. } => "not-held",
        LockError::Unsupported { .. } => "unsupported",
        LockError::Config { .. } => "config",
        LockError::InvalidKey { .. } | LockError::InvalidOptions { .. } => "invalid",
        _ => "other",
    }
}

fn short(e: &LockError) -> String {
    let text = e.to_string();
    match text.char_indices().nth(60) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text,
    }
}

async fn lost_reply_after_applied_acquire(h: &dyn FaultHarness) -> Result<Outcome, Failure> {
    let history = History::new();
    let (a, net) = net_client(h).await?;
    let b = h.fault_client().await?;
    let (ra, rb) = (recorder(&a, 0, &history), recorder(&b, 1, &history));
    let key = unique_key("lost-reply");
    net.drop_replies();
    let started = Instant::now();
    let attempt = timeout(
        h.slack() + HANG,
        ra.acquire(&key, &waiting(h.ttl(), h.slack())),
    )
    .await;
    let took = started.elapsed();
    // A TCP stream cannot lose bytes and go on: the connection breaks.
    net.heal_with_reset();
    match attempt {
        Err(_) => {
            return Err(Failure::Failed(format!(
                "acquire without replies hung for {}",
                millis(took)
            )))
        }
        Ok(Ok(guard)) => {
            let _ = ra.release(guard).await;
            return Err(Failure::Failed(
                "acquire succeeded although every reply was lost".into(),
            ));
        }
        Ok(Err(_)) => {}
    }
    let started = Instant::now();
    let taken = rb
        .acquire(&key, &waiting(h.ttl(), h.ttl() + takeover(h)))
        .await?;
    let free_after = started.elapsed();
    rb.release(taken).await?;
    let again = ra.acquire(&key, &waiting(h.ttl(), takeover(h))).await?;
    ra.release(again).await?;
    Ok(Outcome {
        detail: format!(
            "acquire gave up after {}, another client acquired after {}",
            millis(took),
            millis(free_after)
        ),
        history,
    })
}

/// A waiter that keeps trying (through connection errors) until `deadline`, then adds
/// `value` and releases. Returns whether it acquired.
fn persistent_waiter(
    r: Recorder,
    key: LockKey,
    set: FencedSet,
    ttl: Duration,
    value: u64,
    deadline: Instant,
) -> tokio::task::JoinHandle<bool> {
    tokio::spawn(async move {
        while Instant::now() < deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            match r.acquire(&key, &waiting(ttl, left)).await {
                Ok(guard) => {
                    set.add(r.client, guard.fencing_token(), value);
                    let _ = r.release(guard).await;
                    return true;
                }
                Err(LockError::Timeout { .. }) => return false,
                // The server is down or restarting: try again shortly.
                Err(_) => sleep(Duration::from_millis(100)).await,
            }
        }
        false
    })
}

async fn server_restart_while_held_and_waited(h: &dyn FaultHarness) -> Result<Outcome, Failure> {
    if h.topology().nodes() == 0 {
        return Err(skip(super::harness::NOT_CONTROLLED));
    }
    let history = History::new();
    let a = h.fault_client().await?;
    let ra = recorder(&a, 0, &history);
    let key = unique_key("restart");
    let set = FencedSet::new(format!("{key}#set"), history.clone());
    // A few grants first, so the holder's token is above a counter that starts afresh.
    for _ in 0..3 {
        let g = ra.acquire(&key, &waiting(h.ttl(), h.slack())).await?;
        ra.release(g).await?;
    }
    let guard = ra.acquire(&key, &renewed(h.ttl(), h.slack())).await?;
    check!(
        set.add(0, guard.fencing_token(), 1),
        "the holder's first write was refused"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut waiters = Vec::new();
    for n in 1..=2 {
        let w = h.fault_client().await?;
        waiters.push(persistent_waiter(
            recorder(&w, n, &history),
            key.clone(),
            set.clone(),
            h.ttl(),
            10 + n as u64,
            deadline,
        ));
    }
    let lost = {
        let (ra, lost) = (ra.clone(), guard.lost());
        let monitor = guard.monitor();
        let (key, owner) = (key.clone(), guard.lease().owner());
        tokio::spawn(async move {
            lost.await;
            ra.history.record(
                Event::new(ra.client, key.as_str(), Op::Lost, Phase::Ok)
                    .owner(owner)
                    .valid_until_us(ra.history.micros(monitor.valid_until())),
            );
        })
    };
    all_nodes(h, ServerAction::Kill).await?;
    all_nodes(h, ServerAction::Restart).await?;
    // The holder may be reconnecting (suspect) for a while: wait until it knows
    // whether it holds (the lease has no event for that but lost()).
    let settle = Instant::now() + takeover(h);
    while guard.state() == LeaseState::Suspect && Instant::now() < settle {
        sleep(Duration::from_millis(20)).await;
    }
    // The holder, if it still believes it holds, works on for a TTL (renewing), then
    // writes and releases if it still holds.
    let held_through = guard.state() == LeaseState::Held;
    if held_through {
        let _ = timeout(h.ttl(), guard.lost()).await;
    }
    let still = guard.state() == LeaseState::Held;
    let guard = if still {
        set.add(0, guard.fencing_token(), 2);
        let _ = ra.release(guard).await;
        None
    } else {
        Some(guard)
    };
    let mut acquired = 0;
    for w in waiters {
        if w.await
            .map_err(|e| Failure::Failed(format!("a waiter panicked: {e}")))?
        {
            acquired += 1;
        }
    }
    lost.abort();
    // A holder that lost its lease tries a late write after the others are done.
    if let Some(guard) = guard {
        let _ = stale_write(&set, 0, &guard, false);
    }
    check!(
        acquired >= 1,
        "no waiter acquired within 30 s of the restart"
    );
    set.final_read();
    Ok(Outcome {
        detail: format!(
            "holder {} the restart, {acquired}/2 waiters acquired",
            match (held_through, still) {
                (true, true) => "kept its lease through",
                (true, false) => "held on after, then lost its lease in",
                _ => "lost its lease in",
            }
        ),
        history,
    })
}

async fn redlock_minority_then_majority_loss(h: &dyn FaultHarness) -> Result<Outcome, Failure> {
    let Topology::Quorum { nodes } = h.topology() else {
        return Err(skip(
            "needs independent nodes with a client-side majority (Redlock)",
        ));
    };
    if nodes != 3 {
        return Err(skip("written for 3 nodes"));
    }
    let outcome = node_loss(h).await;
    // Whatever happened, the next scenarios get every node back.
    for node in [1, 2] {
        h.control(node, ServerAction::Restart)
            .await
            .map_err(|e| Failure::Failed(format!("restarting node {node}: {e}")))?;
    }
    outcome
}

async fn node_loss(h: &dyn FaultHarness) -> Result<Outcome, Failure> {
    let history = History::new();
    let (a, b) = (h.fault_client().await?, h.fault_client().await?);
    let (ra, rb) = (recorder(&a, 0, &history), recorder(&b, 1, &history));
    let key = unique_key("redlock-loss");
    let fail = |e: String| Failure::Failed(e);
    h.control(2, ServerAction::Kill).await.map_err(fail)?;
    let guard = ra
        .acquire(&key, &waiting(h.ttl() * 4, h.slack() * 5))
        .await?;
    let second = rb
        .lock
        .try_acquire(&key, &waiting(h.ttl(), Duration::ZERO))
        .await?;
    check!(
        second.is_none(),
        "with one node down a second client also got the key"
    );
    ra.release(guard).await?;
    h.control(1, ServerAction::Kill).await.map_err(fail)?;
    let started = Instant::now();
    // A long TTL, so an orphan left by this attempt would outlive the check below.
    let result = ra
        .acquire(&key, &waiting(h.ttl() * 20, Duration::from_secs(30)))
        .await;
    let took = started.elapsed();
    check!(
        result.is_err(),
        "acquire succeeded with a majority of nodes down"
    );
    check!(
        took < Duration::from_secs(10),
        "acquire with a majority down took {}: not fast",
        millis(took)
    );
    // Node 0 was up throughout. With node 1 back (node 2 still down), an acquire
    // needs node 0: an orphan key left there by the failed attempt (its TTL is far
    // longer than this wait) would refuse it.
    h.control(1, ServerAction::Restart).await.map_err(fail)?;
    let taken = rb.acquire(&key, &waiting(h.ttl(), h.slack() * 2)).await;
    let taken = taken.map_err(|e| {
        Failure::Failed(format!(
            "after the majority failure the key was not free on nodes 0 and 1: {e}"
        ))
    })?;
    rb.release(taken).await?;
    Ok(Outcome {
        detail: format!(
            "1 of 3 down: acquired; 2 of 3 down: failed in {}; no orphan",
            millis(took)
        ),
        history,
    })
}

async fn ensemble_leader_loss(h: &dyn FaultHarness) -> Result<Outcome, Failure> {
    let Topology::Ensemble { .. } = h.topology() else {
        return Err(skip("needs a replicated ensemble with a leader"));
    };
    let Some(leader) = h.leader().await else {
        return Err(Failure::Failed("the ensemble has no leader".into()));
    };
    let history = History::new();
    let a = h.fault_client().await?;
    let ra = recorder(&a, 0, &history);
    let key = unique_key("leader-loss");
    let set = FencedSet::new(format!("{key}#set"), history.clone());
    let guard = ra.acquire(&key, &renewed(h.ttl(), h.slack() * 5)).await?;
    check!(
        set.add(0, guard.fencing_token(), 1),
        "the holder's first write was refused"
    );
    let deadline = Instant::now() + Duration::from_secs(40);
    let w = h.fault_client().await?;
    let waiter = persistent_waiter(
        recorder(&w, 1, &history),
        key.clone(),
        set.clone(),
        h.ttl(),
        2,
        deadline,
    );
    h.control(leader, ServerAction::Kill)
        .await
        .map_err(Failure::Failed)?;
    let killed = Instant::now();
    let new_leader = loop {
        match h.leader().await {
            Some(l) if l != leader => break l,
            _ if killed.elapsed() > Duration::from_secs(30) => {
                return Err(Failure::Failed("no new leader within 30 s".into()))
            }
            _ => sleep(Duration::from_millis(100)).await,
        }
    };
    let elected = killed.elapsed();
    let kept = guard.state() == LeaseState::Held;
    if kept {
        set.add(0, guard.fencing_token(), 3);
        ra.release(guard).await?;
    } else {
        ra.lost(&guard);
        drop(guard);
    }
    let acquired = waiter
        .await
        .map_err(|e| Failure::Failed(format!("the waiter panicked: {e}")))?;
    h.control(leader, ServerAction::Restart)
        .await
        .map_err(Failure::Failed)?;
    check!(acquired, "the waiter did not acquire after the leader loss");
    set.final_read();
    Ok(Outcome {
        detail: format!(
            "node {new_leader} elected after {}, holder {} its lock, waiter acquired",
            millis(elected),
            if kept { "kept" } else { "lost" }
        ),
        history,
    })
}

async fn terminated_session_fires_lost(h: &dyn FaultHarness) -> Result<Outcome, Failure> {
    let history = History::new();
    let (a, b) = (h.fault_client().await?, h.fault_client().await?);
    let (ra, rb) = (recorder(&a, 0, &history), recorder(&b, 1, &history));
    let key = unique_key("terminated");
    let set = FencedSet::new(format!("{key}#set"), history.clone());
    let guard = ra.acquire(&key, &renewed(h.ttl(), h.slack())).await?;
    check!(
        set.add(0, guard.fencing_token(), 1),
        "the holder's first write was refused"
    );
    if let Err(why) = h.terminate_session(&a).await {
        return Err(skip(why));
    }
    let terminated = Instant::now();
    let fired = timeout(takeover(h), guard.lost()).await;
    check!(
        fired.is_ok(),
        "lost() did not fire within {} of the termination",
        millis(takeover(h))
    );
    let lost_after = terminated.elapsed();
    ra.lost(&guard);
    let taken = rb.acquire(&key, &waiting(h.ttl(), takeover(h))).await?;
    check!(
        set.add(1, taken.fencing_token(), 2),
        "the new holder's write was refused"
    );
    let stale = stale_write(&set, 0, &guard, fencing(&a))?;
    // The old lease's release touches nothing: the key is someone else's.
    let late = ra.release(guard).await?;
    check!(
        late != ReleaseOutcome::Released,
        "the terminated holder's release removed the new holder's lock"
    );
    rb.release(taken).await?;
    set.final_read();
    Ok(Outcome {
        detail: format!("lost() after {}, {stale}", millis(lost_after)),
        history,
    })
}

const CLIENTS: usize = 16;
const ROUNDS: usize = 100;
/// A release that takes longer than this counts as hung (a backend bounds it by its
/// request timeout, a few seconds).
const RELEASE_LIMIT: Duration = Duration::from_secs(30);

/// A small seeded generator (xorshift64*), so a run's faults can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The seed: `DISTLOCK_FAULT_SEED` if set, else random.
fn seed() -> u64 {
    std::env::var("DISTLOCK_FAULT_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(rand::random::<u64>)
        .max(1)
}

async fn contention_under_random_faults(h: &dyn FaultHarness) -> Result<Outcome, Failure> {
    let history = History::new();
    let key = unique_key("random-faults");
    let set = FencedSet::new(format!("{key}#set"), history.clone());
    let mut nets = Vec::new();
    let mut tasks = Vec::new();
    let granted = Arc::new(AtomicUsize::new(0));
    // When the last grant came (ms after `begun`): grants that stop long before the end
    // point to a lock left behind, not to slow clients.
    let last_grant_ms = Arc::new(AtomicU64::new(0));
    let begun = Instant::now();
    let ttl = h.ttl();
    let wait = h.slack() * 3;
    for n in 0..CLIENTS {
        let (client, net) = net_client(h).await?;
        nets.push(net);
        let (r, key, set, granted, last_grant_ms) = (
            recorder(&client, n, &history),
            key.clone(),
            set.clone(),
            granted.clone(),
            last_grant_ms.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                match r.acquire(&key, &waiting(ttl, wait)).await {
                    Ok(guard) => {
                        granted.fetch_add(1, Ordering::Relaxed);
                        let ms = u64::try_from(begun.elapsed().as_millis()).unwrap_or(u64::MAX);
                        last_grant_ms.fetch_max(ms, Ordering::Relaxed);
                        set.add(n, guard.fencing_token(), (n * ROUNDS + round) as u64);
                        // Its outcome may be an error under faults; never a hang.
                        if timeout(RELEASE_LIMIT, r.release(guard)).await.is_err() {
                            return Some(format!(
                                "client {n}'s release in round {round} did not return within {RELEASE_LIMIT:?}"
                            ));
                        }
                    }
                    // A fault or a timeout: the next round tries again, after a breath
                    // so a broken connection does not spin.
                    Err(_) => sleep(Duration::from_millis(20)).await,
                }
            }
            None
        }));
    }
    let seed = seed();
    let done = Arc::new(AtomicUsize::new(0));
    let faulter = {
        let (nets, done) = (nets.clone(), done.clone());
        tokio::spawn(async move {
            let mut rng = Rng(seed);
            let mut injected = 0usize;
            while done.load(Ordering::Relaxed) == 0 {
                let net = &nets[rng.below(nets.len() as u64) as usize];
                let kind = rng.below(4);
                match kind {
                    0 => net.latency(Duration::from_millis(5 + rng.below(30))),
                    1 => net.blackhole(),
                    2 => net.drop_replies(),
                    _ => net.reset(),
                }
                injected += 1;
                sleep(Duration::from_millis(50 + rng.below(250))).await;
                if kind == 1 || kind == 2 {
                    net.heal_with_reset();
                } else {
                    net.heal();
                }
                sleep(Duration::from_millis(20 + rng.below(100))).await;
            }
            injected
        })
    };
    let started = Instant::now();
    let all = async {
        let mut hung = Vec::new();
        for t in tasks {
            if let Ok(Some(why)) = t.await {
                hung.push(why);
            }
        }
        hung
    };
    let finished = timeout(Duration::from_secs(240), all).await;
    done.store(1, Ordering::Relaxed);
    let injected = faulter.await.unwrap_or(0);
    for net in &nets {
        net.heal();
    }
    let grants = granted.load(Ordering::Relaxed);
    let Ok(hung) = finished else {
        return Err(Failure::Failed(format!(
            "the clients did not finish within 240 s (seed {seed}): {grants}/{} rounds \
             granted, the last {} after the start",
            CLIENTS * ROUNDS,
            millis(Duration::from_millis(last_grant_ms.load(Ordering::Relaxed)))
        )));
    };
    check!(hung.is_empty(), "{} (seed {seed})", hung.join("; "));
    check!(
        grants > 0,
        "no client was ever granted the lock (seed {seed})"
    );
    set.final_read();
    Ok(Outcome {
        detail: format!(
            "seed {seed}: {grants}/{} rounds granted, {injected} faults injected, {}",
            CLIENTS * ROUNDS,
            millis(started.elapsed())
        ),
        history,
    })
}

/// The most any one fault scenario may take.
const LIMIT: Duration = Duration::from_secs(300);

/// Runs one fault scenario, isolated (a panic or a hang is a failure), then checks its
/// history. The fenced-register checker counts only on backends with fencing.
pub async fn run_fault_scenario(h: Arc<dyn FaultHarness>, scenario: &FaultScenario) -> FaultResult {
    let started = std::time::Instant::now();
    let claim = h.claim(scenario.fault);
    let fencing = match h.client().await {
        Ok(c) => c.lock.info().capabilities.fencing.is_supported(),
        Err(_) => false,
    };
    let run = scenario.run;
    let harness = h.clone();
    let mut task = tokio::spawn(async move { run(&*harness).await });
    let outcome = match timeout(LIMIT, &mut task).await {
        Err(_) => {
            task.abort();
            Err(Failure::Failed(format!("did not finish within {LIMIT:?}")))
        }
        Ok(Err(join)) => Err(Failure::Failed(format!("panicked: {join}"))),
        Ok(Ok(outcome)) => outcome,
    };
    let (verdict, operations, findings, grants) = match outcome {
        Err(Failure::Skipped(why)) => (FaultVerdict::Skip(why), 0, Findings::default(), Vec::new()),
        Err(Failure::Failed(why)) => (FaultVerdict::Fail(why), 0, Findings::default(), Vec::new()),
        Err(other) => (
            FaultVerdict::Fail(format!("{other:?}")),
            0,
            Findings::default(),
            Vec::new(),
        ),
        Ok(Outcome { detail, history }) => {
            let events = history.events();
            let mut findings = Findings::of(&events);
            if !fencing {
                findings.fenced_register.clear();
            }
            let verdict = match (&claim, findings.total()) {
                (_, 0) => FaultVerdict::Pass(detail),
                (Claim::Safe, n) => FaultVerdict::Fail(format!(
                    "{n} violation(s): {}; {detail}",
                    findings
                        .all()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; ")
                )),
                (Claim::NotClaimed(_), n) => FaultVerdict::Shown(format!(
                    "{n} violation(s) shown ({} refused by fencing): {}; {detail}",
                    findings.stale_writes_refused,
                    findings
                        .all()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; ")
                )),
            };
            (
                verdict,
                history.operations(),
                findings,
                super::checkers::grants(&events),
            )
        }
    };
    FaultResult {
        name: scenario.name,
        fault: scenario.fault,
        verdict,
        operations,
        violations: findings.total(),
        findings,
        claim,
        grants,
        elapsed_ms: started.elapsed().as_millis(),
    }
}

/// Runs every fault scenario against `h`, one after another.
pub async fn run_faults(h: Arc<dyn FaultHarness>) -> FaultReport {
    run_selected_faults(h, |_| true).await
}

/// Runs the fault scenarios `select` picks against `h`, one after another.
pub async fn run_selected_faults(
    h: Arc<dyn FaultHarness>,
    select: impl Fn(&FaultScenario) -> bool,
) -> FaultReport {
    let mut results = Vec::new();
    for scenario in FAULT_SCENARIOS.iter().filter(|s| select(s)) {
        results.push(run_fault_scenario(h.clone(), scenario).await);
    }
    FaultReport {
        backend: h.name(),
        results,
    }
}

/// Closes every connection of `net`'s client for good, as the kernel does for a killed
/// process.
fn kill(net: &NetFaults) {
    net.proxies().iter().for_each(|p| p.cut());
}

/// A FIFO waiter recorded by `r`, in the background: when granted, the grant's time and
/// guard.
fn fifo_waiter(
    r: Recorder,
    key: LockKey,
    options: LockOptions,
) -> tokio::task::JoinHandle<Result<(Instant, LockGuard), LockError>> {
    tokio::spawn(async move {
        let guard = r.acquire(&key, &options).await?;
        Ok((Instant::now(), guard))
    })
}

/// Waits for a [`fifo_waiter`] within `limit`.
async fn granted(
    waiter: tokio::task::JoinHandle<Result<(Instant, LockGuard), LockError>>,
    limit: Duration,
    who: &str,
) -> Result<(Instant, LockGuard), Failure> {
    match timeout(limit, waiter).await {
        Err(_) => Err(Failure::Failed(format!(
            "{who} was not granted within {}",
            millis(limit)
        ))),
        Ok(Err(e)) => Err(Failure::Failed(format!("{who} panicked: {e}"))),
        Ok(Ok(result)) => Ok(result?),
    }
}

async fn crashed_clients_do_not_stall_the_fifo_queue(
    h: &dyn FaultHarness,
) -> Result<Outcome, Failure> {
    let history = History::new();
    let observer = h.fault_client().await?;
    if let distlock_api::Capability::Unsupported(why) =
        observer.client.lock.info().capabilities.fifo
    {
        return Err(skip(format!("needs FIFO waiting: {why}")));
    }
    let observer = observer.client.lock;
    let wait = takeover(h) + h.dead_waiter_bound() + HANG;

    // A waiter dies in the queue; the one behind it must not wait for it for long.
    let key = unique_key("fifo-dead-waiter");
    let holder = h.fault_client().await?;
    let rh = recorder(&holder, 0, &history);
    let held = rh.acquire(&key, &fifo_with_ttl(LONG_TTL, wait)).await?;
    let arrival = Arrival::for_backend(h, &*observer, &key).await;
    let (doomed, doomed_net) = net_client(h).await?;
    let doomed_wait = fifo_waiter(
        recorder(&doomed, 1, &history),
        key.clone(),
        fifo_with_ttl(LONG_TTL, wait),
    );
    until_queued(&*observer, &key, 1, &arrival, h.slack() * 10).await?;
    let next = h.fault_client().await?;
    let next_wait = fifo_waiter(
        recorder(&next, 2, &history),
        key.clone(),
        fifo_with_ttl(LONG_TTL, wait),
    );
    until_queued(&*observer, &key, 2, &arrival, h.slack() * 10).await?;
    kill(&doomed_net);
    let killed_at = Instant::now();
    rh.release(held).await?;
    let bound = h.dead_waiter_bound() + 2 * h.slack();
    let (granted_at, guard) =
        granted(next_wait, bound + HANG, "the waiter behind a dead one").await?;
    let dead_waiter_cost = granted_at.saturating_duration_since(killed_at);
    doomed_wait.abort();
    check!(
        dead_waiter_cost <= bound,
        "the waiter behind a killed one was granted {} after the kill; the bound is {} (dead-waiter bound + 2 x slack)",
        millis(dead_waiter_cost),
        millis(bound)
    );
    recorder(&next, 2, &history).release(guard).await?;

    // A holder dies with two waiters queued: they follow it, in order, within the
    // crash bound.
    let key = unique_key("fifo-dead-holder");
    let (dying, dying_net) = net_client(h).await?;
    let rd = recorder(&dying, 3, &history);
    let held = rd.acquire(&key, &fifo_with_ttl(h.ttl(), wait)).await?;
    let arrival = Arrival::for_backend(h, &*observer, &key).await;
    let mut queued = Vec::new();
    for (n, who) in [(4, "the first waiter"), (5, "the second waiter")] {
        let client = h.fault_client().await?;
        queued.push((
            who,
            recorder(&client, n, &history),
            fifo_waiter(
                recorder(&client, n, &history),
                key.clone(),
                fifo_with_ttl(LONG_TTL, wait),
            ),
        ));
        until_queued(&*observer, &key, queued.len(), &arrival, h.slack() * 10).await?;
    }
    kill(&dying_net);
    let killed_at = Instant::now();
    rd.lost(&held);
    drop(held);
    let bound = takeover(h);
    let mut grants = Vec::new();
    for (who, r, waiter) in queued {
        let (granted_at, guard) = granted(waiter, bound + HANG, who).await?;
        grants.push((who, granted_at.saturating_duration_since(killed_at)));
        r.release(guard).await?;
    }
    let first = grants[0].1;
    check!(
        first <= bound,
        "the first waiter behind a killed holder was granted {} after the kill; the bound is {} (crash bound + 3 x slack)",
        millis(first),
        millis(bound)
    );
    check!(
        grants[0].1 <= grants[1].1,
        "the waiters behind a killed holder were granted out of order: {grants:?}"
    );
    Ok(Outcome {
        detail: format!(
            "a killed waiter held up the next for {}, a killed holder for {}; its two waiters followed in order",
            millis(dead_waiter_cost),
            millis(first)
        ),
        history,
    })
}

/// Runs the fault scenario called `name` as a test and prints its result. Used by
/// [`fault_conformance_tests!`](crate::fault_conformance_tests).
///
/// # Panics
/// When no scenario has that name, when it fails, or, with `must_pass`, when it
/// only shows violations or skips for a reason other than [`PROVIDER_LACKS`].
pub async fn run_fault_scenario_test(name: &str, harness: Arc<dyn FaultHarness>, must_pass: bool) {
    let Some(scenario) = FAULT_SCENARIOS.iter().find(|s| s.name == name) else {
        panic!("no fault scenario is called {name}");
    };
    let report = FaultReport {
        backend: harness.name(),
        results: vec![run_fault_scenario(harness, scenario).await],
    };
    print!("{}", report.to_table());
    match &report.results[0].verdict {
        FaultVerdict::Pass(_) => {}
        FaultVerdict::Fail(why) => panic!("{name} on {} failed: {why}", report.backend),
        FaultVerdict::Skip(why) if must_pass && !why.starts_with(PROVIDER_LACKS) => {
            panic!("{name} on {} must pass, but skipped: {why}", report.backend)
        }
        other @ FaultVerdict::Shown(_) if must_pass => {
            panic!("{name} on {} must pass, but: {other:?}", report.backend)
        }
        FaultVerdict::Skip(why) => println!("{name} on {}: SKIPPED: {why}", report.backend),
        FaultVerdict::Shown(why) => println!(
            "{name} on {}: violations shown, not claimed: {why}",
            report.backend
        ),
    }
}

/// A guard held by each test [`fault_conformance_tests!`](crate::fault_conformance_tests)
/// generates, so the fault scenarios of one test binary run one at a time.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    ONE_AT_A_TIME.lock().await
}

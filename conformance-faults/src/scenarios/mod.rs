//! The fault scenarios, by kind of fault, and the vocabulary they share.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock_api::{
    AutoRenew, LeaseState, LockError, LockGuard, LockKey, LockOptions, ReleaseOutcome,
};
use tokio::time::{sleep, timeout, Instant};

use crate::harness::{Fault, FaultClient, FaultHarness, NetFaults, ServerAction, Topology};
use crate::history::{Event, History, Op, Phase};
use crate::record::{pause_holder, FencedSet, Recorder};
use distlock_conformance::check;
use distlock_conformance::support::{
    fifo_with_ttl, unique_key, until_queued, waiting, Arrival, LONG_TTL,
};
use distlock_conformance::Failure;

mod contention;
mod election;
mod holder;
mod network;
mod primitives;
mod queue;
mod servers;

use contention::contention_under_random_faults;
use election::{
    election_through_ensemble_leader_loss, election_through_master_failover,
    lost_reply_after_applied_campaign, partitioned_leader_is_fenced_off,
    paused_leader_wakes_to_a_refused_write, server_paused_during_campaign,
    server_restart_while_leading_and_campaigning, terminated_leader_session_fires_lost,
};
use holder::paused_holder_wakes_to_a_refused_write;
use network::{lost_reply_after_applied_acquire, partitioned_holder_is_fenced_off};
use primitives::{
    paused_permit_holders_free_their_permits, paused_writer_frees_the_key_for_readers,
};
use queue::crashed_clients_do_not_stall_the_fifo_queue;
use servers::{
    ensemble_leader_loss, master_failover_while_held_and_waited,
    redlock_minority_then_majority_loss, server_paused_during_acquire,
    server_restart_while_held_and_waited, terminated_session_fires_lost,
};

/// What a scenario body hands back: a detail line and the history it recorded.
pub(crate) struct Outcome {
    pub(crate) detail: String,
    pub(crate) history: History,
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
    pub(crate) run: for<'a> fn(&'a dyn FaultHarness) -> FaultFuture<'a>,
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
    fault_scenario!(paused_permit_holders_free_their_permits, HolderPause,
        "semaphore of 2: both permit holders stall past their TTL; two other clients each take a permit, and never more than 2 grants overlap"),
    fault_scenario!(paused_writer_frees_the_key_for_readers, HolderPause,
        "read-write lock: a writer stalls past its TTL; two readers are granted together after it, and no read overlaps the write"),
    fault_scenario!(paused_leader_wakes_to_a_refused_write, HolderPause,
        "election: a leader stalls past its lease; a standby leads (leader() reads it) and writes under its higher term, and the stale leader's write under its old term is refused"),
    fault_scenario!(partitioned_leader_is_fenced_off, Partition,
        "election: a leader partitioned past its lease learns lost() by its validity deadline (it does not go on believing it leads); a standby leads under a higher term (leader() reads it), and the cut-off leader's write under its old term is refused"),
    fault_scenario!(server_paused_during_acquire, ServerPause,
        "with every server paused (SIGSTOP) an acquire returns an error within its wait (plus slack), not after a request timeout; after resume a grant that arrived late is released and the key is free"),
    fault_scenario!(server_paused_during_campaign, ServerPause,
        "election: with every server paused a campaign returns an error within its wait (plus slack); after resume a claim that arrived late does not keep the name led: another candidate leads, then the first"),
    fault_scenario!(lost_reply_after_applied_acquire, LostReply,
        "the reply to an acquire the server applied is lost: no deadlock (another client acquires within the lease bound) and no double holder"),
    fault_scenario!(lost_reply_after_applied_campaign, LostReply,
        "election: the reply to a campaign the server applied is lost: the campaign fails, another candidate leads within the lease bound (no stuck name), and the first can lead again"),
    fault_scenario!(server_restart_while_held_and_waited, ServerRestart,
        "every server is killed (-9) and restarted while a lock is held and waited on; the outcome is recorded and checked"),
    fault_scenario!(server_restart_while_leading_and_campaigning, ServerRestart,
        "election: every server is killed (-9) and restarted while a leader leads and two standbys campaign; one leader at a time on the recorded terms, terms rise, and a standby leads within the crash bound once the name is free"),
    fault_scenario!(redlock_minority_then_majority_loss, NodeLoss,
        "Redlock keeps working with a minority of nodes down and fails fast with a majority down, leaving no orphan key that would block a majority"),
    fault_scenario!(ensemble_leader_loss, LeaderLoss,
        "a 3-node ZooKeeper ensemble loses its leader while a lock is held and waited on: a new leader is elected and exclusion holds"),
    fault_scenario!(election_through_ensemble_leader_loss, LeaderLoss,
        "election: the ensemble's leader (ZooKeeper, etcd) is killed while a leader leads and a standby campaigns: one leader at a time on the recorded terms, and the standby leads once the leader resigns or loses its term"),
    fault_scenario!(master_failover_while_held_and_waited, MasterFailover,
        "the master serving a key (Redis Sentinel, Redis Cluster) is killed while the lock is held and waited on: a replica takes over, the client follows it, and the outcome (kept or lost) is recorded and checked"),
    fault_scenario!(election_through_master_failover, MasterFailover,
        "election: the master serving a name (Redis Sentinel, Redis Cluster) is killed while a leader leads and a standby campaigns: a replica takes over, the outcome (term kept or lost) is recorded and checked, and the standby leads"),
    fault_scenario!(terminated_session_fires_lost, SessionTerminated,
        "a holder's server session is terminated: lost() fires, another client acquires, and the stale holder's write is refused"),
    fault_scenario!(terminated_leader_session_fires_lost, SessionTerminated,
        "election: the leader's server session is terminated: lost() fires, a standby leads, the stale term's write is refused, and the old term's resign leaves the new leader be"),
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

/// Skips, with the backend's reason, unless `client`'s backend offers `primitive`.
fn check_offered(client: &FaultClient, primitive: distlock_api::Primitive) -> Result<(), Failure> {
    match client.client.info().capabilities.of(primitive).offered {
        distlock_api::Capability::Unsupported(why) => Err(skip(format!(
            "needs a {} (the backend offers none: {why})",
            primitive.as_str()
        ))),
        _ => Ok(()),
    }
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
    Recorder::new(n, client.client.lock(), history.clone())
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
        return Err(skip(crate::harness::NOT_CONTROLLED));
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
        .info()
        .capabilities
        .mutex
        .fencing
        .is_supported()
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

/// Closes every connection of `net`'s client for good, as the kernel does for a killed
/// process.
fn kill(net: &NetFaults) {
    net.proxies().iter().for_each(|p| p.cut());
}

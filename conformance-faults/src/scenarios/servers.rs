//! Faults of the servers themselves: paused, restarted, nodes or the leader lost, a
//! client's session terminated on the server side.

use super::*;

pub(super) async fn server_paused_during_acquire(h: &dyn FaultHarness) -> Result<Outcome, Failure> {
    if h.topology().nodes() == 0 {
        return Err(skip(crate::harness::NOT_CONTROLLED));
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

pub(super) async fn server_restart_while_held_and_waited(
    h: &dyn FaultHarness,
) -> Result<Outcome, Failure> {
    if h.topology().nodes() == 0 {
        return Err(skip(crate::harness::NOT_CONTROLLED));
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

pub(super) async fn redlock_minority_then_majority_loss(
    h: &dyn FaultHarness,
) -> Result<Outcome, Failure> {
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
    // A long TTL, so an orphan left by this attempt would outlive the check below; a
    // short error patience, so that the failing attempts stop well within the wait.
    let failing_fast =
        waiting(h.ttl() * 20, Duration::from_secs(30)).with_error_patience(Duration::from_secs(2));
    let result = ra.acquire(&key, &failing_fast).await;
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

pub(super) async fn ensemble_leader_loss(h: &dyn FaultHarness) -> Result<Outcome, Failure> {
    let Topology::Ensemble { .. } = h.topology() else {
        return Err(skip("needs a replicated ensemble with a leader"));
    };
    let loss =
        kill_serving_node(h, Serving::Leader, "leader-loss", Duration::from_secs(40)).await?;
    Ok(Outcome {
        detail: format!(
            "node {} elected after {}, holder {} its lock, waiter acquired",
            loss.successor,
            millis(loss.replaced_after),
            loss.holder_verb()
        ),
        history: loss.history,
    })
}

pub(super) async fn master_failover_while_held_and_waited(
    h: &dyn FaultHarness,
) -> Result<Outcome, Failure> {
    let Topology::Replicated { .. } = h.topology() else {
        return Err(skip(
            "needs masters with replicas and failover (Redis Sentinel or Cluster)",
        ));
    };
    let loss =
        kill_serving_node(h, Serving::MasterOfKey, "failover", Duration::from_secs(60)).await?;
    Ok(Outcome {
        detail: format!(
            "node {} took over after {}, holder {} its lock, waiter acquired and released by {} after the kill",
            loss.successor,
            millis(loss.replaced_after),
            loss.holder_verb(),
            millis(loss.followed_after)
        ),
        history: loss.history,
    })
}

/// Which node serves a key, for [`kill_serving_node`].
#[derive(Clone, Copy)]
pub(super) enum Serving {
    /// The ensemble's leader (ZooKeeper).
    Leader,
    /// The master of the key's data (Redis Sentinel, Redis Cluster).
    MasterOfKey,
}

impl Serving {
    pub(super) async fn node(self, h: &dyn FaultHarness, key: &LockKey) -> Option<usize> {
        match self {
            Serving::Leader => h.leader().await,
            Serving::MasterOfKey => h.master_of(key).await,
        }
    }

    fn waiter_failed(self) -> &'static str {
        match self {
            Serving::Leader => "the waiter did not acquire after the leader loss",
            Serving::MasterOfKey => "the waiter did not acquire after the failover",
        }
    }

    fn not_replaced(self) -> &'static str {
        match self {
            Serving::Leader => "no new leader within 30 s",
            Serving::MasterOfKey => "no replica took over within 30 s",
        }
    }
}

/// What [`kill_serving_node`] saw.
struct NodeLoss {
    successor: usize,
    replaced_after: Duration,
    /// Whether the holder still held its lock once the successor served.
    kept: bool,
    /// From the kill until the waiter had acquired and released on the successor.
    followed_after: Duration,
    history: History,
}

impl NodeLoss {
    fn holder_verb(&self) -> &'static str {
        if self.kept {
            "kept"
        } else {
            "lost"
        }
    }
}

/// Holds a fresh key while a persistent waiter waits for it, kills the node serving the
/// key, waits (at most 30 s) for another node to serve, lets the holder keep or lose its
/// lock as the backend decides, and checks the waiter acquires within `waiter_budget`;
/// the killed node is restarted before returning.
async fn kill_serving_node(
    h: &dyn FaultHarness,
    serving: Serving,
    key_prefix: &str,
    waiter_budget: Duration,
) -> Result<NodeLoss, Failure> {
    let history = History::new();
    let a = h.fault_client().await?;
    let ra = recorder(&a, 0, &history);
    let key = unique_key(key_prefix);
    let Some(node) = serving.node(h, &key).await else {
        return Err(Failure::Failed("no node serves the key".into()));
    };
    let set = FencedSet::new(format!("{key}#set"), history.clone());
    let guard = ra.acquire(&key, &renewed(h.ttl(), h.slack() * 5)).await?;
    check!(
        set.add(0, guard.fencing_token(), 1),
        "the holder's first write was refused"
    );
    let deadline = Instant::now() + waiter_budget;
    let w = h.fault_client().await?;
    let waiter = persistent_waiter(
        recorder(&w, 1, &history),
        key.clone(),
        set.clone(),
        h.ttl(),
        2,
        deadline,
    );
    h.control(node, ServerAction::Kill)
        .await
        .map_err(Failure::Failed)?;
    let killed = Instant::now();
    let successor = successor_of(h, serving, &key, node, killed).await?;
    let replaced_after = killed.elapsed();
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
    // The waiter, retrying through the lost node, acquired (and released) on the new one.
    let followed_after = killed.elapsed();
    h.control(node, ServerAction::Restart)
        .await
        .map_err(Failure::Failed)?;
    check!(acquired, "{}", serving.waiter_failed());
    set.final_read();
    Ok(NodeLoss {
        successor,
        replaced_after,
        kept,
        followed_after,
        history,
    })
}

/// The node that serves `key` in place of the killed `node`, polled for at most 30 s
/// from `killed`.
pub(super) async fn successor_of(
    h: &dyn FaultHarness,
    serving: Serving,
    key: &LockKey,
    node: usize,
    killed: Instant,
) -> Result<usize, Failure> {
    loop {
        match serving.node(h, key).await {
            Some(n) if n != node => return Ok(n),
            _ if killed.elapsed() > Duration::from_secs(30) => {
                return Err(Failure::Failed(serving.not_replaced().into()))
            }
            _ => sleep(Duration::from_millis(100)).await,
        }
    }
}

pub(super) async fn terminated_session_fires_lost(
    h: &dyn FaultHarness,
) -> Result<Outcome, Failure> {
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

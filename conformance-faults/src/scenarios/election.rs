//! Elections under the faults the mutex is run under: a leader paused or partitioned
//! past its lease, a lost campaign reply, the servers paused or restarted, the leader's
//! session terminated. A leadership is logged as a mutex grant of its name with its
//! term as the token, so the exclusion checker allows one leader at a time and the
//! fenced-register checker wants terms to rise.

use distlock_api::{Candidate, FencingToken, LeaderElection, Leadership};

use super::servers::{successor_of, Serving};
use super::*;

fn election_of(client: &FaultClient) -> Result<Arc<dyn LeaderElection>, Failure> {
    check_offered(client, distlock_api::Primitive::Election)?;
    Ok(client.client.election())
}

fn candidate(label: &str) -> Result<Candidate, Failure> {
    Candidate::new(label).map_err(|e| Failure::Failed(format!("candidate {label:?}: {e}")))
}

pub(super) async fn paused_leader_wakes_to_a_refused_write(
    h: &dyn FaultHarness,
) -> Result<Outcome, Failure> {
    let history = History::new();
    let a = h.fault_client().await?;
    let caps = a.client.info().capabilities;
    if a.net.is_none() && !caps.election.ttl_expiry.is_supported() {
        return Err(skip(
            "needs TTL expiry or a network hook to stop the leader's session renewing",
        ));
    }
    let b = h.fault_client().await?;
    let (ea, eb) = (election_of(&a)?, election_of(&b)?);
    let (ra, rb) = (recorder(&a, 0, &history), recorder(&b, 1, &history));
    let name = unique_key("leader-pause");
    let set = FencedSet::new(format!("{name}#set"), history.clone());
    // No auto-renew: the paused process renews nothing.
    let leader = ra
        .campaign(&*ea, &name, &candidate("a")?, &waiting(h.ttl(), h.slack()))
        .await?;
    check!(
        set.add(0, Some(leader.term()), 1),
        "the leader's first write was refused"
    );
    let paused = Instant::now();
    // The stall lasts until the standby leads and has written: the event it spans.
    let standby = {
        let (rb, name, set, eb) = (rb.clone(), name.clone(), set.clone(), eb.clone());
        let (ttl, wait) = (h.ttl(), takeover(h));
        let me = candidate("b")?;
        async move {
            let won = rb.campaign(&*eb, &name, &me, &waiting(ttl, wait)).await?;
            let wrote = set.add(1, Some(won.term()), 2);
            let read = eb.leader(&name).await?;
            rb.resign(won).await?;
            Ok::<_, LockError>((wrote, read))
        }
    };
    let (wrote, read) = pause_holder(a.net.as_ref(), standby).await?;
    check!(wrote, "the new leader's write was refused");
    check!(
        read.as_ref()
            .is_some_and(|l| l.candidate.as_bytes() == b"b"),
        "while the standby led, leader() read {read:?}"
    );
    let stalled = paused.elapsed();
    check!(
        leader.valid_until() <= Instant::now(),
        "the standby led while the stalled leader's claimed validity had not run out"
    );
    ra.lost(leader.guard());
    let accepted = set.add(0, Some(leader.term()), 99);
    check!(
        !accepted,
        "the stale leader's write with term {} was accepted",
        leader.term()
    );
    drop(leader);
    set.final_read();
    Ok(Outcome {
        detail: format!("stalled {}, stale leader's write refused", millis(stalled)),
        history,
    })
}

/// The leader's term as the fenced store's token.
fn term_of(leadership: &Leadership) -> Option<FencingToken> {
    Some(leadership.term())
}

pub(super) async fn partitioned_leader_is_fenced_off(
    h: &dyn FaultHarness,
) -> Result<Outcome, Failure> {
    let history = History::new();
    let (a, net) = net_client(h).await?;
    let b = h.fault_client().await?;
    let (ea, eb) = (election_of(&a)?, election_of(&b)?);
    let (ra, rb) = (recorder(&a, 0, &history), recorder(&b, 1, &history));
    let name = unique_key("leader-partition");
    let set = FencedSet::new(format!("{name}#set"), history.clone());
    let leader = ra
        .campaign(&*ea, &name, &candidate("a")?, &renewed(h.ttl(), h.slack()))
        .await?;
    check!(
        set.add(0, term_of(&leader), 1),
        "the leader's first write was refused"
    );
    net.blackhole();
    let cut = Instant::now();
    let deadline = leader.valid_until();
    let fired = timeout(
        deadline.saturating_duration_since(cut) + h.slack(),
        leader.lost(),
    )
    .await;
    let lost_after = cut.elapsed();
    check!(
        fired.is_ok(),
        "the cut-off leader still believed it led {} past its validity deadline",
        millis(h.slack())
    );
    ra.lost(leader.guard());
    let won = rb
        .campaign(
            &*eb,
            &name,
            &candidate("b")?,
            &waiting(h.ttl(), takeover(h)),
        )
        .await?;
    let led_after = cut.elapsed();
    check!(
        won.term() > leader.term(),
        "the new leader's term {} is not above the cut-off leader's {}",
        won.term(),
        leader.term()
    );
    check!(
        set.add(1, term_of(&won), 2),
        "the new leader's write was refused"
    );
    let read = eb.leader(&name).await?;
    check!(
        read.as_ref()
            .is_some_and(|l| l.candidate.as_bytes() == b"b" && l.term == won.term()),
        "while the standby led, leader() read {read:?}"
    );
    check!(
        !set.add(0, term_of(&leader), 99),
        "the cut-off leader's write with term {} was accepted",
        leader.term()
    );
    net.heal_with_reset();
    rb.resign(won).await?;
    drop(leader);
    set.final_read();
    Ok(Outcome {
        detail: format!(
            "lost() after {}, standby led after {}, stale term refused",
            millis(lost_after),
            millis(led_after)
        ),
        history,
    })
}

pub(super) async fn lost_reply_after_applied_campaign(
    h: &dyn FaultHarness,
) -> Result<Outcome, Failure> {
    let history = History::new();
    let (a, net) = net_client(h).await?;
    let b = h.fault_client().await?;
    let (ea, eb) = (election_of(&a)?, election_of(&b)?);
    let (ra, rb) = (recorder(&a, 0, &history), recorder(&b, 1, &history));
    let name = unique_key("leader-lost-reply");
    net.drop_replies();
    let started = Instant::now();
    let attempt = timeout(
        h.slack() + HANG,
        ra.campaign(&*ea, &name, &candidate("a")?, &waiting(h.ttl(), h.slack())),
    )
    .await;
    let took = started.elapsed();
    // A TCP stream cannot lose bytes and go on: the connection breaks.
    net.heal_with_reset();
    match attempt {
        Err(_) => {
            return Err(Failure::Failed(format!(
                "a campaign without replies hung for {}",
                millis(took)
            )))
        }
        Ok(Ok(leadership)) => {
            let _ = ra.resign(leadership).await;
            return Err(Failure::Failed(
                "a campaign won although every reply was lost".into(),
            ));
        }
        Ok(Err(_)) => {}
    }
    let started = Instant::now();
    let won = rb
        .campaign(
            &*eb,
            &name,
            &candidate("b")?,
            &waiting(h.ttl(), h.ttl() + takeover(h)),
        )
        .await?;
    let led_after = started.elapsed();
    rb.resign(won).await?;
    let again = ra
        .campaign(
            &*ea,
            &name,
            &candidate("a")?,
            &waiting(h.ttl(), takeover(h)),
        )
        .await?;
    ra.resign(again).await?;
    Ok(Outcome {
        detail: format!(
            "campaign gave up after {}, another candidate led after {}",
            millis(took),
            millis(led_after)
        ),
        history,
    })
}

pub(super) async fn server_paused_during_campaign(
    h: &dyn FaultHarness,
) -> Result<Outcome, Failure> {
    if h.topology().nodes() == 0 {
        return Err(skip(crate::harness::NOT_CONTROLLED));
    }
    let history = History::new();
    let (b, c) = (h.fault_client().await?, h.fault_client().await?);
    let (eb, ec) = (election_of(&b)?, election_of(&c)?);
    let (rb, rc) = (recorder(&b, 0, &history), recorder(&c, 1, &history));
    let name = unique_key("leader-server-pause");
    let wait = h.slack();
    all_nodes(h, ServerAction::Pause).await?;
    let started = Instant::now();
    let attempt = timeout(
        wait + HANG,
        rb.campaign(&*eb, &name, &candidate("b")?, &waiting(h.ttl(), wait)),
    )
    .await;
    let took = started.elapsed();
    all_nodes(h, ServerAction::Resume).await?;
    let error = match attempt {
        Err(_) => {
            return Err(Failure::Failed(format!(
                "a campaign against a paused server hung for {}",
                millis(took)
            )))
        }
        Ok(Ok(leadership)) => {
            let _ = rb.resign(leadership).await;
            return Err(Failure::Failed(
                "a campaign won against a paused server".into(),
            ));
        }
        Ok(Err(e)) => e,
    };
    // A claim the paused server applies on resume must not keep the name led for good.
    let started = Instant::now();
    let won = rc
        .campaign(
            &*ec,
            &name,
            &candidate("c")?,
            &waiting(h.ttl(), h.ttl() + takeover(h)),
        )
        .await?;
    let led_after = started.elapsed();
    rc.resign(won).await?;
    // And the candidate whose campaign failed can lead again.
    let again = rb
        .campaign(
            &*eb,
            &name,
            &candidate("b")?,
            &waiting(h.ttl(), takeover(h)),
        )
        .await?;
    rb.resign(again).await?;
    let detail = format!(
        "campaign failed after {}, kind {} ({}), another candidate led {} after resume",
        millis(took),
        error_kind(&error),
        short(&error),
        millis(led_after)
    );
    if took > wait + h.slack() {
        return Err(Failure::Failed(format!(
            "the wait of {} did not bound the campaign: {detail}",
            millis(wait)
        )));
    }
    Ok(Outcome { detail, history })
}

/// A standby that campaigns (through connection errors) until `deadline`, then writes
/// `value` under its term and resigns. Returns when it led, if it did.
fn persistent_candidate(
    r: Recorder,
    election: Arc<dyn LeaderElection>,
    name: LockKey,
    set: FencedSet,
    ttl: Duration,
    value: u64,
    deadline: Instant,
) -> tokio::task::JoinHandle<Option<Instant>> {
    tokio::spawn(async move {
        let me = Candidate::new(format!("standby-{value}")).ok()?;
        while Instant::now() < deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            match r
                .campaign(&*election, &name, &me, &waiting(ttl, left))
                .await
            {
                Ok(won) => {
                    let at = Instant::now();
                    set.add(r.client, term_of(&won), value);
                    let _ = r.resign(won).await;
                    return Some(at);
                }
                Err(LockError::Timeout { .. }) => return None,
                // The server is down or restarting: try again shortly.
                Err(_) => sleep(Duration::from_millis(100)).await,
            }
        }
        None
    })
}

pub(super) async fn server_restart_while_leading_and_campaigning(
    h: &dyn FaultHarness,
) -> Result<Outcome, Failure> {
    if h.topology().nodes() == 0 {
        return Err(skip(crate::harness::NOT_CONTROLLED));
    }
    let history = History::new();
    let a = h.fault_client().await?;
    let ea = election_of(&a)?;
    let ra = recorder(&a, 0, &history);
    let name = unique_key("leader-restart");
    let set = FencedSet::new(format!("{name}#set"), history.clone());
    let me = candidate("a")?;
    // A few terms first, so the leader's is above a counter that starts afresh.
    for _ in 0..3 {
        let l = ra
            .campaign(&*ea, &name, &me, &waiting(h.ttl(), h.slack()))
            .await?;
        ra.resign(l).await?;
    }
    let leader = ra
        .campaign(&*ea, &name, &me, &renewed(h.ttl(), h.slack()))
        .await?;
    check!(
        set.add(0, term_of(&leader), 1),
        "the leader's first write was refused"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut standbys = Vec::new();
    for n in 1..=2 {
        let s = h.fault_client().await?;
        standbys.push(persistent_candidate(
            recorder(&s, n, &history),
            election_of(&s)?,
            name.clone(),
            set.clone(),
            h.ttl(),
            10 + n as u64,
            deadline,
        ));
    }
    let lost = {
        let (ra, lost) = (ra.clone(), leader.lost());
        let monitor = leader.monitor();
        let (name, owner) = (name.clone(), leader.lease().owner());
        tokio::spawn(async move {
            lost.await;
            ra.history.record(
                Event::new(ra.client, name.as_str(), Op::Lost, Phase::Ok)
                    .owner(owner)
                    .valid_until_us(ra.history.micros(monitor.valid_until())),
            );
        })
    };
    all_nodes(h, ServerAction::Kill).await?;
    all_nodes(h, ServerAction::Restart).await?;
    let healed = Instant::now();
    // The leader may be reconnecting (suspect) for a while: wait until it knows
    // whether it still leads.
    let settle = healed + takeover(h);
    while leader.state() == LeaseState::Suspect && Instant::now() < settle {
        sleep(Duration::from_millis(20)).await;
    }
    // A leader that still leads works on for a TTL (renewing), then writes and resigns.
    let held_through = leader.state() == LeaseState::Held;
    if held_through {
        let _ = timeout(h.ttl(), leader.lost()).await;
    }
    let still = leader.state() == LeaseState::Held;
    let (leader, freed) = if still {
        set.add(0, term_of(&leader), 2);
        let _ = ra.resign(leader).await;
        (None, Instant::now())
    } else {
        (Some(leader), healed)
    };
    let mut first: Option<Instant> = None;
    let mut led = 0;
    for s in standbys {
        let won = s
            .await
            .map_err(|e| Failure::Failed(format!("a standby panicked: {e}")))?;
        if let Some(at) = won {
            led += 1;
            first = Some(first.map_or(at, |f| f.min(at)));
        }
    }
    lost.abort();
    // A leader that lost its lease tries a late write under its term after the others.
    if let Some(leader) = &leader {
        set.add(0, term_of(leader), 99);
    }
    drop(leader);
    let Some(first) = first else {
        return Err(Failure::Failed(
            "no standby led within 30 s of the restart".into(),
        ));
    };
    // After the leader stepped down (or the restart ended its term), a standby leads
    // within the crash bound plus one hand-off.
    let led_after = first.saturating_duration_since(freed);
    check!(
        led_after <= takeover(h),
        "the first standby led {} after the name was free, past the bound of {}",
        millis(led_after),
        millis(takeover(h))
    );
    set.final_read();
    Ok(Outcome {
        detail: format!(
            "leader {} the restart, {led}/2 standbys led, the first {} after the name was free",
            match (held_through, still) {
                (true, true) => "kept its term through",
                (true, false) => "led on after, then lost its term in",
                _ => "lost its term in",
            },
            millis(led_after)
        ),
        history,
    })
}

pub(super) async fn terminated_leader_session_fires_lost(
    h: &dyn FaultHarness,
) -> Result<Outcome, Failure> {
    let history = History::new();
    let (a, b) = (h.fault_client().await?, h.fault_client().await?);
    let (ea, eb) = (election_of(&a)?, election_of(&b)?);
    let (ra, rb) = (recorder(&a, 0, &history), recorder(&b, 1, &history));
    let name = unique_key("leader-terminated");
    let set = FencedSet::new(format!("{name}#set"), history.clone());
    let leader = ra
        .campaign(&*ea, &name, &candidate("a")?, &renewed(h.ttl(), h.slack()))
        .await?;
    check!(
        set.add(0, term_of(&leader), 1),
        "the leader's first write was refused"
    );
    if let Err(why) = h.terminate_session(&a).await {
        return Err(skip(why));
    }
    let terminated = Instant::now();
    let fired = timeout(takeover(h), leader.lost()).await;
    check!(
        fired.is_ok(),
        "lost() did not fire within {} of the termination",
        millis(takeover(h))
    );
    let lost_after = terminated.elapsed();
    ra.lost(leader.guard());
    let won = rb
        .campaign(
            &*eb,
            &name,
            &candidate("b")?,
            &waiting(h.ttl(), takeover(h)),
        )
        .await?;
    check!(
        set.add(1, term_of(&won), 2),
        "the new leader's write was refused"
    );
    check!(
        !set.add(0, term_of(&leader), 99),
        "the terminated leader's write with term {} was accepted",
        leader.term()
    );
    // The old term's resign touches nothing: the name is someone else's.
    let late = ra.resign(leader).await?;
    check!(
        late != ReleaseOutcome::Released,
        "the terminated leader's resign ended the new leader's term"
    );
    let read = eb.leader(&name).await?;
    check!(
        read.as_ref().is_some_and(|l| l.term == won.term()),
        "after the old leader's resign, leader() read {read:?}"
    );
    rb.resign(won).await?;
    set.final_read();
    Ok(Outcome {
        detail: format!("lost() after {}, stale term refused", millis(lost_after)),
        history,
    })
}

pub(super) async fn election_through_ensemble_leader_loss(
    h: &dyn FaultHarness,
) -> Result<Outcome, Failure> {
    let Topology::Ensemble { .. } = h.topology() else {
        return Err(skip("needs a replicated ensemble with a leader"));
    };
    kill_serving_node_while_leading(h, Serving::Leader, "leader-ensemble-loss").await
}

pub(super) async fn election_through_master_failover(
    h: &dyn FaultHarness,
) -> Result<Outcome, Failure> {
    let Topology::Replicated { .. } = h.topology() else {
        return Err(skip(
            "needs masters with replicas and failover (Redis Sentinel or Cluster)",
        ));
    };
    kill_serving_node_while_leading(h, Serving::MasterOfKey, "leader-failover").await
}

/// A leader leads a fresh name while a standby campaigns; the node serving the name
/// is killed; the leader keeps or loses its term as the backend decides, and the
/// standby must lead within 40 s of the kill. The killed node is restarted.
async fn kill_serving_node_while_leading(
    h: &dyn FaultHarness,
    serving: Serving,
    prefix: &str,
) -> Result<Outcome, Failure> {
    let history = History::new();
    let a = h.fault_client().await?;
    let ea = election_of(&a)?;
    let ra = recorder(&a, 0, &history);
    let name = unique_key(prefix);
    let Some(node) = serving.node(h, &name).await else {
        return Err(Failure::Failed("no node serves the name".into()));
    };
    let set = FencedSet::new(format!("{name}#set"), history.clone());
    let leader = ra
        .campaign(
            &*ea,
            &name,
            &candidate("a")?,
            &renewed(h.ttl(), h.slack() * 5),
        )
        .await?;
    check!(
        set.add(0, term_of(&leader), 1),
        "the leader's first write was refused"
    );
    let s = h.fault_client().await?;
    let standby = persistent_candidate(
        recorder(&s, 1, &history),
        election_of(&s)?,
        name.clone(),
        set.clone(),
        h.ttl(),
        2,
        Instant::now() + Duration::from_secs(40),
    );
    h.control(node, ServerAction::Kill)
        .await
        .map_err(Failure::Failed)?;
    let killed = Instant::now();
    let successor = successor_of(h, serving, &name, node, killed).await?;
    let replaced_after = killed.elapsed();
    let kept = leader.state() == LeaseState::Held;
    if kept {
        set.add(0, term_of(&leader), 3);
        ra.resign(leader).await?;
    } else {
        ra.lost(leader.guard());
        drop(leader);
    }
    let led = standby
        .await
        .map_err(|e| Failure::Failed(format!("the standby panicked: {e}")))?;
    let led_after = killed.elapsed();
    h.control(node, ServerAction::Restart)
        .await
        .map_err(Failure::Failed)?;
    check!(
        led.is_some(),
        "the standby did not lead within 40 s of the kill"
    );
    set.final_read();
    Ok(Outcome {
        detail: format!(
            "node {successor} served after {}, leader {} its term, standby led and resigned by {} after the kill",
            millis(replaced_after),
            if kept { "kept" } else { "lost" },
            millis(led_after)
        ),
        history,
    })
}

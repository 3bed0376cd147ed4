//! A leader that stalls past its lease (a process pause) and then writes under its
//! term: a standby leads meanwhile, and the stale leader's write is refused.

use distlock_api::{Candidate, LeaderElection};

use super::*;

fn election_of(client: &FaultClient) -> Result<Arc<dyn LeaderElection>, Failure> {
    client
        .client
        .election
        .clone()
        .ok_or_else(|| skip("needs an election (the backend offers none)"))
}

fn candidate(label: &str) -> Result<Candidate, Failure> {
    Candidate::new(label).map_err(|e| Failure::Failed(format!("candidate {label:?}: {e}")))
}

pub(super) async fn paused_leader_wakes_to_a_refused_write(
    h: &dyn FaultHarness,
) -> Result<Outcome, Failure> {
    let history = History::new();
    let a = h.fault_client().await?;
    let caps = a.client.lock.info().capabilities;
    if a.net.is_none() && !caps.ttl_expiry.is_supported() {
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

//! Faults on the path between one client and the servers: a partitioned holder and a
//! lost reply.

use super::*;

pub(super) async fn partitioned_holder_is_fenced_off(
    h: &dyn FaultHarness,
) -> Result<Outcome, Failure> {
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

pub(super) async fn lost_reply_after_applied_acquire(
    h: &dyn FaultHarness,
) -> Result<Outcome, Failure> {
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

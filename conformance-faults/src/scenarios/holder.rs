//! A holder that stalls past its lease (a process pause) and then writes.

use super::*;

pub(super) async fn paused_holder_wakes_to_a_refused_write(
    h: &dyn FaultHarness,
) -> Result<Outcome, Failure> {
    let history = History::new();
    let a = h.fault_client().await?;
    let caps = a.client.info().capabilities;
    if a.net.is_none() && !caps.mutex.ttl_expiry.is_supported() {
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

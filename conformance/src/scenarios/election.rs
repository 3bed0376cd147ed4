//! Election scenarios: one leader at a time with rising terms, the leader readable
//! by anyone, hand-over on resign and after a crash, observers in order, and nothing
//! left behind by cancelled campaigns.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use distlock_api::{
    Candidate, FencingToken, Leader, LeaderWatch, LockError, LockOptions, OptionsError,
    ReleaseOutcome, WaitPolicy,
};
use tokio::time::Instant;

use super::{check, millis, no_wait, unique_key, waiting, Failure, LONG_TTL};
use crate::Harness;

fn candidate(label: &str) -> Result<Candidate, Failure> {
    Candidate::new(label).map_err(|e| Failure::Failed(format!("candidate {label:?}: {e}")))
}

const CANDIDATES: usize = 6;
const TERMS_EACH: usize = 8;

pub(super) async fn election_one_leader_at_a_time(h: &dyn Harness) -> Result<String, Failure> {
    let name = unique_key("election-exclusion");
    let leading = Arc::new(AtomicUsize::new(0));
    let most_leading = Arc::new(AtomicUsize::new(0));
    // Terms in the order their leaders started acting: must rise strictly.
    let terms: Arc<Mutex<Vec<FencingToken>>> = Arc::default();
    let mut tasks = Vec::new();
    for n in 0..CANDIDATES {
        let election = h.client().await?.election();
        let me = candidate(&format!("replica-{n}"))?;
        let (name, leading, most_leading, terms) = (
            name.clone(),
            leading.clone(),
            most_leading.clone(),
            terms.clone(),
        );
        let options = waiting(LONG_TTL, Duration::from_secs(60));
        tasks.push(tokio::spawn(async move {
            for _ in 0..TERMS_EACH {
                let won = election.campaign(&name, &me, &options).await?;
                let now = leading.fetch_add(1, Ordering::SeqCst) + 1;
                most_leading.fetch_max(now, Ordering::SeqCst);
                terms
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(won.term());
                tokio::task::yield_now().await;
                leading.fetch_sub(1, Ordering::SeqCst);
                won.resign().await?;
            }
            Ok::<(), LockError>(())
        }));
    }
    for task in tasks {
        task.await
            .map_err(|e| Failure::Failed(format!("a candidate panicked: {e}")))??;
    }
    let most = most_leading.load(Ordering::SeqCst);
    check!(most == 1, "{most} candidates led at once");
    let terms = std::mem::take(&mut *terms.lock().unwrap_or_else(PoisonError::into_inner));
    check!(
        terms.len() == CANDIDATES * TERMS_EACH,
        "{} terms recorded, not {}",
        terms.len(),
        CANDIDATES * TERMS_EACH
    );
    if let Some(pair) = terms.windows(2).find(|w| w[1] <= w[0]) {
        return Err(Failure::Failed(format!(
            "term {} followed term {}: terms must rise strictly",
            pair[1], pair[0]
        )));
    }
    Ok(format!(
        "{} terms by {CANDIDATES} candidates, never two leaders, terms rising",
        terms.len()
    ))
}

pub(super) async fn election_leader_reads_identity_and_term(
    h: &dyn Harness,
) -> Result<String, Failure> {
    let name = unique_key("election-leader");
    let (a, b, observer) = (
        h.client().await?.election(),
        h.client().await?.election(),
        h.client().await?.election(),
    );
    let before = observer.leader(&name).await?;
    check!(before.is_none(), "a new election has a leader: {before:?}");
    let identity = "host-a:8080 \u{e9}";
    let first = a
        .try_campaign(&name, &candidate(identity)?, &no_wait(LONG_TTL))
        .await?
        .ok_or_else(|| Failure::Failed("the first campaign did not win".into()))?;
    let seen = observer.leader(&name).await?;
    let Some(seen) = seen else {
        return Err(Failure::Failed(
            "nobody reads as leader while A leads".into(),
        ));
    };
    check!(
        seen.candidate.as_bytes() == identity.as_bytes() && seen.term == first.term(),
        "leader() read {seen:?}, A leads as {identity:?} in term {}",
        first.term()
    );
    if let Some(left) = seen.remaining {
        check!(
            !left.is_zero() && left <= LONG_TTL,
            "remaining lease {left:?} is outside (0, {LONG_TTL:?}]"
        );
    }
    let other = b
        .try_campaign(&name, &candidate("host-b")?, &no_wait(LONG_TTL))
        .await?;
    check!(other.is_none(), "a second candidate won while A led");
    match b
        .campaign(&name, &candidate("host-b")?, &no_wait(LONG_TTL))
        .await
    {
        Err(LockError::Timeout { .. }) => {}
        Ok(_) => return Err(Failure::Failed("a no-wait campaign won while A led".into())),
        Err(e) => return Err(e.into()),
    }
    let resigned = first.resign().await?;
    check!(
        resigned == ReleaseOutcome::Released,
        "resign gave {resigned:?}"
    );
    let after = observer.leader(&name).await?;
    check!(
        after.is_none(),
        "after the resign the leader reads {after:?}"
    );
    let second = b
        .try_campaign(&name, &candidate("host-b")?, &no_wait(LONG_TTL))
        .await?
        .ok_or_else(|| Failure::Failed("B did not win a free election".into()))?;
    check!(
        second.term() > seen.term,
        "B's term {} is not above A's {}",
        second.term(),
        seen.term
    );
    let now = observer.leader(&name).await?;
    check!(
        now.as_ref()
            .is_some_and(|l| l.candidate.as_bytes() == b"host-b" && l.term == second.term()),
        "leader() read {now:?} while B leads in term {}",
        second.term()
    );
    second.resign().await?;
    Ok(format!(
        "terms {} then {}",
        seen.term,
        now.map_or(0, |l| l.term.get())
    ))
}

pub(super) async fn election_resign_hands_over_promptly(
    h: &dyn Harness,
) -> Result<String, Failure> {
    let name = unique_key("election-resign");
    let (a, b) = (h.client().await?.election(), h.client().await?.election());
    let leader = a
        .campaign(&name, &candidate("a")?, &no_wait(LONG_TTL))
        .await?;
    let slack = h.slack();
    let standby = tokio::spawn({
        let name = name.clone();
        let me = candidate("b")?;
        async move {
            let won = b
                .campaign(&name, &me, &waiting(LONG_TTL, Duration::from_secs(30)))
                .await;
            (won, Instant::now())
        }
    });
    // The leader's work; the standby campaigns meanwhile. The hand-off counts from the
    // resign either way (a standby not yet waiting only makes it shorter).
    tokio::time::sleep(Duration::from_millis(50)).await;
    let resigned_at = Instant::now();
    leader.resign().await?;
    let (won, won_at) = standby
        .await
        .map_err(|e| Failure::Failed(format!("the standby panicked: {e}")))?;
    let won = won?;
    let handoff = won_at.saturating_duration_since(resigned_at);
    check!(
        handoff <= slack,
        "the standby led {} after the resign, beyond the slack {}",
        millis(handoff),
        millis(slack)
    );
    won.resign().await?;
    Ok(format!("hand-off {}", millis(handoff)))
}

pub(super) async fn election_crashed_leader_is_replaced_within_lease(
    h: &dyn Harness,
) -> Result<String, Failure> {
    let name = unique_key("election-crash");
    let ttl = h.ttl();
    let a = h.client().await?;
    let Some(faults) = a.faults.clone() else {
        return Err(Failure::Skipped("the harness cannot crash a client".into()));
    };
    let a = a.election();
    let leader = a.campaign(&name, &candidate("a")?, &no_wait(ttl)).await?;
    let (granted, valid_until) = (leader.lease().acquired_at(), leader.valid_until());
    faults.crash().await?;
    drop(leader);
    let bound = h.crash_bound(ttl) + h.slack();
    let b = h.client().await?.election();
    let won = b
        .campaign(&name, &candidate("b")?, &waiting(LONG_TTL, bound))
        .await
        .map_err(|e| {
            Failure::Failed(format!(
                "no new leader within {bound:?} of the crashed one's grant: {e}"
            ))
        })?;
    let won_at = Instant::now();
    check!(
        won_at >= valid_until,
        "a new leader was elected {:?} before the crashed leader's validity ended",
        valid_until - won_at
    );
    won.resign().await?;
    Ok(format!(
        "new leader {} after the crashed one's grant",
        millis(won_at - granted)
    ))
}

pub(super) async fn election_observer_sees_changes_in_order(
    h: &dyn Harness,
) -> Result<String, Failure> {
    let name = unique_key("election-observe");
    let (a, b, observer) = (
        h.client().await?.election(),
        h.client().await?.election(),
        h.client().await?.election(),
    );
    let bound = h.slack() * 3;
    let mut watch = LeaderWatch::new(observer, name.clone());
    let first = next_within(&mut watch, bound).await?;
    check!(
        first.is_none(),
        "the first look at a new election read {first:?}"
    );
    let mut seen = Vec::new();
    for (label, election) in [("a", &a), ("b", &b), ("a", &a)] {
        let leader = election
            .campaign(&name, &candidate(label)?, &no_wait(LONG_TTL))
            .await?;
        let read = next_within(&mut watch, bound).await?;
        check!(
            read.as_ref().is_some_and(
                |l| l.term == leader.term() && l.candidate.as_bytes() == label.as_bytes()
            ),
            "the observer read {read:?} after {label:?} won term {}",
            leader.term()
        );
        seen.push(leader.term());
        leader.resign().await?;
        let read = next_within(&mut watch, bound).await?;
        check!(
            read.is_none(),
            "after {label:?} resigned the observer read {read:?}"
        );
    }
    check!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "terms observed out of order: {seen:?}"
    );
    Ok(format!(
        "observed terms {seen:?}, each followed by no leader"
    ))
}

async fn next_within(watch: &mut LeaderWatch, bound: Duration) -> Result<Option<Leader>, Failure> {
    match tokio::time::timeout(bound, watch.next()).await {
        Ok(read) => Ok(read?),
        Err(_) => Err(Failure::Failed(format!(
            "the observer saw no change within {bound:?}"
        ))),
    }
}

pub(super) async fn election_cancelled_campaign_leaves_nothing(
    h: &dyn Harness,
) -> Result<String, Failure> {
    let name = unique_key("election-cancel");
    let (a, b, c) = (
        h.client().await?.election(),
        h.client().await?.election(),
        h.client().await?.election(),
    );
    let forever = LockOptions::new(LONG_TTL).with_wait(WaitPolicy::Forever);
    let me = candidate("b")?;
    // Uncontended: a campaign cut short at many points must not leave B leading.
    for step in 0..20u32 {
        let cut = Duration::from_micros(150) * step;
        let _ = tokio::time::timeout(cut, b.campaign(&name, &me, &forever)).await;
        let probe = c
            .campaign(&name, &candidate("c")?, &waiting(LONG_TTL, h.slack()))
            .await
            .map_err(|e| {
                Failure::Failed(format!(
                    "after a campaign cut at {cut:?} the election stayed led: {e}"
                ))
            })?;
        probe.resign().await?;
    }
    // Contended: campaigns dropped while waiting must not win later. A's wait covers
    // the clean-up of B's last cut campaign: a put that reached the server after C's
    // probe is deleted by a drop-path task, within the slack.
    let leader = a
        .campaign(&name, &candidate("a")?, &waiting(LONG_TTL, h.slack()))
        .await?;
    for _ in 0..5 {
        let _ =
            tokio::time::timeout(Duration::from_millis(50), b.campaign(&name, &me, &forever)).await;
    }
    leader.resign().await?;
    let next = c
        .campaign(&name, &candidate("c")?, &waiting(LONG_TTL, h.slack()))
        .await
        .map_err(|e| {
            Failure::Failed(format!(
                "after dropped campaigns the election was not free: {e}"
            ))
        })?;
    let read = c.leader(&name).await?;
    check!(
        read.as_ref()
            .is_some_and(|l| l.candidate.as_bytes() == b"c"),
        "C leads, but leader() read {read:?}"
    );
    next.resign().await?;
    Ok("25 cut campaigns, none left leading or waiting".into())
}

pub(super) async fn election_lost_fires_by_deadline(h: &dyn Harness) -> Result<String, Failure> {
    let name = unique_key("election-lost");
    let ttl = h.ttl();
    let (a, b) = (h.client().await?.election(), h.client().await?.election());
    let leader = a.campaign(&name, &candidate("a")?, &no_wait(ttl)).await?;
    let valid_until = leader.valid_until();
    let lost = leader.lost();
    let slack = h.slack();
    tokio::time::timeout(h.crash_bound(ttl) + slack, lost)
        .await
        .map_err(|_| {
            Failure::Failed(format!(
                "lost() did not fire within the lease bound plus {slack:?}"
            ))
        })?;
    let fired_at = Instant::now();
    check!(
        fired_at + Duration::from_millis(5) >= valid_until,
        "lost() fired {:?} before the validity deadline",
        valid_until - fired_at
    );
    let won = b
        .campaign(&name, &candidate("b")?, &waiting(LONG_TTL, slack))
        .await?;
    check!(
        won.term() > leader.term(),
        "the next term {} is not above the lost one {}",
        won.term(),
        leader.term()
    );
    drop(leader);
    won.resign().await?;
    Ok(format!(
        "lost() at {} past the deadline",
        millis(fired_at.saturating_duration_since(valid_until))
    ))
}

pub(super) async fn election_bad_input_is_typed(h: &dyn Harness) -> Result<String, Failure> {
    check!(
        matches!(Candidate::new(""), Err(OptionsError::Candidate { .. })),
        "an empty candidate identity was accepted"
    );
    check!(
        matches!(
            Candidate::new(vec![b'x'; distlock_api::MAX_CANDIDATE_LEN + 1]),
            Err(OptionsError::Candidate { .. })
        ),
        "an identity above MAX_CANDIDATE_LEN was accepted"
    );
    let name = unique_key("election-bad");
    let (a, b) = (h.client().await?.election(), h.client().await?.election());
    let me = candidate("a")?;
    for ttl in [Duration::ZERO, Duration::from_micros(1)] {
        match a.campaign(&name, &me, &no_wait(ttl)).await {
            Err(LockError::InvalidOptions { .. }) => {}
            other => {
                return Err(Failure::Failed(format!(
                    "a campaign with ttl {ttl:?} gave {other:?}, not InvalidOptions"
                )))
            }
        }
    }
    let free = b
        .try_campaign(&name, &candidate("b")?, &no_wait(LONG_TTL))
        .await?;
    check!(
        free.is_some(),
        "after refused campaigns the election was led"
    );
    if let Some(won) = free {
        won.resign().await?;
    }
    Ok("empty and long identities, zero and tiny TTLs refused; nothing held".into())
}

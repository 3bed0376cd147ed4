//! Many clients contending under seeded random network faults.

use super::*;

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

pub(super) async fn contention_under_random_faults(
    h: &dyn FaultHarness,
) -> Result<Outcome, Failure> {
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

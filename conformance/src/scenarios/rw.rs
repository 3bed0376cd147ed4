//! Read-write lock scenarios: readers overlap, never a reader beside a writer, a
//! waiting writer is not starved by readers, cancelled acquires leave nothing behind.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock_api::{
    Backoff, DistributedRwLock, LockError, LockGuard, LockKey, LockOptions, RwMode, WaitPolicy,
};
use tokio::time::Instant;

use super::{check, millis, no_wait, unique_key, waiting, Failure, LONG_TTL};
use crate::Harness;

async fn try_take(
    lock: &Arc<dyn DistributedRwLock>,
    key: &LockKey,
    mode: RwMode,
) -> Result<Option<LockGuard>, LockError> {
    lock.try_acquire(key, mode, &no_wait(LONG_TTL)).await
}

pub(super) async fn rw_readers_overlap(h: &dyn Harness) -> Result<String, Failure> {
    let key = unique_key("rw-overlap");
    let mut readers = Vec::new();
    for n in 0..3 {
        let lock = h.client().await?.rw_lock();
        let Some(guard) = try_take(&lock, &key, RwMode::Read).await? else {
            return Err(Failure::Failed(format!(
                "reader {} was refused beside {n} readers",
                n + 1
            )));
        };
        readers.push(guard);
    }
    let writer = h.client().await?.rw_lock();
    check!(
        try_take(&writer, &key, RwMode::Write).await?.is_none(),
        "a writer was granted beside 3 readers"
    );
    for guard in readers {
        guard.release().await?;
    }
    let Some(write) = try_take(&writer, &key, RwMode::Write).await? else {
        return Err(Failure::Failed(
            "a writer was refused after every reader left".into(),
        ));
    };
    let reader = h.client().await?.rw_lock();
    check!(
        try_take(&reader, &key, RwMode::Read).await?.is_none(),
        "a reader was granted beside a writer"
    );
    check!(
        try_take(&reader, &key, RwMode::Write).await?.is_none(),
        "a second writer was granted beside a writer"
    );
    write.release().await?;
    Ok("3 readers at once; writer and reader refused beside each other".into())
}

const CLIENTS: usize = 6;
const ROUNDS: usize = 12;

pub(super) async fn rw_reader_and_writer_never_overlap(h: &dyn Harness) -> Result<String, Failure> {
    let key = unique_key("rw-contention");
    let readers = Arc::new(AtomicUsize::new(0));
    let writers = Arc::new(AtomicUsize::new(0));
    let max_readers = Arc::new(AtomicUsize::new(0));
    let broken = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let lock = h.client().await?.rw_lock();
        let (key, readers, writers, max_readers, broken) = (
            key.clone(),
            readers.clone(),
            writers.clone(),
            max_readers.clone(),
            broken.clone(),
        );
        let options = waiting(LONG_TTL, Duration::from_secs(60));
        tasks.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                // One round in three writes, staggered across clients.
                let mode = if (c + round) % 3 == 0 {
                    RwMode::Write
                } else {
                    RwMode::Read
                };
                let guard = lock.acquire(&key, mode, &options).await?;
                match mode {
                    RwMode::Write => {
                        let w = writers.fetch_add(1, Ordering::SeqCst) + 1;
                        if w > 1 || readers.load(Ordering::SeqCst) > 0 {
                            broken.store(true, Ordering::SeqCst);
                        }
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        writers.fetch_sub(1, Ordering::SeqCst);
                    }
                    RwMode::Read => {
                        let r = readers.fetch_add(1, Ordering::SeqCst) + 1;
                        max_readers.fetch_max(r, Ordering::SeqCst);
                        if writers.load(Ordering::SeqCst) > 0 {
                            broken.store(true, Ordering::SeqCst);
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        readers.fetch_sub(1, Ordering::SeqCst);
                    }
                }
                guard.release().await?;
            }
            Ok::<_, LockError>(())
        }));
    }
    for task in tasks {
        task.await
            .map_err(|e| Failure::Failed(format!("client task panicked: {e}")))??;
    }
    check!(
        !broken.load(Ordering::SeqCst),
        "a writer was inside beside a reader or another writer"
    );
    Ok(format!(
        "{} grants, never a writer beside anyone, up to {} readers at once",
        CLIENTS * ROUNDS,
        max_readers.load(Ordering::SeqCst)
    ))
}

/// How long each reader of the starvation scenario holds, and how many keep coming.
const READ_HOLD: Duration = Duration::from_millis(60);
const READERS: usize = 3;

pub(super) async fn rw_waiting_writer_is_not_starved(h: &dyn Harness) -> Result<String, Failure> {
    let key = unique_key("rw-starve");
    let stop = Arc::new(AtomicBool::new(false));
    let readers_inside = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for r in 0..READERS {
        let lock = h.client().await?.rw_lock();
        let (key, stop, inside) = (key.clone(), stop.clone(), readers_inside.clone());
        let options = waiting(LONG_TTL, Duration::from_secs(60));
        tasks.push(tokio::spawn(async move {
            // Staggered so that the holds overlap: the key is never free of readers.
            tokio::time::sleep(READ_HOLD / READERS as u32 * r as u32).await;
            let mut grants = 0usize;
            while !stop.load(Ordering::SeqCst) {
                let guard = lock.acquire(&key, RwMode::Read, &options).await?;
                inside.fetch_add(1, Ordering::SeqCst);
                grants += 1;
                tokio::time::sleep(READ_HOLD).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.release().await?;
            }
            Ok::<_, LockError>(grants)
        }));
    }
    // Wait until the readers are streaming.
    let streaming_by = Instant::now() + h.slack() * 5;
    while readers_inside.load(Ordering::SeqCst) < 2 {
        if Instant::now() > streaming_by {
            stop.store(true, Ordering::SeqCst);
            return Err(Failure::Failed(
                "the readers never held the key together".into(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let bound = h.slack() * 3;
    let writer = h.client().await?.rw_lock();
    let started = Instant::now();
    let granted = writer
        .acquire(&key, RwMode::Write, &waiting(LONG_TTL, bound))
        .await;
    let waited = started.elapsed();
    let inside_at_grant = readers_inside.load(Ordering::SeqCst);
    stop.store(true, Ordering::SeqCst);
    let outcome = match granted {
        Ok(guard) => {
            guard.release().await?;
            Ok(())
        }
        Err(LockError::Timeout { .. }) => Err(Failure::Failed(format!(
            "a writer waiting behind a stream of readers was not granted within {bound:?}: starved"
        ))),
        Err(e) => Err(e.into()),
    };
    let mut reads = 0;
    for task in tasks {
        reads += task
            .await
            .map_err(|e| Failure::Failed(format!("reader task panicked: {e}")))??;
    }
    outcome?;
    check!(
        inside_at_grant == 0,
        "the writer was granted with {inside_at_grant} readers inside"
    );
    Ok(format!(
        "writer granted {} into a stream of {reads} read grants",
        millis(waited)
    ))
}

pub(super) async fn rw_cancelled_acquire_leaks_nothing(h: &dyn Harness) -> Result<String, Failure> {
    let key = unique_key("rw-cancel");
    let (a, b, c) = (
        h.client().await?.rw_lock(),
        h.client().await?.rw_lock(),
        h.client().await?.rw_lock(),
    );
    let forever = LockOptions::new(LONG_TTL).with_wait(WaitPolicy::Forever);
    // Uncontended: cut reads and writes short after 0, 0.1 ms, … of progress.
    for step in 0..20u32 {
        let cut = Duration::from_micros(100) * step;
        let mode = if step % 2 == 0 {
            RwMode::Write
        } else {
            RwMode::Read
        };
        let _ = tokio::time::timeout(cut, b.acquire(&key, mode, &forever)).await;
        let probe = c
            .acquire(&key, RwMode::Write, &waiting(LONG_TTL, h.slack()))
            .await
            .map_err(|e| {
                Failure::Failed(format!(
                    "after a {} acquire cut at {cut:?} the key stayed held: {e}",
                    mode.as_str()
                ))
            })?;
        probe.release().await?;
    }
    // Contended: writers dropped while waiting behind a reader must leave no intent
    // that holds later readers back. The wait covers the last cut acquire's background
    // release, within the slack.
    let reader = a
        .acquire(&key, RwMode::Read, &waiting(LONG_TTL, h.slack()))
        .await
        .map_err(|e| Failure::Failed(format!("a reader of a free key was refused: {e}")))?;
    for _ in 0..5 {
        match tokio::time::timeout(
            Duration::from_millis(20),
            b.acquire(&key, RwMode::Write, &forever),
        )
        .await
        {
            Err(_elapsed) => {}
            Ok(Ok(_)) => return Err(Failure::Failed("a writer got a key a reader held".into())),
            Ok(Err(e)) => return Err(e.into()),
        }
    }
    let second_reader = c
        .acquire(&key, RwMode::Read, &waiting(LONG_TTL, h.slack()))
        .await
        .map_err(|e| {
            Failure::Failed(format!(
                "after cancelled writers a reader was held back: the writer intent leaked: {e}"
            ))
        })?;
    second_reader.release().await?;
    reader.release().await?;
    let writer = c
        .acquire(&key, RwMode::Write, &waiting(LONG_TTL, h.slack()))
        .await
        .map_err(|e| {
            Failure::Failed(format!("after cancelled acquires the key stayed held: {e}"))
        })?;
    writer.release().await?;
    Ok("20 uncontended and 5 queued acquires cancelled".into())
}

pub(super) async fn rw_bad_options_are_typed_errors(h: &dyn Harness) -> Result<String, Failure> {
    let key = unique_key("rw-bad");
    let lock = h.client().await?.rw_lock();
    let bad = [
        LockOptions::new(Duration::ZERO),
        LockOptions::new(LONG_TTL).with_backoff(Backoff::new(Duration::ZERO, Duration::ZERO)),
    ];
    for options in &bad {
        for mode in [RwMode::Read, RwMode::Write] {
            let tried = lock.try_acquire(&key, mode, options).await;
            check!(
                matches!(tried, Err(LockError::InvalidOptions { .. })),
                "a {} try-acquire with {options:?} gave {tried:?}, not InvalidOptions",
                mode.as_str()
            );
            let waited = lock.acquire(&key, mode, options).await;
            check!(
                matches!(waited, Err(LockError::InvalidOptions { .. })),
                "a {} acquire with {options:?} gave {waited:?}, not InvalidOptions",
                mode.as_str()
            );
        }
    }
    let Some(free) = try_take(&lock, &key, RwMode::Write).await? else {
        return Err(Failure::Failed(
            "after refused options the key was held".into(),
        ));
    };
    free.release().await?;
    Ok("zero TTL and zero backoff refused for both modes".into())
}

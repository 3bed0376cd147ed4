//! `distlock bench --failover N`: how long an election goes without a leader, on a
//! real backend, over N trials each:
//! - after a resign: in-process, from the leader's `resign()` being called to the
//!   standby's `campaign` returning (both clients of their own connections);
//! - after a crash: two `distlock elect` processes; from `kill -9` of the leader's
//!   distlock to the standby's command printing its first line (its first action).

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use distlock::{
    AutoRenew, Candidate, LeaderElection, LockError, LockKey, LockOptions, OptionsError, WaitPolicy,
};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio::time::{sleep, timeout, Instant};

use crate::duration;
use crate::error::CliError;

/// The leader's lease in the crash trials (or the backend's shortest, where that is
/// longer: etcd's is 2 s): the longest a crashed TTL leader (Redis, etcd) keeps the
/// name, so each crash trial lasts about this long.
const CRASH_TTL: Duration = Duration::from_secs(1);

/// How long the standby campaigns before the leader goes: enough to be waiting (a
/// queued contender, a subscribed waiter) rather than still connecting.
const STANDBY_SETTLE: Duration = Duration::from_millis(300);

/// The longest one trial may take before the run is called failed.
const TRIAL_PATIENCE: Duration = Duration::from_secs(60);

/// Runs both measurements against `url` and returns the report's text.
///
/// # Errors
/// A failure when the backend offers no election, a process cannot be started, or a
/// trial does not finish within a minute.
pub async fn run(url: &str, trials: usize) -> Result<String, CliError> {
    let trials = trials.max(1);
    let progress = |line: &str| {
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), "{line}");
    };
    let election = distlock::connect(url).await.map(|c| c.election())?;
    let backend = election.info().name;
    if backend == distlock::memory::MEMORY_BACKEND {
        return Err(CliError::usage(
            "a memory:// election lives in one process: --failover needs a backend that \
             processes share (file://DIR, redis://, postgres://, zk://, etcd://)",
        ));
    }
    progress(&format!("failover: {trials} resign trials"));
    let resign = resign_trials(url, trials).await?;
    let crash_ttl = crash_ttl(election.as_ref()).await?;
    progress(&format!("failover: {trials} crash (kill -9) trials"));
    let crash = crash_trials(url, trials, crash_ttl).await?;
    Ok(format!(
        "#### Election failover on {backend} ({trials} trials each; ms)\n\n\
         | event | p50 | p99 | max | bound |\n|---|---:|---:|---:|---|\n\
         | resign → standby leads | {} | {} | {} | one hand-off |\n\
         | kill -9 of the leader → standby's command starts | {} | {} | {} | the lease ({} TTL; a session backend's timeout or connection loss) |\n",
        ms(quantile(&resign, 0.5)),
        ms(quantile(&resign, 0.99)),
        ms(quantile(&resign, 1.0)),
        ms(quantile(&crash, 0.5)),
        ms(quantile(&crash, 0.99)),
        ms(quantile(&crash, 1.0)),
        duration::format(crash_ttl),
    ))
}

/// [`CRASH_TTL`], or the shortest lease the backend grants where that is longer: a
/// campaign with [`CRASH_TTL`] that the backend refuses as too short says its minimum.
async fn crash_ttl(election: &dyn LeaderElection) -> Result<Duration, CliError> {
    let name = trial_name("ttl")?;
    let options = LockOptions::new(CRASH_TTL).with_wait(WaitPolicy::NoWait);
    match election
        .try_campaign(&name, &candidate("bench-probe")?, &options)
        .await
    {
        Ok(Some(probe)) => {
            probe.resign().await?;
            Ok(CRASH_TTL)
        }
        Ok(None) => Ok(CRASH_TTL),
        Err(LockError::InvalidOptions {
            source: OptionsError::TtlTooShort { min, .. },
            ..
        }) if min > CRASH_TTL => Ok(min),
        Err(e) => Err(e.into()),
    }
}

async fn resign_trials(url: &str, trials: usize) -> Result<Vec<Duration>, CliError> {
    let name = trial_name("resign")?;
    let clients: [Arc<dyn LeaderElection>; 2] = [
        distlock::connect(url).await.map(|c| c.election())?,
        distlock::connect(url).await.map(|c| c.election())?,
    ];
    let candidates = [candidate("bench-a")?, candidate("bench-b")?];
    let options = LockOptions::new(Duration::from_secs(30))
        .with_wait(WaitPolicy::Timeout(TRIAL_PATIENCE))
        .with_auto_renew(AutoRenew::new());
    let mut gaps = Vec::with_capacity(trials);
    for trial in 0..trials {
        let (lead, stand) = (trial % 2, 1 - trial % 2);
        let leader = clients[lead]
            .campaign(&name, &candidates[lead], &options)
            .await?;
        let standby = {
            let (election, me, name, options) = (
                clients[stand].clone(),
                candidates[stand].clone(),
                name.clone(),
                options.clone(),
            );
            tokio::spawn(async move {
                let won = election.campaign(&name, &me, &options).await;
                (Instant::now(), won)
            })
        };
        sleep(STANDBY_SETTLE).await;
        let resigned_at = Instant::now();
        leader.resign().await?;
        let (led_at, won) = standby
            .await
            .map_err(|e| CliError::failed(format!("the standby panicked: {e}")))?;
        gaps.push(led_at.saturating_duration_since(resigned_at));
        won?.resign().await?;
    }
    Ok(gaps)
}

async fn crash_trials(url: &str, trials: usize, ttl: Duration) -> Result<Vec<Duration>, CliError> {
    let name = trial_name("crash")?;
    let mut gaps = Vec::with_capacity(trials);
    let mut leader = Replica::start(url, name.as_str(), "bench-0", ttl).await?;
    leader.first_line().await?;
    for trial in 0..trials {
        let mut standby =
            Replica::start(url, name.as_str(), &format!("bench-{}", trial + 1), ttl).await?;
        sleep(STANDBY_SETTLE).await;
        let killed_at = Instant::now();
        leader.kill9();
        standby.first_line().await?;
        gaps.push(killed_at.elapsed());
        leader.reap().await;
        leader = standby;
    }
    leader.kill9();
    leader.reap().await;
    Ok(gaps)
}

/// One `distlock elect` process whose command prints a line as soon as it leads.
struct Replica {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Replica {
    async fn start(url: &str, name: &str, id: &str, ttl: Duration) -> Result<Self, CliError> {
        let exe = std::env::current_exe()
            .map_err(|e| CliError::failed(format!("cannot find the distlock binary: {e}")))?;
        let mut child = Command::new(exe)
            .args(["elect", "--backend", url, "--id", id, "--once", "--ttl"])
            .arg(format!("{}ms", ttl.as_millis()))
            .args([name, "--", "sh", "-c", "echo leading; exec sleep 600"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| CliError::failed(format!("cannot start distlock elect: {e}")))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| CliError::failed("distlock elect has no stdout"))?;
        Ok(Replica {
            child,
            lines: BufReader::new(stdout).lines(),
        })
    }

    /// Waits for the command's first line: this replica leads.
    async fn first_line(&mut self) -> Result<(), CliError> {
        match timeout(TRIAL_PATIENCE, self.lines.next_line()).await {
            Ok(Ok(Some(_))) => Ok(()),
            Ok(_) => Err(CliError::failed("a replica ended without leading")),
            Err(_) => Err(CliError::failed(format!(
                "no replica led within {}",
                duration::format(TRIAL_PATIENCE)
            ))),
        }
    }

    /// `kill -9` of distlock itself: its command gets SIGTERM from the kernel
    /// (distlock sets the parent-death signal), its lease is left to run out.
    fn kill9(&mut self) {
        let _ = self.child.start_kill();
    }

    async fn reap(&mut self) {
        let _ = timeout(TRIAL_PATIENCE, self.child.wait()).await;
    }
}

fn trial_name(kind: &str) -> Result<LockKey, CliError> {
    LockKey::new(format!(
        "distlock-bench/failover-{kind}/{:08x}",
        rand_suffix()
    ))
    .map_err(|e| CliError::failed(format!("cannot name the election: {e}")))
}

/// Distinct per run, so a rerun never meets an earlier run's leftovers.
fn rand_suffix() -> u32 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    std::process::id() ^ now.subsec_nanos()
}

fn candidate(id: &str) -> Result<Candidate, CliError> {
    Candidate::new(id).map_err(|e| CliError::failed(format!("candidate {id}: {e}")))
}

/// The nearest-rank quantile `q` of `samples`.
fn quantile(samples: &[Duration], q: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len().max(1));
    sorted.get(rank - 1).copied().unwrap_or_default()
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

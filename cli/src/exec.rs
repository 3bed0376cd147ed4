//! `distlock exec`: runs a command while holding a lock, like `flock(1)`,
//! `etcdctl lock` and `consul lock`, on any backend.
//!
//! The command runs in its own process group, so that a lost lock, or a signal sent to
//! `distlock`, reaches every process of a `sh -c` pipeline, and a terminal's Ctrl-C
//! reaches it once (forwarded by `distlock`), not twice.

mod hold;
pub(crate) mod verdict;

use std::future::Future;
use std::process::ExitStatus;
use std::time::Duration;

use clap::Args;
use std::time::SystemTime;

use distlock::{
    AutoRenew, BackendInfo, Capability, Client, ExtendOutcome, Firing, LeaseState, LockError,
    LockGuard, LockKey, LockOptions, MultiGuard, ReleaseOutcome, Schedule, WaitPolicy,
};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::time::Instant;

use self::hold::{Held, Mode};
pub(crate) use self::verdict::{CommandEnd, Release};
use crate::error::CliError;
use crate::{duration, escape};

/// Exit code: the lock was not acquired within `--wait` (at once with `--no-wait`).
/// `EX_TEMPFAIL` from sysexits.h: "try again later", what a cron job wants to hear.
pub const EXIT_NOT_ACQUIRED: u8 = 75;
/// Exit code: the backend could not be reached or failed before the command started.
/// `EX_UNAVAILABLE` from sysexits.h.
pub const EXIT_UNREACHABLE: u8 = 69;
/// Exit code: the lock was lost while the command ran (the command was then stopped if
/// it still ran), or cannot be shown to have lasted until the command ended. As
/// `timeout(1)` exits 124 when it stopped the command.
pub const EXIT_LOCK_LOST: u8 = 124;
/// Exit code: `--permits N` disagrees with the count the semaphore's current holders
/// use. `EX_CONFIG` from sysexits.h: retrying will not help until the counts agree.
pub const EXIT_PERMIT_MISMATCH: u8 = 78;
/// Exit code: the command was found but could not be run (as in shells).
pub const EXIT_CANNOT_RUN: u8 = 126;
/// Exit code: the command was not found (as in shells).
pub const EXIT_NOT_FOUND: u8 = 127;

/// The shortest `--ttl` exec accepts. The library's [`distlock::MIN_TTL`] (10 ms) is a
/// lease's; exec must also start the command and renew every third of the TTL on a
/// host that may be busy. Measured on a loaded 2-core host (load 3.3 to 4.4, debug
/// build; file and Redis backends), runs that lost the lock: 10 ms 20 of 100, 50 ms 1
/// of 60, 100 ms 1 of 310, 250 ms none of 160.
pub const MIN_TTL: Duration = Duration::from_millis(250);

/// How long `exec` waits for the release after the command ended.
const RELEASE_PATIENCE: Duration = Duration::from_secs(10);

/// Arguments of `distlock exec`.
#[derive(Debug, Args)]
#[command(after_help = "\
Exit codes:
  N      the command's own exit code (128+S if it was killed by signal S): the lease
         lasted until the command ended
  2      usage or configuration error (bad flag, URL, key or duration)
  69     backend unreachable (or failing) before the command started
  75     lock not acquired within --wait (at once with --no-wait); with --permits N,
         all N permits held; with --once-per, the firing runs or ran elsewhere
  78     --permits N disagrees with the count the key's current holders use
  124    lock lost while the command ran (the command was stopped if it still ran),
         or not shown to have lasted until it ended; stderr says which, with the
         command's own exit code
  126    command not executable; 127 command not found
  130/143/129  distlock got SIGINT/SIGTERM/SIGHUP while still waiting for the lock

Modes: plain exec is exclusive: it takes KEY's lock and, where the backend has
read-write locks, KEY's write lock too, so it excludes other plain execs and every
--shared holder of KEY. --shared takes KEY's read lock: --shared commands run side by
side, never beside a plain exec. --permits N takes one of N permits of the semaphore
KEY: at most N such commands run at once; every exec on that key must give the same N.
Semaphore keys are their own namespace: they do not exclude plain or --shared execs.

The command gets DISTLOCK_KEY, DISTLOCK_FENCING_TOKEN (KEY's; unset where the backend
has no fencing, as on Redlock), DISTLOCK_BACKEND and, with --once-per, DISTLOCK_FIRING
in its environment and runs in its own
process group. SIGINT, SIGTERM and SIGHUP sent to distlock are forwarded to that group.
If the lock is lost while the command runs, the group gets SIGTERM, then SIGKILL after
--kill-after. The lock is released when the command ends. If distlock was paused past
the lease's validity deadline meanwhile, the command's own code is passed on only if
the release finds the lock still ours (nobody else held it). If distlock itself is
killed with -9, the lock is freed as --ttl says for each backend.")]
pub struct ExecArgs {
    #[command(flatten)]
    backend: crate::LockBackendArgs,
    /// Lease time-to-live (at least 250ms), renewed every third of it while the command
    /// runs. How long a killed or frozen distlock keeps the lock depends on the backend:
    /// Redis, Redlock: at most this long. Postgres: a killed distlock frees it at once,
    /// a frozen or cut-off one keeps it until the server's idle_session_timeout (10s by
    /// default). MySQL/MariaDB: the same, until the server's wait_timeout (10s by
    /// default, plus up to 1s). ZooKeeper: until its session expires (the session timeout, whatever
    /// --ttl is). File: a killed distlock frees it at once, a frozen one keeps it.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = duration::parse)]
    ttl: Duration,
    /// How long to wait for a held lock (default: forever). 0 means --no-wait.
    #[arg(long, value_name = "DURATION", value_parser = duration::parse, conflicts_with = "no_wait")]
    wait: Option<Duration>,
    /// Exit at once (code 75) if the lock is held.
    #[arg(long)]
    no_wait: bool,
    /// After a lost lock, how long the command has to exit after SIGTERM before SIGKILL.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = duration::parse)]
    kill_after: Duration,
    /// Print a summary (backend, key, fencing token, wait, hold, renewals) on stderr.
    #[arg(long, short)]
    verbose: bool,
    /// Do not ask for FIFO waiting. By default a waiting exec is granted in arrival
    /// order wherever the backend can promise it (Redis single node, Postgres,
    /// ZooKeeper); with this flag Redis waiters race on each release instead, which
    /// hands off a little faster but lets one waiter lose for seconds. Plain exec only:
    /// --permits and --shared waiters follow their primitive's own order.
    #[arg(long)]
    no_fifo: bool,
    /// Take one of N permits of the semaphore KEY instead of the lock: at most N
    /// commands run at once on KEY across hosts. Every exec on KEY must use the same
    /// N (exit 78 otherwise). 1 to 1024.
    #[arg(long, value_name = "N", conflicts_with = "shared")]
    permits: Option<u32>,
    /// Take KEY's read lock instead: --shared commands run side by side, never beside
    /// a plain (exclusive) exec of KEY, which waits for them; a waiting plain exec holds
    /// new --shared ones back.
    #[arg(long)]
    shared: bool,
    /// Also take KEY2 (repeat for more): every key is taken all or nothing, in one
    /// canonical order, so execs naming the same keys in other orders never deadlock.
    /// The command's DISTLOCK_FENCING_TOKEN is KEY's.
    #[arg(long = "and", value_name = "KEY2", conflicts_with = "once_per")]
    and: Vec<String>,
    /// Run at most once per firing of a schedule of this period, across every host
    /// running the same line (cron on each replica): the firing is the period's last
    /// boundary on this host's clock (as cron fires on boundaries, replicas agree even
    /// when their clocks differ by less than the period). Exits 75 at once if the
    /// firing runs or ran elsewhere; a firing that ran keeps a done mark for one
    /// period. The command gets the firing's nominal time in DISTLOCK_FIRING (Unix
    /// seconds). Needs a backend whose leases expire and outlive their client
    /// (Redis). Implies --no-wait.
    #[arg(long, value_name = "PERIOD", value_parser = duration::parse,
          conflicts_with_all = ["wait", "shared", "permits"])]
    once_per: Option<Duration>,
    /// Keep the lock until DURATION after the command started, even if it ended sooner
    /// (ShedLock's lockAtLeastFor): a replica whose clock is behind by less than this
    /// finds it held. Needs a backend whose leases outlive their client.
    #[arg(long, value_name = "DURATION", value_parser = duration::parse)]
    at_least: Option<Duration>,
    /// The lock key.
    #[arg(value_name = "KEY")]
    key: String,
    /// The command and its arguments, after `--`.
    #[arg(value_name = "CMD", required = true, last = true)]
    command: Vec<String>,
}

/// Runs the command under the lock; `Ok(())` for exit code 0, otherwise an error
/// carrying the exit code (silent when the code is the command's own).
pub async fn run(args: ExecArgs) -> Result<(), CliError> {
    let key = LockKey::new(&args.key).map_err(|e| CliError::usage(format!("invalid key: {e}")))?;
    let firing = match args.once_per {
        Some(period) => Some(
            Schedule::new(args.key.as_str(), period)
                .map_err(|e| CliError::usage(format!("invalid --once-per: {e}")))?
                .firing_at(SystemTime::now())
                .map_err(|e| CliError::usage(format!("invalid key: {e}")))?,
        ),
        None => None,
    };
    let mut keys = vec![firing
        .as_ref()
        .map_or_else(|| key.clone(), |f| f.key().clone())];
    for and in &args.and {
        keys.push(LockKey::new(and).map_err(|e| CliError::usage(format!("invalid key: {e}")))?);
    }
    let wait = match (args.no_wait || firing.is_some(), args.wait) {
        (true, _) => WaitPolicy::NoWait,
        (false, Some(d)) if d.is_zero() => WaitPolicy::NoWait,
        (false, Some(d)) => WaitPolicy::Timeout(d),
        (false, None) => WaitPolicy::Forever,
    };
    let options = LockOptions::new(args.ttl)
        .with_wait(wait)
        .with_auto_renew(AutoRenew::new());
    if args.ttl < MIN_TTL {
        return Err(CliError::usage(format!(
            "invalid --ttl: {} is below exec's minimum of {} (a shorter lease cannot be \
             renewed reliably while a command runs)",
            duration::format(args.ttl),
            duration::format(MIN_TTL)
        )));
    }
    options
        .validate()
        .map_err(|e| CliError::usage(format!("invalid --ttl: {e}")))?;
    let mode = match (args.permits, args.shared) {
        (Some(permits), _) => {
            distlock::check_permits(permits)
                .map_err(|e| CliError::usage(format!("invalid --permits: {e}")))?;
            Mode::Permits(permits)
        }
        (None, true) => Mode::Shared,
        (None, false) => Mode::Exclusive,
    };
    let mut signals = Signals::new()?;

    let started = Instant::now();
    let url = &args.backend.backend;
    // Waiting plain execs are served in arrival order wherever the backend can promise
    // it (README, "Operators"): a cron job must not starve behind newer ones.
    let acquiring = async {
        let client = distlock::connect(url)
            .await
            .map_err(|e| lock_error(e, mode, &keys[0]))?;
        if firing.is_some() || args.at_least.is_some() {
            marks_outlive_us(&client)?;
        }
        let held = hold::acquire(&client, &keys, mode, &options, !args.no_fifo).await;
        match (held, &firing) {
            (Err(e), Some(firing)) if e.exit_code() == EXIT_NOT_ACQUIRED => {
                Err(CliError::with_code(
                    format!(
                        "firing {} of {:?} runs elsewhere",
                        firing_time(firing),
                        args.key
                    ),
                    EXIT_NOT_ACQUIRED,
                ))
            }
            (held, _) => Ok((client, held?)),
        }
    };
    tokio::pin!(acquiring);
    let (client, held) = loop {
        tokio::select! {
            acquired = &mut acquiring => break acquired?,
            signo = signals.next() => match signo {
                // Ctrl-Z: stop as the default action would; Ctrl-Z handling below.
                libc::SIGTSTP => stop_self(),
                libc::SIGCONT => {}
                // Dropping the acquire leaves no lock held; the runtime gets a grace at
                // exit for the backend's clean-up (see `main`).
                _ => return Err(CliError::silent(128u8.saturating_add(signo as u8))),
            },
        }
    };
    let backend_name = held.backend.name;
    let waited = started.elapsed();
    if let Some(firing) = &firing {
        if let Err(skip) = not_done_yet(&client, firing, &args.key).await {
            let _ = release_all(held).await;
            return Err(skip);
        }
    }
    let first_token = held.first().and_then(LockGuard::fencing_token);
    let token = first_token.map_or_else(|| "none".to_owned(), |t| t.to_string());

    let quoted_key = escape::quoted(&args.key);
    let subject = format!("lock {quoted_key}");
    let mut job = Job {
        argv: &args.command,
        env: vec![
            ("DISTLOCK_KEY", args.key.clone()),
            ("DISTLOCK_BACKEND", args.backend.backend.clone()),
        ],
        unset: Vec::new(),
        kill_after: args.kill_after,
    };
    if let Some(firing) = &firing {
        job.env.push(("DISTLOCK_FIRING", firing_time(firing)));
    }
    match first_token {
        Some(token) => job
            .env
            .push(("DISTLOCK_FENCING_TOKEN", token.get().to_string())),
        // A backend without fencing (Redlock) has no token to pass on; nor may one
        // inherited from an enclosing exec pass for this lock's.
        None => job.unset.push("DISTLOCK_FENCING_TOKEN"),
    }
    let outcome = supervise(&job, &subject, &|| held.state(), held.lost(), &mut signals).await;
    let held_since = held.first().map(|g| g.lease().acquired_at());
    let held_for = held_since.map(|since| since.elapsed()).unwrap_or_default();
    let renewals = held.renewals();
    if let (Some(firing), Ok(_)) = (&firing, &outcome) {
        mark_done(&client, firing, &args.key).await;
    }
    // Only now, with the command reaped: what the release (or the extend to
    // --at-least) finds decides whether a lease whose deadline passed before distlock
    // saw the command end still lasted.
    let kept_until = args
        .at_least
        .zip(held_since)
        .map(|(least, since)| since + least);
    let release = match kept_until {
        Some(until) => keep_until(held, until).await,
        None => release_all(held).await,
    };
    let code = match &outcome {
        Ok(end) => {
            let verdict = verdict::decide(&subject, *end, &release);
            verdict.lines.iter().for_each(|line| warn(line));
            verdict.code
        }
        Err(e) => {
            if let Release::Failed { error, freed } = &release {
                warn(&format!("could not release {subject} ({error}); {freed}"));
            }
            e.exit_code()
        }
    };
    if args.verbose {
        warn(&format!(
            "backend={backend_name} key={quoted_key} fencing_token={token} waited={} held={} renewals={renewals} exit={code}",
            duration::format(waited),
            duration::format(held_for),
        ));
    }
    match outcome {
        Ok(_) if code == 0 => Ok(()),
        Ok(_) => Err(CliError::silent(code)),
        Err(e) => Err(e),
    }
}

/// Releases every grant exec holds, and says what that found: the worst of their
/// releases, since the command was protected only if each lasted.
///
/// The write locks go first, then the mutexes: the next exec is granted a mutex only
/// once the write lock beside it is free, so its own take of that write lock succeeds
/// at once. Released the other way round (or together) it may meet the write lock
/// still held and wait for it, which on Postgres costs a dedicated session: one more
/// server connection, queued behind the others in a full session pool.
async fn release_all(held: Held) -> Release {
    let Held {
        primary,
        companion,
        backend,
    } = held;
    let released = |set: MultiGuard| async move { set.release().await.map(worst) };
    let mut found = Release::StillOurs;
    if let Some(companion) = companion {
        found = release(released(companion), &backend).await;
    }
    found.worse(release(released(primary), &backend).await)
}

/// `--at-least`: keeps every grant until `until` instead of releasing it, by extending
/// each lease to end then and letting it run out, and says what the extends found.
/// Released at once if `until` is too close for a lease.
async fn keep_until(held: Held, until: Instant) -> Release {
    let left = until.saturating_duration_since(Instant::now());
    if left < distlock::MIN_TTL {
        return release_all(held).await;
    }
    let Held {
        primary,
        companion,
        backend,
    } = held;
    let mut found = Release::StillOurs;
    for set in std::iter::once(primary).chain(companion) {
        let extended = async {
            set.extend(left)
                .await
                .map(|all| worst(all.into_iter().map(as_release).collect()))
        };
        found = found.worse(release(extended, &backend).await);
        set.let_expire();
    }
    found
}

/// What an extend found, read as a release would report it.
fn as_release(outcome: ExtendOutcome) -> ReleaseOutcome {
    match outcome {
        ExtendOutcome::Extended { .. } => ReleaseOutcome::Released,
        ExtendOutcome::HeldByOther => ReleaseOutcome::HeldByOther,
        ExtendOutcome::Expired | ExtendOutcome::Lost => ReleaseOutcome::Expired,
    }
}

/// The worst of several parts' outcomes: another holder, then an expiry, then a release.
fn worst(outcomes: Vec<ReleaseOutcome>) -> ReleaseOutcome {
    let rank = |o: &ReleaseOutcome| match o {
        ReleaseOutcome::Released => 0,
        ReleaseOutcome::Expired => 1,
        ReleaseOutcome::HeldByOther => 2,
    };
    outcomes
        .into_iter()
        .max_by_key(rank)
        .unwrap_or(ReleaseOutcome::Released)
}

/// The firing's nominal time, in Unix seconds, as DISTLOCK_FIRING and messages give it.
fn firing_time(firing: &Firing) -> String {
    firing.unix_seconds().unwrap_or_default().to_string()
}

/// Refuses `--once-per` and `--at-least` on a backend where a lease left to run out
/// would not outlive this process (or would never run out).
fn marks_outlive_us(client: &Client) -> Result<(), CliError> {
    let info = client.info();
    let mutex = info.capabilities.mutex;
    for needed in [mutex.ttl_expiry, mutex.outlives_client] {
        if let Capability::Unsupported(reason) = needed {
            return Err(CliError::usage(format!(
                "--once-per and --at-least need a lease that runs out on its own after distlock exits; {} cannot: {reason}",
                info.name
            )));
        }
    }
    Ok(())
}

/// Holding the firing's lock: fails with exit 75 if another host already ran it.
async fn not_done_yet(client: &Client, firing: &Firing, key: &str) -> Result<(), CliError> {
    let (Some(done), Some(period)) = (firing.done_key(), firing.period()) else {
        return Ok(());
    };
    let look = LockOptions::new(period).with_wait(WaitPolicy::NoWait);
    match client.lock().try_acquire(done, &look).await {
        Ok(Some(free)) => {
            let _ = free.release().await;
            Ok(())
        }
        Ok(None) => Err(CliError::with_code(
            format!("firing {} of {key:?} ran elsewhere", firing_time(firing)),
            EXIT_NOT_ACQUIRED,
        )),
        Err(e) => Err(lock_error(e, Mode::Exclusive, done)),
    }
}

/// Leaves the firing's done mark for one period. A failure is only a warning: the
/// command ran; another host may run the firing again.
async fn mark_done(client: &Client, firing: &Firing, key: &str) {
    let (Some(done), Some(period)) = (firing.done_key(), firing.period()) else {
        return;
    };
    let mark = LockOptions::new(period).with_wait(WaitPolicy::NoWait);
    match client.lock().try_acquire(done, &mark).await {
        Ok(Some(mark)) => mark.let_expire(),
        Ok(None) => warn(&format!(
            "firing {} of {key:?} was marked done elsewhere while it ran here",
            firing_time(firing)
        )),
        Err(e) => warn(&format!(
            "could not mark firing {} of {key:?} done ({e}); another host may run it again",
            firing_time(firing)
        )),
    }
}

/// Runs an owner-checked release (a guard's release, a leadership's resign) and says
/// what it found. Bounded: a backend that stopped answering must not keep distlock
/// (and a cron slot) waiting.
pub(crate) async fn release(
    releasing: impl Future<Output = Result<ReleaseOutcome, LockError>>,
    backend: &BackendInfo,
) -> Release {
    let failed = |error| Release::Failed {
        error,
        freed: backend.unreleased_lock_ends,
    };
    match tokio::time::timeout(RELEASE_PATIENCE, releasing).await {
        Ok(Ok(ReleaseOutcome::Released)) if backend.release_shows_continuity => Release::StillOurs,
        Ok(Ok(ReleaseOutcome::Released)) => Release::Inconclusive(
            "finding the lease on some Redlock nodes at release does not show that no one \
             else held a majority of them",
        ),
        Ok(Ok(ReleaseOutcome::Expired)) => Release::Gone("that it had expired"),
        Ok(Ok(ReleaseOutcome::HeldByOther)) => Release::Gone("another owner holding it"),
        Ok(Err(e)) => failed(e.to_string()),
        Err(_) => failed(format!(
            "no answer within {}",
            duration::format(RELEASE_PATIENCE)
        )),
    }
}

/// A command to run under a lease: its argv, what its environment gains and loses,
/// and how long it has between SIGTERM and SIGKILL once the lease is lost.
pub(crate) struct Job<'a> {
    /// The program and its arguments.
    pub argv: &'a [String],
    /// Variables set for the command.
    pub env: Vec<(&'static str, String)>,
    /// Variables removed from the command's environment.
    pub unset: Vec<&'static str>,
    /// `--kill-after`.
    pub kill_after: Duration,
}

/// Spawns the job's command and waits for it, forwarding signals and enforcing the
/// lease: `state` reads it, `lost` resolves when it is lost; `subject` names what is
/// held in messages (`lock "k"`).
pub(crate) async fn supervise(
    job: &Job<'_>,
    subject: &str,
    state: &dyn Fn() -> LeaseState,
    lost: impl Future<Output = ()>,
    signals: &mut Signals,
) -> Result<CommandEnd, CliError> {
    let (program, rest) = job
        .argv
        .split_first()
        .ok_or_else(|| CliError::usage("no command given after --"))?;
    let mut command = tokio::process::Command::new(program);
    command.args(rest).process_group(0);
    for (name, value) in &job.env {
        command.env(name, value);
    }
    for name in &job.unset {
        command.env_remove(name);
    }
    terminate_with_parent(&mut command);
    // Do not start a command the lease can no longer protect, or that was called off
    // between the grant and now.
    if state() == LeaseState::Lost {
        return Ok(CommandEnd::NotStarted);
    }
    let pending = tokio::select! {
        biased;
        signo = signals.next() => Some(signo),
        () = std::future::ready(()) => None,
    };
    if let Some(signo) = pending.filter(|&s| s != libc::SIGCONT && s != libc::SIGTSTP) {
        return Err(CliError::silent(128u8.saturating_add(signo as u8)));
    }
    let mut child = command.spawn().map_err(|e| {
        let code = match e.kind() {
            std::io::ErrorKind::NotFound => EXIT_NOT_FOUND,
            _ => EXIT_CANNOT_RUN,
        };
        CliError::with_code(format!("cannot run {program:?}: {e}"), code)
    })?;
    // Whether the lease was still valid when the command was seen to end: read at that
    // moment, since a lease is only ever lost later, never found again.
    let exited = |status: ExitStatus| CommandEnd::Exited {
        code: exit_code(status),
        in_time: state() != LeaseState::Lost,
    };
    let Some(pgid) = child.id() else {
        // Already reaped: nothing to supervise.
        return Ok(exited(child.wait().await.map_err(wait_error)?));
    };
    tokio::pin!(lost);
    loop {
        tokio::select! {
            status = child.wait() => return Ok(exited(status.map_err(wait_error)?)),
            signo = signals.next() => forward(pgid, signo),
            () = &mut lost => break,
        }
    }
    // Lost, or the deadline passed. Reap first: after a pause (SIGSTOP, a suspended VM)
    // the command may have ended while distlock was stopped, and both wake up together.
    // Such a command was not stopped by distlock; the release decides its verdict.
    if let Some(status) = child.try_wait().map_err(wait_error)? {
        return Ok(CommandEnd::Exited {
            code: exit_code(status),
            in_time: false,
        });
    }

    warn(&format!(
        "{subject} lost while the command ran; sending SIGTERM to its process group"
    ));
    signal_group(pgid, libc::SIGTERM);
    let grace = tokio::time::sleep(job.kill_after);
    tokio::pin!(grace);
    loop {
        tokio::select! {
            status = child.wait() => {
                let code = exit_code(status.map_err(wait_error)?);
                return Ok(CommandEnd::Stopped { code });
            }
            signo = signals.next() => forward(pgid, signo),
            () = &mut grace => break,
        }
    }
    warn(&format!(
        "the command did not exit within {} of SIGTERM; sending SIGKILL",
        duration::format(job.kill_after)
    ));
    signal_group(pgid, libc::SIGKILL);
    let code = exit_code(child.wait().await.map_err(wait_error)?);
    Ok(CommandEnd::Stopped { code })
}

/// Linux: the command gets SIGTERM if distlock dies (killed with -9, say), so it does
/// not run on without the lock. Only the command itself: processes it started are not
/// told. Elsewhere, a no-op.
#[cfg(target_os = "linux")]
fn terminate_with_parent(command: &mut tokio::process::Command) {
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe calls (getpid/getppid, prctl), touching no shared memory.
    // The death signal follows the thread that forks: `exec::run` runs on the thread
    // that blocks on the runtime, which lives until distlock exits.
    let parent = unsafe { libc::getpid() };
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // distlock died before the prctl: do not start the command at all.
            if libc::getppid() != parent {
                return Err(std::io::Error::other("distlock exited"));
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn terminate_with_parent(_command: &mut tokio::process::Command) {}

/// Passes a signal distlock caught on to the command's process group. Ctrl-Z
/// (SIGTSTP) reaches only the terminal's foreground group, which is distlock's, so it
/// stops the command's group too and then distlock itself, as the default action
/// would have; `fg` continues distlock (SIGCONT), which continues the command.
fn forward(pgid: u32, signo: i32) {
    signal_group(pgid, signo);
    if signo == libc::SIGTSTP {
        stop_self();
    }
}

/// Stops distlock (SIGSTOP), as an uncaught SIGTSTP would.
pub(crate) fn stop_self() {
    // SAFETY: raise(3) has no memory-safety preconditions.
    unsafe {
        libc::raise(libc::SIGSTOP);
    }
}

/// Sends `signo` to the process group `pgid` (the command and its children).
fn signal_group(pgid: u32, signo: i32) {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return;
    };
    // SAFETY: kill(2) has no memory-safety preconditions. The group is ours: its leader
    // has not been reaped yet, so the id cannot have been reused.
    unsafe {
        libc::kill(-pgid, signo);
    }
}

/// The shell's convention: the exit code, or 128+N for a death by signal N.
fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(signo)) => u8::try_from(128 + (signo & 0x7f)).unwrap_or(255),
        (None, None) => 1,
    }
}

fn wait_error(e: std::io::Error) -> CliError {
    CliError::failed(format!("cannot wait for the command: {e}"))
}

/// Maps a failure to connect or acquire in `mode` onto exec's exit codes.
fn lock_error(error: LockError, mode: Mode, key: &LockKey) -> CliError {
    let code = match &error {
        LockError::Timeout { .. } => EXIT_NOT_ACQUIRED,
        LockError::PermitMismatch { .. } => EXIT_PERMIT_MISMATCH,
        LockError::Config { .. }
        | LockError::InvalidKey { .. }
        | LockError::InvalidOptions { .. }
        | LockError::Unsupported { .. } => CliError::USAGE,
        _ => EXIT_UNREACHABLE,
    };
    let message = match &error {
        LockError::Timeout { waited, .. } => format!(
            "{} (waited {})",
            mode.describe(&format!("{:?}", key.as_str())),
            duration::format(*waited)
        ),
        _ => crate::error::describe(&error),
    };
    CliError::with_code(message, code)
}

/// Prints one `distlock: …` line on stderr, control characters escaped: a message can
/// carry a server's error text.
pub(crate) fn warn(message: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "distlock: {}", escape::line(message));
}

/// SIGINT, SIGTERM and SIGHUP, caught from before the lock is requested, so that none
/// of them kills distlock while it holds the lock; and SIGTSTP and SIGCONT, so that
/// Ctrl-Z and `fg` stop and continue the command with distlock.
pub(crate) struct Signals {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
    stop: Signal,
    resume: Signal,
}

impl Signals {
    pub(crate) fn new() -> Result<Self, CliError> {
        let listen = |kind| {
            signal(kind).map_err(|e| CliError::failed(format!("cannot handle signals: {e}")))
        };
        Ok(Signals {
            interrupt: listen(SignalKind::interrupt())?,
            terminate: listen(SignalKind::terminate())?,
            hangup: listen(SignalKind::hangup())?,
            stop: listen(SignalKind::from_raw(libc::SIGTSTP))?,
            resume: listen(SignalKind::from_raw(libc::SIGCONT))?,
        })
    }

    /// The next signal's number.
    pub(crate) async fn next(&mut self) -> i32 {
        tokio::select! {
            _ = self.interrupt.recv() => libc::SIGINT,
            _ = self.terminate.recv() => libc::SIGTERM,
            _ = self.hangup.recv() => libc::SIGHUP,
            _ = self.stop.recv() => libc::SIGTSTP,
            _ = self.resume.recv() => libc::SIGCONT,
        }
    }
}

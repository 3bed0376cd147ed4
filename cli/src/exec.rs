//! `distlock exec`: runs a command while holding a lock, like `flock(1)`,
//! `etcdctl lock` and `consul lock`, on any backend.
//!
//! The command runs in its own process group, so that a lost lock, or a signal sent to
//! `distlock`, reaches every process of a `sh -c` pipeline, and a terminal's Ctrl-C
//! reaches it once (forwarded by `distlock`), not twice.

use std::process::ExitStatus;
use std::time::Duration;

use clap::Args;
use distlock::{
    AutoRenew, LeaseState, LockError, LockGuard, LockKey, LockOptions, WaitOrder, WaitPolicy,
};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::time::Instant;

use crate::duration;
use crate::error::CliError;

/// Exit code: the lock was not acquired within `--wait` (at once with `--no-wait`).
/// `EX_TEMPFAIL` from sysexits.h: "try again later", what a cron job wants to hear.
pub const EXIT_NOT_ACQUIRED: u8 = 75;
/// Exit code: the backend could not be reached or failed before the command started.
/// `EX_UNAVAILABLE` from sysexits.h.
pub const EXIT_UNREACHABLE: u8 = 69;
/// Exit code: the lock was lost while the command ran, and the command was terminated.
/// As `timeout(1)` exits 124 when it stopped the command.
pub const EXIT_LOCK_LOST: u8 = 124;
/// Exit code: the command was found but could not be run (as in shells).
pub const EXIT_CANNOT_RUN: u8 = 126;
/// Exit code: the command was not found (as in shells).
pub const EXIT_NOT_FOUND: u8 = 127;

/// How long `exec` waits for the release after the command ended.
const RELEASE_PATIENCE: Duration = Duration::from_secs(10);

/// Arguments of `distlock exec`.
#[derive(Debug, Args)]
#[command(after_help = "\
Exit codes:
  N      the command's own exit code (128+S if it was killed by signal S)
  2      usage or configuration error (bad flag, URL, key or duration)
  69     backend unreachable (or failing) before the command started
  75     lock not acquired within --wait (at once with --no-wait)
  124    lock lost while the command ran; the command was terminated
  126    command not executable; 127 command not found
  130/143/129  distlock got SIGINT/SIGTERM/SIGHUP while still waiting for the lock

The command gets DISTLOCK_KEY, DISTLOCK_FENCING_TOKEN and DISTLOCK_BACKEND in its
environment and runs in its own process group. SIGINT, SIGTERM and SIGHUP sent to
distlock are forwarded to that group. If the lock is lost, the group gets SIGTERM, then
SIGKILL after --kill-after. The lock is released when the command ends. If distlock
itself is killed with -9, the lock is freed when its lease (--ttl) or session ends.")]
pub struct ExecArgs {
    #[command(flatten)]
    backend: crate::LockBackendArgs,
    /// Lease time-to-live, renewed every third of it while the command runs; a crashed
    /// distlock frees the lock after at most this long.
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
    /// hands off a little faster but lets one waiter lose for seconds.
    #[arg(long)]
    no_fifo: bool,
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
    let wait = match (args.no_wait, args.wait) {
        (true, _) => WaitPolicy::NoWait,
        (false, Some(d)) if d.is_zero() => WaitPolicy::NoWait,
        (false, Some(d)) => WaitPolicy::Timeout(d),
        (false, None) => WaitPolicy::Forever,
    };
    let options = LockOptions::new(args.ttl)
        .with_wait(wait)
        .with_auto_renew(AutoRenew::new());
    options
        .validate()
        .map_err(|e| CliError::usage(format!("invalid --ttl: {e}")))?;
    let mut signals = Signals::new()?;

    let locks = distlock::connect(&args.backend.backend)
        .await
        .map_err(lock_error)?;
    let backend_name = locks.info().name;
    // Waiting execs are served in arrival order wherever the backend can promise it
    // (README, "Operators"): a cron job must not starve behind newer ones.
    let options = if !args.no_fifo && locks.info().capabilities.fifo.is_supported() {
        options.with_order(WaitOrder::Fifo)
    } else {
        options
    };
    let started = Instant::now();
    let acquiring = locks.acquire(&key, &options);
    tokio::pin!(acquiring);
    let guard = loop {
        tokio::select! {
            acquired = &mut acquiring => break acquired.map_err(lock_error)?,
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
    let waited = started.elapsed();
    let token = guard.fencing_token();

    let outcome = supervise(&args, &guard, &mut signals).await;
    let held = guard.lease().acquired_at().elapsed();
    let renewals = guard.monitor().renewals();
    // Bounded: a backend that stopped answering must not keep distlock (and a cron
    // slot) waiting; the lease then runs out on its own.
    let release = match tokio::time::timeout(RELEASE_PATIENCE, guard.release()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!(
            "no answer within {}",
            duration::format(RELEASE_PATIENCE)
        )),
    };
    if let Err(e) = release {
        warn(&format!(
            "could not release lock {:?} ({e}); it is freed when its lease runs out",
            args.key
        ));
    }
    let code = match &outcome {
        Ok(Ended::Exited(status)) => exit_code(*status),
        Ok(Ended::Lost) => EXIT_LOCK_LOST,
        Err(e) => e.exit_code(),
    };
    if args.verbose {
        warn(&format!(
            "backend={backend_name} key={:?} fencing_token={token} waited={} held={} renewals={renewals} exit={code}",
            args.key,
            duration::format(waited),
            duration::format(held),
        ));
    }
    match outcome {
        Ok(_) if code == 0 => Ok(()),
        Ok(_) => Err(CliError::silent(code)),
        Err(e) => Err(e),
    }
}

/// How the command's run ended.
enum Ended {
    /// It exited (or was killed by a signal we forwarded).
    Exited(ExitStatus),
    /// The lock was lost; it was terminated.
    Lost,
}

/// Spawns the command and waits for it, forwarding signals and enforcing the lock.
async fn supervise(
    args: &ExecArgs,
    guard: &LockGuard,
    signals: &mut Signals,
) -> Result<Ended, CliError> {
    let (program, rest) = args
        .command
        .split_first()
        .ok_or_else(|| CliError::usage("no command given after --"))?;
    let mut command = tokio::process::Command::new(program);
    command
        .args(rest)
        .env("DISTLOCK_KEY", &args.key)
        .env(
            "DISTLOCK_FENCING_TOKEN",
            guard.fencing_token().get().to_string(),
        )
        .env("DISTLOCK_BACKEND", &args.backend.backend)
        .process_group(0);
    terminate_with_parent(&mut command);
    // Do not start a command the lock can no longer protect, or that was called off
    // between the grant and now.
    if guard.state() == LeaseState::Lost {
        return Ok(Ended::Lost);
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
    let Some(pgid) = child.id() else {
        // Already reaped: nothing to supervise.
        return Ok(Ended::Exited(child.wait().await.map_err(wait_error)?));
    };
    let lost = guard.lost();
    tokio::pin!(lost);
    loop {
        tokio::select! {
            status = child.wait() => return Ok(Ended::Exited(status.map_err(wait_error)?)),
            signo = signals.next() => forward(pgid, signo),
            () = &mut lost => break,
        }
    }

    warn(&format!(
        "lock {:?} lost while the command ran; sending SIGTERM to it",
        args.key
    ));
    signal_group(pgid, libc::SIGTERM);
    let grace = tokio::time::sleep(args.kill_after);
    tokio::pin!(grace);
    loop {
        tokio::select! {
            status = child.wait() => {
                status.map_err(wait_error)?;
                return Ok(Ended::Lost);
            }
            signo = signals.next() => forward(pgid, signo),
            () = &mut grace => break,
        }
    }
    warn(&format!(
        "the command did not exit within {} of SIGTERM; sending SIGKILL",
        duration::format(args.kill_after)
    ));
    signal_group(pgid, libc::SIGKILL);
    child.wait().await.map_err(wait_error)?;
    Ok(Ended::Lost)
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
fn stop_self() {
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

/// Maps a failure to connect or acquire onto exec's exit codes.
fn lock_error(error: LockError) -> CliError {
    let code = match &error {
        LockError::Timeout { .. } => EXIT_NOT_ACQUIRED,
        LockError::Config { .. }
        | LockError::InvalidKey { .. }
        | LockError::InvalidOptions { .. }
        | LockError::Unsupported { .. } => CliError::USAGE,
        _ => EXIT_UNREACHABLE,
    };
    let message = match &error {
        LockError::Timeout { key, waited, .. } => format!(
            "lock {:?} is held by another owner (waited {})",
            key.as_str(),
            duration::format(*waited)
        ),
        _ => error.to_string(),
    };
    CliError::with_code(message, code)
}

/// Prints one `distlock: …` line on stderr.
fn warn(message: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "distlock: {message}");
}

/// SIGINT, SIGTERM and SIGHUP, caught from before the lock is requested, so that none
/// of them kills distlock while it holds the lock; and SIGTSTP and SIGCONT, so that
/// Ctrl-Z and `fg` stop and continue the command with distlock.
struct Signals {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
    stop: Signal,
    resume: Signal,
}

impl Signals {
    fn new() -> Result<Self, CliError> {
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
    async fn next(&mut self) -> i32 {
        tokio::select! {
            _ = self.interrupt.recv() => libc::SIGINT,
            _ = self.terminate.recv() => libc::SIGTERM,
            _ = self.hangup.recv() => libc::SIGHUP,
            _ = self.stop.recv() => libc::SIGTSTP,
            _ = self.resume.recv() => libc::SIGCONT,
        }
    }
}

//! A supervised child process: spawn with output captured to a log file,
//! signal the whole process tree, kill and reap on drop.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::OpenOptions;
use std::future::Future;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::{log_tail, ServerError, PROBE_INTERVAL, PROBE_TIMEOUT};

/// How to (re)launch a server process.
#[derive(Debug, Clone)]
pub(crate) struct Launch {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub cwd: PathBuf,
    /// `(uid, gid)` to switch to before exec, when running as root.
    pub run_as: Option<(u32, u32)>,
}

/// A server process owned by a handle. Dropping it kills the process tree.
#[derive(Debug)]
pub(crate) struct Supervised {
    server: &'static str,
    launch: Launch,
    log_path: PathBuf,
    child: Option<Child>,
    paused: bool,
    /// Signal for a graceful stop on drop (e.g. SIGINT for postgres); `None`
    /// means SIGKILL straight away.
    graceful_signal: Option<i32>,
}

impl Supervised {
    pub fn new(server: &'static str, launch: Launch, log_path: PathBuf) -> Self {
        Supervised {
            server,
            launch,
            log_path,
            child: None,
            paused: false,
            graceful_signal: None,
        }
    }

    pub fn with_graceful_signal(mut self, signal: i32) -> Self {
        self.graceful_signal = Some(signal);
        self
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    pub fn log_tail(&self) -> String {
        log_tail(&self.log_path)
    }

    /// Spawns the process (killing a previous one first). Its stdout and
    /// stderr are appended to the log file.
    pub fn spawn(&mut self) -> Result<(), ServerError> {
        self.kill();
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .map_err(|e| ServerError::io(format!("opening log {}", self.log_path.display()), e))?;
        // A marker so that restarts are visible in the log; failure to write
        // it is harmless.
        let _ = writeln!(
            log,
            "=== distlock test harness: starting {} ===",
            self.launch.program.display()
        );
        let log_err = log
            .try_clone()
            .map_err(|e| ServerError::io("duplicating the log file handle", e))?;
        let mut cmd = Command::new(&self.launch.program);
        cmd.args(&self.launch.args)
            .current_dir(&self.launch.cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err));
        if let Some((uid, gid)) = self.launch.run_as {
            cmd.gid(gid).uid(uid);
        }
        let child = cmd.spawn().map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                ServerError::NotInstalled {
                    what: self.launch.program.display().to_string(),
                    hint: format!("cannot execute it: {e}"),
                }
            } else {
                ServerError::io(format!("spawning {}", self.launch.program.display()), e)
            }
        })?;
        self.child = Some(child);
        self.paused = false;
        Ok(())
    }

    /// The process id while a process is owned (running, paused or exited but
    /// not yet noticed).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// If the process has exited, reaps it and returns its status.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => {
                self.child = None;
                self.paused = false;
                Some(status)
            }
            Ok(None) => None,
            Err(_) => None,
        }
    }

    /// True while the process is alive (a paused process is alive).
    pub fn is_running(&mut self) -> bool {
        self.exit_status();
        self.child.is_some()
    }

    pub fn is_paused(&self) -> bool {
        self.paused && self.child.is_some()
    }

    fn running_pid(&mut self) -> Result<i32, ServerError> {
        if !self.is_running() {
            return Err(ServerError::NotRunning {
                server: self.server,
            });
        }
        self.pid()
            .and_then(|p| i32::try_from(p).ok())
            .ok_or(ServerError::NotRunning {
                server: self.server,
            })
    }

    /// SIGSTOPs the process and all its descendants and waits until every thread of
    /// them is stopped.
    ///
    /// # Errors
    /// [`ServerError::NotRunning`] without a running process; [`ServerError::Probe`]
    /// when a thread still runs 5 s after the signal (the process stays marked paused,
    /// so `resume` still sends SIGCONT).
    pub fn pause(&mut self) -> Result<(), ServerError> {
        let pid = self.running_pid()?;
        // Stop the parent first so it cannot fork new children meanwhile.
        send_signal(pid, libc::SIGSTOP);
        let mut stopped = vec![pid];
        for d in descendants(pid) {
            send_signal(d, libc::SIGSTOP);
            stopped.push(d);
        }
        // Signal delivery is asynchronous: a thread that is running on
        // another CPU may still answer a request or two. Wait (bounded) until
        // every thread of every process is actually stopped; a pause that did not take
        // is an error, so a scenario never blames the backend for a running server.
        self.paused = true;
        let running = wait_stopped(&stopped, Duration::from_secs(5));
        if running.is_empty() {
            Ok(())
        } else {
            Err(ServerError::Probe {
                server: self.server,
                detail: format!("SIGSTOP did not stop pids {running:?} within 5 s"),
            })
        }
    }

    /// SIGCONTs the process and all its descendants.
    pub fn resume(&mut self) -> Result<(), ServerError> {
        let pid = self.running_pid()?;
        for d in descendants(pid) {
            send_signal(d, libc::SIGCONT);
        }
        send_signal(pid, libc::SIGCONT);
        self.paused = false;
        Ok(())
    }

    /// SIGKILLs the process tree and reaps the process. Idempotent.
    pub fn kill(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        self.paused = false;
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        let Ok(pid) = i32::try_from(child.id()) else {
            let _ = child.kill();
            let _ = child.wait();
            return;
        };
        // Freeze the parent so it forks nothing new, kill the descendants,
        // then the parent; the parent is our child and not yet reaped, so its
        // pid cannot have been reused.
        send_signal(pid, libc::SIGSTOP);
        let victims = descendants(pid);
        for d in &victims {
            send_signal(*d, libc::SIGKILL);
        }
        let _ = child.kill();
        let _ = child.wait();
        wait_gone(&victims, Duration::from_secs(5));
    }

    /// Asks the process to stop with its graceful signal (if any), waits up to
    /// `grace`, then kills whatever is left. Idempotent.
    pub fn shutdown(&mut self, grace: Duration) {
        if let (Some(signal), Ok(pid)) = (self.graceful_signal, self.running_pid()) {
            if self.paused {
                let _ = self.resume();
            }
            send_signal(pid, signal);
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline {
                if self.exit_status().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        self.kill();
    }

    /// Waits until `probe` succeeds, the process exits, or `timeout` passes.
    /// Each probe is bounded by [`PROBE_TIMEOUT`].
    pub async fn wait_ready<F, Fut>(
        &mut self,
        timeout: Duration,
        mut probe: F,
    ) -> Result<(), ServerError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<(), ServerError>>,
    {
        let started = Instant::now();
        loop {
            if let Some(status) = self.exit_status() {
                return Err(ServerError::Exited {
                    server: self.server,
                    status: status.to_string(),
                    log: self.log_path.clone(),
                    log_tail: self.log_tail(),
                });
            }
            if self.child.is_none() {
                return Err(ServerError::NotRunning {
                    server: self.server,
                });
            }
            let last_probe = match tokio::time::timeout(PROBE_TIMEOUT, probe()).await {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("probe timed out after {PROBE_TIMEOUT:?}"),
            };
            if started.elapsed() >= timeout {
                return Err(ServerError::StartTimeout {
                    server: self.server,
                    waited: started.elapsed(),
                    last_probe,
                    log: self.log_path.clone(),
                    log_tail: self.log_tail(),
                });
            }
            tokio::time::sleep(PROBE_INTERVAL).await;
        }
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.shutdown(Duration::from_secs(5));
    }
}

#[allow(unsafe_code)] // FFI: see the SAFETY notes
fn send_signal(pid: i32, signal: i32) {
    if pid <= 0 {
        return;
    }
    // SAFETY: kill(2) has no memory-safety preconditions; `pid` is positive,
    // so it addresses exactly one process, never a process group.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// `(state, ppid)` of a process from `/proc/<pid>/stat`.
fn proc_stat(pid: i32) -> Option<(char, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may itself contain spaces or
    // parentheses; everything after the last ')' is well-formed.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// All living descendants of `root`, found through `/proc`.
fn descendants(root: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if let Some((state, ppid)) = proc_stat(pid) {
            if state != 'Z' && state != 'X' {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(p) = stack.pop() {
        if let Some(kids) = children.get(&p) {
            for &k in kids {
                out.push(k);
                stack.push(k);
            }
        }
    }
    out
}

/// True when every thread of `pid` is stopped (or the process is gone).
fn all_threads_stopped(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.flatten().all(|task| {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            return true;
        };
        stat.rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .is_none_or(|state| matches!(state, "T" | "t" | "Z" | "X"))
    })
}

/// Waits (bounded) until every thread of every pid is stopped; returns the pids with a
/// thread still running when the bound passed (empty: all stopped).
fn wait_stopped(pids: &[i32], limit: Duration) -> Vec<i32> {
    let deadline = Instant::now() + limit;
    loop {
        let running: Vec<i32> = pids
            .iter()
            .copied()
            .filter(|&p| !all_threads_stopped(p))
            .collect();
        if running.is_empty() || Instant::now() >= deadline {
            return running;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits (bounded) until every pid is gone or a zombie.
fn wait_gone(pids: &[i32], limit: Duration) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        let alive = pids
            .iter()
            .any(|&p| matches!(proc_stat(p), Some((s, _)) if s != 'Z' && s != 'X'));
        if !alive {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

//! The server's CPU time, read before and after each turn: Redis tells its own
//! (`INFO cpu`); for another server listening on this machine the kernel does (the
//! `/proc` times of the process that listens on the URL's port and of its children,
//! which for Postgres are the backends serving each connection). Elsewhere it is not
//! known, and the report says n/a.

use std::collections::HashMap;
use std::time::Duration;

/// Where the server's CPU time comes from.
pub(crate) enum ServerCpu {
    /// `INFO cpu` of the Redis server at this URL.
    Redis(String),
    /// The process (and its children) listening on the URL's port on this machine.
    Process(u32),
    /// Not known: a remote server, several servers (Sentinel, Cluster), or none.
    Unknown,
}

impl ServerCpu {
    /// Finds how to read the CPU time of the server at `url`: `redis` says it is a
    /// single Redis server; `local` that the backend has a server process at all.
    pub(crate) fn locate(url: &str, redis: bool, local: bool) -> ServerCpu {
        if redis {
            return ServerCpu::Redis(url.to_owned());
        }
        if !local {
            return ServerCpu::Unknown;
        }
        match loopback_port(url).and_then(listener_pid) {
            Some(pid) => ServerCpu::Process(pid),
            None => ServerCpu::Unknown,
        }
    }

    /// The server's CPU time (user + system) so far, if known.
    pub(crate) async fn read(&self) -> Option<Duration> {
        match self {
            ServerCpu::Redis(url) => crate::redis::server_cpu(url).await.ok(),
            ServerCpu::Process(pid) => tree_cpu(*pid),
            ServerCpu::Unknown => None,
        }
    }
}

/// The port of `url` when its (first) host is this machine's loopback.
fn loopback_port(url: &str) -> Option<u16> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?', '#']).next()?;
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let first = host_port.split(',').next()?;
    let (host, port) = first.rsplit_once(':')?;
    let loopback = matches!(host, "127.0.0.1" | "localhost" | "[::1]");
    loopback.then(|| port.parse().ok()).flatten()
}

/// The process listening on TCP `port` (IPv4 or IPv6), found through the socket's
/// inode in `/proc/net/tcp*` and the processes' open descriptors.
fn listener_pid(port: u16) -> Option<u32> {
    let wanted = format!(":{port:04X}");
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // local_address, state (0A: LISTEN), …, inode (the tenth field).
            if fields.len() > 9 && fields[1].ends_with(&wanted) && fields[3] == "0A" {
                inodes.push(format!("socket:[{}]", fields[9]));
            }
        }
    }
    if inodes.is_empty() {
        return None;
    }
    for (pid, dir) in processes()? {
        let Ok(fds) = std::fs::read_dir(dir.join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(link) = std::fs::read_link(fd.path()) {
                if inodes.iter().any(|i| link.as_os_str() == i.as_str()) {
                    return Some(pid);
                }
            }
        }
    }
    None
}

/// Every process's id and `/proc` directory.
fn processes() -> Option<impl Iterator<Item = (u32, std::path::PathBuf)>> {
    let entries = std::fs::read_dir("/proc").ok()?;
    Some(entries.flatten().filter_map(|entry| {
        let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
        Some((pid, entry.path()))
    }))
}

/// CPU time of `root` and every live descendant, with the reaped children each
/// accounts for (`cutime`, `cstime`), so a Postgres backend that ended mid-turn still
/// counts.
fn tree_cpu(root: u32) -> Option<Duration> {
    let mut parent_and_ticks: HashMap<u32, (u32, u64)> = HashMap::new();
    for (pid, dir) in processes()? {
        let Ok(stat) = std::fs::read_to_string(dir.join("stat")) else {
            continue;
        };
        // Fields after the command name (which may hold spaces) in parentheses:
        // state, ppid, …; utime, stime, cutime, cstime are the 14th to 17th fields.
        let Some((_, after)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = after.split_whitespace().collect();
        let number = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
        if let (Some(ppid), Some(u), Some(s), Some(cu), Some(cs)) =
            (number(1), number(11), number(12), number(13), number(14))
        {
            parent_and_ticks.insert(pid, (u32::try_from(ppid).unwrap_or(0), u + s + cu + cs));
        }
    }
    parent_and_ticks.get(&root)?;
    let mut total = 0;
    for (&pid, &(_, ticks)) in &parent_and_ticks {
        // Walk up to the root (or the top): a descendant counts.
        let mut at = pid;
        let mut steps = 0;
        while at != root && steps < 64 {
            match parent_and_ticks.get(&at) {
                Some(&(parent, _)) if parent != 0 => at = parent,
                _ => break,
            }
            steps += 1;
        }
        if at == root {
            total += ticks;
        }
    }
    Some(Duration::from_secs_f64(
        total as f64 / clock_ticks_per_second(),
    ))
}

/// The kernel's clock ticks per second, the unit of `/proc/<pid>/stat`'s times.
#[allow(unsafe_code)] // FFI: see the SAFETY note
fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf reads a constant of the system; it has no pointers.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_ports() {
        assert_eq!(
            loopback_port("postgres://u:p@127.0.0.1:5433/db"),
            Some(5433)
        );
        assert_eq!(
            loopback_port("zookeeper://localhost:2181,other:2181"),
            Some(2181)
        );
        assert_eq!(loopback_port("etcd://10.0.0.1:2379"), None);
        assert_eq!(loopback_port("memory://"), None);
    }

    #[test]
    fn this_process_has_cpu_time() {
        let me = std::process::id();
        assert!(tree_cpu(me).is_some());
    }
}

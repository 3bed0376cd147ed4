//! [`FaultProxy`]: a TCP fault-injection proxy on loopback, between lock clients and a
//! real server (Redis, Postgres, ZooKeeper), to inject latency, partitions, lost
//! replies and abrupt disconnects.
//!
//! Point the client under test at [`FaultProxy::local_addr`] instead of the server. Every
//! accepted connection gets its own upstream connection. Fault modes are shared by all
//! connections and take effect immediately, on open connections too: each forwarded
//! chunk is checked against the mode when it is read and again when it is due for
//! delivery. Bytes a fault discards are gone for good: healing does not replay them.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::{sleep, sleep_until, Instant};

/// Size of one forwarded chunk, at most.
const CHUNK: usize = 16 * 1024;
/// Chunks in flight per direction (delayed by latency) before reading pauses.
const IN_FLIGHT: usize = 256;

/// The fault modes, shared by the accept loop and every connection.
#[derive(Clone, Copy, Debug, Default)]
struct Mode {
    latency: Duration,
    blackhole: bool,
    drop_replies: bool,
    refuse: bool,
    /// Bumped by every reset; connections started under an older epoch close abruptly.
    epoch: u64,
}

/// One direction of a proxied connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    /// Client to server: requests.
    Up,
    /// Server to client: replies.
    Down,
}

impl Mode {
    /// Whether bytes (and end of stream) currently flow in `dir`.
    fn passes(&self, dir: Dir) -> bool {
        let lost = self.blackhole || (dir == Dir::Down && self.drop_replies);
        !lost
    }
}

/// A TCP proxy on `127.0.0.1` that forwards to one upstream address and injects faults.
///
/// Cloning gives another handle to the same proxy. When the last handle is dropped the
/// proxy stops: the listener closes and every proxied connection is closed, with no
/// task left behind.
#[derive(Clone, Debug)]
pub struct FaultProxy {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    local_addr: SocketAddr,
    mode: watch::Sender<Mode>,
    connections: Arc<watch::Sender<usize>>,
    accept_loop: AbortHandle,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The accept loop owns the listener and the JoinSet of connection tasks; dropping
        // it (by aborting its task) closes the listener and aborts every connection task.
        self.accept_loop.abort();
    }
}

impl FaultProxy {
    /// Starts a proxy to `upstream`, as [`FaultProxy::start`], on a process-wide runtime
    /// of its own rather than the caller's. It plays the network, so it outlives the
    /// runtime a client runs on: a test that shuts a client's runtime down to play its
    /// process exiting still sees that client's last requests reach the server.
    ///
    /// # Errors
    /// Binding the listener failed, or the proxies' runtime could not be made.
    pub async fn start_detached(upstream: SocketAddr) -> io::Result<FaultProxy> {
        static NETWORK: std::sync::OnceLock<io::Result<tokio::runtime::Runtime>> =
            std::sync::OnceLock::new();
        let network = NETWORK.get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("fault-proxy")
                .enable_all()
                .build()
        });
        let network = network
            .as_ref()
            .map_err(|e| io::Error::new(e.kind(), format!("the fault proxies' runtime: {e}")))?;
        network
            .spawn(FaultProxy::start(upstream))
            .await
            .map_err(|e| io::Error::other(format!("starting a fault proxy: {e}")))?
    }

    /// Listens on `127.0.0.1:0` and forwards every accepted connection to `upstream`,
    /// cleanly until a fault is set. Must be called within a Tokio runtime.
    ///
    /// The upstream is dialled per accepted connection; if that fails, the client's
    /// connection is reset. Nothing is checked about `upstream` here.
    ///
    /// # Errors
    /// Binding the listener failed.
    pub async fn start(upstream: SocketAddr) -> io::Result<FaultProxy> {
        let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
        let local_addr = listener.local_addr()?;
        let (mode, mode_rx) = watch::channel(Mode::default());
        let connections = Arc::new(watch::channel(0).0);
        let task = tokio::spawn(accept_loop(
            listener,
            upstream,
            mode_rx,
            Arc::clone(&connections),
        ));
        Ok(FaultProxy {
            inner: Arc::new(Inner {
                local_addr,
                mode,
                connections,
                accept_loop: task.abort_handle(),
            }),
        })
    }

    /// The address clients connect to instead of the upstream server.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr
    }

    /// Delays every forwarded chunk by `one_way`, in both directions, so a round trip
    /// takes at least twice that. Order within a direction is kept. Applies to chunks
    /// read from now on; `Duration::ZERO` turns latency off.
    pub fn set_latency(&self, one_way: Duration) {
        self.inner.mode.send_modify(|m| m.latency = one_way);
    }

    /// Partitions client from server: connections stay open, but bytes in either
    /// direction are read and discarded, including bytes already read but not yet
    /// delivered. New connections are accepted (and dialled upstream) but get nothing
    /// either. An end of stream is held back until the direction is open again, as TCP
    /// would retransmit it; a connection error still closes both sides. Until [`heal`].
    ///
    /// [`heal`]: FaultProxy::heal
    pub fn blackhole(&self) {
        self.inner.mode.send_modify(|m| m.blackhole = true);
    }

    /// Loses replies: client-to-server bytes are forwarded, server-to-client bytes are
    /// discarded, so requests take effect but their replies never arrive. The server's
    /// end of stream is held back like under [`blackhole`]. Until [`heal`].
    ///
    /// [`blackhole`]: FaultProxy::blackhole
    /// [`heal`]: FaultProxy::heal
    pub fn drop_replies(&self) {
        self.inner.mode.send_modify(|m| m.drop_replies = true);
    }

    /// Closes every current connection abruptly, both the client's and the upstream
    /// side, with a TCP reset (`SO_LINGER` 0). Undelivered bytes are lost. Connections
    /// accepted afterwards are unaffected (see [`refuse_new`]).
    ///
    /// [`refuse_new`]: FaultProxy::refuse_new
    pub fn reset_all(&self) {
        self.inner.mode.send_modify(|m| m.epoch += 1);
    }

    /// While `refuse` is true, new connections are accepted and immediately reset, as by
    /// a dead host; nothing is dialled upstream. Open connections are unaffected.
    pub fn refuse_new(&self, refuse: bool) {
        self.inner.mode.send_modify(|m| m.refuse = refuse);
    }

    /// Cuts the client off, like a crashed or isolated process: [`reset_all`] and
    /// [`refuse_new`]`(true)` at once, with no window for a connection to slip through.
    ///
    /// [`reset_all`]: FaultProxy::reset_all
    /// [`refuse_new`]: FaultProxy::refuse_new
    pub fn cut(&self) {
        self.inner.mode.send_modify(|m| {
            m.refuse = true;
            m.epoch += 1;
        });
    }

    /// Back to clean forwarding: no latency, no blackhole, no dropped replies, new
    /// connections accepted. Connections that survived stay open and flow again; bytes
    /// discarded meanwhile are not replayed.
    pub fn heal(&self) {
        self.inner.mode.send_modify(|m| {
            let epoch = m.epoch;
            *m = Mode {
                epoch,
                ..Mode::default()
            };
        });
    }

    /// The number of proxied connections currently open (accepted and not yet closed;
    /// refused connections never count).
    pub fn connections(&self) -> usize {
        *self.inner.connections.borrow()
    }

    /// Waits until exactly `n` proxied connections are open; returns at once if they
    /// already are. Wrap it in a timeout: it waits forever otherwise.
    pub async fn wait_connections(&self, n: usize) {
        let mut rx = self.inner.connections.subscribe();
        // The sender lives in `self`, so this cannot fail while we wait.
        let _ = rx.wait_for(|&c| c == n).await;
    }
}

/// Counts one open connection for as long as it lives.
struct Counted(Arc<watch::Sender<usize>>);

impl Counted {
    fn new(counter: &Arc<watch::Sender<usize>>) -> Self {
        counter.send_modify(|c| *c += 1);
        Counted(Arc::clone(counter))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.send_modify(|c| *c = c.saturating_sub(1));
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    mode: watch::Receiver<Mode>,
    connections: Arc<watch::Sender<usize>>,
) {
    // Dropped with this future, which aborts every connection task.
    let mut tasks = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    let now = *mode.borrow();
                    if now.refuse {
                        close_abruptly(client);
                        continue;
                    }
                    let counted = Counted::new(&connections);
                    tasks.spawn(serve(client, upstream, mode.clone(), now.epoch, counted));
                }
                // E.g. out of file descriptors: back off instead of spinning.
                Err(_) => sleep(Duration::from_millis(10)).await,
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
}

/// Proxies one connection until both directions end, either side fails, or a reset.
async fn serve(
    mut client: TcpStream,
    upstream: SocketAddr,
    mode: watch::Receiver<Mode>,
    epoch: u64,
    _counted: Counted,
) {
    let mut reset_rx = mode.clone();
    // Also fires if the proxy is gone, which ends the connection the same way.
    let reset = reset_rx.wait_for(|m| m.epoch != epoch);
    tokio::pin!(reset);

    let mut server = tokio::select! {
        dialled = TcpStream::connect(upstream) => match dialled {
            Ok(server) => server,
            Err(_) => return close_abruptly(client),
        },
        _ = &mut reset => return close_abruptly(client),
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);

    let clean = {
        let (client_read, client_write) = client.split();
        let (server_read, server_write) = server.split();
        let up = pump(client_read, server_write, mode.clone(), Dir::Up);
        let down = pump(server_read, client_write, mode, Dir::Down);
        tokio::select! {
            done = async { tokio::try_join!(up, down) } => done.is_ok(),
            _ = &mut reset => false,
        }
    };
    if !clean {
        close_abruptly(client);
        close_abruptly(server);
    }
}

/// Forwards `from` to `to` in `dir`, applying the mode per chunk, until end of stream
/// (propagated as a write shutdown) or an error.
async fn pump<R, W>(mut from: R, mut to: W, mode: watch::Receiver<Mode>, dir: Dir) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    // `None` marks end of stream. The deadline keeps latency from compounding.
    let (queue, mut due) = mpsc::channel::<(Instant, Option<Vec<u8>>)>(IN_FLIGHT);
    let read_mode = mode.clone();
    let reading = async move {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = from.read(&mut buf).await?;
            let now = *read_mode.borrow();
            let at = Instant::now() + now.latency;
            if n == 0 {
                let _ = queue.send((at, None)).await;
                return Ok::<(), io::Error>(());
            }
            if now.passes(dir) && queue.send((at, Some(buf[..n].to_vec()))).await.is_err() {
                return Ok(());
            }
        }
    };
    let mut write_mode = mode;
    let writing = async move {
        while let Some((at, chunk)) = due.recv().await {
            sleep_until(at).await;
            match chunk {
                Some(bytes) => {
                    if write_mode.borrow().passes(dir) {
                        to.write_all(&bytes).await?;
                    }
                }
                None => {
                    if write_mode.wait_for(|m| m.passes(dir)).await.is_err() {
                        return Err(io::Error::other("fault proxy stopped"));
                    }
                    return to.shutdown().await;
                }
            }
        }
        Ok(())
    };
    tokio::try_join!(reading, writing).map(|_| ())
}

/// Closes `stream` with a TCP reset rather than a FIN, if the OS lets us.
fn close_abruptly(stream: TcpStream) {
    // A zero linger never blocks on close (the reason `set_linger` is deprecated does not
    // apply); `set_zero_linger` would need tokio >= 1.50.
    #[allow(deprecated)]
    let _ = stream.set_linger(Some(Duration::ZERO));
    drop(stream);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Long enough for anything that should happen, on a loaded machine.
    const SHOULD: Duration = Duration::from_secs(10);
    /// How long we wait to conclude that nothing arrives.
    const SHOULD_NOT: Duration = Duration::from_millis(300);

    /// An echo server on loopback that also reports every chunk it receives.
    async fn echo_server() -> (SocketAddr, mpsc::UnboundedReceiver<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (seen, seen_rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = conn.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        let _ = seen.send(buf[..n].to_vec());
                        if conn.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        (addr, seen_rx)
    }

    async fn setup() -> (FaultProxy, mpsc::UnboundedReceiver<Vec<u8>>) {
        let (addr, seen) = echo_server().await;
        (FaultProxy::start(addr).await.unwrap(), seen)
    }

    async fn connect(proxy: &FaultProxy) -> TcpStream {
        TcpStream::connect(proxy.local_addr()).await.unwrap()
    }

    /// Sends `msg` and asserts exactly it comes back.
    async fn round_trip(conn: &mut TcpStream, msg: &[u8]) {
        conn.write_all(msg).await.unwrap();
        let mut got = vec![0u8; msg.len()];
        tokio::time::timeout(SHOULD, conn.read_exact(&mut got))
            .await
            .expect("echo timed out")
            .unwrap();
        assert_eq!(got, msg);
    }

    /// Sends `msg` and asserts nothing comes back for a while.
    async fn no_reply(conn: &mut TcpStream, msg: &[u8]) {
        conn.write_all(msg).await.unwrap();
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(SHOULD_NOT, conn.read(&mut buf)).await;
        assert!(read.is_err(), "expected silence, got {read:?}");
    }

    /// Asserts the server received exactly `want` (in however many chunks).
    async fn server_got(seen: &mut mpsc::UnboundedReceiver<Vec<u8>>, want: &[u8]) {
        let mut got = Vec::new();
        while got.len() < want.len() {
            let chunk = tokio::time::timeout(SHOULD, seen.recv()).await;
            got.extend(chunk.expect("server got nothing").unwrap());
        }
        assert_eq!(got, want);
    }

    /// Asserts the connection is closed: end of stream or an error, not silence.
    async fn closed(conn: &mut TcpStream) {
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(SHOULD, conn.read(&mut buf)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "expected a closed connection, got {read:?}"
        );
    }

    async fn wait_connections(proxy: &FaultProxy, n: usize) {
        tokio::time::timeout(SHOULD, proxy.wait_connections(n))
            .await
            .unwrap_or_else(|_| panic!("{} connections, expected {n}", proxy.connections()));
    }

    #[tokio::test]
    async fn forwards_cleanly_and_counts_connections() {
        let (proxy, mut seen) = setup().await;
        assert_eq!(proxy.connections(), 0);
        let mut a = connect(&proxy).await;
        round_trip(&mut a, b"hello").await;
        server_got(&mut seen, b"hello").await;
        let mut b = connect(&proxy).await;
        round_trip(&mut b, b"world").await;
        assert_eq!(proxy.connections(), 2);

        // A half-close reaches the server, whose close comes back as end of stream.
        a.shutdown().await.unwrap();
        let mut rest = Vec::new();
        tokio::time::timeout(SHOULD, a.read_to_end(&mut rest))
            .await
            .unwrap()
            .unwrap();
        assert!(rest.is_empty());
        wait_connections(&proxy, 1).await;
        drop(b);
        wait_connections(&proxy, 0).await;
    }

    #[tokio::test]
    async fn latency_delays_each_direction_in_order() {
        let (proxy, _seen) = setup().await;
        let mut conn = connect(&proxy).await;
        round_trip(&mut conn, b"warm").await;
        let one_way = Duration::from_millis(150);
        proxy.set_latency(one_way);

        let started = std::time::Instant::now();
        round_trip(&mut conn, b"ping").await;
        let took = started.elapsed();
        assert!(took >= 2 * one_way, "round trip took {took:?}");
        assert!(took < SHOULD, "round trip took {took:?}");

        // Several writes in flight at once still arrive in order.
        let msg: Vec<u8> = (0..200u8).collect();
        for part in msg.chunks(10) {
            conn.write_all(part).await.unwrap();
        }
        let mut got = vec![0u8; msg.len()];
        tokio::time::timeout(SHOULD, conn.read_exact(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, msg);

        proxy.heal();
        let started = std::time::Instant::now();
        round_trip(&mut conn, b"fast").await;
        assert!(started.elapsed() < SHOULD);
    }

    #[tokio::test]
    async fn blackhole_silences_then_heal_restores_without_replay() {
        let (proxy, mut seen) = setup().await;
        let mut old = connect(&proxy).await;
        round_trip(&mut old, b"before").await;
        server_got(&mut seen, b"before").await;

        proxy.blackhole();
        no_reply(&mut old, b"lost").await;
        let mut during = connect(&proxy).await;
        no_reply(&mut during, b"lost too").await;
        assert!(seen.try_recv().is_err(), "server saw blackholed bytes");

        proxy.heal();
        // Exactly the new bytes come back: the discarded ones are not replayed.
        round_trip(&mut old, b"after").await;
        round_trip(&mut during, b"again").await;
        let mut fresh = connect(&proxy).await;
        round_trip(&mut fresh, b"fresh").await;
        assert_eq!(proxy.connections(), 3);
    }

    #[tokio::test]
    async fn drop_replies_applies_requests_but_loses_replies() {
        let (proxy, mut seen) = setup().await;
        let mut conn = connect(&proxy).await;
        round_trip(&mut conn, b"ok").await;
        server_got(&mut seen, b"ok").await;

        proxy.drop_replies();
        no_reply(&mut conn, b"set key").await;
        server_got(&mut seen, b"set key").await;

        proxy.heal();
        round_trip(&mut conn, b"later").await;
    }

    #[tokio::test]
    async fn cut_resets_open_connections_and_refuses_new_until_healed() {
        let (proxy, _seen) = setup().await;
        let mut conn = connect(&proxy).await;
        round_trip(&mut conn, b"hi").await;

        proxy.cut();
        closed(&mut conn).await;
        wait_connections(&proxy, 0).await;
        // The listener still accepts, then resets at once.
        let mut refused = connect(&proxy).await;
        closed(&mut refused).await;
        assert_eq!(proxy.connections(), 0);

        proxy.heal();
        let mut fresh = connect(&proxy).await;
        round_trip(&mut fresh, b"back").await;
        assert_eq!(proxy.connections(), 1);
    }

    #[tokio::test]
    async fn reset_all_closes_open_connections_only() {
        let (proxy, _seen) = setup().await;
        let mut conn = connect(&proxy).await;
        round_trip(&mut conn, b"hi").await;

        proxy.reset_all();
        closed(&mut conn).await;
        let mut fresh = connect(&proxy).await;
        round_trip(&mut fresh, b"still serving").await;
    }

    #[tokio::test]
    async fn unreachable_upstream_closes_the_client() {
        // Bind then drop a listener to get a port nobody listens on.
        let port = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let proxy = FaultProxy::start(port).await.unwrap();
        let mut conn = connect(&proxy).await;
        closed(&mut conn).await;
        wait_connections(&proxy, 0).await;
    }

    #[tokio::test]
    async fn dropping_the_proxy_closes_everything() {
        let (proxy, _seen) = setup().await;
        let addr = proxy.local_addr();
        let mut conn = connect(&proxy).await;
        round_trip(&mut conn, b"hi").await;

        let clone = proxy.clone();
        drop(proxy);
        round_trip(&mut conn, b"clone keeps it alive").await;
        drop(clone);
        closed(&mut conn).await;
        assert!(TcpStream::connect(addr).await.is_err(), "still listening");
    }
}

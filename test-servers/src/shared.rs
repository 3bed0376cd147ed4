//! Servers shared by every test of a process: started once, on first use, and stopped
//! when the process exits. The one place a test binary registers its `atexit` hook.

use std::any::Any;
use std::future::Future;
use std::sync::{Mutex, Once};

/// The servers kept until the process exits.
static KEPT: Mutex<Vec<Box<dyn Any + Send>>> = Mutex::new(Vec::new());

extern "C" fn stop_kept_servers() {
    // Dropping a handle stops its server and deletes its directory.
    if let Ok(mut kept) = KEPT.lock() {
        kept.clear();
    }
}

/// Starts a server with `start` on a runtime of its own (so that tests on any runtime,
/// or on none, can share it), keeps it until the process exits, and returns what
/// `read` takes from it (its port or URL, say). Call it from a `OnceLock` initialiser,
/// so that the server starts once per process:
///
/// ```no_run
/// use std::sync::OnceLock;
/// use distlock_test_servers::{shared_server, RedisServer};
///
/// fn shared_port() -> u16 {
///     static PORT: OnceLock<u16> = OnceLock::new();
///     *PORT.get_or_init(|| {
///         shared_server(RedisServer::start(), |server| match server {
///             Ok(server) => server.port(),
///             Err(e) => panic!("could not start redis-server: {e}"),
///         })
///     })
/// }
/// ```
///
/// Tests that kill, pause or restart a server start private ones instead.
///
/// # Panics
/// If `start` or `read` panics, or no thread or runtime can be made to start it on.
#[allow(unsafe_code)] // FFI: see the SAFETY note
pub fn shared_server<S, T>(
    start: impl Future<Output = S> + Send + 'static,
    read: impl FnOnce(&S) -> T,
) -> T
where
    S: Send + 'static,
{
    let server = std::thread::spawn(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("a runtime to start a shared server on: {e}"))
            .block_on(start)
    })
    .join()
    .unwrap_or_else(|_| panic!("starting a shared server panicked"));
    let value = read(&server);
    KEPT.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(Box::new(server));
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        // SAFETY: registers a plain `extern "C"` function with no captured state.
        unsafe {
            libc::atexit(stop_kept_servers);
        }
    });
    value
}

//! [`ServerControl`]: the one interface over every throwaway server, whichever
//! provider started it, so that fault tooling needs no per-server code.

use async_trait::async_trait;

use crate::process::Supervised;
use crate::ServerError;

/// What a test can do to one running server node: where it is, and the faults it
/// can suffer. Local servers support every action; a provider that cannot do one
/// (a container cannot be paused the way SIGSTOP pauses a process) answers
/// [`ServerError::Unsupported`], which fault scenarios report as a skip with its
/// reason.
#[async_trait]
pub trait ServerControl: Send + Sync {
    /// The URL a backend client connects to this server with, e.g.
    /// `redis://127.0.0.1:6379` (host and port are stable across restarts).
    fn url(&self) -> String;

    /// The TCP port on 127.0.0.1 that clients reach the server at.
    fn port(&self) -> u16;

    /// Kills the server abruptly, as in a crash (SIGKILL). Idempotent; never fails.
    fn kill(&mut self);

    /// Kills the server if it still runs, starts it again on the same port with
    /// the same data, and waits until it serves.
    ///
    /// # Errors
    /// [`ServerError::Exited`] or [`ServerError::StartTimeout`] with the log tail
    /// when it does not come back.
    async fn restart(&mut self) -> Result<(), ServerError>;

    /// Stops the server from answering while keeping its connections open
    /// (SIGSTOP), until [`resume`](Self::resume).
    ///
    /// # Errors
    /// [`ServerError::NotRunning`] after a kill; [`ServerError::Unsupported`]
    /// where the provider cannot pause.
    fn pause(&mut self) -> Result<(), ServerError>;

    /// Lets a paused server answer again (SIGCONT).
    ///
    /// # Errors
    /// As [`pause`](Self::pause).
    fn resume(&mut self) -> Result<(), ServerError>;

    /// The last lines of the server's log, for failure messages.
    fn logs(&self) -> String;

    /// Why this server cannot be paused and resumed, or `None` when it can (the
    /// default, true of every local process).
    fn pause_unsupported(&self) -> Option<String> {
        None
    }
}

/// A server that is one local process under [`Supervised`]: each states where it
/// listens and how it comes up, and gets every [`ServerControl`] action from that.
#[async_trait]
pub(crate) trait SupervisedServer: Send + Sync {
    /// The server process.
    fn process(&self) -> &Supervised;

    /// The server process, mutably.
    fn process_mut(&mut self) -> &mut Supervised;

    /// As [`ServerControl::url`].
    fn client_url(&self) -> String;

    /// As [`ServerControl::port`].
    fn client_port(&self) -> u16;

    /// Starts the (killed) process again and waits until it serves.
    async fn boot_again(&mut self) -> Result<(), ServerError>;
}

/// Every action is supported; restart keeps the port and the data directory.
#[async_trait]
impl<T: SupervisedServer> ServerControl for T {
    fn url(&self) -> String {
        self.client_url()
    }

    fn port(&self) -> u16 {
        self.client_port()
    }

    fn kill(&mut self) {
        self.process_mut().kill();
    }

    async fn restart(&mut self) -> Result<(), ServerError> {
        self.process_mut().kill();
        self.boot_again().await
    }

    fn pause(&mut self) -> Result<(), ServerError> {
        self.process_mut().pause()
    }

    fn resume(&mut self) -> Result<(), ServerError> {
        self.process_mut().resume()
    }

    fn logs(&self) -> String {
        self.process().log_tail()
    }
}

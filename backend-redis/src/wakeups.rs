//! Release wake-ups: a per-key pub/sub channel, shared by every waiter of one client.
//!
//! The client's single RESP3 connection carries the subscriptions; pushed messages are
//! routed here and wake the local waiters of that channel. Each channel is subscribed
//! once however many tasks wait on it, and unsubscribed when the last one leaves.
//!
//! A message's payload names the waiter at the head of the key's FIFO queue (empty when
//! nobody is queued): it wakes that queued waiter only, if it is ours, and every
//! unordered waiter of the channel. An empty payload wakes everyone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use redis::{PushInfo, PushKind, Value};
use tokio::sync::Notify;

use crate::conn::NodeConn;

#[derive(Debug)]
struct Channel {
    /// Unordered waiters: all woken by every message.
    notify: Arc<Notify>,
    /// Queued (FIFO) waiters by waiter id: each woken only by a message naming it.
    queued: HashMap<String, Arc<Notify>>,
    waiters: usize,
    subscribed: bool,
}

impl Channel {
    /// Wakes the unordered waiters, and the queued waiter `head` (every queued waiter
    /// when `head` is empty). A queued waiter keeps the wake-up as a permit if it is
    /// not listening yet.
    fn wake(&self, head: &[u8]) {
        self.notify.notify_waiters();
        if head.is_empty() {
            self.queued.values().for_each(|n| n.notify_one());
        } else if let Some(waiter) = std::str::from_utf8(head)
            .ok()
            .and_then(|h| self.queued.get(h))
        {
            waiter.notify_one();
        }
    }

    fn wake_all(&self) {
        self.wake(b"");
    }
}

/// The channels this client's waiters listen on.
#[derive(Debug, Default)]
pub(crate) struct Wakeups {
    channels: Mutex<HashMap<String, Channel>>,
    /// Serialises SUBSCRIBE and UNSUBSCRIBE, so an unsubscribe of a channel's last
    /// waiter cannot overtake a newer waiter's subscribe.
    commands: tokio::sync::Mutex<()>,
}

impl Wakeups {
    fn channels(&self) -> MutexGuard<'_, HashMap<String, Channel>> {
        self.channels.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Routes one push from the server: a message wakes its channel's waiters; a lost
    /// connection wakes everyone, so they retry (and find out) at once.
    pub(crate) fn on_push(&self, push: PushInfo) {
        match push.kind {
            PushKind::Message => {
                if let Some(Value::BulkString(name)) = push.data.first() {
                    let name = String::from_utf8_lossy(name);
                    if let Some(channel) = self.channels().get(name.as_ref()) {
                        match push.data.get(1) {
                            Some(Value::BulkString(head)) => channel.wake(head),
                            _ => channel.wake_all(),
                        }
                    }
                }
            }
            PushKind::Disconnection => {
                for channel in self.channels().values_mut() {
                    // The new connection resubscribes only what the manager tracked;
                    // make our own bookkeeping resubscribe on the next watch.
                    channel.subscribed = false;
                    channel.wake_all();
                }
            }
            _ => {}
        }
    }

    /// Registers a waiter on `channel` and makes sure the connection is subscribed.
    /// The subscription is confirmed by the server before this returns, so a release
    /// after it is never missed. `queued` is the waiter's id in the key's FIFO queue,
    /// for a waiter woken only when it is the head; `None` for an unordered waiter.
    /// Returns the ticket and whether the subscription holds; without it the caller
    /// must poll.
    ///
    /// Without a connection (a Redlock node that has not joined yet) the ticket is
    /// detached: it tracks nothing and is never woken, so the caller polls.
    pub(crate) async fn watch(
        self: &Arc<Self>,
        conn: Option<&NodeConn>,
        channel: &str,
        queued: Option<&str>,
    ) -> (WakeTicket, bool) {
        let Some(conn) = conn else {
            let ticket = WakeTicket {
                wakeups: self.clone(),
                conn: None,
                channel: channel.to_owned(),
                queued: None,
                notify: Arc::new(Notify::new()),
            };
            return (ticket, false);
        };
        let notify = {
            let mut channels = self.channels();
            let entry = channels
                .entry(channel.to_owned())
                .or_insert_with(|| Channel {
                    notify: Arc::new(Notify::new()),
                    queued: HashMap::new(),
                    waiters: 0,
                    subscribed: false,
                });
            entry.waiters += 1;
            match queued {
                Some(id) => entry
                    .queued
                    .entry(id.to_owned())
                    .or_insert_with(|| Arc::new(Notify::new()))
                    .clone(),
                None => entry.notify.clone(),
            }
        };
        let ticket = WakeTicket {
            wakeups: self.clone(),
            conn: Some(conn.clone()),
            channel: channel.to_owned(),
            queued: queued.map(str::to_owned),
            notify,
        };
        let _serial = self.commands.lock().await;
        let needs_subscribe = self.channels().get(channel).is_some_and(|c| !c.subscribed);
        if !needs_subscribe {
            return (ticket, true);
        }
        let subscribed = conn.clone().subscribe(channel).await.is_ok();
        if let Some(c) = self.channels().get_mut(channel) {
            c.subscribed = subscribed;
        }
        (ticket, subscribed)
    }

    async fn forget(self: Arc<Self>, mut conn: NodeConn, channel: String) {
        let _serial = self.commands.lock().await;
        {
            let mut channels = self.channels();
            match channels.get(&channel) {
                Some(c) if c.waiters == 0 => channels.remove(&channel),
                _ => return,
            };
        }
        // Always: the connection manager may have resubscribed after a reconnect even if
        // our flag says otherwise, and UNSUBSCRIBE of an unknown channel is harmless.
        // If it fails the connection is gone, and its subscriptions with it.
        let _ = conn.unsubscribe(&channel).await;
    }

    /// How many channels are tracked (for tests and metrics).
    pub(crate) fn tracked(&self) -> usize {
        self.channels().len()
    }
}

/// One waiter's interest in a channel; dropping it unsubscribes the channel's last waiter.
pub(crate) struct WakeTicket {
    wakeups: Arc<Wakeups>,
    /// `None` for a detached ticket (see [`Wakeups::watch`]).
    conn: Option<NodeConn>,
    channel: String,
    /// The queued waiter's id, for a FIFO waiter.
    queued: Option<String>,
    notify: Arc<Notify>,
}

impl WakeTicket {
    /// The notifier woken by a release on this channel. An unordered waiter must
    /// `enable` its `notified()` before it looks at the key; a queued waiter's is woken
    /// with `notify_one`, which keeps a wake-up that comes before it listens.
    pub(crate) fn notify(&self) -> &Notify {
        &self.notify
    }
}

impl Drop for WakeTicket {
    fn drop(&mut self) {
        let Some(conn) = &self.conn else {
            return;
        };
        let last = {
            let mut channels = self.wakeups.channels();
            match channels.get_mut(&self.channel) {
                Some(c) => {
                    if let Some(id) = &self.queued {
                        c.queued.remove(id);
                    }
                    c.waiters -= 1;
                    c.waiters == 0
                }
                None => false,
            }
        };
        if last {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(
                    self.wakeups
                        .clone()
                        .forget(conn.clone(), self.channel.clone()),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;

    use super::*;

    fn channel(queued: &[&str]) -> Channel {
        Channel {
            notify: Arc::new(Notify::new()),
            queued: queued
                .iter()
                .map(|id| (id.to_string(), Arc::new(Notify::new())))
                .collect(),
            waiters: queued.len(),
            subscribed: true,
        }
    }

    fn woken(channel: &Channel, id: &str) -> bool {
        channel.queued[id].notified().now_or_never().is_some()
    }

    #[test]
    fn a_message_naming_the_head_wakes_only_that_queued_waiter() {
        let c = channel(&["head", "second"]);
        c.wake(b"head");
        assert!(woken(&c, "head"));
        assert!(!woken(&c, "second"));
        // A head of another client wakes none of ours.
        c.wake(b"elsewhere");
        assert!(!woken(&c, "head") && !woken(&c, "second"));
    }

    #[test]
    fn an_empty_message_wakes_every_queued_waiter() {
        let c = channel(&["a", "b"]);
        c.wake(b"");
        assert!(woken(&c, "a") && woken(&c, "b"));
    }
}

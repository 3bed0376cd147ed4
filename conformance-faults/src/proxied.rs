//! [`ProxiedHarness`]: network faults in front of servers the harness does not own.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::LockError;

use super::harness::{Claim, Fault, FaultClient, FaultHarness, NetFaults};
use distlock_conformance::{Client, Harness, UrlConnector};
use distlock_test_servers::FaultProxy;

/// Clients of a backend URL whose every server address is swapped for a per-client
/// [`FaultProxy`]: network faults only. Server faults skip ("server not controlled by
/// the harness").
pub struct ProxiedHarness {
    name: String,
    /// The URL up to the host list (`scheme://` and any `user:pass@`).
    head: String,
    /// The URL after the host list (path, query).
    tail: String,
    upstreams: Vec<SocketAddr>,
    claims: Arc<dyn Fn(Fault) -> Claim + Send + Sync>,
    connector: UrlConnector,
    proxies: Mutex<Vec<FaultProxy>>,
    next_id: AtomicUsize,
    ttl: Duration,
    crash_bound: Duration,
    dead_waiter_bound: Option<Duration>,
}

impl ProxiedHarness {
    /// Resolves the hosts of `url` (`scheme://[user[:pass]@]host[:port][,host[:port]…][/…][?…]`);
    /// clients come from `connector` with those hosts replaced by proxies.
    ///
    /// # Errors
    /// A message when the URL has no `scheme://`, a host list that cannot be parsed,
    /// or a host that does not resolve.
    pub async fn new(url: &str, connector: UrlConnector) -> Result<Self, String> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| format!("{url:?} has no scheme://"))?;
        let hosts_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(hosts_end);
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((user, hosts)) => (format!("{user}@"), hosts),
            None => (String::new(), authority),
        };
        let mut upstreams = Vec::new();
        for host in hosts.split(',').map(str::trim).filter(|h| !h.is_empty()) {
            let with_port = if host
                .rsplit_once(':')
                .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
                && !host.ends_with(']')
            {
                host.to_owned()
            } else {
                let port = distlock_test_servers::default_port(scheme).ok_or_else(|| {
                    format!("{host:?} has no port and {scheme}:// has no default")
                })?;
                format!("{host}:{port}")
            };
            let addr = tokio::net::lookup_host(&with_port)
                .await
                .map_err(|e| format!("cannot resolve {with_port}: {e}"))?
                .next()
                .ok_or_else(|| format!("{with_port} resolves to no address"))?;
            upstreams.push(addr);
        }
        if upstreams.is_empty() {
            return Err(format!("no host in {scheme}:// URL"));
        }
        Ok(ProxiedHarness {
            name: format!("{scheme}://{hosts}"),
            head: format!("{scheme}://{userinfo}"),
            tail: tail.to_owned(),
            upstreams,
            claims: Arc::new(|_| Claim::Safe),
            connector,
            proxies: Mutex::new(Vec::new()),
            next_id: AtomicUsize::new(0),
            ttl: Duration::from_millis(500),
            crash_bound: Duration::from_millis(500),
            dead_waiter_bound: None,
        })
    }

    /// What the backend claims under each fault ([`FaultHarness::claim`]); safety
    /// under every fault until this says otherwise.
    pub fn with_claims(mut self, claims: impl Fn(Fault) -> Claim + Send + Sync + 'static) -> Self {
        self.claims = Arc::new(claims);
        self
    }

    /// Sets the TTL scenarios use and the longest a cut-off holder's lock survives.
    pub fn with_timing(mut self, ttl: Duration, crash_bound: Duration) -> Self {
        self.ttl = ttl;
        self.crash_bound = crash_bound;
        self
    }

    /// Sets the longest a crashed waiter holds up the FIFO queue behind it
    /// ([`Harness::dead_waiter_bound`]; by default the crash bound).
    pub fn with_dead_waiter_bound(mut self, bound: Duration) -> Self {
        self.dead_waiter_bound = Some(bound);
        self
    }
}

#[async_trait]
impl Harness for ProxiedHarness {
    fn name(&self) -> String {
        self.name.clone()
    }

    async fn client(&self) -> Result<Client, LockError> {
        Ok(self.fault_client().await?.client)
    }

    fn ttl(&self) -> Duration {
        self.ttl
    }

    fn crash_bound(&self, _ttl: Duration) -> Duration {
        self.crash_bound
    }

    fn dead_waiter_bound(&self) -> Duration {
        self.dead_waiter_bound.unwrap_or(self.crash_bound)
    }
}

#[async_trait]
impl FaultHarness for ProxiedHarness {
    async fn fault_client(&self) -> Result<FaultClient, LockError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut proxies = Vec::new();
        for upstream in &self.upstreams {
            proxies.push(
                FaultProxy::start(*upstream)
                    .await
                    .map_err(|e| LockError::connection("conformance", e))?,
            );
        }
        let hosts = proxies
            .iter()
            .map(|p| p.local_addr().to_string())
            .collect::<Vec<_>>()
            .join(",");
        let client = (self.connector)(format!("{}{hosts}{}", self.head, self.tail)).await?;
        self.proxies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(proxies.iter().cloned());
        let net = NetFaults::new(proxies);
        Ok(FaultClient {
            id,
            client: Client::new(client).with_faults(Arc::new(net.clone())),
            net: Some(net),
        })
    }

    fn claim(&self, fault: Fault) -> Claim {
        (self.claims)(fault)
    }
}

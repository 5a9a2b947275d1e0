//! What keeps slow, idle or greedy clients of the secure port from starving the health probes:
//!
//! - a cap on open connections ([`ConnectionLimits::max_connections`]) with **per-client
//!   fairness**: when it is reached, a new connection is not refused; instead the oldest idle
//!   (or still handshaking) connection of the client address holding the most connections is
//!   closed. A client that opens hundreds of connections loses its own, never the kubelet's
//!   probe, which comes from elsewhere or, from the same address, is newer than the flood;
//! - the TLS handshake within [`ConnectionLimits::handshake_timeout`];
//! - an **idle timeout** ([`ConnectionLimits::idle_timeout`]) on every connection whenever no
//!   request is being answered: before the first request (hyper's protocol detection has no
//!   timer of its own), between HTTP/1 keep-alive requests, and on an HTTP/2 connection without
//!   streams;
//! - a longest life per connection ([`ConnectionLimits::max_connection_age`]).

use std::{
    collections::HashMap,
    future::Future,
    net::IpAddr,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use parking_lot::Mutex;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    time::{Instant, Sleep},
};
use tokio_util::sync::CancellationToken;

/// Limits that keep slow or idle clients from starving the process.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Connections open at once; past it the oldest idle connection of the busiest client
    /// address is closed to make room.
    pub max_connections: usize,
    /// Time for the TLS handshake.
    pub handshake_timeout: Duration,
    /// Time for a request's headers to arrive once they started (HTTP/1).
    pub header_read_timeout: Duration,
    /// Time a connection may stay without a request in flight and without a byte from the
    /// client.
    pub idle_timeout: Duration,
    /// Interval of HTTP/2 keep-alive pings (a peer that does not answer one within
    /// `idle_timeout` is closed).
    pub http2_keep_alive_interval: Duration,
    /// Streams of one HTTP/2 connection served at once.
    pub http2_max_concurrent_streams: u32,
    /// Longest life of one connection (keep-alive included).
    pub max_connection_age: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: 512,
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            http2_keep_alive_interval: Duration::from_secs(30),
            http2_max_concurrent_streams: 16,
            max_connection_age: Duration::from_secs(300),
        }
    }
}

/// One open connection, as the table knows it.
struct Entry {
    peer: IpAddr,
    opened: Instant,
    activity: Arc<Activity>,
    close: CancellationToken,
}

/// The open connections, by a sequence number (older = smaller).
#[derive(Clone, Default)]
pub(crate) struct ConnectionTable {
    inner: Arc<Mutex<HashMap<u64, Entry>>>,
    next: Arc<AtomicU64>,
}

/// A connection's place in the table; it leaves the table when dropped.
pub(crate) struct Slot {
    table: ConnectionTable,
    id: u64,
    /// Whether a request is in flight.
    pub(crate) activity: Arc<Activity>,
    /// Cancelled when the table closes the connection to make room.
    pub(crate) close: CancellationToken,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.table.inner.lock().remove(&self.id);
    }
}

impl ConnectionTable {
    /// Takes a place for a new connection from `peer`; at `max` open connections, closes the
    /// oldest idle connection of the address with the most connections first. `None` when
    /// every connection is busy answering a request (the new one is closed).
    pub(crate) fn admit(&self, peer: IpAddr, max: usize) -> Option<Slot> {
        let mut entries = self.inner.lock();
        if entries.len() >= max.max(1) {
            let mut per_peer: HashMap<IpAddr, usize> = HashMap::new();
            for e in entries.values() {
                *per_peer.entry(e.peer).or_default() += 1;
            }
            let mut peers: Vec<(usize, IpAddr)> = per_peer.into_iter().map(|(p, n)| (n, p)).collect();
            peers.sort_by_key(|p| std::cmp::Reverse(p.0));
            let victim = peers.iter().find_map(|(_, p)| {
                entries
                    .iter()
                    .filter(|(_, e)| e.peer == *p && !e.activity.busy())
                    .min_by_key(|(id, e)| (e.opened, **id))
                    .map(|(id, _)| *id)
            })?;
            if let Some(e) = entries.remove(&victim) {
                tracing::debug!(peer = %e.peer, "connection limit reached: closing the oldest idle connection of the busiest client");
                e.close.cancel();
            }
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let activity = Arc::new(Activity::default());
        let close = CancellationToken::new();
        entries.insert(
            id,
            Entry {
                peer,
                opened: Instant::now(),
                activity: activity.clone(),
                close: close.clone(),
            },
        );
        Some(Slot {
            table: self.clone(),
            id,
            activity,
            close,
        })
    }

    /// Open connections.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().len()
    }
}

/// Requests in flight on a connection.
#[derive(Default)]
pub(crate) struct Activity {
    in_flight: AtomicUsize,
}

impl Activity {
    fn busy(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) > 0
    }

    /// Marks a request in flight until the guard is dropped.
    pub(crate) fn request(self: &Arc<Self>) -> RequestGuard {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        RequestGuard(self.clone())
    }
}

/// A request in flight (see [`Activity::request`]).
pub(crate) struct RequestGuard(Arc<Activity>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An I/O stream that fails with `TimedOut` when a read waits longer than `idle` while no
/// request is in flight (a request being answered suspends the timer: its handler may take
/// longer than `idle`, e.g. a slow TokenReview).
pub(crate) struct IdleTimeout<S> {
    inner: S,
    idle: Duration,
    activity: Arc<Activity>,
    timer: Pin<Box<Sleep>>,
    armed: bool,
}

impl<S> IdleTimeout<S> {
    pub(crate) fn new(inner: S, idle: Duration, activity: Arc<Activity>) -> Self {
        Self {
            inner,
            idle,
            activity,
            timer: Box::pin(tokio::time::sleep(idle)),
            armed: false,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for IdleTimeout<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                this.armed = false;
                Poll::Ready(r)
            }
            Poll::Pending => {
                if this.activity.busy() {
                    this.armed = false;
                    return Poll::Pending;
                }
                if !this.armed {
                    this.armed = true;
                    let deadline = Instant::now() + this.idle;
                    this.timer.as_mut().reset(deadline);
                }
                match this.timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "idle connection",
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for IdleTimeout<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_cap_the_busiest_clients_oldest_idle_connection_goes() {
        let table = ConnectionTable::default();
        let (flood, probe): (IpAddr, IpAddr) = ("127.0.0.2".parse().unwrap(), "127.0.0.1".parse().unwrap());
        let flood_slots: Vec<Slot> = (0..4).map(|_| table.admit(flood, 4).unwrap()).collect();
        let busy = flood_slots[0].activity.request();
        let probe_slot = table.admit(probe, 4).unwrap();
        assert_eq!(table.len(), 4);
        // The flood's oldest connection is answering a request: its second-oldest went.
        assert!(!flood_slots[0].close.is_cancelled());
        assert!(flood_slots[1].close.is_cancelled());
        assert!(!probe_slot.close.is_cancelled());
        drop(busy);
        // Every connection busy: the new one is refused.
        let guards: Vec<RequestGuard> = [&flood_slots[0], &flood_slots[2], &flood_slots[3], &probe_slot]
            .iter()
            .map(|s| s.activity.request())
            .collect();
        assert!(table.admit(probe, 4).is_none());
        drop(guards);
        drop(flood_slots);
        assert_eq!(table.len(), 1);
    }
}

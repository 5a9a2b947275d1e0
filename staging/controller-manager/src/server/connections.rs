//! What keeps slow, idle or greedy clients of the secure port from starving the health probes:
//!
//! - a cap on open connections ([`ConnectionLimits::max_connections`]) with **per-client
//!   fairness**: when it is reached, a new connection is not refused; instead the oldest idle
//!   (or still handshaking) connection of the client holding the most connections is closed —
//!   a client being an IPv4 address or an IPv6 /64 (one host's or one tenant's many addresses),
//!   ties between clients broken by age (the globally oldest goes). A connection younger than
//!   [`MIN_AGE_TO_CLOSE`] is closed for a newcomer only when its client holds more connections
//!   than the newcomer's, or when the newcomer's client holds none (a client's first
//!   connection always gets in while any connection is idle: hundreds of clients reconnecting
//!   as fast as they are closed keep every connection young, and the kubelet's probe is such a
//!   first connection); otherwise, when no connection can be closed, the newcomer is closed. A
//!   client that opens hundreds of connections, or hundreds of clients with one each, lose
//!   their own, never the kubelet's probe, which is busy with its request a few milliseconds
//!   after its handshake, long before hundreds of newcomers have made it the oldest;
//! - the TLS handshake within [`ConnectionLimits::handshake_timeout`]; once a client's hello
//!   has arrived, the costly rest of the handshake (the server's signature: 1–2 ms of CPU with
//!   an RSA-2048 key) runs for at most [`ConnectionLimits::max_handshakes_per_client`]
//!   connections of one client and, beyond each client's first,
//!   [`ConnectionLimits::max_handshakes`] in all; a connection past either is closed at once
//!   (`HandshakeGate`). A flood of handshakes then costs the
//!   flooding client its connections, never the probe its turn;
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
#[non_exhaustive]
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
    /// Serve HTTP/1.1 only (`--disable-http2-serving`).
    pub http1_only: bool,
    /// TLS handshakes past the client's hello in progress at once (a client's first is
    /// always let in). Default 16: the port's one thread signs for each of them in turn, and
    /// a handshake in progress waits for the others' signatures at each of its round trips
    /// (with 64, an RSA-2048 flood from 16 addresses made the probe's handshake take up to
    /// ~1 s on a loaded 2-core machine); one thread signs only ~600 a second anyway.
    pub max_handshakes: usize,
    /// TLS handshakes past the client's hello in progress at once for one client.
    pub max_handshakes_per_client: usize,
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
            http1_only: false,
            max_handshakes: 16,
            max_handshakes_per_client: 4,
        }
    }
}

/// A connection younger than this is not closed to make room for a newcomer of a client with
/// as many connections (hundreds of clients with one each): a probe's connection sends its
/// request right after the handshake and must not lose its place to the next newcomer. When
/// no connection can be closed, the newcomer is.
pub const MIN_AGE_TO_CLOSE: Duration = Duration::from_secs(2);

use crate::auth::client_of;

/// Bounds the TLS handshakes in progress past the client's hello, in all and per client.
#[derive(Clone, Default)]
pub(crate) struct HandshakeGate {
    in_progress: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// A handshake's place in the [`HandshakeGate`]; released when dropped.
pub(crate) struct HandshakePlace {
    gate: HandshakeGate,
    client: IpAddr,
}

impl HandshakeGate {
    /// A place for a handshake of `peer`, or `None` when its client has `per_client` in
    /// progress, or has one in progress and `max` are in progress in all.
    pub(crate) fn enter(&self, peer: IpAddr, max: usize, per_client: usize) -> Option<HandshakePlace> {
        let client = client_of(peer);
        let mut in_progress = self.in_progress.lock();
        let total: usize = in_progress.values().sum();
        let own = in_progress.get(&client).copied().unwrap_or(0);
        // A client's first handshake always goes ahead (the kubelet's probe makes one at a
        // time): a flood from a few addresses can fill the whole bound with theirs.
        if own >= per_client.max(1) || (own > 0 && total >= max.max(1)) {
            return None;
        }
        *in_progress.entry(client).or_default() += 1;
        Some(HandshakePlace {
            gate: self.clone(),
            client,
        })
    }
}

impl Drop for HandshakePlace {
    fn drop(&mut self) {
        let mut in_progress = self.gate.in_progress.lock();
        if let Some(n) = in_progress.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                in_progress.remove(&self.client);
            }
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
    /// oldest idle connection of the client with the most connections first (ties: the oldest
    /// of them all); one younger than [`MIN_AGE_TO_CLOSE`] only when its client holds more
    /// connections than `peer`'s would, or when `peer`'s client holds none. `None` when no connection can be closed (every one is
    /// answering a request or is too young): the new one is closed.
    pub(crate) fn admit(&self, peer: IpAddr, max: usize) -> Option<Slot> {
        self.admit_at(peer, max, Instant::now())
    }

    /// [`Self::admit`] at `now` (tests give the clock explicitly: the shipped binaries' tokio
    /// has no paused time, and the tests build the same tokio so as to share its build).
    fn admit_at(&self, peer: IpAddr, max: usize, now: Instant) -> Option<Slot> {
        let mut entries = self.inner.lock();
        if entries.len() >= max.max(1) {
            let mut per_client: HashMap<IpAddr, usize> = HashMap::new();
            for e in entries.values() {
                *per_client.entry(client_of(e.peer)).or_default() += 1;
            }
            let newcomers = per_client.get(&client_of(peer)).copied().unwrap_or(0) + 1;
            let first_of_its_client = newcomers == 1;
            let victim = entries
                .iter()
                .filter(|(_, e)| {
                    let busier = per_client.get(&client_of(e.peer)).copied().unwrap_or(0) > newcomers;
                    !e.activity.busy()
                        && (busier || first_of_its_client || now.duration_since(e.opened) >= MIN_AGE_TO_CLOSE)
                })
                .max_by_key(|(id, e)| {
                    (
                        per_client.get(&client_of(e.peer)).copied().unwrap_or(0),
                        std::cmp::Reverse((e.opened, **id)),
                    )
                })
                .map(|(id, _)| *id)?;
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
                opened: now,
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
        let start = Instant::now();
        let (flood, probe): (IpAddr, IpAddr) = ("127.0.0.2".parse().unwrap(), "127.0.0.1".parse().unwrap());
        let flood_slots: Vec<Slot> = (0..4).map(|_| table.admit_at(flood, 4, start).unwrap()).collect();
        // Too young to be closed for another connection of the same client: the newcomer is.
        assert!(table.admit_at(flood, 4, start).is_none());
        assert!(flood_slots.iter().all(|s| !s.close.is_cancelled()));
        let now = start + Duration::from_millis(100);
        let busy = flood_slots[0].activity.request();
        let probe_slot = table.admit_at(probe, 4, now).unwrap();
        assert_eq!(table.len(), 4);
        // Young, but of a busier client: the flood's oldest idle connection went for the probe
        // (its oldest of all is answering a request).
        assert!(!flood_slots[0].close.is_cancelled());
        assert!(flood_slots[1].close.is_cancelled());
        assert!(!probe_slot.close.is_cancelled());
        drop(busy);
        // Every connection busy: the new one is refused.
        let guards: Vec<RequestGuard> = [&flood_slots[0], &flood_slots[2], &flood_slots[3], &probe_slot]
            .iter()
            .map(|s| s.activity.request())
            .collect();
        assert!(table.admit_at(probe, 4, now).is_none());
        drop(guards);
        drop(flood_slots);
        assert_eq!(table.len(), 1);
    }

    /// Many clients with one connection each (all tied): the globally oldest goes, whatever
    /// the order of the table; the probe's connection, busy with its request, is never taken.
    #[test]
    fn ties_between_clients_take_the_globally_oldest_and_never_a_young_probe() {
        let table = ConnectionTable::default();
        let max = 64;
        let mut slots = Vec::new();
        let mut now = Instant::now();
        for i in 0..max - 1 {
            let peer: IpAddr = format!("127.0.{}.{}", i / 200, 1 + i % 200).parse().unwrap();
            slots.push(table.admit_at(peer, max, now).unwrap());
            now += Duration::from_millis(10);
        }
        now += MIN_AGE_TO_CLOSE;
        let probe = table.admit_at("10.0.0.1".parse().unwrap(), max, now).unwrap();
        let _request = probe.activity.request();
        let mut newcomers = Vec::new();
        for n in 0..max - 1 {
            let newcomer: IpAddr = format!("127.1.{}.{}", n / 200, 1 + n % 200).parse().unwrap();
            newcomers.push(
                table
                    .admit_at(newcomer, max, now)
                    .expect("an old idle connection makes room"),
            );
            assert!(!probe.close.is_cancelled(), "the probe survives newcomer {n}");
            assert!(
                slots[..=n].iter().all(|s| s.close.is_cancelled())
                    && slots[n + 1..].iter().all(|s| !s.close.is_cancelled()),
                "newcomer {n} took the oldest connection, in age order"
            );
        }
        // Only young connections are left (the probe's, busy, and the newcomers'): a second
        // connection of a client that has one is closed instead; a client's first connection
        // takes the oldest young idle one (never the busy probe).
        assert!(table.admit_at("127.1.0.1".parse().unwrap(), max, now).is_none());
        assert!(newcomers.iter().all(|s| !s.close.is_cancelled()));
        let _first = table.admit_at("127.2.0.1".parse().unwrap(), max, now).unwrap();
        assert!(newcomers[0].close.is_cancelled() && !probe.close.is_cancelled());
        drop(_request);
    }

    #[test]
    fn handshakes_are_bounded_per_client_and_in_all() {
        let gate = HandshakeGate::default();
        let flood: IpAddr = "127.0.0.2".parse().unwrap();
        let places: Vec<HandshakePlace> = (0..4).filter_map(|_| gate.enter(flood, 6, 4)).collect();
        assert_eq!(places.len(), 4);
        assert!(
            gate.enter(flood, 6, 4).is_none(),
            "the client's fifth waits for nothing"
        );
        let probe = gate.enter("127.0.0.1".parse().unwrap(), 6, 4);
        assert!(probe.is_some(), "another client gets in");
        let sixth = gate.enter("127.0.0.3".parse().unwrap(), 6, 4).unwrap();
        assert!(
            gate.enter("127.0.0.3".parse().unwrap(), 6, 4).is_none(),
            "six in all"
        );
        let _first = gate.enter("127.0.0.4".parse().unwrap(), 6, 4);
        assert!(_first.is_some(), "a client's first handshake goes ahead");
        drop(sixth);
        drop(places);
        assert!(gate.enter(flood, 6, 4).is_some(), "released when done");
    }

    #[test]
    fn an_ipv6_slash_64_is_one_client() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(client_of(a), client_of(b));
        assert_ne!(client_of(a), client_of(c));
        let v4: IpAddr = "127.0.0.2".parse().unwrap();
        assert_eq!(client_of(v4), v4);
    }
}

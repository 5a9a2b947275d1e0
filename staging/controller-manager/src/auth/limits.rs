//! The limits of the delegated checks: the answer caches, the review budgets (shared and per
//! client) and the keys they are kept under.

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use super::UserInfo;

/// Answers with an expiry each, the least recently used dropped first when
/// [`CACHE_CAPACITY`] entries are held (a flood of new keys never empties the cache whole).
pub(crate) struct TtlCache<V> {
    pub(crate) entries: Mutex<lru::LruCache<CacheKey, (Instant, V)>>,
}

/// Entries of each decision cache.
pub const CACHE_CAPACITY: usize = 4096;

pub(crate) type CacheKey = [u8; 32];

impl<V: Clone> TtlCache<V> {
    pub(crate) fn new() -> Self {
        Self {
            entries: Mutex::new(lru::LruCache::new(
                std::num::NonZeroUsize::new(CACHE_CAPACITY).unwrap_or(std::num::NonZeroUsize::MIN),
            )),
        }
    }

    pub(crate) fn get(&self, key: CacheKey) -> Option<V> {
        let mut entries = self.entries.lock();
        match entries.get(&key) {
            Some((expires, v)) if *expires > Instant::now() => Some(v.clone()),
            Some(_) => {
                entries.pop(&key);
                None
            }
            None => None,
        }
    }

    pub(crate) fn put(&self, key: CacheKey, value: V, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        self.entries.lock().put(key, (Instant::now() + ttl, value));
    }
}

/// Reviews a second each delegated client sends at most (upstream's delegating clients: QPS 200).
pub const REVIEW_QPS: f64 = 200.0;
/// Reviews each delegated client may send at once before [`REVIEW_QPS`] applies (upstream: 400).
pub const REVIEW_BURST: u32 = 400;
/// Time for one review, waiting for the rate limit included (upstream: 10 s).
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for the rate limit before a review is given up (upstream waits up to the whole
/// [`REVIEW_TIMEOUT`]; a shorter queue keeps a flood of made-up tokens from holding hundreds of
/// connections open while their reviews wait).
pub const REVIEW_MAX_QUEUE_WAIT: Duration = Duration::from_secs(1);

/// Reviews one client (an IPv4 address or an IPv6 /64) may cause at once, unless recently
/// authenticated (see the module docs).
pub const CLIENT_REVIEW_BURST: u32 = 20;
/// Reviews a second one client may cause after its burst.
pub const CLIENT_REVIEW_QPS: f64 = 5.0;
/// The share of each shared review budget ([`REVIEW_BURST`]) kept for recently authenticated
/// clients.
pub const REVIEW_RESERVE: f64 = 0.25;
/// How long a token that authenticated (and the user it named) counts as recently
/// authenticated.
pub const RECENTLY_AUTHENTICATED: Duration = Duration::from_secs(15 * 60);

/// The client a request counts for: an IPv4 address, or the /64 of an IPv6 address.
pub fn client_of(peer: IpAddr) -> IpAddr {
    match peer {
        IpAddr::V4(_) => peer,
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(std::net::Ipv6Addr::from(bits))
        }
    }
}

/// The key of a user (name, UID and groups) in the recently-authenticated set.
pub(crate) fn user_key(user: &UserInfo) -> CacheKey {
    key_of(format!("user {:?}", (&user.name, &user.uid, &user.groups)).as_bytes())
}

/// A token bucket (as client-go's rate limiter): `burst` reviews at once, refilled at `qps`.
pub(crate) struct RateLimiter {
    pub(crate) qps: f64,
    pub(crate) burst: f64,
    /// (tokens, when they were counted); tokens below zero are reservations.
    state: Mutex<(f64, Instant)>,
}

impl RateLimiter {
    pub(crate) fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps: qps.max(f64::MIN_POSITIVE),
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    /// Reserves one review: how long to wait before sending it, or `None` (nothing reserved)
    /// when that would be longer than `max_wait`. The last `floor` tokens are not taken (a
    /// reserve for other callers).
    pub(crate) fn reserve(&self, max_wait: Duration, floor: f64) -> Option<Duration> {
        let mut state = self.state.lock();
        let now = Instant::now();
        let refill = now.duration_since(state.1).as_secs_f64() * self.qps;
        state.0 = (state.0 + refill).min(self.burst);
        state.1 = now;
        state.0 -= 1.0;
        if state.0 >= floor {
            return Some(Duration::ZERO);
        }
        let wait = Duration::from_secs_f64((floor - state.0) / self.qps);
        if wait > max_wait {
            state.0 += 1.0;
            return None;
        }
        Some(wait)
    }
}

/// A cache key: SHA-256 over a per-process random salt and `material`, so that a key neither
/// reveals a token nor lets two different requests share an answer.
pub(crate) fn key_of(material: &[u8]) -> CacheKey {
    static SALT: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
    let salt = SALT.get_or_init(rand::random);
    let mut h = Sha256::new();
    h.update(salt);
    h.update(material);
    h.finalize().into()
}

//! Unit tests of the delegated checks.

use super::*;

#[test]
fn bearer_tokens_are_read_as_upstream() {
    assert_eq!(bearer_token("Bearer abc"), Some("abc"));
    assert_eq!(bearer_token("bearer   abc "), Some("abc"));
    assert_eq!(bearer_token("Basic dXNlcjpwYXNz"), None);
    assert_eq!(bearer_token("Bearer "), None);
    assert_eq!(bearer_token("Bearer"), None);
}

#[test]
fn always_allow_paths_are_exact_or_star_prefixes() {
    assert!(path_matches("/healthz", "/healthz"));
    assert!(!path_matches("/healthz", "/healthz/ping"));
    assert!(path_matches("/debug/*", "/debug/pprof"));
    assert!(!path_matches("/healthz", "/metrics"));
}

#[tokio::test]
async fn without_clients_only_always_allowed_paths_and_masters_pass() {
    let gate = Delegation::new(DelegationOptions::new(None, None));
    let get = http::Method::GET;
    // A bearer token is not looked at: anonymous.
    let anon = gate.authenticate(Some("Bearer t"), None).await.unwrap();
    assert_eq!(anon, UserInfo::anonymous());
    assert!(gate.authorize(&anon, &get, "/healthz").await.is_ok());
    let refused = gate.authorize(&anon, &get, "/metrics").await.unwrap_err();
    assert_eq!(refused.status(), 403);
    assert!(
        refused
            .body()
            .contains(r#"forbidden: User \"system:anonymous\" cannot get path \"/metrics\""#),
        "{}",
        refused.body()
    );
    let master = UserInfo {
        name: "admin".into(),
        uid: String::new(),
        groups: vec!["system:masters".into()],
        extra: BTreeMap::new(),
    };
    assert!(gate.authorize(&master, &get, "/metrics").await.is_ok());
}

#[test]
fn client_certificate_user_is_cn_and_groups_are_o() {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "prometheus");
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "monitoring");
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    let user = UserInfo::from_client_certificate(cert.der()).unwrap();
    assert_eq!(user.name, "prometheus");
    assert_eq!(user.groups, vec!["monitoring".to_string()]);
    // No CN (rcgen's default subject has one: start from an empty one): not a user.
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "monitoring");
    let cert = params.self_signed(&key).unwrap();
    assert!(UserInfo::from_client_certificate(cert.der()).is_none());
}

#[test]
fn refusals_are_meta_v1_status_bodies() {
    let r = Refusal::Unauthorized;
    let v: serde_json::Value = serde_json::from_str(&r.body()).unwrap();
    assert_eq!(v["code"], 401);
    assert_eq!(v["reason"], "Unauthorized");
}

#[test]
fn cache_expires_and_stays_bounded() {
    let c: TtlCache<bool> = TtlCache::new();
    c.put(key_of(b"a"), true, Duration::from_millis(20));
    assert_eq!(c.get(key_of(b"a")), Some(true));
    assert_eq!(c.get(key_of(b"b")), None);
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(c.get(key_of(b"a")), None);
    // A key in use stays while a flood of new keys passes through (LRU, not cleared whole).
    c.put(key_of(b"kept"), true, Duration::from_secs(60));
    for i in 0..(CACHE_CAPACITY + 10) {
        c.put(key_of(&i.to_le_bytes()), true, Duration::from_secs(60));
        if i % 100 == 0 {
            assert_eq!(c.get(key_of(b"kept")), Some(true));
        }
    }
    assert_eq!(c.entries.lock().len(), CACHE_CAPACITY);
    assert_eq!(c.get(key_of(b"kept")), Some(true));
    assert_eq!(
        c.get(key_of(&0usize.to_le_bytes())),
        None,
        "the least recently used went"
    );
}

/// A flood from one client stops at its own budget; a flood from many uses the shared
/// budget down to the reserve, which a recently authenticated client still gets.
#[tokio::test]
async fn per_client_budgets_and_a_reserve_for_recently_authenticated_clients() {
    let gate = Delegation::new(DelegationOptions::new(None, None));
    let limiter = RateLimiter::new(0.001, 400);
    let t = Duration::from_secs(10);
    let ok = || async { Ok::<_, kube::Error>(()) };
    let stranger = |addr: &str| Budget {
        client: Some(addr.parse().unwrap()),
        recent: false,
    };
    let mut from_one = 0;
    for _ in 0..100 {
        if gate
            .limited(&limiter, stranger("127.0.0.2"), t, ok())
            .await
            .is_ok()
        {
            from_one += 1;
        }
    }
    assert_eq!(from_one, CLIENT_REVIEW_BURST, "one client: its own burst");
    // An IPv6 /64 is one client.
    let mut from_v6 = 0;
    for i in 0..100 {
        let b = stranger(&format!("2001:db8::{i:x}"));
        if gate.limited(&limiter, b, t, ok()).await.is_ok() {
            from_v6 += 1;
        }
    }
    assert_eq!(from_v6, CLIENT_REVIEW_BURST);
    // Many clients: the shared budget down to the reserve.
    let mut from_many = from_one + from_v6;
    for i in 0..1000 {
        let b = stranger(&format!("127.1.{}.{}", i / 200, i % 200));
        if gate.limited(&limiter, b, t, ok()).await.is_ok() {
            from_many += 1;
        }
    }
    let reserve = (400.0 * REVIEW_RESERVE) as u32;
    assert_eq!(from_many, 400 - reserve, "strangers stop at the reserve");
    // A recently authenticated client (from a flooding address, too) gets the reserve.
    let recent = Budget {
        client: Some("127.0.0.2".parse().unwrap()),
        recent: true,
    };
    for n in 0..reserve {
        assert!(
            gate.limited(&limiter, recent, t, ok()).await.is_ok(),
            "reserved review {n}"
        );
    }
    assert!(
        gate.limited(&limiter, recent, t, ok()).await.is_err(),
        "the reserve is finite too"
    );
}

#[test]
fn a_user_is_recent_once_authenticated() {
    let gate = Delegation::new(DelegationOptions::new(None, None));
    let user = UserInfo {
        name: "system:serviceaccount:monitoring:prometheus".into(),
        uid: "u1".into(),
        groups: vec!["system:serviceaccounts".into()],
        extra: Default::default(),
    };
    assert!(gate.inner.recent.get(user_key(&user)).is_none());
    let token = key_of(b"a token");
    gate.remember(Some(token), &user);
    assert!(gate.inner.recent.get(user_key(&user)).is_some());
    assert!(gate.inner.recent.get(token).is_some());
    let other = UserInfo {
        groups: vec!["system:masters".into()],
        ..user
    };
    assert!(
        gate.inner.recent.get(user_key(&other)).is_none(),
        "another group set is another user"
    );
}

#[test]
fn reviews_are_limited_to_the_burst_then_the_rate() {
    let limiter = RateLimiter::new(200.0, 400);
    let timeout = Duration::from_secs(10);
    let mut immediate = 0;
    let mut sent = 0;
    for _ in 0..5000 {
        match limiter.reserve(timeout, 0.0) {
            Some(w) if w.is_zero() => {
                immediate += 1;
                sent += 1;
            }
            Some(w) => {
                assert!(w <= timeout);
                sent += 1;
            }
            None => {}
        }
    }
    assert_eq!(immediate, 400, "the burst goes at once");
    // Within the 10 s a review may wait: 200 a second more.
    assert!((2399..=2401).contains(&sent), "{sent}");
}

use std::time::Duration;

use axum::http::{header, HeaderMap, HeaderValue};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::config::Config;

/// A key file at a fresh path holding `text`.
fn key_file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tg-auth-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("keys");
    std::fs::write(&path, text).unwrap();
    path
}

fn line(key: &str, tenant: &str) -> String {
    format!("{} {tenant}\n", sha256_hex(key.as_bytes()))
}

/// Writes `text` as a change the watcher can tell (a new length, or a new modification time).
fn rewrite(path: &std::path::Path, text: &str) {
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(path, text).unwrap();
}

#[tokio::test]
async fn a_key_file_is_put_in_force_only_once_it_stayed_the_same_for_a_look() {
    let path = key_file("settle", &(line("key-a", "a") + &line("key-b", "b")));
    let mut config = Config::default().auth;
    config.enabled = true;
    config.keys_file = Some(path.clone());
    // Looks are made here, one by one: the background watcher sleeps for an hour.
    config.reload = Duration::from_secs(3_600);
    let stop = CancellationToken::new();
    let auth = Auth::start(&config, stop.clone());
    let mut look = KeyFileLook::default();
    auth.reload(&mut look);
    assert!(auth.key("key-a").is_some() && auth.key("key-b").is_some());
    // Written in place: first only its first line (a look comes in the middle)...
    rewrite(&path, &line("key-a", "a"));
    auth.reload(&mut look);
    assert!(
        auth.key("key-b").is_some(),
        "a file that just changed waits a look"
    );
    // ...then whole again, a new change: waits again, then stays and is put in force.
    rewrite(
        &path,
        &(line("key-a", "a") + &line("key-b", "b") + &line("key-c", "c")),
    );
    auth.reload(&mut look);
    assert!(auth.key("key-c").is_none());
    auth.reload(&mut look);
    assert!(auth.key("key-a").is_some() && auth.key("key-b").is_some());
    assert!(auth.key("key-c").is_some());
    // A removed line, once it stayed: revoked.
    rewrite(&path, &line("key-a", "a"));
    auth.reload(&mut look);
    auth.reload(&mut look);
    assert!(auth.key("key-b").is_none() && auth.key("key-a").is_some());
    // A file left with no key (emptied, or truncated by a slow writer) would refuse every
    // client: the keys in force stay.
    rewrite(&path, "");
    auth.reload(&mut look);
    auth.reload(&mut look);
    assert!(
        auth.key("key-a").is_some(),
        "an empty key file locks nobody out"
    );
    stop.cancel();
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// `[auth]` on with a key file that holds no key (or cannot be read) when the gateway starts:
/// every client is refused, and the log says so at warn level (it said "API keys loaded
/// keys=0" at info, and "keeping the keys in force" of keys there were none of).
#[tokio::test]
async fn a_key_file_with_no_key_at_start_is_warned_about() {
    for (name, text) in [("empty", Some("# keys go here\n")), ("missing", None)] {
        let path = key_file(name, text.unwrap_or_default());
        if text.is_none() {
            std::fs::remove_file(&path).unwrap();
        }
        let mut config = Config::default().auth;
        config.enabled = true;
        config.keys_file = Some(path.clone());
        config.reload = Duration::from_secs(3_600);
        // This test's runtime has one thread: the look logs on it.
        let (captured, _guard) = tutor_testkit::capture_logs(tracing::Level::WARN);
        let stop = CancellationToken::new();
        let auth = Auth::start(&config, stop.clone());
        let mut look = KeyFileLook::default();
        auth.reload(&mut look);
        assert!(auth.key("any-key").is_none());
        let logged = captured.text();
        assert!(
            logged.contains("every client is refused (401)"),
            "{name}: {logged}"
        );
        stop.cancel();
        // With [auth] off nobody is refused: nothing to warn about.
        let (captured, _guard) = tutor_testkit::capture_logs(tracing::Level::WARN);
        config.enabled = false;
        let _off = Auth::start(&config, stop.clone());
        assert!(
            !captured.text().contains("every client is refused"),
            "{name}: {}",
            captured.text()
        );
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }
}

#[test]
fn one_bearer_key_in_any_case_of_its_scheme() {
    let headers = |values: &[&[u8]]| {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(header::AUTHORIZATION, HeaderValue::from_bytes(v).unwrap());
        }
        h
    };
    assert_eq!(bearer(&HeaderMap::new()), Ok(None));
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let h = headers(&[format!("{scheme} sk-1 ").as_bytes()]);
        assert_eq!(bearer(&h), Ok(Some("sk-1")), "{scheme}");
    }
    for bad in [
        &[b"Basic dXNlcg==".as_slice()][..],
        &[b"Bearer"],
        &[b"Bearer   "],
        &[b"Bearer \xff\xfe"],
        &[b"Bearer sk-1", b"Bearer sk-2"],
    ] {
        assert!(bearer(&headers(bad)).is_err(), "{bad:?}");
    }
}

#[tokio::test]
async fn a_key_moved_to_another_tenant_is_revoked_for_the_first() {
    let path = key_file("moved", &line("key-a", "school-one"));
    let mut config = Config::default().auth;
    config.enabled = true;
    config.keys_file = Some(path.clone());
    config.reload = Duration::from_secs(3_600);
    let stop = CancellationToken::new();
    let auth = Auth::start(&config, stop.clone());
    let id = key_id(&sha256_hex(b"key-a"));
    assert!(auth.in_force(&id, "school-one"));
    // The requests in flight for school-one end; the key now speaks for school-2.
    let revoked = tokio::spawn(auth.clone().revoked(id.clone(), "school-one".into()));
    let mut look = KeyFileLook::default();
    auth.reload(&mut look);
    rewrite(&path, &line("key-a", "school-2"));
    auth.reload(&mut look);
    auth.reload(&mut look);
    tokio::time::timeout(Duration::from_secs(30), revoked)
        .await
        .expect("school-one's requests are told")
        .unwrap();
    assert!(!auth.in_force(&id, "school-one") && auth.in_force(&id, "school-2"));
    stop.cancel();
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

fn watched(name: &str, text: &str) -> (PathBuf, AuthConfig) {
    let path = key_file(name, text);
    let mut config = Config::default().auth;
    config.enabled = true;
    config.keys_file = Some(path.clone());
    // Looks are made here, one by one: the background watcher sleeps for an hour.
    config.reload = Duration::from_secs(3_600);
    (path, config)
}

/// Every token a key minted dies with it: putting the key back (a file reverted, a key moved
/// away and back) does not bring a token that leaked back to life; a token minted after it
/// came back works.
#[tokio::test]
async fn a_token_of_a_revoked_key_stays_dead_when_the_key_comes_back() {
    let (path, config) = watched("revived", &line("key-a", "a"));
    let stop = CancellationToken::new();
    let auth = Auth::start(&config, stop.clone());
    let mut look = KeyFileLook::default();
    auth.reload(&mut look);
    let (tenant, id) = auth.key("key-a").unwrap();
    let (leaked, _) = auth.issue(&tenant, &id);
    assert!(auth.tenant_of_token(&leaked).is_ok());
    rewrite(&path, &line("key-b", "b"));
    auth.reload(&mut look);
    auth.reload(&mut look);
    assert!(auth.tenant_of_token(&leaked).is_err(), "revoked");
    rewrite(&path, &(line("key-a", "a") + &line("key-b", "b")));
    auth.reload(&mut look);
    auth.reload(&mut look);
    assert!(auth.key("key-a").is_some(), "the key is back");
    assert_eq!(
        auth.tenant_of_token(&leaked),
        Err("the key that issued this token was revoked")
    );
    std::thread::sleep(Duration::from_millis(5));
    let (fresh, _) = auth.issue(&tenant, &id);
    assert_eq!(auth.tenant_of_token(&fresh), Ok(("a".into(), id)));
    stop.cancel();
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// A rotation deployed with the file's times kept (`cp -p`, `rsync -t`): the same modification
/// time and, key for key, the same length. The removed key is still revoked.
#[tokio::test]
async fn a_key_file_changed_under_the_same_time_and_length_is_read_again() {
    let (path, config) = watched("same-stamp", &(line("key-a", "a") + &line("key-b", "b")));
    let stop = CancellationToken::new();
    let auth = Auth::start(&config, stop.clone());
    let mut look = KeyFileLook::default();
    auth.reload(&mut look);
    assert!(auth.key("key-b").is_some());
    let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
    std::fs::write(&path, line("key-a", "a") + &line("key-c", "b")).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(modified)
        .unwrap();
    auth.reload(&mut look);
    auth.reload(&mut look);
    assert!(auth.key("key-b").is_none(), "revoked");
    assert!(auth.key("key-c").is_some() && auth.key("key-a").is_some());
    stop.cancel();
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// A key file that cannot be parsed at start (changed after the config was checked) leaves the
/// config's own keys in force, as the log says: not every client refused.
#[tokio::test]
async fn an_invalid_key_file_at_start_keeps_the_configs_keys() {
    let (path, mut config) = watched("invalid-start", "garbage\n");
    config.keys = vec![KeyEntry {
        sha256: sha256_hex(b"cfg-key"),
        tenant: "c".into(),
    }];
    let stop = CancellationToken::new();
    let auth = Auth::start(&config, stop.clone());
    assert_eq!(auth.key("cfg-key").map(|(t, _)| t), Some("c".into()));
    stop.cancel();
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// The token secret (which signs every tenant's tokens) never shows in debug output.
#[tokio::test]
async fn the_token_secret_never_shows_in_debug_output() {
    let mut config = Config::default().auth;
    config.enabled = true;
    config.token_secret = Some("a-secret-that-signs-tokens".into());
    let auth = Auth::start(&config, CancellationToken::new());
    let shown = format!("{auth:?}");
    assert!(!shown.contains("a-secret-that-signs-tokens"), "{shown}");
    // Nor as bytes.
    let bytes = format!("{:?}", "a-secret-that-signs-tokens".as_bytes());
    assert!(!shown.contains(&bytes[1..bytes.len() - 1]), "{shown}");
}

/// A key file refused (invalid, unreadable, or with no key left) keeps the keys in force: a
/// key removed in the same edit still works. `tutor_gateway_key_file_refused` says so (1) until
/// a file is put in force (0), so that the revocation that did not happen is seen.
#[tokio::test]
async fn a_refused_key_file_is_shown_until_one_is_put_in_force() {
    let path = key_file("refused", &(line("key-a", "a") + &line("key-b", "b")));
    let mut config = Config::default().auth;
    config.enabled = true;
    config.keys_file = Some(path.clone());
    config.reload = Duration::from_secs(3_600);
    let refused = prometheus::IntGauge::new("refused", "refused").unwrap();
    let auth = Auth::start_counted(&config, CancellationToken::new(), refused.clone());
    let mut look = KeyFileLook::default();
    auth.reload(&mut look);
    assert_eq!(refused.get(), 0);
    // key-b's line removed, and a typo on key-a's: refused, key-b still works.
    let edit = |text: &str, look: &mut KeyFileLook| {
        rewrite(&path, text);
        auth.reload(look);
        auth.reload(look);
    };
    edit("not a key line\n", &mut look);
    assert!(auth.key("key-b").is_some(), "the keys in force stay");
    assert_eq!(refused.get(), 1, "the refusal is shown");
    edit("", &mut look);
    assert_eq!(refused.get(), 1, "a file with no key left is refused too");
    edit(&line("key-a", "a"), &mut look);
    assert!(
        auth.key("key-b").is_none(),
        "revoked once the file is mended"
    );
    assert_eq!(refused.get(), 0);
    std::fs::remove_file(&path).unwrap();
    auth.reload(&mut look);
    auth.reload(&mut look);
    assert_eq!(refused.get(), 1, "an unreadable file is refused");
}

//! A subscription whose connection goes silent (a NAT dropping it, a failover without a word)
//! ends with an error instead of waiting for messages forever.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::subscription::Subscription;
use super::tests::redis_common::RedisServer;

/// A TCP proxy to `to` that, once `silent` is set, forwards nothing more in either direction
/// while keeping every connection open.
async fn proxy(to: String, silent: Arc<AtomicBool>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = TcpStream::connect(&to).await.unwrap();
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            tokio::spawn(pipe(cr, sw, Arc::clone(&silent)));
            tokio::spawn(pipe(sr, cw, Arc::clone(&silent)));
        }
    });
    format!("redis://{addr}/")
}

/// Copies `from` to `to` until `silent`, then holds both ends open without a byte more.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    silent: Arc<AtomicBool>,
) {
    let mut buf = vec![0; 16 * 1024];
    loop {
        let Ok(n) = from.read(&mut buf).await else {
            return;
        };
        if n == 0 {
            return;
        }
        if silent.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[tokio::test]
async fn a_subscription_whose_connection_goes_silent_ends_with_an_error() {
    let server = RedisServer::start();
    let silent = Arc::new(AtomicBool::new(false));
    let address = server
        .url()
        .trim_start_matches("redis://")
        .trim_end_matches("/0")
        .to_owned();
    let via = proxy(address, Arc::clone(&silent)).await;
    let client = redis::Client::open(via).unwrap();
    // A PONG may take its time on a loaded machine: 10 s before the connection counts as dead.
    let patient = Duration::from_secs(10);
    let mut subscription =
        Subscription::open(&client, &["news"], Duration::from_millis(100), patient)
            .await
            .unwrap();
    // Messages arrive while the connection is alive, across several checks.
    let direct = redis::Client::open(server.url()).unwrap();
    let mut conn = direct.get_multiplexed_async_connection().await.unwrap();
    for i in 0..3 {
        let _: i64 = redis::cmd("PUBLISH")
            .arg("news")
            .arg(i)
            .query_async(&mut conn)
            .await
            .unwrap();
        let msg = subscription.next().await.unwrap();
        assert_eq!(msg.get_payload::<i64>().unwrap(), i);
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    // Silent from now on: the next check finds it dead (bounded here only so that a failure
    // reports instead of hanging; it used to wait for good).
    silent.store(true, Ordering::SeqCst);
    let ended = tokio::time::timeout(Duration::from_secs(60), subscription.next()).await;
    assert!(matches!(ended, Ok(Err(_))), "{ended:?}");
}

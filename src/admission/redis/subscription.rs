//! A Redis pub/sub subscription that notices when its connection died without a word.
//!
//! A subscriber only reads: when Redis fails over without closing the socket, or a NAT or load
//! balancer in between drops a quiet connection, nothing ever arrives and nothing says so (the
//! redis crate's pub/sub connection has no keepalive and no read timeout). Every message lost
//! then stays lost: a pre-emptible lease never hears that it was asked to leave, waiters are
//! woken by polling only. So a [`Subscription`] sends a `PING` on the same connection every
//! `every` and ends with an error when none comes back within [`PING_TIMEOUT`]; its owner
//! subscribes again at once, and wakes whoever may have missed a message meanwhile.

use std::time::Duration;

use futures::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use redis::{ErrorKind, Msg, RedisError, RedisResult};

/// How long a subscription must have lived to be opened again at once when it fails (one that
/// fails sooner waits a heartbeat: no loop of reconnections against a server that closes every
/// subscriber).
pub const LIVED: Duration = Duration::from_secs(1);

/// How long connecting and subscribing may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a `PING` may take to come back (a Redis call's timeout).
pub const PING_TIMEOUT: Duration = Duration::from_millis(500);

/// Messages of some channels, from a connection checked every so often.
pub struct Subscription {
    sink: PubSubSink,
    stream: PubSubStream,
    check: tokio::time::Interval,
    ping_timeout: Duration,
}

fn timed_out(what: &'static str) -> RedisError {
    RedisError::from((ErrorKind::IoError, what))
}

impl Subscription {
    /// Subscribes to `channels` on a new connection of `client`, checked every `every` (a
    /// `PING` answered within `ping_timeout`, [`PING_TIMEOUT`] in the gateway).
    pub async fn open(
        client: &redis::Client,
        channels: &[&str],
        every: Duration,
        ping_timeout: Duration,
    ) -> RedisResult<Self> {
        let open = async {
            let (mut sink, stream) = client.get_async_pubsub().await?.split();
            for channel in channels {
                sink.subscribe(*channel).await?;
            }
            Ok::<_, RedisError>((sink, stream))
        };
        let (sink, stream) = tokio::time::timeout(OPEN_TIMEOUT, open)
            .await
            .map_err(|_| timed_out("subscribing took too long"))??;
        let mut check = tokio::time::interval(every);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is now: the connection was just proven.
        check.reset();
        Ok(Self {
            sink,
            stream,
            check,
            ping_timeout,
        })
    }

    /// The next message; an error once the connection is closed or found dead (no answer to a
    /// `PING` within [`PING_TIMEOUT`]). Cancel-safe.
    pub async fn next(&mut self) -> RedisResult<Msg> {
        loop {
            tokio::select! {
                msg = self.stream.next() => {
                    return msg.ok_or_else(|| timed_out("the subscription's connection closed"));
                }
                _ = self.check.tick() => {
                    // A subscribed connection answers `PING` with an array: any reply will do.
                    tokio::time::timeout(self.ping_timeout, self.sink.ping::<redis::Value>())
                        .await
                        .map_err(|_| timed_out("the subscription's connection stopped answering"))??;
                }
            }
        }
    }
}

//! The pump: one task per streamed response that reads vLLM at the engine's pace and puts the
//! rendered SSE bytes in the client's buffer ([`super::client`]), so that counting, promotion,
//! cuts, the timeouts and the seat's release follow the engine, never the client's reading.
//!
//! It runs on the gateway's task tracker (shutdown waits for it) and owns the [`Relay`]: the
//! lane guard and the upstream stream. It ends
//!
//! - at the stream's end, after the last bytes went in the buffer (the seat and tokens were
//!   given back at the finish reason; the client reads the rest at its own pace, taking some
//!   at least every `server.client_write_timeout`, or it is cut: [`ClientTx::finish`]);
//! - when the client goes away (the response body dropped): at once, as before; dropping the
//!   relay aborts the engine's work and records `cancelled`;
//! - when the client is too slow ([`GatewayError::ClientTooSlow`]): more than
//!   `server.client_buffer_bytes` waiting for it, or nothing taken for
//!   `server.client_write_timeout` while bytes wait. The engine's work is aborted, the seat
//!   given back, the request recorded with the code `client_too_slow`, and the response body
//!   ends with an error (the connection is closed, or the HTTP/2 stream reset); a body the server
//!   has not taken down within the write timeout after that closes the client's connection
//!   ([`super::ConnectionCloser`]).

use std::any::Any;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use tokio_util::task::TaskTracker;

use super::client::{self, ClientBody, ClientLimits, ClientTx, ConnectionCloser};
use super::{answer, Format, Relay};
use crate::error::GatewayError;
use crate::telemetry::relay_metrics::TooSlow;

impl Relay {
    /// Starts the pump on `tasks` and returns the SSE body it fills; the first event of an
    /// `/answer` stream is `meta`. `connection` is the client's, closed if a cut body is not
    /// taken down in time.
    pub fn into_sse(
        self,
        tasks: &TaskTracker,
        limits: ClientLimits,
        connection: Option<ConnectionCloser>,
    ) -> ClientBody {
        let (tx, body) = client::buffer(limits, connection);
        tasks.spawn(pump(self, tx));
        body
    }

    /// Ends the request because its client did not take the stream in time: aborts the
    /// engine's work, frees the seat and ends the record.
    fn end_for_slow_client(&mut self, reason: TooSlow) {
        let err = GatewayError::ClientTooSlow;
        tracing::info!(request_id = %self.request_id(), lane = %self.class.lane, tokens = self.produced(), reason = reason.as_str(), "stream ended: the client did not take its bytes in time");
        self.ctx.metrics.relay().too_slow(reason);
        self.upstream.abort_now();
        self.finish(err.outcome(), Some(err.code()));
    }
}

/// How a stream's reading ended (what the pump does next).
enum Ending {
    /// The client went away: dropping the relay aborts the engine's work and records the
    /// cancellation.
    Gone,
    /// The stream's last bytes are in the buffer.
    Read,
    /// The client did not take its bytes in time.
    TooSlow(TooSlow),
}

/// Reads `relay` to its end into `client` (see the module doc). A panic in the reading (a
/// bug) ends the stream as an error the client's format shows (`/answer`: an `error` event
/// `internal`; `/v1`: an error chunk then `[DONE]`), after the engine's work is aborted and
/// the seat and tokens are given back: [`panicked`].
async fn pump(mut relay: Relay, mut client: ClientTx) {
    let read = AssertUnwindSafe(read(&mut relay, &mut client))
        .catch_unwind()
        .await;
    match read {
        Ok(Ending::Gone) => drop(relay),
        Ok(Ending::Read) => {
            let metrics = relay.ctx.metrics.relay().clone();
            client.finish(move || metrics.too_slow(TooSlow::WriteTimeout));
        }
        Ok(Ending::TooSlow(reason)) => too_slow(relay, client, reason),
        Err(panic) => panicked(relay, client, &*panic),
    }
}

async fn read(relay: &mut Relay, client: &mut ClientTx) -> Ending {
    if relay.format == Format::Answer {
        let meta = answer::meta_event(
            relay.request_id(),
            &relay.class,
            relay.timings(),
            relay.ctx.focus.as_ref(),
        );
        // Into an empty buffer: it always fits.
        let _ = client.send(meta);
    }
    let mut watch = client.watch();
    loop {
        let next = tokio::select! {
            biased;
            () = client.closed() => return Ending::Gone,
            () = client.stalled(&mut watch) => return Ending::TooSlow(TooSlow::WriteTimeout),
            next = relay.next_bytes() => next,
        };
        let Some(frame) = next else {
            return Ending::Read;
        };
        if client.send(frame).is_err() {
            return Ending::TooSlow(TooSlow::BufferFull);
        }
    }
}

/// Ends a stream whose reading panicked: counts and logs it (the panic's place went to stderr
/// with the panic report, `crate::telemetry::panic`), aborts the engine's work, gives the seat
/// and tokens back, records the request `internal` (unless the engine had finished it: that
/// record stands) and tells the client.
fn panicked(mut relay: Relay, mut client: ClientTx, panic: &(dyn Any + Send)) {
    relay.ctx.metrics.panicked("relay");
    tracing::error!(
        request_id = %relay.request_id(),
        lane = %relay.class.lane,
        panic = crate::telemetry::panic::message(panic),
        "the relay panicked: the stream ends with an internal error"
    );
    let err = GatewayError::Internal;
    relay.upstream.abort_now();
    let mut out = Vec::new();
    relay.render_error(&err, &mut out);
    relay.finish(err.outcome(), Some(err.code()));
    let metrics = relay.ctx.metrics.relay().clone();
    drop(relay);
    if client.send(out.into()).is_err() {
        metrics.too_slow(TooSlow::BufferFull);
        return client.cut();
    }
    client.finish(move || metrics.too_slow(TooSlow::WriteTimeout));
}

/// Cuts a client that did not take its bytes in time. When the engine had finished already,
/// the request's record stands (it was served); the client only gets less of it.
fn too_slow(mut relay: Relay, client: ClientTx, reason: TooSlow) {
    if relay.done {
        relay.ctx.metrics.relay().too_slow(reason);
    } else {
        relay.end_for_slow_client(reason);
    }
    client.cut();
}

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

/// Reads `relay` to its end into `client` (see the module doc).
async fn pump(mut relay: Relay, mut client: ClientTx) {
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
            // Dropping the relay aborts the engine's work and records the cancellation.
            () = client.closed() => return,
            () = client.stalled(&mut watch) => return too_slow(relay, client, TooSlow::WriteTimeout),
            next = relay.next_bytes() => next,
        };
        let Some(frame) = next else {
            let metrics = relay.ctx.metrics.relay().clone();
            client.finish(move || metrics.too_slow(TooSlow::WriteTimeout));
            return;
        };
        if client.send(frame).is_err() {
            return too_slow(relay, client, TooSlow::BufferFull);
        }
    }
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

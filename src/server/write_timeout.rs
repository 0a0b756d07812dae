//! A client connection whose writes fail once the client has taken nothing for twice
//! `server.client_write_timeout` (a stream's own cut comes first, at once): a write that stays pending that long (the client's receive
//! window closed, the socket's send buffer full) ends with `TimedOut`, and the server closes the
//! connection. Without it a client that stops reading holds its connection (and its request's
//! `server.max_requests_in_flight` permit) for as long as it keeps answering TCP's window
//! probes. Reads pass through untouched; the timer runs only while a write is blocked.

use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// `inner` with writes bounded by a timeout (see the module doc).
#[derive(Debug)]
pub struct WriteTimeout<T> {
    inner: T,
    timeout: Duration,
    /// Armed while a write is blocked.
    blocked: Option<Pin<Box<Sleep>>>,
}

impl<T> WriteTimeout<T> {
    /// Wraps `inner`.
    pub fn new(inner: T, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            blocked: None,
        }
    }

    /// What a write that returned `poll` becomes: pending until the timeout, then `TimedOut`.
    fn bounded<R>(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        if poll.is_ready() {
            self.blocked = None;
            return poll;
        }
        let timeout = self.timeout;
        let timer = self
            .blocked
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client took nothing for server.client_write_timeout_ms",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteTimeout<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteTimeout<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.bounded(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.bounded(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_flush(cx);
        self.bounded(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.bounded(cx, poll)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_write_the_reader_never_takes_fails_after_the_timeout() {
        // A 64-byte pipe nobody reads.
        let (ours, _theirs) = tokio::io::duplex(64);
        let mut conn = WriteTimeout::new(ours, Duration::from_secs(30));
        conn.write_all(&[0; 64]).await.unwrap();
        let err = conn.write_all(&[0; 64]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_keeps_taking_is_never_timed_out() {
        let (ours, mut theirs) = tokio::io::duplex(64);
        let mut conn = WriteTimeout::new(ours, Duration::from_secs(30));
        let reader = tokio::spawn(async move {
            let mut buf = [0; 64];
            let mut total = 0;
            while total < 64 * 10 {
                // Slower than the timeout in all, each piece within it.
                tokio::time::sleep(Duration::from_secs(20)).await;
                total += tokio::io::AsyncReadExt::read(&mut theirs, &mut buf)
                    .await
                    .unwrap();
            }
        });
        for _ in 0..10 {
            conn.write_all(&[0; 64]).await.unwrap();
        }
        reader.await.unwrap();
    }
}

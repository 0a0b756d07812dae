//! Response bodies that stop early: a job's followers at shutdown (`jobs.rs`), a revoked key's
//! streams (`auth.rs`).

/// `stream` until `end` resolves, then `last` (if any) and the end: the response bodies that
/// stop early (a job's followers at shutdown, a revoked key's streams). Dropping `stream` stops
/// what feeds it (a relay sees its client go).
pub(crate) fn until<S, T>(
    stream: S,
    end: impl std::future::Future<Output = ()> + Send + 'static,
    last: Option<T>,
) -> futures::stream::BoxStream<'static, T>
where
    S: futures::Stream<Item = T> + Send + Unpin + 'static,
    T: Send + 'static,
{
    use futures::StreamExt;
    let state = Some((stream, Box::pin(end), last));
    futures::stream::unfold(state, |state| async move {
        let (mut stream, mut end, last) = state?;
        tokio::select! {
            biased;
            () = &mut end => {
                drop(stream);
                last.map(|l| (l, None))
            }
            item = stream.next() => item.map(|i| (i, Some((stream, end, last)))),
        }
    })
    .boxed()
}

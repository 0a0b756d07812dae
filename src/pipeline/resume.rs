//! How a pre-emptible `/answer` goes on (`jobs.preempt_answers`, either quota backend): a large
//! `/answer` so marked first borrows an idle seat as a job does ([`borrow`]); when admission
//! asks that seat back, its relay lets the engine's request go and calls [`Resume`], which
//! builds the continuation (the messages and the text the client has, continued:
//! [`Ready::continued`]), waits for a seat (another idle one to borrow while it may still be
//! pre-empted, else the head of its lane's queue, ahead of the requests that never ran, holding
//! the seat it gets there to its end) and sends it as `<request id>-p<n>`.

use futures::future::BoxFuture;
use futures::FutureExt;
use serde_json::Value;

use super::classify::Ready;
use super::ctx::RequestCtx;
use crate::admission::preempt::Preemptible;
use crate::admission::{Ask, LaneGuard};
use crate::error::GatewayError;
use crate::relay::Continuation;
use crate::upstream::{UpstreamRequest, UpstreamStream};

/// A pre-emptible `ready`'s borrowed seat, when an idle one fits it now (`None`: it queues as
/// any request, not pre-emptible).
pub(super) async fn borrow(ctx: &RequestCtx, ready: &Ready) -> Option<LaneGuard> {
    if !ready.preemptible {
        return None;
    }
    let handle = Preemptible::new(ctx.config().jobs.max_preemptions > 0);
    let class = &ready.class;
    ctx.admission()
        .borrow(class.lane, class.work, ready.prefill, &handle)
        .await
}

/// What a pre-empted `/answer` needs to go on: the request as first sent, and whose it is.
#[derive(Debug)]
pub(super) struct Resume {
    ctx: RequestCtx,
    stored: Value,
    request_id: String,
    traceparent: Option<String>,
    tenant: Option<String>,
}

impl Resume {
    /// For `ready`, sent as `request_id`.
    pub fn new(
        ctx: &RequestCtx,
        ready: &Ready,
        request_id: &str,
        traceparent: Option<String>,
    ) -> Self {
        Self {
            ctx: ctx.clone(),
            stored: ready.stored(),
            request_id: request_id.to_owned(),
            traceparent,
            tenant: ready.tenant().map(|t| t.0.clone()),
        }
    }
}

impl Continuation for Resume {
    fn resume<'a>(
        &'a mut self,
        text: &'a str,
        generated: u32,
        times: u32,
        prompt_counted: Option<u32>,
    ) -> BoxFuture<'a, Result<Option<(UpstreamStream, LaneGuard)>, GatewayError>> {
        async move {
            let max_model_len = self.ctx.config().upstream.max_model_len.get();
            let counted = prompt_counted.map(|n| (n, max_model_len));
            let Some(ready) = Ready::continued(&self.stored, text, generated, counted) else {
                return Ok(None);
            };
            let (lane, work, prefill) = (ready.class.lane, ready.class.work, ready.prefill);
            let admission = self.ctx.admission();
            let handle = Preemptible::new(times < self.ctx.config().jobs.max_preemptions);
            let guard = match admission.borrow(lane, work, prefill, &handle).await {
                Some(guard) => guard,
                None => admission
                    .acquire(
                        Ask::new(lane, work)
                            .with_prefill(prefill)
                            .for_tenant(self.tenant.as_deref())
                            .continuing(),
                    )
                    .await
                    .map_err(GatewayError::from)?,
            };
            let continues_answer = crate::upstream::request::continues_answer(&ready.body);
            let request = UpstreamRequest {
                endpoint: ready.endpoint,
                request_id: format!("{}-p{times}", self.request_id),
                traceparent: self.traceparent.clone(),
                body: ready.body,
                affinity: ready.affinity,
                pin: None,
                continues_answer,
            };
            let upstream = self
                .ctx
                .upstream()
                .stream(request)
                .await
                .map_err(GatewayError::from)?;
            Ok(Some((upstream, guard)))
        }
        .boxed()
    }
}

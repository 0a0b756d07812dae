//! [`RedisJobs`]: the job service's backend over the shared store in Redis.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use serde_json::Value;

use super::store::RedisStore;
use super::{events, run, tasks};
use crate::error::GatewayError;
use crate::jobs::backend::{EventStream, JobBackend, NewJob, Take};
use crate::jobs::context::Context;
use crate::pipeline::{NotTaken, Tenant};

/// The Redis backend of one replica (a cheap handle).
#[derive(Debug, Clone)]
pub struct RedisJobs(Arc<RedisStore>);

impl RedisJobs {
    /// The backend on the quota's Redis, with its beat and listener running until the gateway
    /// stops (when jobs are enabled); `None` when the quota is not in Redis.
    pub fn start(ctx: &Arc<Context>) -> Option<Self> {
        let admission = ctx.state.admission().shared()?.clone();
        let store = Arc::new(RedisStore::new(ctx.clone(), admission));
        if ctx.config.enabled {
            let watch = ctx.state.metrics().background();
            tokio::spawn(watch.watch("jobs heartbeat", tasks::beat(store.clone())));
            tokio::spawn(watch.watch("jobs listener", tasks::listen(store.clone())));
        }
        Some(Self(store))
    }
}

impl JobBackend for RedisJobs {
    /// At least every heartbeat: another replica's submission is seen then.
    fn poll_every(&self) -> Option<Duration> {
        Some(self.0.admission.lease_timing().1)
    }

    fn has_room(&self, bytes: u64) -> bool {
        self.0.has_room(bytes)
    }

    fn adopt(&self, job: NewJob) -> BoxFuture<'_, Result<(), Box<NotTaken>>> {
        async move {
            let NewJob {
                ready,
                record,
                notify,
                share,
            } = job;
            let id = record.request_id().to_owned();
            let traceparent = record.upstream_traceparent();
            let submitted = self
                .0
                .submit(&id, &ready, notify.as_ref(), traceparent, share)
                .await;
            if let Err(error) = submitted {
                return Err(Box::new(NotTaken {
                    ready,
                    record,
                    error,
                }));
            }
            drop(ready);
            // The classified request is kept in Redis (any replica may run it); the
            // submission's record is handed over to the run's.
            record.hand_over();
            tracing::info!(job = %id, "job queued (shared store)");
            Ok(())
        }
        .boxed()
    }

    fn status<'a>(
        &'a self,
        id: &'a str,
        tenant: Option<&'a Tenant>,
    ) -> BoxFuture<'a, Result<Value, GatewayError>> {
        self.0.status(id, tenant).boxed()
    }

    fn cancel<'a>(
        &'a self,
        id: &'a str,
        tenant: Option<&'a Tenant>,
    ) -> BoxFuture<'a, Result<Value, GatewayError>> {
        async move {
            let (view, ended_here) = self.0.cancel(id, tenant).await?;
            if ended_here {
                self.0.notify_ended(id).await;
            }
            Ok(view)
        }
        .boxed()
    }

    fn exists<'a>(
        &'a self,
        id: &'a str,
        tenant: Option<&'a Tenant>,
    ) -> BoxFuture<'a, Result<(), GatewayError>> {
        self.0.check(id, tenant).boxed()
    }

    fn events<'a>(
        &'a self,
        id: &'a str,
        tenant: Option<&'a Tenant>,
        from: (u64, usize),
    ) -> BoxFuture<'a, Result<EventStream, GatewayError>> {
        async move {
            self.0.check(id, tenant).await?;
            Ok(events::stream(self.0.clone(), id.to_owned(), from).boxed())
        }
        .boxed()
    }

    fn take(&self) -> BoxFuture<'_, Take> {
        run::take(&self.0).boxed()
    }
}

//! [`RedisStore`]: the jobs' keys and scripts in Redis, and the calls that read, submit and
//! cancel a job (the data layout is in `redis/mod.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{Script, ScriptInvocation};
use serde_json::{json, Value};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::admission::RedisAdmission;
use crate::error::GatewayError;
use crate::jobs::backend::{too_large, Resumed};
use crate::jobs::context::Context;
use crate::jobs::entry::{Status, Webhook};
use crate::jobs::webhook;
use crate::pipeline::{Ready, Tenant};
use crate::telemetry::throttle::Throttle;

macro_rules! jobs_script {
    ($name:literal) => {
        Script::new(concat!(
            include_str!("../../../lua/quota_common_v2.lua"),
            "\n",
            include_str!("../../../lua/jobs_common_v2.lua"),
            "\n",
            include_str!(concat!("../../../lua/", $name))
        ))
    };
}

/// The jobs scripts, loaded once.
#[derive(Debug)]
pub struct Scripts {
    submit: Script,
    pub take: Script,
    pub push: Script,
    pub end: Script,
    cancel: Script,
    pub beat: Script,
    /// The webhook's state, written while the job exists; whether it keeps its result.
    set_webhook: Script,
}

impl Default for Scripts {
    fn default() -> Self {
        Self {
            submit: jobs_script!("jobs_submit_v2.lua"),
            take: jobs_script!("jobs_take_v2.lua"),
            push: jobs_script!("jobs_push_v2.lua"),
            end: jobs_script!("jobs_end_v2.lua"),
            cancel: jobs_script!("jobs_cancel_v2.lua"),
            beat: jobs_script!("jobs_beat_v2.lua"),
            set_webhook: Script::new(
                "local status = redis.call('HGET', KEYS[1], 'status') \
                 if not status then return 0 end \
                 redis.call('HSET', KEYS[1], 'webhook', ARGV[1]) \
                 if status == 'expired' then return 0 end return 1",
            ),
        }
    }
}

/// A job this replica runs.
#[derive(Debug, Clone)]
pub struct Run {
    /// Its token (the seat's lease id): what the scripts check before it writes the job.
    pub token: String,
    /// Cancelled by `DELETE` (from any replica): the job ends cancelled.
    pub cancel: CancellationToken,
    /// The run no longer owns the job (another run does), or the store stayed unreachable:
    /// it stops and writes nothing more.
    pub lost: CancellationToken,
}

/// The shared job store as one replica sees it: its keys, scripts, the announcements it
/// receives and the jobs it runs.
#[derive(Debug)]
pub struct RedisStore {
    /// The service's context.
    pub ctx: Arc<Context>,
    /// The quota's Redis: connections, leases, the take script's prelude.
    pub admission: RedisAdmission,
    /// `<prefix>:{quota}`.
    pub base: String,
    queue: String,
    running_key: String,
    ended: String,
    meta: String,
    /// `:jobs:changed`.
    pub channel: String,
    pub scripts: Scripts,
    /// Every announcement on `:jobs:changed` (job ids; `cancel <id>`), for event streams,
    /// cancels and runs waiting on a job.
    pub changes: broadcast::Sender<Arc<str>>,
    /// The jobs this replica runs, by id.
    running: Mutex<HashMap<String, Run>>,
    /// The fleet's live jobs and bytes as of the last beat (a diverted `/answer` asks whether
    /// a job would be taken without a round trip).
    pub last: Mutex<(usize, u64)>,
    /// `jobs.result_ttl`, ms.
    pub result_ttl_ms: u64,
}

/// One job's record as read from Redis.
pub type Fields = HashMap<String, String>;

/// How long a submit whose reply was lost (a timeout, a dropped connection: its script may have
/// queued the job) is asked again under the same id, 100 ms apart: an answer "it exists" then
/// says the lost call queued it. Given up, the submission fails (`job_store_unavailable`).
const SUBMIT_RETRY_FOR: Duration = Duration::from_secs(3);

/// The fields of a job's record its status and webhook read: never its stored request (up to
/// `server.max_body_bytes`), which only the run that takes the job needs.
const VIEW_FIELDS: &[&str] = &[
    "status",
    "tenant",
    "submitted_ms",
    "started_ms",
    "finished_ms",
    "lane",
    "input",
    "output_budget",
    "attempt",
    "preempted",
    "progress",
    "answer",
    "error",
    "notify",
    "webhook",
];

/// The fields named in `names` that a record holds, from an `HMGET` reply in their order.
fn fields_of(names: &[&str], values: Vec<Option<String>>) -> Fields {
    names
        .iter()
        .zip(values)
        .filter_map(|(name, v)| Some(((*name).to_owned(), v?)))
        .collect()
}

impl RedisStore {
    /// The store on the quota's Redis (`admission`).
    pub fn new(ctx: Arc<Context>, admission: RedisAdmission) -> Self {
        let base = admission.keys().base.clone();
        let key = |name: &str| format!("{base}:{name}");
        Self {
            queue: key("jobs:queue"),
            running_key: key("jobs:running"),
            ended: key("jobs:ended"),
            meta: key("jobs:meta"),
            channel: key("jobs:changed"),
            base,
            admission,
            scripts: Scripts::default(),
            changes: broadcast::channel(1024).0,
            running: Mutex::new(HashMap::new()),
            last: Mutex::new((0, 0)),
            result_ttl_ms: u64::try_from(ctx.config.result_ttl.as_millis()).unwrap_or(u64::MAX),
            ctx,
        }
    }

    pub fn running(&self) -> MutexGuard<'_, HashMap<String, Run>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A connection, or 503 `job_store_unavailable` while Redis is unreachable.
    pub async fn conn(&self) -> Result<ConnectionManager, GatewayError> {
        self.admission
            .connection_ready()
            .await
            .ok_or(GatewayError::JobStoreDown)
    }

    pub fn job_key(&self, id: &str) -> String {
        format!("{}:job:{id}", self.base)
    }

    pub fn text_key(&self, id: &str) -> String {
        format!("{}:job:{id}:text", self.base)
    }

    /// The keys every jobs script takes after the quota's five, for job `id` (a placeholder
    /// for scripts about many jobs).
    pub fn keys(&self, id: Option<&str>) -> [String; 6] {
        let id = id.unwrap_or("-");
        [
            self.queue.clone(),
            self.running_key.clone(),
            self.ended.clone(),
            self.meta.clone(),
            self.job_key(id),
            self.text_key(id),
        ]
    }

    /// The queue's key.
    pub fn queue_key(&self) -> &str {
        &self.queue
    }

    pub fn call<'a>(&self, script: &'a Script, id: Option<&str>) -> ScriptInvocation<'a> {
        let mut call = self.admission.keys().with_keys(script);
        for key in self.keys(id) {
            call.key(key);
        }
        call.arg(&self.base);
        call
    }

    /// Queues `ready` as job `id`: 429 `jobs_full` at the store's bounds.
    pub async fn submit(
        &self,
        id: &str,
        ready: &Ready,
        notify: Option<&reqwest::Url>,
        traceparent: Option<String>,
        share: f64,
    ) -> Result<(), GatewayError> {
        let config = &self.ctx.config;
        let stored = ready.stored().to_string();
        if let Some(e) = too_large(config, stored.len() as u64, ready.tenant().is_some()) {
            return Err(e);
        }
        let mut conn = self.conn().await?;
        let class = &ready.class;
        let mut call = self.call(&self.scripts.submit, Some(id));
        call.arg(id)
            .arg(ready.tenant().map_or("", |t| t.0.as_str()))
            .arg(share)
            .arg(config.max_jobs)
            .arg(config.max_bytes)
            .arg(stored.len())
            .arg(config.max_jobs_per_tenant)
            .arg(config.max_bytes_per_tenant)
            .arg("request")
            .arg(&stored)
            .arg("work")
            .arg(class.work)
            .arg("prefill")
            .arg(ready.prefill)
            .arg("lane")
            .arg(class.lane.as_str())
            .arg("input")
            .arg(class.input_tokens_estimate)
            .arg("output_budget")
            .arg(class.output_budget);
        if let Some(url) = notify {
            call.arg("notify").arg(url.as_str());
        }
        if let Some(tp) = traceparent {
            call.arg("traceparent").arg(tp);
        }
        // A submit is not undone when its reply is lost: answered "down", a diverted `/answer`
        // ran at once while its job, queued all the same, ran again later (and was charged to
        // its tenant twice); a client of `POST /jobs` got a 503, and its retry made a second
        // job. Asked again under the same id, the script says whether it had queued it.
        let started = tokio::time::Instant::now();
        let mut retried = false;
        let reply: Vec<i64> = loop {
            match call.invoke_async(&mut conn).await {
                Ok(reply) => break reply,
                Err(e)
                    if (e.is_timeout() || e.is_io_error() || e.is_connection_dropped())
                        && started.elapsed() < SUBMIT_RETRY_FOR =>
                {
                    store_down("submit", &e);
                    retried = true;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    conn = self.conn().await?;
                }
                Err(e) => return Err(store_down("submit", &e)),
            }
        };
        let held = reply.get(1).map_or(0, |h| u64::try_from(*h).unwrap_or(0));
        let tenant_full = |what: &'static str, limit: u64| GatewayError::TenantJobsFull {
            tenant: ready.tenant().map(|t| t.0.clone()).unwrap_or_default(),
            what,
            held,
            limit,
        };
        match reply.first().copied().unwrap_or(-1) {
            1 => {
                self.ctx.wake.notify_one();
                Ok(())
            }
            0 => Err(GatewayError::JobsFull),
            -2 => Err(tenant_full("jobs", config.max_jobs_per_tenant as u64)),
            -3 => Err(tenant_full("bytes", config.max_bytes_per_tenant)),
            // Asked again after a lost reply: the lost call had queued it.
            -1 if retried => {
                tracing::info!(job = %id, "a submit whose reply was lost had queued the job");
                self.ctx.wake.notify_one();
                Ok(())
            }
            _ => {
                tracing::error!(job = %id, "a job with this id already exists");
                Err(GatewayError::JobStoreDown)
            }
        }
    }

    /// Job `id`'s record (its [`VIEW_FIELDS`]), its queue position and how many pieces it has,
    /// if `tenant` may see it; with `text`, a finished job's pieces too. The pieces are read
    /// only where the answer is shown: a client polling a running job's status costs Redis a
    /// length, not its text, nor its stored request.
    async fn read(
        &self,
        id: &str,
        tenant: Option<&Tenant>,
        text: bool,
    ) -> Result<(Fields, Option<usize>, usize, Vec<String>), GatewayError> {
        let mut conn = self.conn().await?;
        let (values, rank, count): (Vec<Option<String>>, Option<usize>, usize) = redis::pipe()
            .atomic()
            .hget(self.job_key(id), VIEW_FIELDS)
            .zrank(&self.queue, id)
            .llen(self.text_key(id))
            .query_async(&mut conn)
            .await
            .map_err(|e| store_down("read", &e))?;
        let fields = fields_of(VIEW_FIELDS, values);
        if fields.is_empty() || !visible(&fields, tenant) {
            return Err(GatewayError::JobNotFound);
        }
        let done = fields.get("status").and_then(|s| Status::parse(s)) == Some(Status::Done);
        let pieces = if text && done {
            // A finished job's text no longer changes.
            redis::cmd("LRANGE")
                .arg(self.text_key(id))
                .arg(0)
                .arg(-1)
                .query_async(&mut conn)
                .await
                .map_err(|e| store_down("read", &e))?
        } else {
            Vec::new()
        };
        Ok((fields, rank, count, pieces))
    }

    /// `GET /jobs/{id}`.
    pub async fn status(&self, id: &str, tenant: Option<&Tenant>) -> Result<Value, GatewayError> {
        let (fields, rank, count, pieces) = self.read(id, tenant, true).await?;
        Ok(view(id, &fields, rank, count, &pieces))
    }

    /// Job `id`'s status now (`None`: no such job, or Redis is unreachable).
    pub async fn status_of(&self, id: &str) -> Option<Status> {
        let mut conn = self.conn().await.ok()?;
        let status: Option<String> = redis::cmd("HGET")
            .arg(self.job_key(id))
            .arg("status")
            .query_async(&mut conn)
            .await
            .ok()?;
        Status::parse(&status?)
    }

    /// Ends job `id` failed with `(code, message)` if it is still queued (a replica found it
    /// could never take a seat under the limits in force), its turn passed on as a cancel's;
    /// its webhook is sent. Nothing when it is not queued, or Redis does not answer (tried
    /// again at the next take).
    pub async fn fail_queued(self: &Arc<Self>, id: &str, code: &str, message: &str) {
        let Ok(mut conn) = self.conn().await else {
            return;
        };
        let error = json!({ "code": code, "message": message }).to_string();
        let mut call = self.call(&self.scripts.cancel, Some(id));
        call.arg(id).arg(error);
        let after: Result<String, _> = call.invoke_async(&mut conn).await;
        if after.is_ok_and(|a| a == "ended") {
            tracing::warn!(job = %id, code, "a queued job can never run under the limits in force; failed");
            self.notify_ended(id).await;
        }
    }

    /// `DELETE /jobs/{id}`: a queued job ends at once; a running one (on any replica) when its
    /// runner has dropped its stream (waited for, briefly); a job that had ended (or expired) is
    /// forgotten, its room back, and answered as `expired`. Also says whether this call ended the job (a
    /// queued one: its webhook is the caller's; a running one's runner sends it).
    pub async fn cancel(
        &self,
        id: &str,
        tenant: Option<&Tenant>,
    ) -> Result<(Value, bool), GatewayError> {
        let (mut before, ..) = self.read(id, tenant, false).await?;
        let mut changes = self.changes.subscribe();
        let mut conn = self.conn().await?;
        let mut call = self.call(&self.scripts.cancel, Some(id));
        call.arg(id);
        let after: String = call
            .invoke_async(&mut conn)
            .await
            .map_err(|e| store_down("cancel", &e))?;
        if after == "dropped" {
            // Forgotten: what its status showed as it expired.
            for field in ["answer", "error"] {
                before.remove(field);
            }
            before.insert("status".to_owned(), Status::Expired.as_str().to_owned());
            return Ok((view(id, &before, None, 0, &[]), false));
        }
        let ended_here = after == "ended";
        let running = match after.as_str() {
            "ended" => false,
            other => Status::parse(other).ok_or(GatewayError::JobNotFound)? == Status::Running,
        };
        if running {
            // Its runner, here or elsewhere, is told through the channel.
            if let Some(run) = self.running().get(id) {
                run.cancel.cancel();
            }
            let wait = async {
                loop {
                    if self.status_of(id).await.is_some_and(Status::is_final) {
                        return;
                    }
                    let _ =
                        tokio::time::timeout(Duration::from_millis(200), changed(&mut changes, id))
                            .await;
                }
            };
            let _ = tokio::time::timeout(Duration::from_secs(5), wait).await;
        }
        // Cancelled; still running when the wait ran out (its runner ends it soon); or ended on
        // its own meanwhile (its result kept: a second DELETE drops it).
        Ok((self.status(id, tenant).await?, ended_here))
    }

    /// Checks that job `id` exists for `tenant` (before its event stream starts).
    pub async fn check(&self, id: &str, tenant: Option<&Tenant>) -> Result<(), GatewayError> {
        let mut conn = self.conn().await?;
        let owner: Option<String> = redis::cmd("HGET")
            .arg(self.job_key(id))
            .arg("tenant")
            .query_async(&mut conn)
            .await
            .map_err(|e| store_down("read", &e))?;
        match owner {
            Some(owner) if owner == tenant.map_or("", |t| t.0.as_str()) => Ok(()),
            _ => Err(GatewayError::JobNotFound),
        }
    }

    /// Whether a job of `bytes` would be taken, as of the last beat.
    pub fn has_room(&self, bytes: u64) -> bool {
        let config = &self.ctx.config;
        let (live, kept) = *self.last.lock().unwrap_or_else(PoisonError::into_inner);
        live < config.max_jobs && kept + bytes <= config.max_bytes
    }

    /// Keeps job `id`'s webhook state (unless the job is gone: nothing is created); whether the
    /// job still keeps its result (false once it expired, was dropped by a `DELETE`, or is
    /// gone). Redis unreachable: true (the delivery goes on as configured).
    pub async fn set_webhook(&self, id: &str, webhook: &Webhook) -> bool {
        let Ok(mut conn) = self.conn().await else {
            return true;
        };
        let kept: Result<i64, _> = self
            .scripts
            .set_webhook
            .key(self.job_key(id))
            .arg(webhook.to_json().to_string())
            .invoke_async(&mut conn)
            .await;
        kept.map_or(true, |k| k == 1)
    }

    /// What the earlier runs of job `id`, handed back with its text, produced (`Ok(None)`:
    /// nothing readable; `Err`: Redis did not answer).
    pub async fn resumed(&self, id: &str) -> Result<Option<Resumed>, ()> {
        let mut conn = self.conn().await.map_err(drop)?;
        let (progress, pieces): (Option<String>, Vec<String>) = redis::pipe()
            .cmd("HGET")
            .arg(self.job_key(id))
            .arg("progress")
            .cmd("LRANGE")
            .arg(self.text_key(id))
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .map_err(drop)?;
        let progress = progress.and_then(|p| serde_json::from_str(&p).ok());
        Ok(progress.map(|progress| Resumed {
            text: pieces.concat(),
            progress,
        }))
    }

    /// Job `id`'s record (`Ok(None)`: no such job; `Err`: Redis did not answer).
    pub async fn read_fields(&self, id: &str) -> Result<Option<Fields>, ()> {
        let mut conn = self.conn().await.map_err(drop)?;
        let fields: Fields = redis::cmd("HGETALL")
            .arg(self.job_key(id))
            .query_async(&mut conn)
            .await
            .map_err(drop)?;
        Ok((!fields.is_empty()).then_some(fields))
    }

    /// Sends job `id`'s webhook, if it has one (it just ended: done, failed or cancelled).
    pub async fn notify_ended(self: &Arc<Self>, id: &str) {
        let Ok(mut conn) = self.conn().await else {
            return;
        };
        let names = ["notify", "tenant"];
        let Ok(values) = redis::cmd("HMGET")
            .arg(self.job_key(id))
            .arg(&names)
            .query_async(&mut conn)
            .await
        else {
            return;
        };
        let fields = fields_of(&names, values);
        let Some(notify) = fields.get("notify") else {
            return;
        };
        // Checked again against this replica's `jobs.webhook_allow`, as at submission: the
        // replica that delivers may allow less than the one that took the job (a rollout), and
        // a URL read from Redis is only as trusted as Redis's writers.
        let url = match webhook::check_notify(
            &Value::String(notify.clone()),
            &self.ctx.config.webhook_allow,
        ) {
            Ok(url) => url,
            Err(_) => {
                tracing::warn!(
                    job = %id,
                    "webhook not sent: its URL is not on this replica's jobs.webhook_allow"
                );
                return;
            }
        };
        // The job's status as its own tenant reads it.
        let tenant = fields
            .get("tenant")
            .filter(|t| !t.is_empty())
            .map(|t| Tenant(t.clone()));
        let Ok(status) = self.status(id, tenant.as_ref()).await else {
            return;
        };
        if status["status"] == Status::Expired.as_str() {
            // A DELETE dropped the result between the end and this read (a few round trips):
            // there is nothing left to deliver.
            tracing::info!(job = %id, "webhook not sent: the job's result was dropped first");
            return;
        }
        let body = webhook::body(status, &url, tenant.as_ref().map(|t| t.0.as_str()));
        let (store, id) = (self.clone(), id.to_owned());
        self.ctx.tasks.spawn(async move {
            webhook::send(&store.ctx, &id, url, body, |w| {
                let store = store.clone();
                let id = id.clone();
                async move { store.set_webhook(&id, &w).await }
            })
            .await;
        });
    }
}

/// Whether `tenant` may see the job: its own tenant's, or any job when neither has one.
fn visible(fields: &Fields, tenant: Option<&Tenant>) -> bool {
    fields.get("tenant").map_or("", String::as_str) == tenant.map_or("", |t| t.0.as_str())
}

/// Waits until `id` is announced (or the channel lagged: something may have changed).
pub async fn changed(changes: &mut broadcast::Receiver<Arc<str>>, id: &str) {
    loop {
        match changes.recv().await {
            Ok(what) if &*what == id => return,
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(_)) => return,
            Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
        }
    }
}

/// The status a client is shown for a job whose record says `status`: a job handed back with
/// its text and progress (pre-empted, or cut by the engine), waiting in the shared queue for a
/// replica to continue it, is still `running`, as in process (its answer goes on from where it
/// was; it is not starting over).
pub fn shown(status: Status, resuming: bool) -> Status {
    if status == Status::Queued && resuming {
        Status::Running
    } else {
        status
    }
}

/// Logs a failed call to the job store; 503.
pub fn store_down(op: &str, err: &redis::RedisError) -> GatewayError {
    // Once per client read during an outage: a line a second, with the count held back.
    static LOG: Throttle = Throttle::new(std::time::Duration::from_secs(1));
    if let Some(held_back) = LOG.allow() {
        tracing::warn!(op, error = %err, held_back, "job store call failed");
    }
    GatewayError::JobStoreDown
}

/// Milliseconds since the Unix epoch as seconds, from a record field.
fn at(fields: &Fields, name: &str) -> Option<f64> {
    fields
        .get(name)
        .and_then(|v| v.parse::<f64>().ok())
        .map(|ms| ms / 1000.0)
}

fn number(fields: &Fields, name: &str) -> Option<u64> {
    fields.get(name).and_then(|v| v.parse().ok())
}

fn parsed(fields: &Fields, name: &str) -> Option<Value> {
    fields.get(name).and_then(|v| serde_json::from_str(v).ok())
}

/// The JSON of `GET /jobs/{id}` (and of the webhook) from a job's record: the same shape as
/// in process, plus `runs` (how many times it started).
fn view(id: &str, f: &Fields, rank: Option<usize>, count: usize, pieces: &[String]) -> Value {
    let status = shown(
        f.get("status")
            .and_then(|s| Status::parse(s))
            .unwrap_or(Status::Queued),
        f.contains_key("progress"),
    );
    let mut v = json!({
        "id": id,
        "status": status.as_str(),
        "submitted_at": at(f, "submitted_ms"),
        "started_at": at(f, "started_ms").filter(|_| status != Status::Queued),
        "finished_at": at(f, "finished_ms"),
        "lane": f.get("lane"),
        "estimated_input_tokens": number(f, "input"),
        "output_budget": number(f, "output_budget"),
        "runs": number(f, "attempt").unwrap_or(0),
    });
    if let Some(p) = rank.filter(|_| status == Status::Queued) {
        v["position"] = json!(p);
    }
    // Pre-empted and continued (jobs.preempt), as in process.
    if let Some(n) = number(f, "preempted").filter(|n| *n > 0) {
        v["preempted"] = json!(n);
    }
    if status == Status::Running {
        v["output_pieces"] = json!(count);
    }
    if let Some(mut answer) = parsed(f, "answer").filter(|_| status == Status::Done) {
        answer["text"] = json!(pieces.concat());
        v["answer"] = answer;
    }
    if let Some(error) = parsed(f, "error").filter(|_| status == Status::Failed) {
        v["error"] = error;
    }
    if f.contains_key("notify") {
        v["webhook"] = parsed(f, "webhook").unwrap_or_else(|| Webhook::default().to_json());
    }
    v
}

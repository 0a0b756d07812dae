//! The behaviours of background jobs that do not depend on where jobs are kept, each written
//! once and run against both backends (see `backend_cases!`).

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{json, Value};
use tutor_gateway::config::WebhookPattern;
use tutor_gateway::lane::Lane;

use super::{
    allow, cancel, deliveries, done, error_code, events, forgotten, job, job_until,
    large_seats_only, parse, question, receiver, spawn_post, start, submit, submit_ok, tokens,
    verify, Backend, FAST, SECRET, SLOW,
};
use crate::common::{client, eventually, family_total, json, metric, set_lane, sse, words};

pub async fn a_job_is_submitted_runs_and_its_answer_is_readable(backend: Backend) {
    let h = start(backend, FAST, |_| {}).await;
    let base = h.base();
    let (status, sub) = submit(&base, &question(12)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{sub}");
    let id = sub["id"].as_str().unwrap();
    assert_eq!(sub["status_url"], format!("/jobs/{id}"));
    assert_eq!(sub["events_url"], format!("/jobs/{id}/events"));
    let v = done(&base, id).await;
    assert_eq!(v["lane"], "large", "jobs run in the large lane: {v}");
    let answer = &v["answer"];
    assert_eq!(
        answer["text"].as_str().unwrap().split_whitespace().count(),
        12
    );
    assert_eq!(answer["usage"]["output_tokens"], 12);
    assert_eq!(answer["finish_reason"], "length");
    assert!(
        answer["timings"]["time_to_first_token_ms"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert!(v["started_at"].as_f64().unwrap() >= v["submitted_at"].as_f64().unwrap());
    h.drained().await;
    h.metric_reaches("tutor_gateway_jobs{status=\"done\"}", 1.0)
        .await;
    h.metric_reaches("tutor_gateway_jobs{status=\"queued\"}", 0.0)
        .await;
    h.metric_reaches("tutor_gateway_job_wait_seconds_count", 1.0)
        .await;
    h.metric_reaches("tutor_gateway_job_run_seconds_count", 1.0)
        .await;
    h.metric_reaches(
        "tutor_gateway_requests_total{lane=\"large\",outcome=\"ok\",route=\"job\"}",
        1.0,
    )
    .await;
    // An unknown id is a 404 in the gateway's error shape; so is a path that names a key of a
    // real job's in the store (in Redis its text list: it was a 503 "store unreachable").
    assert_eq!(
        error_code(client().get(h.url("/jobs/nope")).send().await.unwrap()).await,
        (404, "job_not_found".into())
    );
    let text_key = format!("/jobs/{id}:text");
    for req in [
        client().get(h.url(&text_key)),
        client().delete(h.url(&text_key)),
        client().get(h.url(&format!("{text_key}/events"))),
        // An id that is no text: the same JSON 404, not axum's plain-text 400.
        client().get(h.url("/jobs/%FF")),
        client().delete(h.url("/jobs/%FF")),
        client().get(h.url("/jobs/%FF/events")),
    ] {
        assert_eq!(
            error_code(req.send().await.unwrap()).await,
            (404, "job_not_found".into())
        );
    }
    h.shutdown().await;
}

pub async fn bad_jobs_get_the_same_errors_as_answer_and_nothing_is_queued(backend: Backend) {
    let h = start(backend, FAST, |_| {}).await;
    let base = h.base();
    for (body, param) in [
        (json!({"max_output_tokens": 5}), Value::Null),
        (json!({"prompt": "x", "notify": 5}), json!("notify")),
        (
            json!({"prompt": "x", "notify": "http://127.0.0.1:9/hook"}),
            json!("notify"),
        ),
        (json!({"prompt": "x", "stream": true}), Value::Null),
        // Named as /answer names it.
        (
            json!({"prompt": "x", "max_output_tokens": 100_000_000}),
            json!("max_output_tokens"),
        ),
    ] {
        let (status, v) = submit(&base, &body).await;
        assert_eq!(status, 400, "{body} -> {v}");
        assert_eq!(v["error"]["param"], param, "{v}");
    }

    let resp = client()
        .post(h.url("/jobs"))
        .body("{")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let m = h.metrics_text().await;
    assert_eq!(family_total(&m, "tutor_gateway_jobs"), 0.0);
    // A refusal's and an acceptance's x-request-id is the request's own: the job's id.
    let resp = client()
        .post(h.url("/jobs"))
        .json(&json!({"prompt": "x", "max_output_tokens": 100_000_000}))
        .send()
        .await
        .unwrap();
    let refused_id = resp.headers()["x-request-id"].to_str().unwrap().to_owned();
    let resp = client()
        .post(h.url("/jobs"))
        .json(&question(3))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let accepted_id = resp.headers()["x-request-id"].to_str().unwrap().to_owned();
    let job = json(&resp.text().await.unwrap());
    assert_eq!(job["id"], accepted_id.as_str());
    assert_ne!(refused_id, accepted_id);
    done(&base, &accepted_id).await;
    h.shutdown().await;
}

pub async fn events_attached_late_get_all_the_text_and_last_event_id_resumes(backend: Backend) {
    let h = start(backend, SLOW, |_| {}).await;
    let base = h.base();
    let id = submit_ok(&base, &question(60)).await;
    // Attach while it runs, after some text was produced: the pieces so far come first.
    job_until(&base, &id, "running with text", |v| {
        v["output_pieces"].as_u64().unwrap_or(0) >= 3
    })
    .await;
    let live = events(&base, &id, None).await;
    let v = done(&base, &id).await;
    let text = v["answer"]["text"].as_str().unwrap();
    let (streamed, ids) = tokens(&live);
    assert_eq!(streamed, text, "a late attach sees every piece");
    assert_eq!(ids, (1..=ids.len() as u64).collect::<Vec<_>>());
    assert_eq!(live.last().unwrap().event, "done");
    assert_eq!(live.iter().filter(|e| e.event == "done").count(), 1);
    assert_eq!(
        json(&live.last().unwrap().data)["usage"]["output_tokens"],
        60
    );
    // After the end: the whole text again; with Last-Event-ID only what followed that piece.
    let (again, _) = tokens(&events(&base, &id, None).await);
    assert_eq!(again, text);
    let resumed = events(&base, &id, Some("5")).await;
    let (rest, rest_ids) = tokens(&resumed);
    assert_eq!(rest_ids.first(), Some(&6));
    let first_five: String = {
        let (all, _) = tokens(&live);
        all[..all.len() - rest.len()].to_owned()
    };
    assert_eq!(format!("{first_five}{rest}"), text);
    // A new EventSource (a fresh token: the last one expired) cannot set the header: the
    // query's `last_event_id` resumes the same way.
    let resp = client()
        .get(h.url(&format!("/jobs/{id}/events?last_event_id=5")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let by_query = parse(&resp.text().await.unwrap());
    assert_eq!(tokens(&by_query), (rest.clone(), rest_ids.clone()));
    // The last event's id is `end`; a reconnect carrying it is told to stop.
    assert_eq!(live.last().unwrap().id.as_deref(), Some("end"));
    let resp = client()
        .get(h.url(&format!("/jobs/{id}/events")))
        .header("last-event-id", "end")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
    let resp = client()
        .get(h.url(&format!("/jobs/{id}/events")))
        .header("last-event-id", "yesterday")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    h.shutdown().await;
}

pub async fn cancel_while_queued_and_while_running_aborts_and_gives_everything_back(
    backend: Backend,
) {
    let h = start(backend, SLOW, |c| large_seats_only(c, 1)).await;
    let base = h.base();
    let first = submit_ok(&base, &question(2000)).await;
    job_until(&base, &first, "running", |v| v["status"] == "running").await;
    // The large lane's only seat is taken: the second job waits, first in line.
    let second = submit_ok(&base, &question(20)).await;
    let v = job(&base, &second).await;
    assert_eq!(v["status"], "queued");
    assert_eq!(v["position"], 0);
    let cancelled = json(&cancel(&base, &second).await.text().await.unwrap());
    assert_eq!(cancelled["status"], "cancelled");
    // Running: the stream is dropped, the engine aborts the request.
    job_until(&base, &first, "streaming", |v| {
        v["output_pieces"].as_u64().unwrap_or(0) > 0
    })
    .await;
    let resp = cancel(&base, &first).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(json(&resp.text().await.unwrap())["status"], "cancelled");
    eventually("the engine aborted the running job", || {
        h.sim_aborted() >= 1
    })
    .await;
    eventually("the engine runs nothing", || h.sim_running() == 0).await;
    h.drained().await;
    // The queued one never ran.
    assert!(job(&base, &second).await["started_at"].is_null());
    h.metric_reaches("tutor_gateway_jobs{status=\"cancelled\"}", 2.0)
        .await;
    h.metric_reaches("tutor_gateway_jobs{status=\"running\"}", 0.0)
        .await;
    // DELETE of a job that ended drops its result, as its expiry would, and forgets the job
    // (answered with its last status, `expired`): a cancelled one...
    let resp = cancel(&base, &first).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(json(&resp.text().await.unwrap())["status"], "expired");
    h.metric_reaches("tutor_gateway_jobs{status=\"cancelled\"}", 1.0)
        .await;
    // ...and a finished one, whose answer goes.
    let third = submit_ok(&base, &question(3)).await;
    assert!(done(&base, &third).await.get("answer").is_some());
    let resp = cancel(&base, &third).await;
    assert_eq!(resp.status(), 200);
    let v = json(&resp.text().await.unwrap());
    assert_eq!(v["status"], "expired", "{v}");
    assert!(v.get("answer").is_none(), "the result is gone: {v}");
    // Nothing of them is kept: no record a loop of submit and DELETE could pile up.
    for id in [&first, &third] {
        assert_eq!(
            error_code(cancel(&base, id).await).await,
            (404, "job_not_found".into())
        );
        let url = format!("{base}/jobs/{id}");
        assert_eq!(
            error_code(client().get(&url).send().await.unwrap()).await,
            (404, "job_not_found".into())
        );
    }
    h.metric_reaches("tutor_gateway_jobs{status=\"expired\"}", 0.0)
        .await;
    h.metric_reaches("tutor_gateway_jobs{status=\"done\"}", 0.0)
        .await;
    h.shutdown().await;
}

pub async fn jobs_wait_for_interactive_large_requests_and_never_borrow(backend: Backend) {
    let h = start(backend, SLOW, |c| large_seats_only(c, 1)).await;
    let base = h.base();
    // An interactive large request holds the lane's only seat (2,000 tokens, 10 s).
    let big = json!({"prompt": words(8000, "repo"), "max_output_tokens": 2_000});
    let interactive = spawn_post(h.url("/answer"), big);
    eventually("the interactive request holds the seat", || {
        h.in_flight(Lane::Large) == 1
    })
    .await;
    let id = submit_ok(&base, &question(5)).await;
    // Small and medium seats are idle, but a job never takes them.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(job(&base, &id).await["status"], "queued");
    assert_eq!(h.in_flight(Lane::Small) + h.in_flight(Lane::Medium), 0);
    let events = sse(&interactive.await.unwrap());
    assert_eq!(events.last().unwrap().0, "done");
    // The seat came back: the job starts without being asked.
    let v = done(&base, &id).await;
    // Its timings are its run's, as the lane's histograms file them: its seconds in the job
    // queue (job_wait_seconds) are no first token the large lane was slow to give.
    let ttft_ms = v["answer"]["timings"]["time_to_first_token_ms"]
        .as_f64()
        .unwrap();
    let ran_ms = (v["finished_at"].as_f64().unwrap() - v["started_at"].as_f64().unwrap()) * 1e3;
    assert!(ttft_ms <= ran_ms + 1.0, "{v}");
    // The engine's own high-water mark, whatever the timing above: the job never ran beside
    // the interactive request on a small or medium seat.
    assert_eq!(h.sim.engine.snapshot().max_running_seen, 1);
    h.drained().await;
    h.shutdown().await;
}

pub async fn a_finished_job_is_posted_to_its_webhook_signed(backend: Backend) {
    let r = receiver(vec![]).await;
    let h = start(backend, FAST, |c| allow(c, &r)).await;
    let base = h.base();
    let mut body = question(8);
    body["notify"] = json!(r.url);
    let id = submit_ok(&base, &body).await;
    let v = job_until(&base, &id, "delivered", |v| {
        v["webhook"]["delivered"] == true
    })
    .await;
    assert_eq!(v["webhook"]["attempts"][0]["status"], 200);
    let got = r.got.lock().unwrap().clone();
    assert_eq!(got.len(), 1);
    let (headers, posted) = &got[0];
    verify(headers, posted);
    assert_eq!(headers["x-tutor-job-id"], id.as_str());
    let posted = json(posted);
    assert_eq!(posted["id"], id.as_str());
    assert_eq!(posted["status"], "done");
    assert_eq!(posted["answer"]["usage"]["output_tokens"], 8);
    // Under the signature: where it was sent and whose job it is (no tenant without [auth]),
    // so a receiver refuses a delivery meant for another URL or another tenant.
    assert_eq!(posted["notify"], r.url.as_str());
    assert!(posted["tenant"].is_null(), "{posted}");
    let m = h.metrics_text().await;
    assert_eq!(deliveries(&m, "delivered"), 1.0);
    h.shutdown().await;
}

/// With tenants, the signed body names the job's tenant: one school cannot have its own job's
/// signed result taken for another school's by that school's receiver.
pub async fn a_webhook_names_its_jobs_tenant_under_the_signature(backend: Backend) {
    let r = receiver(vec![]).await;
    let key = "key-of-school-a";
    let h = start(backend, FAST, |c| {
        allow(c, &r);
        crate::common::with_keys(c, &[(key, "school-a")]);
    })
    .await;
    let mut body = question(4);
    body["notify"] = json!(r.url);
    let resp = client()
        .post(h.url("/jobs"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    tutor_testkit::eventually("the webhook delivered", || async {
        !r.got.lock().unwrap().is_empty()
    })
    .await;
    let got = r.got.lock().unwrap().clone();
    let (headers, posted) = &got[0];
    verify(headers, posted);
    let posted = json(posted);
    assert_eq!(posted["tenant"], "school-a", "{posted}");
    assert_eq!(posted["notify"], r.url.as_str());
    h.shutdown().await;
}

pub async fn a_webhook_is_retried_until_the_receiver_takes_it(backend: Backend) {
    let r = receiver(vec![500, 503]).await;
    let h = start(backend, FAST, |c| allow(c, &r)).await;
    let base = h.base();
    let mut body = question(4);
    body["notify"] = json!(r.url);
    let id = submit_ok(&base, &body).await;
    let v = job_until(&base, &id, "delivered", |v| {
        v["webhook"]["delivered"] == true
    })
    .await;
    let statuses: Vec<_> = v["webhook"]["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [500, 503, 200]);
    let got = r.got.lock().unwrap().clone();
    assert_eq!(got.len(), 3);
    for (headers, posted) in &got {
        verify(headers, posted);
    }
    let m = h.metrics_text().await;
    assert_eq!(deliveries(&m, "retried"), 2.0);
    assert_eq!(deliveries(&m, "delivered"), 1.0);
    h.shutdown().await;
}

pub async fn a_webhook_outside_the_allow_list_is_refused(backend: Backend) {
    let r = receiver(vec![]).await;
    let h = start(backend, FAST, |c| allow(c, &r)).await;
    let base = h.base();
    let origin = r.origin().to_owned();
    for url in [
        "http://169.254.169.254/latest/meta-data".to_owned(),
        format!("{origin}/admin"),
        r.url.replace("http://", "http://user:pw@"),
        r.url.replace("http://", "https://"),
        format!("{origin}/hooks/..%2Fadmin"),
        "not a url".to_owned(),
        // On the list, but longer than a job keeps (2 KiB).
        format!("{}?{}", r.url, "q".repeat(2_100)),
    ] {
        let mut body = question(4);
        body["notify"] = json!(url);
        let (status, v) = submit(&base, &body).await;
        assert_eq!(status, 400, "{url} -> {v}");
        assert_eq!(v["error"]["param"], "notify");
        assert!(
            !v["error"]["message"].as_str().unwrap().contains(&origin),
            "the URL is not echoed: {v}"
        );
    }
    assert!(r.got.lock().unwrap().is_empty());
    h.shutdown().await;
}

pub async fn a_job_cancelled_while_queued_still_gets_its_webhook(backend: Backend) {
    let r = receiver(vec![]).await;
    let h = start(backend, SLOW, |c| {
        set_lane(c, Lane::Large, 1);
        allow(c, &r);
    })
    .await;
    let base = h.base();
    // The first job holds the only large seat; the second waits.
    let mut body = question(2_000);
    body["notify"] = json!(r.url);
    let first = submit_ok(&base, &body).await;
    job_until(&base, &first, "running", |v| v["status"] == "running").await;
    let mut body = question(5);
    body["notify"] = json!(r.url);
    let second = submit_ok(&base, &body).await;
    assert_eq!(cancel(&base, &second).await.status(), 200);
    let v = job_until(&base, &second, "notified", |v| {
        v["webhook"]["delivered"] == true
    })
    .await;
    assert_eq!(v["status"], "cancelled");
    assert_eq!(json(&r.bodies()[0])["status"], "cancelled");
    // Cancelled again (a client's retry, a second tab): it had ended, nothing is sent again.
    cancel(&base, &second).await;
    // The first one's delivery comes after any the repeat would have sent.
    assert_eq!(cancel(&base, &first).await.status(), 200);
    job_until(&base, &first, "notified", |v| {
        v["webhook"]["delivered"] == true
    })
    .await;
    let ids: Vec<Value> = r.bodies().iter().map(|b| json(b)["id"].clone()).collect();
    assert_eq!(ids, [json!(second), json!(first)], "one delivery per job");
    h.drained().await;
    h.shutdown().await;
}

pub async fn results_expire_after_their_ttl_and_are_then_forgotten(backend: Backend) {
    let h = start(backend, FAST, |c| {
        // Long enough that a loaded machine still sees "done", then "expired", each in its
        // window (an expired job is forgotten after another TTL): a stall of a few seconds
        // must not skip one.
        c.jobs.result_ttl = Duration::from_secs(10);
        c.jobs.max_jobs = 1;
    })
    .await;
    let base = h.base();
    let id = submit_ok(&base, &question(3)).await;
    let finished = done(&base, &id).await;
    assert!(!finished["answer"]["text"].as_str().unwrap().is_empty());
    let v = job_until(&base, &id, "expired", |v| v["status"] == "expired").await;
    assert!(v.get("answer").is_none(), "the result is gone: {v}");
    let events = events(&base, &id, None).await;
    assert_eq!(events.len(), 1);
    assert_eq!(json(&events[0].data)["status"], "expired");
    h.metric_reaches("tutor_gateway_jobs{status=\"expired\"}", 1.0)
        .await;
    // An expired job no longer counts against jobs.max_jobs (1 here).
    let next = submit_ok(&base, &question(3)).await;
    done(&base, &next).await;
    assert!(
        forgotten(&base, &id).await,
        "the expired job was never forgotten"
    );
    h.shutdown().await;
}

pub async fn the_job_store_is_bounded(backend: Backend) {
    let h = start(backend, SLOW, |c| {
        set_lane(c, Lane::Large, 1);
        c.jobs.max_jobs = 2;
    })
    .await;
    let base = h.base();
    for _ in 0..2 {
        assert_eq!(submit(&base, &question(2000)).await.0, 202);
    }
    let resp = client()
        .post(h.url("/jobs"))
        .json(&question(3))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 429);
    assert!(resp.headers().contains_key("retry-after"));
    assert_eq!(
        json(&resp.text().await.unwrap())["error"]["code"],
        "jobs_full"
    );
    h.shutdown().await;
    // Shutting down cancelled (in process) or handed back (Redis) the running job and gave
    // everything back.
}

pub async fn one_tenant_cannot_fill_the_job_store(backend: Backend) {
    let (a, b) = ("key-of-school-a", "key-of-school-b");
    let h = start(backend, SLOW, |c| {
        set_lane(c, Lane::Large, 1);
        c.jobs.max_jobs = 20;
        c.jobs.max_jobs_per_tenant = 5;
        crate::common::with_keys(c, &[(a, "school-a"), (b, "school-b")]);
    })
    .await;
    let post = |key: &str| {
        client()
            .post(h.url("/jobs"))
            .bearer_auth(key)
            .json(&question(2000))
            .send()
    };
    // School A's 20 submissions: 5 are kept, the rest refused with A's own limit.
    let mut kept = 0;
    for _ in 0..20 {
        let resp = post(a).await.unwrap();
        if resp.status() == 202 {
            kept += 1;
            continue;
        }
        assert_eq!(resp.status(), 429);
        assert!(resp.headers().contains_key("retry-after"));
        let err = json(&resp.text().await.unwrap());
        assert_eq!(err["error"]["code"], "tenant_jobs_full", "{err}");
        let message = err["error"]["message"].as_str().unwrap();
        assert!(message.contains("school-a") && message.contains("max_jobs_per_tenant"));
        assert!(!message.contains("school-b"), "{message}");
    }
    assert_eq!(kept, 5);
    // School B is not crowded out.
    let resp = post(b).await.unwrap();
    assert_eq!(resp.status(), 202, "{}", resp.text().await.unwrap());
    h.shutdown().await;
}

/// A tenant at its bounds frees its own room by deleting the results it has read, rather than
/// waiting for them to expire (`jobs.result_ttl_ms`, an hour by default).
pub async fn a_tenant_frees_its_room_by_deleting_a_finished_job(backend: Backend) {
    let (key, other) = ("key-of-school-a", "key-of-school-b");
    let h = start(backend, FAST, |c| {
        c.jobs.max_jobs_per_tenant = 1;
        crate::common::with_keys(c, &[(key, "school-a"), (other, "school-b")]);
    })
    .await;
    let post = || {
        client()
            .post(h.url("/jobs"))
            .bearer_auth(key)
            .json(&question(3))
            .send()
    };
    let resp = post().await.unwrap();
    assert_eq!(resp.status(), 202);
    let id = json(&resp.text().await.unwrap())["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let url = h.url(&format!("/jobs/{id}"));
    let read = || client().get(&url).bearer_auth(key).send();
    let mut tries = 0;
    loop {
        let v = json(&read().await.unwrap().text().await.unwrap());
        if v["status"] == "done" {
            assert!(v.get("answer").is_some(), "{v}");
            break;
        }
        tries += 1;
        assert!(tries < 600, "the job never finished: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Its finished job holds the tenant's one place; the refusal says how to free it.
    let resp = post().await.unwrap();
    assert_eq!(resp.status(), 429);
    let err = json(&resp.text().await.unwrap());
    assert_eq!(err["error"]["code"], "tenant_jobs_full", "{err}");
    assert!(
        err["error"]["message"].as_str().unwrap().contains("DELETE"),
        "{err}"
    );
    // Another tenant's DELETE does not reach it.
    let resp = client()
        .delete(&url)
        .bearer_auth(other)
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(resp).await, (404, "job_not_found".into()));
    assert_eq!(
        json(&read().await.unwrap().text().await.unwrap())["status"],
        "done"
    );
    let resp = client().delete(&url).bearer_auth(key).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let v = json(&resp.text().await.unwrap());
    assert_eq!(v["status"], "expired", "{v}");
    assert!(v.get("answer").is_none(), "the result is gone: {v}");
    assert_eq!(
        error_code(read().await.unwrap()).await,
        (404, "job_not_found".into()),
        "the job is forgotten"
    );
    // The place is free at once.
    let resp = post().await.unwrap();
    assert_eq!(resp.status(), 202, "{}", resp.text().await.unwrap());
    h.shutdown().await;
}

/// A job whose request alone counts more than the store's bytes (or its tenant's) could never
/// be kept: 413 `job_too_large` naming the bound, not a 429 `jobs_full` / `tenant_jobs_full`
/// whose `Retry-After` ("when its results expire") would never come true. Nothing is kept: a
/// small job goes in after it.
pub async fn a_job_no_store_of_its_size_could_keep_is_too_large_not_full(backend: Backend) {
    let key = "key-of-school-a";
    let h = start(backend, SLOW, |c| {
        c.jobs.max_bytes = 20_000;
        c.jobs.max_bytes_per_tenant = 8_000;
        crate::common::with_keys(c, &[(key, "school-a")]);
    })
    .await;
    let post = |body: Value| {
        client()
            .post(h.url("/jobs"))
            .bearer_auth(key)
            .json(&body)
            .send()
    };
    for (words_in, bound) in [
        (6_000, "jobs.max_bytes"),
        (2_500, "jobs.max_bytes_per_tenant"),
    ] {
        let body = json!({"prompt": words(words_in, "big"), "max_output_tokens": 5});
        let resp = post(body).await.unwrap();
        assert_eq!(resp.status(), 413, "{bound}");
        assert!(!resp.headers().contains_key("retry-after"));
        let err = json(&resp.text().await.unwrap());
        assert_eq!(err["error"]["code"], "job_too_large", "{err}");
        let message = err["error"]["message"].as_str().unwrap();
        assert!(message.contains(&format!("{bound} (")), "{message}");
    }
    let resp = post(question(3)).await.unwrap();
    assert_eq!(resp.status(), 202, "{}", resp.text().await.unwrap());
    h.shutdown().await;
}

/// A course job keeps the course's system message and tools with the student's few bytes:
/// the store counts them (as the Redis store, which counts what it stores, always did). A
/// client sending tiny course jobs could otherwise keep a copy of a long prefix per job that
/// `jobs.max_bytes` never saw.
pub async fn a_course_job_counts_its_courses_prefix_against_the_store(backend: Backend) {
    let h = start(backend, SLOW, |c| {
        c.jobs.max_bytes = 20_000;
        let course = tutor_gateway::config::CourseConfig::new(
            "py101",
            "2026.1",
            &words(7_000, "rule"),
            "",
            "",
            None,
        );
        c.courses.insert("py101".into(), course);
    })
    .await;
    let post = |body: Value| client().post(h.url("/jobs")).json(&body).send();
    let body = json!({"course_id": "py101", "prompt": "hi", "max_output_tokens": 5});
    let resp = post(body).await.unwrap();
    assert_eq!(
        resp.status(),
        413,
        "the course's prefix alone is past the store's bytes"
    );
    let err = json(&resp.text().await.unwrap());
    assert_eq!(err["error"]["code"], "job_too_large", "{err}");
    // The same student bytes without the course fit.
    let resp = post(json!({"prompt": "hi", "max_output_tokens": 5}))
        .await
        .unwrap();
    assert_eq!(resp.status(), 202, "{}", resp.text().await.unwrap());
    h.shutdown().await;
}

/// A gateway in real time whose large lane has one seat, diverting reviews to jobs after
/// `after`.
async fn diverting(backend: Backend, after: Duration) -> super::JobsHarness {
    start(backend, SLOW, |c| {
        set_lane(c, Lane::Large, 1);
        c.jobs.divert_large_after = Some(after);
    })
    .await
}

/// An `/answer` review body of 5,500 words and `out` output tokens.
fn review(salt: &str, out: u32) -> Value {
    json!({"prompt": words(5500, salt), "max_output_tokens": out})
}

pub async fn a_large_answer_that_waits_too_long_becomes_a_job(backend: Backend) {
    let h = diverting(backend, Duration::from_millis(150)).await;
    let base = h.base();
    let big = |salt: &str| review(salt, 300);
    // The first large request takes the only seat (it never waits, so it is not diverted) and
    // holds it for 10 s: the second waits its 150 ms there on any machine.
    let first = spawn_post(h.url("/answer"), review("first", 2_000));
    eventually("the first holds the seat", || h.in_flight(Lane::Large) == 1).await;
    let resp = client()
        .post(h.url("/answer"))
        .json(&big("second"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.text().await.unwrap();
    let events = parse(&body);
    assert_eq!(
        events.len(),
        1,
        "one `job` event, then the stream ends: {body}"
    );
    assert_eq!(events[0].event, "job");
    let job_event = json(&events[0].data);
    let id = job_event["id"].as_str().unwrap().to_owned();
    assert!(body.starts_with(&format!("id: job:{id}\n")), "{body}");
    assert_eq!(job_event["status_url"], format!("/jobs/{id}"));
    assert_eq!(h.queued(Lane::Large), 0, "it left the interactive queue");
    // A browser EventSource reconnects with Last-Event-ID: it is told to stop (204), and no
    // new generation starts.
    let again = client()
        .get(h.url("/answer"))
        .query(&[("prompt", "again")])
        .header("last-event-id", format!("job:{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 204);
    // The job runs once the interactive request is done, and ends with the whole answer.
    assert_eq!(sse(&first.await.unwrap()).last().unwrap().0, "done");
    let v = done(&base, &id).await;
    assert_eq!(v["answer"]["usage"]["output_tokens"], 300);
    h.drained().await;
    // The diverted request is counted once, when its job ended: in process under its own
    // record (`answer`); from Redis by the run that took it (`job`).
    let (answers, jobs) = match backend {
        Backend::Local => (2.0, 0.0),
        Backend::Redis => (1.0, 1.0),
    };
    let series = |route: &str| {
        format!("tutor_gateway_requests_total{{lane=\"large\",outcome=\"ok\",route=\"{route}\"}}")
    };
    h.metric_reaches(&series("answer"), answers).await;
    let m = h.metrics_text().await;
    assert_eq!(
        tutor_testkit::metric_or_zero(&m, &series("job")),
        jobs,
        "the diverted request is counted once, when its job ended"
    );
    h.shutdown().await;
}

pub async fn a_review_predicted_to_wait_too_long_becomes_a_job_on_arrival(backend: Backend) {
    let h = diverting(backend, Duration::from_secs(5)).await;
    let base = h.base();
    let big = review;
    // One review runs (the lane's one admission of the last 10 s), one waits behind it. The
    // first runs some 10 s, so it still holds the seat when the third comes on a loaded machine.
    let first = spawn_post(h.url("/answer"), big("first", 2000));
    eventually("the first holds the seat", || h.in_flight(Lane::Large) == 1).await;
    let second = spawn_post(h.url("/answer"), big("second", 100));
    eventually("the second waits", || h.queued(Lane::Large) == 1).await;
    // One ahead at one admission per 10 s: about 10 s predicted, past the 5 s. It becomes a job
    // at once, never joining the queue, and is told why.
    let resp = client()
        .post(h.url("/answer"))
        .json(&big("third", 100))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.text().await.unwrap();
    let events = parse(&body);
    assert_eq!(events.len(), 1, "one `job` event: {body}");
    assert_eq!(events[0].event, "job");
    let job_event = json(&events[0].data);
    assert!(
        job_event["predicted_wait_ms"].as_u64().unwrap() > 5000,
        "{job_event}"
    );
    let id = job_event["id"].as_str().unwrap().to_owned();
    assert_eq!(sse(&first.await.unwrap()).last().unwrap().0, "done");
    let _ = second.await.unwrap();
    let v = done(&base, &id).await;
    assert_eq!(v["answer"]["usage"]["output_tokens"], 100);
    h.drained().await;
    h.shutdown().await;
}

pub async fn an_unreachable_webhook_is_given_up_after_its_attempts(backend: Backend) {
    // Nothing listens there (the port was just free); https, as real receivers are.
    let refused = tutor_testkit::RefusedPort::new();
    let port = refused.port();
    let h = start(backend, FAST, |c| {
        c.jobs.webhook_allow =
            vec![WebhookPattern::parse(&format!("https://127.0.0.1:{port}/*")).unwrap()];
        c.jobs.webhook_secret = Some(SECRET.into());
        c.jobs.webhook_backoff = Duration::from_millis(10);
        c.jobs.webhook_attempts = 2;
    })
    .await;
    let base = h.base();
    let mut body = question(3);
    body["notify"] = json!(format!("https://127.0.0.1:{port}/done"));
    let id = submit_ok(&base, &body).await;
    let v = job_until(&base, &id, "given up", |v| {
        v["webhook"]["delivered"] == false
    })
    .await;
    let attempts = v["webhook"]["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2);
    assert!(attempts
        .iter()
        .all(|a| a["status"].is_null() && a["error"] == "connect"));
    let m = h.metrics_text().await;
    assert_eq!(deliveries(&m, "retried"), 1.0);
    assert_eq!(deliveries(&m, "failed"), 1.0);
    h.shutdown().await;
}

/// A webhook is retried only while its job's result is kept: 20 attempts with a doubling
/// backoff would have gone on for days (past the job's expiry, its body held outside the
/// store's bounds); it is given up once the next attempt would come after the result expires.
pub async fn a_webhook_is_not_retried_past_its_jobs_result(backend: Backend) {
    let r = receiver(vec![500; 20]).await;
    let h = start(backend, FAST, |c| {
        allow(c, &r);
        c.jobs.webhook_backoff = Duration::from_millis(200);
        c.jobs.webhook_attempts = 20;
        c.jobs.result_ttl = Duration::from_secs(3);
    })
    .await;
    let base = h.base();
    let mut body = question(3);
    body["notify"] = json!(r.url);
    let id = submit_ok(&base, &body).await;
    let v = job_until(&base, &id, "given up", |v| {
        v["webhook"]["delivered"] == false
    })
    .await;
    let attempts = v["webhook"]["attempts"].as_array().unwrap();
    assert!((2..20).contains(&attempts.len()), "{v}");
    assert!(attempts.iter().all(|a| a["status"] == 500), "{v}");
    assert_eq!(r.got.lock().unwrap().len(), attempts.len());
    h.shutdown().await;
}

/// A `DELETE` that drops a finished job's result also ends its webhook's retries: they went on
/// (for up to `jobs.result_ttl_ms`, an hour by default) POSTing a result the store no longer
/// keeps.
pub async fn a_webhook_is_not_retried_after_a_delete_drops_its_result(backend: Backend) {
    let r = receiver(vec![500; 50]).await;
    let h = start(backend, FAST, |c| {
        allow(c, &r);
        c.jobs.webhook_backoff = Duration::from_millis(100);
        c.jobs.webhook_attempts = 50;
        c.jobs.result_ttl = Duration::from_secs(3600);
    })
    .await;
    let base = h.base();
    let mut body = question(3);
    body["notify"] = json!(r.url);
    let id = submit_ok(&base, &body).await;
    done(&base, &id).await;
    eventually("the receiver was tried", || {
        !r.got.lock().unwrap().is_empty()
    })
    .await;
    let resp = cancel(&base, &id).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(json(&resp.text().await.unwrap())["status"], "expired");
    // Counted once the DELETE is answered: however long it took (a loaded machine), the
    // attempts before it do not count against the bound below.
    let before = r.got.lock().unwrap().len();
    // Given up at its next attempt, not after fifty.
    h.metric_reaches(
        "tutor_gateway_webhook_deliveries_total{outcome=\"failed\"}",
        1.0,
    )
    .await;
    // At most the attempt under way when the DELETE was answered and the one after it.
    let after = r.got.lock().unwrap().len();
    assert!(after <= before + 2, "{before} attempts, then {after}");
    // The job itself is forgotten with its result.
    let url = format!("{base}/jobs/{id}");
    assert_eq!(
        error_code(client().get(&url).send().await.unwrap()).await,
        (404, "job_not_found".into())
    );
    h.shutdown().await;
}

/// The engine goes away under a running job, then comes back. The run it cut goes on from its
/// text once the engine is ready (`jobs.engine_retries`): its answer is the uninterrupted one,
/// each token counted once (it used to fail, losing the text). The jobs queued meanwhile wait
/// for the engine (`tutor_gateway_jobs_engine_down`) and run when it is back. Every seat and
/// token comes back. With every seat idle, each queued job used to be taken and fail at once,
/// then the next: a whole queue failed within a second of an outage.
pub async fn queued_jobs_wait_out_an_engine_outage_and_the_cut_run_goes_on_from_its_text(
    backend: Backend,
) {
    let sim = vllm_sim::start(&vllm_sim::SimArgs::for_test(SLOW))
        .await
        .unwrap();
    let engine = tutor_testkit::Outage::new(sim.addr.port()).await;
    let h = start(backend, FAST, |c| {
        c.upstream.base_url = format!("http://127.0.0.1:{}", engine.port());
    })
    .await;
    let base = h.base();
    let cut = submit_ok(&base, &question(1500)).await;
    job_until(&base, &cut, "streaming", |v| {
        v["status"] == "running" && v["output_pieces"].as_u64().unwrap_or(0) >= 2
    })
    .await;
    engine.cut();
    h.metric_reaches("tutor_gateway_job_engine_cuts_total", 1.0)
        .await;
    let queued: Vec<String> = {
        let mut ids = Vec::new();
        for _ in 0..3 {
            ids.push(submit_ok(&base, &question(5)).await);
        }
        ids
    };
    h.metric_reaches("tutor_gateway_jobs_engine_down", 1.0)
        .await;
    for id in &queued {
        assert_eq!(job(&base, id).await["status"], "queued");
    }
    // An outage of a second at least: the cut job's run time spans it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let waiting = job(&base, &cut).await;
    // Waiting in its run (in process), or back in the shared queue with its text (Redis):
    // running either way, not starting over.
    assert_eq!(
        waiting["status"], "running",
        "the cut job waits for the engine: {waiting}"
    );
    engine.restore();
    for id in &queued {
        let v = done(&base, id).await;
        assert_eq!(v["answer"]["usage"]["output_tokens"], 5, "{v}");
    }
    let resumed = done(&base, &cut).await;
    assert_eq!(
        resumed["answer"]["usage"]["output_tokens"], 1500,
        "every token once: {resumed}"
    );
    assert_eq!(resumed["answer"]["finish_reason"], "length", "{resumed}");
    // Its run time counts from its first run's start, not the run that went on (the Redis
    // store timed the last run only): the four runs' sum holds the cut job's whole span.
    h.metric_reaches("tutor_gateway_job_run_seconds_count", 4.0)
        .await;
    let span = resumed["finished_at"].as_f64().unwrap() - resumed["started_at"].as_f64().unwrap();
    let ran = tutor_testkit::metric_or_zero(
        &h.h.metrics_text().await,
        "tutor_gateway_job_run_seconds_sum",
    );
    assert!(
        ran >= span - 0.01,
        "the cut job ran {span:.3} s from its start to its end; the runs' sum is {ran:.3} s"
    );
    let whole = done(&base, &submit_ok(&base, &question(1500)).await).await;
    assert_eq!(
        resumed["answer"]["text"], whole["answer"]["text"],
        "the answer goes on where the engine cut it"
    );
    h.metric_reaches("tutor_gateway_jobs_engine_down", 0.0)
        .await;
    h.drained().await;
    h.metric_reaches("tutor_gateway_jobs{status=\"done\"}", 5.0)
        .await;
    h.shutdown().await;
    sim.shutdown().await;
}

/// With `jobs.engine_retries = 0`, the first run the engine cuts fails the job with the reason.
pub async fn a_job_the_engine_cuts_past_its_retries_fails_with_the_reason(backend: Backend) {
    let sim = vllm_sim::start(&vllm_sim::SimArgs::for_test(SLOW))
        .await
        .unwrap();
    let engine = tutor_testkit::Outage::new(sim.addr.port()).await;
    let h = start(backend, FAST, |c| {
        c.upstream.base_url = format!("http://127.0.0.1:{}", engine.port());
        c.jobs.engine_retries = 0;
    })
    .await;
    let base = h.base();
    let cut = submit_ok(&base, &question(2000)).await;
    job_until(&base, &cut, "streaming", |v| {
        v["status"] == "running" && v["output_pieces"].as_u64().unwrap_or(0) >= 2
    })
    .await;
    engine.cut();
    let v = job_until(&base, &cut, "failed", |v| v["status"] == "failed").await;
    assert!(
        v["error"]["code"]
            .as_str()
            .is_some_and(|c| c.starts_with("upstream_")),
        "{v}"
    );
    engine.restore();
    h.drained().await;
    h.shutdown().await;
    sim.shutdown().await;
}

pub async fn jobs_are_refused_clearly_where_they_are_switched_off(backend: Backend) {
    let h = start(backend, FAST, |c| c.jobs.enabled = false).await;
    let (status, v) = submit(&h.base(), &question(3)).await;
    assert_eq!(status, 501);
    assert_eq!(v["error"]["code"], "jobs_unavailable");
    h.shutdown().await;
}

pub async fn jobs_max_running_keeps_large_seats_for_interactive_reviews(backend: Backend) {
    let h = start(backend, SLOW, |c| {
        set_lane(c, Lane::Large, 3);
        c.jobs.max_running = 1;
    })
    .await;
    let base = h.base();
    let first = submit_ok(&base, &question(2000)).await;
    job_until(&base, &first, "running", |v| v["status"] == "running").await;
    let second = submit_ok(&base, &question(5)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        job(&base, &second).await["status"],
        "queued",
        "one job at a time"
    );
    assert_eq!(h.in_flight(Lane::Large), 1, "two large seats stay free");
    // An interactive review takes one of them at once.
    let resp = client()
        .post(h.url("/answer"))
        .json(&json!({"prompt": words(5500, "review"), "max_output_tokens": 5}))
        .send()
        .await
        .unwrap();
    let events = sse(&resp.text().await.unwrap());
    assert_eq!(json(&events[0].1)["queue_wait_ms"], 0.0);
    assert_eq!(events.last().unwrap().0, "done");
    cancel(&base, &first).await;
    done(&base, &second).await;
    // The engine's own high-water mark, whatever the timing above: the first job and the
    // review; the second job never ran beside them.
    assert_eq!(h.sim.engine.snapshot().max_running_seen, 2);
    h.drained().await;
    h.shutdown().await;
}

/// Under `jobs.max_running = 1`, each queued job starts when the one before it ends on its
/// own, with nothing else happening: every job of a short queue ends done. The engine keeps
/// each stream open a while after its last token (no `[DONE]`: the run ends a second after its
/// finish reason), so a job's seat comes back well before its run is over.
pub async fn jobs_under_max_running_follow_each_other_with_nothing_else_happening(
    backend: Backend,
) {
    let sim = crate::common::flags(
        "--speed 50 --profile tiny-test --mean-output-tokens 1000000 --omit-done-rate 1 \
         --omit-done-hang",
    );
    let h = start(backend, &sim, |c| c.jobs.max_running = 1).await;
    let base = h.base();
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(submit_ok(&base, &question(5)).await);
    }
    for id in &ids {
        let v = done(&base, id).await;
        assert_eq!(v["answer"]["usage"]["output_tokens"], 5, "{v}");
    }
    h.drained().await;
    h.shutdown().await;
}

/// A job's `session_id` reservation is given back at submission and its run is not counted in
/// the session's output (a job that waits hours must not move its session's questions to
/// larger lanes meanwhile): after a 300-token job, the session's next question is small; after
/// a 300-token answer, it is medium (past small's 256).
pub async fn a_jobs_output_is_not_counted_in_its_session(backend: Backend) {
    let h = start(backend, FAST, |_| {}).await;
    let base = h.base();
    let ask = |session: &'static str| {
        let url = h.url("/answer");
        async move {
            let body = json!({"prompt": "why", "session_id": session, "max_output_tokens": 10});
            let events = sse(&crate::common::post_text(url, &body).await);
            json(&events[0].1)["lane"].as_str().unwrap().to_owned()
        }
    };
    let long = |session: &str| json!({"prompt": "explain it all", "session_id": session, "max_output_tokens": 300});
    let id = submit_ok(&base, &long("job-session")).await;
    let v = done(&base, &id).await;
    assert_eq!(v["answer"]["usage"]["output_tokens"], 300, "{v}");
    assert_eq!(ask("job-session").await, "small");
    // The same output as an answer counts.
    crate::common::post_text(h.url("/answer"), &long("answer-session")).await;
    assert_eq!(ask("answer-session").await, "medium");
    h.drained().await;
    h.shutdown().await;
}

/// A reload that lowers the large lane's token budget below a queued job's reservation: that
/// job could never take a seat again, and every job behind it waited for good. It fails
/// `too_long`, as it would have on arrival, and the next one runs. (With Redis the reload
/// writes the fleet's shared record, which the take is refused by.)
pub async fn a_queued_job_a_reload_made_too_large_fails_and_the_next_one_runs(backend: Backend) {
    let h = start(backend, SLOW, |c| large_seats_only(c, 1)).await;
    let base = h.base();
    let holder = submit_ok(&base, &question(2_000)).await;
    job_until(&base, &holder, "running", |v| v["status"] == "running").await;
    // 5,000 tokens reserved; the short one behind it about 20.
    let review = json!({"prompt": words(3_000, "review"), "max_output_tokens": 2_000});
    let too_large = submit_ok(&base, &review).await;
    let next = submit_ok(&base, &question(3)).await;
    let mut lowered = (*h.gw.state.config()).clone();
    lowered.upstream.max_model_len = std::num::NonZeroU32::new(4_500).unwrap();
    lowered.lanes.large.max_tokens_in_flight = std::num::NonZeroU64::new(4_500).unwrap();
    let reloaded = tutor_gateway::pipeline::reload::apply(&h.gw.state, lowered).unwrap();
    assert!(reloaded.changed.contains(&"lanes"), "{reloaded:?}");
    assert_eq!(cancel(&base, &holder).await.status(), 200);
    let v = job_until(&base, &too_large, "failed", |v| v["status"] == "failed").await;
    assert_eq!(v["error"]["code"], "too_long", "{v}");
    assert_eq!(done(&base, &next).await["status"], "done");
    h.drained().await;
    h.shutdown().await;
}

/// A course with tools: the simulator's model calls the first one (`--call-tools`). `/answer`
/// streams the call's pieces as `tool_call` events and lists the call, joined, in `done`; a
/// job's answer lists it too (the job's `done` event and its status). Both dropped it before:
/// the student saw no token and a `done` with output tokens.
pub async fn a_courses_tool_call_reaches_the_student_and_the_job(backend: Backend) {
    let tools = json!([
        {"type": "function", "function": {"name": "run_tests", "parameters": {}}},
        {"type": "function", "function": {"name": "lint", "parameters": {}}},
    ]);
    let mut flags = FAST.to_vec();
    flags.push("--call-tools");
    let h = start(backend, &flags, |c| {
        let course = tutor_gateway::config::CourseConfig::new(
            "py101",
            "2026.1",
            "You are a patient Python tutor.",
            "",
            "",
            Some(tools),
        );
        c.courses.insert("py101".into(), course);
    })
    .await;
    let body = json!({"course_id": "py101", "prompt": "do my tests pass?", "max_output_tokens": 9});
    let resp = client()
        .post(h.url("/answer"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let evs = parse(&resp.text().await.unwrap().replacen("retry: 3000\n", "", 1));
    let pieces: Vec<Value> = evs
        .iter()
        .filter(|e| e.event == "tool_call")
        .map(|e| json(&e.data))
        .collect();
    // One piece or several: the engine's chunks carry as many tokens as were ready.
    assert!(!pieces.is_empty(), "the call is streamed: {evs:?}");
    assert_eq!(pieces[0]["name"], "run_tests");
    let arguments: String = pieces
        .iter()
        .map(|p| p["arguments"].as_str().unwrap())
        .collect();
    let parsed = json(&arguments);
    assert_eq!(
        parsed["text"].as_str().unwrap().split_whitespace().count(),
        9,
        "{arguments}"
    );
    // Numbered with the tokens, from 1.
    let ids: Vec<&str> = evs
        .iter()
        .filter(|e| e.event == "tool_call" || e.event == "token")
        .map(|e| e.id.as_deref().unwrap())
        .collect();
    let want: Vec<String> = (1..=ids.len()).map(|n| n.to_string()).collect();
    assert_eq!(ids, want);
    let end = evs.last().unwrap();
    assert_eq!(end.event, "done", "{evs:?}");
    let done_event = json(&end.data);
    assert_eq!(done_event["finish_reason"], "tool_calls");
    let call = &done_event["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "run_tests");
    assert_eq!(call["function"]["arguments"].as_str().unwrap(), arguments);
    assert!(
        call["id"].as_str().is_some_and(|id| !id.is_empty()),
        "{call}"
    );

    let id = submit_ok(&h.base(), &body).await;
    let v = done(&h.base(), &id).await;
    let calls = v["answer"]["tool_calls"]
        .as_array()
        .expect("the job's calls");
    assert_eq!(calls.len(), 1, "{v}");
    assert_eq!(calls[0]["function"]["name"], "run_tests");
    assert_eq!(
        json(calls[0]["function"]["arguments"].as_str().unwrap())["text"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .count(),
        9
    );
    let job_events = events(&h.base(), &id, None).await;
    let last = job_events.last().unwrap();
    assert_eq!(last.event, "done");
    assert_eq!(json(&last.data)["tool_calls"], json!(calls));
    h.drained().await;
    h.shutdown().await;
}

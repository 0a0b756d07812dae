use std::time::Duration;

use super::*;
use crate::lane::Lane;

const MINIMAL: &str = "[classify]\ntokenizer = \"heuristic\"\n";

/// `[auth]` on with one key of tenant `cs101` (tenants exist only with it).
const AUTH: &str = "[auth]\nenabled = true\nkeys = [{ sha256 = \
    \"0000000000000000000000000000000000000000000000000000000000000000\", \
    tenant = \"cs101\" }]\n";

fn issues_of(src: &str) -> Vec<String> {
    match Config::from_toml_str(src) {
        Ok(_) => panic!("config unexpectedly valid:\n{src}"),
        Err(err) => {
            assert!(!err.issues().is_empty(), "expected key issues, got {err}");
            err.issues().iter().map(ToString::to_string).collect()
        }
    }
}

#[test]
fn shipped_file_states_exactly_the_builtin_defaults() {
    // Leaving every key out (but the required tokenizer) must give the shipped file.
    assert_eq!(Config::from_toml_str(MINIMAL).unwrap(), Config::default());
}

#[test]
fn defaults_follow_the_seed() {
    let c = Config::default();
    assert_eq!(c.upstream.base_url, "http://127.0.0.1:8000");
    assert_eq!(c.upstream.model, "meta-llama/Llama-3.1-8B-Instruct");
    assert_eq!(c.upstream.max_model_len.get(), 16_384);
    assert_eq!(c.classify.small_max_work.get(), 1200);
    assert_eq!(c.classify.medium_max_work.get(), 5000);
    assert_eq!(c.classify.tokenizer, TokenizerSource::Heuristic);
    assert_eq!(c.admission.policy, Policy::Lanes);
    let caps: Vec<u32> = Lane::ALL
        .iter()
        .map(|l| c.lanes.get(*l).max_concurrency.get())
        .collect();
    // The seed's 32/20/4, the large lane raised to 10 under the prefill budget (measured).
    assert_eq!(caps, [32, 20, 10]);
    assert_eq!(c.admission.fifo.max_concurrency, None, "fifo 0 = unlimited");
    assert_eq!(c.lanes.small.queue.timeout, Duration::from_millis(5000));
    let abort = &c.upstream.abort;
    assert!(abort.enabled);
    assert_eq!(abort.mode, AbortMode::Auto);
    assert_eq!(abort.method, AbortMethod::Post);
    assert_eq!(
        abort.url(&c.upstream.base_url, "r1"),
        "http://127.0.0.1:8000/inference/v1/abort_requests"
    );
    assert_eq!(abort.body("r1"), r#"{"request_ids":["r1"]}"#);
}

#[test]
fn every_bad_key_is_reported_at_once_with_its_dotted_path() {
    let issues = issues_of(
        r#"
listen = "not an address"
[upstream]
idle_timeout_ms = 0
first_token_timeout_ms = 700000
[classify]
tokenizer = "heuristic"
small_max_work = 6000
[admission]
policy = "round-robin"
[lanes.small]
max_concurrency = 0
[lanes.large]
max_tokens_in_flight = 1000
queue_len = 5
queue_timeout_ms = 0
"#,
    );
    let expected = [
        "listen must be a socket address",
        "upstream.idle_timeout_ms must be > 0",
        "upstream.first_token_timeout_ms must be <= upstream.total_timeout_ms",
        "classify.small_max_work must be < classify.medium_max_work",
        "admission.policy must be \"lanes\", \"strict\" or \"fifo\"",
        "lanes.small.max_concurrency must be > 0",
        "lanes.large.max_tokens_in_flight must be >= upstream.max_model_len",
        "lanes.large.queue_timeout_ms must be > 0 when lanes.large.queue_len > 0",
    ];
    for want in expected {
        assert!(
            issues.iter().any(|i| i.starts_with(want)),
            "missing {want:?} in {issues:#?}"
        );
    }
    assert_eq!(issues.len(), expected.len(), "{issues:#?}");
}

#[test]
fn unknown_keys_and_wrong_types_are_named_by_path_together_with_other_problems() {
    let issues = issues_of(
        r#"
[upstream]
max_model_len = "16k"
[lanes.small]
max_concurency = 8
[classify]
tokenizer = "heuristic"
medium_max_work = 0
[telemetri]
"#,
    );
    let has = |prefix: &str| issues.iter().any(|i| i.starts_with(prefix));
    assert!(has(
        "upstream.max_model_len has an invalid type: expected u32"
    ));
    assert!(has("lanes.small.max_concurency is not a known key"));
    assert!(has("telemetri is not a known key"));
    assert!(has("classify.medium_max_work must be > 0"));
}

#[test]
fn documented_upper_bounds_are_problems_not_silent_clamps() {
    // Each used to be cut down to its bound without a word; and a lane's objective stopped at
    // its first bad key.
    let issues = issues_of(
        r#"
[classify]
tokenizer = "heuristic"
max_concurrent_tokenizations = 5000
[server]
drain_announce_ms = 700000
[lanes.small]
ttft_slo_quantile = 0.3
ttft_slo_ms = 4000000
"#,
    );
    let has = |prefix: &str| issues.iter().any(|i| i.starts_with(prefix));
    for expected in [
        "classify.max_concurrent_tokenizations must be at most 1024",
        "server.drain_announce_ms must be at most 600000",
        "lanes.small.ttft_slo_quantile must be from 0.5 to 0.999",
        "lanes.small.ttft_slo_ms must be at most 3600000",
    ] {
        assert!(has(expected), "missing {expected:?} in {issues:#?}");
    }
    assert_eq!(issues.len(), 4, "{issues:#?}");
}

/// With several replicas, an abort URL of one fixed host would send every replica's aborts
/// there (and look successful: vLLM answers 200 to an id it does not know).
#[test]
fn a_fixed_abort_url_with_several_replicas_is_a_problem() {
    let replicas = "[[upstream.replicas]]\nurl = \"http://10.0.0.1:8000\"\n\
                    [[upstream.replicas]]\nurl = \"http://10.0.0.2:8000\"\n";
    let fixed = format!(
        "{MINIMAL}[upstream]\n[upstream.abort]\nurl = \"http://10.0.0.1:8000/abort/{{id}}\"\n\
         body = \"\"\n{replicas}"
    );
    let issues = issues_of(&fixed);
    assert!(
        issues
            .iter()
            .any(|i| i.starts_with("upstream.abort.url must start with {base_url}")),
        "{issues:#?}"
    );
    // The default ({base_url}…) is fine, and so is a fixed URL with one replica.
    assert!(Config::from_toml_str(&format!("{MINIMAL}[upstream]\n{replicas}")).is_ok());
    let one = format!(
        "{MINIMAL}[upstream]\n[upstream.abort]\nurl = \"http://10.0.0.1:8000/abort/{{id}}\"\n\
         body = \"\"\n"
    );
    assert!(Config::from_toml_str(&one).is_ok());
}

#[test]
fn autopilot_steps_of_zero_are_problems() {
    // Either would keep its knob down for good after the first tighten, rescue included.
    let issues = issues_of(
        "[classify]\ntokenizer = \"heuristic\"\n[autopilot]\nloosen_prefill_tokens = 0\nloosen_large_seats = 0\n",
    );
    assert_eq!(
        issues,
        [
            "autopilot.loosen_prefill_tokens must be > 0 (leave it out for the default, 1024)",
            "autopilot.loosen_large_seats must be > 0 (leave it out for the default, 1)"
        ],
        "{issues:#?}"
    );
    // More samples than the windows keep: never judged.
    let issues =
        issues_of("[classify]\ntokenizer = \"heuristic\"\n[autopilot]\nmin_samples = 5000\n");
    assert_eq!(
        issues,
        ["autopilot.min_samples must be at most 4096 (the samples the step window keeps)"]
    );
}

#[test]
fn a_request_head_bound_hyper_could_not_take_is_a_problem() {
    // Below 8 KiB hyper's HTTP/1 server would panic at the first connection.
    for bad in [4096, 2 << 20] {
        let issues = issues_of(&format!("{MINIMAL}[server]\nmax_head_bytes = {bad}\n"));
        assert_eq!(
            issues,
            ["server.max_head_bytes must be between 8192 and 1048576"]
        );
    }
    let c = Config::from_toml_str(&format!("{MINIMAL}[server]\nmax_head_bytes = 8192\n"));
    assert_eq!(c.unwrap().server.max_head_bytes, 8192);
}

#[test]
fn every_problem_of_a_section_is_listed_not_only_its_first() {
    // Two unknown keys and a wrong type in one table, an unknown key beside a validation
    // problem in another: all of them, in one report (it used to stop at a section's first).
    let issues = issues_of(
        r#"
[classify]
tokenizer = "heuristic"
[lanes.small]
max_concurency = 8
ceilng = 9
queue_len = "ten"
[lanes.large]
lend_it = true
max_concurrency = 0
[server]
max_body_bytez = 1
"#,
    );
    let has = |prefix: &str| issues.iter().any(|i| i.starts_with(prefix));
    for expected in [
        "lanes.small.max_concurency is not a known key",
        "lanes.small.ceilng is not a known key",
        "lanes.small.queue_len has an invalid type",
        "lanes.large.lend_it is not a known key",
        "lanes.large.max_concurrency",
        "server.max_body_bytez is not a known key",
    ] {
        assert!(has(expected), "missing {expected:?} in {issues:#?}");
    }
    // Nothing is said twice, and the table with the wrong type gets no follow-on problem.
    let mut unique = issues.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), issues.len(), "{issues:#?}");
    assert_eq!(
        issues
            .iter()
            .filter(|i| i.starts_with("lanes.small."))
            .count(),
        3,
        "{issues:#?}"
    );
}

#[test]
fn errors_never_echo_values_from_the_file() {
    let secret = "hunter2-secret";
    for src in [
        format!("[upstream]\nbase_url = \"ftp://admin:{secret}@vllm\"\n{MINIMAL}"),
        format!("[upstream]\nmax_model_len = \"{secret}\"\n{MINIMAL}"),
        format!("[admission]\npolicy = \"{secret}\"\n{MINIMAL}"),
        format!("[upstream.abort]\nmethod = \"{secret}\"\n{MINIMAL}"),
        format!("[upstream]\nbase_url = \"http://u:{secret}@h\n"),
        format!("[classify]\ntokenizer = \"/nonexistent/{secret}/tokenizer.json\"\n"),
    ] {
        let err = Config::from_toml_str(&src).unwrap_err();
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains(secret), "echoed a value: {shown}");
    }
}

#[test]
fn syntax_errors_give_line_and_column() {
    let err = Config::from_toml_str("listen = \"127.0.0.1:1\"\n[upstream\n").unwrap_err();
    match err {
        ConfigError::Syntax { line, .. } => assert_eq!(line, 2),
        other => panic!("expected a syntax error, got {other}"),
    }
}

#[test]
fn tokenizer_must_be_chosen_explicitly_and_exist() {
    assert_eq!(
        issues_of(""),
        ["classify.tokenizer is required: a path to tokenizer.json, or \"heuristic\""]
    );
    let issues = issues_of("[classify]\ntokenizer = \"/nonexistent/tokenizer.json\"\n");
    assert_eq!(
        issues,
        [
            "classify.tokenizer names a file that does not exist (a path to the model's \
          tokenizer.json, relative to the working directory, or \"heuristic\")"
        ]
    );
}

#[test]
fn abort_templates_are_checked_and_substitute_safely() {
    let issues = issues_of(&format!(
        "[upstream.abort]\nurl = \"/abort\"\nbody = '{{\"ids\": [{{id}}'\n{MINIMAL}"
    ));
    assert!(issues
        .iter()
        .any(|i| i.starts_with("upstream.abort.url must start")));
    assert!(issues
        .iter()
        .any(|i| i.starts_with("upstream.abort.body must be JSON")));

    let no_id = format!("[upstream.abort]\nbody = '{{}}'\n{MINIMAL}");
    assert!(issues_of(&no_id)
        .iter()
        .any(|i| i.starts_with("upstream.abort.url or upstream.abort.body must contain {id}")));

    // Disabled abort needs no {id}; an id with quotes stays valid JSON in the body.
    let c = Config::from_toml_str(&format!(
        "[upstream.abort]\nenabled = false\nbody = '{{\"id\":\"{{id}}\"}}'\n{MINIMAL}"
    ))
    .unwrap();
    let body = Config::default().upstream.abort.body("a\"b");
    assert!(
        serde_json::from_str::<serde_json::Value>(&body).is_ok(),
        "{body}"
    );
    assert!(!c.upstream.abort.enabled);
}

#[test]
fn fifo_policy_and_limits_parse() {
    let c = Config::from_toml_str(&format!(
        "[admission]\npolicy = \"fifo\"\n[admission.fifo]\nmax_concurrency = 64\nqueue_len = 0\n{MINIMAL}"
    ))
    .unwrap();
    assert_eq!(c.admission.policy, Policy::Fifo);
    assert_eq!(c.admission.fifo.max_concurrency.map(|n| n.get()), Some(64));
    assert_eq!(c.admission.fifo.queue.len, 0);
}

#[test]
fn load_reads_the_shipped_file_and_reports_missing_files() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/config.toml");
    assert_eq!(Config::load(path).unwrap(), Config::default());
    let err = Config::load("/nonexistent/config.toml").unwrap_err();
    assert!(matches!(err, ConfigError::Read { .. }), "{err}");
}

#[test]
fn prefill_budget_defaults_to_one_reference_step_and_holds_with_either_backend() {
    let c = Config::from_toml_str(MINIMAL).unwrap();
    assert_eq!(c.admission.prefill_budget_tokens, 12288, "on by default");
    assert_eq!(c.admission.long_prompt_tokens.get(), 2048);
    assert!(c.admission.prefill_discount_cached);
    let off = Config::from_toml_str(&format!(
        "[admission]\nprefill_budget_tokens = 0\nprefill_discount_cached = false\n{MINIMAL}"
    ))
    .unwrap();
    assert_eq!(off.admission.prefill_budget_tokens, 0);
    assert!(!off.admission.prefill_discount_cached);
    // The shared quota enforces it fleet-wide (one budget per engine).
    let redis = Config::from_toml_str(&format!(
        "[admission]\nprefill_budget_tokens = 12288\n[quota]\nbackend = \"redis\"\n{MINIMAL}"
    ))
    .unwrap();
    assert_eq!(redis.admission.prefill_budget_tokens, 12288);
    // Off, Redis is fine.
    Config::from_toml_str(&format!("[quota]\nbackend = \"redis\"\n{MINIMAL}")).unwrap();
    let issues = issues_of(&format!(
        "[admission]\nprefill_budget_tokens = 1000\n{MINIMAL}"
    ));
    assert_eq!(issues.len(), 1, "{issues:#?}");
    assert!(
        issues[0].starts_with(
            "admission.prefill_budget_tokens must be 0 (off) or >= admission.long_prompt_tokens"
        ),
        "{issues:#?}"
    );
    let issues = issues_of(&format!("[admission]\nlong_prompt_tokens = 0\n{MINIMAL}"));
    assert!(
        issues[0].starts_with("admission.long_prompt_tokens must be > 0"),
        "{issues:#?}"
    );
}

#[test]
fn jobs_keys_are_checked_together() {
    let issues = issues_of(&format!(
        "{MINIMAL}[jobs]\nmax_jobs = 0\nwebhook_allow = [\"https://hooks.example.edu/*\", \"ftp://x/\"]\n\
         webhook_attempts = 21\ndivert_large_after_ms = 500\nenabled = false\nmax_attempts = 0\n\
         prefill_piece_tokens = 100\n"
    ));
    for expected in [
        "jobs.prefill_piece_tokens must be 0 (off) or at least 256",
        "jobs.max_jobs",
        "jobs.webhook_allow[1]",
        "jobs.webhook_attempts",
        "jobs.max_attempts",
        "jobs.divert_large_after_ms",
    ] {
        assert!(
            issues.iter().any(|i| i.starts_with(expected)),
            "{expected} not in {issues:?}"
        );
    }
    if std::env::var(WEBHOOK_SECRET_ENV).is_err() {
        assert!(
            issues.iter().any(|i| i.starts_with("jobs.webhook_secret")),
            "an allow-list needs a secret: {issues:?}"
        );
    }
    // `localhost` is a name: kept off loopback unless private addresses are allowed, so a
    // pattern naming it could never be delivered to; 127.0.0.1 is taken as written.
    let hooks = |allow: &str, private: bool| {
        format!(
            "{MINIMAL}[jobs]\nwebhook_allow = [\"{allow}\"]\nwebhook_allow_private = {private}\n\
             webhook_secret = \"a-secret-of-sixteen-bytes\"\n"
        )
    };
    let local = issues_of(&hooks("http://localhost:9000/hooks/*", false));
    assert!(
        local
            .iter()
            .any(|i| i.starts_with("jobs.webhook_allow[0] names localhost")),
        "{local:?}"
    );
    for valid in [
        hooks("http://localhost:9000/hooks/*", true),
        hooks("http://127.0.0.1:9000/hooks/*", false),
    ] {
        assert!(Config::from_toml_str(&valid).is_ok(), "{valid}");
    }
    let short = issues_of(&format!("{MINIMAL}[jobs]\nwebhook_secret = \"short\"\n"));
    assert!(short.iter().any(|i| i.starts_with("jobs.webhook_secret")));
    assert!(
        short.iter().all(|i| !i.contains("short")),
        "the secret is never echoed: {short:?}"
    );
    // Pre-emption is bounded, and refused where it would be silently dropped (across replicas).
    let issues = issues_of(&format!(
        "{MINIMAL}[jobs]\npreempt = true\nmax_preemptions = 101\n"
    ));
    assert!(
        issues
            .iter()
            .any(|i| i.starts_with("jobs.max_preemptions must be at most 100")),
        "{issues:?}"
    );
    let issues = issues_of(&format!(
        "{MINIMAL}[jobs]\npreempt = true\npreempt_cooldown_ms = 600001\n"
    ));
    assert!(
        issues
            .iter()
            .any(|i| i.starts_with("jobs.preempt_cooldown_ms must be at most 600000")),
        "{issues:?}"
    );
    let cool = Config::from_toml_str(&format!(
        "{MINIMAL}[jobs]\npreempt = true\npreempt_cooldown_ms = 5000\n"
    ))
    .expect("a cool-down");
    assert_eq!(
        cool.jobs.preempt_cooldown,
        std::time::Duration::from_secs(5)
    );
    // Pre-emptible answers: three modes, in process only.
    let marked = Config::from_toml_str(&format!(
        "{MINIMAL}[jobs]\npreempt_answers = \"marked\"\npreempt_notice = true\n"
    ))
    .expect("marked answers");
    assert_eq!(
        marked.jobs.preempt_answers,
        crate::config::PreemptAnswers::Marked
    );
    assert!(marked.jobs.preempt_notice);
    let issues = issues_of(&format!("{MINIMAL}[jobs]\npreempt_answers = \"some\"\n"));
    assert!(
        issues
            .iter()
            .any(|i| i.starts_with("jobs.preempt_answers must be \"off\", \"marked\" or \"large\"")),
        "{issues:?}"
    );
    // Pre-emptible answers across replicas (the quota's borrow script).
    let answers = Config::from_toml_str(&format!(
        "{MINIMAL}[quota]\nbackend = \"redis\"\n[jobs]\npreempt_answers = \"large\"\n"
    ))
    .expect("pre-emptible answers on the Redis backend");
    assert_eq!(
        answers.jobs.preempt_answers,
        crate::config::PreemptAnswers::Large
    );
    // Jobs are pre-emptible unless the file says otherwise.
    let unset = Config::from_toml_str(MINIMAL).expect("minimal");
    assert!(unset.jobs.preempt);
    let off = Config::from_toml_str(&format!("{MINIMAL}[jobs]\npreempt = false\n"))
        .expect("jobs on large seats only");
    assert!(!off.jobs.preempt);
    // Across replicas too (the Redis backend asks borrowers to leave through its scripts).
    let shared = Config::from_toml_str(&format!(
        "{MINIMAL}[quota]\nbackend = \"redis\"\n[jobs]\npreempt = true\n"
    ))
    .expect("pre-emption on the Redis backend");
    assert!(shared.jobs.preempt);
    let on = Config::from_toml_str(&format!(
        "{MINIMAL}[jobs]\npreempt = true\npreempt_prefill_grace_tokens = 0\n"
    ))
    .expect("pre-emption in process, without grace");
    assert!(on.jobs.preempt && on.jobs.max_preemptions == 3);
    assert_eq!(on.jobs.preempt_prefill_grace_tokens, 0);
    // Jobs, and diverting to them, run with the Redis quota too.
    let redis = Config::from_toml_str(&format!(
        "{MINIMAL}[quota]\nbackend = \"redis\"\n[jobs]\ndivert_large_after_ms = 500\n"
    ));
    assert!(redis.is_ok(), "{:?}", redis.err());
    // A diversion the large lane's queue never lets a review reach: it gives up first (60 s
    // by default), or nobody waits in it.
    for lanes in [
        "[lanes.large]\nqueue_timeout_ms = 60000\n[jobs]\ndivert_large_after_ms = 90000\n",
        "[lanes.large]\nqueue_len = 0\n[jobs]\ndivert_large_after_ms = 500\n",
        "[admission]\npolicy = \"fifo\"\n[jobs]\ndivert_large_after_ms = 500\n",
    ] {
        let err = Config::from_toml_str(&format!("{MINIMAL}{lanes}")).unwrap_err();
        assert!(
            err.issues()
                .iter()
                .any(|i| i.path == "jobs.divert_large_after_ms"),
            "{lanes}: {err}"
        );
    }
    let fifo = Config::from_toml_str(&format!(
        "{MINIMAL}[admission]\npolicy = \"fifo\"\n[admission.fifo]\nmax_concurrency = 8\n\
         [jobs]\ndivert_large_after_ms = 500\n"
    ));
    assert!(fifo.is_ok(), "{:?}", fifo.err());
}

/// Secrets are trimmed, as the admin token is: one from a file written by `echo` ends in a
/// newline, which signed every webhook with a key its receiver does not hold (and a 15-byte
/// secret with it passed the 16-byte minimum).
#[test]
fn webhook_and_token_secrets_are_trimmed_before_they_are_judged() {
    let c = Config::from_toml_str(&format!(
        "{MINIMAL}[jobs]\nwebhook_secret = \"0123456789abcdef\\n\"\n\
         [auth]\ntoken_secret = \" 0123456789abcdef-token\\n\"\n"
    ))
    .unwrap();
    assert_eq!(
        c.jobs.webhook_secret.as_ref().map(|s| s.expose()),
        Some("0123456789abcdef")
    );
    assert_eq!(
        c.auth.token_secret.as_ref().map(|s| s.expose()),
        Some("0123456789abcdef-token")
    );
    let short = issues_of(&format!(
        "{MINIMAL}[jobs]\nwebhook_secret = \"0123456789abcde\\n\"\n\
         [auth]\ntoken_secret = \"0123456789abcde\\n\"\n"
    ));
    assert!(
        short.iter().any(|i| i.starts_with("jobs.webhook_secret")),
        "{short:?}"
    );
    assert!(
        short.iter().any(|i| i.starts_with("auth.token_secret")),
        "{short:?}"
    );
}

#[test]
fn the_webhook_secret_never_shows_in_debug_output() {
    let c = Config::from_toml_str(&format!(
        "{MINIMAL}[jobs]\nwebhook_secret = \"do-not-print-this-secret\"\n"
    ))
    .unwrap();
    assert_eq!(
        c.jobs.webhook_secret.as_ref().map(|s| s.expose()),
        Some("do-not-print-this-secret")
    );
    assert!(!format!("{c:?}").contains("do-not-print"), "{c:?}");
}

#[test]
fn cors_origins_are_checked() {
    let c = Config::from_toml_str(&format!(
        "{MINIMAL}[server]\ncors_allow_origins = [\"https://Tutor.Example.edu\", \"http://localhost:3000\"]\n"
    ))
    .unwrap();
    assert_eq!(
        c.server.cors_allow_origins,
        ["https://tutor.example.edu", "http://localhost:3000"]
    );
    let issues = issues_of(&format!(
        "{MINIMAL}[server]\ncors_allow_origins = [\"https://a.edu/app\", \"ftp://a.edu\", \"a.edu\"]\ncors_max_age_s = 999999\n"
    ));
    for expected in [
        "server.cors_allow_origins[0]",
        "server.cors_allow_origins[1]",
        "server.cors_allow_origins[2]",
        "server.cors_max_age_s",
    ] {
        assert!(
            issues.iter().any(|i| i.starts_with(expected)),
            "{expected} not in {issues:?}"
        );
    }
}

#[test]
fn the_upstream_api_key_comes_from_a_file_or_the_environment_never_the_file_itself() {
    let missing = issues_of(&format!(
        "{MINIMAL}[upstream]\napi_key_env = \"TUTOR_GATEWAY_TEST_UNSET_VARIABLE\"\n"
    ));
    assert!(missing
        .iter()
        .any(|i| i.starts_with("upstream.api_key_env")));
    let unreadable = issues_of(&format!(
        "{MINIMAL}[upstream]\napi_key_file = \"/nonexistent/tutor-gateway/key\"\n"
    ));
    assert!(unreadable
        .iter()
        .any(|i| i.starts_with("upstream.api_key_file")));
    let both = issues_of(&format!(
        "{MINIMAL}[upstream]\napi_key_env = \"A\"\napi_key_file = \"/b\"\n"
    ));
    assert!(both.iter().any(|i| i.contains("not both")));
    let raw = issues_of(&format!(
        "{MINIMAL}[upstream]\napi_key = \"sk-in-the-file\"\n"
    ));
    assert!(
        raw.iter().any(|i| i.starts_with("upstream.api_key")),
        "no key in the file itself: {raw:?}"
    );
    assert!(raw.iter().all(|i| !i.contains("sk-in-the-file")));
}

#[test]
fn tls_everywhere_is_built_in_and_ca_files_are_checked() {
    // TLS to vLLM, the OTLP collector and Redis is built in (rustls): these pass.
    Config::from_toml_str(&format!(
        "{MINIMAL}[upstream]\nbase_url = \"https://vllm.internal:8000\"\n\
         [telemetry]\notlp_endpoint = \"https://collector:4317\"\n\
         [quota]\nredis_url = \"rediss://redis:6380/0\"\n"
    ))
    .unwrap();
    // A CA file must hold a certificate, and goes with a TLS endpoint.
    let ca = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tls/ca.pem");
    let issues = issues_of(&format!(
        "{MINIMAL}[telemetry]\notlp_endpoint = \"http://collector:4318\"\notlp_ca_file = \"{ca}\"\n\
         [upstream]\nca_file = \"{}\"\n",
        concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")
    ));
    assert!(issues
        .iter()
        .any(|i| i.starts_with("telemetry.otlp_ca_file needs an https://")));
    assert!(issues
        .iter()
        .any(|i| i.starts_with("upstream.ca_file holds no PEM certificate")));
    // vLLM's CA with an http:// vLLM: nothing would be checked, prompts and key in the clear.
    let issues = issues_of(&format!(
        "{MINIMAL}[upstream]\nbase_url = \"http://vllm:8000\"\nca_file = \"{ca}\"\n"
    ));
    assert!(
        issues
            .iter()
            .any(|i| i.starts_with("upstream.ca_file needs an https://")),
        "{issues:#?}"
    );
    Config::from_toml_str(&format!(
        "{MINIMAL}[upstream]\nbase_url = \"https://vllm:8000\"\nca_file = \"{ca}\"\n"
    ))
    .unwrap();
}

#[test]
fn auth_keys_are_hashes_with_tenants() {
    let issues = issues_of(&format!(
        "{MINIMAL}[auth]\nenabled = true\nkeys = [{{sha256 = \"sk-raw-key\", tenant = \"cs101\"}}, {{sha256 = \"{}\", tenant = \"bad tenant\"}}]\nkeys_file = \"/nonexistent/keys\"\n",
        "ab".repeat(32)
    ));
    for expected in [
        "auth.keys[0].sha256",
        "auth.keys[1].tenant",
        "auth.keys_file",
    ] {
        assert!(
            issues.iter().any(|i| i.starts_with(expected)),
            "{expected} not in {issues:?}"
        );
    }
    assert!(
        issues.iter().all(|i| !i.contains("sk-raw-key")),
        "{issues:?}"
    );
    let none = issues_of(&format!("{MINIMAL}[auth]\nenabled = true\n"));
    assert!(none.iter().any(|i| i.starts_with("auth.enabled")));
}

// Section checks that need the whole file (`Config`) live here, not in the section's file,
// which `file.rs` imports (no file imports one that imports it back).

/// `[upstream.abort]`, read through the whole file.
mod upstream_abort {
    use super::*;

    fn parsed(abort: &str) -> Result<AbortConfig, Vec<String>> {
        let src = format!("[classify]\ntokenizer = \"heuristic\"\n[upstream.abort]\n{abort}\n");
        Config::from_toml_str(&src)
            .map(|c| c.upstream.abort)
            .map_err(|e| e.issues().iter().map(ToString::to_string).collect())
    }

    #[test]
    fn mode_defaults_to_auto_with_vllms_ids() {
        let a = parsed("").unwrap();
        assert_eq!((a.mode, a.call_mode()), (AbortMode::Auto, AbortMode::Auto));
        assert_eq!(a.id_format, AbortIdFormat::Vllm);
        for (text, mode) in [
            ("on", AbortMode::On),
            ("off", AbortMode::Off),
            ("auto", AbortMode::Auto),
        ] {
            let a = parsed(&format!("mode = \"{text}\"")).unwrap();
            assert_eq!(a.call_mode(), mode);
            assert_eq!(a.enabled, mode != AbortMode::Off);
            assert_eq!(mode.as_str(), text);
        }
        let a = parsed("id_format = \"as_sent\"").unwrap();
        assert_eq!(a.id_format, AbortIdFormat::AsSent);
    }

    #[test]
    fn the_older_enabled_key_still_reads_and_never_contradicts_mode() {
        assert_eq!(
            parsed("enabled = false").unwrap().call_mode(),
            AbortMode::Off
        );
        assert_eq!(
            parsed("enabled = true").unwrap().call_mode(),
            AbortMode::Auto
        );
        assert_eq!(
            parsed("enabled = true\nmode = \"on\"").unwrap().call_mode(),
            AbortMode::On
        );
        assert!(parsed("enabled = false\nmode = \"off\"").is_ok());
        for contradiction in [
            "enabled = false\nmode = \"on\"",
            "enabled = true\nmode = \"off\"",
        ] {
            let issues = parsed(contradiction).unwrap_err();
            assert!(
                issues
                    .iter()
                    .any(|i| i.starts_with("upstream.abort.enabled contradicts")),
                "{issues:?}"
            );
        }
    }

    #[test]
    fn unknown_modes_and_id_formats_are_named_without_their_value() {
        let issues = parsed("mode = \"sometimes-secret\"\nid_format = \"x-secret\"").unwrap_err();
        assert!(issues
            .iter()
            .any(|i| i == "upstream.abort.mode must be one of auto, on, off"));
        assert!(issues
            .iter()
            .any(|i| i == "upstream.abort.id_format must be vllm or as_sent"));
        assert!(issues.iter().all(|i| !i.contains("secret")), "{issues:?}");
    }

    #[test]
    fn mode_off_needs_no_id_placeholder() {
        assert!(parsed("mode = \"off\"\nbody = '{}'").is_ok());
        assert!(parsed("mode = \"auto\"\nbody = '{}'").is_err());
    }
}

/// `[quota]`, read through the whole file.
mod quota_section {
    use super::*;

    fn issues(quota: &str) -> Vec<String> {
        let src = format!("[classify]\ntokenizer = \"heuristic\"\n[quota]\n{quota}");
        match Config::from_toml_str(&src) {
            Ok(_) => vec![],
            Err(e) => e.issues().iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn heartbeat_must_be_well_inside_the_ttl() {
        let found = issues("lease_ttl_ms = 3000\nheartbeat_ms = 1500\n");
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("quota.heartbeat_ms must be"));
        assert!(issues("lease_ttl_ms = 3000\nheartbeat_ms = 1000\n").is_empty());
        // A lease shorter than a Redis call may take (500 ms) could expire during a renewal.
        let redis = "backend = \"redis\"\n";
        let found = issues(&format!("{redis}lease_ttl_ms = 300\nheartbeat_ms = 100\n"));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("quota.lease_ttl_ms must be >= 1000"));
        assert!(issues(&format!("{redis}lease_ttl_ms = 1000\nheartbeat_ms = 100\n")).is_empty());
    }

    #[test]
    fn bad_urls_are_reported_without_echoing_the_password() {
        // TLS is built in: a rediss:// URL is fine, a CA file needs one.
        assert!(issues("backend = \"redis\"\nredis_url = \"rediss://u:hunter2@h:1\"\n").is_empty());
        let ca = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tls/ca.pem");
        let found = issues(&format!(
            "redis_url = \"redis://h:1\"\nredis_ca_file = \"{ca}\"\n"
        ));
        assert!(found[0].starts_with("quota.redis_ca_file"), "{found:?}");
        let found = issues("redis_url = \"rediss://h:1\"\nredis_ca_file = \"/nonexistent.pem\"\n");
        assert!(
            found[0].starts_with("quota.redis_ca_file cannot be read"),
            "{found:?}"
        );
        let found = issues("redis_url = \"http://u:hunter2@h:1\"\n");
        assert!(!found.iter().any(|i| i.contains("hunter2")), "{found:?}");
        assert!(found[0].starts_with("quota.redis_url"), "{found:?}");
    }

    #[test]
    fn the_password_can_come_from_a_file_and_never_shows_in_an_issue() {
        let dir = std::env::temp_dir().join(format!("tg-redis-pw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("password");
        std::fs::write(&file, "hunter2-secret\n").unwrap();
        let src = format!(
            "[classify]\ntokenizer = \"heuristic\"\n[quota]\nbackend = \"redis\"\n\
             redis_url = \"redis://cache:6379/0\"\nredis_password_file = \"{}\"\n",
            file.display()
        );
        let config = Config::from_toml_str(&src).unwrap();
        assert_eq!(
            config.quota.redis_url.expose(),
            "redis://:hunter2-secret@cache:6379/0"
        );
        assert!(!format!("{:?}", config.quota).contains("hunter2"));
        // Both places at once, an unset variable, a password twice: named, never echoed.
        let found = issues(&format!(
            "redis_password_env = \"TUTOR_GATEWAY_TEST_UNSET_VARIABLE\"\n\
             redis_password_file = \"{}\"\n",
            file.display()
        ));
        assert!(
            found[0].starts_with("quota.redis_password_env set"),
            "{found:?}"
        );
        let found = issues("redis_password_env = \"TUTOR_GATEWAY_TEST_UNSET_VARIABLE\"\n");
        assert!(found[0].contains("is not set"), "{found:?}");
        let found = issues(&format!(
            "redis_url = \"redis://:hunter2@cache:6379/0\"\nredis_password_file = \"{}\"\n",
            file.display()
        ));
        assert!(
            found[0].contains("must not be set while quota.redis_url carries user:password@"),
            "{found:?}"
        );
        // Named by the key the password came through, not the one left unset.
        assert!(
            found[0].starts_with("quota.redis_password_file"),
            "{found:?}"
        );
        assert!(!found.iter().any(|i| i.contains("hunter2")), "{found:?}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn batch_max_is_bounded_and_defaults_to_32() {
        assert_eq!(Config::default().quota.batch_max, 32);
        assert!(issues("batch_max = 257\n")
            .iter()
            .any(|i| i.starts_with("quota.batch_max")));
        let one = Config::from_toml_str(
            "[classify]\ntokenizer = \"heuristic\"\n[quota]\nbatch_max = 1\n",
        )
        .unwrap();
        assert_eq!(one.quota.batch_max, 1);
    }

    #[test]
    fn other_bad_keys_are_all_reported() {
        let found = issues(
            "backend = \"x\"\nkey_prefix = \"a{b}\"\non_redis_down = \"x\"\nexpected_replicas = 0\n\
             batch_max = 0\n",
        );
        for key in [
            "backend",
            "key_prefix",
            "on_redis_down",
            "expected_replicas",
            "batch_max",
        ] {
            assert!(
                found.iter().any(|i| i.starts_with(&format!("quota.{key}"))),
                "{key}: {found:?}"
            );
        }
    }
}

#[test]
fn the_demo_page_is_off_unless_server_demo_is_true() {
    assert!(!Config::default().server.demo);
    let on = Config::from_toml_str(&format!("{MINIMAL}[server]\ndemo = true\n")).unwrap();
    assert!(on.server.demo);
    let issues = issues_of(&format!("{MINIMAL}[server]\ndemo = \"yes\"\n"));
    assert!(
        issues.iter().any(|i| i.contains("demo")),
        "server.demo not in {issues:?}"
    );
}

#[test]
fn tenant_budgets_parse_with_either_quota_and_bad_names_are_refused() {
    let c = Config::from_toml_str(&format!(
        "{MINIMAL}{AUTH}\n[auth.tenants.cs101]\ntokens_per_minute = 200000\ntokens_per_day = 0\n"
    ))
    .unwrap();
    let b = c.auth.tenants["cs101"];
    assert_eq!(b.tokens_per_minute, Some(200_000));
    assert_eq!((b.requests_per_minute, b.tokens_per_day), (None, None));
    // With the Redis quota the ledger is shared by the replicas (`admission::tenant_budget`).
    let c = Config::from_toml_str(&format!(
        "{MINIMAL}{AUTH}\n[quota]\nbackend = \"redis\"\n[auth.tenants.cs101]\nrequests_per_minute = 5\n"
    ))
    .unwrap();
    assert_eq!(c.auth.tenants["cs101"].requests_per_minute, Some(5));
    let issues = issues_of(&format!(
        "{MINIMAL}\n[auth.tenants.\"bad name\"]\nrequests_per_minute = 5\n"
    ));
    assert!(
        issues.iter().any(|i| i.starts_with("auth.tenants")),
        "{issues:?}"
    );
}

/// Under `lanes`, the reservations must fit the seats (a lane below its reservation always
/// gets one; a ceiling above them is bounded by them); `strict` does not use `seats`; the large
/// lane has no mid-stream limit.
#[test]
fn reservations_fit_the_seats() {
    let issues = issues_of(
        "[classify]\ntokenizer = \"heuristic\"\n[admission]\npolicy = \"lanes\"\nseats = 2\n\
         [lanes.small]\nmax_concurrency = 1\nceiling = 1\n\
         [lanes.medium]\nmax_concurrency = 1\nceiling = 5000\n\
         [lanes.large]\nmax_concurrency = 1\nceiling = 1\n",
    );
    assert_eq!(issues.len(), 1, "{issues:#?}");
    assert!(issues[0].starts_with("admission.seats must be >= the lanes' reservations"));
    assert!(issues[0].contains("(3 in all)"), "{issues:#?}");
    let large = issues_of(
        "[classify]\ntokenizer = \"heuristic\"\n[lanes.large]\nmid_stream_limit = 4096\n",
    );
    assert!(
        large[0].starts_with("lanes.large.mid_stream_limit must be 0"),
        "{large:#?}"
    );
    let labels = issues_of(
        "[classify]\ntokenizer = \"heuristic\"\n[prefix_cache]\nfingerprint_labels = 4294967295\n",
    );
    assert!(labels[0].starts_with("prefix_cache.fingerprint_labels must be at most 1000"));
    let share = issues_of(
        "[classify]\ntokenizer = \"heuristic\"\n[prefix_cache]\nfingerprint_labels = 8\n\
         fingerprint_labels_per_tenant = 9\n",
    );
    assert!(
        share[0].starts_with(
            "prefix_cache.fingerprint_labels_per_tenant must be at most prefix_cache.fingerprint_labels"
        ),
        "{share:#?}"
    );
    // Drift detection silently off: a factor never reached, samples never had, a log window
    // that never ends.
    let drift = issues_of(
        "[classify]\ntokenizer = \"heuristic\"\n[prefix_cache]\ndrift_factor_percent = 4294967295\n\
         drift_min_samples = 4294967295\ndrift_log_window_ms = 31536000000\n",
    );
    for expected in [
        "prefix_cache.drift_factor_percent must be at most 10000",
        "prefix_cache.drift_min_samples must be at most 10000",
        "prefix_cache.drift_log_window_ms must be at most 86400000",
    ] {
        assert!(
            drift.iter().any(|i| i.starts_with(expected)),
            "missing {expected:?} in {drift:#?}"
        );
    }
    // A key removed from the file must not stay in force for hours, nor a token live for weeks.
    let auth = issues_of(
        "[classify]\ntokenizer = \"heuristic\"\n[auth]\nreload_ms = 3600000\n\
         token_ttl_ms = 2592000000\n",
    );
    assert!(
        auth.iter()
            .any(|i| i.starts_with("auth.reload_ms must be at most 60000"))
            && auth
                .iter()
                .any(|i| i.starts_with("auth.token_ttl_ms must be at most 86400000")),
        "{auth:#?}"
    );
    // 0, the default: a quarter of the labels, at least one.
    assert_eq!(
        Config::default().prefix_cache.fingerprint_labels_per_tenant,
        5
    );
    let course = |tenants: &str| {
        format!(
            "[classify]\ntokenizer = \"heuristic\"\n{AUTH}[courses.cs1]\nversion = \"1\"\n\
             instructions = \"Be kind.\"\ntenants = {tenants}\n"
        )
    };
    for bad in ["[]", "[\"school a\"]"] {
        let issues = issues_of(&course(bad));
        assert!(issues[0].starts_with("courses.cs1.tenants"), "{issues:#?}");
    }
    assert!(Config::from_toml_str(&course("[\"school-a\"]")).is_ok());
    let strict = Config::from_toml_str(
        "[classify]\ntokenizer = \"heuristic\"\n[admission]\npolicy = \"strict\"\nseats = 2\n",
    );
    assert!(strict.is_ok(), "{:?}", strict.err());
}

/// One key for two tenants (its hash written once in lower and once in upper case) is
/// refused, naming the tenants but not the key; the same key twice for one tenant is not.
#[test]
fn a_key_listed_for_two_tenants_is_refused() {
    let hash = "ab".repeat(32);
    let config = |second: &str| {
        format!(
            "[classify]\ntokenizer = \"heuristic\"\n[auth]\nenabled = true\nkeys = [{{ sha256 = \"{hash}\", tenant = \"alpha\" }}, \
             {{ sha256 = \"{}\", tenant = \"{second}\" }}]\n",
            hash.to_ascii_uppercase()
        )
    };
    let err = Config::from_toml_str(&config("beta"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("auth.keys"), "{err}");
    assert!(
        err.contains("\"alpha\"") && err.contains("\"beta\""),
        "{err}"
    );
    assert!(!err.to_ascii_lowercase().contains(&hash), "{err}");
    let same = Config::from_toml_str(&config("alpha"));
    assert!(same.is_ok(), "{:?}", same.err());
}

#[test]
fn an_engine_url_ending_in_v1_is_refused_with_the_fix() {
    // The gateway adds /v1/... itself: a URL ending in /v1 sent every request to /v1/v1/... and
    // each came back 404 `upstream_rejected`, as if the client were at fault.
    for url in [
        "http://127.0.0.1:8000/v1",
        "http://vllm:8000/v1/",
        "https://gpu.internal/llama/V1",
    ] {
        let issues = issues_of(&format!("{MINIMAL}[upstream]\nbase_url = \"{url}\"\n"));
        assert!(
            issues
                .iter()
                .any(|i| i.contains("upstream.base_url") && i.contains("without /v1")),
            "{url}: {issues:#?}"
        );
        let replica = format!("{MINIMAL}[[upstream.replicas]]\nurl = \"{url}\"\n");
        let issues = issues_of(&replica);
        assert!(
            issues
                .iter()
                .any(|i| i.contains("upstream.replicas[0].url") && i.contains("without /v1")),
            "{url}: {issues:#?}"
        );
    }
    // A host named v1, or a path that only contains v1, is a root like any other.
    for url in [
        "http://v1:8000",
        "http://v1",
        "https://gw.internal/v1/llama",
    ] {
        let c = Config::from_toml_str(&format!("{MINIMAL}[upstream]\nbase_url = \"{url}\"\n"))
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        assert_eq!(c.upstream.base_url, url);
    }
}

/// Time keys whose extremes break something are bounded: a health interval of a few
/// milliseconds (every probe would fail it and eject every replica), a promotion pause longer
/// than a minute (the stream is not read meanwhile), a continuation window past a day (a Redis
/// TTL).
#[test]
fn time_keys_with_a_breaking_extreme_are_bounded() {
    let base = "[classify]\ntokenizer = \"heuristic\"\n";
    let one = |toml: &str| {
        let found = issues_of(&format!("{base}{toml}"));
        assert_eq!(found.len(), 1, "{toml}: {found:?}");
        found[0].clone()
    };
    let fine = |toml: &str| {
        let src = format!("{base}{toml}");
        assert!(Config::from_toml_str(&src).is_ok(), "{toml}");
    };
    let routing = "[upstream.routing]\nhealth_interval_ms = ";
    assert!(one(&format!("{routing}5\n"))
        .starts_with("upstream.routing.health_interval_ms must be 0 (no checks) or at least 100"));
    fine(&format!("{routing}0\n"));
    fine(&format!("{routing}100\n"));
    let promotion = "[promotion]\n";
    assert!(one(&format!("{promotion}wait_ms = 60001\n"))
        .starts_with("promotion.wait_ms must be at most 60000"));
    fine(&format!("{promotion}wait_ms = 60000\n"));
    fine(&format!("{promotion}wait_ms = 0\n"));
    for window in [0, 86_400_001, i64::MAX as u64] {
        assert!(
            one(&format!("{promotion}continuation_window_ms = {window}\n"))
                .starts_with("promotion.continuation_window_ms must be between 1 and 86400000")
        );
    }
    fine(&format!("{promotion}continuation_window_ms = 86400000\n"));
}

/// `fields.template_kwargs` names template variables, never one a request may not set (the
/// template, material it loops over, its own switches, the special tokens).
#[test]
fn template_kwargs_are_names_and_never_the_templates_material() {
    let base = "[classify]\ntokenizer = \"heuristic\"\n[fields]\n";
    for (listed, problem) in [
        (
            "[\"custom_tools\"]",
            "fields.template_kwargs[0] custom_tools cannot be set",
        ),
        (
            "[\"enable_thinking\", \"eos_token\"]",
            "fields.template_kwargs[1] eos_token cannot be set",
        ),
        (
            "[\"a b\"]",
            "fields.template_kwargs[0] must be a template variable's name",
        ),
        (
            "[\"\"]",
            "fields.template_kwargs[0] must be a template variable's name",
        ),
    ] {
        let found = issues_of(&format!("{base}template_kwargs = {listed}\n"));
        assert_eq!(found.len(), 1, "{listed}: {found:?}");
        assert!(found[0].starts_with(problem), "{listed}: {found:?}");
    }
    let ok = Config::from_toml_str(&format!("{base}template_kwargs = [\"week\"]\n")).unwrap();
    assert_eq!(ok.fields.template_kwargs, ["week"]);
    let none = Config::from_toml_str(&format!("{base}template_kwargs = []\n")).unwrap();
    assert!(none.fields.template_kwargs.is_empty());
}

/// Keys each valid alone that together make a feature do nothing, silently: tenant budgets or
/// course tenants without [auth] (no request has a tenant: budgets never charged, the course
/// refused to everyone), an autopilot with nothing to pace or floors above what it paces.
#[test]
fn settings_that_would_silently_do_nothing_are_refused_with_their_keys() {
    let issues = issues_of(&format!(
        "{MINIMAL}[auth.tenants.cs101]\ntokens_per_day = 5000000\n"
    ));
    assert!(
        issues
            .iter()
            .any(|i| i.starts_with("auth.tenants") && i.contains("auth.enabled")),
        "{issues:?}"
    );
    let issues = issues_of(&format!(
        "{MINIMAL}[courses.py101]\nversion = \"1\"\ninstructions = \"Be a tutor.\"\n\
         tenants = [\"cs101\"]\n"
    ));
    assert!(
        issues
            .iter()
            .any(|i| i.starts_with("courses.py101.tenants") && i.contains("auth.enabled")),
        "{issues:?}"
    );
    // An autopilot that would pace nothing, or clamp its floors to the values it paces.
    for (autopilot, key) in [
        (
            "[admission]\npolicy = \"fifo\"\n[autopilot]\nenabled = true\n",
            "autopilot.enabled",
        ),
        (
            "[lanes.large]\nmax_concurrency = 4\nceiling = 10\n[autopilot]\nenabled = true\n\
             min_large_seats = 11\n",
            "autopilot.min_large_seats",
        ),
        (
            "[admission]\nprefill_budget_tokens = 12288\n[autopilot]\nenabled = true\n\
             min_prefill_budget_tokens = 20000\n",
            "autopilot.min_prefill_budget_tokens",
        ),
    ] {
        let issues = issues_of(&format!("{MINIMAL}{autopilot}"));
        assert!(
            issues.iter().any(|i| i.starts_with(key)),
            "{autopilot}: {issues:?}"
        );
        // The same values with the autopilot off are not its to pace.
        let off = autopilot.replace("enabled = true", "enabled = false");
        assert!(
            Config::from_toml_str(&format!("{MINIMAL}{off}")).is_ok(),
            "{off}"
        );
    }
    // With [auth] on, the same tables are fine.
    let ok = Config::from_toml_str(&format!(
        "{MINIMAL}{AUTH}[auth.tenants.cs101]\ntokens_per_day = 5000000\n\
         [courses.py101]\nversion = \"1\"\ninstructions = \"Be a tutor.\"\ntenants = [\"cs101\"]\n"
    ));
    assert!(ok.is_ok(), "{:?}", ok.err());
}

/// Every period, timeout and cap has a ceiling: a huge value turned a timeout into "never" (a
/// hung engine stream held its seat for good), a check period into "once" (an ejected replica
/// never came back), a cap into "none"; a tiny beat into a Redis call a millisecond. Each is
/// refused naming its key; the values just inside pass.
#[test]
fn periods_timeouts_and_caps_have_ceilings() {
    let too_far = [
        (
            "[upstream]\nconnect_timeout_ms = 60001\n",
            "upstream.connect_timeout_ms",
        ),
        (
            "[upstream]\ntotal_timeout_ms = 86400001\n",
            "upstream.total_timeout_ms",
        ),
        (
            "[upstream]\nhealth_cache_ms = 60001\n",
            "upstream.health_cache_ms",
        ),
        (
            "[upstream.routing]\nhealth_interval_ms = 60001\n",
            "upstream.routing.health_interval_ms",
        ),
        (
            "[upstream.routing]\nunhealthy_after = 101\n",
            "upstream.routing.unhealthy_after",
        ),
        (
            "[upstream.routing]\nhealthy_after = 101\n",
            "upstream.routing.healthy_after",
        ),
        ("[quota]\nlease_ttl_ms = 3600001\n", "quota.lease_ttl_ms"),
        ("[quota]\nheartbeat_ms = 99\n", "quota.heartbeat_ms"),
        ("[autopilot]\ninterval_ms = 99\n", "autopilot.interval_ms"),
        (
            "[autopilot]\ninterval_ms = 60001\nwindow_ms = 120000\n",
            "autopilot.interval_ms",
        ),
        ("[autopilot]\nwindow_ms = 3600001\n", "autopilot.window_ms"),
        ("[autopilot]\nhold_ms = 600001\n", "autopilot.hold_ms"),
        (
            "[autopilot]\nmax_large_wait_ms = 3600001\n",
            "autopilot.max_large_wait_ms",
        ),
        (
            "[server]\nshutdown_grace_ms = 3600001\n",
            "server.shutdown_grace_ms",
        ),
        ("[jobs]\nmax_jobs = 10000001\n", "jobs.max_jobs"),
        ("[jobs]\nmax_bytes = 1099511627777\n", "jobs.max_bytes"),
        ("[jobs]\nresult_ttl_ms = 604800001\n", "jobs.result_ttl_ms"),
        (
            "[jobs]\nwebhook_timeout_ms = 60001\n",
            "jobs.webhook_timeout_ms",
        ),
        (
            "[[upstream.replicas]]\nurl = \"http://a:8000\"\nweight = 1001\n",
            "upstream.replicas[0].weight",
        ),
    ];
    for (section, key) in too_far {
        let issues = issues_of(&format!("{MINIMAL}{section}"));
        assert!(
            issues
                .iter()
                .any(|i| i.starts_with(&format!("{key} must be"))),
            "{key}: {issues:#?}"
        );
    }
    let inside = "[upstream]\nconnect_timeout_ms = 60000\ntotal_timeout_ms = 86400000\n\
                  health_cache_ms = 60000\n[upstream.routing]\nhealth_interval_ms = 60000\n\
                  unhealthy_after = 100\nhealthy_after = 100\n[quota]\nlease_ttl_ms = 3600000\n\
                  heartbeat_ms = 100\n[autopilot]\ninterval_ms = 60000\nwindow_ms = 3600000\n\
                  hold_ms = 600000\nmax_large_wait_ms = 3600000\n[server]\n\
                  shutdown_grace_ms = 3600000\n[jobs]\nmax_jobs = 10000000\n\
                  max_bytes = 1099511627776\nresult_ttl_ms = 604800000\n\
                  webhook_timeout_ms = 60000\n";
    let config = Config::from_toml_str(&format!("{MINIMAL}{inside}"));
    assert!(config.is_ok(), "{:?}", config.err());
}

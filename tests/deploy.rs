//! Checks of `deploy/`: the Prometheus config, alert rules and their unit tests (with
//! `promtool`, which `scripts/test` installs), the Grafana dashboard (every query names a metric
//! that the gateway, vLLM or the DCGM exporter exposes), the alert rules' metric names, and the
//! gateway config used by `deploy/docker-compose.yml`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    let path = repo().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

// ---------------------------------------------------------------------------------------------
// the production image

/// The image's build line leaves the simulator out, and so does the build it names: without
/// default features no `vllm-sim` is in the gateway's normal dependency tree.
#[test]
fn the_production_image_is_built_without_the_simulator() {
    let dockerfile = read("deploy/Dockerfile");
    let build: Vec<&str> = dockerfile
        .lines()
        .filter(|l| l.contains("cargo build"))
        .collect();
    assert_eq!(build.len(), 1, "one build line: {build:?}");
    assert!(
        build[0].contains("--no-default-features"),
        "the image must build without the `sim` feature: {}",
        build[0]
    );
    assert!(
        !build[0].contains("--features") && !build[0].contains("--all-features"),
        "no feature may bring the simulator back: {}",
        build[0]
    );
    let out = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "-e", "normal", "-p", "tutor-gateway"])
        .args(["--no-default-features", "--prefix", "none"])
        .current_dir(repo())
        .output()
        .expect("cargo tree runs");
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "cargo tree: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(tree.contains("tutor-gateway"), "{tree}");
    assert!(
        !tree.contains("vllm-sim"),
        "the simulator is linked:\n{tree}"
    );
    // And with defaults it is there (the check can tell the two apart).
    let out = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "-e", "normal", "-p", "tutor-gateway"])
        .args(["--prefix", "none"])
        .current_dir(repo())
        .output()
        .expect("cargo tree runs");
    assert!(String::from_utf8_lossy(&out.stdout).contains("vllm-sim"));
}

// ---------------------------------------------------------------------------------------------
// promtool

/// Runs `promtool ARGS` in `dir` and fails with its output unless it succeeds. A missing
/// promtool is a failure, never a skip.
fn promtool(dir: &Path, args: &[&str]) {
    let out = match Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
    {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "promtool is not installed (not on PATH). Run `scripts/test`, which installs it \
             (Debian package `prometheus`, /usr/bin/promtool), or install it yourself."
        ),
        Err(e) => panic!("cannot run promtool: {e}"),
    };
    assert!(
        out.status.success(),
        "`promtool {}` in {} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        args.join(" "),
        dir.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
}

fn prometheus_dir() -> PathBuf {
    repo().join("deploy/prometheus")
}

#[test]
fn promtool_check_config() {
    // From the config's directory, as Prometheus resolves `rule_files` against it.
    promtool(&prometheus_dir(), &["check", "config", "prometheus.yml"]);
}

#[test]
fn promtool_check_rules() {
    promtool(&prometheus_dir(), &["check", "rules", "alerts.yml"]);
}

#[test]
fn promtool_test_rules() {
    promtool(
        &prometheus_dir(),
        &["test", "rules", "tests/alerts_test.yml"],
    );
}

// ---------------------------------------------------------------------------------------------
// Metrics that exist

/// The gateway's public contract (issue 4), plus `tutor_gateway_engine_queue_seconds`, the
/// prefill budget's two series, the estimate's error and the autopilot's series
/// (`src/telemetry/`).
const GATEWAY_HISTOGRAMS: &[&str] = &[
    "tutor_gateway_queue_wait_seconds",
    "tutor_gateway_time_to_first_token_seconds",
    "tutor_gateway_prefill_seconds",
    "tutor_gateway_engine_queue_seconds",
    "tutor_gateway_time_per_output_token_seconds",
    "tutor_gateway_decode_tokens_per_second",
    "tutor_gateway_output_tokens",
    "tutor_gateway_cancelled_after_tokens",
    "tutor_gateway_prefill_wait_seconds",
    "tutor_gateway_estimate_error_ratio",
];
const GATEWAY_SERIES: &[&str] = &[
    "tutor_gateway_requests_total",
    "tutor_gateway_cancellations_total",
    "tutor_gateway_prefix_cache_queries_total",
    "tutor_gateway_prefix_cache_hits_total",
    "tutor_gateway_lane_in_flight",
    "tutor_gateway_lane_reserved_tokens",
    "tutor_gateway_lane_queue_depth",
    "tutor_gateway_prefill_tokens_in_flight",
    "tutor_gateway_autopilot_prefill_budget_tokens",
    "tutor_gateway_autopilot_large_seats",
    "tutor_gateway_autopilot_small_seats",
    "tutor_gateway_autopilot_piece_tokens",
    "tutor_gateway_autopilot_objective_ratio",
    "tutor_gateway_autopilot_adjustments_total",
    "tutor_gateway_tenant_refused_total",
    "tutor_gateway_tenant_service_tokens",
    "tutor_gateway_tenant_service_gap_tokens",
    "tutor_gateway_tenant_fleet_yields_total",
    "tutor_gateway_refused_total",
    "tutor_gateway_denied_total",
    "tutor_gateway_quota_degraded",
    "tutor_gateway_config_reloads_total",
    "tutor_gateway_quota_limits_differ",
    "tutor_gateway_log_dropped_total",
    "tutor_gateway_request_log_dropped_total",
    "tutor_gateway_jobs_engine_down",
    "tutor_gateway_job_engine_cuts_total",
    "tutor_gateway_promotions_waiting",
    "tutor_gateway_replica_healthy",
    "tutor_gateway_replica_ejections_total",
    "tutor_gateway_panics_total",
    "tutor_gateway_key_file_refused",
];

/// vLLM's `/metrics` (`docs/vllm-interface.md`, "Prometheus metrics"; V1 engine).
const VLLM_HISTOGRAMS: &[&str] = &[
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
];
const VLLM_SERIES: &[&str] = &[
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:cache_config_info",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:num_preemptions_total",
    "vllm:request_success_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
];

/// NVIDIA DCGM exporter, default counters.
const DCGM_SERIES: &[&str] = &[
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
];

/// Whether a series name is exposed: a plain series, or a histogram's `_bucket`/`_sum`/`_count`.
fn exposed(name: &str) -> bool {
    let plain = GATEWAY_SERIES
        .iter()
        .chain(VLLM_SERIES)
        .chain(DCGM_SERIES)
        .any(|m| *m == name);
    plain
        || ["_bucket", "_sum", "_count"].iter().any(|suffix| {
            name.strip_suffix(suffix).is_some_and(|base| {
                GATEWAY_HISTOGRAMS
                    .iter()
                    .chain(VLLM_HISTOGRAMS)
                    .any(|m| *m == base)
            })
        })
}

// ---------------------------------------------------------------------------------------------
// PromQL metric-name extraction

/// PromQL functions and aggregation operators (Prometheus 2.x/3.x).
const FUNCTIONS: &[&str] = &[
    "abs",
    "absent",
    "absent_over_time",
    "acos",
    "acosh",
    "asin",
    "asinh",
    "atan",
    "atanh",
    "avg",
    "avg_over_time",
    "bottomk",
    "ceil",
    "changes",
    "clamp",
    "clamp_max",
    "clamp_min",
    "cos",
    "cosh",
    "count",
    "count_over_time",
    "count_values",
    "day_of_month",
    "day_of_week",
    "day_of_year",
    "days_in_month",
    "deg",
    "delta",
    "deriv",
    "double_exponential_smoothing",
    "end",
    "exp",
    "floor",
    "group",
    "histogram_avg",
    "histogram_count",
    "histogram_fraction",
    "histogram_quantile",
    "histogram_stddev",
    "histogram_stdvar",
    "histogram_sum",
    "holt_winters",
    "hour",
    "idelta",
    "increase",
    "irate",
    "label_join",
    "label_replace",
    "last_over_time",
    "limit_ratio",
    "limitk",
    "ln",
    "log10",
    "log2",
    "mad_over_time",
    "max",
    "max_over_time",
    "min",
    "min_over_time",
    "minute",
    "month",
    "pi",
    "predict_linear",
    "present_over_time",
    "quantile",
    "quantile_over_time",
    "rad",
    "rate",
    "resets",
    "round",
    "scalar",
    "sgn",
    "sin",
    "sinh",
    "sort",
    "sort_by_label",
    "sort_by_label_desc",
    "sort_desc",
    "sqrt",
    "start",
    "stddev",
    "stddev_over_time",
    "stdvar",
    "stdvar_over_time",
    "sum",
    "sum_over_time",
    "tan",
    "tanh",
    "time",
    "timestamp",
    "topk",
    "vector",
    "year",
];

/// Keywords followed by a label list in parentheses.
const LABEL_LIST_KEYWORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// Other keywords and literals that are not series names.
const KEYWORDS: &[&str] = &[
    "and", "or", "unless", "bool", "offset", "atan2", "inf", "nan",
];

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Index just past the quoted string starting at `i` (`"`, `'` or a backtick).
fn skip_string(s: &[char], i: usize) -> usize {
    let quote = s[i];
    let mut j = i + 1;
    while j < s.len() {
        if s[j] == '\\' && quote != '`' {
            j += 2;
            continue;
        }
        if s[j] == quote {
            return j + 1;
        }
        j += 1;
    }
    j
}

/// Index just past the bracket that closes the one at `i`, skipping strings inside.
fn skip_group(s: &[char], i: usize) -> Result<usize, String> {
    let (open, close) = (s[i], matching(s[i]));
    let mut depth = 0;
    let mut j = i;
    while j < s.len() {
        match s[j] {
            '"' | '\'' | '`' => {
                j = skip_string(s, j);
                continue;
            }
            c if c == open => depth += 1,
            c if c == close => {
                depth -= 1;
                if depth == 0 {
                    return Ok(j + 1);
                }
            }
            _ => {}
        }
        j += 1;
    }
    Err(format!("unclosed `{open}`"))
}

fn matching(open: char) -> char {
    match open {
        '(' => ')',
        '[' => ']',
        '{' => '}',
        _ => unreachable!("not a bracket: {open}"),
    }
}

/// Whether the keyword `word` starts at `i` (and is not the start of a longer identifier).
fn word_at(s: &[char], i: usize, word: &str) -> bool {
    let w: Vec<char> = word.chars().collect();
    s.len() >= i + w.len()
        && s[i..i + w.len()]
            .iter()
            .zip(&w)
            .all(|(a, b)| a.eq_ignore_ascii_case(b))
        && !s.get(i + w.len()).is_some_and(|c| is_ident_char(*c))
}

fn next_non_space(s: &[char], mut i: usize) -> Option<usize> {
    while i < s.len() && s[i].is_whitespace() {
        i += 1;
    }
    (i < s.len()).then_some(i)
}

/// The series names a PromQL expression selects, in order of appearance. Skips label
/// matchers (`{...}`), ranges and subqueries (`[...]`), strings, numbers and durations, Grafana
/// variables (`$__rate_interval`, `${x}`), functions, aggregations, keywords and the label lists
/// of `by`/`without`/`on`/`ignoring`/`group_left`/`group_right`. An identifier followed by `(`
/// that is not a PromQL function is an error.
fn metric_names(expr: &str) -> Result<Vec<String>, String> {
    let s: Vec<char> = expr.chars().collect();
    let mut names = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '#' {
            while i < s.len() && s[i] != '\n' {
                i += 1;
            }
        } else if c == '"' || c == '\'' || c == '`' {
            i = skip_string(&s, i);
        } else if c == '{' || c == '[' {
            i = skip_group(&s, i)?;
        } else if c == '$' {
            i += 1;
            if i < s.len() && s[i] == '{' {
                i = skip_group(&s, i)?;
            } else {
                while i < s.len() && is_ident_char(s[i]) {
                    i += 1;
                }
            }
        } else if c.is_ascii_digit() || (c == '.' && s.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            // A number or a duration (0.95, 1e3, 1e-3, 0x1f, 5m, 1h30m).
            let start = i;
            while i < s.len() {
                let d = s[i];
                let exponent_sign = (d == '+' || d == '-')
                    && matches!(s[i - 1], 'e' | 'E')
                    && !s[start..i].contains(&'x');
                if d.is_ascii_alphanumeric() || d == '.' || d == '_' || exponent_sign {
                    i += 1;
                } else {
                    break;
                }
            }
        } else if is_ident_start(c) {
            let start = i;
            while i < s.len() && is_ident_char(s[i]) {
                i += 1;
            }
            let word: String = s[start..i].iter().collect();
            let lower = word.to_ascii_lowercase();
            let next = next_non_space(&s, i);
            // `sum(...)`, and also `sum by (lane) (...)` / `sum without (x) (...)`.
            let paren_follows = next
                .is_some_and(|n| s[n] == '(' || word_at(&s, n, "by") || word_at(&s, n, "without"));
            if LABEL_LIST_KEYWORDS.contains(&lower.as_str()) {
                if let (Some(n), true) = (next, paren_follows) {
                    i = skip_group(&s, n)?;
                }
            } else if KEYWORDS.contains(&lower.as_str()) {
                // Operator, modifier or literal.
            } else if paren_follows {
                if !FUNCTIONS.contains(&word.as_str()) {
                    return Err(format!("`{word}(` is not a PromQL function"));
                }
            } else {
                names.push(word);
            }
        } else {
            // Operators, parentheses, commas, `@`.
            i += 1;
        }
    }
    Ok(names)
}

#[test]
fn metric_name_extractor_finds_series_and_skips_the_rest() {
    let expr = r#"histogram_quantile(0.95, sum by (lane, le) (rate(tutor_gateway_time_to_first_token_seconds_bucket{lane=~"small|medium", route!="x{y}"}[$__rate_interval])))
        / on() group_left(lane) sum without (instance) (vllm:num_requests_waiting offset 5m)
        + ignoring(le) max(DCGM_FI_DEV_GPU_UTIL) > bool 1e-3 and sum(rate(x_total[5m:1m])) or vector(1)
        + label_replace(up, "dst", "$1", "src", "(.*)") * 0.5 unless ${var} inf"#;
    assert_eq!(
        metric_names(expr).unwrap(),
        [
            "tutor_gateway_time_to_first_token_seconds_bucket",
            "vllm:num_requests_waiting",
            "DCGM_FI_DEV_GPU_UTIL",
            "x_total",
            "up",
        ]
    );
    assert_eq!(
        metric_names("sum(rate(foo[5m])) by (lane)").unwrap(),
        ["foo"]
    );
    assert_eq!(
        metric_names("sum without(instance)(rate(bar_total[1m]))").unwrap(),
        ["bar_total"]
    );
    assert_eq!(metric_names("by_lane_total").unwrap(), ["by_lane_total"]);
    assert!(metric_names("histogram_quantle(0.9, foo)").is_err());
    assert!(metric_names("summ by (le) (foo)").is_err());
    assert!(metric_names("sum(foo{a=\"b\"").is_err());
}

#[test]
fn exposed_metrics_include_histogram_series_only_for_histograms() {
    assert!(exposed("tutor_gateway_time_to_first_token_seconds_bucket"));
    assert!(exposed("tutor_gateway_output_tokens_sum"));
    assert!(exposed("vllm:request_queue_time_seconds_count"));
    assert!(exposed("vllm:kv_cache_usage_perc"));
    assert!(exposed("DCGM_FI_DEV_FB_USED"));
    assert!(!exposed("tutor_gateway_time_to_first_token_seconds"));
    assert!(!exposed("tutor_gateway_requests_total_bucket"));
    assert!(!exposed("vllm:gpu_cache_usage_perc"));
    assert!(!exposed("tutor_gateway_ttft_seconds_bucket"));
}

// ---------------------------------------------------------------------------------------------
// Grafana dashboard

const DASHBOARD: &str = "deploy/grafana/dashboards/tutor-gateway.json";

/// Every panel, rows' nested panels included, depth first.
fn walk_panels<'a>(panels: &'a [Value], out: &mut Vec<&'a Value>) {
    for p in panels {
        out.push(p);
        if let Some(children) = p.get("panels").and_then(Value::as_array) {
            walk_panels(children, out);
        }
    }
}

fn dashboard() -> Value {
    serde_json::from_str(&read(DASHBOARD)).unwrap_or_else(|e| panic!("{DASHBOARD}: {e}"))
}

/// (panel title, expr) of every query of every non-row panel; problems go to `errors`.
fn dashboard_queries(dash: &Value, errors: &mut Vec<String>) -> Vec<(String, String)> {
    let top = dash["panels"].as_array().expect("top-level `panels` array");
    let mut panels = Vec::new();
    walk_panels(top, &mut panels);
    let mut queries = Vec::new();
    for p in panels {
        let title = p["title"].as_str().unwrap_or("<untitled>").to_string();
        let kind = p["type"].as_str().unwrap_or("");
        if kind == "row" || kind == "text" {
            continue;
        }
        let uses_variable = |v: &Value| v["uid"].as_str() == Some("${datasource}");
        if !uses_variable(&p["datasource"]) {
            errors.push(format!(
                "panel {title:?}: datasource must be the ${{datasource}} variable"
            ));
        }
        let targets = p["targets"].as_array().cloned().unwrap_or_default();
        if targets.is_empty() {
            errors.push(format!("panel {title:?} has no queries"));
        }
        for t in &targets {
            if !uses_variable(&t["datasource"]) {
                errors.push(format!(
                    "panel {title:?} query {}: datasource must be the ${{datasource}} variable",
                    t["refId"]
                ));
            }
            match t["expr"].as_str() {
                Some(e) if !e.trim().is_empty() => queries.push((title.clone(), e.to_string())),
                _ => errors.push(format!("panel {title:?} query {}: no `expr`", t["refId"])),
            }
        }
    }
    queries
}

#[test]
fn dashboard_queries_name_only_exposed_metrics() {
    let dash = dashboard();
    let mut errors = Vec::new();
    let queries = dashboard_queries(&dash, &mut errors);
    assert!(queries.len() >= 20, "only {} queries", queries.len());
    for (title, expr) in &queries {
        match metric_names(expr) {
            Ok(names) if names.is_empty() => {
                errors.push(format!("panel {title:?}: `{expr}` selects no series"))
            }
            Ok(names) => {
                for n in names.iter().filter(|n| !exposed(n)) {
                    errors.push(format!(
                        "panel {title:?}: `{n}` is not a gateway, vLLM or DCGM series (in `{expr}`)"
                    ));
                }
            }
            Err(e) => errors.push(format!("panel {title:?}: {e} (in `{expr}`)")),
        }
    }
    assert!(errors.is_empty(), "{DASHBOARD}:\n{}", errors.join("\n"));
}

#[test]
fn dashboard_covers_the_required_panels() {
    let dash = dashboard();
    let mut errors = Vec::new();
    let queries = dashboard_queries(&dash, &mut errors);
    assert!(errors.is_empty(), "{}", errors.join("\n"));
    let used: BTreeSet<String> = queries
        .iter()
        .flat_map(|(_, e)| metric_names(e).unwrap_or_default())
        .collect();
    let required = [
        "tutor_gateway_time_to_first_token_seconds_bucket",
        "tutor_gateway_queue_wait_seconds_bucket",
        "tutor_gateway_prefill_seconds_bucket",
        "vllm:num_requests_waiting",
        "tutor_gateway_lane_queue_depth",
        "vllm:kv_cache_usage_perc",
        "vllm:generation_tokens_total",
        "tutor_gateway_output_tokens_sum",
        "tutor_gateway_prefix_cache_hits_total",
        "tutor_gateway_prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prefix_cache_queries_total",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "tutor_gateway_lane_in_flight",
        "tutor_gateway_lane_reserved_tokens",
        "tutor_gateway_requests_total",
        "tutor_gateway_cancellations_total",
        "tutor_gateway_decode_tokens_per_second_bucket",
        "tutor_gateway_time_per_output_token_seconds_bucket",
    ];
    let missing: Vec<_> = required.iter().filter(|m| !used.contains(**m)).collect();
    assert!(missing.is_empty(), "no panel queries {missing:?}");
    // TTFT p50/p95/p99 per lane.
    for q in ["0.5", "0.95", "0.99"] {
        let per_lane_ttft = queries.iter().any(|(_, e)| {
            e.starts_with(&format!("histogram_quantile({q},"))
                && e.contains("by (lane, le)")
                && e.contains("tutor_gateway_time_to_first_token_seconds_bucket")
        });
        assert!(per_lane_ttft, "no TTFT p{q} per lane panel query");
    }
    // One datasource variable, Prometheus.
    let vars = dash["templating"]["list"].as_array().expect("templating");
    assert!(
        vars.iter().any(|v| v["name"] == "datasource"
            && v["type"] == "datasource"
            && v["query"] == "prometheus"),
        "no `datasource` variable of type datasource/prometheus"
    );
    // Unique panel ids and a grid position on each.
    let mut panels = Vec::new();
    walk_panels(dash["panels"].as_array().unwrap(), &mut panels);
    let mut ids = BTreeSet::new();
    for p in &panels {
        let id = p["id"].as_u64().expect("panel id");
        assert!(ids.insert(id), "duplicate panel id {id}");
        assert!(p["gridPos"]["w"].is_u64(), "panel {id} has no gridPos");
    }
    assert_eq!(dash["uid"], "tutor-gateway");
}

// ---------------------------------------------------------------------------------------------
// Alert rules' metric names

/// The `expr` of every rule in a Prometheus rules file (block scalars `|`/`>` and one-liners).
fn rule_exprs(yaml: &str) -> Vec<String> {
    let lines: Vec<&str> = yaml.lines().collect();
    let mut exprs = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix("expr:") {
            let rest = rest.trim();
            let indent = line.len() - trimmed.len();
            if rest.starts_with('|') || rest.starts_with('>') {
                let mut body = Vec::new();
                i += 1;
                while i < lines.len() {
                    let l = lines[i];
                    let li = l.len() - l.trim_start().len();
                    if !l.trim().is_empty() && li <= indent {
                        break;
                    }
                    body.push(l.trim());
                    i += 1;
                }
                exprs.push(body.join("\n"));
                continue;
            }
            exprs.push(rest.to_string());
        }
        i += 1;
    }
    exprs
}

#[test]
fn alert_rules_name_only_exposed_metrics() {
    let rules = read("deploy/prometheus/alerts.yml");
    let exprs = rule_exprs(&rules);
    assert!(exprs.len() >= 8, "found {} rule expressions", exprs.len());
    let mut errors = Vec::new();
    for expr in &exprs {
        match metric_names(expr) {
            Ok(names) => {
                // `up` is Prometheus's own per-target series.
                for n in names.iter().filter(|n| *n != "up" && !exposed(n)) {
                    errors.push(format!("`{n}` is not exposed (in `{expr}`)"));
                }
            }
            Err(e) => errors.push(format!("{e} (in `{expr}`)")),
        }
    }
    assert!(errors.is_empty(), "alerts.yml:\n{}", errors.join("\n"));
    let capacity = exprs
        .iter()
        .find(|e| e.contains("vllm:num_requests_waiting"))
        .expect("capacity alert");
    for signal in [
        "vllm:num_requests_waiting",
        "tutor_gateway_time_to_first_token_seconds_bucket",
        "vllm:kv_cache_usage_perc",
    ] {
        assert!(capacity.contains(signal), "capacity alert lacks {signal}");
    }
}

// ---------------------------------------------------------------------------------------------
// docker-compose inputs

#[test]
fn compose_gateway_config_is_valid() {
    let out = Command::new(env!("CARGO_BIN_EXE_tutor-gateway"))
        .args(["check-config", "deploy/gateway/config.toml"])
        .current_dir(repo())
        .output()
        .expect("run tutor-gateway check-config");
    assert!(
        out.status.success(),
        "deploy/gateway/config.toml:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn compose_mounts_files_that_exist() {
    let compose = read("deploy/docker-compose.yml");
    let mut mounts = 0;
    for line in compose.lines() {
        let Some(src) = line.trim().strip_prefix("- ./") else {
            continue;
        };
        let src = src.split(':').next().unwrap();
        mounts += 1;
        let path = repo().join("deploy").join(src);
        assert!(path.exists(), "docker-compose.yml mounts missing ./{src}");
    }
    assert!(mounts >= 5, "only {mounts} bind mounts found");
    assert!(repo().join("deploy/Dockerfile").exists());
}

/// Host ports each compose service publishes (`ports:` entries), by service name.
fn compose_ports(compose: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let (mut service, mut in_ports) = (String::new(), false);
    for line in compose.lines() {
        let indent = line.len() - line.trim_start().len();
        let text = line.trim();
        if text.is_empty() || text.starts_with('#') {
            continue;
        }
        if indent == 2 && text.ends_with(':') {
            service = text.trim_end_matches(':').to_owned();
            in_ports = false;
        } else if indent == 4 {
            in_ports = text == "ports:";
        } else if in_ports && indent == 6 {
            let port = text.trim_start_matches("- ").trim_matches('"').to_owned();
            out.push((service.clone(), port));
        }
    }
    out
}

#[test]
fn compose_publishes_only_the_gateway_and_grafana_and_requires_passwords() {
    let compose = read("deploy/docker-compose.yml");
    let ports = compose_ports(&compose);
    assert!(
        ports.contains(&("gateway".into(), "8080:8080".into())),
        "{ports:?}"
    );
    assert!(
        ports.contains(&("grafana".into(), "3000:3000".into())),
        "{ports:?}"
    );
    for (service, port) in &ports {
        if service != "gateway" && service != "grafana" {
            assert!(
                port.starts_with("127.0.0.1:"),
                "{service} publishes {port} beyond the host's loopback"
            );
        }
    }
    for (service, _) in &ports {
        assert!(
            !["vllm", "redis", "dcgm-exporter", "otel-collector"].contains(&service.as_str()),
            "{service} must not be published"
        );
    }
    assert!(compose.contains("--requirepass"), "Redis has a password");
    assert!(
        compose.contains("${REDIS_PASSWORD:?"),
        "no default Redis password"
    );
    assert!(
        compose.contains("GF_SECURITY_ADMIN_PASSWORD: ${GRAFANA_ADMIN_PASSWORD:?"),
        "Grafana's admin password is required, never admin/admin"
    );
}

#[test]
fn the_containers_gateway_listens_on_every_interface_and_scrapes_its_admin_port() {
    let config = tutor_gateway::config::Config::load(repo().join("deploy/gateway/config.toml"))
        .expect("valid");
    assert!(config.listen.ip().is_unspecified(), "{}", config.listen);
    assert_eq!(config.listen.port(), 8080);
    let admin = config
        .server
        .admin_listen
        .expect("an admin listener in the container");
    assert!(admin.ip().is_unspecified());
    let prometheus = read("deploy/prometheus/prometheus.yml");
    assert!(
        prometheus.contains(&format!("\"gateway:{}\"", admin.port())),
        "Prometheus scrapes the admin port"
    );
}

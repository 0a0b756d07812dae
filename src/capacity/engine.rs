//! The capacity one engine reports: its KV cache from `vllm:cache_config_info` on `/metrics`
//! (labels `block_size` and `num_gpu_blocks`; vLLM adds many more, and one label set per engine
//! core under data parallelism), its `max_model_len` from `/v1/models`.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use serde::Serialize;
use serde_json::Value;

use super::prom;
use crate::config::UpstreamConfig;

/// The metric vLLM exports its cache configuration as.
pub const CACHE_CONFIG_INFO: &str = "vllm:cache_config_info";

/// How long one read of `/metrics` or `/v1/models` may take.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// What one engine (one vLLM server, one replica) can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct EngineCapacity {
    /// KV blocks, summed over the engine cores behind this server (`engine` label; one unless
    /// vLLM runs data parallel).
    pub num_gpu_blocks: u64,
    /// Tokens per block.
    pub block_size: u32,
    /// Engine cores counted (label sets of `vllm:cache_config_info`).
    pub engines: u32,
    /// The engine's `--max-model-len` (`/v1/models` `data[0].max_model_len`).
    pub max_model_len: u32,
}

impl EngineCapacity {
    /// Tokens the KV cache holds: `num_gpu_blocks x block_size`.
    pub fn kv_tokens(&self) -> u64 {
        self.num_gpu_blocks
            .saturating_mul(u64::from(self.block_size))
    }
}

impl std::fmt::Display for EngineCapacity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "KV cache {} tokens ({} blocks x {} tokens",
            self.kv_tokens(),
            self.num_gpu_blocks,
            self.block_size
        )?;
        if self.engines > 1 {
            write!(f, ", {} engine cores", self.engines)?;
        }
        write!(f, "), max_model_len {}", self.max_model_len)
    }
}

/// An HTTP client for reading capacity from the engine `upstream` names: its API key (vLLM
/// guards `/v1/models` behind `--api-key`), its CA file, its connect timeout.
pub fn client_for(upstream: &UpstreamConfig) -> Result<reqwest::Client> {
    let mut headers = HeaderMap::new();
    if let Some(key) = &upstream.api_key {
        let mut auth = HeaderValue::from_str(&format!("Bearer {}", key.expose()))
            .map_err(|_| anyhow::anyhow!("the upstream API key is not a valid header value"))?;
        auth.set_sensitive(true);
        headers.insert(AUTHORIZATION, auth);
    }
    let mut builder = reqwest::Client::builder()
        .connect_timeout(upstream.connect_timeout)
        .timeout(READ_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .default_headers(headers);
    if let Some(pem) = &upstream.ca_pem {
        for cert in reqwest::Certificate::from_pem_bundle(pem).context("upstream.ca_file")? {
            builder = builder.add_root_certificate(cert);
        }
    }
    builder.build().context("cannot build the HTTP client")
}

/// Reads `GET {base_url}/metrics` and `GET {base_url}/v1/models`. Its errors name the path,
/// never the URL (a replica's URL may hold a password; the caller names the replica).
pub async fn read_engine_capacity(
    http: &reqwest::Client,
    base_url: &str,
) -> Result<EngineCapacity> {
    let base = base_url.trim_end_matches('/');
    let metrics = get_text(http, base, "/metrics").await?;
    let (num_gpu_blocks, block_size, engines) = parse_cache_config(&metrics).context("/metrics")?;
    let models = get_text(http, base, "/v1/models").await?;
    let max_model_len = parse_max_model_len(&models).context("/v1/models")?;
    Ok(EngineCapacity {
        num_gpu_blocks,
        block_size,
        engines,
        max_model_len,
    })
}

/// `GET {base}{path}`'s page; its errors name `path` and reqwest's errors without their URL.
async fn get_text(http: &reqwest::Client, base: &str, path: &str) -> Result<String> {
    let resp = http
        .get(format!("{base}{path}"))
        .send()
        .await
        .map_err(reqwest::Error::without_url)
        .with_context(|| format!("GET {path}"))?;
    let status = resp.status();
    if !status.is_success() {
        bail!("GET {path}: HTTP {status}");
    }
    // Read with a bound: a page past it is not vLLM's (its /metrics is tens of KiB).
    let mut body = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = futures::StreamExt::next(&mut stream).await {
        let chunk = chunk
            .map_err(reqwest::Error::without_url)
            .with_context(|| format!("GET {path}"))?;
        if body.len() + chunk.len() > MAX_PAGE_BYTES {
            bail!("GET {path}: more than {MAX_PAGE_BYTES} bytes, not vLLM's page");
        }
        body.extend_from_slice(&chunk);
    }
    String::from_utf8(body).with_context(|| format!("GET {path}: not UTF-8"))
}

/// The most bytes read of the engine's `/metrics` or `/v1/models`.
const MAX_PAGE_BYTES: usize = 8 << 20;

/// The most KV blocks one engine core may report and still be believed: 2^40 blocks is far
/// beyond any GPU, and keeps every product with a block size within u64.
const MAX_BLOCKS: u64 = 1 << 40;

/// Blocks (summed over engine cores), block size, engine cores, from a `/metrics` page.
pub fn parse_cache_config(metrics: &str) -> Result<(u64, u32, u32)> {
    let sets = prom::label_sets(metrics, CACHE_CONFIG_INFO);
    if sets.is_empty() {
        bail!("the engine does not export {CACHE_CONFIG_INFO} (is it vLLM, with its /metrics?)");
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut blocks = 0u64;
    let mut block_size = None;
    for set in &sets {
        // One label set per engine core; a page that repeats one is counted once.
        if !seen.insert(set.get("engine").cloned().unwrap_or_default()) {
            continue;
        }
        let label = |key: &str| -> Result<u64> {
            let value = set
                .get(key)
                .with_context(|| format!("{CACHE_CONFIG_INFO} has no `{key}` label"))?;
            value.parse().with_context(|| {
                format!("{CACHE_CONFIG_INFO} `{key}` is {value:?}, not a number (KV cache not sized yet?)")
            })
        };
        let n = label("num_gpu_blocks")?;
        if n > MAX_BLOCKS {
            bail!("{CACHE_CONFIG_INFO} `num_gpu_blocks` is {n}, beyond any engine");
        }
        let size = u32::try_from(label("block_size")?).context("block_size is too large")?;
        if size == 0 {
            bail!("{CACHE_CONFIG_INFO} `block_size` is 0");
        }
        if *block_size.get_or_insert(size) != size {
            bail!("{CACHE_CONFIG_INFO}: the engine cores report different block sizes");
        }
        blocks = blocks.saturating_add(n);
    }
    Ok((blocks, block_size.unwrap_or_default(), seen.len() as u32))
}

/// `max_model_len` of the served model from a `/v1/models` body: the first entry that has one,
/// base models (`parent` null) before LoRA adapters.
pub fn parse_max_model_len(body: &str) -> Result<u32> {
    let v: Value = serde_json::from_str(body).context("not JSON")?;
    let data = v
        .get("data")
        .and_then(Value::as_array)
        .context("no `data` list")?;
    let len = |m: &Value| {
        m.get("max_model_len")
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
    };
    data.iter()
        .filter(|m| m.get("parent").is_none_or(Value::is_null))
        .chain(data.iter())
        .find_map(len)
        .context("no model with a `max_model_len` (vLLM lists it for every model)")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// vLLM 0.11's line, all its labels (one engine core).
    const VLLM_LINE: &str = "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",\
        calculate_kv_scales=\"False\",cpu_offload_gb=\"0\",enable_prefix_caching=\"True\",\
        engine=\"0\",gpu_memory_utilization=\"0.9\",is_attention_free=\"False\",\
        num_cpu_blocks=\"None\",num_gpu_blocks=\"27690\",num_gpu_blocks_override=\"None\",\
        prefix_caching_hash_algo=\"sha256\",sliding_window=\"None\",swap_space=\"4\",\
        swap_space_bytes=\"4294967296\"} 1.0";

    /// A replica's URL may hold a password: the errors (logged by the capacity watcher) name
    /// the path, never the URL, whatever failed.
    #[tokio::test]
    async fn errors_name_the_path_never_the_url() {
        // Nothing listens there: the connection is refused.
        let refused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = refused.local_addr().unwrap().port();
        drop(refused);
        // One that answers 404 to everything.
        let app = axum::Router::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let answers = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let http = reqwest::Client::new();
        for port in [port, answers] {
            let url = format!("http://tutor:s3cret-pw@127.0.0.1:{port}");
            let err = read_engine_capacity(&http, &url).await.unwrap_err();
            let told = format!("{err:#}");
            assert!(told.contains("GET /metrics"), "{told}");
            assert!(
                !told.contains("s3cret") && !told.contains("tutor:"),
                "{told}"
            );
        }
    }

    #[test]
    fn reads_vllms_cache_config_info() {
        let page = format!("# HELP x\n# TYPE vllm:cache_config_info gauge\n{VLLM_LINE}\n");
        assert_eq!(parse_cache_config(&page).unwrap(), (27690, 16, 1));
    }

    #[test]
    fn data_parallel_engine_cores_add_up() {
        let two = format!(
            "{VLLM_LINE}\n{}\n",
            VLLM_LINE.replace("engine=\"0\"", "engine=\"1\"")
        );
        assert_eq!(parse_cache_config(&two).unwrap(), (2 * 27690, 16, 2));
    }

    #[test]
    fn a_page_without_the_metric_says_so() {
        let err = parse_cache_config("vllm:num_requests_running{engine=\"0\"} 0\n").unwrap_err();
        assert!(
            err.to_string()
                .contains("engine does not export vllm:cache_config_info"),
            "{err}"
        );
    }

    #[test]
    fn unsized_blocks_are_an_error_naming_the_label() {
        let page = VLLM_LINE.replace("num_gpu_blocks=\"27690\"", "num_gpu_blocks=\"None\"");
        let err = parse_cache_config(&page).unwrap_err().to_string();
        assert!(err.contains("`num_gpu_blocks` is \"None\""), "{err}");
    }

    /// A block count no engine has (2^59: times a block size it would wrap u64, and the
    /// replicas' KV shares divided by a total of zero) is refused, not believed.
    #[test]
    fn a_block_count_beyond_any_engine_is_refused() {
        let page = VLLM_LINE.replace("\"27690\"", "\"576460752303423488\"");
        let err = parse_cache_config(&page).unwrap_err().to_string();
        assert!(err.contains("beyond any engine"), "{err}");
        let most = EngineCapacity {
            num_gpu_blocks: u64::MAX,
            block_size: 16,
            engines: 1,
            max_model_len: 1,
        };
        assert_eq!(most.kv_tokens(), u64::MAX);
    }

    #[test]
    fn max_model_len_of_the_base_model() {
        let body = r#"{"object":"list","data":[
            {"id":"lora-a","parent":"meta-llama/Llama-3.1-8B-Instruct","max_model_len":4096},
            {"id":"meta-llama/Llama-3.1-8B-Instruct","parent":null,"max_model_len":16384}]}"#;
        assert_eq!(parse_max_model_len(body).unwrap(), 16384);
        let err = parse_max_model_len(r#"{"data":[{"id":"m"}]}"#).unwrap_err();
        assert!(err.to_string().contains("max_model_len"), "{err}");
    }
}

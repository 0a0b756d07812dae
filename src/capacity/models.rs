//! `config.json` shapes of a few common open models, bundled so that `capacity --model NAME`
//! needs no download. Each file in `config/models/` holds the keys the planner reads, as the
//! model's published `config.json` states them (its `_source` names the repository).

/// The bundled models: the name `--model` takes, and the file's text.
pub const BUNDLED: &[(&str, &str)] = &[
    (
        "llama-3.1-8b",
        include_str!("../../config/models/llama-3.1-8b.json"),
    ),
    (
        "llama-3.1-70b",
        include_str!("../../config/models/llama-3.1-70b.json"),
    ),
    (
        "qwen2.5-7b",
        include_str!("../../config/models/qwen2.5-7b.json"),
    ),
    (
        "qwen2.5-32b",
        include_str!("../../config/models/qwen2.5-32b.json"),
    ),
    (
        "mistral-7b",
        include_str!("../../config/models/mistral-7b.json"),
    ),
];

/// The bundled `config.json` of `name` (case-insensitive), or an error listing the names.
pub fn bundled(name: &str) -> anyhow::Result<&'static str> {
    BUNDLED
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, text)| *text)
        .ok_or_else(|| {
            let names: Vec<&str> = BUNDLED.iter().map(|(n, _)| *n).collect();
            anyhow::anyhow!(
                "--model {name:?} is not bundled; bundled: {}; or give the model's config.json \
                 with --model-config",
                names.join(", ")
            )
        })
}

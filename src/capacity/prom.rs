//! Just enough of the Prometheus text exposition to read one info metric's label sets.

use std::collections::BTreeMap;

/// The label sets of every sample of `name` in `text` (`# HELP`/`# TYPE` lines and other
/// metrics skipped). Label values are unescaped (`\\`, `\"`, `\n`). A line whose labels do not
/// parse is skipped.
pub fn label_sets(text: &str, name: &str) -> Vec<BTreeMap<String, String>> {
    text.lines()
        .filter_map(|line| {
            let rest = line.trim_start().strip_prefix(name)?;
            let rest = rest.strip_prefix('{')?;
            labels(rest)
        })
        .collect()
}

/// Parses `a="x",b="y"}` (the part after `{`).
fn labels(mut s: &str) -> Option<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    loop {
        s = s.trim_start();
        if let Some(rest) = s.strip_prefix('}') {
            // The value must follow.
            return (!rest.trim().is_empty()).then_some(out);
        }
        let eq = s.find('=')?;
        let key = s[..eq].trim();
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return None;
        }
        s = s[eq + 1..].trim_start().strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        out.insert(key.to_owned(), value);
        s = s[end + 1..].trim_start();
        s = s.strip_prefix(',').unwrap_or(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_labels_with_escapes_and_skips_other_metrics() {
        let text = "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
             # TYPE vllm:cache_config_info gauge\n\
             vllm:cache_config_info_extra{a=\"1\"} 1.0\n\
             vllm:cache_config_info{block_size=\"16\",note=\"a \\\"quoted\\\", one\\\\\",num_gpu_blocks=\"27000\",} 1.0\n\
             vllm:num_requests_running{engine=\"0\"} 0.0\n";
        let sets = label_sets(text, "vllm:cache_config_info");
        assert_eq!(sets.len(), 1);
        assert_eq!(sets[0]["block_size"], "16");
        assert_eq!(sets[0]["num_gpu_blocks"], "27000");
        assert_eq!(sets[0]["note"], "a \"quoted\", one\\");
    }

    #[test]
    fn a_broken_line_is_skipped() {
        assert!(label_sets("m{a=\"1} 1\n", "m").is_empty());
        assert!(label_sets("m{a=1} 1\n", "m").is_empty());
        assert!(label_sets("m{a=\"1\"}\n", "m").is_empty());
    }
}

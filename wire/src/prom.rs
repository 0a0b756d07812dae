//! Reading values out of a Prometheus text exposition (`/metrics` of the gateway, vLLM, the
//! simulator or a DCGM exporter).

/// The value of one series, given as its exact text before the value (name and labels, as
/// exposed, e.g. `vllm:num_requests_running{engine="0",model_name="m"}`); `None` when absent
/// or not a number.
pub fn series_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' ')))
        .and_then(|v| v.parse().ok())
}

/// The sum of every sample of the metric family `name` (all its label sets; comment lines
/// skipped); `None` when the family has no sample.
pub fn family_sum(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        if &line[..name_end] != name {
            continue;
        }
        if let Some(v) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_and_families_are_read() {
        let page = "# TYPE a counter\na{x=\"1\"} 2\na{x=\"2\"} 3.5\nab 7\nb 1\n";
        assert_eq!(series_value(page, "a{x=\"2\"}"), Some(3.5));
        assert_eq!(series_value(page, "c"), None);
        assert_eq!(family_sum(page, "a"), Some(5.5));
        assert_eq!(family_sum(page, "b"), Some(1.0));
        assert_eq!(family_sum(page, "c"), None);
    }
}

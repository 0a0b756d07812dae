//! Hand-written SVG charts (no plotting dependency): lines or dots on linear or logarithmic
//! axes (TTFT spans three decades under load: 40 ms for a short question, seconds for a review,
//! so TTFT axes are logarithmic).

use std::fmt::Write;

/// Colours given to series in order.
pub const PALETTE: &[&str] = &[
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];

/// One series.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend label.
    pub name: String,
    /// (x, y) points.
    pub points: Vec<(f64, f64)>,
    /// Dots instead of a line.
    pub dots: bool,
}

/// A chart with a title, axis labels and optional horizontal/vertical marker lines.
#[derive(Debug, Clone, Default)]
pub struct Chart {
    /// Title above the plot.
    pub title: String,
    /// X axis label.
    pub x_label: String,
    /// Y axis label.
    pub y_label: String,
    /// Series drawn in order.
    pub series: Vec<Series>,
    /// Dashed vertical line at this x with a label (e.g. the SLO).
    pub x_marker: Option<(f64, String)>,
    /// Dashed horizontal line at this y with a label.
    pub y_marker: Option<(f64, String)>,
    /// Logarithmic x axis (decades from the smallest positive x).
    pub x_log: bool,
    /// Logarithmic y axis.
    pub y_log: bool,
}

/// One axis: linear from 0 to a nice maximum, or logarithmic over whole decades.
#[derive(Debug, Clone, Copy)]
struct Axis {
    log: bool,
    /// Linear: the maximum. Log: the lowest and highest decade exponents.
    lo: f64,
    hi: f64,
}

impl Axis {
    fn new(log: bool, values: impl Iterator<Item = f64>) -> Self {
        if !log {
            let max = values.fold(0.0f64, f64::max);
            return Self {
                log,
                lo: 0.0,
                hi: nice_max(max),
            };
        }
        let (mut min, mut max) = (f64::INFINITY, 0.0f64);
        for v in values.filter(|v| *v > 0.0 && v.is_finite()) {
            min = min.min(v);
            max = max.max(v);
        }
        if !min.is_finite() {
            (min, max) = (1.0, 10.0);
        }
        let lo = min.log10().floor();
        let hi = max.log10().ceil().max(lo + 1.0);
        Self { log, lo, hi }
    }

    /// Where `v` sits along the axis, 0 to 1 (log: values at or below 0 sit at the bottom).
    fn frac(&self, v: f64) -> f64 {
        if self.log {
            if v <= 0.0 {
                return 0.0;
            }
            (v.log10() - self.lo) / (self.hi - self.lo)
        } else {
            v / self.hi
        }
    }

    /// Tick values: six even steps, or every decade.
    fn ticks(&self) -> Vec<f64> {
        if self.log {
            let (lo, hi) = (self.lo as i32, self.hi as i32);
            // Parsed rather than computed, so 0.01 is the double nearest 0.01 (clean labels).
            (lo..=hi)
                .map(|e| format!("1e{e}").parse().unwrap_or(1.0))
                .collect()
        } else {
            (0..=5).map(|i| f64::from(i) / 5.0 * self.hi).collect()
        }
    }
}

const W: f64 = 720.0;
const H: f64 = 420.0;
const L: f64 = 70.0;
const R: f64 = 20.0;
const T: f64 = 40.0;
const B: f64 = 50.0;

fn nice_max(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let mag = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|&c| c >= v)
        .unwrap_or(10.0 * mag)
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

impl Chart {
    /// The chart as an SVG document.
    pub fn render(&self) -> String {
        let pts = || self.series.iter().flat_map(|s| s.points.iter());
        let xs = pts().map(|p| p.0).chain(self.x_marker.iter().map(|m| m.0));
        let ys = pts().map(|p| p.1).chain(self.y_marker.iter().map(|m| m.0));
        let (xa, ya) = (Axis::new(self.x_log, xs), Axis::new(self.y_log, ys));
        let (pw, ph) = (W - L - R, H - T - B);
        let sx = |x: f64| L + xa.frac(x) * pw;
        let sy = |y: f64| T + ph - ya.frac(y) * ph;
        let mut o = String::new();
        let _ = writeln!(
            o,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(o, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
        let _ = writeln!(
            o,
            r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
            W / 2.0,
            esc(&self.title)
        );
        for v in ya.ticks() {
            let y = sy(v);
            let _ = writeln!(
                o,
                r##"<line x1="{L}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
                W - R,
                L - 6.0,
                y + 4.0,
                fmt_tick(v)
            );
        }
        for v in xa.ticks() {
            let x = sx(v);
            let _ = writeln!(
                o,
                r##"<line x1="{x:.1}" x2="{x:.1}" y1="{T}" y2="{}" stroke="#eee"/><text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"##,
                T + ph,
                T + ph + 16.0,
                fmt_tick(v)
            );
        }
        let _ = writeln!(
            o,
            r##"<rect x="{L}" y="{T}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##
        );
        let _ = writeln!(
            o,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            L + pw / 2.0,
            H - 10.0,
            esc(&self.x_label)
        );
        let _ = writeln!(
            o,
            r#"<text transform="translate(16 {}) rotate(-90)" text-anchor="middle">{}</text>"#,
            T + ph / 2.0,
            esc(&self.y_label)
        );
        if let Some((x, label)) = &self.x_marker {
            let _ = writeln!(
                o,
                r##"<line x1="{0:.1}" x2="{0:.1}" y1="{T}" y2="{1}" stroke="#555" stroke-dasharray="5 4"/><text x="{2:.1}" y="{3}">{4}</text>"##,
                sx(*x),
                T + ph,
                sx(*x) + 4.0,
                T + 14.0,
                esc(label)
            );
        }
        if let Some((y, label)) = &self.y_marker {
            let _ = writeln!(
                o,
                r##"<line x1="{L}" x2="{0}" y1="{1:.1}" y2="{1:.1}" stroke="#555" stroke-dasharray="5 4"/><text x="{2}" y="{3:.1}">{4}</text>"##,
                W - R,
                sy(*y),
                L + 6.0,
                sy(*y) - 4.0,
                esc(label)
            );
        }
        for (i, s) in self.series.iter().enumerate() {
            let c = PALETTE[i % PALETTE.len()];
            if s.dots {
                for &(x, y) in &s.points {
                    let _ = writeln!(
                        o,
                        r#"<circle cx="{:.1}" cy="{:.1}" r="2" fill="{c}" fill-opacity="0.6"/>"#,
                        sx(x),
                        sy(y)
                    );
                }
            } else if !s.points.is_empty() {
                let path: Vec<String> = s
                    .points
                    .iter()
                    .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
                    .collect();
                let _ = writeln!(
                    o,
                    r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#,
                    path.join(" ")
                );
            }
            let ly = T + 16.0 + 16.0 * i as f64;
            let _ = writeln!(
                o,
                r#"<rect x="{}" y="{}" width="12" height="12" fill="{c}"/><text x="{}" y="{}">{}</text>"#,
                W - R - 150.0,
                ly - 10.0,
                W - R - 132.0,
                ly,
                esc(&s.name)
            );
        }
        o.push_str("</svg>\n");
        o
    }
}

fn fmt_tick(v: f64) -> String {
    if v >= 100.0 || v == v.round() {
        format!("{v:.0}")
    } else if v >= 0.01 {
        format!("{v:.2}")
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_well_formed_document() {
        let c = Chart {
            title: "a < b".into(),
            series: vec![Series {
                name: "s".into(),
                points: vec![(0.0, 0.0), (1.0, 3.0)],
                dots: false,
            }],
            y_marker: Some((2.0, "SLO".into())),
            ..Default::default()
        };
        let svg = c.render();
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("a &lt; b") && svg.contains("<polyline"));
        assert_eq!(nice_max(3.2), 5.0);
    }

    #[test]
    fn a_log_axis_spans_whole_decades_and_places_values_by_their_logarithm() {
        let a = Axis::new(true, [0.04, 0.3, 12.0, 0.0].into_iter());
        assert_eq!((a.lo, a.hi), (-2.0, 2.0));
        assert_eq!(a.ticks(), vec![0.01, 0.1, 1.0, 10.0, 100.0]);
        assert!((a.frac(0.1) - 0.25).abs() < 1e-9 && (a.frac(10.0) - 0.75).abs() < 1e-9);
        assert_eq!(
            a.frac(0.0),
            0.0,
            "a zero sits at the bottom, not at minus infinity"
        );
        let c = Chart {
            x_log: true,
            series: vec![Series {
                name: "small".into(),
                points: vec![(0.04, 0.5), (0.3, 1.0)],
                dots: false,
            }],
            ..Default::default()
        };
        let svg = c.render();
        assert!(
            svg.contains(">0.01<") && svg.contains(">1<"),
            "decade ticks"
        );
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }
}

//! A minimal SVG line chart: bus bandwidth against message size (log2 x axis).

use super::report::human_size;
use std::fmt::Write;

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 160.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
const COLOURS: [&str; 4] = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd"];

/// An SVG document plotting each named series of `(size in bytes, GB/s)` points.
pub(crate) fn busbw_svg(title: &str, series: &[(String, Vec<(f64, f64)>)]) -> String {
    let points = series.iter().flat_map(|(_, p)| p.iter());
    let (mut x_min, mut x_max, mut y_max) = (f64::MAX, f64::MIN, 0.0f64);
    for &(x, y) in points {
        x_min = x_min.min(x.log2());
        x_max = x_max.max(x.log2());
        if y.is_finite() {
            y_max = y_max.max(y);
        }
    }
    if x_min >= x_max {
        x_max = x_min + 1.0;
    }
    let y_max = if y_max > 0.0 { y_max * 1.1 } else { 1.0 };
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x_of = |size: f64| LEFT + (size.log2() - x_min) / (x_max - x_min) * plot_w;
    let y_of = |gbps: f64| TOP + plot_h - gbps / y_max * plot_h;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="24" font-size="15">{title}</text>"#
    );
    let _ = writeln!(
        svg,
        r#"<path d="M{LEFT},{TOP} V{} H{}" fill="none" stroke="black"/>"#,
        TOP + plot_h,
        LEFT + plot_w
    );
    for tick in 0..=4 {
        let v = y_max * f64::from(tick) / 4.0;
        let y = y_of(v);
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{v:.2}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            y + 4.0
        );
    }
    let mut exp = x_min.ceil() as i32;
    while f64::from(exp) <= x_max {
        let x = x_of(2f64.powi(exp));
        let _ = writeln!(
            svg,
            r#"<text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"#,
            TOP + plot_h + 18.0,
            human_size(1u64 << exp)
        );
        exp += 3;
    }
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">message size</text><text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">busbw (GB/s)</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 10.0,
        TOP + plot_h / 2.0,
        TOP + plot_h / 2.0
    );
    for (i, (name, points)) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let path: Vec<String> = points
            .iter()
            .filter(|(_, y)| y.is_finite())
            .map(|&(x, y)| format!("{:.1},{:.1}", x_of(x), y_of(y)))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"/>"#,
            path.join(" ")
        );
        let ly = TOP + 20.0 * i as f64 + 10.0;
        let lx = LEFT + plot_w + 14.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{lx}" x2="{}" y1="{ly}" y2="{ly}" stroke="{colour}" stroke-width="2"/><text x="{}" y="{}">{name}</text>"#,
            lx + 20.0,
            lx + 26.0,
            ly + 4.0
        );
    }
    svg.push_str("</svg>\n");
    svg
}

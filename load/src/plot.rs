//! `--plot`: throughput by thread count, one panel per throughput metric, one line per system.

use crate::report::Sample;
use plotters::prelude::*;
use std::path::Path;

/// The throughput metrics worth a panel (workload prefix, metric).
fn is_throughput(sample: &Sample) -> bool {
    sample.system != "probe" && sample.metric.ends_with("_per_s") && sample.unit != "ms/s"
}

fn color(index: usize) -> RGBColor {
    const COLORS: [RGBColor; 6] = [
        RGBColor(31, 119, 180),
        RGBColor(214, 39, 40),
        RGBColor(44, 160, 44),
        RGBColor(255, 127, 14),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
    ];
    COLORS[index % COLORS.len()]
}

/// Draws the chart into `path` (SVG).
pub(crate) fn draw(samples: &[Sample], path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let mut panels: Vec<(String, &'static str)> = Vec::new();
    let mut systems: Vec<&'static str> = Vec::new();
    for sample in samples.iter().filter(|s| is_throughput(s)) {
        let panel = (sample.workload.clone(), sample.metric);
        if !panels.contains(&panel) {
            panels.push(panel);
        }
        if !systems.contains(&sample.system) {
            systems.push(sample.system);
        }
    }
    if panels.is_empty() {
        return Err("no throughput metric was measured".into());
    }
    systems.sort_by_key(|s| crate::report::system_rank(s));
    let columns = panels.len().min(3);
    let rows = panels.len().div_ceil(columns);
    let size = (420 * columns as u32, 320 * rows as u32 + 40);
    let root = SVGBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        "shardwheel-load: throughput by submitting threads (M ops/s)",
        ("sans-serif", 22),
    )?;
    let areas = root.split_evenly((rows, columns));
    let max_threads = samples.iter().map(|s| s.threads).max().unwrap_or(1) as f64;
    for ((workload, metric), area) in panels.iter().zip(areas.iter()) {
        let series: Vec<(&'static str, Vec<(f64, f64)>)> = systems
            .iter()
            .map(|system| {
                let mut points: Vec<(f64, f64)> = samples
                    .iter()
                    .filter(|s| {
                        s.system == *system && s.workload == *workload && s.metric == *metric
                    })
                    .map(|s| (s.threads as f64, s.value / 1e6))
                    .collect();
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                (*system, points)
            })
            .filter(|(_, points)| !points.is_empty())
            .collect();
        let top = series
            .iter()
            .flat_map(|(_, points)| points.iter().map(|p| p.1))
            .fold(0.0f64, f64::max)
            .max(1e-6)
            * 1.6;
        let mut chart = ChartBuilder::on(area)
            .caption(format!("{workload}: {metric}"), ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(32)
            .y_label_area_size(48)
            .build_cartesian_2d(0.5f64..max_threads + 0.5, 0f64..top)?;
        chart
            .configure_mesh()
            .x_desc("threads")
            .y_desc("M/s")
            .x_labels(max_threads as usize + 2)
            .x_label_formatter(&|x| {
                if (x - x.round()).abs() < 1e-6 {
                    format!("{x:.0}")
                } else {
                    String::new()
                }
            })
            .draw()?;
        for (system, points) in &series {
            let index = systems.iter().position(|s| s == system).unwrap_or(0);
            let style = color(index);
            chart
                .draw_series(LineSeries::new(points.clone(), style.stroke_width(2)))?
                .label(*system)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], style.stroke_width(2))
                });
            chart.draw_series(points.iter().map(|p| Circle::new(*p, 4, style.filled())))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

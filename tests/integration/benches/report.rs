//! The benchmarks' results: a side-by-side table on stdout, JSON under the results folder
//! (`BENCH_RESULTS`, else bench-results/ at the repository root), and PNG plots of RSS over time.
use std::path::PathBuf;

/// One figure of both builds.
pub struct Row<'a> {
    pub what: &'a str,
    pub ours: f64,
    pub upstream: f64,
}

pub fn row(what: &str, ours: f64, upstream: f64) -> Row<'_> {
    Row { what, ours, upstream }
}

/// Prints `rows` as a table with the ratio ours/upstream, and returns them as JSON.
pub fn table(title: &str, rows: &[Row<'_>]) -> serde_json::Value {
    println!("\n{title}");
    println!("  {:<44} {:>10} {:>10} {:>9}", "", "ours", "upstream", "ours/up");
    let mut json = serde_json::Map::new();
    for Row { what, ours, upstream } in rows {
        let ratio = if *upstream == 0.0 { f64::NAN } else { ours / upstream };
        println!("  {what:<44} {ours:>10.2} {upstream:>10.2} {:>8.1}%", 100.0 * ratio);
        let ratio = if ratio.is_finite() { serde_json::json!(ratio) } else { serde_json::Value::Null };
        json.insert((*what).to_owned(), serde_json::json!({"ours": ours, "upstream": upstream, "ratio": ratio}));
    }
    serde_json::Value::Object(json)
}

pub fn results_dir() -> PathBuf {
    let dir = std::env::var_os("BENCH_RESULTS")
        .filter(|d| !d.is_empty())
        .map_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench-results"), PathBuf::from);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes `<results>/<name>.json` with the machine the figures came from.
pub fn write_json(name: &str, mut value: serde_json::Value) {
    value["machine"] = machine();
    let path = results_dir().join(format!("{name}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(&value).unwrap() + "\n").unwrap();
    println!("  results: {}", path.display());
}

/// The commit measured and the day, so that sizes from different runs can be told apart.
pub fn provenance() -> serde_json::Value {
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    let day = std::process::Command::new("date")
        .args(["-u", "+%F"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    serde_json::json!({"commit": commit, "day": day})
}

/// CPU model, cores and memory, from /proc.
fn machine() -> serde_json::Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model =
        cpuinfo.lines().find_map(|l| l.strip_prefix("model name")).map(|l| l.trim_start_matches([' ', '\t', ':']));
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    serde_json::json!({
        "cpu": model.unwrap_or("unknown"),
        "cores": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "memory_gib": (mem_kib as f64 / 1024.0 / 1024.0 * 10.0).round() / 10.0,
    })
}

/// Where a TrueType font for the plot's text is found (Debian's fonts-dejavu-core).
const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// Plots each named series of (seconds, MiB) into `<results>/<file>`; says why on stdout when it
/// cannot (no font to write the labels with).
pub fn plot_rss(file: &str, title: &str, series: &[(&str, &[(f64, f64)])]) {
    plot_rss_against(file, title, "seconds since start", series);
}

/// As [`plot_rss`], each series of (x, MiB) with x as `x_label` says (objects, for one).
pub fn plot_rss_against(file: &str, title: &str, x_label: &str, series: &[(&str, &[(f64, f64)])]) {
    let path = results_dir().join(file);
    match draw(&path, title, x_label, series) {
        Ok(()) => println!("  plot: {}", path.display()),
        Err(e) => println!("  plot: not drawn ({e})"),
    }
}

fn draw(path: &std::path::Path, title: &str, x_label: &str, series: &[(&str, &[(f64, f64)])]) -> Result<(), String> {
    use plotters::prelude::*;
    static FONT_REGISTERED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    FONT_REGISTERED
        .get_or_init(|| {
            let bytes = std::fs::read(FONT).map_err(|e| format!("{FONT}: {e}; install fonts-dejavu-core"))?;
            // The font lives as long as the process: plotters wants it 'static.
            plotters::style::register_font("sans-serif", FontStyle::Normal, Box::leak(bytes.into_boxed_slice()))
                .map_err(|_| format!("{FONT} is not a font plotters can read"))
        })
        .clone()?;
    let max_t = series.iter().flat_map(|(_, s)| s.iter().map(|p| p.0)).fold(1.0, f64::max);
    let max_y = series.iter().flat_map(|(_, s)| s.iter().map(|p| p.1)).fold(1.0, f64::max) * 1.1;
    let root = BitMapBackend::new(path, (960, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..max_t, 0f64..max_y)
        .map_err(|e| e.to_string())?;
    chart.configure_mesh().x_desc(x_label).y_desc("RSS (MiB)").draw().map_err(|e| e.to_string())?;
    for (i, (name, points)) in series.iter().enumerate() {
        // Colour-blind-safe (Okabe and Ito); the first series is ours.
        const COLORS: [RGBColor; 4] =
            [RGBColor(0, 114, 178), RGBColor(213, 94, 0), RGBColor(0, 158, 115), RGBColor(204, 121, 167)];
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

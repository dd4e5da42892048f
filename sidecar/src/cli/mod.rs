//! `csi-addons`: call a driver's CSI-Addons endpoint directly, as upstream's CLI does: same
//! flags (Go single-dash forms too), same operation names. PVs and Secrets are read from the
//! cluster (`KUBECONFIG` or the in-cluster config) only by the operations that need them.
mod flags;
mod ops;

pub use self::flags::{Cli, Operation, Output, parse};

/// Runs the operation and prints its result.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let result = ops::run(&cli).await?;
    match cli.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&result)?),
        Output::Text => print_text(&result, ""),
    }
    Ok(())
}

fn print_text(value: &serde_json::Value, indent: &str) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                if v.is_object() || v.is_array() {
                    println!("{indent}{k}:");
                    print_text(v, &format!("{indent}  "));
                } else {
                    println!("{indent}{k}: {}", v.as_str().map_or_else(|| v.to_string(), str::to_owned));
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| match v {
            serde_json::Value::String(s) => println!("{indent}- {s}"),
            other => print_text(other, indent),
        }),
        other => println!("{indent}{other}"),
    }
}

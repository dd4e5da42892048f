//! `csi-addons-demo`: starts the stack, tells the story, prints a summary; then keeps the cluster
//! running until SIGTERM or Ctrl-C (`make demo-down`), or stops at once with DEMO_KEEP=0.
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use demo::stack::{Options, Stack};
use demo::story::{self, Outcome};

/// hack/demo.sh stops following the output at these lines.
const READY: &str = "demo: ready";
const FAILED: &str = "demo: failed";

fn main() -> std::process::ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("{FAILED}: cannot start a runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            println!("{FAILED}: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> anyhow::Result<()> {
    let started = Instant::now();
    let dir = std::env::var_os("DEMO_DIR").map_or_else(|| PathBuf::from("/tmp/csi-addons-demo"), PathBuf::from);
    let keep = std::env::var("DEMO_KEEP").map_or(true, |v| v != "0");
    let csi_provisioner = std::env::var_os("CSI_PROVISIONER")
        .map(PathBuf::from)
        .context("CSI_PROVISIONER is not set (`make demo` sets it from hack/csi-provisioner.sh)")?;
    let bin_dir = std::env::current_exe()
        .context("finding this binary")?
        .parent()
        .map(PathBuf::from)
        .context("finding the directory of the workspace's binaries")?;
    let options = Options::demo(dir.clone(), bin_dir, csi_provisioner);
    let say = |line: &str| println!("[{:>5.1}s] {line}", started.elapsed().as_secs_f64());

    println!("csi-addons-rs demo: everything runs as local processes; logs under {}/logs", dir.display());
    let stack = Stack::start(&options, &say).await.context("starting the stack")?;
    let mut report = |o: &Outcome| say(&format!("✔ {} — {}: {}", o.step, o.object, o.effect));
    let outcomes = match story::run(&stack, &mut report).await {
        Ok(outcomes) => outcomes,
        Err(failure) => {
            println!("\n✘ {failure}");
            println!("(all logs: {})", stack.logs_dir().display());
            anyhow::bail!("step {:?} failed", failure.step);
        }
    };
    summary(&outcomes);
    println!("\nthe story took {:.0} s", started.elapsed().as_secs_f64());
    if !keep {
        println!("DEMO_KEEP=0: stopping everything");
        return Ok(());
    }
    let kubectl = std::env::var_os("KUBEBUILDER_ASSETS")
        .map_or_else(|| PathBuf::from("kubectl"), |assets| PathBuf::from(assets).join("kubectl"));
    println!("\nThe cluster keeps running. Look around with:");
    println!(
        "  KUBECONFIG={} {} get csiaddonsnodes,reclaimspacejobs,volumereplications -A",
        stack.control_plane.kubeconfig_path().display(),
        kubectl.display()
    );
    println!("Stop it with `make demo-down`.");
    println!("{READY}");
    shutdown_signal().await;
    println!("demo: stopping");
    Ok(())
}

fn summary(outcomes: &[Outcome]) {
    println!("\n{:<30} {:<12} Effect", "Step", "Result");
    for outcome in outcomes {
        println!("{:<30} {:<12} {}", outcome.step, "Succeeded", outcome.effect);
    }
    println!("{} of {} steps Succeeded", outcomes.len(), story::STEPS.len());
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut terminate) => {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

//! The demo's story as assertions, on the same stack as `make demo` (a control plane of its own:
//! the story's manager watches the whole cluster): every step succeeds and its measured effect is
//! what the operation should have done.
//!
//! The interop pairs (`interop`) run the same story's steps with one half upstream's build.
use demo::stack::{Options, Stack};
use demo::story::{self, MIB, Outcome};

use crate::harness::support::{test_peer, workspace_binary};

pub(super) fn options(dir: &tempfile::TempDir) -> Options {
    let manager = workspace_binary("csi-addons-manager");
    Options::demo(
        dir.path().join("demo"),
        manager.parent().unwrap().to_path_buf(),
        test_peer("CSI_PROVISIONER", "csi-provisioner.sh"),
    )
}

/// Starts the stack in `dir` and runs `steps`; a failed step panics with its step, object and log
/// tail, and leaves `dir` (every component's log) behind.
pub(super) async fn run(dir: tempfile::TempDir, options: &Options, steps: &[&str]) -> Vec<Outcome> {
    run_on(start(options).await, dir, steps).await
}

/// Starts the stack `options` describe.
pub(super) async fn start(options: &Options) -> Stack {
    Stack::start(options, &|line| eprintln!("e2e: {line}")).await.unwrap()
}

/// Runs `steps` on `stack`, started in `dir`, as [`run`] does.
pub(super) async fn run_on(stack: Stack, dir: tempfile::TempDir, steps: &[&str]) -> Vec<Outcome> {
    let outcomes = match story::run_steps(&stack, steps, &mut |o| eprintln!("e2e: {} — {}", o.step, o.effect)).await {
        Ok(outcomes) => outcomes,
        Err(failure) => {
            drop(stack);
            panic!("{failure}\nall logs: {}", dir.keep().join("demo/logs").display())
        }
    };
    assert_eq!(outcomes.len(), steps.len(), "every step ran");
    outcomes
}

fn fact(outcomes: &[Outcome], step: &str, name: &str) -> i64 {
    let outcome = outcomes.iter().find(|o| o.step == step).unwrap_or_else(|| panic!("no step {step}"));
    *outcome.facts.get(name).unwrap_or_else(|| panic!("{step} measured no {name}: {outcome:?}"))
}

/// What reclaiming, fencing and group replication measurably did.
pub(super) fn check_protection_effects(outcomes: &[Outcome]) {
    assert_eq!(fact(outcomes, "Provision", "bound"), 5);
    assert_eq!(fact(outcomes, "NetworkFence", "refused"), 1);
    assert_eq!(fact(outcomes, "VolumeGroupReplication", "members"), 2);
    if reference_driver::mounts::loop_unavailable_reason().is_none() {
        // Loop-backed volumes: the freed blocks went back to the host. 128 MiB and 64 MiB were
        // written and deleted; ext4's own metadata stays allocated.
        let freed = |step: &str| fact(outcomes, step, "before") - fact(outcomes, step, "after");
        let attached = freed("ReclaimSpaceJob (attached)");
        assert!(attached >= 96 * MIB, "the attached reclaim gave back only {attached} bytes");
        let unattached = freed("ReclaimSpaceJob (unattached)");
        assert!(unattached >= 48 * MIB, "the unattached reclaim gave back only {unattached} bytes");
    }
}

#[tokio::test]
async fn the_demo_story_runs_every_operation_with_its_effect() {
    let dir = tempfile::tempdir().unwrap();
    let steps = story::STEPS.map(|(step, _, _)| step);
    let options = options(&dir);
    let outcomes = run(dir, &options, &steps).await;
    check_protection_effects(&outcomes);
    assert_eq!(fact(&outcomes, "StorageClass schedule", "cron_jobs"), 5);
    assert_eq!(fact(&outcomes, "EncryptionKeyRotationJob", "rotated"), 1);
}

//! The demo's story as assertions, on the same stack as `make demo` (a control plane of its own:
//! the story's manager watches the whole cluster): every step succeeds and its measured effect is
//! what the operation should have done.
use demo::stack::{Options, Stack};
use demo::story::{self, MIB};

use crate::support::{test_peer, workspace_binary};

#[tokio::test]
async fn the_demo_story_runs_every_operation_with_its_effect() {
    let dir = tempfile::tempdir().unwrap();
    let manager = workspace_binary("csi-addons-manager");
    let options = Options {
        dir: dir.path().join("demo"),
        bin_dir: manager.parent().unwrap().to_path_buf(),
        csi_provisioner: test_peer("CSI_PROVISIONER", "csi-provisioner.sh"),
    };
    let stack = Stack::start(&options, &|line| eprintln!("e2e: {line}")).await.unwrap();
    let outcomes = match story::run(&stack, &mut |o| eprintln!("e2e: {} — {}", o.step, o.effect)).await {
        Ok(outcomes) => outcomes,
        Err(failure) => panic!("{failure}"),
    };
    assert_eq!(outcomes.len(), story::STEPS.len(), "every step ran");
    let fact = |step: &str, name: &str| -> i64 {
        let outcome = outcomes.iter().find(|o| o.step == step).unwrap_or_else(|| panic!("no step {step}"));
        *outcome.facts.get(name).unwrap_or_else(|| panic!("{step} measured no {name}: {outcome:?}"))
    };
    assert_eq!(fact("Provision", "bound"), 5);
    assert_eq!(fact("StorageClass schedule", "cron_jobs"), 5);
    assert_eq!(fact("EncryptionKeyRotationJob", "rotated"), 1);
    assert_eq!(fact("NetworkFence", "refused"), 1);
    assert_eq!(fact("VolumeGroupReplication", "members"), 2);
    if reference_driver::mounts::loop_unavailable_reason().is_none() {
        // Loop-backed volumes: the freed blocks went back to the host. 128 MiB and 64 MiB were
        // written and deleted; ext4's own metadata stays allocated.
        let attached = fact("ReclaimSpaceJob (attached)", "before") - fact("ReclaimSpaceJob (attached)", "after");
        assert!(attached >= 96 * MIB, "the attached reclaim gave back only {attached} bytes");
        let unattached = fact("ReclaimSpaceJob (unattached)", "before") - fact("ReclaimSpaceJob (unattached)", "after");
        assert!(unattached >= 48 * MIB, "the unattached reclaim gave back only {unattached} bytes");
    }
}

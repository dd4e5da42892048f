//! Hostile custom resources on the real API server, with our manager running as a process (the cases
//! are testenv's, shared with the cluster suite). Each must be rejected at admission with a message,
//! or be admitted and end Failed with a message a user can act on; the manager must keep running and
//! stay healthy throughout. Prints what happened to each.

use crate::harness::manager::Stage;
use crate::harness::sidecar::http_get;

#[tokio::test]
async fn hostile_crs_are_rejected_or_fail_with_a_message_and_the_manager_stays_up() {
    let mut stage = Stage::new("hostile-crs", &["service.CONTROLLER_SERVICE"]).await;
    let (client, namespace) = (stage.client.clone(), stage.namespace.clone());
    let manager = &mut stage.manager;
    let outcome = testenv::hostile::create_all(&client, &namespace, async || match manager.child.try_wait() {
        Ok(None) => Ok(()),
        _ => Err(format!("the manager exited:\n{}", manager.log())),
    })
    .await;
    for line in &outcome.report {
        println!("{line}");
    }
    let (code, _) = http_get(stage.manager.health, "/healthz").await.expect("the manager answers /healthz");
    assert_eq!(code, 200, "{}", stage.manager.log());
    assert!(stage.manager.child.try_wait().unwrap().is_none(), "the manager exited:\n{}", stage.manager.log());
    assert!(!stage.manager.log().contains("panicked"), "{}", stage.manager.log());
}

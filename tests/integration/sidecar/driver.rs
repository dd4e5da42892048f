//! The sidecar's driver connection against the reference driver as a real process: ready with
//! identity and capabilities, lost when the driver dies, ready again after it restarts.
use std::time::Duration;

use sidecar::driver::{DriverConnection, DriverState, Probing};

use crate::harness::driver_process::start_driver;

#[tokio::test]
async fn the_connection_follows_the_driver_through_a_restart() {
    let mut driver = start_driver(&[]);
    let probing = Probing {
        interval: Duration::from_millis(100),
        timeout: Duration::from_secs(5),
        backoff: (Duration::from_millis(50), Duration::from_millis(400)),
    };
    let connection = DriverConnection::start(&driver.addons_endpoint, probing).unwrap();
    let info = connection.ready(Duration::from_secs(20)).await.expect("the driver never became ready");
    assert_eq!(info.name, "reference.csi-addons-rs.io");
    assert!(info.capabilities.iter().any(|c| c == "reclaim_space.OFFLINE"), "{:?}", info.capabilities);

    driver.kill();
    let mut state = connection.state();
    let lost = tokio::time::timeout(Duration::from_secs(20), state.wait_for(|s| matches!(s, DriverState::Lost { .. })))
        .await
        .map(|r| r.map(|s| s.clone()));
    assert!(
        matches!(lost, Ok(Ok(DriverState::Lost { .. }))),
        "the loss of the driver was not noticed: {:?}",
        *connection.state().borrow()
    );

    driver.kill_and_restart();
    let again = connection
        .ready(Duration::from_secs(20))
        .await
        .expect("the connection did not recover after the driver restarted");
    assert_eq!(again, info);
    // Calls go through the same channel again.
    let mut client = api::proto::identity::identity_client::IdentityClient::new(connection.channel());
    assert!(client.probe(api::proto::identity::ProbeRequest {}).await.is_ok());
}

//! Leader election on the real API server: a standby takes a Lease its holder released at once,
//! not at the end of the holder's term (a manager Pod evicted during a drain releases its Lease;
//! its standby must lead before the Deployment's replacement Pod even starts).
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cluster_client::election::{Lease, Timings, compete};
use testenv::poll;
use tokio::sync::watch;

/// One competitor: what it was last told, and its stop signal.
struct Competitor {
    leading: Arc<Mutex<bool>>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

fn competitor(client: &kube::Client, namespace: &str, identity: &str, watch_releases: bool) -> Competitor {
    let lease = Lease {
        namespace: namespace.to_owned(),
        name: "election".into(),
        identity: identity.to_owned(),
        watch_releases,
    };
    // A term far longer than the test: only a released Lease can change hands within it.
    let timings = Timings {
        lease_duration: Duration::from_secs(600),
        renew_deadline: Duration::from_secs(590),
        retry_period: Duration::from_secs(1),
    };
    let leading = Arc::new(Mutex::new(false));
    let told = leading.clone();
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(compete(client.clone(), lease, timings, move |now| *told.lock().unwrap() = now, stopped));
    Competitor { leading, stop, task }
}

async fn leads(competitor: &Competitor) -> bool {
    poll::until(poll::MINUTE, async || (*competitor.leading.lock().unwrap()).then_some(())).await.is_some()
}

/// Two competitors for one Lease: the first leads, the second stands by, and takes over once the
/// first stops and releases the Lease.
async fn standby_takes_over_a_released_lease(watch_releases: bool) {
    let plane = testenv::shared();
    let client = plane.client().await.unwrap();
    let namespace = plane.namespace(&client, "election").await.unwrap();

    let first = competitor(&client, &namespace, "first", watch_releases);
    assert!(leads(&first).await, "the only competitor leads");
    let second = competitor(&client, &namespace, "second", watch_releases);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!*second.leading.lock().unwrap(), "the Lease is held: the second stands by");

    first.stop.send(true).unwrap();
    first.task.await.unwrap();
    assert!(!*first.leading.lock().unwrap(), "the first was told it no longer leads before it released");
    assert!(leads(&second).await, "the standby takes the released Lease (its term has 10 minutes left)");
    second.stop.send(true).unwrap();
    second.task.await.unwrap();
}

#[tokio::test]
async fn a_standby_watching_the_lease_takes_it_once_released_not_at_the_end_of_the_term() {
    standby_takes_over_a_released_lease(true).await;
}

#[tokio::test]
async fn a_standby_reading_the_lease_takes_it_once_released_not_at_the_end_of_the_term() {
    standby_takes_over_a_released_lease(false).await;
}

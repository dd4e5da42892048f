//! The Events a user watches for on the ReferenceCSIDriver.
use api::driver::{ManagementState, ReferenceCSIDriver};
use kube::Resource;
use kube::runtime::events::{Event, EventType};

use super::context::Context;
use crate::decide::Rollout;

/// Events for the transitions a user watches for: a rollout that failed (Warning), and one that
/// recovered (Normal). Sent when the Degraded condition turns.
pub(super) async fn announce(
    ctx: &Context,
    driver: &ReferenceCSIDriver,
    state: ManagementState,
    rollout: &Rollout,
    before: Option<bool>,
) {
    let event = match (state, rollout) {
        (ManagementState::Managed, Rollout::Failed(why)) if before != Some(true) => Event {
            type_: EventType::Warning,
            reason: "RolloutFailed".into(),
            note: Some(why.clone()),
            action: "Rollout".into(),
            secondary: None,
        },
        (ManagementState::Managed, Rollout::Done) if before == Some(true) => Event {
            type_: EventType::Normal,
            reason: "RolledOut".into(),
            note: Some("the driver's Pods are ready".into()),
            action: "Rollout".into(),
            secondary: None,
        },
        _ => return,
    };
    send(ctx, driver, &event).await;
}

pub(super) async fn publish(ctx: &Context, driver: &ReferenceCSIDriver, type_: EventType, reason: &str, note: String) {
    let event = Event { type_, reason: reason.into(), note: Some(note), action: "Sync".into(), secondary: None };
    send(ctx, driver, &event).await;
}

async fn send(ctx: &Context, driver: &ReferenceCSIDriver, event: &Event) {
    if let Err(e) = ctx.recorder.publish(event, &driver.object_ref(&())).await {
        tracing::warn!(error = %e, "sending an event");
    }
}

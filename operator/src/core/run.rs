//! How every controller runs: kube's `Controller` with at most `max-concurrent-reconciles` passes
//! at once (upstream runs one worker for VolumeGroupReplications, their contents and
//! NetworkFenceClasses) [differs: all-controllers-workers], each pass recorded in
//! controller-runtime's series, and a failed pass retried (or not) as its error's category says.
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use futures::{FutureExt, StreamExt};
use kube::Resource;
use kube::runtime::Controller;
use serde::de::DeserializeOwned;

use super::Core;
use super::action::Action;
use super::error::Categorized;
use super::queue::Front;

/// What a controller's context gives the machinery: the shared core. Each controller's own state
/// sits beside it in the context type the controller chooses.
pub trait ControllerContext: Send + Sync + 'static {
    fn core(&self) -> &Core;
}

impl ControllerContext for Core {
    fn core(&self) -> &Core {
        self
    }
}

/// A controller's context: the shared core (which it derefs to), and what that controller alone
/// keeps (`state`), dropped with the controller.
pub struct Context<S> {
    core: Arc<Core>,
    pub state: S,
}

impl<S> Context<S> {
    pub fn new(core: Arc<Core>, state: S) -> Self {
        Context { core, state }
    }
}

impl<S> std::ops::Deref for Context<S> {
    type Target = Core;
    fn deref(&self) -> &Core {
        &self.core
    }
}

impl<S: Send + Sync + 'static> ControllerContext for Context<S> {
    fn core(&self) -> &Core {
        &self.core
    }
}

/// The most passes kube may be handed at once, for `workers` passes at a time: enough that a
/// worker freed finds the next pass waiting; the rest wait in the compact queue (`core::queue`).
fn handed_limit(workers: usize) -> usize {
    workers.saturating_mul(2).max(1)
}

/// Runs `controller` (from `Triggers::controller`, its other watches attached) until `stop`: at
/// most `max-concurrent-reconciles` passes at once, by kube's own limit (a change of the setting
/// restarts the reconcilers), each pass recorded in controller-runtime's series under `name`, and
/// each pass's end told to `front`.
pub async fn run_controller<K, C, E, F, Fut>(
    (controller, front): (Controller<K>, Front<K>),
    ctx: Arc<C>,
    name: &'static str,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
    reconcile: F,
) where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    C: ControllerContext,
    E: Categorized,
    F: Fn(Arc<K>, Arc<C>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
{
    let core = ctx.core();
    let workers = core.settings().max_concurrent_reconciles;
    front.configure(handed_limit(workers), core.metrics.workqueue_depth.with_label_values(&[name, name]));
    let config = kube::runtime::Config::default().concurrency(u16::try_from(workers).unwrap_or(u16::MAX).max(1));
    // kube is always told to wait for a change: a later pass waits in the queue (`Front::later`).
    let (after_pass, after_failure) = (front.clone(), front.clone());
    controller
        .with_config(config)
        .graceful_shutdown_on(stop)
        .run(
            // No async block around the pass: one would keep a second copy of its state (a
            // moved-from capture keeps its room), and a hundred of them run at once.
            move |object, ctx: Arc<C>| {
                let (front, asked) = (after_pass.clone(), Arc::clone(&object));
                record_pass(Arc::clone(&ctx), name, reconcile(object, ctx))
                    .map(move |result| result.map(|action| front.asked(&asked, action)))
            },
            move |object, error, ctx| {
                let action = error_policy(Arc::clone(&object), error, ctx, name);
                after_failure.asked(&object, action)
            },
            ctx,
        )
        .for_each(move |result| {
            front.passed(&result);
            futures::future::ready(())
        })
        .await;
}

/// After a failed pass: counted by category, told on the object as a Warning event whose reason
/// is the category's (unless the category gets none, or the controller told it already), and
/// retried as the category says.
pub fn error_policy<K, C, E>(object: Arc<K>, error: &E, ctx: Arc<C>, name: &'static str) -> Action
where
    K: Resource<DynamicType = ()> + Send + Sync + 'static,
    C: ControllerContext,
    E: Categorized,
{
    let category = error.category();
    ctx.core().metrics.reconcile_error_categories.with_label_values(&[name, category.label()]).inc();
    if let Some(reason) = category.reason().filter(|_| !error.announced()) {
        let message = with_causes(error);
        let event_ctx = Arc::clone(&ctx);
        tokio::spawn(async move {
            let core = event_ctx.core();
            core.event(object.as_ref(), true, reason, message).await;
        });
    }
    Action::requeue(category.retry())
}

/// An error with its causes, each after a colon.
pub fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        let next = inner.to_string();
        if !text.contains(&next) {
            text.push_str(&format!(": {next}"));
        }
        cause = inner.source();
    }
    text
}

/// Runs one reconcile pass of controller `name`, recording controller-runtime's series. How many
/// run at once is kube's own limit (`run_controller`).
///
/// A combinator rather than an async fn: an async fn would hold the pass twice (its argument and
/// the future it awaits each keep their room), some 2.5 KB more for each of a hundred passes.
pub fn record_pass<C, F, E>(ctx: Arc<C>, name: &'static str, pass: F) -> impl Future<Output = Result<Action, E>>
where
    C: ControllerContext,
    E: Categorized,
    F: Future<Output = Result<Action, E>>,
{
    let active = ctx.core().metrics.active_workers.with_label_values(&[name]);
    active.inc();
    let started = Instant::now();
    pass.map(move |result| {
        active.dec();
        let metrics = &ctx.core().metrics;
        metrics.reconcile_time.with_label_values(&[name]).observe(started.elapsed().as_secs_f64());
        let label = match &result {
            Ok(action) if *action == Action::await_change() => "success",
            Ok(_) => "requeue_after",
            Err(_) => "error",
        };
        metrics.reconcile_total.with_label_values(&[name, label]).inc();
        if let Err(e) = &result {
            metrics.reconcile_errors.with_label_values(&[name]).inc();
            tracing::warn!(controller = name, category = e.category().label(), error = %with_causes(e), "reconcile failed");
        }
        result
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn causes_are_named_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("reading PV p")]
        struct Outer(#[source] std::io::Error);
        let error = Outer(std::io::Error::other("connection refused"));
        assert_eq!(super::with_causes(&error), "reading PV p: connection refused");
    }
}

//! What the driver set controller shares between reconciles.
use kube::runtime::events::{Recorder, Reporter};

use crate::assets::Placement;
use crate::names::FIELD_MANAGER;

/// What the controller shares between reconciles.
pub struct Context {
    pub client: kube::Client,
    pub placement: Placement,
    pub recorder: Recorder,
    pub metrics: crate::metrics::Metrics,
}

impl Context {
    pub fn new(client: kube::Client, placement: Placement, metrics: crate::metrics::Metrics) -> Self {
        let reporter = Reporter { controller: FIELD_MANAGER.to_owned(), instance: std::env::var("POD_NAME").ok() };
        Context { recorder: Recorder::new(client.clone(), reporter), client, placement, metrics }
    }
}

//! The operator's metrics, served on `/metrics` in Prometheus's text format.
use prometheus::{Encoder, IntCounter, IntGauge, Registry, TextEncoder};

#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    pub reconciles: IntCounter,
    pub reconcile_errors: IntCounter,
    pub leader: IntGauge,
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let reconciles =
            IntCounter::new("reference_driver_operator_reconcile_total", "Passes over the ReferenceCSIDriver.")?;
        let reconcile_errors = IntCounter::new(
            "reference_driver_operator_reconcile_errors_total",
            "Passes over the ReferenceCSIDriver that failed and are retried.",
        )?;
        let leader = IntGauge::new("reference_driver_operator_leader", "1 while this operator process leads.")?;
        registry.register(Box::new(reconciles.clone()))?;
        registry.register(Box::new(reconcile_errors.clone()))?;
        registry.register(Box::new(leader.clone()))?;
        Ok(Metrics { registry, reconciles, reconcile_errors, leader })
    }

    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding into a Vec fails only on a write error, which a Vec never has.
        if TextEncoder::new().encode(&self.registry.gather(), &mut out).is_err() {
            return String::new();
        }
        String::from_utf8(out).unwrap_or_default()
    }
}

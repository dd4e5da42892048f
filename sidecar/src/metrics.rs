//! The sidecar's Prometheus metrics: RPCs served (by method and code, with latency), calls to the
//! driver, and the driver, registration and leadership states.
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry};

/// One registry per process; cloning shares it.
#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    pub rpcs: IntCounterVec,
    pub rpc_seconds: HistogramVec,
    pub driver_calls: IntCounterVec,
    pub driver_ready: IntGauge,
    pub registered: IntGauge,
    pub leader: IntGauge,
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new_custom(Some("csi_addons_sidecar".to_owned()), None)?;
        let rpcs = IntCounterVec::new(
            Opts::new("rpcs_total", "RPCs served to the controller, by method and gRPC code"),
            &["method", "code"],
        )?;
        let rpc_seconds = HistogramVec::new(
            HistogramOpts::new("rpc_duration_seconds", "Time to answer an RPC, by method")
                .buckets(vec![0.005, 0.025, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0]),
            &["method"],
        )?;
        let driver_calls = IntCounterVec::new(
            Opts::new("driver_calls_total", "Calls to the driver, by method and gRPC code"),
            &["method", "code"],
        )?;
        let driver_ready = IntGauge::new("driver_ready", "1 while the driver answers Probe as ready")?;
        let registered = IntGauge::new("registered", "1 while this sidecar's CSIAddonsNode exists")?;
        let leader = IntGauge::new("leader", "1 while this sidecar holds its driver's Lease")?;
        registry.register(Box::new(rpcs.clone()))?;
        registry.register(Box::new(rpc_seconds.clone()))?;
        registry.register(Box::new(driver_calls.clone()))?;
        registry.register(Box::new(driver_ready.clone()))?;
        registry.register(Box::new(registered.clone()))?;
        registry.register(Box::new(leader.clone()))?;
        Ok(Metrics { registry, rpcs, rpc_seconds, driver_calls, driver_ready, registered, leader })
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Encoding into a String only fails on invalid metric data, which the types rule out;
        // an error would leave a partial page, still better than none.
        let _ = prometheus::TextEncoder::new().encode_utf8(&self.registry.gather(), &mut out);
        out
    }

    /// Counts one call to the driver.
    pub fn driver_call<T>(&self, method: &str, result: &Result<T, tonic::Status>) {
        let code = match result {
            Ok(_) => "OK".to_owned(),
            Err(status) => format!("{:?}", status.code()),
        };
        self.driver_calls.with_label_values(&[method, &code]).inc();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn metrics_render_with_their_prefix() {
        let m = super::Metrics::new().unwrap();
        m.rpcs.with_label_values(&["/proto.ReclaimSpace/NodeReclaimSpace", "Ok"]).inc();
        m.driver_call::<()>("NodeReclaimSpace", &Err(tonic::Status::not_found("x")));
        let text = m.render();
        assert!(
            text.contains(
                "csi_addons_sidecar_rpcs_total{code=\"Ok\",method=\"/proto.ReclaimSpace/NodeReclaimSpace\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("csi_addons_sidecar_driver_calls_total{code=\"NotFound\",method=\"NodeReclaimSpace\"} 1"),
            "{text}"
        );
    }
}

//! The manager's metrics, in one explicit registry: controller-runtime's series under their names
//! (so dashboards made for upstream keep working) and ours for operations and sidecars.
//! [differs: manager-metrics]
use futures::FutureExt;
use prometheus::{HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry};

/// Every series the manager serves.
#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    pub leader: IntGaugeVec,
    pub reconcile_total: IntCounterVec,
    pub reconcile_errors: IntCounterVec,
    /// Ours: failed passes by controller and category (transient, permanent, configuration).
    pub reconcile_error_categories: IntCounterVec,
    pub reconcile_time: HistogramVec,
    pub max_concurrent: IntGaugeVec,
    pub active_workers: IntGaugeVec,
    pub workqueue_depth: IntGaugeVec,
    pub operations: IntCounterVec,
    pub operation_duration: HistogramVec,
    pub reclaimed_bytes: IntCounter,
    pub sidecar_connections: IntGaugeVec,
    pub sidecar_rpc: HistogramVec,
    /// client-go's: each attempt of each API request, by status code ("<error>" without an
    /// answer), method and API server.
    pub api_requests: IntCounterVec,
}

/// The `kind` of every operation `csi_addons_operations_total` counts.
pub const OPERATION_KINDS: [&str; 10] = [
    "ReclaimSpaceJob",
    "EncryptionKeyRotationJob",
    "NetworkFence/Fence",
    "NetworkFence/Unfence",
    "VolumeReplication/Promote",
    "VolumeReplication/Demote",
    "VolumeReplication/Resync",
    "VolumeGroup/CreateVolumeGroup",
    "VolumeGroup/ModifyVolumeGroupMembership",
    "VolumeGroup/DeleteVolumeGroup",
];
/// The `result` of a reconcile pass in `controller_runtime_reconcile_total`.
const PASS_RESULTS: [&str; 3] = ["success", "requeue_after", "error"];

/// Operation and RPC latencies: 5 ms to 10 min.
const SECONDS: [f64; 12] = [0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0, 60.0, 180.0, 600.0];

impl Metrics {
    /// Counts the API client's attempts in `rest_client_requests_total`, as client-go does.
    pub fn api_observer(&self) -> cluster_client::observe::Observer {
        let requests = self.api_requests.clone();
        std::sync::Arc::new(move |attempt| {
            let code = attempt.status.map_or_else(|| "<error>".to_owned(), |s| s.as_u16().to_string());
            requests.with_label_values(&[code.as_str(), attempt.method.as_str(), attempt.host]).inc();
        })
    }

    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let gauge = |name: &str, help: &str, labels: &[&str]| -> Result<IntGaugeVec, prometheus::Error> {
            let metric = IntGaugeVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(metric.clone()))?;
            Ok(metric)
        };
        let counter = |name: &str, help: &str, labels: &[&str]| -> Result<IntCounterVec, prometheus::Error> {
            let metric = IntCounterVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(metric.clone()))?;
            Ok(metric)
        };
        let histogram = |name: &str, help: &str, labels: &[&str], buckets: Vec<f64>| {
            let metric = HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)?;
            registry.register(Box::new(metric.clone()))?;
            Ok::<_, prometheus::Error>(metric)
        };
        let reclaimed_bytes = IntCounter::new(
            "csi_addons_reclaimed_bytes_total",
            "Bytes given back by ReclaimSpaceJobs (pre minus post usage, as the driver reported)",
        )?;
        registry.register(Box::new(reclaimed_bytes.clone()))?;
        Ok(Metrics {
            leader: gauge("leader_election_master_status", "1 while this manager holds the leader Lease", &["name"])?,
            reconcile_total: counter(
                "controller_runtime_reconcile_total",
                "Total number of reconciliations per controller",
                &["controller", "result"],
            )?,
            reconcile_errors: counter(
                "controller_runtime_reconcile_errors_total",
                "Total number of reconciliation errors per controller",
                &["controller"],
            )?,
            reconcile_error_categories: counter(
                "csi_addons_reconcile_errors_total",
                "Failed reconcile passes per controller, by category: transient (retried in seconds), permanent \
                 (retried when the object changes), configuration (the manager's own setup; retried each minute)",
                &["controller", "category"],
            )?,
            reconcile_time: histogram(
                "controller_runtime_reconcile_time_seconds",
                "Length of time per reconciliation per controller",
                &["controller"],
                prometheus::exponential_buckets(0.005, 2.0, 14)?,
            )?,
            max_concurrent: gauge(
                "controller_runtime_max_concurrent_reconciles",
                "Maximum number of concurrent reconciles per controller",
                &["controller"],
            )?,
            active_workers: gauge(
                "controller_runtime_active_workers",
                "Number of currently used workers per controller",
                &["controller"],
            )?,
            workqueue_depth: gauge(
                "workqueue_depth",
                "Current depth of workqueue: objects waiting for a pass",
                &["name", "controller"],
            )?,
            operations: counter(
                "csi_addons_operations_total",
                "CSI-Addons operations that ended, by kind and result",
                &["kind", "result"],
            )?,
            operation_duration: histogram(
                "csi_addons_operation_duration_seconds",
                "Time from a job's first attempt to its result, by kind",
                &["kind"],
                SECONDS.to_vec(),
            )?,
            reclaimed_bytes,
            sidecar_connections: gauge(
                "csi_addons_sidecar_connections",
                "Sidecars known to the manager, by state (connected, retrying, failed)",
                &["state"],
            )?,
            sidecar_rpc: histogram(
                "csi_addons_sidecar_rpc_duration_seconds",
                "Latency of calls from the manager to sidecars, by method and gRPC code",
                &["method", "code"],
                SECONDS.to_vec(),
            )?,
            api_requests: counter(
                "rest_client_requests_total",
                "Number of HTTP requests, partitioned by status code, method, and host.",
                &["code", "method", "host"],
            )?,
            registry,
        })
    }

    /// Serves the counters of every controller and operation from 0, as controller-runtime does for
    /// its controllers: a counter that first appears at 1 shows no increase to `rate()` and
    /// `increase()`, so the first failure would move neither a dashboard nor an alert.
    pub fn start_at_zero(&self, controllers: &[&str]) {
        for controller in controllers {
            for result in PASS_RESULTS {
                self.reconcile_total.with_label_values(&[controller, result]);
            }
            self.reconcile_errors.with_label_values(&[controller]);
            self.active_workers.with_label_values(&[controller]);
        }
        for kind in OPERATION_KINDS {
            self.operation_duration.with_label_values(&[kind]);
            for result in ["Succeeded", "Failed"] {
                self.operations.with_label_values(&[kind, result]);
            }
        }
    }

    /// Counts one operation that ended.
    pub fn operation_ended(&self, kind: &str, result: &str) {
        debug_assert!(OPERATION_KINDS.contains(&kind), "{kind} is not in OPERATION_KINDS");
        self.operations.with_label_values(&[kind, result]).inc();
    }

    /// The text exposition of every series.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Only invalid metric data fails to encode, which the types rule out.
        let _ = prometheus::TextEncoder::new().encode_utf8(&self.registry.gather(), &mut out);
        out
    }

    /// Records one sidecar call.
    pub fn observe_rpc(&self, method: &str, code: tonic::Code, seconds: f64) {
        self.sidecar_rpc.with_label_values(&[method, &format!("{code:?}")]).observe(seconds);
    }

    /// Awaits one sidecar call and records it under `method` with its gRPC code and latency.
    ///
    /// A combinator rather than an async fn, which would hold the call twice (its argument and
    /// the future it awaits): a hundred calls wait at once.
    pub fn timed_rpc<T>(
        &self,
        method: &str,
        call: impl Future<Output = Result<T, tonic::Status>>,
    ) -> impl Future<Output = Result<T, tonic::Status>> {
        let started = std::time::Instant::now();
        call.map(move |answer| {
            let code = answer.as_ref().map_or_else(tonic::Status::code, |_| tonic::Code::Ok);
            self.observe_rpc(method, code, started.elapsed().as_secs_f64());
            answer
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn controller_runtime_names_are_served() {
        let metrics = super::Metrics::new().unwrap();
        metrics.reconcile_total.with_label_values(&["reclaimspacejob", "success"]).inc();
        metrics.reconcile_errors.with_label_values(&["reclaimspacejob"]).inc();
        metrics.reconcile_time.with_label_values(&["reclaimspacejob"]).observe(0.01);
        metrics.observe_rpc("ReclaimSpace/NodeReclaimSpace", tonic::Code::Ok, 0.2);
        let text = metrics.render();
        for series in [
            "controller_runtime_reconcile_total{controller=\"reclaimspacejob\",result=\"success\"} 1",
            "controller_runtime_reconcile_errors_total{controller=\"reclaimspacejob\"} 1",
            "controller_runtime_reconcile_time_seconds_bucket{controller=\"reclaimspacejob\"",
            "csi_addons_sidecar_rpc_duration_seconds_count{code=\"Ok\",method=\"ReclaimSpace/NodeReclaimSpace\"} 1",
        ] {
            assert!(text.contains(series), "{series} missing from:\n{text}");
        }
    }

    #[test]
    fn counters_are_served_from_zero_before_anything_happens() {
        let metrics = super::Metrics::new().unwrap();
        metrics.start_at_zero(&["reclaimspacejob"]);
        let text = metrics.render();
        for series in [
            "controller_runtime_reconcile_errors_total{controller=\"reclaimspacejob\"} 0",
            "controller_runtime_reconcile_total{controller=\"reclaimspacejob\",result=\"error\"} 0",
            "csi_addons_operations_total{kind=\"ReclaimSpaceJob\",result=\"Failed\"} 0",
            "csi_addons_operations_total{kind=\"VolumeGroup/DeleteVolumeGroup\",result=\"Succeeded\"} 0",
        ] {
            assert!(text.contains(series), "{series} missing from:\n{text}");
        }
        metrics.operation_ended("ReclaimSpaceJob", "Failed");
        assert!(metrics.render().contains("csi_addons_operations_total{kind=\"ReclaimSpaceJob\",result=\"Failed\"} 1"));
    }
}

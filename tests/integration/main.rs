//! Integration suites on a real kube-apiserver + etcd (built by hack/control-plane.sh). One
//! control plane for the whole binary; every test works in its own namespace.

mod admission;
mod bench_manager;
mod bench_sidecar;
mod crds;
mod deploy_manifests;
mod driver_addons;
mod driver_harness;
mod driver_sanity;
mod driver_volumes;
mod e2e;
mod helm_chart;
mod hostile_input;
mod manager_fence;
mod manager_groups;
mod manager_harness;
mod manager_jobs;
mod manager_process;
mod manager_replication;
mod manager_schedules;
mod manager_sidecar_client;
mod olm_bundle;
mod packaging;
mod recording_driver;
mod sidecar_cli;
mod sidecar_condition;
mod sidecar_driver;
mod sidecar_harness;
mod sidecar_leader;
mod sidecar_registration;
mod sidecar_rpcs;
mod sidecar_security;
mod support;
mod testenv_features;
mod testenv_lifecycle;
mod upstream_parity;

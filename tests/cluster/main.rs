//! The product in real Pods on the one-node cluster (hack/cluster.sh): images built here, the
//! release YAMLs and the reference driver's manifests installed as users install them, a kubelet
//! making the CSI calls. `make test-cluster` starts the cluster, installs, runs these inside the
//! cluster's network namespace (they reach Pods and Services) and removes every trace. Without a
//! cluster they are ignored.
mod api_fairness;
mod cluster;
mod driver_operator;
mod driver_pods;
mod evictions;
mod failover;
mod fan_out;
mod faults_cluster;
mod full_disk;
mod helm;
mod hostile;
mod manager_pods;
mod olm;
mod olm_driver;
mod olm_hub;
mod olm_scorecard;
mod olm_upgrade;
mod partition;
mod prometheus;
mod rbac_audit;
mod readme_helm;
mod reboot;
mod sidecar_tls;
mod story;

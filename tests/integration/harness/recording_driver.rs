//! A small CSI-Addons driver on a real Unix socket that records every request it gets, so the
//! sidecar's mapping (handles, parameters, secrets, paths, access modes) can be asserted exactly.
//! It also serves CSI NodeGetCapabilities, so it can stand for the driver's CSI socket.
use std::any::Any;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use api::proto::csi::v1 as csi;
use api::proto::{encryptionkeyrotation as ekr, fence, identity, reclaimspace, replication, volumegroup};
use tonic::{Request, Response, Status};

type Log = Vec<(String, Box<dyn Any + Send>)>;
/// A method that fails, with what, and for how many more calls (None: for ever).
type Failing = (String, Status, Option<usize>);

#[derive(Clone)]
pub struct Recorder {
    name: String,
    controller: bool,
    stages: bool,
    log: Arc<Mutex<Log>>,
    failing: Arc<Mutex<Option<Failing>>>,
    /// Methods that answer only after a while.
    delays: Arc<Mutex<Vec<(String, std::time::Duration)>>>,
    /// Methods whose calls wait until they are released.
    holds: Arc<tokio::sync::watch::Sender<Vec<String>>>,
    /// Per method: calls in flight now, and the most there ever were at once.
    flights: Arc<Mutex<std::collections::HashMap<String, (usize, usize)>>>,
    condition: Arc<Mutex<Option<csi::VolumeCondition>>>,
    /// `Some`: advertise exactly these (`<field>.<VALUE>`) instead of the defaults.
    advertised: Arc<Mutex<Option<Vec<String>>>>,
}

impl Recorder {
    fn record<Req: Send + 'static, Resp>(
        &self,
        method: &str,
        request: Req,
        response: Resp,
    ) -> Result<Response<Resp>, Status> {
        self.log.lock().unwrap().push((method.to_owned(), Box::new(request)));
        let mut failing = self.failing.lock().unwrap();
        let Some((_, status, remaining)) = failing.as_mut().filter(|(m, _, _)| m == method) else {
            return Ok(Response::new(response));
        };
        let status = status.clone();
        match remaining {
            Some(0) => return Ok(Response::new(response)),
            Some(n) => *n -= 1,
            None => {}
        }
        Err(status)
    }

    /// Counts a call in flight until the guard goes.
    fn fly(&self, method: &str) -> Flight {
        let mut flights = self.flights.lock().unwrap();
        let (now, most) = flights.entry(method.to_owned()).or_default();
        *now += 1;
        *most = (*most).max(*now);
        Flight { flights: self.flights.clone(), method: method.to_owned() }
    }

    fn delay_of(&self, method: &str) -> Option<std::time::Duration> {
        self.delays.lock().unwrap().iter().find(|(m, _)| m == method).map(|(_, d)| *d)
    }
}

/// A call in flight; counted down when dropped.
struct Flight {
    flights: Arc<Mutex<std::collections::HashMap<String, (usize, usize)>>>,
    method: String,
}

impl Drop for Flight {
    fn drop(&mut self) {
        if let Some((now, _)) = self.flights.lock().unwrap().get_mut(&self.method) {
            *now -= 1;
        }
    }
}

/// Implements a driver service whose every method records its request and answers `$value`, a
/// function of the recorder.
macro_rules! recorded {
    ($service:path { $($method:ident($request:ty) -> $response:ty = $value:expr;)* }) => {
        #[tonic::async_trait]
        impl $service for Recorder {
            $(
                async fn $method(&self, request: Request<$request>) -> Result<Response<$response>, Status> {
                    let value: fn(&Recorder) -> $response = $value;
                    let _flight = self.fly(stringify!($method));
                    if let Some(delay) = self.delay_of(stringify!($method)) {
                        tokio::time::sleep(delay).await;
                    }
                    let mut holds = self.holds.subscribe();
                    let _ = holds.wait_for(|held| !held.iter().any(|m| m == stringify!($method))).await;
                    self.record(stringify!($method), request.into_inner(), value(self))
                }
            )*
        }
    };
}

/// A capability from its `<field>.<VALUE>` name (the ones the tests use).
fn named_capability(name: &str) -> identity::Capability {
    use identity::capability::*;
    let kind = match name {
        "service.NODE_SERVICE" => Type::Service(Service { r#type: service::Type::NodeService as i32 }),
        "service.CONTROLLER_SERVICE" => Type::Service(Service { r#type: service::Type::ControllerService as i32 }),
        "reclaim_space.ONLINE" => Type::ReclaimSpace(ReclaimSpace { r#type: reclaim_space::Type::Online as i32 }),
        "reclaim_space.OFFLINE" => Type::ReclaimSpace(ReclaimSpace { r#type: reclaim_space::Type::Offline as i32 }),
        "encryption_key_rotation.ENCRYPTIONKEYROTATION" => Type::EncryptionKeyRotation(EncryptionKeyRotation {
            r#type: encryption_key_rotation::Type::Encryptionkeyrotation as i32,
        }),
        "network_fence.NETWORK_FENCE" => {
            Type::NetworkFence(NetworkFence { r#type: network_fence::Type::NetworkFence as i32 })
        }
        "network_fence.GET_CLIENTS_TO_FENCE" => {
            Type::NetworkFence(NetworkFence { r#type: network_fence::Type::GetClientsToFence as i32 })
        }
        "volume_replication.VOLUME_REPLICATION" => {
            Type::VolumeReplication(VolumeReplication { r#type: volume_replication::Type::VolumeReplication as i32 })
        }
        "volume_replication.GET_REPLICATION_DESTINATION_INFO" => Type::VolumeReplication(VolumeReplication {
            r#type: volume_replication::Type::GetReplicationDestinationInfo as i32,
        }),
        other => panic!("the recording driver does not know capability {other}"),
    };
    identity::Capability { r#type: Some(kind) }
}

fn capabilities(r: &Recorder) -> identity::GetCapabilitiesResponse {
    use identity::capability::{ReclaimSpace, Service, Type, reclaim_space, service};
    if let Some(names) = &*r.advertised.lock().unwrap() {
        return identity::GetCapabilitiesResponse { capabilities: names.iter().map(|n| named_capability(n)).collect() };
    }
    let service = |t: service::Type| identity::Capability { r#type: Some(Type::Service(Service { r#type: t as i32 })) };
    let mut capabilities = vec![
        service(service::Type::NodeService),
        identity::Capability {
            r#type: Some(Type::ReclaimSpace(ReclaimSpace { r#type: reclaim_space::Type::Online as i32 })),
        },
    ];
    if r.controller {
        capabilities.push(service(service::Type::ControllerService));
    }
    identity::GetCapabilitiesResponse { capabilities }
}

fn node_capabilities(r: &Recorder) -> csi::NodeGetCapabilitiesResponse {
    use csi::node_service_capability::{Rpc, Type, rpc};
    let rpc = |t: rpc::Type| csi::NodeServiceCapability { r#type: Some(Type::Rpc(Rpc { r#type: t as i32 })) };
    let mut capabilities = vec![rpc(rpc::Type::GetVolumeStats), rpc(rpc::Type::VolumeCondition)];
    if r.stages {
        capabilities.push(rpc(rpc::Type::StageUnstageVolume));
    }
    csi::NodeGetCapabilitiesResponse { capabilities }
}

recorded!(identity::identity_server::Identity {
    get_identity(identity::GetIdentityRequest) -> identity::GetIdentityResponse =
        |r| identity::GetIdentityResponse { name: r.name.clone(), vendor_version: "1.0.0".into(), ..Default::default() };
    get_capabilities(identity::GetCapabilitiesRequest) -> identity::GetCapabilitiesResponse = capabilities;
    probe(identity::ProbeRequest) -> identity::ProbeResponse = |_| identity::ProbeResponse { ready: Some(true) };
});

recorded!(reclaimspace::reclaim_space_controller_server::ReclaimSpaceController {
    controller_reclaim_space(reclaimspace::ControllerReclaimSpaceRequest) -> reclaimspace::ControllerReclaimSpaceResponse =
        |_| reclaimspace::ControllerReclaimSpaceResponse {
            pre_usage: Some(reclaimspace::StorageConsumption { usage_bytes: 100 }),
            post_usage: Some(reclaimspace::StorageConsumption { usage_bytes: 40 }),
        };
});

recorded!(reclaimspace::reclaim_space_node_server::ReclaimSpaceNode {
    node_reclaim_space(reclaimspace::NodeReclaimSpaceRequest) -> reclaimspace::NodeReclaimSpaceResponse =
        |_| reclaimspace::NodeReclaimSpaceResponse {
            pre_usage: Some(reclaimspace::StorageConsumption { usage_bytes: 1000 }),
            post_usage: Some(reclaimspace::StorageConsumption { usage_bytes: 900 }),
        };
});

recorded!(fence::fence_controller_server::FenceController {
    fence_cluster_network(fence::FenceClusterNetworkRequest) -> fence::FenceClusterNetworkResponse = |_| Default::default();
    unfence_cluster_network(fence::UnfenceClusterNetworkRequest) -> fence::UnfenceClusterNetworkResponse =
        |_| Default::default();
    list_cluster_fence(fence::ListClusterFenceRequest) -> fence::ListClusterFenceResponse = |_| Default::default();
    get_fence_clients(fence::GetFenceClientsRequest) -> fence::GetFenceClientsResponse =
        |_| fence::GetFenceClientsResponse {
            clients: vec![fence::ClientDetails {
                id: "client-1".into(),
                addresses: vec![fence::Cidr { cidr: "10.1.2.3/32".into() }],
            }],
        };
});

recorded!(replication::controller_server::Controller {
    enable_volume_replication(replication::EnableVolumeReplicationRequest) -> replication::EnableVolumeReplicationResponse =
        |_| Default::default();
    disable_volume_replication(replication::DisableVolumeReplicationRequest) -> replication::DisableVolumeReplicationResponse =
        |_| Default::default();
    promote_volume(replication::PromoteVolumeRequest) -> replication::PromoteVolumeResponse = |_| Default::default();
    demote_volume(replication::DemoteVolumeRequest) -> replication::DemoteVolumeResponse = |_| Default::default();
    resync_volume(replication::ResyncVolumeRequest) -> replication::ResyncVolumeResponse =
        |_| replication::ResyncVolumeResponse { ready: true };
    get_volume_replication_info(replication::GetVolumeReplicationInfoRequest) -> replication::GetVolumeReplicationInfoResponse =
        |_| replication::GetVolumeReplicationInfoResponse {
            last_sync_time: Some(prost_types::Timestamp { seconds: 1_795_435_200, nanos: 0 }),
            last_sync_bytes: 4096,
            ..Default::default()
        };
    get_replication_destination_info(replication::GetReplicationDestinationInfoRequest) -> replication::GetReplicationDestinationInfoResponse =
        |_| replication::GetReplicationDestinationInfoResponse {
            replication_destination: Some(replication::ReplicationDestination {
                r#type: Some(replication::replication_destination::Type::Volume(
                    replication::replication_destination::VolumeDestination { volume_id: "remote-7".into() },
                )),
            }),
        };
});

recorded!(volumegroup::controller_server::Controller {
    create_volume_group(volumegroup::CreateVolumeGroupRequest) -> volumegroup::CreateVolumeGroupResponse =
        |_| volumegroup::CreateVolumeGroupResponse {
            volume_group: Some(volumegroup::VolumeGroup {
                volume_group_id: "group-1".into(),
                volumes: vec![csi::Volume { volume_id: "vol-a".into(), ..Default::default() }],
                ..Default::default()
            }),
        };
    modify_volume_group_membership(volumegroup::ModifyVolumeGroupMembershipRequest) -> volumegroup::ModifyVolumeGroupMembershipResponse =
        |_| Default::default();
    delete_volume_group(volumegroup::DeleteVolumeGroupRequest) -> volumegroup::DeleteVolumeGroupResponse =
        |_| Default::default();
    list_volume_groups(volumegroup::ListVolumeGroupsRequest) -> volumegroup::ListVolumeGroupsResponse =
        |_| Default::default();
    controller_get_volume_group(volumegroup::ControllerGetVolumeGroupRequest) -> volumegroup::ControllerGetVolumeGroupResponse =
        |_| Default::default();
});

recorded!(ekr::encryption_key_rotation_controller_server::EncryptionKeyRotationController {
    encryption_key_rotate(ekr::EncryptionKeyRotateRequest) -> ekr::EncryptionKeyRotateResponse = |_| Default::default();
});

recorded!(csi::node_server::Node {
    node_stage_volume(csi::NodeStageVolumeRequest) -> csi::NodeStageVolumeResponse = |_| Default::default();
    node_unstage_volume(csi::NodeUnstageVolumeRequest) -> csi::NodeUnstageVolumeResponse = |_| Default::default();
    node_publish_volume(csi::NodePublishVolumeRequest) -> csi::NodePublishVolumeResponse = |_| Default::default();
    node_unpublish_volume(csi::NodeUnpublishVolumeRequest) -> csi::NodeUnpublishVolumeResponse = |_| Default::default();
    node_get_volume_stats(csi::NodeGetVolumeStatsRequest) -> csi::NodeGetVolumeStatsResponse =
        |r| csi::NodeGetVolumeStatsResponse { volume_condition: r.condition.lock().unwrap().clone(), ..Default::default() };
    node_expand_volume(csi::NodeExpandVolumeRequest) -> csi::NodeExpandVolumeResponse = |_| Default::default();
    node_get_capabilities(csi::NodeGetCapabilitiesRequest) -> csi::NodeGetCapabilitiesResponse = node_capabilities;
    node_get_info(csi::NodeGetInfoRequest) -> csi::NodeGetInfoResponse = |_| Default::default();
});

/// The driver; stops serving when dropped.
pub struct RecordingDriver {
    _dir: tempfile::TempDir,
    pub socket: PathBuf,
    recorder: Recorder,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RecordingDriver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RecordingDriver {
    /// `controller`: advertise CONTROLLER_SERVICE; `stages`: advertise STAGE_UNSTAGE_VOLUME.
    pub fn start(name: &str, controller: bool, stages: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("addons.sock");
        let recorder = Recorder {
            name: name.to_owned(),
            controller,
            stages,
            log: Arc::default(),
            failing: Arc::default(),
            delays: Arc::default(),
            holds: Arc::new(tokio::sync::watch::Sender::new(Vec::new())),
            flights: Arc::default(),
            condition: Arc::default(),
            advertised: Arc::default(),
        };
        let routes = tonic::service::Routes::new(identity::identity_server::IdentityServer::new(recorder.clone()))
            .add_service(reclaimspace::reclaim_space_controller_server::ReclaimSpaceControllerServer::new(
                recorder.clone(),
            ))
            .add_service(reclaimspace::reclaim_space_node_server::ReclaimSpaceNodeServer::new(recorder.clone()))
            .add_service(fence::fence_controller_server::FenceControllerServer::new(recorder.clone()))
            .add_service(replication::controller_server::ControllerServer::new(recorder.clone()))
            .add_service(volumegroup::controller_server::ControllerServer::new(recorder.clone()))
            .add_service(ekr::encryption_key_rotation_controller_server::EncryptionKeyRotationControllerServer::new(
                recorder.clone(),
            ))
            .add_service(csi::node_server::NodeServer::new(recorder.clone()));
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder().add_routes(routes).serve_with_incoming(incoming).await;
        });
        RecordingDriver { _dir: dir, socket, recorder, task }
    }

    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// The last request `method` got.
    pub fn last<T: Clone + 'static>(&self, method: &str) -> T {
        let log = self.recorder.log.lock().unwrap();
        let (_, request) = log.iter().rev().find(|(m, _)| m == method).unwrap_or_else(|| {
            panic!("the driver got no {method}; it got {:?}", log.iter().map(|(m, _)| m).collect::<Vec<_>>())
        });
        request.downcast_ref::<T>().unwrap().clone()
    }

    /// The most calls of `method` there were in flight at once.
    pub fn max_in_flight(&self, method: &str) -> usize {
        self.recorder.flights.lock().unwrap().get(method).map_or(0, |(_, most)| *most)
    }

    /// How many calls of `method` are in flight now.
    pub fn in_flight(&self, method: &str) -> usize {
        self.recorder.flights.lock().unwrap().get(method).map_or(0, |(now, _)| *now)
    }

    /// From now on calls of `method` wait until [`Self::release`] (a sidecar that stops answering).
    pub fn hold(&self, method: &str) {
        self.recorder.holds.send_modify(|held| held.push(method.to_owned()));
    }

    /// The calls of `method` held answer, and later ones at once.
    pub fn release(&self, method: &str) {
        self.recorder.holds.send_modify(|held| held.retain(|m| m != method));
    }

    pub fn count(&self, method: &str) -> usize {
        self.recorder.log.lock().unwrap().iter().filter(|(m, _)| m == method).count()
    }

    /// From now on NodeGetVolumeStats reports this condition.
    pub fn set_condition(&self, abnormal: bool, message: &str) {
        *self.recorder.condition.lock().unwrap() = Some(csi::VolumeCondition { abnormal, message: message.to_owned() });
    }

    /// From now on GetCapabilities answers exactly `names` (`<field>.<VALUE>`).
    pub fn advertise(&self, names: &[&str]) {
        *self.recorder.advertised.lock().unwrap() = Some(names.iter().map(|n| (*n).to_owned()).collect());
    }

    /// From now on `method` answers `status`.
    pub fn fail(&self, method: &str, status: Status) {
        *self.recorder.failing.lock().unwrap() = Some((method.to_owned(), status, None));
    }

    /// The next `times` calls of `method` answer `status`, later ones succeed.
    pub fn fail_times(&self, method: &str, status: Status, times: usize) {
        *self.recorder.failing.lock().unwrap() = Some((method.to_owned(), status, Some(times)));
    }

    /// Nothing fails any more.
    pub fn heal(&self) {
        *self.recorder.failing.lock().unwrap() = None;
    }

    /// From now on `method` answers only after `delay` (a driver that hangs, for a timeout).
    pub fn delay(&self, method: &str, delay: std::time::Duration) {
        self.recorder.delays.lock().unwrap().push((method.to_owned(), delay));
    }
}
